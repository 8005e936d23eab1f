"""The scalar decode kind (turboquant-mse, turboquant-qjl): a Lloyd-Max centroid per rotated coordinate.

A key stores one K_BITS-bit code per rotated coordinate (formats.md); u_hat_j = C_coord[code_j]. Here: the
kind's record (`KIND`), its @triton.jit helpers for the split-K attention (`scores`; its queries are
operands.rotated_queries), the key encode (`encode_codes`: a codebook search per coordinate, and the QJL
residual) and the score tables (`_scalar_tables_kernel`: a table code a group of adjacent coordinates), and
its launch table.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..bits import pack_tile, row_codes
from ..encode_math import _dot_pm1, _index, _table, rotated_rows, unit_coords
from ..operands import mm_nt, operand, rotated_queries
from ..qjl import qjl_table
from ..tables import (
    SCALAR_GROUP_BITS,
    TableLayout,
    rotated_query,
    sum_step,
    table_grid,
    table_options,
    table_program,
)
from .kind import DecodeKind, KindEncode, KindTables, register_kind

# the score tables' register cap (impls/score_tables.MAX_REGISTERS) holds the key loop up to this many code
# words a key, QJL sign words counted twice (turboquant-mse b <= 7 and -qjl b <= 6 at d=128, every b at
# d=64; mse b=8 (32 words) and qjl b=7 (24 + 2 x 4) spill under it)
CAPPED_SCALAR_WORDS = 28


def _scalar_tables(kc) -> dict:
    n = kc.code_bits
    return {} if n == 0 else {"centroids": (2**n,), "boundaries": (2**n - 1,)}


def _scalar_attention_tables(kc) -> tuple[torch.Tensor, torch.Tensor]:
    cent = kc.tables.get("centroids", kc.rotation_signs)  # rotation_signs: never read (0 bits)
    return cent, cent


@triton.jit
def turbo_unit(rows_ptr, row_ok, cent_ptr, D: tl.constexpr, N_BITS: tl.constexpr, N_WORDS: tl.constexpr,
               WP: tl.constexpr, TILE: tl.constexpr):
    """turboquant: u_hat [BN, D] = C_coord[code_j], one centroid lookup per coordinate."""
    codes = row_codes(rows_ptr, row_ok, tl.arange(0, D)[None, :], N_BITS, N_WORDS, WP, TILE)
    return tl.load(cent_ptr + codes)


@triton.jit
def scores(s, qa, qb, qc, k_rows, n_ok, gamma, cent_ptr, tab_b_ptr, K):
    """s + q_rot . (gamma u_hat), u_hat = C_coord[code] (no codes at 0 bits: s unchanged); the tile's keys:
    rows k_rows [BLOCK_N, 1] of code words, norms gamma [BLOCK_N, 1], valid where n_ok; the centroids at
    cent_ptr (`attention_tables`)."""
    if K.K_BITS > 0:
        if K.HALVES:  # half a key's codes is d/2 * K_BITS bits: whole words for d >= 64
            KW2: tl.constexpr = K.D * K.K_BITS // 64
            u = turbo_unit(k_rows, n_ok[:, None], cent_ptr, K.D // 2, K.K_BITS, KW2, K.K_WP2, K.TILE)
            s = mm_nt(qa, operand(u * gamma, K.OPD, K.RNE_BY_HAND), s, K.USE_DOT, K.PREC)
            u = turbo_unit(k_rows + KW2, n_ok[:, None], cent_ptr, K.D // 2, K.K_BITS, KW2, K.K_WP2, K.TILE)
            s = mm_nt(qb, operand(u * gamma, K.OPD, K.RNE_BY_HAND), s, K.USE_DOT, K.PREC)
        else:
            u = turbo_unit(k_rows, n_ok[:, None], cent_ptr, K.D, K.K_BITS, K.K_WORDS, K.K_WP, K.TILE)
            s = mm_nt(qa, operand(u * gamma, K.OPD, K.RNE_BY_HAND), s, K.USE_DOT, K.PREC)
    return s


@triton.jit
def _scalar_encode(y, gmax, inv_g, inv_sqrt_d, hoff, had_ptr, qs_ptr, cent_ptr, bnd_ptr, D: tl.constexpr,
                   LOG2D: tl.constexpr, K_BITS: tl.constexpr, K_CODES: tl.constexpr, WP: tl.constexpr,
                   KP: tl.constexpr, HAS_QJL: tl.constexpr, SPLIT: tl.constexpr, BLOCK_T: tl.constexpr):
    """(words, their word map, R' r, ||r||) of the rotated rows y: an index per unit coordinate u against the
    boundaries (none at 0 bits), and for QJL the residual r = u - C[index]."""
    dcol = tl.arange(0, D)[None, :]
    hrow = tl.arange(0, D)[:, None]
    words = gmax  # placeholders where there are no codes or no QJL term (never read)
    wmap = gmax
    proj = gmax
    gamma_r = gmax
    u = unit_coords(y, gmax, inv_g, inv_sqrt_d, LOG2D)
    if K_BITS > 0:
        i_u = _index(u, bnd_ptr, K_BITS, SPLIT, True)
        words, wmap = pack_tile(i_u, K_CODES, K_BITS, WP, KP)
        if HAS_QJL:
            u_hat = _table(cent_ptr + i_u, SPLIT)
    else:
        u_hat = tl.zeros((BLOCK_T, D), tl.float32)
    if HAS_QJL:
        res = u - u_hat
        gamma_r = tl.sqrt_rn(tl.sum(res * res, 1))
        qsg = tl.load(qs_ptr + hoff + dcol)
        proj = _dot_pm1(res * qsg, tl.load(had_ptr + hrow * D + dcol).to(tl.float32), SPLIT)
    return words, wmap, proj, gamma_r


@triton.jit
def encode_codes(xsg, rscale, gmax, inv_g, inv_sqrt_d, hoff, pid, near_ptr, had_ptr, hadt_ptr, qs_ptr,
                 cent_ptr, bnd_ptr, xib_ptr, aux_ptr, dir_ptr, K):
    """(code words [BT, WP], their word numbers in the stream, R' r [BT, D], ||r|| [BT]) of the rows xsg
    [BT, D] (the keys times their signs; gmax = max(gamma, 1e-30) and inv_g = RN(1/gmax) per row, rscale a
    power of two that keeps the rows' squares finite; K the kernel's `EncodeConstants`), the last two only
    with HAS_QJL: the signature of every kind's key encode (impls/encode.py). Here the rows are rotated
    (`rotated_rows`), then `_scalar_encode`."""
    y = rotated_rows(xsg, had_ptr, K.D, K.DOT_NATIVE, K.SPLIT)
    words, wmap, proj, gamma_r = _scalar_encode(y, gmax, inv_g, inv_sqrt_d, hoff, had_ptr, qs_ptr, cent_ptr,
                                                bnd_ptr, K.D, K.LOG2D, K.K_BITS, K.K_CODES, K.WP, K.KP,
                                                K.HAS_QJL, K.SPLIT, K.BLOCK_T)
    return words, wmap, proj, gamma_r


@triton.jit
def _scalar_tables_kernel(q_ptr, rs_ptr, qs_ptr, had_ptr, cent_ptr, lut_ptr, qlut_ptr, H, inv_sqrt_d,
                          qk_scale, D: tl.constexpr, L: tl.constexpr, B: tl.constexpr, G: tl.constexpr,
                          N_ENTRIES: tl.constexpr, CHUNK: tl.constexpr, HAS_QJL: tl.constexpr,
                          TP: tl.constexpr):
    """One program per (query row r, block of TP coordinate groups) (KV head h = r % H): that part of the
    row's score tables (scalar kind); the block-0 programs also write the QJL table.

    Group i is the G coordinates G i .. G i + G - 1 (those past d left out), whose B-bit codes lie side by
    side in the key's bit stream (formats.md): one (G B)-bit code e, coordinate G i + j's code at bits
    B j .. B j + B - 1. T[r, i, e] = qk_scale * sum_j q_rot[G i + j] * C_coord[(e >> B j) & (2^B - 1)].
    """
    r, h, k, qs, i, live = table_program(q_ptr, rs_ptr, H, inv_sqrt_d, D, L, TP)
    q_g = ()
    for j in tl.static_range(G):
        q_g = q_g + (rotated_query(qs, had_ptr, k, G * i + j, D) * qk_scale,)
    row_lut = lut_ptr + r * (L * N_ENTRIES)
    for e0 in tl.static_range(0, N_ENTRIES, CHUNK):
        e = e0 + tl.arange(0, CHUNK)
        t = tl.zeros((TP, CHUNK), tl.float32)
        for j in tl.static_range(G):
            c = tl.load(cent_ptr + ((e >> (B * j)) & ((1 << B) - 1)))
            t += q_g[j][:, None] * c[None, :]
        tl.store(row_lut + i[:, None] * N_ENTRIES + e[None, :], t, mask=live[:, None])
    if HAS_QJL and tl.program_id(1) == 0:
        qjl_table(qs, had_ptr, qs_ptr, qlut_ptr, r, h, inv_sqrt_d, qk_scale, k, D)


def _table_layout(kc, group: int | None = None) -> TableLayout:
    """`group` coordinates a table code (default: the most whose codes fit in SCALAR_GROUP_BITS bits), the
    last group short where it does not divide d (its missing coordinates' bits, read past the stream, select
    equal entries)."""
    n = kc.code_bits
    g = group or max(1, SCALAR_GROUP_BITS // max(n, 1))
    return TableLayout(-(-kc.head_dim // g), g * n, 1 << (g * n), True, g)


def _build_tables(q, kc, lay: TableLayout, h: int, qk_scale: float, lut, qlut) -> None:
    qjl_signs = kc.qjl_signs if kc.has_qjl else kc.rotation_signs
    _scalar_tables_kernel[table_grid(q, lay)](
        q, kc.rotation_signs, qjl_signs, kc.hadamard, kc.table("centroids"), lut, qlut,
        h, 1.0 / math.sqrt(kc.head_dim), qk_scale, B=kc.code_bits, G=lay.group, **table_options(kc, lay))


def _capped(kc, lay: TableLayout) -> bool:
    return kc.code_words + (2 * -(-kc.head_dim // 32) if kc.has_qjl else 0) <= CAPPED_SCALAR_WORDS


# The key kernel's launch (rows per program, warps, register cap or None) by (head-dim class, QJL): the H200
# sweep of the encode launches (each row checked against the library on the GPU; impls/encode.py says how
# they apply). At a code width (turboquant-qjl at b bits codes b - 1 a coordinate), H200 through encode_keys
# at 64k tokens x 16 heads (benchmarks/lab/sweep_encode_caps.py; every field equal to the previous launch's),
# ms before -> now: turboquant-qjl b=2 0.2014 -> 0.1782, b=3 0.2120 -> 0.1905, b=4 (cap 128 before) 0.2242 ->
# 0.2188; turboquant-mse b=2 0.1042 -> 0.1027 (two runs), b=3 0.1419 -> 0.1290. At d=128 the same sweep:
# turboquant-mse takes a 128 cap, faster at every width timed: b=1 / 2 / 3 / 4 / 5 / 8 0.2263 / 0.2469 /
# 0.3204 / 0.3307 / 0.6159 / 0.7215 -> 0.2086 / 0.2297 / 0.3018 / 0.3143 / 0.5583 / 0.6658 (b = 6, 7 take the
# row untimed); turboquant-qjl b=2 / 3 / 4 0.5099 / 0.5334 / 0.6201 -> 0.4666 / 0.4752 / 0.5848 under 168 (254
# registers uncapped; 128: 0.4842 / - / 0.6627); b=5 0.6766 -> 0.6863, uncapped.
KEY_LAUNCH = {(64, False): (64, 4, None), (64, True): (64, 4, None), (128, False): (64, 4, 128),
              (128, True): (64, 4, None)}
KEY_LAUNCH_BITS = {(64, False, 2): (64, 4, 72), (64, False, 3): (128, 4, 96), (64, True, 1): (64, 4, 96),
                   (64, True, 2): (64, 4, 96), (64, True, 3): (64, 4, 96), (128, True, 1): (64, 4, 168),
                   (128, True, 2): (64, 4, 168), (128, True, 3): (64, 4, 168)}

KIND = register_kind(DecodeKind(
    "scalar", _scalar_tables, _scalar_attention_tables, rotated_queries, scores,
    encode=KindEncode(encode_codes, KEY_LAUNCH, launch_bits=KEY_LAUNCH_BITS),
    score_tables=KindTables(_table_layout, _build_tables, sum_step, lambda kc: kc.table("centroids"), _capped,
                            groups=True, what="a group table")))
