"""Tests for the int32 little-endian bit-stream packing, against a bit-by-bit Python reference."""

import pytest
import torch

from octopus_audio.packing import num_words, pack, unpack


def _python_pack(codes, n):
    stream = []
    for c in codes:
        stream += [(c >> b) & 1 for b in range(n)]
    W = -(-len(stream) // 32)
    stream += [0] * (W * 32 - len(stream))
    words = []
    for w in range(W):
        v = sum(bit << i for i, bit in enumerate(stream[32 * w: 32 * w + 32]))
        words.append(v - 2**32 if v >= 2**31 else v)
    return words


@pytest.mark.parametrize("n", list(range(1, 14)) + [16, 31, 32], ids=lambda n: f"n{n}")
@pytest.mark.parametrize("L", [1, 7, 43, 64], ids=lambda L: f"L{L}")
def test_pack_matches_bitstream_and_round_trips(n, L):
    g = torch.Generator().manual_seed(n * 100 + L)
    codes = torch.randint(0, 2**n, (3, 2, L), generator=g, dtype=torch.int64)
    words = pack(codes, n)
    assert words.dtype == torch.int32 and words.shape == (3, 2, num_words(L, n))
    assert words[1, 0].tolist() == _python_pack(codes[1, 0].tolist(), n)
    assert torch.equal(unpack(words, n, L), codes)


def test_straddling_code_layout():
    # three 12-bit codes: the third straddles words 0 and 1 (bits 24..35)
    codes = torch.tensor([[0xABC, 0x123, 0xFED]])
    words = pack(codes, 12)
    assert words.shape == (1, 2)
    w0 = words[0, 0].item() & 0xFFFFFFFF
    assert w0 == 0xABC | (0x123 << 12) | ((0xFED & 0xFF) << 24)
    assert words[0, 1].item() == 0xFED >> 8


def test_zero_width_fields_and_bad_bits():
    assert pack(torch.zeros(4, 16, dtype=torch.int64), 0).shape == (4, 0)
    assert unpack(torch.zeros(4, 0, dtype=torch.int32), 0, 16).shape == (4, 16)
    with pytest.raises(ValueError, match="0..32"):
        pack(torch.zeros(2, dtype=torch.int64), 33)
    with pytest.raises(ValueError, match="expected 2 words"):
        unpack(torch.zeros(1, 3, dtype=torch.int32), 12, 3)


@pytest.mark.parametrize("n", [3, 7, 12, 31], ids=lambda n: f"n{n}")
def test_bits_above_the_width_are_dropped(n):
    """pack keeps a code's low `n` bits (as the bit stream does): codes + k * 2^n pack as the codes."""
    g = torch.Generator().manual_seed(n)
    codes = torch.randint(0, 2**n, (2, 37), generator=g, dtype=torch.int64)
    high = torch.randint(1, 8, (2, 37), generator=g, dtype=torch.int64) << n
    assert torch.equal(pack(codes + high, n), pack(codes, n))
