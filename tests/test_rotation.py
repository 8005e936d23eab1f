"""Tests for the seeded Walsh-Hadamard rotation: orthogonality, structure, seeding, bad head dims."""

import math

import pytest
import torch

from octopus_audio import rotation


@pytest.mark.parametrize("d", [8, 32, 64, 128, 256, 1024], ids=lambda d: f"d{d}")
def test_hadamard_is_sylvester_and_orthogonal(d):
    h = rotation.hadamard(d)
    assert torch.equal(h, h.T)
    assert torch.equal(h @ h, d * torch.eye(d))
    # Sylvester entry: H[i, j] = (-1)^popcount(i & j)
    i, j = 5 % d, 7 % d
    assert h[i, j].item() == (-1) ** bin(i & j).count("1")
    assert h[0].eq(1).all() and h[:, 0].eq(1).all()


@pytest.mark.parametrize("shape", [(16, 64), (3, 2, 5, 64), (1, 4, 33, 128)], ids=str)
def test_rotate_unrotate_round_trip_and_norm(shape):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g)
    s = rotation.head_signs(7, rotation.num_heads_of(x), shape[-1])
    y = rotation.rotate(x, s)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rotation.unrotate(y, s), x, rtol=1e-5, atol=1e-5)


def test_rotate_matches_explicit_matrix_per_head():
    d, H = 32, 3
    x = torch.randn(2, H, 4, d)
    s = rotation.head_signs(1, H, d)
    y = rotation.rotate(x, s)
    for h in range(H):
        R = rotation.hadamard(d) @ torch.diag(s[h]) / math.sqrt(d)
        torch.testing.assert_close(y[:, h], x[:, h] @ R.T, rtol=1e-5, atol=1e-5)


def test_inner_product_preserved():
    d = 64
    q, k = torch.randn(2, 1, 5, d), torch.randn(2, 1, 7, d)
    s = rotation.head_signs(3, 1, d)
    scores = rotation.rotate(q, s) @ rotation.rotate(k, s).mT
    torch.testing.assert_close(scores, q @ k.mT, rtol=1e-4, atol=1e-4)


def test_sign_vectors_deterministic_and_distinct():
    d = 128
    a = rotation.sign_vector(0, 0, d)
    assert torch.equal(a, rotation.sign_vector(0, 0, d))
    assert set(a.unique().tolist()) == {-1.0, 1.0}
    others = [rotation.sign_vector(0, 1, d), rotation.sign_vector(1, 0, d),
              rotation.sign_vector(0, 0, d, stream=1), rotation.sign_vector(rotation.layer_seed(0, 1), 0, d)]
    for b in others:
        assert not torch.equal(a, b)
    assert rotation.layer_seed(0, 3) != rotation.layer_seed(1, 3) != rotation.layer_seed(1, 4)
    assert rotation.layer_seed(2, 5) == 2 * 1_000_003 + 5


@pytest.mark.parametrize("d", [0, 4, 48, 100, 2048], ids=lambda d: f"d{d}")
def test_bad_head_dim_names_what_is_supported(d):
    with pytest.raises(ValueError, match="power of two from 8 to 1024"):
        rotation.check_head_dim(d)
