"""Building blocks of the one-row score-table attention (impls/score_tables.py) shared by the decode kinds:
the layout of a kind's table codes (`TableLayout`), what a table-building program starts from (the rotated
query row, `table_program`), and the attention loop's reads of a step of keys (code words, norms) with the
generic score step `sum_step`: one table entry a code, summed (the scalar and triplet kinds).

A score table turns a key's decode into lookups (asymmetric distance computation, as in product
quantization): the score of key n is a sum of terms that each depend on one table code of the key, so a
table T[i, e] built once per query row gives each term in one lookup (impls/score_tables.py says more).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from .bits import masked_load

# the scalar kind: a table code holds the most coordinates whose codes fit in this many bits (64 entries a
# group, 256 bytes: two cache lines a lookup; a group of one coordinate from 4 bits a code on); the polar
# kind the most bottom levels whose 2^G - 1 angle codes fit in it (G = 2 up to 2 bits an angle, else 1)
SCALAR_GROUP_BITS = 6

TABLE_CODES_A_PROGRAM = 16


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


@triton.jit
def rotated_query(qs, had_ptr, k, col, D: tl.constexpr):
    """q_rot[col] for the columns col [N] (zero where col >= d): H_d qs with qs = s_h * q / sqrt(d) [D]."""
    hk = tl.load(had_ptr + k[:, None] * D + col[None, :], mask=(col < D)[None, :], other=0.0)
    return tl.sum(qs[:, None] * hk, axis=0)


@triton.jit
def table_program(q_ptr, rs_ptr, H, inv_sqrt_d, D: tl.constexpr, L: tl.constexpr, TP: tl.constexpr):
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
def _cut(w_cur, w_next, SH: tl.constexpr, N_BITS: tl.constexpr):
    """The N_BITS-bit code starting at bit SH of w_cur (continuing into w_next when it straddles), int32."""
    if SH + N_BITS <= 32:
        c = (w_cur >> SH) & ((1 << N_BITS) - 1)
    else:
        c = ((w_cur >> SH) | (w_next << (32 - SH))) & ((1 << N_BITS) - 1)
    return c.to(tl.int32, bitcast=True)


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
    a step first (PAIRS: two words a load), the xor for the gate of its table reads (sum_step)."""
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
def sum_step(row_lut, qlut_ptr, rho_ptr, kc_ptr, kg_ptr, ks_ptr, kr_ptr, s_ptr, r, n0, end, qjl_coef, zero,
             m_vec, rho0, rho1, D: tl.constexpr, L: tl.constexpr, K_BITS: tl.constexpr, K_WORDS: tl.constexpr,
             B_RHO: tl.constexpr, N_ENTRIES: tl.constexpr, FOLD_RHO: tl.constexpr, HAS_QJL: tl.constexpr,
             BLOCK_K: tl.constexpr, PAIRS: tl.constexpr, LEVELS: tl.constexpr, A_BITS: tl.constexpr,
             LOG2D: tl.constexpr, MASKED: tl.constexpr):
    """One step of the score phase (impls/score_tables._store_scores) for a kind whose table codes are its
    codes (K_BITS bits each, side by side from bit 0: the scalar and triplet kinds): keys [n0, n0 + BLOCK_K),
    those from `end` on masked off when MASKED; their scores (log2 units) stored at s_ptr, the running
    maximum returned. One table entry a code from row_lut (FOLD_RHO: C_rho folded in; else times C_rho of
    the code's low B_RHO bits, rho0 / rho1 when B_RHO is 1), one entry a sign byte from the QJL table at
    qlut_ptr (HAS_QJL). The signature every kind's score step has (LEVELS, A_BITS, LOG2D: the polar kind's).

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


def build_tables(q: torch.Tensor, codec, lay: TableLayout, h: int,
                 qk_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The score tables of the query rows q [..., d] (contiguous; row r is of KV head r % h), fp32:
    (lut [rows, lay.codes, lay.entries], qlut [rows, d/8, 256], or lut itself without the QJL side-car),
    written by the codec's kind (`KindTables.build`): one launch, a program per (row, TABLE_CODES_A_PROGRAM
    table codes)."""
    d = q.shape[-1]
    rows = q.numel() // d
    dev = q.device
    lut = torch.empty(rows, lay.codes, lay.entries, device=dev, dtype=torch.float32)
    qlut = torch.empty(rows, d // 8, 256, device=dev, dtype=torch.float32) if codec.has_qjl else lut
    codec.kind.score_tables.build(q, codec, lay, h, qk_scale, lut, qlut)
    return lut, qlut


def table_grid(q: torch.Tensor, lay: TableLayout) -> tuple[int, int]:
    """The grid of a table-building launch: a program per (query row, TABLE_CODES_A_PROGRAM table codes)."""
    return q.numel() // q.shape[-1], -(-lay.codes // TABLE_CODES_A_PROGRAM)


def table_options(codec, lay: TableLayout) -> dict:
    """The compile-time arguments and launch options every kind's table kernel takes."""
    return dict(D=codec.head_dim, L=lay.codes, N_ENTRIES=lay.entries, CHUNK=min(lay.entries, 128),
                HAS_QJL=codec.has_qjl, TP=TABLE_CODES_A_PROGRAM, num_warps=4)
