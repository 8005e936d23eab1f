"""Per-codec @triton.jit encode helpers, by decode section: the rotation, the codebook searches and the joint
rounding that turn rotated keys into codes in registers; and each section's host-side encode tables.

Shared: the rotation by the +-1 Hadamard matrix (`_rotate`, exact products, fp32 sums), the per-row
divisions, codebook searches against boundaries (`_index`). Sections: "scalar" (a Lloyd-Max index per
coordinate, and the QJL residual), "polar" (recursive angles by cross products), "triplet" (octahedral seeds
and local3x3 joint rounding); `encode_codes` dispatches on the section (encode.encode_tables builds the tables
it reads). A section without an entry here has no encode kernel: its codecs encode in the library
(octopus_audio.backend announces it).
"""

import triton
import triton.language as tl

from .bits import pack_codes, pack_tile
from .codec_decode import POLAR, TRIPLET

LINEAR_BITS = tl.constexpr(3)  # `_index`: compares against every boundary up to this many bits
NEAR = tl.constexpr(4e-7)  # `_octopus_tile`: scores this close (relative) are re-decided the reference's way
NEAR_ROWS = tl.constexpr(16)  # encode_keys re-decides near ties in groups of this many rows


# ---------------------------------------------------------------- shared: rotation, division, search
@triton.jit
def _div_row(a, b, inv_b):
    """RN(a / b) for b > 0 broadcast over a, given inv_b = RN(1 / b) (one division per row): q = RN(a * inv_b)
    corrected once by its exact fma residual (Markstein), the correctly rounded quotient but in cases
    within one ulp of a rounding boundary."""
    q = a * inv_b
    return tl.fma(tl.fma(q, -b, a), inv_b, q)


@triton.jit
def _dot_pm1(a, b, SPLIT: tl.constexpr):
    """a [M, K] fp32 @ b [K, N] with entries in {-1, 0, 1}, as fp32. SPLIT: a is the exact sum of three
    bfloat16 parts (hi, mid, lo), each product by +-1 exact, accumulated in fp32 on the tensor cores;
    otherwise an IEEE fp32 dot (the interpreter)."""
    if SPLIT:
        bb = b.to(tl.bfloat16)
        hi = a.to(tl.bfloat16)
        r1 = a - hi.to(tl.float32)
        mid = r1.to(tl.bfloat16)
        lo = (r1 - mid.to(tl.float32)).to(tl.bfloat16)
        acc = tl.dot(hi, bb, out_dtype=tl.float32)
        acc = tl.dot(mid, bb, acc, out_dtype=tl.float32)
        return tl.dot(lo, bb, acc, out_dtype=tl.float32)
    else:
        return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _rotate(x, had, DOT_NATIVE: tl.constexpr, SPLIT: tl.constexpr):
    """x @ had for x [BT, D] (the key times its signs): native 16-bit x (+-1 products exact, fp32
    accumulation), or fp32 x through `_dot_pm1`."""
    if DOT_NATIVE:
        return tl.dot(x, had.to(x.dtype), out_dtype=tl.float32)
    else:
        return _dot_pm1(x, had, SPLIT)


