"""One query row per KV head from per-query score tables (triplet, scalar and polar sections): the attention
kernel and its launcher (the tables: query_tables.py).

With one query row per KV head the decoded key is used exactly once, so decoding it is waste: the score
of key n is a sum of terms that each depend only on one code of the key,

    q . k_n = gamma_n * sum_i rho(c_ni) * (q_rot,i . n_hat(dir(c_ni)))           (octopus, formats.md)

so a table T[i, c] = qk_scale * rho(c) * (q_rot,i . n_hat(dir(c))) built once per query row turns the key loop
into one lookup and one add per triplet (asymmetric distance computation, as in product quantization). The
scalar section (turboquant-*: q . k_n = gamma_n * sum_j q_rot[j] C_coord[c_nj]) groups G adjacent coordinates,
whose codes lie side by side in the bit stream, into one table code of G b bits: T[i, e] = qk_scale *
sum_{j < G} q_rot[G i + j] C_coord[e_j] (table_layout: the most coordinates within SCALAR_GROUP_BITS bits),
so the same key loop runs over the groups. The QJL term (R' q_rot) . sigma_n takes a second table over the
sign bytes: S[p, e] = qk_scale * sum_t q_j[8p + t] * (2 bit_t(e) - 1), one lookup per 8 signs. Tables live in
global memory and are read through L1 (a row's table is 11-22 KB at d = 64-128, b = 2, octopus; 5.5-11 KB
turboquant-mse). The polar section (polarquant: u_hat's coordinates are products of cos and sin along
a binary tree of angles) does not separate into per-code terms, but its score folds up the tree: with
S_-1[i] = q_rot[i] and S_lv[m] = cos(psi_lv,m) S_lv-1[2m] + sin(psi_lv,m) S_lv-1[2m+1],
q . k_n = gamma_n * S_top. A table per subtree of the bottom G levels (query_tables) gives its S_G-1 in one
lookup; each level above costs a cos | sin pair read and two FMAs an angle (`_polar_score_step`).

Two phases per program, so each runs in the layout that suits it (one key a thread for the scores, keys x
channels for the values) with few registers and no per-block cross-thread reductions:
1. scores: each thread owns whole keys, loads a key's code words once each and cuts the codes with
   compile-time shifts (the unrolled loops), adds one table entry per code; the scores (log2 units,
   4 bytes a key) go to a scratch row, and their maximum m is kept.
2. values: p_n = 2^(s_n - m) (an exact two-pass softmax: m is known), and sum_n p_n (c_nj scale_ng +
   min_ng) accumulated elementwise per thread and reduced once at the end. Group-16 values up to 8 bits
   (`values_in_place`): a channel costs one mask and one FMA, the code masked where it lies read as an fp32
   subnormal (c * 2^pos * 2^-149, exact) and the per-column power of two removed after the loop; other value
   formats cut each key's word tile (`values_by_key`).
For group-16 values the phases alternate by stages of STAGE_K keys (an online softmax by stages: the running
maximum rescales the accumulators when it grows), so warps done with a stage's values score the next stage
while others still accumulate, and the scores are re-read while still in L2.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .bits import masked_load, store_rounded
from .codec_decode import SECTIONS, polar_cos_sin
from .launch import _cdiv, _interpreting, _pow2, _sm_count, split_buffers, split_chunk
from .query_tables import TableLayout, build_tables, table_layout
from .spec import KernelCodec, PackedKeys, PackedValues
from .value_decode import in_place_sum, values_by_key, values_in_place


@triton.jit
def _cut(w_cur, w_next, SH: tl.constexpr, N_BITS: tl.constexpr):
    """The N_BITS-bit code starting at bit SH of w_cur (continuing into w_next when it straddles), int32."""
    if SH + N_BITS <= 32:
        c = (w_cur >> SH) & ((1 << N_BITS) - 1)
    else:
        c = ((w_cur >> SH) | (w_next << (32 - SH))) & ((1 << N_BITS) - 1)
    return c.to(tl.int32, bitcast=True)


@triton.jit(do_not_specialize=["total_rows", "n_splits"])
def _merge_splits_kernel(opart_ptr, lse_ptr, out_ptr, total_rows, n_splits, D: tl.constexpr,
                         BLOCK_S: tl.constexpr):
    """out[r] = sum_s 2^(lse_s - m) o_s / sum_s 2^(lse_s - m), one program per row r, BLOCK_S splits a step
    (flash_decode's merge with the splits, not the rows, across the threads: a few long rows here)."""
    r = tl.program_id(0)
    sp = tl.arange(0, BLOCK_S)
    dcol = tl.arange(0, D)
    m = tl.full((), float("-inf"), tl.float32)
    for s0 in range(0, n_splits, BLOCK_S):
        ok = s0 + sp < n_splits
        lse = tl.load(lse_ptr + (s0 + sp) * total_rows + r, mask=ok, other=float("-inf"))
        m = tl.maximum(m, tl.max(lse, 0))
    m = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros((D,), tl.float32)
    den = tl.zeros((), tl.float32)
    for s0 in range(0, n_splits, BLOCK_S):
        ok = s0 + sp < n_splits
        part = (s0 + sp) * total_rows + r
        w = tl.exp2(tl.load(lse_ptr + part, mask=ok, other=float("-inf")) - m)
        o = tl.load(opart_ptr + part[:, None] * D + dcol[None, :], mask=ok[:, None], other=0.0)
        acc += tl.sum(w[:, None] * o, axis=0)
        den += tl.sum(w, 0)
    store_rounded(out_ptr + r * D + dcol, acc / tl.where(den > 0, den, 1.0), None)


@triton.jit
def _word_pair(krow, n_ok, WI: tl.constexpr, K_WORDS: tl.constexpr, MASKED: tl.constexpr):
    """Words WI and WI + 1 of each key row (one [BK, 2] load, a thread's two words adjacent: an 8-byte load
    when the rows are 8-byte aligned); the second is 0 past the row. MASKED: rows where n_ok is false."""
    if WI + 1 < K_WORDS:
        two = masked_load(krow[:, None] + (WI + tl.arange(0, 2))[None, :], n_ok[:, None], 0, MASKED)
        a, b = tl.split(two.to(tl.uint32, bitcast=True))
    else:
        a = masked_load(krow + WI, n_ok, 0, MASKED).to(tl.uint32, bitcast=True)
        b = tl.zeros_like(a)
    return a, b


@triton.jit
def _key_words(kc_ptr, kg_ptr, n, n_ok, K_WORDS: tl.constexpr, PAIRS: tl.constexpr, MASKED: tl.constexpr):
    """(gamma fp32, the code words as a tuple of uint32, their xor with gamma's bits) of keys n: every load of
    a step first (PAIRS: two words a load), the xor for the gate of its table reads (_score_step)."""
    krow = kc_ptr + n.to(tl.int64) * K_WORDS
    gamma = masked_load(kg_ptr + n, n_ok, 0.0, MASKED).to(tl.float32)
    ws = ()
    for wi in tl.static_range(0, K_WORDS, 1 + PAIRS):
        if PAIRS:
            pa, pb = _word_pair(krow, n_ok, wi, K_WORDS, MASKED)
            ws = ws + (pa, pb)
        else:
            ws = ws + (masked_load(krow + wi, n_ok, 0, MASKED).to(tl.uint32, bitcast=True),)
    mix = gamma.to(tl.uint32, bitcast=True)
    for wi in tl.static_range(K_WORDS):
        mix = mix ^ ws[wi]
    return gamma, ws, mix


@triton.jit
def _keep_scores(s_ptr, n, n_ok, s, m_vec, MASKED: tl.constexpr):
    """Store a step's scores s of keys n (those not n_ok left out when MASKED); the running maximum."""
    if MASKED:
        tl.store(s_ptr + n, s, mask=n_ok)
        return tl.maximum(m_vec, tl.where(n_ok, s, float("-inf")))
    else:
        tl.store(s_ptr + n, s)
        return tl.maximum(m_vec, s)


@triton.jit
def _score_step(row_lut, qlut_ptr, rho_ptr, kc_ptr, kg_ptr, ks_ptr, kr_ptr, s_ptr, r, n0, end, qjl_coef, zero,
                m_vec, rho0, rho1, D: tl.constexpr, L: tl.constexpr, K_BITS: tl.constexpr,
                K_WORDS: tl.constexpr, B_RHO: tl.constexpr, N_ENTRIES: tl.constexpr, FOLD_RHO: tl.constexpr,
                HAS_QJL: tl.constexpr, BLOCK_K: tl.constexpr, PAIRS: tl.constexpr, MASKED: tl.constexpr):
    """One step of _store_scores: keys [n0, n0 + BLOCK_K), those from `end` on masked off when MASKED.

    Every code word and norm of the step is loaded first (PAIRS: two words a load) and every table read is
    predicated on all of them (`gate`, always true: `zero` is 0 at run time, but the compiler cannot know), so
    the compiler issues the step's loads together: one memory round trip a step instead of one per word
    (ptxas otherwise sinks each load to its first use)."""
    n = n0 + tl.arange(0, BLOCK_K)
    n_ok = n < end
    s = tl.zeros((BLOCK_K,), tl.float32)
    S_WORDS: tl.constexpr = D // 32
    srow = ks_ptr + n.to(tl.int64) * S_WORDS
    gamma, ws, mix = _key_words(kc_ptr, kg_ptr, n, n_ok, K_WORDS, PAIRS, MASKED)
    if HAS_QJL:
        g_r = masked_load(kr_ptr + n, n_ok, 0.0, MASKED).to(tl.float32)
        sws = ()
        for wi in tl.static_range(S_WORDS):
            sws = sws + (masked_load(srow + wi, n_ok, 0, MASKED).to(tl.uint32, bitcast=True),)
            mix = mix ^ sws[wi]
        mix = mix ^ g_r.to(tl.uint32, bitcast=True)
    gate = (mix != 0x5BD1E995).to(tl.int32) + (zero == 0).to(tl.int32) > 0
    w_cur = ws[0]
    for wi in tl.static_range(K_WORDS):
        if wi + 1 >= K_WORDS:
            w_next = w_cur
        else:
            w_next = ws[wi + 1]
        for i in tl.static_range((32 * wi + K_BITS - 1) // K_BITS, (32 * wi + 31) // K_BITS + 1):
            if i < L:
                code = _cut(w_cur, w_next, i * K_BITS - 32 * wi, K_BITS)
                if FOLD_RHO:
                    s += tl.load(row_lut + i * N_ENTRIES + code, mask=gate)
                else:
                    t = tl.load(row_lut + i * N_ENTRIES + (code >> B_RHO), mask=gate)
                    if B_RHO == 1:
                        rho = tl.where((code & 1) != 0, rho1, rho0)
                    else:
                        rho = tl.load(rho_ptr + (code & ((1 << B_RHO) - 1)))
                    s += rho * t
        w_cur = w_next
    if HAS_QJL:
        sq = tl.zeros((BLOCK_K,), tl.float32)
        for wi in tl.static_range(S_WORDS):
            w = sws[wi]
            for byte in tl.static_range(4):
                e = ((w >> (8 * byte)) & 255).to(tl.int32, bitcast=True)
                sq += tl.load(qlut_ptr + r * (D // 8 * 256) + (4 * wi + byte) * 256 + e, mask=gate)
        s += qjl_coef * g_r * sq
    return _keep_scores(s_ptr, n, n_ok, s * gamma, m_vec, MASKED)


@triton.jit
def _field(ws, OFF: tl.constexpr, WIDTH: tl.constexpr):
    """The WIDTH-bit field at bit OFF of the code words ws (a tuple; it may straddle two), int32."""
    WI: tl.constexpr = OFF // 32
    SH: tl.constexpr = OFF % 32
    if SH + WIDTH <= 32:
        c = (ws[WI] >> SH) & ((1 << WIDTH) - 1)
    else:
        c = ((ws[WI] >> SH) | (ws[WI + 1] << (32 - SH))) & ((1 << WIDTH) - 1)
    return c.to(tl.int32, bitcast=True)


@triton.jit
def _polar_score_step(row_lut, cs_ptr, kc_ptr, kg_ptr, s_ptr, n0, end, zero, m_vec, D: tl.constexpr,
                      LOG2D: tl.constexpr, G: tl.constexpr, A_BITS: tl.constexpr, K_WORDS: tl.constexpr,
                      N_ENTRIES: tl.constexpr, BLOCK_K: tl.constexpr, PAIRS: tl.constexpr,
                      MASKED: tl.constexpr):
    """One step of _store_scores for the polar section (module docstring): keys [n0, n0 + BLOCK_K).

    Subtree m's table code (query_tables._polar_tables_kernel) gathers level lv's 2^(G-1-lv) angle codes
    from D - (D >> lv) + m 2^(G-1-lv) on into bits A_BITS (2^G - 2^(G-lv)) up; level lv >= G's angle m is
    code D - (D >> lv) + m, its cos | sin pair at cs_ptr + 2 (lv 2^A_BITS + code). Loads gated as in
    _score_step."""
    n = n0 + tl.arange(0, BLOCK_K)
    n_ok = n < end
    gamma, ws, mix = _key_words(kc_ptr, kg_ptr, n, n_ok, K_WORDS, PAIRS, MASKED)
    gate = (mix != 0x5BD1E995).to(tl.int32) + (zero == 0).to(tl.int32) > 0
    sub = ()
    for m in tl.static_range(D >> G):
        e = tl.zeros((BLOCK_K,), tl.int32)
        for lv in tl.static_range(G):
            e = e | (_field(ws, A_BITS * (D - (D >> lv) + m * (1 << (G - 1 - lv))), A_BITS << (G - 1 - lv))
                     << (A_BITS * ((1 << G) - (1 << (G - lv)))))
        sub = sub + (tl.load(row_lut + m * N_ENTRIES + e, mask=gate),)
    for lv in tl.static_range(G, LOG2D):
        up = ()
        for m in tl.static_range(D >> (lv + 1)):
            pair = cs_ptr + 2 * (lv * (1 << A_BITS) + _field(ws, A_BITS * (D - (D >> lv) + m), A_BITS))
            up = up + (tl.load(pair) * sub[2 * m] + tl.load(pair + 1) * sub[2 * m + 1],)
        sub = up
    return _keep_scores(s_ptr, n, n_ok, sub[0] * gamma, m_vec, MASKED)


@triton.jit
def _store_scores(lut_ptr, qlut_ptr, rho_ptr, kc_ptr, kg_ptr, ks_ptr, kr_ptr, s_ptr, r, start, end, qjl_coef,
                  zero, D: tl.constexpr, L: tl.constexpr, K_BITS: tl.constexpr, K_WORDS: tl.constexpr,
                  B_RHO: tl.constexpr, N_ENTRIES: tl.constexpr, FOLD_RHO: tl.constexpr, HAS_QJL: tl.constexpr,
                  BLOCK_K: tl.constexpr, PAIRS: tl.constexpr, POLAR_G: tl.constexpr, A_BITS: tl.constexpr,
                  LOG2D: tl.constexpr):
    """Phase 1: the scores (log2 units) of compressed keys [start, end) of row r into s_ptr; their maximum.
    The key pointers (kc, kg, ks, kr) and s_ptr point at row r already; the tables are indexed by r.

    A thread owns whole keys: it loads each code word of its key once and cuts the codes with constant
    shifts (the unrolled loops), then adds one table entry per triplet (and one per 8 QJL signs). Whole
    steps run without load masks, the tail step with them."""
    row_lut = lut_ptr + r * (L * N_ENTRIES)
    if not FOLD_RHO:
        rho0 = tl.load(rho_ptr)
        rho1 = tl.load(rho_ptr + 1)
    else:
        rho0 = 1.0
        rho1 = 1.0
    m_vec = tl.full((BLOCK_K,), float("-inf"), tl.float32)
    full = start + (end - start) // BLOCK_K * BLOCK_K
    for n0 in range(start, full, BLOCK_K):
        if POLAR_G > 0:
            m_vec = _polar_score_step(row_lut, rho_ptr, kc_ptr, kg_ptr, s_ptr, n0, end, zero, m_vec, D, LOG2D,
                                      POLAR_G, A_BITS, K_WORDS, N_ENTRIES, BLOCK_K, PAIRS, False)
        else:
            m_vec = _score_step(row_lut, qlut_ptr, rho_ptr, kc_ptr, kg_ptr, ks_ptr, kr_ptr, s_ptr, r, n0, end,
                                qjl_coef, zero, m_vec, rho0, rho1, D, L, K_BITS, K_WORDS, B_RHO, N_ENTRIES,
                                FOLD_RHO, HAS_QJL, BLOCK_K, PAIRS, False)
    if full < end:
        if POLAR_G > 0:
            m_vec = _polar_score_step(row_lut, rho_ptr, kc_ptr, kg_ptr, s_ptr, full, end, zero, m_vec, D,
                                      LOG2D, POLAR_G, A_BITS, K_WORDS, N_ENTRIES, BLOCK_K, PAIRS, True)
        else:
            m_vec = _score_step(row_lut, qlut_ptr, rho_ptr, kc_ptr, kg_ptr, ks_ptr, kr_ptr, s_ptr, r, full,
                                end, qjl_coef, zero, m_vec, rho0, rho1, D, L, K_BITS, K_WORDS, B_RHO,
                                N_ENTRIES, FOLD_RHO, HAS_QJL, BLOCK_K, PAIRS, True)
    return tl.max(m_vec, 0)


@triton.jit
def _window_scores(qn_ptr, kw_base, stride_kwt, r, t_win, qk_scale, D: tl.constexpr, BLOCK_W: tl.constexpr):
    """Scores (log2 units) of the first BLOCK_W native window keys, -inf past t_win."""
    n = tl.arange(0, BLOCK_W)
    n_ok = n < t_win
    dcol = tl.arange(0, D)
    qn = tl.load(qn_ptr + r * D + dcol).to(tl.float32)
    kt = tl.load(kw_base + n[:, None] * stride_kwt + dcol[None, :], mask=n_ok[:, None], other=0.0)
    return tl.where(n_ok, tl.sum(kt.to(tl.float32) * qn[None, :], axis=1) * qk_scale, float("-inf"))


# the per-call integers used only in bounds, masks and split indices are not specialised on (== 1, % 16), as
# flash.PER_CALL_INTS: a decode step's store length and window, the split count and the rows; t_cap (row base
# of the score scratch), chunk (a split's first key) and the strides keep it (they align vector accesses)
@triton.jit(do_not_specialize=["t_comp", "t_win", "n_splits", "total_rows"])
def _adc_attn_kernel(
    lut_ptr, qlut_ptr, qn_ptr, rho_ptr,
    kc_ptr, kg_ptr, ks_ptr, kr_ptr,
    vc_ptr, vs_ptr, vm_ptr,
    kw_ptr, vw_ptr, stride_kwb, stride_kwh, stride_kwt, stride_vwb, stride_vwh, stride_vwt,
    s_ptr, out_ptr, opart_ptr, lse_ptr,
    H, t_cap, t_comp, t_win, chunk, n_splits, total_rows, qk_scale, qjl_coef, zero,
    D: tl.constexpr, L: tl.constexpr, K_BITS: tl.constexpr, K_WORDS: tl.constexpr, B_RHO: tl.constexpr,
    N_ENTRIES: tl.constexpr, FOLD_RHO: tl.constexpr, HAS_QJL: tl.constexpr,
    V_GROUP: tl.constexpr, V_BITS: tl.constexpr, V_WORDS: tl.constexpr, V_WP: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_W: tl.constexpr, DIRECT: tl.constexpr,
    V_GT: tl.constexpr, STAGE_K: tl.constexpr, POLAR_G: tl.constexpr, A_BITS: tl.constexpr,
    LOG2D: tl.constexpr, VALUE_STAGES: tl.constexpr,
):
    """One (query row, split) program: score tables instead of decoded keys (module docstring).

    Split s covers compressed keys [s*chunk, (s+1)*chunk); the last split also covers the native window
    (at most BLOCK_W keys, score q . k * qk_scale). Phase 1 writes the split's scores to s_ptr (row r,
    t_cap entries) and takes their maximum m; phase 2 (after a barrier) reads them back and accumulates
    p = 2^(s - m) times the dequantized values, elementwise per thread, reduced once at the end. DIRECT:
    one split writes the normalised output; otherwise o/l and the log2-sum-exp go to the partial buffers
    of the merge kernel. Group-16 values up to 8 bits go through values_in_place (V_GT groups of a key a
    thread row; widths not dividing 32 need V_GT = 2), the split in stages of STAGE_K keys, each scored, then
    its values accumulated, the accumulators rescaled when the running maximum grows; other value formats
    through values_by_key after the whole split is scored. POLAR_G > 0: the polar section's scores
    (_polar_score_step, its bottom POLAR_G levels a table code, A_BITS bits an angle; rho_ptr then holds the
    angles' cos | sin pairs). The score phase loads code words two at a time
    where a key has an even number of them (PAIRS) and predicates its table reads on all of a step's loads
    (`zero` must be 0; _score_step).
    """
    r = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = r // H
    h = r % H
    G: tl.constexpr = D // V_GROUP
    row = r.to(tl.int64) * t_cap
    start = pid_s * chunk
    end = tl.minimum(start + chunk, t_comp)
    s_row = s_ptr + row
    last = pid_s == n_splits - 1
    n_win = tl.where(last, t_win, 0)
    kw_base = kw_ptr + b * stride_kwb + h * stride_kwh
    PAIRS: tl.constexpr = K_WORDS % 2 == 0  # odd rows are not 8-byte aligned: a pair would need a conversion
    IN_PLACE: tl.constexpr = (V_GROUP == 16) and (V_BITS <= 8) and ((32 % V_BITS == 0) or (V_GT == 2))
    if IN_PLACE:
        # stages of STAGE_K keys: scores, then their values, the running maximum
        # rescaling the accumulators when it grows (an online softmax by stages, exact like the two-pass one)
        R: tl.constexpr = BLOCK_V * G // V_GT
        acc_t = tl.zeros((R, 16 * V_GT), tl.float32)
        acc_min = tl.zeros((R, V_GT), tl.float32)
        l_vec = tl.zeros((R, 1), tl.float32)
        m_run = tl.full((), float("-inf"), tl.float32)
        for c0 in range(start, end, STAGE_K):
            c1 = tl.minimum(c0 + STAGE_K, end)
            m_c = _store_scores(lut_ptr, qlut_ptr, rho_ptr, kc_ptr + row * K_WORDS, kg_ptr + row,
                                ks_ptr + row * (D // 32), kr_ptr + row, s_row, r, c0, c1, qjl_coef, zero,
                                D, L, K_BITS, K_WORDS, B_RHO, N_ENTRIES, FOLD_RHO, HAS_QJL, BLOCK_K, PAIRS,
                                POLAR_G, A_BITS, LOG2D)
            tl.debug_barrier()
            if m_c > m_run:
                alpha = tl.exp2(m_run - m_c)  # 0 at the first stage
                acc_t *= alpha
                acc_min *= alpha
                l_vec *= alpha
                m_run = m_c
            acc_t, acc_min, l_vec = values_in_place(vc_ptr + row * V_WORDS, vs_ptr + row * G,
                                                     vm_ptr + row * G, s_row, m_run, c0, c1, acc_t, acc_min,
                                                     l_vec, G, V_BITS, BLOCK_V, V_GT, VALUE_STAGES)
        s_win = _window_scores(qn_ptr, kw_base, stride_kwt, r, n_win, qk_scale, D, BLOCK_W)
        m = tl.maximum(m_run, tl.max(s_win, 0))
        m = tl.where(m == float("-inf"), 0.0, m)
        alpha = tl.exp2(m_run - m)
        acc, l_i = in_place_sum(acc_t * alpha, acc_min * alpha, l_vec * alpha, G, V_BITS, BLOCK_V, V_GT)
    else:
        m = _store_scores(lut_ptr, qlut_ptr, rho_ptr, kc_ptr + row * K_WORDS, kg_ptr + row,
                          ks_ptr + row * (D // 32), kr_ptr + row, s_row, r, start, end, qjl_coef, zero,
                          D, L, K_BITS, K_WORDS, B_RHO, N_ENTRIES, FOLD_RHO, HAS_QJL, BLOCK_K, PAIRS,
                          POLAR_G, A_BITS, LOG2D)
        s_win = _window_scores(qn_ptr, kw_base, stride_kwt, r, n_win, qk_scale, D, BLOCK_W)
        m = tl.maximum(m, tl.max(s_win, 0))
        m = tl.where(m == float("-inf"), 0.0, m)
        tl.debug_barrier()

        # phase 2: sum_n p_n (c_nj * scale_ng + min_ng)
        acc, l_i = values_by_key(vc_ptr + row * V_WORDS, vs_ptr + row * G, vm_ptr + row * G, s_row, m,
                                  start, end, D, V_GROUP, V_BITS, V_WORDS, V_WP, BLOCK_V)

    # the native window (last split)
    p_win = tl.exp2(s_win - m)
    l_i += tl.sum(p_win, 0)
    wn = tl.arange(0, BLOCK_W)
    dcol = tl.arange(0, D)
    vw_base = vw_ptr + b * stride_vwb + h * stride_vwh
    vt = tl.load(vw_base + wn[:, None] * stride_vwt + dcol[None, :], mask=(wn < n_win)[:, None], other=0.0)
    pv = tl.reshape(vt.to(tl.float32), (BLOCK_W, G, V_GROUP)) * tl.reshape(p_win, (BLOCK_W, 1, 1))
    acc += tl.sum(pv, axis=0)

    o = tl.reshape(acc, (D,)) / tl.where(l_i > 0, l_i, 1.0)
    if DIRECT:
        store_rounded(out_ptr + r * D + dcol, o, None)
    else:
        part = pid_s * total_rows + r
        tl.store(opart_ptr + part * D + dcol, o)
        tl.store(lse_ptr + part, m + tl.log2(l_i))


LOG2E = 1.4426950408889634


MAX_ENTRIES = 4096  # larger direction tables (b_dir >= 7) leave the table path to flash_decode

MAX_WINDOW = 64

STAGE_KEYS = 1024  # keys scored before their values are accumulated (group-16 values)

# a register cap where a thread holds one value row and the key loop fits under it: it keeps 3 programs of 8
# warps on an SM with the gated loads, without spills (sm_90, d=64 and 128): the triplet section without QJL
# (octopus b=2-4) or with C_rho folded into its table (octopus-qjl b <= 2), the scalar section up to
# CAPPED_SCALAR_WORDS code words a key, QJL sign words counted twice (turboquant-mse b <= 7 and -qjl b <= 6 at
# d=128, every b at d=64; mse b=8 (32 words) and qjl b=7 (24 + 2 x 4) spill under it, which the rule fits).
# Two value rows a thread and octopus-qjl at b=3-4 (C_rho looked up) spill under it too, so those run uncapped
MAX_REGISTERS = 80
CAPPED_SCALAR_WORDS = 28


def adc_limit(codec: KernelCodec, n_rows: int, t_win: int = 0, group: int | None = None) -> str | None:
    """Why the table path cannot serve this call (None when it can): one query row, a codec of a section with
    score tables (triplet, scalar, polar) with codes to look up and tables of at most MAX_ENTRIES entries a
    code, a native window of at most MAX_WINDOW tokens. `group`: attention_adc's."""
    if t_win > MAX_WINDOW:
        return f"a native window of {t_win} tokens (at most {MAX_WINDOW})"
    if n_rows != 1:
        return f"{n_rows} query rows per KV head (the table path takes 1)"
    if not SECTIONS[codec.decode].score_tables:
        return f"the {codec.decode} section (it has no score tables)"
    if codec.code_bits == 0:
        return "keys without codes (0 bits a code: nothing to look up)"
    if group is not None and (codec.decode != "scalar" or not isinstance(group, int) or group < 1):
        return f"group={group!r} (a positive number of coordinates, for the scalar section only)"
    entries = table_layout(codec, group).entries
    if entries > MAX_ENTRIES:
        what = "a direction table" if codec.decode == "triplet" else "a group table"
        return f"{what} of {entries} entries a code (at most {MAX_ENTRIES})"
    return None


def attention_constants(codec: KernelCodec, lay: TableLayout, values: PackedValues, t_win: int, block_k: int,
                        block_v: int, num_warps: int, value_stages: int = 0) -> tuple[dict, dict]:
    """The attention kernel's compile-time constants but DIRECT, and its launch options (num_warps, the
    register cap), as attention_adc launches it. A thread takes two value groups of a key per row where a
    step still has a row for every thread (always for widths not dividing 32), else one; with one row a
    thread and a key loop that fits (MAX_REGISTERS' comment) the kernel runs under MAX_REGISTERS."""
    d = codec.head_dim
    n_groups = d // values.group
    if 32 % values.bits and n_groups % 2 == 0:  # widths not dividing 32 cut pairs of groups (whole words)
        value_groups = 2
    else:  # fewer rows than threads would change the tile's layout (replicated rows)
        value_groups = 2 if n_groups % 2 == 0 and block_v * n_groups // 2 >= 32 * num_warps else 1
    value_groups = min(value_groups, n_groups)
    if codec.decode == "scalar":
        fits = codec.code_words + (2 * -(-d // 32) if codec.has_qjl else 0) <= CAPPED_SCALAR_WORDS
    elif codec.decode == "polar":
        fits = False
    else:
        fits = not codec.has_qjl or lay.fold_rho
    capped = block_v * n_groups // value_groups == 32 * num_warps and fits
    v_words = -(-d * values.bits // 32)
    consts = dict(D=d, L=lay.codes, K_BITS=lay.bits, K_WORDS=codec.code_words, B_RHO=codec.param("b_rho"),
                  N_ENTRIES=lay.entries, FOLD_RHO=lay.fold_rho, HAS_QJL=codec.has_qjl,
                  V_GROUP=values.group, V_BITS=values.bits, V_WORDS=v_words, V_WP=_pow2(v_words),
                  BLOCK_K=block_k, BLOCK_V=block_v, BLOCK_W=max(16, _pow2(t_win)), V_GT=value_groups,
                  STAGE_K=max(STAGE_KEYS, block_k, block_v), POLAR_G=lay.levels, A_BITS=codec.code_bits,
                  LOG2D=d.bit_length() - 1, VALUE_STAGES=value_stages)
    return consts, {"num_warps": num_warps, **({"maxnreg": MAX_REGISTERS} if capped else {})}


def attention_adc(q_BHTD: torch.Tensor, keys: PackedKeys, values: PackedValues, length: int,
                  k_window: torch.Tensor | None, v_window: torch.Tensor | None, codec: KernelCodec,
                  scale: float | None = None, num_splits: int | None = None, block_k: int | None = None,
                  block_v: int | None = None, num_warps: int | None = None,
                  programs_per_sm: int | None = None, group: int | None = None,
                  value_stages: int = 0) -> torch.Tensor:
    """softmax(scale * q.[K_hat; K_win]) @ [V_hat; V_win] for one query per KV head, by score tables.

    Same arguments and result as attention (q [B, H, 1, d], store [B, H, Tcap, ...], window [B, H, Tw, d]);
    the caller has validated them (attention routes here). Two launches (tables, attention) plus the
    log-sum-exp merge when the keys are split. block_k / block_v: keys per step of the score and value phases;
    the window may hold at most MAX_WINDOW tokens here (value layout, register cap: attention_constants).
    group (scalar section): coordinates a table code (table_layout's default when None). value_stages: the
    group-16 value loop's software-pipeline depth (values_in_place; 0: its register double buffer).
    """
    if value_stages not in (0, 2, 3, 4):
        raise ValueError(f"value_stages={value_stages!r}: one of 0 (a register double buffer), 2, 3, 4")
    b, hq, tq, d = q_BHTD.shape
    h = keys.codes.shape[1]
    t_win = 0 if k_window is None else k_window.shape[2]
    why = adc_limit(codec, (hq // h) * tq, t_win, group)
    if why is not None:
        raise ValueError(f"the table-lookup attention cannot take {why}")
    dev = q_BHTD.device
    codec = codec.to(dev)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    qk_scale = scale * LOG2E
    rows = b * h
    t_cap = keys.codes.shape[2]
    lay = table_layout(codec, group)
    q = q_BHTD.contiguous()

    lut, qlut = build_tables(q, codec, lay, h, qk_scale)

    if k_window is None or t_win == 0:
        k_window = v_window = torch.zeros(1, 1, 1, d, device=dev, dtype=q.dtype)
    if k_window.stride(-1) != 1:
        k_window = k_window.contiguous()
    if v_window.stride(-1) != 1:
        v_window = v_window.contiguous()

    nw = num_warps or 4
    block_k = block_k or 32 * nw
    block_v = block_v or (64 if _interpreting() else 16)
    step = max(block_k, block_v)
    consts, options = attention_constants(codec, lay, values, t_win, block_k, block_v, nw, value_stages)
    if num_splits is None:
        # floor: one full wave of resident programs; a ceil can spill a few programs into a second wave
        want = max(1, (programs_per_sm or 8) * _sm_count(dev) // rows)
        num_splits = max(1, min(want, _cdiv(length, 4 * step)))
    num_splits, chunk = split_chunk(length, min(int(num_splits), max(1, _cdiv(length, step))), step)
    out = torch.empty(b, hq, tq, d, device=dev, dtype=q.dtype)
    direct = num_splits == 1
    opart, lse = split_buffers(out, num_splits, rows, d)
    signs = keys.signs if codec.has_qjl else keys.codes
    gamma_r = keys.gamma_r if codec.has_qjl else keys.gamma
    scores = torch.empty(rows, t_cap, device=dev, dtype=torch.float32)
    _adc_attn_kernel[(rows, num_splits)](
        lut, qlut, q, polar_cos_sin(codec) if codec.decode == "polar" else codec.table("centroids"),
        keys.codes.contiguous(), keys.gamma.contiguous(), signs.contiguous(), gamma_r.contiguous(),
        values.codes.contiguous(), values.scale.contiguous(), values.minimum.contiguous(),
        k_window, v_window, k_window.stride(0), k_window.stride(1), k_window.stride(2),
        v_window.stride(0), v_window.stride(1), v_window.stride(2),
        scores, out, opart, lse,
        h, t_cap, length, t_win, chunk, num_splits, rows, qk_scale, math.sqrt(math.pi / (2 * d)), 0,
        DIRECT=direct, **consts, **options)
    if not direct:
        _merge_splits_kernel[(rows,)](opart, lse, out, rows, num_splits, D=d,
                                      BLOCK_S=min(64, _pow2(num_splits)), num_warps=4)
    return out
