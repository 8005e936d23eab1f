"""Bit-field helpers shared by the kernels: read and write n-bit codes in the little-endian int32 word streams
(formats.md), masked loads, and fp32 -> bf16 rounding as the GPU does it."""

import triton
import triton.language as tl


@triton.jit
def unpack_codes(row_ptr, j, valid, N_BITS: tl.constexpr):
    """Codes number `j` of N_BITS bits each from the word streams starting at `row_ptr`.

    Code j occupies stream bits [j*n, j*n + n); stream bit i is bit i % 32 of word i // 32. `row_ptr` (int32
    pointers, one per key row) and `j` broadcast against each other; `valid` masks rows/codes that must not be
    read (they come back as 0). The second word is only read where a code straddles two words, and not at all
    when N_BITS divides 32.
    """
    bit = j * N_BITS
    word = bit >> 5
    shift = (bit & 31).to(tl.uint32)
    lo = tl.load(row_ptr + word, mask=valid, other=0).to(tl.uint32, bitcast=True)
    val = lo >> shift
    if 32 % N_BITS != 0:
        straddles = valid & ((bit & 31) + N_BITS > 32)
        hi = tl.load(row_ptr + word + 1, mask=straddles, other=0).to(tl.uint32, bitcast=True)
        # (hi << 1) << (31 - shift) == hi << (32 - shift) without a 32-bit shift when shift == 0
        val = val | ((hi << 1) << (31 - shift))
    return (val & ((1 << N_BITS) - 1)).to(tl.int32)


@triton.jit
def load_words(rows_ptr, row_ok, N_WORDS: tl.constexpr, WP: tl.constexpr):
    """The N_WORDS words of each row at rows_ptr [BN, 1] as one contiguous tile [BN, WP] (uint32, 0 pad)."""
    w = tl.arange(0, WP)[None, :]
    return tl.load(rows_ptr + w, mask=row_ok & (w < N_WORDS), other=0).to(tl.uint32, bitcast=True)


@triton.jit
def cut_codes(words, j, N_BITS: tl.constexpr):
    """Codes number j [1, S] of N_BITS bits from each row of a word tile [BN, WP], in registers (tl.gather).

    Expands by shifts alone when the codes are whole words' worth in order (j = 0..S-1, N_BITS | 32, S*N_BITS
    = 32*WP); otherwise each code gathers its word (and the next, where it straddles).
    """
    BN: tl.constexpr = words.shape[0]
    WP: tl.constexpr = words.shape[1]
    S: tl.constexpr = j.shape[1]
    if (32 % N_BITS == 0) and (S * N_BITS == WP * 32):
        PER: tl.constexpr = 32 // N_BITS
        shift = (tl.arange(0, PER) * N_BITS).to(tl.uint32)
        codes = tl.reshape((words[:, :, None] >> shift[None, None, :]) & ((1 << N_BITS) - 1), (BN, S))
    else:
        bit = j * N_BITS
        word = tl.minimum(bit >> 5, WP - 1)
        sh = (bit & 31).to(tl.uint32)
        codes = tl.gather(words, tl.broadcast_to(word, (BN, S)), axis=1) >> sh
        if 32 % N_BITS != 0:
            hi = tl.gather(words, tl.broadcast_to(tl.minimum(word + 1, WP - 1), (BN, S)), axis=1)
            codes = codes | tl.where((bit & 31) + N_BITS > 32, (hi << 1) << (31 - sh), 0)
        codes = codes & ((1 << N_BITS) - 1)
    return codes.to(tl.int32)


@triton.jit
def row_codes(rows_ptr, row_ok, j, N_BITS: tl.constexpr, N_WORDS: tl.constexpr, WP: tl.constexpr,
           TILE: tl.constexpr):
    """Codes j [1, S] of each row: from one contiguous word tile cut in registers (TILE), or one gathered load
    per code."""
    if TILE:
        return cut_codes(load_words(rows_ptr, row_ok, N_WORDS, WP), j, N_BITS)
    else:
        return unpack_codes(rows_ptr, j, row_ok, N_BITS)


@triton.jit
def masked_load(ptr, ok, other, MASKED: tl.constexpr, CG: tl.constexpr = False):
    """tl.load with the mask only where MASKED (the tail step); CG: through L2 only (.cg)."""
    if MASKED:
        if CG:
            return tl.load(ptr, mask=ok, other=other, cache_modifier=".cg")
        else:
            return tl.load(ptr, mask=ok, other=other)
    else:
        if CG:
            return tl.load(ptr, cache_modifier=".cg")
        else:
            return tl.load(ptr)


