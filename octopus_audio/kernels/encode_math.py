"""Encode arithmetic shared by the decode kinds (@triton.jit): the rotation by the +-1 Hadamard matrix (exact
products, fp32 sums), the per-row division, codebook searches against boundaries (`_index`), and table reads
that keep the layout of the computation around them (`_table`, `_table_row`, `_region`)."""

import triton
import triton.language as tl

LINEAR_BITS = tl.constexpr(3)  # `_index`: compares against every boundary up to this many bits


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
def rotated_rows(xsg, had_ptr, D: tl.constexpr, DOT_NATIVE: tl.constexpr, SPLIT: tl.constexpr):
    """y = xsg @ H_d [BT, D] of the rows xsg (the keys times their signs; had_ptr: H_d [D, D]), `_rotate`."""
    dcol = tl.arange(0, D)[None, :]
    hrow = tl.arange(0, D)[:, None]
    return _rotate(xsg, tl.load(had_ptr + hrow * D + dcol), DOT_NATIVE, SPLIT)


@triton.jit
def unit_coords(y, gmax, inv_g, inv_sqrt_d, LOG2D: tl.constexpr):
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


@triton.jit
def _rcp(x, ASM: tl.constexpr):
    """1 / x to about an ulp (ASM: one MUFU.RCP, denormals flushed), for decisions that tolerate it."""
    if ASM:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return 1.0 / x


@triton.jit
def _table_row(base_ptr, idx, N: tl.constexpr, ASM: tl.constexpr):
    """Row idx (int32, >= 0) of a table of N-entry fp32 rows at base_ptr (1, 2 or 4 entries, rows aligned to
    4 N bytes) as N tensors. ASM (compiled kernels): the row's byte offset as an unsigned 32-bit shift,
    zero-extended onto the base (no per-element sign extension or 64-bit multiply), then one inline read-only
    vector load (like `_table`: the layout of the computation around it is kept)."""
    if ASM:
        base = tl.full(idx.shape, 0, tl.int64) + base_ptr.to(tl.int64, bitcast=True)
        if N == 1:
            return tl.inline_asm_elementwise(
                "{ .reg .u32 o; .reg .u64 w, a; shl.b32 o, $1, 2; cvt.u64.u32 w, o; add.s64 a, $2, w; "
                "ld.global.nc.f32 $0, [a]; }", "=f,r,l",
                [idx, base], dtype=tl.float32, is_pure=True, pack=1)
        elif N == 2:
            return tl.inline_asm_elementwise(
                "{ .reg .u32 o; .reg .u64 w, a; shl.b32 o, $2, 3; cvt.u64.u32 w, o; add.s64 a, $3, w; "
                "ld.global.nc.v2.f32 {$0, $1}, [a]; }", "=f,=f,r,l",
                [idx, base], dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
        else:
            return tl.inline_asm_elementwise(
                "{ .reg .u32 o; .reg .u64 w, a; shl.b32 o, $4, 4; cvt.u64.u32 w, o; add.s64 a, $5, w; "
                "ld.global.nc.v4.f32 {$0, $1, $2, $3}, [a]; }",
                "=f,=f,=f,=f,r,l", [idx, base], dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
                is_pure=True, pack=1)
    else:
        p = base_ptr + N * idx
        if N == 1:
            return tl.load(p)
        elif N == 2:
            return tl.load(p), tl.load(p + 1)
        else:
            return tl.load(p), tl.load(p + 1), tl.load(p + 2), tl.load(p + 3)


@triton.jit
def _region(x, lut_ptr, LUT_SCALE: tl.constexpr, ASM: tl.constexpr):
    """The number of region thresholds below x (a value on one goes lower) by the lookup table
    (kinds/triplet_search.TripletSearchTables.lut): cell j = floor((x + 1) L) (clamped; NaN goes to a cell
    too), then one compare against the cell's threshold."""
    j = tl.fma(x, LUT_SCALE * 1.0, LUT_SCALE * 1.0).to(tl.int32)
    if not ASM:  # compiled: |x| < 1 + 1/L truncates into 0..2L and a NaN converts to 0; numpy's NaN: INT_MIN
        j = tl.minimum(j.to(tl.uint32, bitcast=True), 2 * LUT_SCALE).to(tl.int32, bitcast=True)
    thr, below = _table_row(lut_ptr, j, 2, ASM)
    return below.to(tl.int32, bitcast=True) + (x > thr).to(tl.int32)
