"""The triplet decode kind (octopus, octopus-qjl): per triplet of rotated coordinates an octahedral direction
and a Lloyd-Max norm.

A key stores ceil(d/3) codes ((i_xi << b_dir | i_eta) << b_rho | i_rho, formats.md); a triplet decodes to
C_rho[i_rho] * n_hat(i_xi, i_eta). Here: the kind's record (`KIND`), its @triton.jit helpers for the split-K
attention (`queries`, `scores`: three LP-deep dots over the triplets' x, y and z components) and the score
tables (`_octopus_tables_kernel`: a table code a triplet), its key encode's host tables (the search tables of
kinds/triplet_search.py; the @triton.jit joint rounding is kinds/triplet_rounding.py), and its launch table.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..bits import row_codes
from ..operands import mm_nt, operand, project
from ..qjl import qjl_table
from ..tables import TableLayout, rotated_query, sum_step, table_grid, table_options, table_program
from .kind import DecodeKind, KindEncode, KindTables, register_kind
from .triplet_rounding import NEAR_ROWS, encode_codes
from .triplet_search import TripletSearchTables, search_tables

DIR_UNFOLD, DIR_FOLDED = 0, 2  # the kind's DIR_TABLE


def _cached(kc, key: str, make):
    if key not in kc.__dict__:
        kc.__dict__[key] = make()
    return kc.__dict__[key]


# folded rows (one 16-byte row a code: C_rho and the direction premultiplied) where the key codes
# have at most this many bits (2**n rows, 16 KiB at n = 10, octopus b=3; b=4 has n = 13), else the direction
# unfolded in registers from the xi centroids: folded rows beat the unfold at every AAR batch on the H200
FOLDED_MAX_BITS = 10


def _triplet_tables(kc) -> dict:
    b_dir, b_rho = kc.param("b_dir"), kc.param("b_rho")
    if b_dir < 1 or b_rho < 0 or kc.code_bits != 2 * b_dir + b_rho or kc.num_codes != -(-kc.head_dim // 3):
        raise ValueError(f"{kc.name or kc.kind.name}: triplet codes are ceil(d/3) codes of 2 b_dir + b_rho "
                         f"bits (b_dir >= 1), got {kc.num_codes} of {kc.code_bits} bits, b_dir {b_dir}, "
                         f"b_rho {b_rho}")
    return {"directions": (4**b_dir, 3), "xi_boundaries": (2**b_dir - 1,), "xi_centroids": (2**b_dir,),
            "centroids": (2**b_rho,), "boundaries": (2**b_rho - 1,)}


def dir_table(kc) -> int:
    """The triplet direction decode: folded rows where the key codes have at most FOLDED_MAX_BITS bits, else
    the unfold in registers."""
    return DIR_FOLDED if kc.code_bits <= FOLDED_MAX_BITS else DIR_UNFOLD


def folded_directions(kc) -> torch.Tensor:
    """[2**n * 4] fp32, row `code` = (x, y, z, 0) of C_rho[code & (2**b_rho - 1)] times D[code >> b_rho] (a
    triplet's whole decode as one 16-byte row; n = 2 b_dir + b_rho), cached."""
    def make():
        b_dir, b_rho = kc.param("b_dir"), kc.param("b_rho")
        rho = kc.table("centroids").repeat(4**b_dir)[:, None]
        rows = kc.table("directions").repeat_interleave(2**b_rho, 0) * rho
        return torch.nn.functional.pad(rows, (0, 1)).reshape(-1).contiguous()

    return _cached(kc, "_folded", make)


def _triplet_attention_tables(kc) -> tuple[torch.Tensor, torch.Tensor]:
    tab = folded_directions(kc) if dir_table(kc) == DIR_FOLDED else kc.table("xi_centroids")
    return tab, kc.table("centroids")


def _triplet_constants(kc) -> dict:
    return dict(LP=kc.triplet_lanes, B_DIR=kc.param("b_dir"), B_RHO=kc.param("b_rho"),
                DIR_TABLE=dir_table(kc))


def _triplet_query_block(kc, rot: torch.Tensor) -> torch.Tensor:
    """The triplet components x | y | z of R q: column c * LP + i holds coordinate 3i + c (zero past d)."""
    d, lp = kc.head_dim, kc.triplet_lanes
    j = 3 * torch.arange(lp, device=rot.device)[None, :] + torch.arange(3, device=rot.device)[:, None]
    j = j.reshape(-1)
    return torch.where(j < d, rot[:, :, j.clamp_max(d - 1)], 0.0)


@triton.jit
def octopus_triplets(rows_ptr, row_ok, gain, tab_ptr, rho_ptr, LP: tl.constexpr, L: tl.constexpr,
                     N_BITS: tl.constexpr, B_DIR: tl.constexpr, B_RHO: tl.constexpr, DIR_TABLE: tl.constexpr,
                     N_WORDS: tl.constexpr, WP: tl.constexpr, TILE: tl.constexpr):
    """octopus: the triplets gain * t_hat = gain * C_rho[i_rho] * n_hat as three component tiles [BN, LP]
    (x, y, z); `gain` [BN, 1] is the key's norm gamma, folded into the one scale each lane already needs.

    DIR_TABLE 2: the whole triplet is one 16-byte row of the folded table at tab_ptr (folded_directions:
    C_rho and D premultiplied, one row a code), one vector load a triplet and no C_rho lookup.
    0: n_hat is unfolded in registers from the xi centroids at tab_ptr (two lookups into a table of
    2^b_dir floats, then the octahedral unfold and a reciprocal square root), which touches far fewer cache
    lines than a lookup into the decoded-direction table D [4^b_dir, 3]. Padded triplets (>= L) read code 0
    and meet zero query columns.
    """
    i = tl.arange(0, LP)[None, :]
    live = row_ok & (i < L)
    codes = tl.where(live, row_codes(rows_ptr, row_ok if TILE else live, i, N_BITS, N_WORDS, WP, TILE), 0)
    if DIR_TABLE == 2:
        BN: tl.constexpr = codes.shape[0]
        c4 = tl.arange(0, 4)[None, None, :]
        t = tl.load(tab_ptr + codes[:, :, None] * 4 + c4, mask=live[:, :, None], other=0.0)  # one 16-B load
        xz, y0 = tl.split(tl.reshape(t * gain[:, :, None], (BN, LP, 2, 2)))  # (x, z) and (y, 0) pairs
        kx, kz = tl.split(xz)
        ky, _ = tl.split(y0)
        return kx, ky, kz
    rho = tl.load(rho_ptr + (codes & ((1 << B_RHO) - 1)), mask=live, other=0.0) * gain
    xi = tl.load(tab_ptr + (codes >> (B_RHO + B_DIR)), mask=live, other=0.0)
    eta = tl.load(tab_ptr + ((codes >> B_RHO) & ((1 << B_DIR) - 1)), mask=live, other=0.0)
    z = 1.0 - tl.abs(xi) - tl.abs(eta)
    lower = z < 0
    x = tl.where(lower, tl.where(xi < 0, -1.0, 1.0) * (1.0 - tl.abs(eta)), xi)
    y = tl.where(lower, tl.where(eta < 0, -1.0, 1.0) * (1.0 - tl.abs(xi)), eta)
    scale = rho * tl.math.rsqrt(x * x + y * y + z * z)
    kx = x * scale
    ky = y * scale
    kz = z * scale
    return kx, ky, kz


@triton.jit
def queries(q_pro, qmap, qn, rot_scale, K):
    """The triplet components of R q, x | y | z, as three operands [M, LP] (zero past d)."""
    lcol = tl.arange(0, K.LP)[None, :]
    qx = project(q_pro, qmap, lcol, rot_scale, K.USE_DOT, K.PREC_Q, K.OPD, K.RNE_BY_HAND)
    qy = project(q_pro, qmap, K.LP + lcol, rot_scale, K.USE_DOT, K.PREC_Q, K.OPD, K.RNE_BY_HAND)
    qz = project(q_pro, qmap, 2 * K.LP + lcol, rot_scale, K.USE_DOT, K.PREC_Q, K.OPD, K.RNE_BY_HAND)
    return qx, qy, qz


@triton.jit
def scores(s, qx, qy, qz, k_rows, n_ok, gamma, tab_ptr, rho_ptr, K):
    """s + sum over components of q_c . (gamma C_rho n_hat)_c: three LP-deep dots (`octopus_triplets`; the
    tables at tab_ptr, rho_ptr: `attention_tables`)."""
    kx, ky, kz = octopus_triplets(k_rows, n_ok[:, None], gamma, tab_ptr, rho_ptr, K.LP, K.K_CODES, K.K_BITS,
                                  K.B_DIR, K.B_RHO, K.DIR_TABLE, K.K_WORDS, K.K_WP, K.TILE)
    s = mm_nt(qx, operand(kx, K.OPD, K.RNE_BY_HAND), s, K.USE_DOT, K.PREC)
    s = mm_nt(qy, operand(ky, K.OPD, K.RNE_BY_HAND), s, K.USE_DOT, K.PREC)
    s = mm_nt(qz, operand(kz, K.OPD, K.RNE_BY_HAND), s, K.USE_DOT, K.PREC)
    return s


FOLD_ENTRIES = 256  # fold C_rho into the triplet table when it has at most this many entries per triplet


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
    r, h, k, qs, i, live = table_program(q_ptr, rs_ptr, H, inv_sqrt_d, D, L, TP)
    qx = rotated_query(qs, had_ptr, k, 3 * i, D)
    qy = rotated_query(qs, had_ptr, k, 3 * i + 1, D)
    qz = rotated_query(qs, had_ptr, k, 3 * i + 2, D)
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
        qjl_table(qs, had_ptr, qs_ptr, qlut_ptr, r, h, inv_sqrt_d, qk_scale, k, D)


def _triplet_hadamard(codec) -> torch.Tensor:
    """[3, d, lp] fp32: slice c holds the Hadamard columns 3j + c (j < lp; zero where 3j + c >= d), so that
    x @ slice c is coordinate c of every triplet of x @ H_d."""
    had, d, lp, device = codec.hadamard, codec.head_dim, codec.triplet_lanes, codec.hadamard.device
    out = torch.zeros(3, d, lp, device=device)
    for c in range(3):
        cols = torch.arange(c, d, 3, device=device)
        out[c, :, : cols.numel()] = had[:, cols]
    return out


def triplet_search(codec) -> TripletSearchTables:
    """The kind's search tables (`triplet_search.search_tables`) on the codec's device, built once per codec
    and device."""
    cache = codec.__dict__.setdefault("_triplet_search", {})
    dev = codec.table("directions").device
    if dev not in cache:
        cache[dev] = search_tables(codec.table("directions"), codec.table("xi_centroids"),
                                   codec.table("xi_boundaries"), codec.table("boundaries"))
    return cache[dev]


def _encode_constants(kc) -> dict:
    search = triplet_search(kc)
    return dict(SEARCH_K=search.k, LUT_SCALE=search.lut_scale, HALF=int(search.half),
                RHO_SCALE=search.rho_scale, LP=kc.triplet_lanes)


def _encode_tables(kc, dtype) -> tuple:
    """The key kernel's kind tables (hadt, xib, aux, dir): the triplet Hadamard columns in `dtype`, the
    seeds' region lookup, the candidate and direction rows (`triplet_search`), the direction table as its
    three coordinate rows [3, 4^b_dir] (near ties)."""
    search = triplet_search(kc)
    return (_triplet_hadamard(kc).to(dtype), search.lut, search.table,
            kc.table("directions").t().contiguous())


def _table_layout(kc, group: int | None = None) -> TableLayout:
    """One table code a triplet, C_rho folded in when 2^n <= FOLD_ENTRIES or there is one norm."""
    n = kc.code_bits
    if (1 << n) <= FOLD_ENTRIES or kc.param("b_rho") == 0:
        return TableLayout(kc.num_codes, n, 1 << n, True)
    return TableLayout(kc.num_codes, n, 4 ** kc.param("b_dir"), False)


def _build_tables(q, kc, lay: TableLayout, h: int, qk_scale: float, lut, qlut) -> None:
    qjl_signs = kc.qjl_signs if kc.has_qjl else kc.rotation_signs
    _octopus_tables_kernel[table_grid(q, lay)](
        q, kc.rotation_signs, qjl_signs, kc.hadamard, kc.table("directions"), kc.table("centroids"), lut,
        qlut, h, 1.0 / math.sqrt(kc.head_dim), qk_scale, B_RHO=kc.param("b_rho"), FOLD_RHO=lay.fold_rho,
        **table_options(kc, lay))


def _capped(kc, lay: TableLayout) -> bool:
    """Without QJL (octopus b=2-4), or with C_rho folded into the table (octopus-qjl b <= 2): octopus-qjl at
    b=3-4 (C_rho looked up) spills under the cap."""
    return not kc.has_qjl or lay.fold_rho


# The key kernel's launch (rows per program, warps, register cap or None) by (head-dim class, QJL): the fewest
# SASS instructions per key without spills since the table search (benchmarks/lab/count_sass_encode.py). At
# d=128 (H200, triton 3.6, 32 heads x 8k keys, b=2): 2048 elements of a key tile a warp (64 rows x 4 warps,
# 128 x 8) fault in the rotation dot (compute-sanitizer: out-of-range shared or local address), so it takes
# 1024: octopus 64 x 8 under the 128 cap 0.589 ms (uncapped 0.668, 32 x 4 0.871), octopus-qjl 32 x 4 0.955
# (16 x 4 1.118). At a code width (octopus(-qjl) b = 2, 3, 4 code 7, 10, 13 bits a triplet; H200 through
# encode_keys at 64k tokens x 16 heads, benchmarks/lab/sweep_encode_caps.py): octopus-qjl b=2 0.5786 ->
# 0.4590, b=3 0.6393 -> 0.5220, b=4 0.7365 -> 0.6169 ms; octopus was no faster capped (0.3822 -> 0.3886 at
# b=3 under 96), nor at d=128 (0.9104 -> 0.9683 at 80; octopus-qjl 2.1507 -> 2.3790 at 168). The fused unit
# encode, whose key programs re-decide near ties inline and whose value programs share the launch, has its
# own best cap: octopus b=2 / 3 / 4 0.5175 / 0.5857 / 0.6999 -> 0.4175 / 0.5020 / 0.5970 ms under 112
# registers (keys and 2-bit values into a store, graph-timed), where encode_keys is no faster capped.
KEY_LAUNCH = {(64, False): (64, 4, None), (64, True): (64, 4, None), (128, False): (64, 8, 128),
              (128, True): (32, 4, None)}
KEY_LAUNCH_BITS = {(64, True, 7): (64, 4, 128), (64, True, 10): (64, 4, 128), (64, True, 13): (64, 4, 168)}
UNIT_CAPS = {(64, False, 7): 112, (64, False, 10): 112, (64, False, 13): 112}

KIND = register_kind(DecodeKind(
    "triplet", _triplet_tables, _triplet_attention_tables, queries, scores, constants=_triplet_constants,
    query_block=_triplet_query_block, halves=False, gathers=lambda kc: dir_table(kc) == DIR_FOLDED,
    encode=KindEncode(encode_codes, KEY_LAUNCH, constants=_encode_constants, tables=_encode_tables,
                      launch_bits=KEY_LAUNCH_BITS, unit_caps=UNIT_CAPS,
                      near_rows=NEAR_ROWS.value),
    score_tables=KindTables(_table_layout, _build_tables, sum_step, lambda kc: kc.table("centroids"), _capped,
                            what="a direction table")))
