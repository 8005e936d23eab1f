"""Split-K flash decoding: attention straight from the compressed cache by the split-K kernel over the store
plus the native window, its log-sum-exp merge, and its launcher `attention_flash`.

Supports every call (any kind, head dim, dtype, rows and window): the implementation the selector
(octopus_audio/kernels/select.py) falls back to. The kind's decode is a compile-time parameter: its
`queries` and `scores` helpers (kinds/kind.py) are the kernel's QUERIES and SCORES.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..bits import store_rounded
from ..kinds import ATTENTION_PARAMS, AttentionConstants
from ..launch import (
    AttnConfig,
    _cdiv,
    _interpreter_16bit_dot,
    _interpreting,
    _pow2,
    _sm_count,
    split_buffers,
    split_chunk,
)
from ..operands import mm_nn, mm_nt, operand, project
from ..qjl import qjl_scores
from ..spec import KernelCodec, PackedKeys, PackedValues, WideSegment
from ..value_decode import value_tile

NAME = "split-k"

LOG2E = 1.4426950408889634
_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _online_update(m_i, l_i, acc, s, v, USE_DOT: tl.constexpr, PREC: tl.constexpr, OPD: tl.constexpr,
                   RNE_BY_HAND: tl.constexpr):
    """One step of the online softmax with scores s [M, N] (log2 units, -inf for masked keys); v [N, D] is
    already in the operand dtype OPD, and so is P for P @ V (flash attention's bf16 P)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + mm_nn(operand(p, OPD, RNE_BY_HAND), v, USE_DOT, PREC)
    return m_new, l_i, acc


@triton.jit
def _compressed_tile(m_i, l_i, acc, qa, qb, qc, qj, qj2, n0, end, row0,
                     kc_ptr, kg_ptr, ks_ptr, kr_ptr, vc_ptr, vs_ptr, vm_ptr, tab_a_ptr, tab_b_ptr,
                     SCORES: tl.constexpr, K, HAS_QJL: tl.constexpr, S_WP: tl.constexpr,
                     V_GROUP: tl.constexpr, V_BITS: tl.constexpr, V_WORDS: tl.constexpr, V_WP: tl.constexpr,
                     BLOCK_M: tl.constexpr, MASKED: tl.constexpr):
    """Decode compressed keys [n0, n0 + K.BLOCK_N) (rows row0 + n of the store) and fold them into the online
    softmax. MASKED: the tile may run past `end` (keys >= end are not read and score -inf); otherwise every
    key is valid and no mask is computed. The kind's scores (its SCORES helper against its query operands
    qa, qb, qc; K: the kernel's `AttentionConstants`), the QJL term (qj, qj2), then the values' group
    dequantization. K.HALVES: the d-wide score dots run as two of d/2 (K.K_WP2: the word-tile width of half a
    key's codes)."""
    BLOCK_N: tl.constexpr = K.BLOCK_N
    D: tl.constexpr = K.D
    USE_DOT: tl.constexpr = K.USE_DOT
    PREC: tl.constexpr = K.PREC
    OPD: tl.constexpr = K.OPD
    RNE_BY_HAND: tl.constexpr = K.RNE_BY_HAND
    n = n0 + tl.arange(0, BLOCK_N)
    if MASKED:
        n_ok = n < end
    else:
        n_ok = tl.full((BLOCK_N,), 1, tl.int1)
    krow = row0 + n
    k_rows = kc_ptr + krow[:, None] * K.K_WORDS
    gamma = tl.load(kg_ptr + krow, mask=n_ok, other=0.0).to(tl.float32)[:, None]
    s = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    s = SCORES(s, qa, qb, qc, k_rows, n_ok, gamma, tab_a_ptr, tab_b_ptr, K)
    if HAS_QJL:
        s = qjl_scores(s, qj, qj2, krow, n_ok, gamma, ks_ptr, kr_ptr, D, S_WP, K.TILE, K.HALVES, USE_DOT,
                       PREC, OPD, RNE_BY_HAND)
    if MASKED:
        s = tl.where(n_ok[None, :], s, float("-inf"))
    # values cut from word tiles whenever the width divides 32 (shifts alone: ptxas counts 890 instructions a
    # warp per tile against 932 with one gathered load per code, octopus b=2, 128 rows, 8 warps)
    v_tile: tl.constexpr = K.TILE or (32 % V_BITS == 0)
    v = value_tile(vc_ptr, vs_ptr, vm_ptr, krow, n_ok, BLOCK_N, D, V_GROUP, V_BITS, V_WORDS, V_WP, v_tile)
    return _online_update(m_i, l_i, acc, s, operand(v, OPD, RNE_BY_HAND), USE_DOT, PREC, OPD, RNE_BY_HAND)

@triton.jit
def _qjl_queries(q_pro, qmap, qn, qjl_scale, NP: tl.constexpr, HAS_QJL: tl.constexpr, K):
    """The QJL query operands (qj, and qj2 for the second half when K.HALVES) from the query map's last D
    columns (NP columns in all); without a QJL term, placeholders never read."""
    qj = qn
    qj2 = qn
    if HAS_QJL:  # the QJL block: the map's last D columns
        QJL_COL: tl.constexpr = NP - K.D
        if K.HALVES:
            hcol = tl.arange(0, K.D // 2)[None, :]
            qj = project(q_pro, qmap, QJL_COL + hcol, qjl_scale, K.USE_DOT, K.PREC_Q, K.OPD, K.RNE_BY_HAND)
            qj2 = project(q_pro, qmap, (QJL_COL + K.D // 2) + hcol, qjl_scale, K.USE_DOT, K.PREC_Q, K.OPD,
                          K.RNE_BY_HAND)
        else:
            qj = project(q_pro, qmap, QJL_COL + tl.arange(0, K.D)[None, :], qjl_scale, K.USE_DOT, K.PREC_Q,
                         K.OPD, K.RNE_BY_HAND)
    return qj, qj2


# the integers that change from one AAR scale to the next are not specialised on (== 1, % 16): one compile
# serves every scale (specialising them compiled 10-16 variants a codec, 25-42 s on first use); strides keep
# their specialisation (their divisibility is what vectorises the loads)
PER_CALL_INTS = ["H", "grp", "tq", "n_rows", "t_cap", "t_comp", "t_win", "chunk", "n_splits", "total_rows"]
WIDE_INTS = ["w_cap", "t_wide"]


@triton.jit
def _attn_fwd_body(
    q_ptr, stride_qb, stride_qh, stride_qt, qmap_ptr,
    kc_ptr, kg_ptr, ks_ptr, kr_ptr,
    vc_ptr, vs_ptr, vm_ptr,
    kw_ptr, vw_ptr, stride_kwb, stride_kwh, stride_kwt, stride_vwb, stride_vwh, stride_vwt,
    tab_a_ptr, tab_b_ptr,
    wc_ptr, wg_ptr, ws_ptr, wr_ptr, wvc_ptr, wvs_ptr, wvm_ptr, wtab_a_ptr, wtab_b_ptr, wmap_ptr,
    out_ptr, opart_ptr, lse_ptr,
    H, grp, tq, n_rows, t_cap, t_comp, t_win, chunk, n_splits, total_rows, w_cap, t_wide,
    qk_scale, rot_scale, qjl_scale,
    QUERIES: tl.constexpr, SCORES: tl.constexpr, D: tl.constexpr, LP: tl.constexpr, NP: tl.constexpr,
    LOG2D: tl.constexpr,
    K_BITS: tl.constexpr, K_CODES: tl.constexpr, K_WORDS: tl.constexpr, B_DIR: tl.constexpr,
    B_RHO: tl.constexpr,
    DIR_TABLE: tl.constexpr,
    K_WP: tl.constexpr, HAS_QJL: tl.constexpr, S_WP: tl.constexpr,
    V_GROUP: tl.constexpr, V_BITS: tl.constexpr, V_WORDS: tl.constexpr, V_WP: tl.constexpr,
    TILE: tl.constexpr,
    DIRECT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
    PREC_Q: tl.constexpr, OPD: tl.constexpr, RNE_BY_HAND: tl.constexpr, HALVES: tl.constexpr,
    K_WP2: tl.constexpr, BLOCK_W: tl.constexpr,
    WIDE: tl.constexpr, W_NP: tl.constexpr, W_LP: tl.constexpr, W_K_BITS: tl.constexpr,
    W_K_CODES: tl.constexpr, W_K_WORDS: tl.constexpr, W_B_DIR: tl.constexpr, W_B_RHO: tl.constexpr,
    W_DIR_TABLE: tl.constexpr, W_K_WP: tl.constexpr, W_K_WP2: tl.constexpr, W_TILE: tl.constexpr,
    W_V_BITS: tl.constexpr, W_V_WORDS: tl.constexpr, W_V_WP: tl.constexpr,
):
    """One (batch, KV head, query block, split) program of attention straight from the compressed cache
    (the body of `_attn_fwd_kernel` and `_attn_fwd_wide_kernel`).

    Rows are (query head in the KV head's group, query token) pairs r = g * tq + t, G*Tq per KV head, so the
    group shares one pass over K/V. Prologue: the query rows are loaded once and projected in registers to
    the layouts the codec's score needs, q @ M_h with the per-head integer matrix at qmap (formats.md
    rotation times sqrt(d): R q in the kind's layout, its QUERIES helper, then the QJL query R' R q times
    d), scaled by rot_scale / qjl_scale, which also carry the softmax scale in log2 units.
    Compressed score of key n: q_rot' . (gamma_n u_hat_n) [+ q_j' . (gamma_n gamma_r_n sigma_n)]; window
    score: qk_scale * q . k_n. Softmax over both with one running max; values: group dequant in the original
    frame. Matmul operands are OPD (fp32 with PREC, or the queries' 16-bit dtype), accumulation fp32.
    Split s covers compressed keys [s*chunk, (s+1)*chunk); the last split also covers the native window
    (alone when its chunk starts past the store).
    DIRECT: a single split writes the normalised output; otherwise o/l and the log2-sum-exp go to the
    partial buffers. tab_a/tab_b: the kind's attention tables (DecodeKind.attention_tables). HALVES
    (d >= 128):
    the d-wide projections and score dots as two of d/2 each (see _compressed_tile). BLOCK_W: native window
    keys per step.
    WIDE: a second compressed store in the same softmax (a cache's wide prefix: `t_wide` keys at store rows
    pid_bh * w_cap .., the same kind at other widths, the W_ constants, its own tables and query map with W_NP
    columns), split 0's share: its query operands projected through its map, its tiles scored and folded
    like the store's.
    """
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    b = pid_bh // H
    h = pid_bh % H
    USE_DOT: tl.constexpr = BLOCK_M >= 16

    # prologue: the query block
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    qrow = pid_bh * n_rows + rows
    dcol = tl.arange(0, D)[None, :]
    q_rows = q_ptr + b * stride_qb + (h * grp + rows // tq)[:, None] * stride_qh
    q = tl.load(q_rows + (rows % tq)[:, None] * stride_qt + dcol, mask=row_ok[:, None], other=0.0)
    qn = operand(q, OPD, RNE_BY_HAND)

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)

    # native window first (the last split's share), so qn is dead during the compressed loop
    w_end = tl.where(pid_s == n_splits - 1, t_win, 0)
    kw_base = kw_ptr + b * stride_kwb + h * stride_kwh
    vw_base = vw_ptr + b * stride_vwb + h * stride_vwh
    for n0 in tl.range(0, w_end, BLOCK_W):
        n = n0 + tl.arange(0, BLOCK_W)
        n_ok = n < t_win
        k = operand(tl.load(kw_base + n[:, None] * stride_kwt + dcol, mask=n_ok[:, None], other=0.0), OPD,
                     RNE_BY_HAND)
        s = mm_nt(qn, k, tl.zeros((BLOCK_M, BLOCK_W), tl.float32), USE_DOT, PREC)
        s = tl.where(n_ok[None, :], s * qk_scale, float("-inf"))
        v = operand(tl.load(vw_base + n[:, None] * stride_vwt + dcol, mask=n_ok[:, None], other=0.0), OPD,
                     RNE_BY_HAND)
        m_i, l_i, acc = _online_update(m_i, l_i, acc, s, v, USE_DOT, PREC, OPD, RNE_BY_HAND)

    # the query's projections for the compressed keys (after the window: q and these are not live together)
    q_pro = q.to(qmap_ptr.dtype.element_ty)
    K: tl.constexpr = AttentionConstants(BLOCK_N, D, LP, LOG2D, K_BITS, K_CODES, K_WORDS, B_DIR, B_RHO,
                                         DIR_TABLE, K_WP, K_WP2, TILE, HALVES, USE_DOT, PREC, PREC_Q, OPD,
                                         RNE_BY_HAND)
    if WIDE:  # the wide store first, split 0's share, through its own map and widths
        KW: tl.constexpr = AttentionConstants(BLOCK_N, D, W_LP, LOG2D, W_K_BITS, W_K_CODES, W_K_WORDS,
                                              W_B_DIR, W_B_RHO, W_DIR_TABLE, W_K_WP, W_K_WP2, W_TILE, HALVES,
                                              USE_DOT, PREC, PREC_Q, OPD, RNE_BY_HAND)
        w_end = tl.where(pid_s == 0, t_wide, 0)
        wmap = wmap_ptr + h * (D * W_NP) + tl.arange(0, D)[:, None] * W_NP
        wa, wb, wq = QUERIES(q_pro, wmap, qn, rot_scale, KW)
        wj, wj2 = _qjl_queries(q_pro, wmap, qn, qjl_scale, W_NP, HAS_QJL, KW)
        for n0 in tl.range(0, w_end, BLOCK_N):
            m_i, l_i, acc = _compressed_tile(
                m_i, l_i, acc, wa, wb, wq, wj, wj2, n0, w_end, pid_bh * w_cap, wc_ptr, wg_ptr, ws_ptr, wr_ptr,
                wvc_ptr, wvs_ptr, wvm_ptr, wtab_a_ptr, wtab_b_ptr, SCORES, KW, HAS_QJL, S_WP, V_GROUP,
                W_V_BITS, W_V_WORDS, W_V_WP, BLOCK_M, True)
    qmap = qmap_ptr + h * (D * NP) + tl.arange(0, D)[:, None] * NP
    qa, qb, qc = QUERIES(q_pro, qmap, qn, rot_scale, K)
    qj, qj2 = _qjl_queries(q_pro, qmap, qn, qjl_scale, NP, HAS_QJL, K)

    # compressed store: whole tiles without key masks, then the partial tail tile
    start = pid_s * chunk
    end = tl.maximum(tl.minimum(start + chunk, t_comp), start)  # a window-only split: empty
    full_end = start + (end - start) // BLOCK_N * BLOCK_N
    for n0 in tl.range(start, full_end, BLOCK_N):
        m_i, l_i, acc = _compressed_tile(
            m_i, l_i, acc, qa, qb, qc, qj, qj2, n0, end, pid_bh * t_cap, kc_ptr, kg_ptr, ks_ptr,
            kr_ptr, vc_ptr, vs_ptr, vm_ptr, tab_a_ptr, tab_b_ptr, SCORES, K, HAS_QJL, S_WP, V_GROUP, V_BITS,
            V_WORDS, V_WP, BLOCK_M, False)
    if full_end < end:
        m_i, l_i, acc = _compressed_tile(
            m_i, l_i, acc, qa, qb, qc, qj, qj2, full_end, end, pid_bh * t_cap, kc_ptr, kg_ptr,
            ks_ptr, kr_ptr, vc_ptr, vs_ptr, vm_ptr, tab_a_ptr, tab_b_ptr, SCORES, K, HAS_QJL, S_WP, V_GROUP,
            V_BITS, V_WORDS, V_WP, BLOCK_M, True)

    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if DIRECT:
        store_rounded(out_ptr + qrow[:, None] * D + dcol, o, row_ok[:, None])
    else:
        part = pid_s * total_rows + qrow
        tl.store(opart_ptr + part[:, None] * D + dcol, o, mask=row_ok[:, None])
        tl.store(lse_ptr + part, m_i + tl.log2(l_i), mask=row_ok)



@triton.jit(do_not_specialize=PER_CALL_INTS)
def _attn_fwd_kernel(
    q_ptr, stride_qb, stride_qh, stride_qt, qmap_ptr,
    kc_ptr, kg_ptr, ks_ptr, kr_ptr,
    vc_ptr, vs_ptr, vm_ptr,
    kw_ptr, vw_ptr, stride_kwb, stride_kwh, stride_kwt, stride_vwb, stride_vwh, stride_vwt,
    tab_a_ptr, tab_b_ptr,
    out_ptr, opart_ptr, lse_ptr,
    H, grp, tq, n_rows, t_cap, t_comp, t_win, chunk, n_splits, total_rows,
    qk_scale, rot_scale, qjl_scale,
    QUERIES: tl.constexpr, SCORES: tl.constexpr, D: tl.constexpr, LP: tl.constexpr, NP: tl.constexpr,
    LOG2D: tl.constexpr,
    K_BITS: tl.constexpr, K_CODES: tl.constexpr, K_WORDS: tl.constexpr, B_DIR: tl.constexpr,
    B_RHO: tl.constexpr,
    DIR_TABLE: tl.constexpr,
    K_WP: tl.constexpr, HAS_QJL: tl.constexpr, S_WP: tl.constexpr,
    V_GROUP: tl.constexpr, V_BITS: tl.constexpr, V_WORDS: tl.constexpr, V_WP: tl.constexpr,
    TILE: tl.constexpr,
    DIRECT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
    PREC_Q: tl.constexpr, OPD: tl.constexpr, RNE_BY_HAND: tl.constexpr, HALVES: tl.constexpr,
    K_WP2: tl.constexpr, BLOCK_W: tl.constexpr,
):
    """`_attn_fwd_body` without a wide segment: its launch passes no wide arguments (14 fewer than
    `_attn_fwd_wide_kernel`'s, host time at every call), the store's own pointers stand in for the never-read
    wide ones."""
    _attn_fwd_body(
        q_ptr, stride_qb, stride_qh, stride_qt, qmap_ptr, kc_ptr, kg_ptr, ks_ptr, kr_ptr, vc_ptr, vs_ptr,
        vm_ptr, kw_ptr, vw_ptr, stride_kwb, stride_kwh, stride_kwt, stride_vwb, stride_vwh, stride_vwt,
        tab_a_ptr, tab_b_ptr,
        kc_ptr, kg_ptr, ks_ptr, kr_ptr, vc_ptr, vs_ptr, vm_ptr, tab_a_ptr, tab_b_ptr, qmap_ptr,
        out_ptr, opart_ptr, lse_ptr, H, grp, tq, n_rows, t_cap, t_comp, t_win, chunk, n_splits, total_rows,
        t_cap, 0, qk_scale, rot_scale, qjl_scale, QUERIES, SCORES, D, LP, NP, LOG2D, K_BITS, K_CODES,
        K_WORDS, B_DIR, B_RHO, DIR_TABLE, K_WP, HAS_QJL, S_WP, V_GROUP, V_BITS, V_WORDS, V_WP, TILE, DIRECT,
        BLOCK_M, BLOCK_N, PREC, PREC_Q, OPD, RNE_BY_HAND, HALVES, K_WP2, BLOCK_W,
        False, NP, LP, K_BITS, K_CODES, K_WORDS, B_DIR, B_RHO, DIR_TABLE, K_WP, K_WP2, TILE, V_BITS, V_WORDS,
        V_WP)


@triton.jit(do_not_specialize=PER_CALL_INTS + WIDE_INTS)
def _attn_fwd_wide_kernel(
    q_ptr, stride_qb, stride_qh, stride_qt, qmap_ptr,
    kc_ptr, kg_ptr, ks_ptr, kr_ptr,
    vc_ptr, vs_ptr, vm_ptr,
    kw_ptr, vw_ptr, stride_kwb, stride_kwh, stride_kwt, stride_vwb, stride_vwh, stride_vwt,
    tab_a_ptr, tab_b_ptr,
    wc_ptr, wg_ptr, ws_ptr, wr_ptr, wvc_ptr, wvs_ptr, wvm_ptr, wtab_a_ptr, wtab_b_ptr, wmap_ptr,
    out_ptr, opart_ptr, lse_ptr,
    H, grp, tq, n_rows, t_cap, t_comp, t_win, chunk, n_splits, total_rows, w_cap, t_wide,
    qk_scale, rot_scale, qjl_scale,
    QUERIES: tl.constexpr, SCORES: tl.constexpr, D: tl.constexpr, LP: tl.constexpr, NP: tl.constexpr,
    LOG2D: tl.constexpr,
    K_BITS: tl.constexpr, K_CODES: tl.constexpr, K_WORDS: tl.constexpr, B_DIR: tl.constexpr,
    B_RHO: tl.constexpr,
    DIR_TABLE: tl.constexpr,
    K_WP: tl.constexpr, HAS_QJL: tl.constexpr, S_WP: tl.constexpr,
    V_GROUP: tl.constexpr, V_BITS: tl.constexpr, V_WORDS: tl.constexpr, V_WP: tl.constexpr,
    TILE: tl.constexpr,
    DIRECT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
    PREC_Q: tl.constexpr, OPD: tl.constexpr, RNE_BY_HAND: tl.constexpr, HALVES: tl.constexpr,
    K_WP2: tl.constexpr, BLOCK_W: tl.constexpr,
    W_NP: tl.constexpr, W_LP: tl.constexpr, W_K_BITS: tl.constexpr,
    W_K_CODES: tl.constexpr, W_K_WORDS: tl.constexpr, W_B_DIR: tl.constexpr, W_B_RHO: tl.constexpr,
    W_DIR_TABLE: tl.constexpr, W_K_WP: tl.constexpr, W_K_WP2: tl.constexpr, W_TILE: tl.constexpr,
    W_V_BITS: tl.constexpr, W_V_WORDS: tl.constexpr, W_V_WP: tl.constexpr,
):
    """`_attn_fwd_body` with a wide segment (WIDE True)."""
    _attn_fwd_body(
        q_ptr, stride_qb, stride_qh, stride_qt, qmap_ptr, kc_ptr, kg_ptr, ks_ptr, kr_ptr, vc_ptr, vs_ptr,
        vm_ptr, kw_ptr, vw_ptr, stride_kwb, stride_kwh, stride_kwt, stride_vwb, stride_vwh, stride_vwt,
        tab_a_ptr, tab_b_ptr,
        wc_ptr, wg_ptr, ws_ptr, wr_ptr, wvc_ptr, wvs_ptr, wvm_ptr, wtab_a_ptr, wtab_b_ptr, wmap_ptr,
        out_ptr, opart_ptr, lse_ptr, H, grp, tq, n_rows, t_cap, t_comp, t_win, chunk, n_splits, total_rows,
        w_cap, t_wide, qk_scale, rot_scale, qjl_scale, QUERIES, SCORES, D, LP, NP, LOG2D, K_BITS, K_CODES,
        K_WORDS, B_DIR, B_RHO, DIR_TABLE, K_WP, HAS_QJL, S_WP, V_GROUP, V_BITS, V_WORDS, V_WP, TILE, DIRECT,
        BLOCK_M, BLOCK_N, PREC, PREC_Q, OPD, RNE_BY_HAND, HALVES, K_WP2, BLOCK_W,
        True, W_NP, W_LP, W_K_BITS, W_K_CODES, W_K_WORDS, W_B_DIR, W_B_RHO, W_DIR_TABLE, W_K_WP, W_K_WP2,
        W_TILE, W_V_BITS, W_V_WORDS, W_V_WP)


@triton.jit(do_not_specialize=["total_rows", "n_splits"])
def _merge_kernel(opart_ptr, lse_ptr, out_ptr, total_rows, n_splits, D: tl.constexpr, BLOCK_R: tl.constexpr):
    """out = sum_s 2^(lse_s - m) o_s / sum_s 2^(lse_s - m): the splits' log-sum-exp merge (empty splits
    carry lse = -inf and weigh nothing)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = rows < total_rows
    dcol = tl.arange(0, D)[None, :]
    m = tl.full((BLOCK_R,), float("-inf"), tl.float32)
    for sp in range(n_splits):
        m = tl.maximum(m, tl.load(lse_ptr + sp * total_rows + rows, mask=ok, other=float("-inf")))
    m = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros((BLOCK_R, D), tl.float32)
    den = tl.zeros((BLOCK_R,), tl.float32)
    for sp in range(n_splits):
        w = tl.exp2(tl.load(lse_ptr + sp * total_rows + rows, mask=ok, other=float("-inf")) - m)
        o = tl.load(opart_ptr + (sp * total_rows + rows)[:, None] * D + dcol, mask=ok[:, None], other=0.0)
        acc += w[:, None] * o
        den += w
    out = acc / tl.where(den > 0, den, 1.0)[:, None]
    store_rounded(out_ptr + rows[:, None] * D + dcol, out, ok[:, None])


def _codec_constants(codec: KernelCodec) -> dict:
    """The kernel's compile-time constants that depend on the codec alone (cached on the codec)."""
    consts = codec.__dict__.get("_attn_constants")
    if consts is None:
        kind = codec.kind
        d = codec.head_dim
        consts = dict(QUERIES=kind.queries, SCORES=kind.scores, D=d, LOG2D=int(math.log2(d)),
                      K_BITS=codec.code_bits, K_CODES=codec.num_codes, K_WORDS=codec.code_words,
                      K_WP=_pow2(max(codec.code_words, 1)), HAS_QJL=codec.has_qjl, S_WP=_pow2(-(-d // 32)),
                      **dict(ATTENTION_PARAMS, **kind.constants(codec)))
        codec.__dict__["_attn_constants"] = consts
    return consts


def _launch_shape(cfg: AttnConfig, n_rows: int, d: int, length: int, t_win: int, programs_bh: int,
                  device: torch.device, folded: bool = False,
                  fp32: bool = False) -> tuple[int, int, int, bool, int, int]:
    """(block_m, block_n, num_warps, tile_words, num_splits, chunk) for n_rows rows per KV head: split s
    covers the compressed keys [s * chunk, (s + 1) * chunk), the last split the window too (alone, with
    window_split, when there is room for more programs). folded: the kind gathers codes (folded rows).
    fp32: fp32 queries, whose dots run at IEEE precision on the CUDA cores (unrolled FMAs): at most 32 rows
    a block, because the unrolled code grows with the tile and ptxas's time with it (sm_90, Triton 3.6,
    octopus b=2, 64 keys a step: 8 / 11 / 23 s to compile at 16 / 32 / 64 rows, over 120 s at 128).

    One query row past the score tables' 64 window tokens (under them every codec with codes takes
    `_table_attention`): no tensor cores, word tiles; at d <= 64 256 keys a step, 8 warps, 8 programs per SM,
    at d = 128 128 keys, 4 warps, 4 programs per SM: the configurations `bench --tune` picked (H200,
    turboquant-mse b=2, 1 q x 8k/32k/128k keys: 0.028 / 0.089 / 0.300 ms at d=64 x 16 heads, 0.061 / 0.180 /
    0.759 ms at d=128 x 32 heads, against 0.053 / 0.130 / 0.411 and 0.100 / 0.313 / 1.132 ms with the earlier
    32 keys, 4 warps, 8 programs per SM, which an octopus b=2 sweep had chosen before octopus moved to score
    tables). A block of queries: up to 128 rows (64 at d > 64), 64 keys a step, 4 warps; gathered codes
    for folded octopus rows, word tiles otherwise. The H200 sweep at AAR shapes (d=64, 16-bit operands),
    octopus b=2 at 128 rows, 64 keys a step, 4 warps: gathered codes with folded rows 0.278 ms at B=64 and
    2.105 ms at B=512, against 0.324 / 2.49 ms unfolded from word tiles, 0.288 / 2.196 ms for folded rows
    from word tiles and 0.104 / 0.748 ms for bf16 SDPA over native K/V; 8 warps, 32 or 128 keys a step, 64
    rows and 2 stages were all slower. turboquant-mse b=2 at B=64 was fastest with word tiles (0.252 ms
    against 0.280 for gathers at 128 keys x 8 warps). d=128 query blocks take the same choices untimed.
    """
    single = n_rows == 1
    max_rows = 32 if fp32 else 128 if d <= 64 else 64
    block_m = cfg.block_m or (1 if single else min(max(16, _pow2(n_rows)), max_rows))
    # one row: (keys a step, warps, programs per SM) = (256, 8, 8) at d <= 64, (128, 4, 4) above
    block_n = cfg.block_n or ((256 if d <= 64 else 128) if single else (32 if d > 64 else 64))
    if _interpreting() and cfg.block_n is None:  # per-op cost on the CPU: fewer, larger key blocks
        block_n = 128
    num_warps = cfg.num_warps or (8 if single and d <= 64 else 4)
    tile = not (folded and block_m > 1)
    programs = programs_bh * _cdiv(n_rows, block_m)
    per_sm = cfg.programs_per_sm or (4 if single and d > 64 else 8)
    want = _cdiv(per_sm * _sm_count(device), programs)
    num_splits = max(1, min(want, _cdiv(length, cfg.split_min_keys or 4 * block_n)))
    num_splits, chunk = split_chunk(length, num_splits, block_n)
    if want > 1 and t_win and length and (cfg.window_split is None or cfg.window_split):
        num_splits += 1  # its chunk starts past the store: the window alone
    return block_m, block_n, num_warps, tile, num_splits, chunk


def _wide_constants(wide: WideSegment, w_map: torch.Tensor, block_m: int, d: int) -> dict:
    """`_attn_fwd_wide_kernel`'s W_ constants: the wide segment's widths (`w_map`: its query map)."""
    wc, wv = wide.codec, wide.values
    c = _codec_constants(wc)
    return dict(W_NP=w_map.shape[-1], W_LP=c["LP"], W_K_BITS=c["K_BITS"],
                W_K_CODES=c["K_CODES"], W_K_WORDS=c["K_WORDS"], W_B_DIR=c["B_DIR"], W_B_RHO=c["B_RHO"],
                W_DIR_TABLE=c["DIR_TABLE"], W_K_WP=c["K_WP"], W_K_WP2=_pow2(max(1, d * wc.code_bits // 64)),
                W_TILE=not (wc.kind.gathers(wc) and block_m > 1), W_V_BITS=wv.bits,
                W_V_WORDS=wv.codes.shape[-1], W_V_WP=_pow2(wv.codes.shape[-1]))


def attention_flash(q_BHTD: torch.Tensor, keys: PackedKeys, values: PackedValues, length: int,
                    k_window: torch.Tensor | None, v_window: torch.Tensor | None, codec: KernelCodec,
                    scale: float, num_splits: int | None = None,
                    config: AttnConfig | None = None, wide: WideSegment | None = None) -> torch.Tensor:
    """softmax(scale * q.[K_hat; K_win]) @ [V_hat; V_win] by the split-K kernel, for arguments the selector
    has checked (`select.attention`: the shapes there; `codec` on q's device). `num_splits` forces the
    split-K count (default: enough programs to fill the GPU); `config` overrides the launch heuristic
    (AttnConfig). One kernel launch (plus the split merge); the query rotation and layouts happen in the
    kernel's prologue, so the host does no tensor math. `wide`: a second store in the same softmax (the
    selector checked it), read by split 0."""
    b, hq, tq, d = q_BHTD.shape
    h = keys.codes.shape[1]
    t_cap = keys.codes.shape[2]
    t_win = 0 if k_window is None else k_window.shape[2]
    dev = q_BHTD.device
    grp = hq // h
    n_rows = grp * tq
    cfg = config or AttnConfig()
    kind = codec.kind
    folded = kind.gathers(codec)
    half = q_BHTD.dtype in (torch.bfloat16, torch.float16)  # 16-bit queries: tensor-core operands
    block_m, block_n, warps, tile, splits, chunk = _launch_shape(cfg, n_rows, d, length, t_win, b * h, dev,
                                                                 folded, fp32=not half)
    if num_splits is not None:
        splits, chunk = split_chunk(length, min(int(num_splits), max(1, _cdiv(length, block_n))), block_n)

    # matmul operands with tensor cores in the queries' dtype when it is 16-bit (decoded K, V and P too, as
    # flash attention does), else fp32 at IEEE precision; accumulation is fp32 always. 16-bit queries
    # project exactly in their own dtype (the map is small integers); input_precision only matters for fp32
    # operands, 16-bit ones take "tf32", tl.dot's default, as every bf16 flash-attention kernel does
    use_dot = block_m >= 16
    q16 = use_dot and half
    opd = q_BHTD.dtype if q16 else torch.float32
    prec = "ieee" if opd == torch.float32 else "tf32"
    qmap = codec.query_map(q_BHTD.dtype if q16 else torch.float32)
    # At d >= 128 the d-wide score dots (all but the triplet kind's, and the QJL term) run as two of d/2,
    # the 64-deep shape the triplet dots have: with d-wide dots and bf16 operands the H200 gave relative RMS
    # errors of 1.6e-2..2.5e-2 at d = 128, with halves 1.7e-3..2.0e-3, within tolerance.
    halves = d >= 128 and (codec.has_qjl or kind.halves)
    interpreting = _interpreting()
    if interpreting:
        _interpreter_16bit_dot()
    if q_BHTD.stride(-1) != 1:
        q_BHTD = q_BHTD.contiguous()
    if not t_win:  # any tensor serves as the never-read window
        k_window = v_window = q_BHTD
    if k_window.stride(-1) != 1:
        k_window = k_window.contiguous()
    if v_window.stride(-1) != 1:
        v_window = v_window.contiguous()
    tab_a, tab_b = kind.attention_tables(codec)
    qk_scale = scale * LOG2E
    rot_scale, qjl_scale = qk_scale / math.sqrt(d), qk_scale * math.sqrt(math.pi / (2 * d)) / d

    total_rows = b * h * n_rows
    out = torch.empty(b, hq, tq, d, device=dev, dtype=q_BHTD.dtype)
    direct = splits == 1
    opart, lse = split_buffers(out, splits, total_rows, d)
    store = (*keys.launch_args(codec.has_qjl), *values.launch_args(),
             k_window, v_window, k_window.stride(0), k_window.stride(1), k_window.stride(2),
             v_window.stride(0), v_window.stride(1), v_window.stride(2), tab_a, tab_b)
    ints = (h, grp, tq, n_rows, t_cap, length, t_win, chunk, splits, total_rows)
    consts = dict(**_codec_constants(codec), NP=qmap.shape[-1],
                  V_GROUP=values.group, V_BITS=values.bits, V_WORDS=values.codes.shape[-1],
                  V_WP=_pow2(values.codes.shape[-1]), TILE=tile,
                  DIRECT=direct, BLOCK_M=block_m, BLOCK_N=block_n, PREC=prec,
                  PREC_Q="ieee" if qmap.dtype == torch.float32 else "tf32",
                  OPD=_TL_DTYPES[opd], RNE_BY_HAND=interpreting, HALVES=halves,
                  K_WP2=_pow2(max(1, d * codec.code_bits // 64)), BLOCK_W=cfg.block_w or block_n,
                  num_warps=warps, num_stages=cfg.num_stages or 1)
    grid = (b * h, _cdiv(n_rows, block_m), splits)
    q_args = (q_BHTD, q_BHTD.stride(0), q_BHTD.stride(1), q_BHTD.stride(2), qmap)
    if wide is None:
        _attn_fwd_kernel[grid](*q_args, *store, out, opart, lse, *ints, qk_scale, rot_scale, qjl_scale,
                               **consts)
    else:
        w_map = wide.codec.query_map(qmap.dtype)
        _attn_fwd_wide_kernel[grid](
            *q_args, *store, *wide.keys.launch_args(codec.has_qjl), *wide.values.launch_args(),
            *wide.codec.kind.attention_tables(wide.codec), w_map,
            out, opart, lse, *ints, wide.keys.codes.shape[2], wide.length, qk_scale, rot_scale, qjl_scale,
            **consts, **_wide_constants(wide, w_map, block_m, d))
    if not direct:
        block_r = 32
        _merge_kernel[(_cdiv(total_rows, block_r),)](opart, lse, out, total_rows, splits, D=d,
                                                           BLOCK_R=block_r, num_warps=4)
    return out