@triton.jit
def pack_codes(codes, J0: tl.constexpr, L: tl.constexpr, N_BITS: tl.constexpr, WP: tl.constexpr,
               KP: tl.constexpr):
    """Words [BT, WP] (int32) holding the bits of codes [BT, CP] placed at code numbers J0 .. J0+L-1.

    Word w receives the codes j with [j*n, j*n+n) meeting [32w, 32w+32); there are at most KP of them
    (KP >= ceil(32/n) + 1, a power of two). Bits of codes outside [J0, J0+L) are zero, so streams written in
    pieces (polarquant levels) are OR-ed together.
    """
    BT: tl.constexpr = codes.shape[0]
    CP: tl.constexpr = codes.shape[1]
    w = tl.arange(0, WP)[:, None]
    k = tl.arange(0, KP)[None, :]
    j = tl.maximum((w * 32) // N_BITS, J0) + k  # absolute code number, [WP, KP]
    off = j * N_BITS - w * 32  # where the code's bit 0 lands in word w (negative: it began in word w-1)
    ok = (j < J0 + L) & (off < 32)
    local = tl.where(ok, j - J0, 0)
    local = tl.minimum(local, CP - 1)
    idx = tl.broadcast_to(tl.reshape(local, (1, WP * KP)), (BT, WP * KP))
    g = tl.reshape(tl.gather(codes, idx, axis=1), (BT, WP, KP)).to(tl.uint32, bitcast=True)
    left = tl.maximum(off, 0).to(tl.uint32)[None, :, :]
    right = tl.maximum(-off, 0).to(tl.uint32)[None, :, :]
    part = tl.where(off[None, :, :] >= 0, g << left, g >> right)
    part = tl.where(ok[None, :, :], part, 0)
    # the parts are disjoint bit fields, so their sum is their OR (and a plain sum is fast in the interpreter)
    return tl.sum(part, 2).to(tl.int32, bitcast=True)


@triton.jit
def pack_whole(codes, N_BITS: tl.constexpr):
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
def pack_period_sums(codes, N_BITS: tl.constexpr):
    """Codes [BT, CP] of N_BITS bits, N_BITS odd or twice odd and at most 15 (a pair of codes fits a word),
    CP a multiple of P -> (words,
    their word numbers in the stream [1, W], -1 for padding). The stream repeats every P = 32 / gcd(N, 32)
    codes (Q = P N / 32 words): per period, codes paired (c_2i | c_2i+1 << N), and word k the sum of the
    pairs' pieces that fall in it (shifted left, or right for a pair that began in word k - 1)."""
    BT: tl.constexpr = codes.shape[0]
    CP: tl.constexpr = codes.shape[1]
    P: tl.constexpr = 32 if N_BITS % 2 == 1 else 16
    Q: tl.constexpr = N_BITS * P // 32
    QP: tl.constexpr = 4 if Q <= 4 else (8 if Q <= 8 else 16)
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
def pack_tile(codes, L: tl.constexpr, N_BITS: tl.constexpr, WP: tl.constexpr, KP: tl.constexpr,
          SUM: tl.constexpr = True):
    """Codes [BT, CP] (CP >= L, codes beyond L zero) -> (words, their word numbers in the stream [1, W]; -1
    where unused): `pack_whole` when the codes per word are whole and fill the padded row,
    `pack_period_sums` for 3, 5, 6, 7, 9, 10, 11, 13, 14 and 15 bits over whole periods (with SUM), else
    `pack_codes` (a register gather)."""
    CP: tl.constexpr = codes.shape[1]
    if (32 % N_BITS == 0) and ((CP * N_BITS) == (WP * 32)):
        return pack_whole(codes, N_BITS), tl.arange(0, WP)[None, :]
    elif SUM and (N_BITS <= 15) and (N_BITS % 4 != 0) and (CP % (16 << (N_BITS % 2)) == 0):
        return pack_period_sums(codes, N_BITS)
    else:
        return pack_codes(codes, 0, L, N_BITS, WP, KP), tl.arange(0, WP)[None, :]


@triton.jit
def round_half_even(x):
    """Round to the nearest integer, ties to even (torch.round), for |x| < 2**22."""
    f = tl.floor(x)
    frac = x - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
    up = (frac > 0.5) | ((frac == 0.5) & odd)
    return tl.where(up, f + 1.0, f)


@triton.jit
def bf16_bits(x):
    """The bfloat16 bit pattern (as int16) of fp32 x, rounded to nearest even (NaN not preserved)."""
    b = x.to(tl.int32, bitcast=True)
    b = b + 0x7FFF + ((b >> 16) & 1)
    return (b >> 16).to(tl.int16)


@triton.jit
def bf16_value(x):
    """fp32 x rounded to the nearest bfloat16, returned as fp32."""
    b = x.to(tl.int32, bitcast=True)
    b = b + 0x7FFF + ((b >> 16) & 1)
    return (b & -65536).to(tl.float32, bitcast=True)


@triton.jit
def store_rounded(ptr, o, mask):
    """Store fp32 o in ptr's dtype, bf16 rounded to nearest even (the CPU interpreter's cast truncates)."""
    if ptr.dtype.element_ty == tl.bfloat16:
        o = bf16_value(o)
    tl.store(ptr, o.to(ptr.dtype.element_ty), mask=mask)
