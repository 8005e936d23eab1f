"""Per-codec @triton.jit decode helpers: tiles of compressed keys or values decoded in registers, by section.

A section per kind of key decode, named in the declaration of the codecs that use it (`kernel_decode`):
"scalar" (a centroid per rotated coordinate: turboquant-*), "polar" (recursive angles: polarquant) and
"triplet" (an octahedral direction and a norm per triplet: octopus*). A section is its DECODE id (the
kernels' tl.constexpr), its host-side record in SECTIONS (the tables it reads, what the attention kernel gets
from them, how it lays out the query) and its @triton.jit code: the query operands it scores with
(`*_queries`) and the scores of a tile of keys (`*_scores`), which `query_operands` and `key_scores` dispatch
to. Shared by the sections: the QJL side-car (`qjl_scores`). Values decode in value_decode.py.

A tile of keys is scored against the query rows in the rotated frame (formats.md): s = q_rot . (gamma u_hat)
[+ q_j . (gamma gamma_r sigma)], with the queries projected once per program (`query_operands`).
"""

import dataclasses
import math
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from .bits import cut_codes, load_words, row_codes, unpack_codes

SCALAR = tl.constexpr(0)
POLAR = tl.constexpr(1)
TRIPLET = tl.constexpr(2)
# triplet: folded rows (one 16-byte row a code: C_rho and the direction premultiplied) where the key codes
# have at most this many bits (2**n rows, 16 KiB at n = 10, octopus b=3; b=4 has n = 13), else the direction
# unfolded in registers from the xi centroids: folded rows beat the unfold at every AAR batch on the H200
FOLDED_MAX_BITS = 10
DIR_UNFOLD, DIR_FOLDED = 0, 2  # the triplet section's DIR_TABLE


# ---------------------------------------------------------------- host side of the sections


@dataclasses.dataclass(frozen=True)
class Section:
    """What the launchers know of a section: `id` (the kernels' DECODE); `tables(kc)`: the shapes of the
    tables it reads, by name; `attention_tables(kc)`: the two table pointers of the attention kernel;
    `constants(kc)`: its compile-time constants there (LP, B_DIR, B_RHO, DIR_TABLE); `query_block(kc, rot)`:
    the columns of the rotation block of the query map (rot [H, d, d] -> [H, d, NQ]); `halves`: at d >= 128
    its d-wide score dots run as two of d/2; `gathers(kc)`: query blocks load one code a gather, not word
    tiles; `score_tables`: one query row per KV head runs the score-table kernel (score_tables.py)."""

    id: int
    tables: Callable
    attention_tables: Callable
    constants: Callable
    query_block: Callable = lambda kc, rot: rot
    halves: bool = True
    gathers: Callable = lambda kc: False
    score_tables: bool = False


def _cached(kc, key: str, make):
    if key not in kc.__dict__:
        kc.__dict__[key] = make()
    return kc.__dict__[key]


def _plain_constants(kc) -> dict:
    return dict(LP=16, B_DIR=0, B_RHO=0, DIR_TABLE=dir_table(kc))


def _scalar_tables(kc) -> dict:
    n = kc.code_bits
    return {} if n == 0 else {"centroids": (2**n,), "boundaries": (2**n - 1,)}


def _scalar_attention_tables(kc) -> tuple[torch.Tensor, torch.Tensor]:
    cent = kc.tables.get("centroids", kc.rotation_signs)  # rotation_signs: never read (0 bits)
    return cent, cent


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
    tables' polar section reads both of an angle in one cache line), cached."""
    return _cached(kc, "_cos_sin_pairs",
                   lambda: torch.stack(_polar_attention_tables(kc), -1).reshape(-1).contiguous())


