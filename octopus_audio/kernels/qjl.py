"""The QJL side-car, common to the decode kinds (turboquant-qjl, octopus-qjl): its @triton.jit score term in
the split-K attention (`qjl_scores`, sigma from the sign words) and its sign table in the one-row score
tables (`qjl_table`).

The side-car stores sigma = sign(R' r) (bit 1 = +1, one bit a coordinate in int32 words) and gamma_r = ||r||
(bf16) of the residual r = u - u_hat; a key's score gains q_j . (gamma gamma_r sigma) with q_j = R' R q
scaled (formats.md). The encode side is each kind's (its residual).
"""

import triton
import triton.language as tl

from .bits import row_codes
from .operands import mm_nt, operand


# ---------------------------------------------------------------- the QJL side-car (the -qjl codecs)
@triton.jit
def qjl_signs(rows_ptr, row_ok, D: tl.constexpr, N_WORDS: tl.constexpr, WP: tl.constexpr, TILE: tl.constexpr):
    """QJL: sigma [BN, D] as +-1.0 (stored bit 1 for +1)."""
    bits = row_codes(rows_ptr, row_ok, tl.arange(0, D)[None, :], 1, N_WORDS, WP, TILE)
    return bits.to(tl.float32) * 2.0 - 1.0


@triton.jit
def qjl_scores(s, qj, qj2, krow, n_ok, gamma, ks_ptr, kr_ptr, D: tl.constexpr, S_WP: tl.constexpr,
               TILE: tl.constexpr, HALVES: tl.constexpr, USE_DOT: tl.constexpr, PREC: tl.constexpr,
               OPD: tl.constexpr, RNE_BY_HAND: tl.constexpr):
    """s + q_j . (gamma gamma_r sigma) for the keys at rows krow (HALVES: two dots of d/2)."""
    s_words = (D + 31) // 32
    g_r = tl.load(kr_ptr + krow, mask=n_ok, other=0.0).to(tl.float32)[:, None]
    s_rows = ks_ptr + krow[:, None] * s_words
    if HALVES:
        SW2: tl.constexpr = D // 64
        sigma = qjl_signs(s_rows, n_ok[:, None], D // 2, SW2, SW2, TILE)
        s = mm_nt(qj, operand(sigma * (gamma * g_r), OPD, RNE_BY_HAND), s, USE_DOT, PREC)
        sigma = qjl_signs(s_rows + SW2, n_ok[:, None], D // 2, SW2, SW2, TILE)
        s = mm_nt(qj2, operand(sigma * (gamma * g_r), OPD, RNE_BY_HAND), s, USE_DOT, PREC)
    else:
        sigma = qjl_signs(s_rows, n_ok[:, None], D, s_words, S_WP, TILE)
        s = mm_nt(qj, operand(sigma * (gamma * g_r), OPD, RNE_BY_HAND), s, USE_DOT, PREC)
    return s


@triton.jit
def qjl_table(qs, had_ptr, qjs_ptr, qlut_ptr, r, h, inv_sqrt_d, qk_scale, k, D: tl.constexpr):
    """Row r's QJL sign table: q_j = R' q_rot = H_d (s'_h * q_rot) / sqrt(d) (qjs_ptr: the s' rows),
    S[r, p, e] = qk_scale * sum_t q_j[8p + t] * (2 ((e >> t) & 1) - 1)."""
    hfull = tl.load(had_ptr + k[:, None] * D + k[None, :])
    q_rot = tl.sum(qs[:, None] * hfull, axis=0)  # along the contraction axis
    qr = q_rot[:, None] * tl.load(qjs_ptr + h * D + k)[:, None] * inv_sqrt_d
    p = tl.arange(0, D // 8)
    byte = tl.arange(0, 256)
    s = tl.zeros((D // 8, 256), tl.float32)
    for bit in tl.static_range(8):
        col = 8 * p + bit
        hj = tl.load(had_ptr + k[:, None] * D + col[None, :])
        qj = tl.sum(qr * hj, axis=0)  # q_j[8p + t], [D/8]
        sgn = ((byte >> bit) & 1).to(tl.float32) * 2.0 - 1.0
        s += qj[:, None] * sgn[None, :]
    tl.store(qlut_ptr + r * (D // 8 * 256) + p[:, None] * 256 + byte[None, :], s * qk_scale)