@triton.jit
def _unit_coords(y, gmax, inv_g, inv_sqrt_d, LOG2D: tl.constexpr):
    """u = RN(RN(y / sqrt(d)) / gmax) of the rotated rows y [BT, S] (gmax, inv_g = RN(1/gmax) [BT, 1]): where
    1/sqrt(d) is a power of two, y/sqrt(d) is exact and u = RN(y / (gmax sqrt(d))), one `_div_row`."""
    if LOG2D % 2 == 0:
        return _div_row(y, gmax * (1 << (LOG2D // 2)), inv_g * inv_sqrt_d)
    else:
        return _div_row(y * inv_sqrt_d, gmax, inv_g)


@triton.jit
def _table(ptrs, ASM: tl.constexpr):
    """fp32 table reads at ptrs (any shape) that keep the layout of the computation around them (ASM, compiled
    kernels: one inline read-only load per element). A tl.load of scattered addresses gets a layout of its own
    from Triton's coalescing, and conversions through shared memory around it."""
    if ASM:
        return tl.inline_asm_elementwise("ld.global.nc.f32 $0, [$1];", "=f,l", [ptrs], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.load(ptrs)


@triton.jit
def _search(x, bnd_ptr, N_BITS: tl.constexpr, ASM: tl.constexpr):
    """#{i : x > beta_i} against 2**N_BITS - 1 ascending boundaries: a binary search, N_BITS table reads."""
    idx = tl.zeros(x.shape, dtype=tl.int32)
    for level in tl.static_range(N_BITS):
        step = 1 << (N_BITS - 1 - level)
        idx = tl.where(x > _table(bnd_ptr + idx + (step - 1), ASM), idx + step, idx)
    return idx


@triton.jit
def _count_above(x, bnd_ptr, NB: tl.constexpr):
    """#{i < NB : x > beta_i} (int32) against NB boundaries read as scalars: each compare a 0/1 float
    (one FSET) summed in fp32, exact up to 2**24."""
    acc = tl.zeros(x.shape, tl.float32)
    for i in tl.static_range(NB):
        acc += tl.where(x > tl.load(bnd_ptr + i), 1.0, 0.0)
    return acc.to(tl.int32)


@triton.jit
def _index(x, bnd_ptr, N_BITS: tl.constexpr, ASM: tl.constexpr, SYM: tl.constexpr = False):
    """#{i : x > beta_i} against the 2**N_BITS - 1 ascending boundaries at bnd_ptr (a value on a boundary
    goes to the lower index): compares in registers up to LINEAR_BITS bits, a binary search of N_BITS table
    reads (one cache line for up to 31 fp32 boundaries) beyond; SYM: boundaries symmetric about 0
    (`_index_sym`, from 3 bits)."""
    if SYM and N_BITS >= 3:
        return _index_sym(x, bnd_ptr, N_BITS, ASM)
    elif N_BITS <= LINEAR_BITS:
        return _count_above(x, bnd_ptr, (1 << N_BITS) - 1)
    else:
        return _search(x, bnd_ptr, N_BITS, ASM)


@triton.jit
def _index_sym(x, bnd_ptr, N_BITS: tl.constexpr, ASM: tl.constexpr):
    """`_index` for boundaries symmetric about 0 (beta_{h-1} = 0 and beta_{h-1+j} = -beta_{h-1-j}, h =
    2**(N_BITS-1): the coordinate and xi codebooks, tests/test_kernels_encode.py checks every one): x > 0 is
    h + #{positive beta < x}; x <= 0 is h - 1 - #{positive beta <= |x|}, where beta <= |x| is beta < |x|
    nudged up one ulp. Half the compares."""
    H: tl.constexpr = 1 << (N_BITS - 1)
    pos = x > 0
    ax = (tl.abs(x).to(tl.int32, bitcast=True) + tl.where(pos, 0, 1)).to(tl.float32, bitcast=True)
    if N_BITS - 1 <= LINEAR_BITS:
        cnt = _count_above(ax, bnd_ptr + H, H - 1)
    else:
        cnt = _search(ax, bnd_ptr + H, N_BITS - 1, ASM)
    return tl.where(pos, H + cnt, (H - 1) - cnt)


# ---------------------------------------------------------------- section "polar"
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


# ---------------------------------------------------------------- section "triplet"
@triton.jit
def _rcp(x, ASM: tl.constexpr):
    """1 / x to about an ulp (ASM: one MUFU.RCP, denormals flushed), for decisions that tolerate it."""
    if ASM:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return 1.0 / x


@triton.jit
def _table_vec(ptrs, N: tl.constexpr, ASM: tl.constexpr):
    """N (2 or 4) consecutive fp32 table entries from each of ptrs (aligned to 4 N bytes) as N tensors: one
    vector load per element (ASM, compiled kernels: inline read-only loads, like `_table`)."""
    if ASM:
        if N == 2:
            return tl.inline_asm_elementwise("ld.global.nc.v2.f32 {$0, $1}, [$2];", "=f,=f,l", [ptrs],
                                             dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
        else:
            return tl.inline_asm_elementwise("ld.global.nc.v4.f32 {$0, $1, $2, $3}, [$4];", "=f,=f,=f,=f,l",
                                             [ptrs], dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
                                             is_pure=True, pack=1)
    else:
        if N == 2:
            return tl.load(ptrs), tl.load(ptrs + 1)
        else:
            return tl.load(ptrs), tl.load(ptrs + 1), tl.load(ptrs + 2), tl.load(ptrs + 3)


@triton.jit
def _region(x, lut_ptr, LUT_SCALE: tl.constexpr, ASM: tl.constexpr):
    """The number of region thresholds below x (a value on one goes lower) by the lookup table
    (triplet_tables.TripletSearchTables.lut): cell j = floor((x + 1) L) (clamped; NaN goes to a cell too),
    then one compare against the cell's threshold."""
    j = tl.fma(x, LUT_SCALE * 1.0, LUT_SCALE * 1.0).to(tl.int32)
    if not ASM:  # compiled: |x| < 1 + 1/L truncates into 0..2L and a NaN converts to 0; numpy's NaN: INT_MIN
        j = tl.minimum(j.to(tl.uint32, bitcast=True), 2 * LUT_SCALE).to(tl.int32, bitcast=True)
    thr, below = _table_vec(lut_ptr + 2 * j, 2, ASM)
    return below.to(tl.int32, bitcast=True) + (x > thr).to(tl.int32)


@triton.jit
def _table_word(ptrs, ASM: tl.constexpr):
    """An int32 table word stored as fp32 bits (`_table`, bitcast back)."""
    return _table(ptrs, ASM).to(tl.int32, bitcast=True)


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
    regions of the lookup table; the region's row of the candidate table (triplet_tables: the flat indices of
    the seed's 3x3 candidates that can win there, increasing, padded with M*M) gives SEARCH_K directions, one
    vector load each from the direction rows (row M*M NaN), scored in the reference's own arithmetic
    (t_x n_x + t_y n_y) + t_z n_z (bit-equal scores); a tie keeps the first: the reference's lowest-index
    rule. A zero triplet searches as (0, 0, 1), the reference's placeholder direction: the first of the four
    tied directions around the pole, its seeds. The table layout (F-bit fields, words a row, where the
    direction rows start) is triplet_tables' field_bits / row_words / dir_offset, computed here from the same
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
    row = cand_ptr + (r_xi * R + r_eta) * RW
    if RW == 2:
        w0, w1 = _table_vec(row, 2, ASM)
        word = w0.to(tl.int32, bitcast=True)
        word1 = w1.to(tl.int32, bitcast=True)
    else:
        word = _table_word(row, ASM)
        word1 = word
    best = tl.full(tx.shape, float("-inf"), tl.float32)
    second = tl.full(tx.shape, float("-inf"), tl.float32)
    flat = tl.zeros(tx.shape, tl.int32)
    for k in tl.static_range(SEARCH_K):
        if (F * k) % 32 == 0 and k > 0:  # the next word of the row
            if RW == 2:
                word = word1
            else:
                word = _table_word(row + (F * k) // 32, ASM)
        if F == 32:
            f_k = word
        else:
            f_k = (word >> ((F * k) % 32)) & ((1 << F) - 1)
        nx, ny, nz, _ = _table_vec(cand_ptr + DIR_OFF + 4 * f_k, 4, ASM)
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
        ddx, ddy, ddz, _ = _table_vec(cand_ptr + DIR_OFF + 4 * flat, 4, ASM)
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
def _octopus_words(xsg, hadt_ptr, J0: tl.constexpr, W: tl.constexpr, LP: tl.constexpr, gmax, inv_g,
                   inv_sqrt_d, hoff, qs_ptr, xib_ptr, aux_ptr, dir_ptr, bnd_ptr, cent_ptr, D: tl.constexpr,
                   LOG2D: tl.constexpr, K_CODES: tl.constexpr, K_BITS: tl.constexpr, WP: tl.constexpr,
                   KP: tl.constexpr, B_DIR: tl.constexpr, B_RHO: tl.constexpr, SEARCH_K: tl.constexpr,
                   LUT_SCALE: tl.constexpr,
                   HALF: tl.constexpr, RHO_SCALE: tl.constexpr,
                   HAS_QJL: tl.constexpr, DOT_NATIVE: tl.constexpr, SPLIT: tl.constexpr, EXACT: tl.constexpr):
    """Triplets [J0, J0 + W) of the rows xsg [BT, D] (the keys times their signs): their coordinates from
    three dots with the triplet Hadamard columns (`hadt_ptr` [3, D, LP]), their codes packed into words at
    code J0 (zero elsewhere; with the words' stream numbers, `_pack`: a tile short of the row packs into
    [BT, WP] in order), for -qjl the partial R' r [BT, D] and ||r||^2 [BT] of these triplets (zeros
    otherwise), and `_octopus_tile`'s near-tie flags per row."""
    BT: tl.constexpr = xsg.shape[0]
    hrow = tl.arange(0, D)[:, None]
    lcol = tl.arange(0, W)[None, :]
    cols = hrow * LP + J0 + lcol
    tx = _unit_coords(_rotate(xsg, tl.load(hadt_ptr + cols), DOT_NATIVE, SPLIT), gmax, inv_g, inv_sqrt_d,
                      LOG2D)
    ty = _unit_coords(_rotate(xsg, tl.load(hadt_ptr + D * LP + cols), DOT_NATIVE, SPLIT), gmax, inv_g,
                      inv_sqrt_d, LOG2D)
    tz = _unit_coords(_rotate(xsg, tl.load(hadt_ptr + 2 * D * LP + cols), DOT_NATIVE, SPLIT), gmax, inv_g,
                      inv_sqrt_d, LOG2D)
    j = J0 + lcol
    code, i_rho, ddx, ddy, ddz, near = _octopus_tile(tx, ty, tz, j < K_CODES, xib_ptr, aux_ptr, dir_ptr,
                                                     bnd_ptr, cent_ptr, B_DIR, B_RHO, SEARCH_K, LUT_SCALE,
                                                     HALF, RHO_SCALE,
                                                     HAS_QJL, EXACT, SPLIT)
    if J0 == 0 and W >= K_CODES:
        words, wmap = pack_tile(code, K_CODES, K_BITS, WP, KP)
    else:
        N_CODES: tl.constexpr = W if W < K_CODES - J0 else K_CODES - J0
        words = pack_codes(code, J0, N_CODES, K_BITS, WP, KP)
        wmap = tl.arange(0, WP)[None, :]
    acc = tl.zeros((BT, D), tl.float32)
    res2 = tl.zeros((BT,), tl.float32)
    if HAS_QJL:
        rx, ry, rz = _octopus_residual(tx, ty, tz, i_rho, ddx, ddy, ddz, cent_ptr, 3 * j, D, SPLIT)
        res2 = tl.sum((rx * rx + ry * ry) + rz * rz, 1)
        dcol = tl.arange(0, D)[None, :]
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
            qsg = tl.where(jc < D, _table(qs_ptr + hoff + tl.minimum(jc, D - 1), SPLIT), 0.0)
            ht = tl.load(hadt_ptr + (comp * D + dcol) * LP + jr).to(tl.float32)  # [W, D]: H[3j + comp, :]
            acc += _dot_pm1(rc * qsg, ht, SPLIT)
    return words, wmap, acc, res2, near


@triton.jit
def _triplet_encode(xsg, gmax, inv_g, inv_sqrt_d, hoff, pid, near_ptr, hadt_ptr, qs_ptr, cent_ptr, bnd_ptr,
                    xib_ptr, aux_ptr, dir_ptr, D: tl.constexpr, LOG2D: tl.constexpr, K_BITS: tl.constexpr,
                    K_CODES: tl.constexpr, WP: tl.constexpr, KP: tl.constexpr, B_DIR: tl.constexpr,
                    B_RHO: tl.constexpr, SEARCH_K: tl.constexpr, LUT_SCALE: tl.constexpr,
                   HALF: tl.constexpr, RHO_SCALE: tl.constexpr, LP: tl.constexpr, HAS_QJL: tl.constexpr,
                   DOT_NATIVE: tl.constexpr,
                    SPLIT: tl.constexpr, EXACT: tl.constexpr):
    """(words, their word map, R' r, ||r||) of the rows' triplets (`_octopus_words`; with EXACT 1 the near-tie
    flags of the block's groups of NEAR_ROWS rows go to near_ptr[pid * BT / NEAR_ROWS + g])."""
    if D >= 128:
        # two tiles: triplets [0, D/4) and [D/4, 3D/8) (the last ceil(D/12) of them used), 3D/8 lanes
        # instead of the D/2 of one power-of-two tile
        words, wmap, acc, res2, near = _octopus_words(
            xsg, hadt_ptr, 0, D // 4, LP, gmax, inv_g, inv_sqrt_d, hoff, qs_ptr, xib_ptr, aux_ptr,
            dir_ptr, bnd_ptr, cent_ptr, D, LOG2D, K_CODES, K_BITS, WP, KP, B_DIR, B_RHO, SEARCH_K, LUT_SCALE,
            HALF, RHO_SCALE, HAS_QJL,
            DOT_NATIVE, SPLIT, EXACT)
        words_b, _, acc_b, res2_b, near_b = _octopus_words(
            xsg, hadt_ptr, D // 4, D // 8, LP, gmax, inv_g, inv_sqrt_d, hoff, qs_ptr, xib_ptr, aux_ptr,
            dir_ptr, bnd_ptr, cent_ptr, D, LOG2D, K_CODES, K_BITS, WP, KP, B_DIR, B_RHO, SEARCH_K, LUT_SCALE,
            HALF, RHO_SCALE, HAS_QJL,
            DOT_NATIVE, SPLIT, EXACT)
        words = words | words_b
        acc += acc_b
        res2 += res2_b
        near = tl.maximum(near, near_b)
    else:
        words, wmap, acc, res2, near = _octopus_words(
            xsg, hadt_ptr, 0, LP, LP, gmax, inv_g, inv_sqrt_d, hoff, qs_ptr, xib_ptr, aux_ptr, dir_ptr,
            bnd_ptr, cent_ptr, D, LOG2D, K_CODES, K_BITS, WP, KP, B_DIR, B_RHO, SEARCH_K, LUT_SCALE, HALF,
            RHO_SCALE, HAS_QJL, DOT_NATIVE,
            SPLIT, EXACT)
    if EXACT == 1:
        BT: tl.constexpr = xsg.shape[0]
        NT: tl.constexpr = NEAR_ROWS if BT >= NEAR_ROWS else BT
        groups = tl.max(tl.reshape(near, (BT // NT, NT)), 1)
        tl.store(near_ptr + pid * (BT // NT) + tl.arange(0, BT // NT), groups)
    gamma_r = res2
    if HAS_QJL:
        gamma_r = tl.sqrt_rn(res2)
    return words, wmap, acc, gamma_r


# ---------------------------------------------------------------- section "scalar"
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
    u = _unit_coords(y, gmax, inv_g, inv_sqrt_d, LOG2D)
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


# ---------------------------------------------------------------- dispatch on the section
@triton.jit
def encode_codes(xsg, rscale, gmax, inv_g, inv_sqrt_d, hoff, pid, near_ptr, had_ptr, hadt_ptr, qs_ptr,
                 cent_ptr, bnd_ptr, xib_ptr, aux_ptr, dir_ptr, DECODE: tl.constexpr, D: tl.constexpr,
                 LOG2D: tl.constexpr, K_BITS: tl.constexpr, K_CODES: tl.constexpr, WP: tl.constexpr,
                 KP: tl.constexpr, B_DIR: tl.constexpr, B_RHO: tl.constexpr, SEARCH_K: tl.constexpr,
                 LUT_SCALE: tl.constexpr,
                   HALF: tl.constexpr, RHO_SCALE: tl.constexpr, LP: tl.constexpr,
                 HAS_QJL: tl.constexpr, DOT_NATIVE: tl.constexpr, SPLIT: tl.constexpr, EXACT: tl.constexpr,
                 BLOCK_T: tl.constexpr):
    """(code words [BT, WP], their word numbers in the stream, R' r [BT, D], ||r|| [BT]) of the rows xsg
    [BT, D] (the keys times their signs; gmax = max(gamma, 1e-30) and inv_g = RN(1/gmax) per row, rscale a
    power of two that keeps the rows' squares finite); the last two only with HAS_QJL."""
    if DECODE == TRIPLET:
        words, wmap, proj, gamma_r = _triplet_encode(
            xsg, gmax, inv_g, inv_sqrt_d, hoff, pid, near_ptr, hadt_ptr, qs_ptr, cent_ptr, bnd_ptr, xib_ptr,
            aux_ptr, dir_ptr, D, LOG2D, K_BITS, K_CODES, WP, KP, B_DIR, B_RHO, SEARCH_K, LUT_SCALE, HALF,
            RHO_SCALE, LP, HAS_QJL, DOT_NATIVE, SPLIT,
            EXACT)
    else:
        dcol = tl.arange(0, D)[None, :]
        hrow = tl.arange(0, D)[:, None]
        y = _rotate(xsg, tl.load(had_ptr + hrow * D + dcol), DOT_NATIVE, SPLIT)
        if DECODE == POLAR:
            # the angles need no division by gamma, only a scale that keeps the squares finite
            codes = _polar_codes(y * rscale[:, None], aux_ptr, BLOCK_T, D, LOG2D, K_BITS, SPLIT)
            words, wmap = pack_tile(codes, K_CODES, K_BITS, WP, KP)
            proj = y  # no QJL term (never read)
            gamma_r = gmax
        else:
            words, wmap, proj, gamma_r = _scalar_encode(y, gmax, inv_g, inv_sqrt_d, hoff, had_ptr, qs_ptr,
                                                        cent_ptr, bnd_ptr, D, LOG2D, K_BITS, K_CODES, WP, KP,
                                                        HAS_QJL, SPLIT, BLOCK_T)
    return words, wmap, proj, gamma_r
