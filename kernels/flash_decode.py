"""Split-K flash-decoding attention over the compressed K/V store plus the native window; the LSE merge."""

import triton
import triton.language as tl

from .bits import bf16_value
from .codec_decode import (
    OCTOPUS,
    OCTOPUS_QJL,
    POLAR,
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
def _key_operands(n0, end, row0, kc_ptr, kg_ptr, ks_ptr, kr_ptr, tab_a_ptr, tab_b_ptr,
                  CODEC: tl.constexpr, D: tl.constexpr, LP: tl.constexpr, LOG2D: tl.constexpr,
                  K_BITS: tl.constexpr, K_CODES: tl.constexpr, K_WORDS: tl.constexpr, B_DIR: tl.constexpr,
                  B_RHO: tl.constexpr, DIR_TABLE: tl.constexpr, K_WP: tl.constexpr, HAS_QJL: tl.constexpr,
                  S_WP: tl.constexpr, TILE: tl.constexpr, BLOCK_N: tl.constexpr, OPD: tl.constexpr,
                  RNE_BY_HAND: tl.constexpr, HALVES: tl.constexpr, K_WP2: tl.constexpr, MASKED: tl.constexpr):
    """Decode compressed keys [n0, n0 + BLOCK_N) (rows row0 + n of the store) into the score's key operands,
    in the operand dtype OPD: a1, a2, a3 for the rotated part (octopus: x, y, z triplet components times
    gamma; polarquant: even | odd coordinates, or the whole unit vector, times gamma; turboquant: first |
    second half, or whole) and b1, b2 for the QJL part (gamma gamma_r sigma, halves or whole); the slots a
    codec does not use repeat a used one and are never read (NA / NB of _tile_scores). Also the key mask
    n_ok [BLOCK_N] and the store rows krow. MASKED: the tile may run past `end` (keys >= end are not read);
    otherwise every key is valid and no mask is computed. HALVES: the d-wide dots as two of d/2 (K_WP2: the
    word-tile width of half a key's codes)."""
    n = n0 + tl.arange(0, BLOCK_N)
    if MASKED:
        n_ok = n < end
    else:
        n_ok = tl.full((BLOCK_N,), 1, tl.int1)
    krow = row0 + n
    k_rows = kc_ptr + krow[:, None] * K_WORDS
    gamma = tl.load(kg_ptr + krow, mask=n_ok, other=0.0).to(tl.float32)[:, None]
    if (CODEC == OCTOPUS) or (CODEC == OCTOPUS_QJL):
        kx, ky, kz = octopus_triplets(k_rows, n_ok[:, None], gamma, tab_a_ptr, tab_b_ptr, LP, K_CODES, K_BITS,
                                      B_DIR, B_RHO, DIR_TABLE, K_WORDS, K_WP, TILE)
        a1 = _operand(kx, OPD, RNE_BY_HAND)
        a2 = _operand(ky, OPD, RNE_BY_HAND)
        a3 = _operand(kz, OPD, RNE_BY_HAND)
    elif CODEC == POLAR:
        if HALVES:
            ue, uo = polar_halves(k_rows, n_ok[:, None], tab_a_ptr, tab_b_ptr, BLOCK_N, D, LOG2D, K_BITS,
                                  K_WORDS, K_WP, TILE)
            a1 = _operand(ue * gamma, OPD, RNE_BY_HAND)
            a2 = _operand(uo * gamma, OPD, RNE_BY_HAND)
        else:
            u = polar_unit(k_rows, n_ok[:, None], tab_a_ptr, tab_b_ptr, BLOCK_N, D, LOG2D, K_BITS, K_WORDS,
                           K_WP, TILE)
            a1 = _operand(u * gamma, OPD, RNE_BY_HAND)
            a2 = a1
        a3 = a1
    elif K_BITS > 0:
        if HALVES:  # half a key's codes is d/2 * K_BITS bits: whole words for d >= 64
            KW2: tl.constexpr = D * K_BITS // 64
            u = turbo_unit(k_rows, n_ok[:, None], tab_a_ptr, D // 2, K_BITS, KW2, K_WP2, TILE)
            a1 = _operand(u * gamma, OPD, RNE_BY_HAND)
            u = turbo_unit(k_rows + KW2, n_ok[:, None], tab_a_ptr, D // 2, K_BITS, KW2, K_WP2, TILE)
            a2 = _operand(u * gamma, OPD, RNE_BY_HAND)
        else:
            u = turbo_unit(k_rows, n_ok[:, None], tab_a_ptr, D, K_BITS, K_WORDS, K_WP, TILE)
            a1 = _operand(u * gamma, OPD, RNE_BY_HAND)
            a2 = a1
        a3 = a1
    else:  # no rotated part (never read)
        a1 = gamma
        a2 = gamma
        a3 = gamma
    if HAS_QJL:
        s_words = (D + 31) // 32
        g_r = tl.load(kr_ptr + krow, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        s_rows = ks_ptr + krow[:, None] * s_words
        if HALVES:
            SW2: tl.constexpr = D // 64
            sigma = qjl_signs(s_rows, n_ok[:, None], D // 2, SW2, SW2, TILE)
            b1 = _operand(sigma * (gamma * g_r), OPD, RNE_BY_HAND)
            sigma = qjl_signs(s_rows + SW2, n_ok[:, None], D // 2, SW2, SW2, TILE)
            b2 = _operand(sigma * (gamma * g_r), OPD, RNE_BY_HAND)
        else:
            sigma = qjl_signs(s_rows, n_ok[:, None], D, s_words, S_WP, TILE)
            b1 = _operand(sigma * (gamma * g_r), OPD, RNE_BY_HAND)
            b2 = b1
    else:
        b1 = a1
        b2 = a1
    return a1, a2, a3, b1, b2, n_ok, krow


@triton.jit
def _tile_scores(q1, q2, q3, qj1, qj2, a1, a2, a3, b1, b2, n_ok, NA: tl.constexpr, NB: tl.constexpr,
                 BLOCK_N: tl.constexpr, PREC: tl.constexpr, MASKED: tl.constexpr):
    """Scores [M, BLOCK_N] of one row tile (M = q1's rows) against decoded keys: q1 a1 + .. (NA terms, the
    rotated part) + qj1 b1 + .. (NB terms, the QJL part); -inf for masked keys."""
    USE_DOT: tl.constexpr = q1.shape[0] >= 16
    s = tl.zeros((q1.shape[0], BLOCK_N), tl.float32)
    if NA >= 1:
        s = _mm_nt(q1, a1, s, USE_DOT, PREC)
    if NA >= 2:
        s = _mm_nt(q2, a2, s, USE_DOT, PREC)
    if NA >= 3:
        s = _mm_nt(q3, a3, s, USE_DOT, PREC)
    if NB >= 1:
        s = _mm_nt(qj1, b1, s, USE_DOT, PREC)
    if NB >= 2:
        s = _mm_nt(qj2, b2, s, USE_DOT, PREC)
    if MASKED:
        s = tl.where(n_ok[None, :], s, float("-inf"))
    return s


@triton.jit
def _query_operands(q, qmap_ptr, h, rot_scale, qjl_scale, CODEC: tl.constexpr, D: tl.constexpr,
                    LP: tl.constexpr, NP: tl.constexpr, HAS_QJL: tl.constexpr, HALVES: tl.constexpr,
                    USE_DOT: tl.constexpr, PREC_Q: tl.constexpr, OPD: tl.constexpr,
                    RNE_BY_HAND: tl.constexpr):
    """The query rows' projections q @ M_h in the layouts the codec's score needs (see _key_operands):
    q1, q2, q3 (rotated part, times rot_scale) and qj1, qj2 (QJL part, times qjl_scale); unused slots repeat
    q1."""
    q_pro = q.to(qmap_ptr.dtype.element_ty)
    qmap = qmap_ptr + h * (D * NP) + tl.arange(0, D)[:, None] * NP
    dcol = tl.arange(0, D)[None, :]
    hcol = tl.arange(0, D // 2)[None, :]
    if (CODEC == OCTOPUS) or (CODEC == OCTOPUS_QJL):
        lcol = tl.arange(0, LP)[None, :]
        q1 = _project(q_pro, qmap, lcol, rot_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
        q2 = _project(q_pro, qmap, LP + lcol, rot_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
        q3 = _project(q_pro, qmap, 2 * LP + lcol, rot_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
        QJL_COL: tl.constexpr = 3 * LP
    elif HALVES:
        c0 = 2 * hcol if CODEC == POLAR else hcol  # polarquant: even | odd coordinates
        c1 = c0 + 1 if CODEC == POLAR else hcol + D // 2
        q1 = _project(q_pro, qmap, c0, rot_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
        q2 = _project(q_pro, qmap, c1, rot_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
        q3 = q1
        QJL_COL: tl.constexpr = D
    else:
        q1 = _project(q_pro, qmap, dcol, rot_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
        q2 = q1
        q3 = q1
        QJL_COL: tl.constexpr = D
    if HAS_QJL:
        if HALVES:
            qj1 = _project(q_pro, qmap, QJL_COL + hcol, qjl_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
            qj2 = _project(q_pro, qmap, (QJL_COL + D // 2) + hcol, qjl_scale, USE_DOT, PREC_Q, OPD,
                           RNE_BY_HAND)
        else:
            qj1 = _project(q_pro, qmap, QJL_COL + dcol, qjl_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
            qj2 = qj1
    else:
        qj1 = q1
        qj2 = q1
    return q1, q2, q3, qj1, qj2


@triton.jit
def _load_rows(q_ptr, b, h, grp, tq, stride_qb, stride_qh, stride_qt, rows, row_ok, D: tl.constexpr):
    """Query rows r = g * tq + t of KV head h (query head h * grp + g, token t) [M, D]; 0 past n_rows."""
    q_rows = q_ptr + b * stride_qb + (h * grp + rows // tq)[:, None] * stride_qh
    return tl.load(q_rows + (rows % tq)[:, None] * stride_qt + tl.arange(0, D)[None, :], mask=row_ok[:, None],
                   other=0.0)


@triton.jit
def _finish(o_acc, m_i, l_i, rows, row_ok, pid_bh, pid_s, n_rows, total_rows, out_ptr, opart_ptr, lse_ptr,
            D: tl.constexpr, DIRECT: tl.constexpr):
    """Write one row tile: the normalised output (DIRECT) or the split's o/l and log2-sum-exp."""
    qrow = pid_bh * n_rows + rows
    dcol = tl.arange(0, D)[None, :]
    o = o_acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if DIRECT:
        _store_out(out_ptr + qrow[:, None] * D + dcol, o, row_ok[:, None])
    else:
        part = pid_s * total_rows + qrow
        tl.store(opart_ptr + part[:, None] * D + dcol, o, mask=row_ok[:, None])
        tl.store(lse_ptr + part, m_i + tl.log2(l_i), mask=row_ok)


@triton.jit
def _store_step(m_i, l_i, acc, m2, l2, acc2, q1, q2, q3, qj1, qj2, r1, r2, r3, rj1, rj2, n0, end, row0,
                kc_ptr, kg_ptr, ks_ptr, kr_ptr, vc_ptr, vs_ptr, vm_ptr, tab_a_ptr, tab_b_ptr,
                CODEC: tl.constexpr, D: tl.constexpr, LP: tl.constexpr, LOG2D: tl.constexpr,
                K_BITS: tl.constexpr, K_CODES: tl.constexpr, K_WORDS: tl.constexpr, B_DIR: tl.constexpr,
                B_RHO: tl.constexpr, DIR_TABLE: tl.constexpr, K_WP: tl.constexpr, HAS_QJL: tl.constexpr,
                S_WP: tl.constexpr, V_GROUP: tl.constexpr, V_BITS: tl.constexpr, V_WORDS: tl.constexpr,
                V_WP: tl.constexpr, TILE: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
                OPD: tl.constexpr, RNE_BY_HAND: tl.constexpr, HALVES: tl.constexpr, K_WP2: tl.constexpr,
                NA: tl.constexpr, NB: tl.constexpr, TWO: tl.constexpr, MASKED: tl.constexpr):
    """One step of BLOCK_N compressed keys: decode them (_key_operands), score the row tile (q1..qj2) and,
    with TWO, the second row tile (r1..rj2) against them, decode the step's values once and fold both into
    their online softmax states."""
    a1, a2, a3, b1, b2, n_ok, krow = _key_operands(
        n0, end, row0, kc_ptr, kg_ptr, ks_ptr, kr_ptr, tab_a_ptr, tab_b_ptr, CODEC, D, LP, LOG2D, K_BITS,
        K_CODES, K_WORDS, B_DIR, B_RHO, DIR_TABLE, K_WP, HAS_QJL, S_WP, TILE, BLOCK_N, OPD, RNE_BY_HAND,
        HALVES, K_WP2, MASKED)
    s = _tile_scores(q1, q2, q3, qj1, qj2, a1, a2, a3, b1, b2, n_ok, NA, NB, BLOCK_N, PREC, MASKED)
    if TWO:
        s2 = _tile_scores(r1, r2, r3, rj1, rj2, a1, a2, a3, b1, b2, n_ok, NA, NB, BLOCK_N, PREC, MASKED)
    # values cut from word tiles whenever the width divides 32 (shifts alone: ptxas counts 890 instructions a
    # warp per tile against 932 with one gathered load per code, octopus b=2, 128 rows, 8 warps)
    v_tile: tl.constexpr = TILE or (32 % V_BITS == 0)
    v = _operand(value_tile(vc_ptr, vs_ptr, vm_ptr, krow, n_ok, BLOCK_N, D, V_GROUP, V_BITS, V_WORDS, V_WP,
                            v_tile), OPD, RNE_BY_HAND)
    m_i, l_i, acc = _online_update(m_i, l_i, acc, s, v, q1.shape[0] >= 16, PREC, OPD, RNE_BY_HAND)
    if TWO:
        m2, l2, acc2 = _online_update(m2, l2, acc2, s2, v, True, PREC, OPD, RNE_BY_HAND)
    return m_i, l_i, acc, m2, l2, acc2


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
    CODEC: tl.constexpr, D: tl.constexpr, LP: tl.constexpr, NP: tl.constexpr, LOG2D: tl.constexpr,
    K_BITS: tl.constexpr, K_CODES: tl.constexpr, K_WORDS: tl.constexpr, B_DIR: tl.constexpr,
    B_RHO: tl.constexpr,
    DIR_TABLE: tl.constexpr,
    K_WP: tl.constexpr, HAS_QJL: tl.constexpr, S_WP: tl.constexpr,
    V_GROUP: tl.constexpr, V_BITS: tl.constexpr, V_WORDS: tl.constexpr, V_WP: tl.constexpr,
    TILE: tl.constexpr,
    DIRECT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
    PREC_Q: tl.constexpr, OPD: tl.constexpr, RNE_BY_HAND: tl.constexpr, HALVES: tl.constexpr,
    K_WP2: tl.constexpr, BLOCK_W: tl.constexpr, STAGES_W: tl.constexpr, STAGES_C: tl.constexpr,
    NA: tl.constexpr, NB: tl.constexpr, BLOCK_M2: tl.constexpr,
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
    (see _key_operands); NA / NB: the rotated / QJL score terms. BLOCK_W: native window keys per step.
    STAGES_W / STAGES_C: software pipelining depth of the window loop / the compressed loop (None: the
    launch's num_stages).
    BLOCK_M2 > 0: a second row tile of BLOCK_M2 rows after the first BLOCK_M (one program holds all n_rows
    <= BLOCK_M + BLOCK_M2, e.g. 75 = 64 + 16 rows instead of 75 padded to 128): both tiles score against
    the same decoded keys and accumulate the same decoded values, so the key and value decode is shared and
    the matmuls and exponentials cover 80 rows, not 128.
    """
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    b = pid_bh // H
    h = pid_bh % H
    USE_DOT: tl.constexpr = BLOCK_M >= 16
    TWO: tl.constexpr = BLOCK_M2 > 0
    ROWS2: tl.constexpr = BLOCK_M2 if TWO else 16  # the second tile's shape when absent (never used)

    # prologue: the query block(s)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    q = _load_rows(q_ptr, b, h, grp, tq, stride_qb, stride_qh, stride_qt, rows, row_ok, D)
    qn = _operand(q, OPD, RNE_BY_HAND)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    rows2 = BLOCK_M + tl.arange(0, ROWS2)
    row_ok2 = rows2 < n_rows
    if TWO:
        q2 = _load_rows(q_ptr, b, h, grp, tq, stride_qb, stride_qh, stride_qt, rows2, row_ok2, D)
    else:
        q2 = q
    qn2 = _operand(q2, OPD, RNE_BY_HAND)
    m2 = tl.full((ROWS2,), float("-inf"), tl.float32)
    l2 = tl.zeros((ROWS2,), tl.float32)
    acc2 = tl.zeros((ROWS2, D), tl.float32)

    # native window first (the last split's share), so qn is dead during the compressed loop
    dcol = tl.arange(0, D)[None, :]
    w_end = tl.where(pid_s == n_splits - 1, t_win, 0)
    kw_base = kw_ptr + b * stride_kwb + h * stride_kwh
    vw_base = vw_ptr + b * stride_vwb + h * stride_vwh
    for n0 in tl.range(0, w_end, BLOCK_W, num_stages=STAGES_W):
        n = n0 + tl.arange(0, BLOCK_W)
        n_ok = n < t_win
        k = _operand(tl.load(kw_base + n[:, None] * stride_kwt + dcol, mask=n_ok[:, None], other=0.0), OPD,
                     RNE_BY_HAND)
        s = _mm_nt(qn, k, tl.zeros((BLOCK_M, BLOCK_W), tl.float32), USE_DOT, PREC)
        s = tl.where(n_ok[None, :], s * qk_scale, float("-inf"))
        if TWO:
            s2 = _mm_nt(qn2, k, tl.zeros((ROWS2, BLOCK_W), tl.float32), True, PREC)
            s2 = tl.where(n_ok[None, :], s2 * qk_scale, float("-inf"))
        v = _operand(tl.load(vw_base + n[:, None] * stride_vwt + dcol, mask=n_ok[:, None], other=0.0), OPD,
                     RNE_BY_HAND)
        m_i, l_i, acc = _online_update(m_i, l_i, acc, s, v, USE_DOT, PREC, OPD, RNE_BY_HAND)
        if TWO:
            m2, l2, acc2 = _online_update(m2, l2, acc2, s2, v, True, PREC, OPD, RNE_BY_HAND)

    # the query's projections for the compressed keys (after the window: q and these are not live together)
    q1, q2a, q3, qj1, qj2 = _query_operands(q, qmap_ptr, h, rot_scale, qjl_scale, CODEC, D, LP, NP, HAS_QJL,
                                            HALVES, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
    if TWO:
        r1, r2, r3, rj1, rj2 = _query_operands(q2, qmap_ptr, h, rot_scale, qjl_scale, CODEC, D, LP, NP,
                                               HAS_QJL, HALVES, True, PREC_Q, OPD, RNE_BY_HAND)
    else:
        r1, r2, r3, rj1, rj2 = q1, q2a, q3, qj1, qj2

    # compressed store: whole tiles without key masks, then the partial tail tile
    start = pid_s * chunk
    end = tl.maximum(tl.minimum(start + chunk, t_comp), start)  # a window-only split: empty
    full_end = start + (end - start) // BLOCK_N * BLOCK_N
    row0 = pid_bh * t_cap
    for n0 in tl.range(start, full_end, BLOCK_N, num_stages=STAGES_C):
        m_i, l_i, acc, m2, l2, acc2 = _store_step(
            m_i, l_i, acc, m2, l2, acc2, q1, q2a, q3, qj1, qj2, r1, r2, r3, rj1, rj2, n0, end, row0,
            kc_ptr, kg_ptr, ks_ptr, kr_ptr, vc_ptr, vs_ptr, vm_ptr, tab_a_ptr, tab_b_ptr, CODEC, D, LP, LOG2D,
            K_BITS, K_CODES, K_WORDS, B_DIR, B_RHO, DIR_TABLE, K_WP, HAS_QJL, S_WP, V_GROUP, V_BITS, V_WORDS,
            V_WP, TILE, BLOCK_N, PREC, OPD, RNE_BY_HAND, HALVES, K_WP2, NA, NB, TWO, False)
    if full_end < end:
        m_i, l_i, acc, m2, l2, acc2 = _store_step(
            m_i, l_i, acc, m2, l2, acc2, q1, q2a, q3, qj1, qj2, r1, r2, r3, rj1, rj2, full_end, end, row0,
            kc_ptr, kg_ptr, ks_ptr, kr_ptr, vc_ptr, vs_ptr, vm_ptr, tab_a_ptr, tab_b_ptr, CODEC, D, LP, LOG2D,
            K_BITS, K_CODES, K_WORDS, B_DIR, B_RHO, DIR_TABLE, K_WP, HAS_QJL, S_WP, V_GROUP, V_BITS, V_WORDS,
            V_WP, TILE, BLOCK_N, PREC, OPD, RNE_BY_HAND, HALVES, K_WP2, NA, NB, TWO, True)

    _finish(acc, m_i, l_i, rows, row_ok, pid_bh, pid_s, n_rows, total_rows, out_ptr, opart_ptr, lse_ptr, D,
            DIRECT)
    if TWO:
        _finish(acc2, m2, l2, rows2, row_ok2, pid_bh, pid_s, n_rows, total_rows, out_ptr, opart_ptr, lse_ptr,
                D, DIRECT)


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
