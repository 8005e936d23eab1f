"""Bit-field helpers: read and write n-bit codes in the little-endian int32 word streams (formats.md)."""

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
