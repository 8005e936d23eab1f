"""Split-K flash-decoding attention over the compressed K/V store plus the native window; the LSE merge."""

import triton
import triton.language as tl

from .bits import bf16_value
from .codec_decode import (
    OCTOPUS,
    OCTOPUS_QJL,
    POLAR,
    octopus_triplets,
    polar_unit,
    qjl_signs,
    turbo_unit,
    value_tile,
)


@triton.jit
def _mm_nt(a, b, USE_DOT: tl.constexpr, PREC: tl.constexpr):
    """a [M, K] @ b[N, K]^T -> [M, N] fp32: tensor cores for M >= 16, else (M == 1) FMAs and a row sum."""
    if USE_DOT:
        return tl.dot(a, tl.trans(b), input_precision=PREC)
    else:
        return tl.sum(a * b, axis=1)[None, :]


@triton.jit
def _mm_nn(a, b, USE_DOT: tl.constexpr, PREC: tl.constexpr):
    """a [M, N] @ b [N, D] -> [M, D] fp32 (M == 1 without tensor cores: a column sum)."""
    if USE_DOT:
        return tl.dot(a, b, input_precision=PREC)
    else:
        return tl.sum(tl.reshape(a, (b.shape[0], 1)) * b, axis=0)[None, :]


@triton.jit
def _store_out(ptr, o, mask):
    """Store fp32 o in ptr's dtype, bf16 rounded to nearest even (the CPU interpreter's cast truncates)."""
    if ptr.dtype.element_ty == tl.bfloat16:
        o = bf16_value(o)
    tl.store(ptr, o.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _online_update(m_i, l_i, acc, s, v, USE_DOT: tl.constexpr, PREC: tl.constexpr):
    """One step of the online softmax with scores s [M, N] (log2 units, -inf for masked keys)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _mm_nn(p, v, USE_DOT, PREC)
    return m_new, l_i, acc


@triton.jit
def _attn_fwd_kernel(
    qn_ptr, qr_ptr, qj_ptr,
    kc_ptr, kg_ptr, ks_ptr, kr_ptr,
    vc_ptr, vs_ptr, vm_ptr,
    kw_ptr, vw_ptr, stride_kwb, stride_kwh, stride_kwt, stride_vwb, stride_vwh, stride_vwt,
    tab_a_ptr, tab_b_ptr,
    out_ptr, opart_ptr, lse_ptr,
    H, n_rows, t_cap, t_comp, t_win, chunk, n_splits, total_rows,
    qk_scale, qjl_coef,
    CODEC: tl.constexpr, D: tl.constexpr, LP: tl.constexpr, LOG2D: tl.constexpr,
    K_BITS: tl.constexpr, K_CODES: tl.constexpr, K_WORDS: tl.constexpr, B_DIR: tl.constexpr,
    B_RHO: tl.constexpr,
    DIR_TABLE: tl.constexpr,
    K_WP: tl.constexpr, HAS_QJL: tl.constexpr, S_WP: tl.constexpr,
    V_GROUP: tl.constexpr, V_BITS: tl.constexpr, V_WORDS: tl.constexpr, V_WP: tl.constexpr,
    TILE: tl.constexpr,
    DIRECT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
):
    """One (batch, KV head, query block, split) program of attention straight from the compressed cache.

    Rows are (query head in the KV head's group, query token) pairs, G*Tq per KV head, so the group shares
    one pass over K/V. Compressed score of key n: gamma_n * (q_rot . u_hat_n [+ qjl_coef * gamma_r_n *
    (R' q_rot) . sigma_n]); window score: q . k_n. Softmax over both with one running max (log2 units,
    qk_scale = softmax scale * log2 e); values: group dequant in the original frame. Split s covers
    compressed keys [s*chunk, (s+1)*chunk); the last split also covers the native window. DIRECT: a single
    split writes the normalised output; otherwise o/l and the log2-sum-exp go to the partial buffers.
    tab_a/tab_b: centroids (turboquant), cos/sin (polarquant), directions or xi centroids/C_rho (octopus).
    """
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    b = pid_bh // H
    h = pid_bh % H
    USE_DOT: tl.constexpr = BLOCK_M >= 16
    IS_OCT: tl.constexpr = (CODEC == OCTOPUS) or (CODEC == OCTOPUS_QJL)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    qrow = pid_bh * n_rows + rows
    dcol = tl.arange(0, D)[None, :]
    qn = tl.load(qn_ptr + qrow[:, None] * D + dcol, mask=row_ok[:, None], other=0.0)
    if IS_OCT:
        lcol = tl.arange(0, LP)[None, :]
        qbase = qr_ptr + qrow[:, None] * (3 * LP) + lcol
        qx = tl.load(qbase, mask=row_ok[:, None], other=0.0)
        qy = tl.load(qbase + LP, mask=row_ok[:, None], other=0.0)
        qz = tl.load(qbase + 2 * LP, mask=row_ok[:, None], other=0.0)
    else:
        qr = tl.load(qr_ptr + qrow[:, None] * D + dcol, mask=row_ok[:, None], other=0.0)
    if HAS_QJL:
        qj = tl.load(qj_ptr + qrow[:, None] * D + dcol, mask=row_ok[:, None], other=0.0)

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)

    # compressed store
    start = pid_s * chunk
    end = tl.minimum(start + chunk, t_comp)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < end
        krow = pid_bh * t_cap + n
        k_rows = kc_ptr + krow[:, None] * K_WORDS
        gamma = tl.load(kg_ptr + krow, mask=n_ok, other=0.0).to(tl.float32)
        if IS_OCT:
            kx, ky, kz = octopus_triplets(k_rows, n_ok[:, None], tab_a_ptr, tab_b_ptr, LP, K_CODES, K_BITS,
                                          B_DIR, B_RHO, DIR_TABLE, K_WORDS, K_WP, TILE)
            s = _mm_nt(qx, kx, USE_DOT, PREC) + _mm_nt(qy, ky, USE_DOT, PREC) + _mm_nt(qz, kz, USE_DOT, PREC)
        elif CODEC == POLAR:
            u = polar_unit(k_rows, n_ok[:, None], tab_a_ptr, tab_b_ptr, BLOCK_N, D, LOG2D, K_BITS, K_WORDS,
                           K_WP, TILE)
            s = _mm_nt(qr, u, USE_DOT, PREC)
        elif K_BITS > 0:
            u = turbo_unit(k_rows, n_ok[:, None], tab_a_ptr, D, K_BITS, K_WORDS, K_WP, TILE)
            s = _mm_nt(qr, u, USE_DOT, PREC)
        else:
            s = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        if HAS_QJL:
            s_words = (D + 31) // 32
            sigma = qjl_signs(ks_ptr + krow[:, None] * s_words, n_ok[:, None], D, s_words, S_WP, TILE)
            g_r = tl.load(kr_ptr + krow, mask=n_ok, other=0.0).to(tl.float32)
            s = s + _mm_nt(qj, sigma, USE_DOT, PREC) * (qjl_coef * g_r)[None, :]
        s = tl.where(n_ok[None, :], s * (gamma * qk_scale)[None, :], float("-inf"))
        v = value_tile(vc_ptr, vs_ptr, vm_ptr, krow, n_ok, BLOCK_N, D, V_GROUP, V_BITS, V_WORDS, V_WP, TILE)
        m_i, l_i, acc = _online_update(m_i, l_i, acc, s, v, USE_DOT, PREC)

    # native window: the last split's tail
    w_end = tl.where(pid_s == n_splits - 1, t_win, 0)
    kw_base = kw_ptr + b * stride_kwb + h * stride_kwh
    vw_base = vw_ptr + b * stride_vwb + h * stride_vwh
    for n0 in range(0, w_end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < t_win
        k = tl.load(kw_base + n[:, None] * stride_kwt + dcol, mask=n_ok[:, None], other=0.0).to(tl.float32)
        s = tl.where(n_ok[None, :], _mm_nt(qn, k, USE_DOT, PREC) * qk_scale, float("-inf"))
        v = tl.load(vw_base + n[:, None] * stride_vwt + dcol, mask=n_ok[:, None], other=0.0).to(tl.float32)
        m_i, l_i, acc = _online_update(m_i, l_i, acc, s, v, USE_DOT, PREC)

    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if DIRECT:
        _store_out(out_ptr + qrow[:, None] * D + dcol, o, row_ok[:, None])
    else:
        part = pid_s * total_rows + qrow
        tl.store(opart_ptr + part[:, None] * D + dcol, o, mask=row_ok[:, None])
        tl.store(lse_ptr + part, m_i + tl.log2(l_i), mask=row_ok)


@triton.jit
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