def _triplet_tables(kc) -> dict:
    b_dir, b_rho = kc.param("b_dir"), kc.param("b_rho")
    if b_dir < 1 or b_rho < 0 or kc.code_bits != 2 * b_dir + b_rho or kc.num_codes != -(-kc.head_dim // 3):
        raise ValueError(f"{kc.name or kc.decode}: triplet codes are ceil(d/3) codes of 2 b_dir + b_rho "
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


SECTIONS = {
    "scalar": Section(SCALAR.value, _scalar_tables, _scalar_attention_tables, _plain_constants,
                      score_tables=True),
    "polar": Section(POLAR.value, _polar_tables, _polar_attention_tables, _plain_constants,
                     score_tables=True),
    "triplet": Section(TRIPLET.value, _triplet_tables, _triplet_attention_tables, _triplet_constants,
                       _triplet_query_block, halves=False,
                       gathers=lambda kc: dir_table(kc) == DIR_FOLDED, score_tables=True),
}


# ---------------------------------------------------------------- shared: matmul operands


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
def turbo_unit(rows_ptr, row_ok, cent_ptr, D: tl.constexpr, N_BITS: tl.constexpr, N_WORDS: tl.constexpr,
               WP: tl.constexpr, TILE: tl.constexpr):
    """turboquant: u_hat [BN, D] = C_coord[code_j], one centroid lookup per coordinate."""
    codes = row_codes(rows_ptr, row_ok, tl.arange(0, D)[None, :], N_BITS, N_WORDS, WP, TILE)
    return tl.load(cent_ptr + codes)


@triton.jit
def _scalar_queries(q_pro, qmap, rot_scale, D: tl.constexpr, HALVES: tl.constexpr, USE_DOT: tl.constexpr,
                    PREC_Q: tl.constexpr, OPD: tl.constexpr, RNE_BY_HAND: tl.constexpr):
    """The rotated query R q as one operand [M, D], or (HALVES) its first and second halves."""
    if HALVES:
        hcol = tl.arange(0, D // 2)[None, :]
        qa = _project(q_pro, qmap, hcol, rot_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
        qb = _project(q_pro, qmap, hcol + D // 2, rot_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
    else:
        qa = _project(q_pro, qmap, tl.arange(0, D)[None, :], rot_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
        qb = qa
    return qa, qb


@triton.jit
def _scalar_scores(s, qa, qb, k_rows, n_ok, gamma, cent_ptr, D: tl.constexpr, K_BITS: tl.constexpr,
                   K_WORDS: tl.constexpr, K_WP: tl.constexpr, K_WP2: tl.constexpr, TILE: tl.constexpr,
                   HALVES: tl.constexpr, USE_DOT: tl.constexpr, PREC: tl.constexpr, OPD: tl.constexpr,
                   RNE_BY_HAND: tl.constexpr):
    """s + q_rot . (gamma u_hat), u_hat = C_coord[code] (no codes at 0 bits: s unchanged)."""
    if K_BITS > 0:
        if HALVES:  # half a key's codes is d/2 * K_BITS bits: whole words for d >= 64
            KW2: tl.constexpr = D * K_BITS // 64
            u = turbo_unit(k_rows, n_ok[:, None], cent_ptr, D // 2, K_BITS, KW2, K_WP2, TILE)
            s = _mm_nt(qa, _operand(u * gamma, OPD, RNE_BY_HAND), s, USE_DOT, PREC)
            u = turbo_unit(k_rows + KW2, n_ok[:, None], cent_ptr, D // 2, K_BITS, KW2, K_WP2, TILE)
            s = _mm_nt(qb, _operand(u * gamma, OPD, RNE_BY_HAND), s, USE_DOT, PREC)
        else:
            u = turbo_unit(k_rows, n_ok[:, None], cent_ptr, D, K_BITS, K_WORDS, K_WP, TILE)
            s = _mm_nt(qa, _operand(u * gamma, OPD, RNE_BY_HAND), s, USE_DOT, PREC)
    return s


# ---------------------------------------------------------------- section "polar" (polarquant)
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
def _polar_queries(q_pro, qmap, rot_scale, D: tl.constexpr, HALVES: tl.constexpr, USE_DOT: tl.constexpr,
                   PREC_Q: tl.constexpr, OPD: tl.constexpr, RNE_BY_HAND: tl.constexpr):
    """The rotated query R q as one operand [M, D], or (HALVES) its even and odd coordinates."""
    if HALVES:
        hcol = tl.arange(0, D // 2)[None, :]
        c0 = 2 * hcol
        qa = _project(q_pro, qmap, c0, rot_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
        qb = _project(q_pro, qmap, c0 + 1, rot_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
    else:
        qa = _project(q_pro, qmap, tl.arange(0, D)[None, :], rot_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
        qb = qa
    return qa, qb


@triton.jit
def _polar_scores(s, qa, qb, k_rows, n_ok, gamma, cos_ptr, sin_ptr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                  LOG2D: tl.constexpr, K_BITS: tl.constexpr, K_WORDS: tl.constexpr, K_WP: tl.constexpr,
                  TILE: tl.constexpr, HALVES: tl.constexpr, USE_DOT: tl.constexpr, PREC: tl.constexpr,
                  OPD: tl.constexpr, RNE_BY_HAND: tl.constexpr):
    """s + q_rot . (gamma u_hat), u_hat decoded top-down from the angle codes (HALVES: even | odd)."""
    if HALVES:
        ue, uo = polar_halves(k_rows, n_ok[:, None], cos_ptr, sin_ptr, BLOCK_N, D, LOG2D, K_BITS, K_WORDS,
                              K_WP, TILE)
        s = _mm_nt(qa, _operand(ue * gamma, OPD, RNE_BY_HAND), s, USE_DOT, PREC)
        s = _mm_nt(qb, _operand(uo * gamma, OPD, RNE_BY_HAND), s, USE_DOT, PREC)
    else:
        u = polar_unit(k_rows, n_ok[:, None], cos_ptr, sin_ptr, BLOCK_N, D, LOG2D, K_BITS, K_WORDS, K_WP,
                       TILE)
        s = _mm_nt(qa, _operand(u * gamma, OPD, RNE_BY_HAND), s, USE_DOT, PREC)
    return s


# ---------------------------------------------------------------- section "triplet" (octopus*)
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
def _triplet_queries(q_pro, qmap, rot_scale, LP: tl.constexpr, USE_DOT: tl.constexpr, PREC_Q: tl.constexpr,
                     OPD: tl.constexpr, RNE_BY_HAND: tl.constexpr):
    """The triplet components of R q, x | y | z, as three operands [M, LP] (zero past d)."""
    lcol = tl.arange(0, LP)[None, :]
    qx = _project(q_pro, qmap, lcol, rot_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
    qy = _project(q_pro, qmap, LP + lcol, rot_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
    qz = _project(q_pro, qmap, 2 * LP + lcol, rot_scale, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
    return qx, qy, qz


@triton.jit
def _triplet_scores(s, qx, qy, qz, k_rows, n_ok, gamma, tab_ptr, rho_ptr, LP: tl.constexpr,
                    K_CODES: tl.constexpr, K_BITS: tl.constexpr, B_DIR: tl.constexpr, B_RHO: tl.constexpr,
                    DIR_TABLE: tl.constexpr, K_WORDS: tl.constexpr, K_WP: tl.constexpr, TILE: tl.constexpr,
                    USE_DOT: tl.constexpr, PREC: tl.constexpr, OPD: tl.constexpr, RNE_BY_HAND: tl.constexpr):
    """s + sum over components of q_c . (gamma C_rho n_hat)_c: three LP-deep dots."""
    kx, ky, kz = octopus_triplets(k_rows, n_ok[:, None], gamma, tab_ptr, rho_ptr, LP, K_CODES, K_BITS, B_DIR,
                                  B_RHO, DIR_TABLE, K_WORDS, K_WP, TILE)
    s = _mm_nt(qx, _operand(kx, OPD, RNE_BY_HAND), s, USE_DOT, PREC)
    s = _mm_nt(qy, _operand(ky, OPD, RNE_BY_HAND), s, USE_DOT, PREC)
    s = _mm_nt(qz, _operand(kz, OPD, RNE_BY_HAND), s, USE_DOT, PREC)
    return s


# ---------------------------------------------------------------- dispatch on the section
@triton.jit
def query_operands(q_pro, qmap, qn, rot_scale, DECODE: tl.constexpr, D: tl.constexpr, LP: tl.constexpr,
                   HALVES: tl.constexpr, USE_DOT: tl.constexpr, PREC_Q: tl.constexpr, OPD: tl.constexpr,
                   RNE_BY_HAND: tl.constexpr):
    """The section's query operands (qa, qb, qc) from the query rows q_pro [M, D] and the head's map rows
    (times rot_scale); operands a section does not use are `qn` (never read)."""
    qc = qn
    if DECODE == TRIPLET:
        qa, qb, qc = _triplet_queries(q_pro, qmap, rot_scale, LP, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
    elif DECODE == POLAR:
        qa, qb = _polar_queries(q_pro, qmap, rot_scale, D, HALVES, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
    else:
        qa, qb = _scalar_queries(q_pro, qmap, rot_scale, D, HALVES, USE_DOT, PREC_Q, OPD, RNE_BY_HAND)
    return qa, qb, qc


@triton.jit
def key_scores(s, qa, qb, qc, k_rows, n_ok, gamma, tab_a_ptr, tab_b_ptr, DECODE: tl.constexpr,
               BLOCK_N: tl.constexpr, D: tl.constexpr, LP: tl.constexpr, LOG2D: tl.constexpr,
               K_BITS: tl.constexpr, K_CODES: tl.constexpr, K_WORDS: tl.constexpr, B_DIR: tl.constexpr,
               B_RHO: tl.constexpr, DIR_TABLE: tl.constexpr, K_WP: tl.constexpr, K_WP2: tl.constexpr,
               TILE: tl.constexpr, HALVES: tl.constexpr, USE_DOT: tl.constexpr, PREC: tl.constexpr,
               OPD: tl.constexpr, RNE_BY_HAND: tl.constexpr):
    """s [M, BLOCK_N] plus the scores of a tile of keys (rows k_rows [BLOCK_N, 1] of code words, norms gamma
    [BLOCK_N, 1], keys where n_ok) against the section's query operands; tab_a / tab_b: its attention
    tables (Section.attention_tables)."""
    if DECODE == TRIPLET:
        s = _triplet_scores(s, qa, qb, qc, k_rows, n_ok, gamma, tab_a_ptr, tab_b_ptr, LP, K_CODES, K_BITS,
                            B_DIR, B_RHO, DIR_TABLE, K_WORDS, K_WP, TILE, USE_DOT, PREC, OPD, RNE_BY_HAND)
    elif DECODE == POLAR:
        s = _polar_scores(s, qa, qb, k_rows, n_ok, gamma, tab_a_ptr, tab_b_ptr, BLOCK_N, D, LOG2D, K_BITS,
                          K_WORDS, K_WP, TILE, HALVES, USE_DOT, PREC, OPD, RNE_BY_HAND)
    else:
        s = _scalar_scores(s, qa, qb, k_rows, n_ok, gamma, tab_a_ptr, D, K_BITS, K_WORDS, K_WP, K_WP2, TILE,
                           HALVES, USE_DOT, PREC, OPD, RNE_BY_HAND)
    return s


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
        s = _mm_nt(qj, _operand(sigma * (gamma * g_r), OPD, RNE_BY_HAND), s, USE_DOT, PREC)
        sigma = qjl_signs(s_rows + SW2, n_ok[:, None], D // 2, SW2, SW2, TILE)
        s = _mm_nt(qj2, _operand(sigma * (gamma * g_r), OPD, RNE_BY_HAND), s, USE_DOT, PREC)
    else:
        sigma = qjl_signs(s_rows, n_ok[:, None], D, s_words, S_WP, TILE)
        s = _mm_nt(qj, _operand(sigma * (gamma * g_r), OPD, RNE_BY_HAND), s, USE_DOT, PREC)
    return s
