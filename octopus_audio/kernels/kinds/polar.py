"""The polar decode kind (polarquant): recursive polar angles of the rotated unit key, Lloyd-Max per level.

A key stores d - 1 angle codes, level 1 (pairs of coordinates) first and the top angle last (formats.md);
u_hat is decoded top-down from radius 1, each angle turning a radius r into (r cos psi, r sin psi). Here: the
kind's record (`KIND`), its @triton.jit helpers for the split-K attention (`scores`; its queries are
operands.interleaved_queries), the key encode (`encode_codes`: angles by cross products against the
boundaries' cos and sin, no atan2) and the score tables (a table code the bottom levels of a subtree,
`_polar_tables_kernel`, and the levels above folded in the attention loop, `score_step`), and its launch
table.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..bits import cut_codes, load_words, pack_tile, unpack_codes
from ..encode_math import _table, rotated_rows
from ..operands import interleaved_queries, mm_nt, operand
from ..tables import (
    SCALAR_GROUP_BITS,
    TableLayout,
    _field,
    _keep_scores,
    _key_words,
    rotated_query,
    table_grid,
    table_options,
    table_program,
)
from .kind import DecodeKind, KindEncode, KindTables, register_kind


def _cached(kc, key: str, make):
    if key not in kc.__dict__:
        kc.__dict__[key] = make()
    return kc.__dict__[key]


def _polar_tables(kc) -> dict:
    levels, n = int(math.log2(kc.head_dim)), kc.code_bits
    return {"centroids": (levels, 2**n), "boundaries": (levels, 2**n - 1)}


def _polar_attention_tables(kc) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the angle centroids, flattened level-major (cached)."""
    centroids = kc.table("centroids")
    return _cached(kc, "_cos_sin", lambda: (torch.cos(centroids).reshape(-1).contiguous(),
                                                 torch.sin(centroids).reshape(-1).contiguous()))


def polar_cos_sin(kc) -> torch.Tensor:
    """[levels * 2^n * 2] fp32: cos and sin of each angle centroid side by side, level-major (the score
    tables' polar steps read both of an angle in one cache line), cached."""
    return _cached(kc, "_cos_sin_pairs",
                   lambda: torch.stack(_polar_attention_tables(kc), -1).reshape(-1).contiguous())


@triton.jit
def _polar_pair(rows_ptr, row_ok, words, cos_ptr, sin_ptr, r, D: tl.constexpr, LVL: tl.constexpr,
                S: tl.constexpr, N_BITS: tl.constexpr, TILE: tl.constexpr):
    """Level LVL's S angles turn the radii r [BN, S] into (r cos psi, r sin psi): the next level's even
    and odd radii."""
    j = (D - (D >> LVL)) + tl.arange(0, S)[None, :]
    if TILE:
        idx = cut_codes(words, j, N_BITS) + LVL * (1 << N_BITS)
    else:
        idx = unpack_codes(rows_ptr, j, row_ok, N_BITS) + LVL * (1 << N_BITS)
    return r * tl.load(cos_ptr + idx), r * tl.load(sin_ptr + idx)


@triton.jit
def _polar_level(rows_ptr, row_ok, words, cos_ptr, sin_ptr, r, BN: tl.constexpr, D: tl.constexpr,
                 LVL: tl.constexpr, S: tl.constexpr, N_BITS: tl.constexpr, TILE: tl.constexpr):
    even, odd = _polar_pair(rows_ptr, row_ok, words, cos_ptr, sin_ptr, r, D, LVL, S, N_BITS, TILE)
    return tl.reshape(tl.join(even, odd), (BN, 2 * S))


@triton.jit
def polar_unit(rows_ptr, row_ok, cos_ptr, sin_ptr, BN: tl.constexpr, D: tl.constexpr, LOG2D: tl.constexpr,
               N_BITS: tl.constexpr, N_WORDS: tl.constexpr, WP: tl.constexpr, TILE: tl.constexpr):
    """polarquant: u_hat [BN, D], decoded top-down from radius 1 with per-level cos/sin tables.

    Level lvl (0-based) holds D >> (lvl+1) angles starting at code D - (D >> lvl); each turns a radius r into
    the pair (r cos psi, r sin psi), and pairs interleave into the next level's radii.
    """
    if TILE:
        words = load_words(rows_ptr, row_ok, N_WORDS, WP)
    else:
        words = rows_ptr
    r = tl.full((BN, 1), 1.0, tl.float32)
    for lvl in tl.static_range(LOG2D - 1, -1, -1):
        r = _polar_level(rows_ptr, row_ok, words, cos_ptr, sin_ptr, r, BN, D, lvl, D >> (lvl + 1), N_BITS,
                         TILE)
    return r


