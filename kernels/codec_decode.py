"""Per-codec @triton.jit decode helpers: a tile of BLOCK_N compressed keys or values, decoded in registers.

A section per kind of key decode, each named by the codecs that use it (`kernel_decode` in their declaration):
"scalar" (a centroid per coordinate: turboquant-*), "polar" (recursive angles: polarquant), "triplet" (an
octahedral direction and a norm per triplet: octopus*). A section has an id (the kernels' tl.constexpr
DECODE) and the tables it reads (SECTION_TABLES: their shapes for a KernelCodec).
"""

import math

import triton
import triton.language as tl

from .bits import cut_codes, load_words, unpack_codes

SCALAR = tl.constexpr(0)
POLAR = tl.constexpr(1)
TRIPLET = tl.constexpr(2)


def _scalar_tables(kc) -> dict:
    n = kc.code_bits
    return {} if n == 0 else {"centroids": (2**n,), "boundaries": (2**n - 1,)}


def _polar_tables(kc) -> dict:
    levels, n = int(math.log2(kc.head_dim)), kc.code_bits
    return {"centroids": (levels, 2**n), "boundaries": (levels, 2**n - 1)}


def _triplet_tables(kc) -> dict:
    b_dir, b_rho = kc.param("b_dir"), kc.param("b_rho")
    if b_dir < 1 or b_rho < 0 or kc.code_bits != 2 * b_dir + b_rho or kc.num_codes != -(-kc.head_dim // 3):
        raise ValueError(f"{kc.name or kc.decode}: triplet codes are ceil(d/3) codes of 2 b_dir + b_rho "
                         f"bits (b_dir >= 1), got {kc.num_codes} of {kc.code_bits} bits, b_dir {b_dir}, "
                         f"b_rho {b_rho}")
    return {"directions": (4**b_dir, 3), "xi_boundaries": (2**b_dir - 1,), "xi_centroids": (2**b_dir,),
            "centroids": (2**b_rho,), "boundaries": (2**b_rho - 1,)}


# section name -> (its DECODE id, the shapes of the tables it reads for a KernelCodec)
SECTION_IDS = {"scalar": SCALAR.value, "polar": POLAR.value, "triplet": TRIPLET.value}
SECTION_TABLES = {"scalar": _scalar_tables, "polar": _polar_tables, "triplet": _triplet_tables}


@triton.jit
def _codes(rows_ptr, row_ok, j, N_BITS: tl.constexpr, N_WORDS: tl.constexpr, WP: tl.constexpr,
           TILE: tl.constexpr):
    """Codes j [1, S] of each row: from one contiguous word tile cut in registers (TILE), or one gathered load
    per code."""
    if TILE:
        return cut_codes(load_words(rows_ptr, row_ok, N_WORDS, WP), j, N_BITS)
    else:
        return unpack_codes(rows_ptr, j, row_ok, N_BITS)


@triton.jit
def turbo_unit(rows_ptr, row_ok, cent_ptr, D: tl.constexpr, N_BITS: tl.constexpr, N_WORDS: tl.constexpr,
               WP: tl.constexpr, TILE: tl.constexpr):
    """turboquant: u_hat [BN, D] = C_coord[code_j], one centroid lookup per coordinate."""
    codes = _codes(rows_ptr, row_ok, tl.arange(0, D)[None, :], N_BITS, N_WORDS, WP, TILE)
    return tl.load(cent_ptr + codes)


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
def octopus_triplets(rows_ptr, row_ok, gain, tab_ptr, rho_ptr, LP: tl.constexpr, L: tl.constexpr,
                     N_BITS: tl.constexpr, B_DIR: tl.constexpr, B_RHO: tl.constexpr, DIR_TABLE: tl.constexpr,
                     N_WORDS: tl.constexpr, WP: tl.constexpr, TILE: tl.constexpr):
    """octopus: the triplets gain * t_hat = gain * C_rho[i_rho] * n_hat as three component tiles [BN, LP]
    (x, y, z); `gain` [BN, 1] is the key's norm gamma, folded into the one scale each lane already needs.

    DIR_TABLE 2: the whole triplet is one 16-byte row of the folded table at tab_ptr (spec.folded_directions:
    C_rho and D premultiplied, one row a code), one vector load a triplet and no C_rho lookup.
    0: n_hat is unfolded in registers from the xi centroids at tab_ptr (two lookups into a table of
    2^b_dir floats, then the octahedral unfold and a reciprocal square root), which touches far fewer cache
    lines than a lookup into the decoded-direction table D [4^b_dir, 3]. Padded triplets (>= L) read code 0
    and meet zero query columns.
    """
    i = tl.arange(0, LP)[None, :]
    live = row_ok & (i < L)
    codes = tl.where(live, _codes(rows_ptr, row_ok if TILE else live, i, N_BITS, N_WORDS, WP, TILE), 0)
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
def qjl_signs(rows_ptr, row_ok, D: tl.constexpr, N_WORDS: tl.constexpr, WP: tl.constexpr, TILE: tl.constexpr):
    """QJL: sigma [BN, D] as +-1.0 (stored bit 1 for +1)."""
    bits = _codes(rows_ptr, row_ok, tl.arange(0, D)[None, :], 1, N_WORDS, WP, TILE)
    return bits.to(tl.float32) * 2.0 - 1.0


@triton.jit
def value_tile(codes_ptr, scale_ptr, min_ptr, rows, row_ok, BN: tl.constexpr, D: tl.constexpr,
               GROUP: tl.constexpr, N_BITS: tl.constexpr, N_WORDS: tl.constexpr, WP: tl.constexpr,
               TILE: tl.constexpr):
    """Group dequantization: v_hat [BN, D] = code * scale + minimum, per group of GROUP channels."""
    G: tl.constexpr = D // GROUP
    j = tl.arange(0, D)[None, :]
    codes = _codes(codes_ptr + rows[:, None] * N_WORDS, row_ok[:, None], j, N_BITS, N_WORDS, WP, TILE)
    codes = codes.to(tl.float32)
    gcol = rows[:, None] * G + tl.arange(0, G)[None, :]
    sc = tl.load(scale_ptr + gcol, mask=row_ok[:, None], other=0.0).to(tl.float32)
    mn = tl.load(min_ptr + gcol, mask=row_ok[:, None], other=0.0).to(tl.float32)
    v = tl.reshape(codes, (BN, G, GROUP)) * sc[:, :, None] + mn[:, :, None]
    return tl.reshape(v, (BN, D))
