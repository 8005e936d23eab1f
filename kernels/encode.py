"""Encode kernels: K (any codec) and V (group-16) in any float dtype -> the packed state of formats.md."""

import triton
import triton.language as tl

from .bits import bf16_bits, pack_codes, round_half_even
from .codec_decode import POLAR, TRIPLET

LINEAR_BITS = tl.constexpr(3)  # `_index`: compares against every boundary up to this many bits
NEAR = tl.constexpr(4e-7)  # `_octopus_tile`: scores this close (relative) are re-decided the reference's way


@triton.jit
def _cat(a, b):
    """[BT, S] ++ [BT, S] -> [BT, 2S] along the last axis, in registers."""
    BT: tl.constexpr = a.shape[0]
    S: tl.constexpr = a.shape[1]
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), (BT, 2 * S))


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


@triton.jit
def _pack_whole(codes, N_BITS: tl.constexpr):
    """Codes [BT, L] of N_BITS bits, N_BITS dividing 32 and L * N_BITS a multiple of 32 -> words
    [BT, L * N_BITS / 32] (int32): codes per word are whole, so a reshape, shifts and a sum (no gather)."""
    BT: tl.constexpr = codes.shape[0]
    L: tl.constexpr = codes.shape[1]
    PER: tl.constexpr = 32 // N_BITS
    sh = (tl.arange(0, PER) * N_BITS).to(tl.uint32)
    c3 = tl.reshape(codes.to(tl.uint32, bitcast=True), (BT, L // PER, PER))
    # disjoint bit fields: the sum is their OR
    return tl.sum(c3 << sh[None, None, :], 2).to(tl.int32, bitcast=True)


@triton.jit
def _pack_sum(codes, N_BITS: tl.constexpr):
    """Codes [BT, CP] of N_BITS bits, N_BITS odd or twice odd and at most 7, CP a multiple of P -> (words,
    their word numbers in the stream [1, W], -1 for padding). The stream repeats every P = 32 / gcd(N, 32)
    codes (Q = P N / 32 words): per period, codes paired (c_2i | c_2i+1 << N), and word k the sum of the
    pairs' pieces that fall in it (shifted left, or right for a pair that began in word k - 1)."""
    BT: tl.constexpr = codes.shape[0]
    CP: tl.constexpr = codes.shape[1]
    P: tl.constexpr = 32 if N_BITS % 2 == 1 else 16
    Q: tl.constexpr = N_BITS * P // 32
    QP: tl.constexpr = 4 if Q <= 4 else 8
    NPER: tl.constexpr = CP // P
    c0, c1 = tl.split(tl.reshape(codes.to(tl.uint32, bitcast=True), (BT, CP // 2, 2)))
    v = tl.reshape(c0 | (c1 << N_BITS), (BT, NPER, P // 2))
    off = (tl.arange(0, P // 2) * (2 * N_BITS))[None, None, :]
    kk = tl.arange(0, QP)[None, None, :]
    out = tl.zeros((BT, NPER, QP), tl.uint32)
    for k in tl.static_range(Q):
        sh = off - 32 * k
        lo = v << tl.minimum(tl.maximum(sh, 0), 31).to(tl.uint32)
        hi = v >> tl.minimum(tl.maximum(-sh, 0), 31).to(tl.uint32)
        piece = tl.where((sh >= 0) & (sh < 32), lo, tl.where((sh < 0) & (sh > -2 * N_BITS), hi, 0))
        out = tl.where(kk == k, tl.sum(piece, 2)[:, :, None], out)  # disjoint bit fields: sum = OR
    q = tl.arange(0, QP)[None, :]
    wmap = tl.where(q < Q, tl.arange(0, NPER)[:, None] * Q + q, -1)
    return tl.reshape(out, (BT, NPER * QP)).to(tl.int32, bitcast=True), tl.reshape(wmap, (1, NPER * QP))


@triton.jit
def _pack(codes, L: tl.constexpr, N_BITS: tl.constexpr, WP: tl.constexpr, KP: tl.constexpr,
          SUM: tl.constexpr = True):
    """Codes [BT, CP] (CP >= L, codes beyond L zero) -> (words, their word numbers in the stream [1, W]; -1
    where unused): `_pack_whole` when the codes per word are whole and fill the padded row, `_pack_sum` for
    3, 5, 6 and 7 bits over whole periods (with SUM), else `pack_codes` (a register gather)."""
    CP: tl.constexpr = codes.shape[1]
    if (32 % N_BITS == 0) and ((CP * N_BITS) == (WP * 32)):
        return _pack_whole(codes, N_BITS), tl.arange(0, WP)[None, :]
    elif SUM and (N_BITS <= 7) and (N_BITS % 4 != 0) and (CP % (16 << (N_BITS % 2)) == 0):
        return _pack_sum(codes, N_BITS)
    else:
        return pack_codes(codes, 0, L, N_BITS, WP, KP), tl.arange(0, WP)[None, :]


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
def _mark_bad(flag_ptr):
    """Record a bad input in the one-element flag at flag_ptr: +inf in a float32 flag (the cache's deferred
    record, where anything not finite reads as bad), 1 in an int32 flag. Every program that sees a bad value
    stores the same thing, so no atomic is needed."""
    if flag_ptr.dtype.element_ty == tl.float32:
        tl.store(flag_ptr, float("inf"))
    else:
        tl.store(flag_ptr, 1)


@triton.jit
def _unit_rows(rows, T, H, T_OUT, OFFSET, stride_b, stride_h, stride_t):
    """Row r of a unit [B, H, T, .] (r = (b * H + h) * T + t) -> (element offset of its first channel in the
    input, whose strides are given, its row in a store [B, H, T_OUT, .] at token OFFSET + t, its head)."""
    bh = rows // T
    t = rows - bh * T
    head = bh % H
    src = (bh // H) * stride_b + head * stride_h + t * stride_t
    return src, bh * T_OUT + OFFSET + t, head


@triton.jit
def _divmod_near(n, d, inv_d):
    """(n // d, n % d) for int32 n >= 0, d >= 1 and quotients below 2**21, without an integer division: the
    fp32 estimate n * RN(1/d) is within one of the quotient, corrected once each way."""
    q = (n.to(tl.float32) * inv_d).to(tl.int32)
    r = n - q * d
    hi = r >= d
    q = tl.where(hi, q + 1, q)
    r = tl.where(hi, r - d, r)
    lo = r < 0
    return tl.where(lo, q - 1, q), tl.where(lo, r + d, r)


@triton.jit
def _key_rows(pid, n_rows, T, H, T_OUT, OFFSET, D: tl.constexpr, stride_b, stride_h, stride_t,
              BLOCK_T: tl.constexpr, ALIGNED: tl.constexpr):
    """Rows [BLOCK_T] of block `pid` of a unit [B, H, T, .] as `_unit_rows` places them: (valid mask, input
    offset, store row, head * D). ALIGNED (T a multiple of BLOCK_T): the block lies in one head, whose
    offset is a scalar. Otherwise one scalar division per program, and per row quotients of at most
    1 + BLOCK_T / T and 1 + (BLOCK_T + 1) / H, so `_divmod_near` is exact."""
    r0 = pid * BLOCK_T
    bh0 = r0 // T
    h0 = bh0 % H
    i = tl.arange(0, BLOCK_T)
    if ALIGNED:
        t = r0 - bh0 * T + i
        src = (bh0 // H) * stride_b + h0 * stride_h + t * stride_t
        return r0 + i < n_rows, src, bh0 * T_OUT + OFFSET + t, h0 * D
    else:
        q, t = _divmod_near(r0 - bh0 * T + i, T, 1.0 / (T * 1.0))
        qh, head = _divmod_near(h0 + q, H, 1.0 / (H * 1.0))  # H may be a constexpr 1
        src = (bh0 // H + qh) * stride_b + head * stride_h + t * stride_t
        return r0 + i < n_rows, src, (bh0 + q) * T_OUT + OFFSET + t, (head * D)[:, None]


@triton.jit
def _key_norm(xf):
    """(gamma = ||x||, 2**-e) per row of xf [BT, D] (fp32) for any finite x: the row is scaled by the power of
    two 2**-e (exact) that takes max|x| into [1, 2), squared and summed, and the root scaled back by 2**e."""
    e = tl.max(tl.abs(xf), 1).to(tl.int32, bitcast=True) & 0x7F800000
    e = tl.minimum(tl.maximum(e, 1 << 23), 253 << 23)  # binades 1..253: both 2**e and 2**-e are normal
    scale = ((254 << 23) - e).to(tl.float32, bitcast=True)
    xs = xf * scale[:, None]
    return tl.sqrt_rn(tl.sum(xs * xs, 1)) * e.to(tl.float32, bitcast=True), scale


@triton.jit
def _unit_coords(y, gmax, inv_g, inv_sqrt_d, LOG2D: tl.constexpr):
    """u = RN(RN(y / sqrt(d)) / gmax) of the rotated rows y [BT, S] (gmax, inv_g = RN(1/gmax) [BT, 1]): where
    1/sqrt(d) is a power of two, y/sqrt(d) is exact and u = RN(y / (gmax sqrt(d))), one `_div_row`."""
    if LOG2D % 2 == 0:
        return _div_row(y, gmax * (1 << (LOG2D // 2)), inv_g * inv_sqrt_d)
    else:
        return _div_row(y * inv_sqrt_d, gmax, inv_g)


@triton.jit
def _rcp(x, ASM: tl.constexpr):
    """1 / x to about an ulp (ASM: one MUFU.RCP, denormals flushed), for decisions that tolerate it."""
    if ASM:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return 1.0 / x


@triton.jit
def _sign_of(x, s):
    """x with its sign flipped where s is negative (s never +-0 here): one bit operation."""
    sb = s.to(tl.int32, bitcast=True) & -2147483648
    return (x.to(tl.int32, bitcast=True) ^ sb).to(tl.float32, bitcast=True)


@triton.jit
def _try_direction(best, second, best_k, K: tl.constexpr, tz, txs, A, oA, tys, B, oB):
    """One local3x3 candidate: the grid point (xi, eta) = (sa A, sb B) unfolds to v = (sa X, sb Y, w),
    w = 1 - A - B, (X, Y) = (A, B) on the upper half and (1 - B, 1 - A) where w < 0; its score
    s = t.v / ||v|| (txs = sa tx, tys = sb ty). Keeps the larger score (the first on a tie), its number K,
    and the runner-up's score (equal to the best's on a tie)."""
    w = oA - B
    lower = w < 0
    X = tl.where(lower, oB, A)
    Y = tl.where(lower, oA, B)
    dot = tl.fma(txs, X, tl.fma(tys, Y, tz * w))
    s = dot * tl.math.rsqrt(tl.fma(X, X, tl.fma(Y, Y, w * w)))
    better = s > best
    # the largest score below or equal to the best, the best's own value once (a repeat at the grid's edge
    # scores NaN: `_xi_triples`)
    second = tl.where(better, best, tl.where(s <= best, tl.maximum(second, s), second))
    return tl.where(better, s, best), second, tl.where(better, K, best_k)


@triton.jit
def _octopus_search(tx, ty, tz, xib_ptr, aux_ptr, B_DIR: tl.constexpr, ASM: tl.constexpr):
    """local3x3 joint rounding of triplets t = (tx, ty, tz) [BT, LP] -> (flat direction index of the winner,
    its score s = t.n_hat, the runner-up's score, the seeds i_xi, i_eta).

    The reference keeps the candidate of least cost rho^2 - 2 c(s) s + c(s)^2 with c(s) the rho centroid
    nearest s. That is rho^2 + min_k (c_k^2 - 2 c_k s), strictly decreasing in s as every c_k > 0 (the rho
    codebook lies in (0, 1]), so the least cost is the largest s: no rho search per candidate. The candidate
    directions are unfolded in registers from the xi centroids (3 per coordinate from `aux_ptr`, rows
    (C[i-1], C[i], C[i+1], 0) clamped) instead of read from the direction table; their s differ from the
    table's by float rounding only, as do the seeds, computed from t / ||t||_1 (one reciprocal). Candidates
    run in increasing flat index and a tie keeps the first: the reference's lowest-index rule."""
    M: tl.constexpr = 1 << B_DIR
    l1 = tl.abs(tx) + tl.abs(ty) + tl.abs(tz)
    inv = _rcp(tl.where(l1 > 0, l1, 1.0), ASM)  # approximate: it places the seeds only
    px = tx * inv
    py = ty * inv
    lower = tz < 0
    xi = tl.where(lower, tl.where(px < 0, tl.abs(py) - 1.0, 1.0 - tl.abs(py)), px)
    eta = tl.where(lower, tl.where(py < 0, tl.abs(px) - 1.0, 1.0 - tl.abs(px)), py)
    i_xi = _index(xi, xib_ptr, B_DIR, ASM, True)
    i_eta = _index(eta, xib_ptr, B_DIR, ASM, True)
    rx = aux_ptr + i_xi * 4
    ry = aux_ptr + i_eta * 4
    b0 = _table(ry, ASM)
    b1 = _table(ry + 1, ASM)
    b2 = _table(ry + 2, ASM)
    B0 = tl.abs(b0)
    B1 = tl.abs(b1)
    B2 = tl.abs(b2)
    oB0 = 1.0 - B0
    oB1 = 1.0 - B1
    oB2 = 1.0 - B2
    t0 = _sign_of(ty, b0)
    t1 = _sign_of(ty, b1)
    t2 = _sign_of(ty, b2)
    best = tl.full(tx.shape, float("-inf"), tl.float32)
    second = best
    best_k = tl.zeros(tx.shape, tl.int32)
    for dx in tl.static_range(3):
        a = _table(rx + dx, ASM)
        A = tl.abs(a)
        oA = 1.0 - A
        txs = _sign_of(tx, a)
        best, second, best_k = _try_direction(best, second, best_k, 3 * dx, tz, txs, A, oA, t0, B0, oB0)
        best, second, best_k = _try_direction(best, second, best_k, 3 * dx + 1, tz, txs, A, oA, t1, B1, oB1)
        best, second, best_k = _try_direction(best, second, best_k, 3 * dx + 2, tz, txs, A, oA, t2, B2, oB2)
    kx = (best_k * 11) >> 5  # best_k // 3 for best_k < 9
    fx = tl.minimum(tl.maximum(i_xi + kx - 1, 0), M - 1)
    fy = tl.minimum(tl.maximum(i_eta + (best_k - 3 * kx) - 1, 0), M - 1)
    return fx * M + fy, best, second, i_xi, i_eta


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
def _octopus_tile(tx, ty, tz, valid, xib_ptr, aux_ptr, dir_ptr, bnd_ptr, cent_ptr, B_DIR: tl.constexpr,
                  B_RHO: tl.constexpr, EXACT: tl.constexpr, ASM: tl.constexpr):
    """Codes ((i_xi << b_dir | i_eta) << b_rho | i_rho) of a tile of triplets (0 where not `valid`), the rho
    indices and the chosen directions from the table: `_octopus_search`, then the rho index of the winner's
    score against the table's direction (it differs from the search's own score only within float rounding,
    and the -qjl residual needs the table's direction anyway). Where the search's
    two best distinct scores lie within NEAR (relative) of each other, its rounding may order them unlike
    the reference's (as may an exact tie off the symmetry planes): EXACT 0, a program holding such a triplet
    reruns every triplet's choice in the
    reference's arithmetic (`_octopus_exact`; rare); 1, the choice stays the search's and the last value
    returned says whether the tile holds one (a second launch with EXACT 2 redoes such programs); 2, every
    choice in the reference's arithmetic. A zero triplet (rho = 0; tested as |tx| + |ty| + |tz| = 0, which
    differs from the reference's sum of squares only where those underflow, |t| < 4e-23) keeps the
    placeholder direction's seeds and the rho index of s = 0."""
    M: tl.constexpr = 1 << B_DIR
    flat, s, second, i_xi, i_eta = _octopus_search(tx, ty, tz, xib_ptr, aux_ptr, B_DIR, ASM)
    # a zero triplet keeps its seeds (their direction feeds the -qjl residual); its s = 0 on either path
    zero = (tl.abs(tx) + tl.abs(ty)) + tl.abs(tz) == 0
    # exact mirror images score alike in both arithmetics (t on a symmetry plane: tx or ty 0, |tx| = |ty|);
    # any other pair of scores within NEAR may be ordered unlike the reference's
    sym = (tx == 0) | (ty == 0) | (tl.abs(tx) == tl.abs(ty))
    near = tl.max(tl.max((valid & ~sym & (s - second <= NEAR * tl.abs(s))).to(tl.int32), 1), 0)
    if (EXACT == 2) or ((EXACT == 0) and (near > 0)):
        flat = _octopus_exact(tx, ty, tz, i_xi, i_eta, dir_ptr, bnd_ptr, cent_ptr, B_DIR, B_RHO, ASM)
        flat = tl.where(zero, i_xi * M + i_eta, flat)
        ddx = _table(dir_ptr + flat, ASM)
        ddy = _table(dir_ptr + M * M + flat, ASM)
        ddz = _table(dir_ptr + 2 * M * M + flat, ASM)
        s = (tx * ddx + ty * ddy) + tz * ddz
    else:
        flat = tl.where(zero, i_xi * M + i_eta, flat)
        ddx = _table(dir_ptr + flat, ASM)
        ddy = _table(dir_ptr + M * M + flat, ASM)
        ddz = _table(dir_ptr + 2 * M * M + flat, ASM)
        s = (tx * ddx + ty * ddy) + tz * ddz
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
                   KP: tl.constexpr, B_DIR: tl.constexpr, B_RHO: tl.constexpr,
                   HAS_QJL: tl.constexpr, DOT_NATIVE: tl.constexpr, SPLIT: tl.constexpr, EXACT: tl.constexpr):
    """Triplets [J0, J0 + W) of the rows xsg [BT, D] (the keys times their signs): their coordinates from
    three dots with the triplet Hadamard columns (`hadt_ptr` [3, D, LP]), their codes packed into words at
    code J0 (zero elsewhere; with the words' stream numbers, `_pack`: a tile short of the row packs into
    [BT, WP] in order), for -qjl the partial R' r [BT, D] and ||r||^2 [BT] of these triplets (zeros
    otherwise), and `_octopus_tile`'s near-tie flag."""
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
                                                     bnd_ptr, cent_ptr, B_DIR, B_RHO, EXACT, SPLIT)
    if J0 == 0 and W >= K_CODES:
        # (the period sums lift octopus-qjl b=2 to 255 registers and spills; its gather pack does not)
        words, wmap = _pack(code, K_CODES, K_BITS, WP, KP, not HAS_QJL)
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
def _encode_keys_kernel(
    k_ptr, stride_kb, stride_kh, stride_kt, codes_ptr, gamma_ptr, signs_ptr, gamma_r_ptr, flag_ptr, near_ptr,
    had_ptr, hadt_ptr, rs_ptr, qs_ptr,
    cent_ptr, bnd_ptr, xib_ptr, aux_ptr, dir_ptr,
    n_rows, T, H, T_OUT, OFFSET, inv_sqrt_d,
    DECODE: tl.constexpr, D: tl.constexpr, LOG2D: tl.constexpr,
    K_BITS: tl.constexpr, K_CODES: tl.constexpr, K_WORDS: tl.constexpr, WP: tl.constexpr, KP: tl.constexpr,
    B_DIR: tl.constexpr, B_RHO: tl.constexpr, LP: tl.constexpr,
    HAS_QJL: tl.constexpr, S_WORDS: tl.constexpr, S_WP: tl.constexpr, S_KP: tl.constexpr,
    DOT_NATIVE: tl.constexpr, SPLIT: tl.constexpr, CHECK: tl.constexpr, BLOCK_T: tl.constexpr,
    ALIGNED: tl.constexpr, EXACT: tl.constexpr,
):
    """Keys of every codec, one block of BLOCK_T rows per program (`_encode_key_rows`). Octopus runs twice:
    EXACT 1 writes near_ptr[pid] (the block holds a near tie, `_octopus_tile`), then EXACT 2 redoes just
    those blocks in the reference's arithmetic (a separate kernel keeps that rare path's registers out of
    the first)."""
    pid = tl.program_id(0)
    go = True  # EXACT 2: only the blocks the first launch flagged
    if EXACT == 2:
        go = tl.load(near_ptr + pid) != 0
    if go:
        _encode_key_rows(
            pid, k_ptr, stride_kb, stride_kh, stride_kt, codes_ptr, gamma_ptr, signs_ptr, gamma_r_ptr,
            flag_ptr, near_ptr, had_ptr, hadt_ptr, rs_ptr, qs_ptr, cent_ptr, bnd_ptr, xib_ptr, aux_ptr,
            dir_ptr, n_rows, T, H, T_OUT, OFFSET, inv_sqrt_d,
            DECODE, D, LOG2D, K_BITS, K_CODES, K_WORDS, WP, KP, B_DIR, B_RHO, LP, HAS_QJL, S_WORDS,
            S_WP, S_KP, DOT_NATIVE, SPLIT, CHECK, BLOCK_T, ALIGNED, EXACT)


@triton.jit
def _encode_key_rows(
    pid, k_ptr, stride_kb, stride_kh, stride_kt, codes_ptr, gamma_ptr, signs_ptr, gamma_r_ptr, flag_ptr,
    near_ptr, had_ptr, hadt_ptr, rs_ptr, qs_ptr,
    cent_ptr, bnd_ptr, xib_ptr, aux_ptr, dir_ptr,
    n_rows, T, H, T_OUT, OFFSET, inv_sqrt_d,
    DECODE: tl.constexpr, D: tl.constexpr, LOG2D: tl.constexpr,
    K_BITS: tl.constexpr, K_CODES: tl.constexpr, K_WORDS: tl.constexpr, WP: tl.constexpr, KP: tl.constexpr,
    B_DIR: tl.constexpr, B_RHO: tl.constexpr, LP: tl.constexpr,
    HAS_QJL: tl.constexpr, S_WORDS: tl.constexpr, S_WP: tl.constexpr, S_KP: tl.constexpr,
    DOT_NATIVE: tl.constexpr, SPLIT: tl.constexpr, CHECK: tl.constexpr, BLOCK_T: tl.constexpr,
    ALIGNED: tl.constexpr, EXACT: tl.constexpr,
):
    """Rows [BLOCK_T] (block `pid`) of a unit K [B, H, T, D] (row r is token r % T of head (r // T) % H; the
    input's strides are given, unit stride along D) -> codes, gamma, QJL fields written to rows
    (b * H + h) * T_OUT + OFFSET + t of the outputs (a store of T_OUT tokens; T_OUT = T, OFFSET = 0 for a
    plain [.., T, .] output). CHECK: a NaN or infinite key sets the flag (`_mark_bad`).

    gamma = ||k|| (fp32, `_key_norm`; stored bf16); u = (H_d (s_h * k)) / sqrt(d) / max(gamma, 1e-30), the
    rotation a matmul with the +-1 Hadamard matrix (`_rotate`; the signs s_h and the matrices had_ptr /
    hadt_ptr are in the input's dtype when DOT_NATIVE, else fp32), the per-row divisions as `_div_row`. Then
    per codec: codebook search against boundaries (turboquant, `_index`), recursive polar angles by cross
    products against the boundaries' cos and sin (polarquant, `_polar_codes`; `aux_ptr` the trig table),
    octahedral seeds + local3x3 joint rounding (octopus, `_octopus_words`: the triplet coordinates come
    straight out of three matmuls with the Hadamard columns 3j, 3j+1, 3j+2, `hadt_ptr` [3, D, LP], in two
    tiles from d = 128; `_octopus_search` with `aux_ptr` the xi neighbour table; the winner's rho index from
    its score against the direction table `dir_ptr` [3, 4^b_dir]); the -qjl codecs add
    sigma = sign(R' (u - u_hat)) and gamma_r = ||u - u_hat||.
    ALIGNED: T is a multiple of BLOCK_T (a block lies in one head). Codes go out through `_pack`'s word map.
    """
    ok, src, dst, hoff = _key_rows(pid, n_rows, T, H, T_OUT, OFFSET, D, stride_kb, stride_kh, stride_kt,
                                   BLOCK_T, ALIGNED)
    dcol = tl.arange(0, D)[None, :]
    x = tl.load(k_ptr + src[:, None] + dcol, mask=ok[:, None], other=0.0)
    xf = x.to(tl.float32)
    if CHECK:
        if tl.max(tl.max((~(tl.abs(xf) < float("inf"))).to(tl.int32), 1), 0) > 0:
            _mark_bad(flag_ptr)
    gamma, rscale = _key_norm(xf)
    tl.store(gamma_ptr + dst, bf16_bits(gamma), mask=ok)
    gmax = tl.maximum(gamma, 1e-30)[:, None]
    inv_g = tl.math.div_rn(1.0, gmax)
    sgn = tl.load(rs_ptr + hoff + dcol)
    if DOT_NATIVE:
        xsg = x * sgn  # +-1 in the input dtype: exact
    else:
        xsg = xf * sgn
    hrow = tl.arange(0, D)[:, None]

    if DECODE == TRIPLET:
        if D >= 128:
            # two tiles: triplets [0, D/4) and [D/4, 3D/8) (the last ceil(D/12) of them used), 3D/8 lanes
            # instead of the D/2 of one power-of-two tile
            words, wmap, acc, res2, near = _octopus_words(
                xsg, hadt_ptr, 0, D // 4, LP, gmax, inv_g, inv_sqrt_d, hoff, qs_ptr, xib_ptr, aux_ptr,
                dir_ptr, bnd_ptr, cent_ptr, D, LOG2D, K_CODES, K_BITS, WP, KP, B_DIR, B_RHO, HAS_QJL,
                DOT_NATIVE, SPLIT, EXACT)
            words_b, _, acc_b, res2_b, near_b = _octopus_words(
                xsg, hadt_ptr, D // 4, D // 8, LP, gmax, inv_g, inv_sqrt_d, hoff, qs_ptr, xib_ptr, aux_ptr,
                dir_ptr, bnd_ptr, cent_ptr, D, LOG2D, K_CODES, K_BITS, WP, KP, B_DIR, B_RHO, HAS_QJL,
                DOT_NATIVE, SPLIT, EXACT)
            words = words | words_b
            acc += acc_b
            res2 += res2_b
            near = tl.maximum(near, near_b)
        else:
            words, wmap, acc, res2, near = _octopus_words(
                xsg, hadt_ptr, 0, LP, LP, gmax, inv_g, inv_sqrt_d, hoff, qs_ptr, xib_ptr, aux_ptr, dir_ptr,
                bnd_ptr, cent_ptr, D, LOG2D, K_CODES, K_BITS, WP, KP, B_DIR, B_RHO, HAS_QJL, DOT_NATIVE,
                SPLIT, EXACT)
        if EXACT == 1:
            tl.store(near_ptr + pid, near)
        if HAS_QJL:
            proj = acc
            gamma_r = tl.sqrt_rn(res2)
    else:
        y = _rotate(xsg, tl.load(had_ptr + hrow * D + dcol), DOT_NATIVE, SPLIT)
        if DECODE == POLAR:
            # the angles need no division by gamma, only a scale that keeps the squares finite
            codes = _polar_codes(y * rscale[:, None], aux_ptr, BLOCK_T, D, LOG2D, K_BITS, SPLIT)
            words, wmap = _pack(codes, K_CODES, K_BITS, WP, KP)
        else:
            u = _unit_coords(y, gmax, inv_g, inv_sqrt_d, LOG2D)
            if K_BITS > 0:
                i_u = _index(u, bnd_ptr, K_BITS, SPLIT, True)
                words, wmap = _pack(i_u, K_CODES, K_BITS, WP, KP)
                if HAS_QJL:
                    u_hat = _table(cent_ptr + i_u, SPLIT)
            else:
                u_hat = tl.zeros((BLOCK_T, D), tl.float32)
        if HAS_QJL:
            res = u - u_hat
            gamma_r = tl.sqrt_rn(tl.sum(res * res, 1))
            qsg = tl.load(qs_ptr + hoff + dcol)
            proj = _dot_pm1(res * qsg, tl.load(had_ptr + hrow * D + dcol).to(tl.float32), SPLIT)
    if K_WORDS > 0:
        tl.store(codes_ptr + dst[:, None] * K_WORDS + wmap, words,
                 mask=ok[:, None] & (wmap >= 0) & (wmap < K_WORDS))
    if HAS_QJL:
        tl.store(gamma_r_ptr + dst, bf16_bits(gamma_r), mask=ok)
        sbits, _ = _pack((proj >= 0).to(tl.int32), D, 1, S_WP, S_KP)
        scol = tl.arange(0, S_WP)[None, :]
        tl.store(signs_ptr + dst[:, None] * S_WORDS + scol, sbits, mask=ok[:, None] & (scol < S_WORDS))


@triton.jit
def _round_code(a, s, inv_s, MAXC: tl.constexpr):
    """clamp(round_half_even(RN(a / s)), 0, MAXC) for s > 0 (an fp16 value) and |a| < 2**17, without a
    division per element. q0 = a * inv_s is within a few ulps of a / s (inv_s ~ 1/s), so the code is k or k+1,
    k = floor(clamp(q0)), split at y = k + 1/2. RN(a/s) > y exactly when a/s > y + ulp(y)/2 (a tie there goes
    to y, whose last bit is 0), i.e. a - y*s > s*ulp(y)/2; y*s is exact (<= 9 + 11 bits) and the fma rounds
    a - y*s once, exactly wherever the comparison is close (Sterbenz), so the test is exact. RN(a/s) == y
    (a tie, to even) adds 1 when k is odd (then y is not a power of two: the lower threshold is the same)."""
    q0 = tl.minimum(tl.maximum(a * inv_s, 0.0), MAXC * 1.0)
    k = tl.floor(q0)
    y = k + 0.5
    d1 = tl.fma(y, -s, a)
    half_ulp = ((y.to(tl.int32, bitcast=True) & 0x7F800000) - (24 << 23)).to(tl.float32, bitcast=True)
    thr = half_ulp * s
    ki = k.to(tl.int32)
    up = (d1 > thr) | (((ki & 1) != 0) & (d1 >= -thr))
    return tl.minimum(ki + up.to(tl.int32), MAXC)


@triton.jit(do_not_specialize=["n_groups", "T", "OFFSET"])
def _encode_values_kernel(v_ptr, stride_vb, stride_vh, stride_vt, codes_ptr, scale_ptr, min_ptr, flag_ptr,
                          n_groups, T, H, T_OUT, OFFSET,
                          D: tl.constexpr, GROUP: tl.constexpr, BITS: tl.constexpr, ROW_UNITS: tl.constexpr,
                          BLOCK_G: tl.constexpr, CHECK: tl.constexpr):
    """Values in groups of GROUP >= 8 channels, BLOCK_G groups per program (`_encode_value_groups`)."""
    _encode_value_groups(tl.program_id(0), v_ptr, stride_vb, stride_vh, stride_vt, codes_ptr, scale_ptr,
                         min_ptr, flag_ptr, n_groups, T, H, T_OUT, OFFSET, D, GROUP, BITS, ROW_UNITS, BLOCK_G,
                         CHECK)


@triton.jit
def _encode_value_groups(pid, v_ptr, stride_vb, stride_vh, stride_vt, codes_ptr, scale_ptr, min_ptr, flag_ptr,
                         n_groups, T, H, T_OUT, OFFSET,
                         D: tl.constexpr, GROUP: tl.constexpr, BITS: tl.constexpr, ROW_UNITS: tl.constexpr,
                         BLOCK_G: tl.constexpr, CHECK: tl.constexpr):
    """Groups [BLOCK_G] (block `pid`) of GROUP (>= 8) channels of a unit V [B, H, T, D] (group g is channels
    [(g % (D / GROUP)) * GROUP, +GROUP) of row g // (D / GROUP), rows as in `_unit_rows`; strides given, unit
    stride along D) -> mn = fp16(min), scale = fp16(min((max-min)/(2^b-1), 65504)) (1 where that is 0),
    code = clamp(round((v - mn) / scale), 0, 2^b - 1) as in fp32 with ties to even (`_round_code`), written
    to rows (b * H + h) * T_OUT + OFFSET + t of the outputs. A group is HC chunks of 8 channels; chunk i's
    8 codes are 8*BITS bits = BITS bytes of the little-endian stream, written with one store per chunk
    (codes_ptr typed uint8, int16, int32, int64 for BITS = 1, 2, 4, 8; otherwise uint8 and byte by byte);
    rows start ROW_UNITS elements of codes_ptr apart. CHECK: any |v| > 65504 or NaN sets the flag
    (`_mark_bad`)."""
    HC: tl.constexpr = GROUP // 8
    GPR: tl.constexpr = D // GROUP
    MAXC: tl.constexpr = (1 << BITS) - 1
    g = pid * BLOCK_G + tl.arange(0, BLOCK_G)
    ok = g < n_groups
    row = g // GPR
    j = g - row * GPR  # the group's index within its row
    src, dst, _ = _unit_rows(row, T, H, T_OUT, OFFSET, stride_vb, stride_vh, stride_vt)
    h = tl.arange(0, HC)[None, :, None]
    c = tl.arange(0, 8)[None, None, :]
    v = tl.load(v_ptr + (src + j * GROUP)[:, None, None] + h * 8 + c, mask=ok[:, None, None], other=0.0)
    v = v.to(tl.float32)
    if CHECK:
        if tl.max(tl.max(tl.max((~(tl.abs(v) <= 65504.0)).to(tl.int32), 2), 1), 0) > 0:
            _mark_bad(flag_ptr)
    mx = tl.max(tl.max(v, 2), 1)
    mn = tl.min(tl.min(v, 2), 1)
    mn16 = mn.to(tl.float16)
    sc16 = tl.minimum(tl.math.div_rn(mx - mn, MAXC * 1.0), 65504.0).to(tl.float16)
    sc16 = tl.where(sc16 == 0, 1.0, sc16.to(tl.float32)).to(tl.float16)
    tl.store(scale_ptr + dst * GPR + j, sc16, mask=ok)
    tl.store(min_ptr + dst * GPR + j, mn16, mask=ok)
    s = sc16.to(tl.float32)[:, None, None]
    a = v - mn16.to(tl.float32)[:, None, None]
    code = _round_code(a, s, 1.0 / s, MAXC)
    if (BITS == 1) or (BITS == 2) or (BITS == 4):
        val = tl.sum(code << (c * BITS), 2)
    else:
        val = tl.sum(code.to(tl.int64) << (c * BITS).to(tl.int64), 2)
    chunk = j[:, None] * HC + tl.arange(0, HC)[None, :]
    okc = ok[:, None]
    if (BITS == 1) or (BITS == 2) or (BITS == 4) or (BITS == 8):
        # codes_ptr has the element type of one chunk (BITS bytes): one store per chunk
        tl.store(codes_ptr + dst[:, None] * ROW_UNITS + chunk, val.to(codes_ptr.dtype.element_ty),
                 mask=okc)
    else:
        p = tl.arange(0, 8)[None, None, :]
        piece = ((val[:, :, None] >> (p * 8)) & 255).to(tl.uint8)
        byte = dst[:, None] * ROW_UNITS + chunk * BITS
        tl.store(codes_ptr + byte[:, :, None] + p, piece, mask=okc[:, :, None] & (p < BITS))


@triton.jit(do_not_specialize=["n_rows", "T", "OFFSET", "key_programs", "n_groups"])
def _encode_unit_kernel(
    k_ptr, stride_kb, stride_kh, stride_kt, v_ptr, stride_vb, stride_vh, stride_vt,
    codes_ptr, gamma_ptr, signs_ptr, gamma_r_ptr, v_codes_ptr, scale_ptr, min_ptr, flag_ptr,
    had_ptr, hadt_ptr, rs_ptr, qs_ptr,
    cent_ptr, bnd_ptr, xib_ptr, aux_ptr, dir_ptr,
    n_rows, T, H, T_OUT, OFFSET, inv_sqrt_d, key_programs, n_groups,
    DECODE: tl.constexpr, D: tl.constexpr, LOG2D: tl.constexpr,
    K_BITS: tl.constexpr, K_CODES: tl.constexpr, K_WORDS: tl.constexpr, WP: tl.constexpr, KP: tl.constexpr,
    B_DIR: tl.constexpr, B_RHO: tl.constexpr, LP: tl.constexpr,
    HAS_QJL: tl.constexpr, S_WORDS: tl.constexpr, S_WP: tl.constexpr, S_KP: tl.constexpr,
    DOT_NATIVE: tl.constexpr, SPLIT: tl.constexpr, CHECK: tl.constexpr, BLOCK_T: tl.constexpr,
    ALIGNED: tl.constexpr,
    GROUP: tl.constexpr, V_BITS: tl.constexpr, ROW_UNITS: tl.constexpr, BLOCK_G: tl.constexpr,
):
    """One unit's keys and values in one launch, straight into a store [B, H, T_OUT, .] at token OFFSET:
    programs [0, key_programs) encode BLOCK_T key rows each (`_encode_key_rows`), the rest BLOCK_G value
    groups each (`_encode_value_groups`). CHECK: flag_ptr[0] is set for a non-finite key, flag_ptr[1] for a
    value that is NaN or beyond the fp16 range."""
    pid = tl.program_id(0)
    if pid < key_programs:
        _encode_key_rows(
            pid, k_ptr, stride_kb, stride_kh, stride_kt, codes_ptr, gamma_ptr, signs_ptr, gamma_r_ptr,
            flag_ptr, flag_ptr, had_ptr, hadt_ptr, rs_ptr, qs_ptr, cent_ptr, bnd_ptr, xib_ptr, aux_ptr,
            dir_ptr, n_rows, T, H, T_OUT, OFFSET, inv_sqrt_d,
            DECODE, D, LOG2D, K_BITS, K_CODES, K_WORDS, WP, KP, B_DIR, B_RHO, LP, HAS_QJL, S_WORDS,
            S_WP, S_KP, DOT_NATIVE, SPLIT, CHECK, BLOCK_T, ALIGNED, 0)
    else:
        _encode_value_groups(pid - key_programs, v_ptr, stride_vb, stride_vh, stride_vt, v_codes_ptr,
                             scale_ptr, min_ptr, flag_ptr + 1, n_groups, T, H, T_OUT, OFFSET, D, GROUP,
                             V_BITS, ROW_UNITS, BLOCK_G, CHECK)


@triton.jit
def _encode_values_any_group_kernel(v_ptr, codes_ptr, scale_ptr, min_ptr, n_rows,
                          D: tl.constexpr, GROUP: tl.constexpr, BITS: tl.constexpr, WORDS: tl.constexpr,
                          WP: tl.constexpr, KP: tl.constexpr, BLOCK_T: tl.constexpr):
    """(Groups of fewer than 8 channels.) Rows of V [n_rows, D] -> per group of GROUP channels:
    mn = fp16(min), scale = fp16(min((max-min)/(2^b-1), 65504)) (1 where that is 0),
    code = clamp(round((v - mn) / scale), 0, 2^b - 1) in fp32, ties to even."""
    G: tl.constexpr = D // GROUP
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = rows < n_rows
    dcol = tl.arange(0, D)[None, :]
    v = tl.load(v_ptr + rows[:, None] * D + dcol, mask=ok[:, None], other=0.0).to(tl.float32)
    g = tl.reshape(v, (BLOCK_T, G, GROUP))
    mx = tl.max(g, 2)
    mn = tl.min(g, 2)
    mn16 = mn.to(tl.float16)
    sc16 = tl.minimum(tl.math.div_rn(mx - mn, (1 << BITS) - 1.0), 65504.0).to(tl.float16)
    sc16 = tl.where(sc16 == 0, 1.0, sc16.to(tl.float32)).to(tl.float16)
    q = tl.math.div_rn(g - mn16.to(tl.float32)[:, :, None], sc16.to(tl.float32)[:, :, None])
    code = tl.minimum(tl.maximum(round_half_even(q), 0.0), (1 << BITS) - 1.0).to(tl.int32)
    words = pack_codes(tl.reshape(code, (BLOCK_T, D)), 0, D, BITS, WP, KP)
    wcol = tl.arange(0, WP)[None, :]
    tl.store(codes_ptr + rows[:, None] * WORDS + wcol, words, mask=ok[:, None] & (wcol < WORDS))
    gcol = rows[:, None] * G + tl.arange(0, G)[None, :]
    tl.store(scale_ptr + gcol, sc16, mask=ok[:, None])
    tl.store(min_ptr + gcol, mn16, mask=ok[:, None])