@triton.jit
def polar_halves(rows_ptr, row_ok, cos_ptr, sin_ptr, BN: tl.constexpr, D: tl.constexpr, LOG2D: tl.constexpr,
                 N_BITS: tl.constexpr, N_WORDS: tl.constexpr, WP: tl.constexpr, TILE: tl.constexpr):
    """polarquant's u_hat as its even and odd coordinates ([BN, D/2] each): the last level's cos and sin
    products before they interleave."""
    if TILE:
        words = load_words(rows_ptr, row_ok, N_WORDS, WP)
    else:
        words = rows_ptr
    r = tl.full((BN, 1), 1.0, tl.float32)
    for lvl in tl.static_range(LOG2D - 1, 0, -1):
        r = _polar_level(rows_ptr, row_ok, words, cos_ptr, sin_ptr, r, BN, D, lvl, D >> (lvl + 1), N_BITS,
                         TILE)
    return _polar_pair(rows_ptr, row_ok, words, cos_ptr, sin_ptr, r, D, 0, D >> 1, N_BITS, TILE)


@triton.jit
def scores(s, qa, qb, qc, k_rows, n_ok, gamma, cos_ptr, sin_ptr, K):
    """s + q_rot . (gamma u_hat), u_hat decoded top-down from the angle codes (K.HALVES: even | odd); the
    angles' cos and sin at cos_ptr, sin_ptr (`attention_tables`)."""
    if K.HALVES:
        ue, uo = polar_halves(k_rows, n_ok[:, None], cos_ptr, sin_ptr, K.BLOCK_N, K.D, K.LOG2D, K.K_BITS,
                              K.K_WORDS, K.K_WP, K.TILE)
        s = mm_nt(qa, operand(ue * gamma, K.OPD, K.RNE_BY_HAND), s, K.USE_DOT, K.PREC)
        s = mm_nt(qb, operand(uo * gamma, K.OPD, K.RNE_BY_HAND), s, K.USE_DOT, K.PREC)
    else:
        u = polar_unit(k_rows, n_ok[:, None], cos_ptr, sin_ptr, K.BLOCK_N, K.D, K.LOG2D, K.K_BITS, K.K_WORDS,
                       K.K_WP, K.TILE)
        s = mm_nt(qa, operand(u * gamma, K.OPD, K.RNE_BY_HAND), s, K.USE_DOT, K.PREC)
    return s


@triton.jit
def _cat(a, b):
    """[BT, S] ++ [BT, S] -> [BT, 2S] along the last axis, in registers."""
    BT: tl.constexpr = a.shape[0]
    S: tl.constexpr = a.shape[1]
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), (BT, 2 * S))


@triton.jit
def _cross_count(bq, aq, c_ptr, s_ptr, N: tl.constexpr, ASM: tl.constexpr):
    """#{k < 2**N - 1 : bq c_k - aq s_k > 0} for tables c, s whose test holds on a prefix of k (boundaries in
    increasing angle): compares in registers up to 7, a binary search of N table reads beyond."""
    if N <= 3:
        acc = tl.zeros(bq.shape, tl.float32)
        for k in tl.static_range((1 << N) - 1):
            acc += tl.where(tl.fma(bq, tl.load(c_ptr + k), -(aq * tl.load(s_ptr + k))) > 0, 1.0, 0.0)
        return acc.to(tl.int32)
    else:
        idx = tl.zeros(bq.shape, tl.int32)
        for level in tl.static_range(N):
            step = 1 << (N - 1 - level)
            j = idx + (step - 1)
            hit = tl.fma(bq, _table(c_ptr + j, ASM), -(aq * _table(s_ptr + j, ASM))) > 0
            idx = tl.where(hit, idx + step, idx)
        return idx


