"""Split-K flash-decoding attention over the compressed K/V store plus the native window; the LSE merge."""

import triton
import triton.language as tl

from .bits import bf16_value
from .codec_decode import (
    POLAR,
    TRIPLET,
    octopus_triplets,
    polar_halves,
    polar_unit,
    qjl_signs,
    turbo_unit,
    value_tile,
)


@triton.jit
def _mm_nt(a, b, acc, USE_DOT: tl.constexpr, PREC: tl.constexpr):
    """acc + a [M, K] @ b [N, K]^T -> [M, N] fp32: tensor cores for M >= 16, else (M == 1) FMAs and a row
    sum."""
    if USE_DOT:
        return tl.dot(a, tl.trans(b), acc, input_precision=PREC)
    else:
        return acc + tl.sum(a * b, axis=1)[None, :]


@triton.jit
def _mm_nn(a, b, USE_DOT: tl.constexpr, PREC: tl.constexpr):
    """a [M, N] @ b [N, D] -> [M, D] fp32 (M == 1 without tensor cores: a column sum)."""
    if USE_DOT:
        return tl.dot(a, b, input_precision=PREC)
    else:
        return tl.sum(tl.reshape(a, (b.shape[0], 1)) * b, axis=0)[None, :]


@triton.jit
def _operand(x, OPD: tl.constexpr, RNE_BY_HAND: tl.constexpr):
    """x as a matmul operand of dtype OPD. RNE_BY_HAND (the CPU interpreter, whose fp32 -> bf16 cast
    truncates): round to nearest even on the fp32 bits first, as the GPU's cast does."""
    if OPD == tl.bfloat16 and RNE_BY_HAND:  # bits.bf16_value inlined (a jit call costs in the interpreter)
        b = x.to(tl.float32).to(tl.int32, bitcast=True)
        x = ((b + 0x7FFF + ((b >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
    return x.to(OPD)


@triton.jit
def _project(q_pro, qmap, cols, scale, USE_DOT: tl.constexpr, PREC_Q: tl.constexpr, OPD: tl.constexpr,
             RNE_BY_HAND: tl.constexpr):
    """Columns `cols` [1, C] of the query rows' projection q @ M_h (qmap: the head's map rows), times
    `scale`, as a matmul operand [M, C] of dtype OPD."""
    return _operand(_mm_nn(q_pro, tl.load(qmap + cols), USE_DOT, PREC_Q) * scale, OPD, RNE_BY_HAND)


@triton.jit
def _store_out(ptr, o, mask):
    """Store fp32 o in ptr's dtype, bf16 rounded to nearest even (the CPU interpreter's cast truncates)."""
    if ptr.dtype.element_ty == tl.bfloat16:
        o = bf16_value(o)
    tl.store(ptr, o.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _online_update(m_i, l_i, acc, s, v, USE_DOT: tl.constexpr, PREC: tl.constexpr, OPD: tl.constexpr,
                   RNE_BY_HAND: tl.constexpr):
    """One step of the online softmax with scores s [M, N] (log2 units, -inf for masked keys); v [N, D] is
    already in the operand dtype OPD, and so is P for P @ V (flash attention's bf16 P)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _mm_nn(_operand(p, OPD, RNE_BY_HAND), v, USE_DOT, PREC)
    return m_new, l_i, acc


@triton.jit
def _compressed_tile(m_i, l_i, acc, qx, qy, qz, qr, qj, qr2, qj2, n0, end, row0,
                     kc_ptr, kg_ptr, ks_ptr, kr_ptr, vc_ptr, vs_ptr, vm_ptr, tab_a_ptr, tab_b_ptr,
                     DECODE: tl.constexpr, D: tl.constexpr, LP: tl.constexpr, LOG2D: tl.constexpr,
                     K_BITS: tl.constexpr, K_CODES: tl.constexpr, K_WORDS: tl.constexpr, B_DIR: tl.constexpr,
                     B_RHO: tl.constexpr, DIR_TABLE: tl.constexpr, K_WP: tl.constexpr, HAS_QJL: tl.constexpr,
                     S_WP: tl.constexpr, V_GROUP: tl.constexpr, V_BITS: tl.constexpr, V_WORDS: tl.constexpr,
                     V_WP: tl.constexpr, TILE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     PREC: tl.constexpr, OPD: tl.constexpr, RNE_BY_HAND: tl.constexpr, HALVES: tl.constexpr,
                     K_WP2: tl.constexpr, MASKED: tl.constexpr):
    """Decode compressed keys [n0, n0 + BLOCK_N) (rows row0 + n of the store) and fold them into the online
    softmax. MASKED: the tile may run past `end` (keys >= end are not read and score -inf); otherwise every
    key is valid and no mask is computed. HALVES: the d-wide score dots (rotated and QJL) run as two dots of
    d/2 (qr/qr2, qj/qj2: polarquant's even | odd coordinates, the others' first | second half; K_WP2: the
    word-tile width of half a key's codes)."""
    USE_DOT: tl.constexpr = BLOCK_M >= 16
    n = n0 + tl.arange(0, BLOCK_N)
    if MASKED:
        n_ok = n < end
    else:
        n_ok = tl.full((BLOCK_N,), 1, tl.int1)
    krow = row0 + n
    k_rows = kc_ptr + krow[:, None] * K_WORDS
    gamma = tl.load(kg_ptr + krow, mask=n_ok, other=0.0).to(tl.float32)[:, None]
    s = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    if DECODE == TRIPLET:
        kx, ky, kz = octopus_triplets(k_rows, n_ok[:, None], gamma, tab_a_ptr, tab_b_ptr, LP, K_CODES, K_BITS,
                                      B_DIR, B_RHO, DIR_TABLE, K_WORDS, K_WP, TILE)
        s = _mm_nt(qx, _operand(kx, OPD, RNE_BY_HAND), s, USE_DOT, PREC)
        s = _mm_nt(qy, _operand(ky, OPD, RNE_BY_HAND), s, USE_DOT, PREC)
        s = _mm_nt(qz, _operand(kz, OPD, RNE_BY_HAND), s, USE_DOT, PREC)
    elif DECODE == POLAR:
        if HALVES:
            ue, uo = polar_halves(k_rows, n_ok[:, None], tab_a_ptr, tab_b_ptr, BLOCK_N, D, LOG2D, K_BITS,
                                  K_WORDS, K_WP, TILE)
            s = _mm_nt(qr, _operand(ue * gamma, OPD, RNE_BY_HAND), s, USE_DOT, PREC)
            s = _mm_nt(qr2, _operand(uo * gamma, OPD, RNE_BY_HAND), s, USE_DOT, PREC)
        else:
            u = polar_unit(k_rows, n_ok[:, None], tab_a_ptr, tab_b_ptr, BLOCK_N, D, LOG2D, K_BITS, K_WORDS,
                           K_WP, TILE)
            s = _mm_nt(qr, _operand(u * gamma, OPD, RNE_BY_HAND), s, USE_DOT, PREC)
    elif K_BITS > 0:
        if HALVES:  # half a key's codes is d/2 * K_BITS bits: whole words for d >= 64
            KW2: tl.constexpr = D * K_BITS // 64
            u = turbo_unit(k_rows, n_ok[:, None], tab_a_ptr, D // 2, K_BITS, KW2, K_WP2, TILE)
            s = _mm_nt(qr, _operand(u * gamma, OPD, RNE_BY_HAND), s, USE_DOT, PREC)
            u = turbo_unit(k_rows + KW2, n_ok[:, None], tab_a_ptr, D // 2, K_BITS, KW2, K_WP2, TILE)
            s = _mm_nt(qr2, _operand(u * gamma, OPD, RNE_BY_HAND), s, USE_DOT, PREC)
        else:
            u = turbo_unit(k_rows, n_ok[:, None], tab_a_ptr, D, K_BITS, K_WORDS, K_WP, TILE)
            s = _mm_nt(qr, _operand(u * gamma, OPD, RNE_BY_HAND), s, USE_DOT, PREC)
    if HAS_QJL:
        s_words = (D + 31) // 32
        g_r = tl.load(kr_ptr + krow, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        s_rows = ks_ptr + krow[:, None] * s_words
        if HALVES:
            SW2: tl.constexpr = D // 64
            sigma = qjl_signs(s_rows, n_ok[:, None], D // 2, SW2, SW2, TILE)
            s = _mm_nt(qj, _operand(sigma * (gamma * g_r), OPD, RNE_BY_HAND), s, USE_DOT, PREC)
            sigma = qjl_signs(s_rows + SW2, n_ok[:, None], D // 2, SW2, SW2, TILE)
            s = _mm_nt(qj2, _operand(sigma * (gamma * g_r), OPD, RNE_BY_HAND), s, USE_DOT, PREC)
        else:
            sigma = qjl_signs(s_rows, n_ok[:, None], D, s_words, S_WP, TILE)
            s = _mm_nt(qj, _operand(sigma * (gamma * g_r), OPD, RNE_BY_HAND), s, USE_DOT, PREC)
    if MASKED:
        s = tl.where(n_ok[None, :], s, float("-inf"))
    # values cut from word tiles whenever the width divides 32 (shifts alone: ptxas counts 890 instructions a
    # warp per tile against 932 with one gathered load per code, octopus b=2, 128 rows, 8 warps)
    v_tile: tl.constexpr = TILE or (32 % V_BITS == 0)
    v = value_tile(vc_ptr, vs_ptr, vm_ptr, krow, n_ok, BLOCK_N, D, V_GROUP, V_BITS, V_WORDS, V_WP, v_tile)
    return _online_update(m_i, l_i, acc, s, _operand(v, OPD, RNE_BY_HAND), USE_DOT, PREC, OPD, RNE_BY_HAND)


# the integers that change from one AAR scale to the next are not specialised on (== 1, % 16): one compile
# serves every scale (specialising them compiled 10-16 variants a codec, 25-42 s on first use); strides keep
# their specialisation (their divisibility is what vectorises the loads)
PER_CALL_INTS = ["H", "grp", "tq", "n_rows", "t_cap", "t_comp", "t_win", "chunk", "n_splits", "total_rows"]


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
    DECODE: tl.constexpr, D: tl.constexpr, LP: tl.constexpr, NP: tl.constexpr, LOG2D: tl.constexpr,
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
    """One (batch, KV head, query block, split) program of attention straight from the compressed cache.

    Rows are (query head in the KV head's group, query token) pairs r = g * tq + t, G*Tq per KV head, so the
    group shares one pass over K/V. Prologue: the query rows are loaded once and projected in registers to
    the layouts the codec's score needs, q @ M_h with the per-head integer matrix at qmap (formats.md
    rotation times sqrt(d): the rotated query R q, or its octopus x/y/z triplet columns, then the QJL query
    R' R q times d), scaled by rot_scale / qjl_scale, which also carry the softmax scale in log2 units.
    Compressed score of key n: q_rot' . (gamma_n u_hat_n) [+ q_j' . (gamma_n gamma_r_n sigma_n)]; window
    score: qk_scale * q . k_n. Softmax over both with one running max; values: group dequant in the original
    frame. Matmul operands are OPD (fp32 with PREC, or the queries' 16-bit dtype), accumulation fp32.
    Split s covers compressed keys [s*chunk, (s+1)*chunk); the last split also covers the native window
    (alone when its chunk starts past the store).
    DIRECT: a single split writes the normalised output; otherwise o/l and the log2-sum-exp go to the
    partial buffers. tab_a/tab_b: centroids (turboquant), cos/sin (polarquant), directions or xi
    centroids/C_rho (octopus). HALVES (d >= 128): the d-wide projections and score dots as two of d/2 each
    (see _compressed_tile). BLOCK_W: native window keys per step.
    """
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    b = pid_bh // H
    h = pid_bh % H
    USE_DOT: tl.constexpr = BLOCK_M >= 16
    IS_OCT: tl.constexpr = DECODE == TRIPLET

    # prologue: the query block
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    qrow = pid_bh * n_rows + rows
    dcol = tl.arange(0, D)[None, :]
    q_rows = q_ptr + b * stride_qb + (h * grp + rows // tq)[:, None] * stride_qh
    q = tl.load(q_rows + (rows % tq)[:, None] * stride_qt + dcol, mask=row_ok[:, None], other=0.0)
    qn = _operand(q, OPD, RNE_BY_HAND)

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
        k = _operand(tl.load(kw_base + n[:, None] * stride_kwt + dcol, mask=n_ok[:, None], other=0.0), OPD,
                     RNE_BY_HAND)
        s = _mm_nt(qn, k, tl.zeros((BLOCK_M, BLOCK_W), tl.float32), USE_DOT, PREC)
        s = tl.where(n_ok[None, :], s * qk_scale, float("-inf"))
        v = _operand(tl.load(vw_base + n[:, None] * stride_vwt + dcol, mask=n_ok[:, None], other=0.0), OPD,
                     RNE_BY_HAND)
        m_i, l_i, acc = _online_update(m_i, l_i, acc, s, v, USE_DOT, PREC, OPD, RNE_BY_HAND)

    # the query's projections for the compressed keys (after the window: q and these are not live together)
    q_pro = q.to(qmap_ptr.dtype.element_ty)
    qmap = qmap_ptr + h * (D * NP) + tl.arange(0, D)[:, None] * NP
    qx = qn  # placeholders for the operands a codec does not use (never read)
    qy = qn
    qz = qn
    qr = qn
    qj = qn
    qr2 = qn
    qj2 = qn
    hcol = tl.arange(0, D // 2)[None, :]
    if IS_OCT:
        lcol = tl.arange(0, LP)[None, :]
        qx = _project(q_pro, qmap, lcol, rot_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
        qy = _project(q_pro, qmap, LP + lcol, rot_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
        qz = _project(q_pro, qmap, 2 * LP + lcol, rot_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
        QJL_COL: tl.constexpr = 3 * LP
    elif HALVES:
        c0 = 2 * hcol if DECODE == POLAR else hcol  # polarquant: even | odd coordinates
        c1 = c0 + 1 if DECODE == POLAR else hcol + D // 2
        qr = _project(q_pro, qmap, c0, rot_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
        qr2 = _project(q_pro, qmap, c1, rot_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
        QJL_COL: tl.constexpr = D
    else:
        qr = _project(q_pro, qmap, dcol, rot_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
        QJL_COL: tl.constexpr = D
    if HAS_QJL:
        if HALVES:
            qj = _project(q_pro, qmap, QJL_COL + hcol, qjl_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
            qj2 = _project(q_pro, qmap, (QJL_COL + D // 2) + hcol, qjl_scale, USE_DOT, PREC_Q, OPD,
                           RNE_BY_HAND)
        else:
            qj = _project(q_pro, qmap, QJL_COL + dcol, qjl_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)

    # compressed store: whole tiles without key masks, then the partial tail tile
    start = pid_s * chunk
    end = tl.maximum(tl.minimum(start + chunk, t_comp), start)  # a window-only split: empty
    full_end = start + (end - start) // BLOCK_N * BLOCK_N
    for n0 in tl.range(start, full_end, BLOCK_N):
        m_i, l_i, acc = _compressed_tile(
            m_i, l_i, acc, qx, qy, qz, qr, qj, qr2, qj2, n0, end, pid_bh * t_cap, kc_ptr, kg_ptr, ks_ptr,
            kr_ptr, vc_ptr, vs_ptr, vm_ptr, tab_a_ptr, tab_b_ptr, DECODE, D, LP, LOG2D, K_BITS, K_CODES,
            K_WORDS, B_DIR, B_RHO, DIR_TABLE, K_WP, HAS_QJL, S_WP, V_GROUP, V_BITS, V_WORDS, V_WP, TILE,
            BLOCK_M, BLOCK_N, PREC, OPD, RNE_BY_HAND, HALVES, K_WP2, False)
    if full_end < end:
        m_i, l_i, acc = _compressed_tile(
            m_i, l_i, acc, qx, qy, qz, qr, qj, qr2, qj2, full_end, end, pid_bh * t_cap, kc_ptr, kg_ptr,
            ks_ptr, kr_ptr, vc_ptr, vs_ptr, vm_ptr, tab_a_ptr, tab_b_ptr, DECODE, D, LP, LOG2D, K_BITS,
            K_CODES, K_WORDS, B_DIR, B_RHO, DIR_TABLE, K_WP, HAS_QJL, S_WP, V_GROUP, V_BITS, V_WORDS, V_WP,
            TILE, BLOCK_M, BLOCK_N, PREC, OPD, RNE_BY_HAND, HALVES, K_WP2, True)

    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if DIRECT:
        _store_out(out_ptr + qrow[:, None] * D + dcol, o, row_ok[:, None])
    else:
        part = pid_s * total_rows + qrow
        tl.store(opart_ptr + part[:, None] * D + dcol, o, mask=row_ok[:, None])
        tl.store(lse_ptr + part, m_i + tl.log2(l_i), mask=row_ok)


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
    _store_out(out_ptr + rows[:, None] * D + dcol, out, ok[:, None])
