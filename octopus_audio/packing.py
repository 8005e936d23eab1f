"""Reference bit packing: L codes of n bits per row as a little-endian bit stream of int32 words."""

from __future__ import annotations

import torch

WORD_BITS = 32


def num_words(num_codes: int, bits: int) -> int:
    """Words W = ceil(L * n / 32) that hold `num_codes` codes of `bits` bits."""
    return -(-num_codes * bits // WORD_BITS)


def _check_bits(bits: int) -> None:
    if not 0 <= bits <= WORD_BITS:
        raise ValueError(f"codes of {bits} bits cannot be packed: 0..{WORD_BITS} bits per code are supported")


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack integer codes [..., L] (each in [0, 2^bits)) into int32 words [..., ceil(L*bits/32)].

    Code j occupies stream bits [j*bits, (j+1)*bits); stream bit i is bit i % 32 of word i // 32.
    """
    _check_bits(bits)
    lead, L = codes.shape[:-1], codes.shape[-1]
    W = num_words(L, bits)
    if W == 0:
        return torch.zeros(*lead, 0, dtype=torch.int32, device=codes.device)
    codes = codes.to(torch.int64)
    shifts_N = torch.arange(bits, device=codes.device, dtype=torch.int64)
    bits_LN = ((codes[..., None] >> shifts_N) & 1).to(torch.uint8).reshape(*lead, L * bits)
    pad = W * WORD_BITS - L * bits
    if pad:
        bits_LN = torch.nn.functional.pad(bits_LN, (0, pad))
    bits_W32 = bits_LN.reshape(*lead, W, WORD_BITS).to(torch.int64)
    word_shifts = torch.arange(WORD_BITS, device=codes.device, dtype=torch.int64)
    words = (bits_W32 << word_shifts).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32)


def unpack(words: torch.Tensor, bits: int, num_codes: int) -> torch.Tensor:
    """Inverse of `pack`: int32 words [..., W] -> int64 codes [..., num_codes]."""
    _check_bits(bits)
    lead, W = words.shape[:-1], words.shape[-1]
    if W != num_words(num_codes, bits):
        raise ValueError(f"{W} words cannot hold exactly {num_codes} codes of {bits} bits "
                         f"(expected {num_words(num_codes, bits)} words)")
    if num_codes * bits == 0:
        return torch.zeros(*lead, num_codes, dtype=torch.int64, device=words.device)
    word_shifts = torch.arange(WORD_BITS, device=words.device, dtype=torch.int64)
    stream = ((words.to(torch.int64)[..., None] >> word_shifts) & 1).reshape(*lead, W * WORD_BITS)
    bits_LN = stream[..., : num_codes * bits].reshape(*lead, num_codes, bits)
    shifts_N = torch.arange(bits, device=words.device, dtype=torch.int64)
    return (bits_LN << shifts_N).sum(-1)
