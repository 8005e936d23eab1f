"""The per-query score tables of the score-table attention (score_tables.py): their layout per key decode
section and the kernels that build them, one a section.

Triplet section: a table code a triplet (its n bits), T[i, e] = qk_scale * C_rho * (q_rot,i . D[dir]).
Scalar section: a table code a group of G adjacent coordinates (their codes lie side by side in the bit
stream, formats.md), T[i, e] = qk_scale * sum_j q_rot[G i + j] C_coord[e_j]. Polar section: a table code
the angle codes of the bottom G levels of a subtree of 2^G coordinates, T[m, e] = qk_scale *
sum_t q_rot[2^G m + t] * prod_lv (cos or sin)(psi_lv), the product along leaf t's path (the levels above
are combined in the attention loop, score_tables.py). With the QJL side-car, a sign
table over the sign bytes, S[p, e] = qk_scale * sum_t q_j[8p + t] (2 bit_t(e) - 1). q_rot = R q =
H_d (s_h * q) / sqrt(d) and q_j = R' q_rot, computed here from the Hadamard matrix.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl

from .codec_decode import polar_cos_sin
from .launch import _cdiv
from .spec import KernelCodec

FOLD_ENTRIES = 256  # fold C_rho into the triplet table when it has at most this many entries per triplet

# scalar section: a table code holds the most coordinates whose codes fit in this many bits (64 entries a
# group, 256 bytes: two cache lines a lookup; a group of one coordinate from 4 bits a code on); the polar
# section the most bottom levels whose 2^G - 1 angle codes fit in it (G = 2 up to 2 bits an angle, else 1)
SCALAR_GROUP_BITS = 6

TABLE_CODES_A_PROGRAM = 16


@triton.jit
def _rotated(qs, had_ptr, k, col, D: tl.constexpr):
    """q_rot[col] for the columns col [N] (zero where col >= d): H_d qs with qs = s_h * q / sqrt(d) [D]."""
    hk = tl.load(had_ptr + k[:, None] * D + col[None, :], mask=(col < D)[None, :], other=0.0)
    return tl.sum(qs[:, None] * hk, axis=0)


@triton.jit
def _qjl_table(qs, had_ptr, qjs_ptr, qlut_ptr, r, h, inv_sqrt_d, qk_scale, k, D: tl.constexpr):
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


@triton.jit
def _table_program(q_ptr, rs_ptr, H, inv_sqrt_d, D: tl.constexpr, L: tl.constexpr, TP: tl.constexpr):
    """A table program's (query row r, KV head h, columns k [D], qs = s_h * q_r / sqrt(d) [D], its table
    codes i [TP], i < L): program (r, block of TP table codes)."""
    r = tl.program_id(0)
    blk = tl.program_id(1)
    h = r % H
    k = tl.arange(0, D)
    qs = tl.load(q_ptr + r * D + k).to(tl.float32) * tl.load(rs_ptr + h * D + k) * inv_sqrt_d
    i = blk * TP + tl.arange(0, TP)
    return r, h, k, qs, i, i < L


@triton.jit
def _octopus_tables_kernel(q_ptr, rs_ptr, qs_ptr, had_ptr, dir_ptr, rho_ptr, lut_ptr, qlut_ptr,
                           H, inv_sqrt_d, qk_scale,
                           D: tl.constexpr, L: tl.constexpr, B_RHO: tl.constexpr,
                           FOLD_RHO: tl.constexpr, N_ENTRIES: tl.constexpr, CHUNK: tl.constexpr,
                           HAS_QJL: tl.constexpr, TP: tl.constexpr):
    """One program per (query row r, block of TP triplets) (KV head h = r % H): that part of the row's score
    tables; the block-0 programs also write the QJL table.

    q_rot = R q = H_d (s_h * q) / sqrt(d); triplet i's components are q_rot[3i + c] (zero beyond d).
    T[r, i, e] = qk_scale * C_rho[e & mask] * (q_rot,i . D[e >> B_RHO]) when FOLD_RHO (e < 2^n), else
    T[r, i, e] = qk_scale * (q_rot,i . D[e]) (e < 4^b_dir; rho is looked up in the attention loop).
    HAS_QJL: q_j = R' q_rot, S[r, p, e] = qk_scale * sum_t q_j[8p + t] * (2 ((e >> t) & 1) - 1).
    """
    r, h, k, qs, i, live = _table_program(q_ptr, rs_ptr, H, inv_sqrt_d, D, L, TP)
    qx = _rotated(qs, had_ptr, k, 3 * i, D)
    qy = _rotated(qs, had_ptr, k, 3 * i + 1, D)
    qz = _rotated(qs, had_ptr, k, 3 * i + 2, D)
    row_lut = lut_ptr + r * (L * N_ENTRIES)
    for e0 in tl.static_range(0, N_ENTRIES, CHUNK):
        e = e0 + tl.arange(0, CHUNK)
        if FOLD_RHO:
            dirn = e >> B_RHO
            rho = tl.load(rho_ptr + (e & ((1 << B_RHO) - 1)))
        else:
            dirn = e
            rho = tl.full((CHUNK,), 1.0, tl.float32)
        dx = tl.load(dir_ptr + dirn * 3)
        dy = tl.load(dir_ptr + dirn * 3 + 1)
        dz = tl.load(dir_ptr + dirn * 3 + 2)
        t = qx[:, None] * dx[None, :] + qy[:, None] * dy[None, :] + qz[:, None] * dz[None, :]
        t = t * (rho * qk_scale)[None, :]
        tl.store(row_lut + i[:, None] * N_ENTRIES + e[None, :], t, mask=live[:, None])
    if HAS_QJL and tl.program_id(1) == 0:
        _qjl_table(qs, had_ptr, qs_ptr, qlut_ptr, r, h, inv_sqrt_d, qk_scale, k, D)


@triton.jit
def _scalar_tables_kernel(q_ptr, rs_ptr, qs_ptr, had_ptr, cent_ptr, lut_ptr, qlut_ptr, H, inv_sqrt_d,
                          qk_scale, D: tl.constexpr, L: tl.constexpr, B: tl.constexpr, G: tl.constexpr,
                          N_ENTRIES: tl.constexpr, CHUNK: tl.constexpr, HAS_QJL: tl.constexpr,
                          TP: tl.constexpr):
    """One program per (query row r, block of TP coordinate groups) (KV head h = r % H): that part of the
    row's score tables (scalar section); the block-0 programs also write the QJL table.

    Group i is the G coordinates G i .. G i + G - 1 (those past d left out), whose B-bit codes lie side by
    side in the key's bit stream (formats.md): one (G B)-bit code e, coordinate G i + j's code at bits
    B j .. B j + B - 1. T[r, i, e] = qk_scale * sum_j q_rot[G i + j] * C_coord[(e >> B j) & (2^B - 1)].
    """
    r, h, k, qs, i, live = _table_program(q_ptr, rs_ptr, H, inv_sqrt_d, D, L, TP)
    q_g = ()
    for j in tl.static_range(G):
        q_g = q_g + (_rotated(qs, had_ptr, k, G * i + j, D) * qk_scale,)
    row_lut = lut_ptr + r * (L * N_ENTRIES)
    for e0 in tl.static_range(0, N_ENTRIES, CHUNK):
        e = e0 + tl.arange(0, CHUNK)
        t = tl.zeros((TP, CHUNK), tl.float32)
        for j in tl.static_range(G):
            c = tl.load(cent_ptr + ((e >> (B * j)) & ((1 << B) - 1)))
            t += q_g[j][:, None] * c[None, :]
        tl.store(row_lut + i[:, None] * N_ENTRIES + e[None, :], t, mask=live[:, None])
    if HAS_QJL and tl.program_id(1) == 0:
        _qjl_table(qs, had_ptr, qs_ptr, qlut_ptr, r, h, inv_sqrt_d, qk_scale, k, D)


@triton.jit
def _polar_tables_kernel(q_ptr, rs_ptr, had_ptr, cs_ptr, lut_ptr, H, inv_sqrt_d, qk_scale,
                         D: tl.constexpr, L: tl.constexpr, A_BITS: tl.constexpr, G: tl.constexpr,
                         N_ENTRIES: tl.constexpr, CHUNK: tl.constexpr, TP: tl.constexpr):
    """One program per (query row r, block of TP subtrees) (KV head h = r % H): that part of the row's score
    tables (polar section).

    Subtree m holds coordinates 2^G m + t (t < 2^G) and the angle codes of its bottom G levels: at level lv
    the 2^(G-1-lv) codes from D - (D >> lv) + m 2^(G-1-lv) on, adjacent in the bit stream; the table code e
    puts level lv's codes at bit A_BITS (2^G - 2^(G-lv)) (the order of the stream). Leaf t's path takes at
    level lv the node t >> (lv+1) of the subtree and its cos (bit lv of t clear) or sin (set), so
    T[r, m, e] = qk_scale * sum_t q_rot[2^G m + t] * prod_lv cs[lv, code_lv(e, t >> (lv+1)), bit lv of t]
    with cs the interleaved cos | sin of the level's angle centroids (codec_decode.polar_cos_sin).
    """
    r, h, k, qs, i, live = _table_program(q_ptr, rs_ptr, H, inv_sqrt_d, D, L, TP)
    q_t = ()
    for t in tl.static_range(1 << G):
        q_t = q_t + (_rotated(qs, had_ptr, k, (i << G) + t, D) * qk_scale,)
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


@dataclasses.dataclass(frozen=True)
class TableLayout:
    """How a key's codes index its score tables: `codes` table codes a key of `bits` bits each, side by side
    from bit 0 of its code words; `entries` per table code (2^bits, or 4^b_dir where a triplet table leaves
    C_rho to the attention loop: `fold_rho` False); `group`: the coordinates a scalar table code covers (its
    coordinates' codes are adjacent in the bit stream, formats.md), 0 otherwise; `levels`: the bottom angle
    levels a polar table code covers (its subtree's codes, not side by side: _polar_tables_kernel), 0
    otherwise."""

    codes: int
    bits: int
    entries: int
    fold_rho: bool
    group: int = 0
    levels: int = 0


def table_layout(codec: KernelCodec, group: int | None = None) -> TableLayout:
    """The score-table layout of `codec` (a section with score tables). Triplet: one table code a triplet,
    C_rho folded in when 2^n <= FOLD_ENTRIES or there is one norm. Scalar: `group` coordinates a table code
    (default: the most whose codes fit in SCALAR_GROUP_BITS bits), the last group short where it does not
    divide d (its missing coordinates' bits, read past the stream, select equal entries). Polar: a table code
    a subtree of the bottom G levels (the most whose 2^G - 1 codes fit in SCALAR_GROUP_BITS bits, at least
    one)."""
    n = codec.code_bits
    if codec.decode == "polar":
        log2d = codec.head_dim.bit_length() - 1
        g = max([1] + [lv for lv in range(1, log2d + 1) if ((1 << lv) - 1) * n <= SCALAR_GROUP_BITS])
        bits = ((1 << g) - 1) * n
        return TableLayout(codec.head_dim >> g, bits, 1 << bits, True, levels=g)
    if codec.decode == "scalar":
        g = group or max(1, SCALAR_GROUP_BITS // max(n, 1))
        return TableLayout(-(-codec.head_dim // g), g * n, 1 << (g * n), True, g)
    if (1 << n) <= FOLD_ENTRIES or codec.param("b_rho") == 0:
        return TableLayout(codec.num_codes, n, 1 << n, True)
    return TableLayout(codec.num_codes, n, 4 ** codec.param("b_dir"), False)


def build_tables(q: torch.Tensor, codec: KernelCodec, lay: TableLayout, h: int,
                 qk_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The score tables of the query rows q [..., d] (contiguous; row r is of KV head r % h), fp32:
    (lut [rows, lay.codes, lay.entries], qlut [rows, d/8, 256], or lut itself without the QJL side-car).
    One launch, a program per (row, TABLE_CODES_A_PROGRAM table codes)."""
    d = q.shape[-1]
    rows = q.numel() // d
    dev = q.device
    lut = torch.empty(rows, lay.codes, lay.entries, device=dev, dtype=torch.float32)
    qlut = torch.empty(rows, d // 8, 256, device=dev, dtype=torch.float32) if codec.has_qjl else lut
    qjl_signs = codec.qjl_signs if codec.has_qjl else codec.rotation_signs
    tp = TABLE_CODES_A_PROGRAM
    common = dict(D=d, L=lay.codes, N_ENTRIES=lay.entries, CHUNK=min(lay.entries, 128), HAS_QJL=codec.has_qjl,
                  TP=tp, num_warps=4)
    if codec.decode == "polar":
        _polar_tables_kernel[(rows, _cdiv(lay.codes, tp))](
            q, codec.rotation_signs, codec.hadamard, polar_cos_sin(codec), lut, h, 1.0 / math.sqrt(d),
            qk_scale, D=d, L=lay.codes, A_BITS=codec.code_bits, G=lay.levels, N_ENTRIES=lay.entries,
            CHUNK=min(lay.entries, 128), TP=tp, num_warps=4)
    elif codec.decode == "scalar":
        _scalar_tables_kernel[(rows, _cdiv(lay.codes, tp))](
            q, codec.rotation_signs, qjl_signs, codec.hadamard, codec.table("centroids"), lut, qlut,
            h, 1.0 / math.sqrt(d), qk_scale, B=codec.code_bits, G=lay.group, **common)
    else:
        _octopus_tables_kernel[(rows, _cdiv(lay.codes, tp))](
            q, codec.rotation_signs, qjl_signs, codec.hadamard, codec.table("directions"),
            codec.table("centroids"), lut, qlut, h, 1.0 / math.sqrt(d), qk_scale,
            B_RHO=codec.param("b_rho"), FOLD_RHO=lay.fold_rho, **common)
    return lut, qlut
