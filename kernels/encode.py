"""Encode kernels: K (any codec) and V (group-16) in any float dtype -> the packed state of formats.md."""

import triton
import triton.language as tl

from .bits import bf16_bits, pack_codes, round_half_even, search_sorted
from .codec_decode import OCTOPUS, OCTOPUS_QJL, POLAR

PI = tl.constexpr(3.141592653589793)


@triton.jit
def _atan2(y, x):
    """atan2 in fp32 (Cephes atanf on the reduced ratio min/max, ~1e-7 rad), IEEE signs of zeros."""
    ax = tl.abs(x)
    ay = tl.abs(y)
    hi = tl.maximum(ax, ay)
    lo = tl.minimum(ax, ay)
    a = tl.math.div_rn(lo, tl.where(hi > 0, hi, 1.0))
    big = a > 0.41421356237309503
    z = tl.where(big, tl.math.div_rn(a - 1.0, a + 1.0), a)
    base = tl.where(big, PI / 4, 0.0)
    z2 = z * z
    poly = (((8.05374449538e-2 * z2 - 1.38776856032e-1) * z2 + 1.99777106478e-1) * z2 - 3.33329491539e-1)
    r = base + (poly * z2 * z + z)
    r = tl.where(ay > ax, PI / 2 - r, r)
    x_neg = x.to(tl.int32, bitcast=True) < 0
    r = tl.where(x_neg, PI - r, r)
    y_neg = y.to(tl.int32, bitcast=True) < 0
    return tl.where(y_neg, -r, r)


@triton.jit
def _sgn(x):
    return tl.where(x < 0, -1.0, 1.0)


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
    return tl.fma(tl.fma(-q, b, a), inv_b, q)


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
def _quantize(x, bnd_ptr, cent_ptr, N_BITS: tl.constexpr, WANT_C: tl.constexpr):
    """(#{i : x > beta_i}, the centroid of that index if WANT_C) against the 2**N_BITS - 1 ascending
    boundaries at bnd_ptr. Up to 15 boundaries are compared in registers (scalar loads, one per program);
    the centroid is selected alongside for up to 3 boundaries and read from the table otherwise."""
    NB: tl.constexpr = (1 << N_BITS) - 1
    if N_BITS <= 4:
        idx = tl.zeros(x.shape, tl.int32)
        if WANT_C and N_BITS <= 2:
            c = tl.zeros(x.shape, tl.float32) + tl.load(cent_ptr)
        for i in tl.static_range(NB):
            above = x > tl.load(bnd_ptr + i)
            idx += above.to(tl.int32)
            if WANT_C and N_BITS <= 2:
                c = tl.where(above, tl.load(cent_ptr + i + 1), c)
    else:
        idx = search_sorted(x, bnd_ptr, N_BITS)
    if WANT_C and N_BITS > 2:
        c = tl.load(cent_ptr + idx)
    if not WANT_C:
        c = 0.0
    return idx, c


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
def _pack(codes, L: tl.constexpr, N_BITS: tl.constexpr, WP: tl.constexpr, KP: tl.constexpr):
    """Codes [BT, CP] (CP >= L, codes beyond L zero) -> words [BT, WP]: `_pack_whole` when the codes per word
    are whole and fill the padded row, else `pack_codes` (a register gather)."""
    CP: tl.constexpr = codes.shape[1]
    if (32 % N_BITS == 0) and ((CP * N_BITS) == (WP * 32)):
        return _pack_whole(codes, N_BITS)
    else:
        return pack_codes(codes, 0, L, N_BITS, WP, KP)


@triton.jit
def _direction(dir4_ptr, flat):
    """Rows `flat` [BT, LP] of the padded direction table [4^b_dir, 4]: one 16-byte load each -> (x, y, z)."""
    BT: tl.constexpr = flat.shape[0]
    LP: tl.constexpr = flat.shape[1]
    d4 = tl.load(dir4_ptr + flat[:, :, None] * 4 + tl.arange(0, 4)[None, None, :])
    xz, yw = tl.split(tl.reshape(d4, (BT, LP, 2, 2)))
    x, z = tl.split(xz)
    y, _ = tl.split(yw)
    return x, y, z


