"""The triplet decode kind's key encode (@triton.jit): octahedral seeds and local3x3 joint rounding of the
rotated key's triplets, their codes packed, and for octopus-qjl the QJL residual; `encode_codes` is the helper
the key kernel calls (kinds/triplet.py registers it, kinds/triplet_search.py builds the tables it searches).

The reference (octopus_audio/octahedral.py) keeps the candidate of least cost rho^2 - 2 c(s) s + c(s)^2 among
the seed's 3x3 neighbours (DESIGN section 2); `_octopus_search` finds it from precomputed candidate lists
and `_octopus_exact` redoes a choice in the reference's own arithmetic where the two may differ.
"""

import triton
import triton.language as tl

from ..bits import pack_codes, pack_tile
from ..encode_math import (
    _dot_pm1,
    _index,
    _rcp,
    _region,
    _rotate,
    _table,
    _table_row,
    unit_coords,
)

NEAR = tl.constexpr(4e-7)  # `_octopus_tile`: scores this close (relative) are re-decided the reference's way


NEAR_ROWS = tl.constexpr(16)  # encode_keys re-decides near ties in groups of this many rows


@triton.jit
def _octopus_search(tx, ty, tz, lut_ptr, cand_ptr, B_DIR: tl.constexpr, SEARCH_K: tl.constexpr,
                    LUT_SCALE: tl.constexpr, HALF: tl.constexpr, WANT_DIR: tl.constexpr, ASM: tl.constexpr):
    """local3x3 joint rounding of triplets t = (tx, ty, tz) [BT, LP] -> (flat direction index of the winner,
    its score s = t.n_hat (0 for a zero triplet), the best and runner-up scores of the search, the seeds
    i_xi, i_eta, and with WANT_DIR the winner's direction (else placeholders)).

    The reference keeps the candidate of least cost rho^2 - 2 c(s) s + c(s)^2 with c(s) the rho centroid
    nearest s. That is rho^2 + min_k (c_k^2 - 2 c_k s), strictly decreasing in s as every c_k > 0 (the rho
    codebook lies in (0, 1]), so the least cost is the largest s: no rho search per candidate. The seeds come
    from t / ||t||_1 (one approximate reciprocal; they differ from the reference's by float rounding only) as
    regions of the lookup table; the region's row of the candidate table (triplet_search: the flat indices of
    the seed's 3x3 candidates that can win there, increasing, padded with M*M) gives SEARCH_K directions, one
    vector load each from the direction rows (row M*M NaN), scored in the reference's own arithmetic
    (t_x n_x + t_y n_y) + t_z n_z (bit-equal scores); a tie keeps the first: the reference's lowest-index
    rule. A zero triplet searches as (0, 0, 1), the reference's placeholder direction: the first of the four
    tied directions around the pole, its seeds. The table layout (F-bit fields, words a row, where the
    direction rows start) is triplet_search's field_bits / row_words / dir_offset, computed here from the same
    constants."""
    M2: tl.constexpr = 1 << (2 * B_DIR)
    F: tl.constexpr = 8 if M2 < 255 else 16 if M2 < 65535 else 32
    RW: tl.constexpr = (SEARCH_K * F + 31) // 32
    R: tl.constexpr = (1 << B_DIR) << HALF
    DIR_OFF: tl.constexpr = (R * R * RW + 3) // 4 * 4
    l1 = (tl.abs(tx) + tl.abs(ty)) + tl.abs(tz)
    zero = l1 == 0
    tzs = tl.where(zero, 1.0, tz)
    inv = _rcp(tl.where(zero, 1.0, l1), ASM)  # approximate: it places the seeds only
    px = tx * inv
    py = ty * inv
    lower = tzs < 0
    xi = tl.where(lower, tl.where(px < 0, tl.abs(py) - 1.0, 1.0 - tl.abs(py)), px)
    eta = tl.where(lower, tl.where(py < 0, tl.abs(px) - 1.0, 1.0 - tl.abs(px)), py)
    r_xi = _region(xi, lut_ptr, LUT_SCALE, ASM)
    r_eta = _region(eta, lut_ptr, LUT_SCALE, ASM)
    region = r_xi * R + r_eta
    if RW == 2:
        w0, w1 = _table_row(cand_ptr, region, 2, ASM)
        word = w0.to(tl.int32, bitcast=True)
        word1 = w1.to(tl.int32, bitcast=True)
    else:
        word = _table_row(cand_ptr, region * RW, 1, ASM).to(tl.int32, bitcast=True)
        word1 = word
    best = tl.full(tx.shape, float("-inf"), tl.float32)
    second = tl.full(tx.shape, float("-inf"), tl.float32)
    flat = tl.zeros(tx.shape, tl.int32)
    for k in tl.static_range(SEARCH_K):
        if (F * k) % 32 == 0 and k > 0:  # the next word of the row
            if RW == 2:
                word = word1
            else:
                word = _table_row(cand_ptr, region * RW + (F * k) // 32, 1, ASM).to(tl.int32, bitcast=True)
        if F == 32:
            f_k = word
        else:
            f_k = (word >> ((F * k) % 32)) & ((1 << F) - 1)
        nx, ny, nz, _ = _table_row(cand_ptr + DIR_OFF, f_k, 4, ASM)
        s = (tx * nx + ty * ny) + tzs * nz
        if k == 0:  # candidate 0 is never padding: it opens the best, the runner-up stays -inf
            best = s
            flat = f_k
        else:
            flat = tl.where(s > best, f_k, flat)
            # the runner-up: the median of (best, second, s), which ignores a NaN s (max and min drop NaN)
            second = tl.minimum(best, tl.maximum(second, s))
            best = tl.maximum(best, s)
    if WANT_DIR:
        ddx, ddy, ddz, _ = _table_row(cand_ptr + DIR_OFF, flat, 4, ASM)
    else:
        ddx = best
        ddy = best
        ddz = best
    return flat, tl.where(zero, 0.0, best), best, second, r_xi >> HALF, r_eta >> HALF, ddx, ddy, ddz


@triton.jit
def _octopus_exact(tx, ty, tz, i_xi, i_eta, dir_ptr, bnd_ptr, cent_ptr, B_DIR: tl.constexpr,
                   B_RHO: tl.constexpr, ASM: tl.constexpr):
    """The reference's local3x3 in its own arithmetic -> the flat direction index: per candidate (increasing
    flat index) its direction from the table, s = t.n_hat, the rho index of s, cost (rho^2 - 2 c s) + c^2;
    the least cost, the first on a tie."""
    M: tl.constexpr = 1 << B_DIR
    rho2 = (tx * tx + ty * ty) + tz * tz
    best = tl.full(tx.shape, float("inf"), tl.float32)
    flat = tl.zeros(tx.shape, tl.int32)
    for dx in tl.static_range(3):
        cx = tl.minimum(tl.maximum(i_xi + (dx - 1), 0), M - 1) * M
        for dy in tl.static_range(3):
            f = cx + tl.minimum(tl.maximum(i_eta + (dy - 1), 0), M - 1)
            s = (tx * _table(dir_ptr + f, ASM) + ty * _table(dir_ptr + M * M + f, ASM)) \
                + tz * _table(dir_ptr + 2 * M * M + f, ASM)
            rh = _table(cent_ptr + _index(s, bnd_ptr, B_RHO, ASM), ASM)
            cost = (rho2 - 2.0 * rh * s) + rh * rh
            better = cost < best
            best = tl.where(better, cost, best)
            flat = tl.where(better, f, flat)
    return flat


@triton.jit
def _octopus_tile(tx, ty, tz, valid, lut_ptr, cand_ptr, dir_ptr, bnd_ptr, cent_ptr, B_DIR: tl.constexpr,
                  B_RHO: tl.constexpr, SEARCH_K: tl.constexpr, LUT_SCALE: tl.constexpr, HALF: tl.constexpr,
                  RHO_SCALE: tl.constexpr, WANT_DIR: tl.constexpr, EXACT: tl.constexpr, ASM: tl.constexpr):
    """Codes ((i_xi << b_dir | i_eta) << b_rho | i_rho) of a tile of triplets (0 where not `valid`), the rho
    indices and (WANT_DIR) the chosen directions from the table: `_octopus_search`, then the rho index of the
    winner's score (the reference's own). Its scores are the reference's bit for bit, but the reference
    ranks them by a rounded cost: where the search's two best distinct scores lie within NEAR (relative) of
    each other, the rounding may order them unlike the scores (as may an exact tie off the symmetry
    planes): EXACT 0, a program holding such a triplet reruns every triplet's choice in the reference's
    arithmetic (`_octopus_exact`; rare); 1, the choice stays the search's and the last value returned says
    whether the tile holds one (a second launch with EXACT 2 redoes such programs); 2, every choice in the
    reference's arithmetic. A zero triplet (rho = 0; tested as |tx| + |ty| + |tz| = 0, which differs from
    the reference's sum of squares only where those underflow, |t| < 4e-23) keeps the placeholder
    direction's seeds and the rho index of s = 0."""
    M: tl.constexpr = 1 << B_DIR
    flat, s, best, second, i_xi, i_eta, ddx, ddy, ddz = _octopus_search(
        tx, ty, tz, lut_ptr, cand_ptr, B_DIR, SEARCH_K, LUT_SCALE, HALF, WANT_DIR, ASM)
    # exact mirror images score alike in both arithmetics (t on a symmetry plane: tx or ty 0, |tx| = |ty|);
    # any other pair of scores within NEAR may be ordered unlike the reference's
    sym = (tx == 0) | (ty == 0) | (tl.abs(tx) == tl.abs(ty))
    near = tl.max((valid & ~sym & (best - second <= NEAR * tl.abs(best))).to(tl.int32), 1)  # per row
    if (EXACT == 2) or ((EXACT == 0) and (tl.max(near, 0) > 0)):
        zero = (tl.abs(tx) + tl.abs(ty)) + tl.abs(tz) == 0
        flat = _octopus_exact(tx, ty, tz, i_xi, i_eta, dir_ptr, bnd_ptr, cent_ptr, B_DIR, B_RHO, ASM)
        flat = tl.where(zero, i_xi * M + i_eta, flat)
        ddx = _table(dir_ptr + flat, ASM)
        ddy = _table(dir_ptr + M * M + flat, ASM)
        ddz = _table(dir_ptr + 2 * M * M + flat, ASM)
        s = (tx * ddx + ty * ddy) + tz * ddz
    if RHO_SCALE > 0:  # |s| <= ||u|| = 1
        i_rho = _region(s, lut_ptr + 2 * (2 * LUT_SCALE + 1), RHO_SCALE, ASM)
    else:
        i_rho = _index(s, bnd_ptr, B_RHO, ASM)
    return tl.where(valid, (flat << B_RHO) | i_rho, 0), i_rho, ddx, ddy, ddz, near


@triton.jit
def _octopus_residual(tx, ty, tz, i_rho, ddx, ddy, ddz, cent_ptr, coord, D: tl.constexpr, ASM: tl.constexpr):
    """r = t - C_rho[i_rho] * direction per component, 0 for coordinates coord + c >= D (u's zero padding
    is not part of the residual)."""
    rh = _table(cent_ptr + i_rho, ASM)
    rx = tl.where(coord < D, tx - rh * ddx, 0.0)
    ry = tl.where(coord + 1 < D, ty - rh * ddy, 0.0)
    rz = tl.where(coord + 2 < D, tz - rh * ddz, 0.0)
    return rx, ry, rz


@triton.jit
def _tile(tx, ty, tz, valid, xib_ptr, aux_ptr, dir_ptr, bnd_ptr, cent_ptr, K):
    """`_octopus_tile` with the kernel's constants K (the chosen directions for -qjl's residual only)."""
    return _octopus_tile(tx, ty, tz, valid, xib_ptr, aux_ptr, dir_ptr, bnd_ptr, cent_ptr, K.B_DIR, K.B_RHO,
                         K.SEARCH_K, K.LUT_SCALE, K.HALF, K.RHO_SCALE, K.HAS_QJL, K.EXACT, K.SPLIT)


@triton.jit
def _live_quarters(x):
    """x [BT, W] -> (columns [0, W/2), columns [W/2, 3W/4)): splits of the tile that move no data where its
    column bits W/2 and W/4 are register bits of the rotation's accumulator layout (W >= 32 in the wgmma
    layout; at W = 16 one of them is a lane bit and Triton converts layouts through shared memory)."""
    BT: tl.constexpr = x.shape[0]
    W: tl.constexpr = x.shape[1]
    a, b = tl.split(tl.permute(tl.reshape(x, (BT, 2, W // 2)), (0, 2, 1)))
    b0, _ = tl.split(tl.permute(tl.reshape(b, (BT, 2, W // 4)), (0, 2, 1)))
    return a, b0


@triton.jit
def _from_quarters(a, b0):
    """The inverse of `_live_quarters`: [BT, W/2] and [BT, W/4] -> [BT, W], zeros in the last quarter."""
    BT: tl.constexpr = a.shape[0]
    W: tl.constexpr = 2 * a.shape[1]
    b = tl.reshape(tl.permute(tl.join(b0, tl.zeros_like(b0)), (0, 2, 1)), (BT, W // 2))
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), (BT, W))


@triton.jit
def _octopus_words(xsg, hadt_ptr, J0: tl.constexpr, W: tl.constexpr, gmax, inv_g, inv_sqrt_d, hoff, qs_ptr,
                   xib_ptr, aux_ptr, dir_ptr, bnd_ptr, cent_ptr, K):
    """Triplets [J0, J0 + W) of the rows xsg [BT, D] (the keys times their signs): their coordinates from
    three dots with the triplet Hadamard columns (`hadt_ptr` [3, D, LP]), their codes packed into words at
    code J0 (zero elsewhere; with the words' stream numbers, `_pack`: a tile short of the row packs into
    [BT, WP] in order), for -qjl the partial R' r [BT, D] and ||r||^2 [BT] of these triplets (zeros
    otherwise), and `_octopus_tile`'s near-tie flags per row."""
    BT: tl.constexpr = xsg.shape[0]
    hrow = tl.arange(0, K.D)[:, None]
    lcol = tl.arange(0, W)[None, :]
    cols = hrow * K.LP + J0 + lcol
    tx = unit_coords(_rotate(xsg, tl.load(hadt_ptr + cols), K.DOT_NATIVE, K.SPLIT), gmax, inv_g, inv_sqrt_d,
                     K.LOG2D)
    ty = unit_coords(_rotate(xsg, tl.load(hadt_ptr + K.D * K.LP + cols), K.DOT_NATIVE, K.SPLIT), gmax, inv_g,
                     inv_sqrt_d, K.LOG2D)
    tz = unit_coords(_rotate(xsg, tl.load(hadt_ptr + 2 * K.D * K.LP + cols), K.DOT_NATIVE, K.SPLIT), gmax,
                     inv_g, inv_sqrt_d, K.LOG2D)
    j = J0 + lcol
    if (not K.HAS_QJL) and (W >= 32) and (4 * (K.K_CODES - J0) <= 3 * W):
        # the search on the first three quarters of the columns only (octopus d=64: 22 triplets on 24
        # columns of 32): register-level pieces of the tile, the last quarter never searched
        txa, txb = _live_quarters(tx)
        tya, tyb = _live_quarters(ty)
        tza, tzb = _live_quarters(tz)
        ja, jb = _live_quarters(j + tl.zeros(tx.shape, tl.int32))
        code_a, _, _, _, _, near_a = _tile(txa, tya, tza, ja < K.K_CODES, xib_ptr, aux_ptr, dir_ptr, bnd_ptr,
                                           cent_ptr, K)
        code_b, _, _, _, _, near_b = _tile(txb, tyb, tzb, jb < K.K_CODES, xib_ptr, aux_ptr, dir_ptr, bnd_ptr,
                                           cent_ptr, K)
        code = _from_quarters(code_a, code_b)
        near = tl.maximum(near_a, near_b)
        i_rho = code  # placeholders: the residual below is -qjl's only
        ddx = tx
        ddy = tx
        ddz = tx
    else:
        code, i_rho, ddx, ddy, ddz, near = _tile(tx, ty, tz, j < K.K_CODES, xib_ptr, aux_ptr, dir_ptr,
                                                 bnd_ptr, cent_ptr, K)
    if J0 == 0 and W >= K.K_CODES:
        words, wmap = pack_tile(code, K.K_CODES, K.K_BITS, K.WP, K.KP)
    else:
        N_CODES: tl.constexpr = W if W < K.K_CODES - J0 else K.K_CODES - J0
        words = pack_codes(code, J0, N_CODES, K.K_BITS, K.WP, K.KP)
        wmap = tl.arange(0, K.WP)[None, :]
    acc = tl.zeros((BT, K.D), tl.float32)
    res2 = tl.zeros((BT,), tl.float32)
    if K.HAS_QJL:
        rx, ry, rz = _octopus_residual(tx, ty, tz, i_rho, ddx, ddy, ddz, cent_ptr, 3 * j, K.D, K.SPLIT)
        res2 = tl.sum((rx * rx + ry * ry) + rz * rz, 1)
        dcol = tl.arange(0, K.D)[None, :]
        jr = J0 + tl.arange(0, W)[:, None]
        # R' r from the triplet layout: sum over components c of (r_c * s'_c) @ H[3j + c, :]
        for comp in tl.static_range(3):
            if comp == 0:
                rc = rx
            elif comp == 1:
                rc = ry
            else:
                rc = rz
            jc = 3 * j + comp
            qsg = tl.where(jc < K.D, _table(qs_ptr + hoff + tl.minimum(jc, K.D - 1), K.SPLIT), 0.0)
            ht = tl.load(hadt_ptr + (comp * K.D + dcol) * K.LP + jr).to(tl.float32)  # [W, D]: H[3j + comp, :]
            acc += _dot_pm1(rc * qsg, ht, K.SPLIT)
    return words, wmap, acc, res2, near


@triton.jit
def encode_codes(xsg, rscale, gmax, inv_g, inv_sqrt_d, hoff, pid, near_ptr, had_ptr, hadt_ptr, qs_ptr,
                 cent_ptr, bnd_ptr, xib_ptr, aux_ptr, dir_ptr, K):
    """The kind's key encode (scalar.encode_codes' signature): the triplet coordinates straight out of three
    matmuls with the Hadamard columns 3j, 3j+1, 3j+2 (`hadt_ptr` [3, D, LP]), their codes and QJL terms
    (`_octopus_words`: the seeds' region lookup at xib_ptr, the candidate and direction rows at aux_ptr, the
    direction table [3, 4^b_dir] at dir_ptr for near ties); with EXACT 1 the near-tie flags of the block's
    groups of NEAR_ROWS rows go to near_ptr[pid * BT / NEAR_ROWS + g]."""
    if K.D >= 128:
        # two tiles: triplets [0, D/4) and [D/4, 3D/8) (the last ceil(D/12) of them used), 3D/8 lanes
        # instead of the D/2 of one power-of-two tile
        words, wmap, proj, res2, near = _octopus_words(
            xsg, hadt_ptr, 0, K.D // 4, gmax, inv_g, inv_sqrt_d, hoff, qs_ptr, xib_ptr, aux_ptr, dir_ptr,
            bnd_ptr, cent_ptr, K)
        words_b, _, proj_b, res2_b, near_b = _octopus_words(
            xsg, hadt_ptr, K.D // 4, K.D // 8, gmax, inv_g, inv_sqrt_d, hoff, qs_ptr, xib_ptr, aux_ptr,
            dir_ptr, bnd_ptr, cent_ptr, K)
        words = words | words_b
        proj += proj_b
        res2 += res2_b
        near = tl.maximum(near, near_b)
    else:
        words, wmap, proj, res2, near = _octopus_words(
            xsg, hadt_ptr, 0, K.LP, gmax, inv_g, inv_sqrt_d, hoff, qs_ptr, xib_ptr, aux_ptr, dir_ptr, bnd_ptr,
            cent_ptr, K)
    if K.EXACT == 1:
        BT: tl.constexpr = xsg.shape[0]
        NT: tl.constexpr = NEAR_ROWS if BT >= NEAR_ROWS else BT
        groups = tl.max(tl.reshape(near, (BT // NT, NT)), 1)
        tl.store(near_ptr + pid * (BT // NT) + tl.arange(0, BT // NT), groups)
    gamma_r = res2
    if K.HAS_QJL:
        gamma_r = tl.sqrt_rn(res2)
    return words, wmap, proj, gamma_r