@triton.jit
def _polar_radii(r2, trig_ptr, BT: tl.constexpr, LVL: tl.constexpr, S: tl.constexpr, LEVELS: tl.constexpr,
                 N_BITS: tl.constexpr, ASM: tl.constexpr):
    """Angle codes of levels LVL >= 1 from the squared radii r2 [BT, 2S] of the level below, concatenated
    level by level in stream order and padded with one zero code: [BT, 2S]. psi = atan2(r_odd, r_even) lies in
    [0, pi/2] like the boundaries, so psi > beta exactly when r2_odd cos^2 beta > r2_even sin^2 beta: no
    angle and no square root (trig_ptr: rows cos^2, sin^2 of each level's boundaries)."""
    NB: tl.constexpr = (1 << N_BITS) - 1
    e, o = tl.split(tl.reshape(r2, (BT, S, 2)))
    codes = _cross_count(o, e, trig_ptr + LVL * NB, trig_ptr + (LEVELS + LVL) * NB, N_BITS, ASM)
    if S == 1:
        rest = tl.zeros((BT, 1), tl.int32)
    else:
        rest = _polar_radii(e + o, trig_ptr, BT, LVL + 1, S // 2, LEVELS, N_BITS, ASM)
    return _cat(codes, rest)


@triton.jit
def _polar_codes(y, trig_ptr, BT: tl.constexpr, D: tl.constexpr, LEVELS: tl.constexpr, N_BITS: tl.constexpr,
                 ASM: tl.constexpr):
    """polarquant codes [BT, D] (D - 1 and a zero pad) of rotated rows y [BT, D] scaled by any positive
    per-row factor (the angles do not depend on it). Level 1, pair (a, b): psi = atan2(b, a) in [0, 2 pi)
    against the uniform boundaries beta_k, k < 2^N - 1; beta_{h-1} (h = 2^(N-1)) is pi within rounding, the
    h - 1 below it lie in (0, pi) and the upper half repeats them shifted by pi. So for b >= 0 the code counts
    the lower boundaries with b cos beta - a sin beta > 0; for b < 0 it is h plus the same count for the
    reflected pair (-a, -b) (one rounding apart from the upper boundaries themselves); the middle boundary is
    tested on its own (trig row 0 holds cos, sin of level 1's boundaries; its sine's sign says on which side
    of pi it was rounded). From 3 bits, pairs exactly on an axis or a diagonal (one in 1e5 with 16-bit keys)
    take the reference's own code for that angle. Levels >= 2: `_polar_radii`."""
    NB: tl.constexpr = (1 << N_BITS) - 1
    H: tl.constexpr = 1 << (N_BITS - 1)
    a, b = tl.split(tl.reshape(y, (BT, D // 2, 2)))
    neg = b < 0
    ar = tl.where(neg, -a, a)
    br = tl.abs(b)
    c_ptr = trig_ptr
    s_ptr = trig_ptr + LEVELS * NB
    if N_BITS > 1:
        lower = _cross_count(br, ar, c_ptr, s_ptr, N_BITS - 1, ASM)
    else:
        lower = tl.zeros(a.shape, tl.int32)
    s_mid = tl.load(s_ptr + (H - 1))
    cross = tl.fma(b, tl.load(c_ptr + (H - 1)), -(a * s_mid)) > 0
    below_pi = (tl.zeros(b.shape, tl.float32) + s_mid) > 0
    mid = tl.where(neg, below_pi | cross, below_pi & cross)
    codes = tl.where(neg, H - 1, 0) + lower + mid.to(tl.int32)
    if N_BITS >= 3:
        # (a, b) on an axis or a diagonal lies exactly on a boundary from 3 bits (the cross products get the
        # axes of 1 and 2 bits right): the reference's code there is whatever its atan2 rounds to, read from
        # the table (9 cases after the trig rows)
        sa = (a.to(tl.int32, bitcast=True) >> 31) & 1
        sb = (b.to(tl.int32, bitcast=True) >> 31) & 1
        bz = b == 0
        az = a == 0
        k = tl.where(bz, sa * (4 + 4 * sb), tl.where(az, 2 + 4 * sb, 1 + 2 * (2 * sb + (sa ^ sb))))
        tie = bz | az | (tl.abs(a) == tl.abs(b))
        codes = tl.where(tie, _table(trig_ptr + 2 * LEVELS * NB + k, ASM).to(tl.int32), codes)
    rest = _polar_radii(tl.fma(a, a, b * b), trig_ptr, BT, 1, D // 4, LEVELS, N_BITS, ASM)
    return _cat(codes, rest)


@triton.jit
def encode_codes(xsg, rscale, gmax, inv_g, inv_sqrt_d, hoff, pid, near_ptr, had_ptr, hadt_ptr, qs_ptr,
                 cent_ptr, bnd_ptr, xib_ptr, aux_ptr, dir_ptr, K):
    """The kind's key encode (scalar.encode_codes' signature): the rows rotated, then their angle codes
    (`_polar_codes` against the trig table at aux_ptr, `_polar_trig`); no QJL term."""
    y = rotated_rows(xsg, had_ptr, K.D, K.DOT_NATIVE, K.SPLIT)
    # the angles need no division by gamma, only a scale that keeps the squares finite
    codes = _polar_codes(y * rscale[:, None], aux_ptr, K.BLOCK_T, K.D, K.LOG2D, K.K_BITS, K.SPLIT)
    words, wmap = pack_tile(codes, K.K_CODES, K.K_BITS, K.WP, K.KP)
    return words, wmap, y, gmax  # no QJL term: placeholders, never read


@triton.jit
def _polar_tables_kernel(q_ptr, rs_ptr, had_ptr, cs_ptr, lut_ptr, H, inv_sqrt_d, qk_scale,
                         D: tl.constexpr, L: tl.constexpr, A_BITS: tl.constexpr, G: tl.constexpr,
                         N_ENTRIES: tl.constexpr, CHUNK: tl.constexpr, TP: tl.constexpr):
    """One program per (query row r, block of TP subtrees) (KV head h = r % H): that part of the row's score
    tables (polar kind).

    Subtree m holds coordinates 2^G m + t (t < 2^G) and the angle codes of its bottom G levels: at level lv
    the 2^(G-1-lv) codes from D - (D >> lv) + m 2^(G-1-lv) on, adjacent in the bit stream; the table code e
    puts level lv's codes at bit A_BITS (2^G - 2^(G-lv)) (the order of the stream). Leaf t's path takes at
    level lv the node t >> (lv+1) of the subtree and its cos (bit lv of t clear) or sin (set), so
    T[r, m, e] = qk_scale * sum_t q_rot[2^G m + t] * prod_lv cs[lv, code_lv(e, t >> (lv+1)), bit lv of t]
    with cs the interleaved cos | sin of the level's angle centroids (`polar_cos_sin`).
    """
    r, h, k, qs, i, live = table_program(q_ptr, rs_ptr, H, inv_sqrt_d, D, L, TP)
    q_t = ()
    for t in tl.static_range(1 << G):
        q_t = q_t + (rotated_query(qs, had_ptr, k, (i << G) + t, D) * qk_scale,)
    row_lut = lut_ptr + r * (L * N_ENTRIES)
    for e0 in tl.static_range(0, N_ENTRIES, CHUNK):
        e = e0 + tl.arange(0, CHUNK)
        acc = tl.zeros((TP, CHUNK), tl.float32)
        for t in tl.static_range(1 << G):
            f = tl.full((CHUNK,), 1.0, tl.float32)
            for lv in tl.static_range(G):
                off = A_BITS * ((1 << G) - (1 << (G - lv))) + A_BITS * (t >> (lv + 1))
                code = (e >> off) & ((1 << A_BITS) - 1)
                f = f * tl.load(cs_ptr + 2 * (lv * (1 << A_BITS) + code) + ((t >> lv) & 1))
            acc += q_t[t][:, None] * f[None, :]
        tl.store(row_lut + i[:, None] * N_ENTRIES + e[None, :], acc, mask=live[:, None])


@triton.jit
def score_step(row_lut, qlut_ptr, cs_ptr, kc_ptr, kg_ptr, ks_ptr, kr_ptr, s_ptr, r, n0, end, qjl_coef, zero,
               m_vec, rho0, rho1, D: tl.constexpr, L: tl.constexpr, K_BITS: tl.constexpr,
               K_WORDS: tl.constexpr, B_RHO: tl.constexpr, N_ENTRIES: tl.constexpr, FOLD_RHO: tl.constexpr,
               HAS_QJL: tl.constexpr, BLOCK_K: tl.constexpr, PAIRS: tl.constexpr, G: tl.constexpr,
               A_BITS: tl.constexpr, LOG2D: tl.constexpr, MASKED: tl.constexpr):
    """One step of the score phase (tables.sum_step's signature) for the polar kind: keys [n0, n0 + BLOCK_K).

    The score folds up the angle tree: with S_-1[i] = q_rot[i] and S_lv[m] = cos(psi_lv,m) S_lv-1[2m] +
    sin(psi_lv,m) S_lv-1[2m+1], q . k_n = gamma_n * S_top. Subtree m's table code (`_polar_tables_kernel`)
    gathers level lv's 2^(G-1-lv) angle codes from D - (D >> lv) + m 2^(G-1-lv) on into bits A_BITS (2^G -
    2^(G-lv)) up and gives its S_G-1 in one lookup; level lv >= G's angle m is code D - (D >> lv) + m, its
    cos | sin pair at cs_ptr + 2 (lv 2^A_BITS + code): a pair read and two FMAs an angle. Loads gated as in
    sum_step."""
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


def _polar_trig(codec) -> torch.Tensor:
    """fp32, flat: [2, levels, 2^b - 1] from the fp32 polarquant boundaries, in float64: level 1 (row 0) cos
    and sin of its boundaries, levels >= 2 cos^2 and sin^2 (the kernel compares squared radii); then 9 level-1
    codes as the reference computes them, in fp32 on the codec's device (its atan2 decides where the angle
    lies exactly on a boundary), of the pairs (a, b) at angles k pi/4, k < 8, and (-1, -0)."""
    boundaries = codec.table("boundaries")
    beta = boundaries.double()
    c, s = torch.cos(beta), torch.sin(beta)
    c[1:], s[1:] = c[1:] ** 2, s[1:] ** 2
    k = torch.arange(9, device=beta.device, dtype=torch.float64)
    a = torch.where(k == 8, -1.0, torch.round(torch.cos(k * (math.pi / 4)))).float()
    b = torch.round(torch.sin(k * (math.pi / 4))).float()
    b = torch.where(k == 8, -torch.zeros_like(b), b)
    psi = torch.atan2(b, a)
    psi = torch.where(psi < 0, psi + 2 * math.pi, psi)
    ties = torch.searchsorted(boundaries[0].contiguous(), psi.contiguous(), right=False)
    return torch.cat([torch.stack([c, s]).float().reshape(-1), ties.float()])


def _encode_tables(kc, dtype) -> tuple:
    """The key kernel's kind tables (hadt, xib, aux, dir): the trig table as aux."""
    return None, None, _polar_trig(kc), None


def _table_layout(kc, group: int | None = None) -> TableLayout:
    """A table code a subtree of the bottom G levels: the most whose 2^G - 1 codes fit in SCALAR_GROUP_BITS
    bits, at least one."""
    n, log2d = kc.code_bits, kc.head_dim.bit_length() - 1
    g = max([1] + [lv for lv in range(1, log2d + 1) if ((1 << lv) - 1) * n <= SCALAR_GROUP_BITS])
    bits = ((1 << g) - 1) * n
    return TableLayout(kc.head_dim >> g, bits, 1 << bits, True, levels=g)


def _build_tables(q, kc, lay: TableLayout, h: int, qk_scale: float, lut, qlut) -> None:
    options = {k: v for k, v in table_options(kc, lay).items() if k != "HAS_QJL"}  # no side-car
    _polar_tables_kernel[table_grid(q, lay)](
        q, kc.rotation_signs, kc.hadamard, polar_cos_sin(kc), lut, h, 1.0 / math.sqrt(kc.head_dim), qk_scale,
        A_BITS=kc.code_bits, G=lay.levels, **options)


# The key kernel's launch by (head-dim class, QJL) and at a code width (impls/encode.py; H200, encode_keys at
# 64k tokens x 16 heads, benchmarks/lab/sweep_encode_caps.py): polarquant b=4 0.2967 -> 0.2831 ms under 80
# registers; at d=128 a 128 cap, faster at every width timed: b=1 / 2 / 3 / 4 / 5 / 8 0.6169 / 0.6874 /
# 1.0844 / 1.0225 / 1.5542 / 1.8499 -> 0.4359 / 0.5160 / 0.8568 / 0.7974 / 1.2816 / 1.6281 (130 registers
# uncapped at b=2: one 8-warp block an SM, two capped). The fused unit encode's key programs at b=2: 0.2609 ->
# 0.2390 ms under 128.
KEY_LAUNCH = {(64, False): (64, 4, None), (128, False): (64, 8, 128)}
KEY_LAUNCH_BITS = {(64, False, 2): (128, 4, None), (64, False, 4): (64, 4, 80)}
UNIT_CAPS = {(64, False, 2): 128}
# the one-row score tables at d >= 128 (impls/score_tables.TABLE_LAUNCH: keys a score step, keys a value step,
# warps, programs an SM, value pipeline depth): the angle folds take more registers than the other kinds'
# sums, 0.3573 -> 0.2751 ms at (128, 32, 4, 5) against the wide launch (H200, 128k keys, graph-timed,
# benchmarks/lab/sweep_table_occupancy.py); the value loop 3 deep 0.2539 -> 0.2503
WIDE_TABLE_LAUNCH = (128, 32, 4, 5, 3)

KIND = register_kind(DecodeKind(
    "polar", _polar_tables, _polar_attention_tables, interleaved_queries, scores,
    encode=KindEncode(encode_codes, KEY_LAUNCH, tables=_encode_tables, launch_bits=KEY_LAUNCH_BITS,
                      unit_caps=UNIT_CAPS),
    score_tables=KindTables(_table_layout, _build_tables, score_step, polar_cos_sin,
                            wide_launch=WIDE_TABLE_LAUNCH, what="a subtree table")))
