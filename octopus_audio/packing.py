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


def _layout(num_codes: int, bits: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(word, shift) [num_codes]: code j starts at stream bit j * bits, bit `shift` of word `word`."""
    start = torch.arange(num_codes, device=device, dtype=torch.int64) * bits
    return start // WORD_BITS, start % WORD_BITS


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack integer codes [..., L] (each in [0, 2^bits); higher bits are dropped) into int32 words
    [..., ceil(L*bits/32)].

    Code j occupies stream bits [j*bits, (j+1)*bits); stream bit i is bit i % 32 of word i // 32. So code j,
    shifted left by its start's `shift` in word `word`, puts its low 32 bits into that word and the rest into
    the next (a code straddling two words); codes never share a bit, so adding them is or-ing them.
    """
    _check_bits(bits)
    lead, L = codes.shape[:-1], codes.shape[-1]
    W = num_words(L, bits)
    if W == 0:
        return torch.zeros(*lead, 0, dtype=torch.int32, device=codes.device)
    word, shift = _layout(L, bits, codes.device)
    shifted = (codes.to(torch.int64) & ((1 << bits) - 1)) << shift  # < 2^63: bits + shift <= 63
    words = torch.zeros(*lead, W + 1, dtype=torch.int64, device=codes.device)
    if WORD_BITS % bits:  # some code straddles two words
        words.scatter_add_(-1, word.expand(*lead, L), shifted & 0xFFFFFFFF)
        words.scatter_add_(-1, (word + 1).expand(*lead, L), shifted >> WORD_BITS)
    else:  # codes tile the words: each lies in one
        words.scatter_add_(-1, word.expand(*lead, L), shifted)
    words = words[..., :W]  # word W only ever receives zeros
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack(words: torch.Tensor, bits: int, num_codes: int) -> torch.Tensor:
    """Inverse of `pack`: int32 words [..., W] -> int64 codes [..., num_codes] (each code: its start word
    shifted right, or-ed with the next word shifted left into the bits above, masked to `bits` bits)."""
    _check_bits(bits)
    lead, W = words.shape[:-1], words.shape[-1]
    if W != num_words(num_codes, bits):
        raise ValueError(f"{W} words cannot hold exactly {num_codes} codes of {bits} bits "
                         f"(expected {num_words(num_codes, bits)} words)")
    if num_codes * bits == 0:
        return torch.zeros(*lead, num_codes, dtype=torch.int64, device=words.device)
    unsigned = words.to(torch.int64) & 0xFFFFFFFF
    word, shift = _layout(num_codes, bits, words.device)
    if WORD_BITS % bits == 0:  # codes tile the words: none straddles
        return (unsigned.index_select(-1, word) >> shift) & ((1 << bits) - 1)
    unsigned = torch.nn.functional.pad(unsigned, (0, 1))  # a zero word past the end
    low = unsigned.index_select(-1, word) >> shift
    high = unsigned.index_select(-1, word + 1) << (WORD_BITS - shift)  # wraps past bit 63: masked off below
    return (low | high) & ((1 << bits) - 1)