@triton.jit
def _polar_codes(r, bnd_ptr, BT: tl.constexpr, LVL: tl.constexpr, S: tl.constexpr, N_BITS: tl.constexpr):
    """Angle codes of levels LVL.. of the polar transform of radii r [BT, 2S], concatenated level by level in
    stream order and padded with one zero code: [BT, 2S]. Level 0 angles are atan2 mapped to [0, 2 pi)."""
    a, b = tl.split(tl.reshape(r, (BT, S, 2)))
    psi = _atan2(b, a)
    if LVL == 0:
        psi = tl.where(psi < 0, psi + 2 * PI, psi)
    codes, _ = _quantize(psi, bnd_ptr + LVL * ((1 << N_BITS) - 1), bnd_ptr, N_BITS, False)
    if S == 1:
        rest = tl.zeros((BT, 1), tl.int32)
    else:
        rest = _polar_codes(tl.sqrt_rn(a * a + b * b), bnd_ptr, BT, LVL + 1, S // 2, N_BITS)
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


@triton.jit(do_not_specialize=["n_rows", "T", "OFFSET"])
def _encode_keys_kernel(
    k_ptr, stride_kb, stride_kh, stride_kt, codes_ptr, gamma_ptr, signs_ptr, gamma_r_ptr, flag_ptr,
    had_ptr, hadt_ptr, rs_ptr, qs_ptr,
    cent_ptr, bnd_ptr, xib_ptr, dir4_ptr,
    n_rows, T, H, T_OUT, OFFSET, inv_sqrt_d,
    CODEC: tl.constexpr, D: tl.constexpr, LOG2D: tl.constexpr,
    K_BITS: tl.constexpr, K_CODES: tl.constexpr, K_WORDS: tl.constexpr, WP: tl.constexpr, KP: tl.constexpr,
    B_DIR: tl.constexpr, B_RHO: tl.constexpr, LP: tl.constexpr,
    HAS_QJL: tl.constexpr, S_WORDS: tl.constexpr, S_WP: tl.constexpr, S_KP: tl.constexpr,
    DOT_NATIVE: tl.constexpr, SPLIT: tl.constexpr, CHECK: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """Keys of every codec, one block of BLOCK_T rows per program (`_encode_key_rows`)."""
    _encode_key_rows(
        tl.program_id(0), k_ptr, stride_kb, stride_kh, stride_kt, codes_ptr, gamma_ptr, signs_ptr,
        gamma_r_ptr, flag_ptr, had_ptr, hadt_ptr, rs_ptr, qs_ptr, cent_ptr, bnd_ptr, xib_ptr, dir4_ptr,
        n_rows, T, H, T_OUT, OFFSET, inv_sqrt_d,
        CODEC, D, LOG2D, K_BITS, K_CODES, K_WORDS, WP, KP, B_DIR, B_RHO, LP, HAS_QJL, S_WORDS, S_WP, S_KP,
        DOT_NATIVE, SPLIT, CHECK, BLOCK_T)


@triton.jit
def _encode_key_rows(
    pid, k_ptr, stride_kb, stride_kh, stride_kt, codes_ptr, gamma_ptr, signs_ptr, gamma_r_ptr, flag_ptr,
    had_ptr, hadt_ptr, rs_ptr, qs_ptr,
    cent_ptr, bnd_ptr, xib_ptr, dir4_ptr,
    n_rows, T, H, T_OUT, OFFSET, inv_sqrt_d,
    CODEC: tl.constexpr, D: tl.constexpr, LOG2D: tl.constexpr,
    K_BITS: tl.constexpr, K_CODES: tl.constexpr, K_WORDS: tl.constexpr, WP: tl.constexpr, KP: tl.constexpr,
    B_DIR: tl.constexpr, B_RHO: tl.constexpr, LP: tl.constexpr,
    HAS_QJL: tl.constexpr, S_WORDS: tl.constexpr, S_WP: tl.constexpr, S_KP: tl.constexpr,
    DOT_NATIVE: tl.constexpr, SPLIT: tl.constexpr, CHECK: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """Rows [BLOCK_T] (block `pid`) of a unit K [B, H, T, D] (row r is token r % T of head (r // T) % H; the
    input's strides are given, unit stride along D) -> codes, gamma, QJL fields written to rows
    (b * H + h) * T_OUT + OFFSET + t of the outputs (a store of T_OUT tokens; T_OUT = T, OFFSET = 0 for a
    plain [.., T, .] output). CHECK: a NaN or infinite key sets the flag (`_mark_bad`).

    gamma = max|k| * ||k / max|k||| (fp32, no overflow for norms up to 1e20; stored bf16);
    u = (H_d (s_h * k)) / sqrt(d) / max(gamma, 1e-30), the rotation a matmul with the +-1 Hadamard matrix
    (`_rotate`), the per-row divisions as `_div_row`. Then per codec: codebook search against boundaries
    (turboquant), recursive polar angles (polarquant), octahedral seeds + local3x3 joint rounding (octopus:
    the triplet coordinates come straight out of three matmuls with the Hadamard columns 3j, 3j+1, 3j+2,
    `hadt_ptr` [3, D, LP]); the -qjl codecs add sigma = sign(R' (u - u_hat)) and gamma_r = ||u - u_hat||.
    """
    rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = rows < n_rows
    src, dst, head = _unit_rows(rows, T, H, T_OUT, OFFSET, stride_kb, stride_kh, stride_kt)
    dcol = tl.arange(0, D)[None, :]
    x = tl.load(k_ptr + src[:, None] + dcol, mask=ok[:, None], other=0.0)
    xf = x.to(tl.float32)
    if CHECK:
        if tl.max(tl.max((~(tl.abs(xf) < float("inf"))).to(tl.int32), 1), 0) > 0:
            _mark_bad(flag_ptr)
    peak = tl.max(tl.abs(xf), 1)
    peak1 = tl.where(peak > 0, peak, 1.0)
    xs = _div_row(xf, peak1[:, None], tl.math.div_rn(1.0, peak1)[:, None])
    gamma = tl.sqrt_rn(tl.sum(xs * xs, 1)) * peak
    tl.store(gamma_ptr + dst, bf16_bits(gamma), mask=ok)
    gmax = tl.maximum(gamma, 1e-30)[:, None]
    inv_g = tl.math.div_rn(1.0, gmax)
    sgn = tl.load(rs_ptr + head[:, None] * D + dcol)
    if DOT_NATIVE:
        xsg = x * sgn.to(x.dtype)  # +-1: exact in the input dtype
    else:
        xsg = xf * sgn
    hrow = tl.arange(0, D)[:, None]

    if (CODEC == OCTOPUS) or (CODEC == OCTOPUS_QJL):
        M: tl.constexpr = 1 << B_DIR
        lcol = tl.arange(0, LP)[None, :]
        tx = _div_row(_rotate(xsg, tl.load(hadt_ptr + hrow * LP + lcol), DOT_NATIVE, SPLIT) * inv_sqrt_d,
                      gmax, inv_g)
        ty = _div_row(_rotate(xsg, tl.load(hadt_ptr + (D + hrow) * LP + lcol), DOT_NATIVE, SPLIT)
                      * inv_sqrt_d, gmax, inv_g)
        tz = _div_row(_rotate(xsg, tl.load(hadt_ptr + (2 * D + hrow) * LP + lcol), DOT_NATIVE, SPLIT)
                      * inv_sqrt_d, gmax, inv_g)
        rho2 = tx * tx + ty * ty + tz * tz
        rho = tl.sqrt_rn(rho2)
        pos = rho > 0
        safe = tl.where(pos, rho, 1.0)
        nx = tl.where(pos, tl.math.div_rn(tx, safe), 0.0)
        ny = tl.where(pos, tl.math.div_rn(ty, safe), 0.0)
        nz = tl.where(pos, tl.math.div_rn(tz, safe), 1.0)
        l1 = tl.abs(nx) + tl.abs(ny) + tl.abs(nz)
        px = tl.math.div_rn(nx, l1)
        py = tl.math.div_rn(ny, l1)
        lower = nz < 0
        xi = tl.where(lower, _sgn(px) * (1.0 - tl.abs(py)), px)
        eta = tl.where(lower, _sgn(py) * (1.0 - tl.abs(px)), py)
        i_xi, _ = _quantize(xi, xib_ptr, xib_ptr, B_DIR, False)
        i_eta, _ = _quantize(eta, xib_ptr, xib_ptr, B_DIR, False)
        # local3x3: candidates in increasing flat index (clamped repeats are equal), so a strict < keeps the
        # lowest flat index among equal costs, as the reference's ties rule
        best = tl.full((BLOCK_T, LP), float("inf"), tl.float32)
        best_code = tl.zeros((BLOCK_T, LP), tl.int32)
        for dx in tl.static_range(3):
            cx = tl.minimum(tl.maximum(i_xi + (dx - 1), 0), M - 1) * M
            for dy in tl.static_range(3):
                flat = cx + tl.minimum(tl.maximum(i_eta + (dy - 1), 0), M - 1)
                ddx, ddy, ddz = _direction(dir4_ptr, flat)
                s = (tx * ddx + ty * ddy) + tz * ddz
                i_rho, rh = _quantize(s, bnd_ptr, cent_ptr, B_RHO, True)
                cost = (rho2 - 2.0 * rh * s) + rh * rh
                better = cost < best
                best = tl.where(better, cost, best)
                best_code = tl.where(better, (flat << B_RHO) | i_rho, best_code)
        zero = rho == 0  # the placeholder direction's seeds and the rho index of 0
        i_rho0, _ = _quantize(rho, bnd_ptr, cent_ptr, B_RHO, False)
        best_code = tl.where(zero, ((i_xi * M + i_eta) << B_RHO) | i_rho0, best_code)
        best_code = tl.where(lcol < K_CODES, best_code, 0)
        words = _pack(best_code, K_CODES, K_BITS, WP, KP)
        if HAS_QJL:
            best_dir = best_code >> B_RHO
            rh = tl.load(cent_ptr + (best_code & ((1 << B_RHO) - 1)))
            ddx, ddy, ddz = _direction(dir4_ptr, best_dir)
            jr = tl.arange(0, LP)[:, None]
            # R' r from the triplet layout: sum over components c of (r_c * s'_c) @ H[3j + c, :]
            acc = tl.zeros((BLOCK_T, D), tl.float32)
            res2 = tl.zeros((BLOCK_T, LP), tl.float32)
            for comp in tl.static_range(3):
                if comp == 0:
                    rc = tx - rh * ddx
                elif comp == 1:
                    rc = ty - rh * ddy
                else:
                    rc = tz - rh * ddz
                rc = tl.where(lcol * 3 + comp < D, rc, 0.0)
                res2 += rc * rc
                jc = lcol * 3 + comp
                qsg = tl.load(qs_ptr + head[:, None] * D + jc, mask=jc < D, other=0.0)
                ht = tl.load(hadt_ptr + (comp * D + dcol) * LP + jr)  # [LP, D]: H[3j + comp, :]
                acc += _dot_pm1(rc * qsg, ht, SPLIT)
            proj = acc
            gamma_r = tl.sqrt_rn(tl.sum(res2, 1))
    else:
        u = _div_row(_rotate(xsg, tl.load(had_ptr + hrow * D + dcol), DOT_NATIVE, SPLIT) * inv_sqrt_d,
                     gmax, inv_g)
        if CODEC == POLAR:
            words = _pack(_polar_codes(u, bnd_ptr, BLOCK_T, 0, D // 2, K_BITS), K_CODES, K_BITS, WP, KP)
        elif K_BITS > 0:
            i_u, u_hat = _quantize(u, bnd_ptr, cent_ptr, K_BITS, HAS_QJL)
            words = _pack(i_u, K_CODES, K_BITS, WP, KP)
        else:
            u_hat = tl.zeros((BLOCK_T, D), tl.float32)
        if HAS_QJL:
            res = u - u_hat
            gamma_r = tl.sqrt_rn(tl.sum(res * res, 1))
            qsg = tl.load(qs_ptr + head[:, None] * D + dcol)
            proj = _dot_pm1(res * qsg, tl.load(had_ptr + hrow * D + dcol), SPLIT)
    if K_WORDS > 0:
        wcol = tl.arange(0, WP)[None, :]
        tl.store(codes_ptr + dst[:, None] * K_WORDS + wcol, words, mask=ok[:, None] & (wcol < K_WORDS))
    if HAS_QJL:
        tl.store(gamma_r_ptr + dst, bf16_bits(gamma_r), mask=ok)
        sbits = _pack((proj >= 0).to(tl.int32), D, 1, S_WP, S_KP)
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
    cent_ptr, bnd_ptr, xib_ptr, dir4_ptr,
    n_rows, T, H, T_OUT, OFFSET, inv_sqrt_d, key_programs, n_groups,
    CODEC: tl.constexpr, D: tl.constexpr, LOG2D: tl.constexpr,
    K_BITS: tl.constexpr, K_CODES: tl.constexpr, K_WORDS: tl.constexpr, WP: tl.constexpr, KP: tl.constexpr,
    B_DIR: tl.constexpr, B_RHO: tl.constexpr, LP: tl.constexpr,
    HAS_QJL: tl.constexpr, S_WORDS: tl.constexpr, S_WP: tl.constexpr, S_KP: tl.constexpr,
    DOT_NATIVE: tl.constexpr, SPLIT: tl.constexpr, CHECK: tl.constexpr, BLOCK_T: tl.constexpr,
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
            flag_ptr, had_ptr, hadt_ptr, rs_ptr, qs_ptr, cent_ptr, bnd_ptr, xib_ptr, dir4_ptr,
            n_rows, T, H, T_OUT, OFFSET, inv_sqrt_d,
            CODEC, D, LOG2D, K_BITS, K_CODES, K_WORDS, WP, KP, B_DIR, B_RHO, LP, HAS_QJL, S_WORDS, S_WP, S_KP,
            DOT_NATIVE, SPLIT, CHECK, BLOCK_T)
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
