"""The octahedral fold/unfold, the direction table and OCTOPUS's joint rounding modes."""

from __future__ import annotations

import itertools

import pytest
import torch

from octopus_audio.codebooks import get_codebook
from octopus_audio.octahedral import decode_triplets, direction_table, fold, round_triplets, unfold


def _random_triplets(n_vectors: int, d: int, seed: int) -> torch.Tensor:
    """Triplets of random unit vectors in R^d (d % 3 leftover coordinates dropped), shape [n, 3]."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(n_vectors, d, generator=g)
    u = u / u.norm(dim=-1, keepdim=True)
    return u[:, : 3 * (d // 3)].reshape(-1, 3).contiguous()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-14)], ids=["fp32", "fp64"])
def test_fold_unfold_round_trip(dtype, tol):
    g = torch.Generator().manual_seed(0)
    n = torch.randn(5000, 3, generator=g, dtype=dtype)
    axes = torch.tensor([[1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1], [1, 1, 0],
                         [1, -1, -1], [0, -1, -1], [-1, 0, -1]], dtype=dtype)
    n = torch.cat([n, axes])
    n = n / n.norm(dim=-1, keepdim=True)
    xi, eta = fold(n)
    assert xi.abs().max() <= 1 and eta.abs().max() <= 1
    upper = n[:, 2] >= 0
    assert torch.all((xi.abs() + eta.abs())[upper] <= 1 + tol)
    assert torch.all((xi.abs() + eta.abs())[~upper] >= 1 - tol)
    assert (unfold(xi, eta) - n).abs().max().item() <= tol


def test_fold_by_hand():
    n = torch.tensor([[1.0, 2.0, -3.0], [0.0, 0.0, -1.0], [0.0, 0.0, 1.0], [-1.0, 0.0, -1.0],
                      [2.0, -1.0, 1.0]])
    xi, eta = fold(n)
    # (1,2,-3): p = (1/6, 1/3), lower: (1 - 1/3, 1 - 1/6); south pole: sign(0) = +1 gives (1, 1);
    # (-1,0,-1): p = (-1/2, 0): (-(1 - 0), +(1 - 1/2)); (2,-1,1): upper, p = (1/2, -1/4)
    expected_xi = torch.tensor([2 / 3, 1.0, 0.0, -1.0, 0.5])
    expected_eta = torch.tensor([5 / 6, 1.0, 0.0, 0.5, -0.25])
    assert (xi - expected_xi).abs().max() < 1e-6 and (eta - expected_eta).abs().max() < 1e-6


def test_fold_keeps_batch_shape():
    n = torch.randn(2, 5, 7, 3)
    xi, eta = fold(n)
    assert xi.shape == eta.shape == (2, 5, 7)
    assert unfold(xi, eta).shape == (2, 5, 7, 3)


@pytest.mark.parametrize("b_dir", [0, 1, 3, 5], ids=lambda b: f"bdir{b}")
def test_direction_table_rows(b_dir):
    table = direction_table(b_dir)
    c = get_codebook("xi", None, b_dir).centroids.double()
    m = c.numel()
    assert table.shape == (4**b_dir, 3) and table.dtype == torch.float32
    assert (table.double().norm(dim=-1) - 1).abs().max() < 1e-6
    for i_xi, i_eta in [(0, 0), (m - 1, 0), (m // 2, m - 1), (m - 1, m - 1)]:
        expected = unfold(c[i_xi], c[i_eta])
        assert (table[i_xi * m + i_eta].double() - expected).abs().max() < 1e-7


@pytest.mark.parametrize("b_dir", [2, 3, 4, 5], ids=lambda b: f"bdir{b}")
def test_local3x3_equals_full_search(b_dir):
    t = _random_triplets(10_000 // 42 + 1, 128, seed=b_dir)[:10_000]
    assert t.shape[0] == 10_000
    b_rho = b_dir - 2  # the default split (b+1, b-1)
    local = round_triplets(t, b_dir, b_rho, "local3x3", d=128)
    full = round_triplets(t, b_dir, b_rho, "full", d=128)
    for a, b in zip(local, full, strict=True):
        assert torch.equal(a, b)


def test_full_search_is_the_brute_force_optimum():
    t = _random_triplets(50, 128, seed=11).double()
    b_dir, b_rho = 2, 2
    idx = round_triplets(t, b_dir, b_rho, "full", d=128)
    err = ((decode_triplets(*idx, b_dir, b_rho, d=128).double() - t) ** 2).sum(-1)
    table = direction_table(b_dir).double()
    rho_c = get_codebook("rho", 128, b_rho).centroids.double()
    every = rho_c[None, :, None, None] * table[None, None, :, :]  # [1, R, D, 3]
    best = ((every - t[:, None, None, :]) ** 2).sum(-1).flatten(1).min(dim=1).values
    assert (err - best).abs().max().item() < 1e-7


def test_rounding_modes_rank_by_error():
    t = _random_triplets(200, 128, seed=5)
    errors = {}
    for mode in ("scalar", "local3x3", "full"):
        idx = round_triplets(t, 4, 2, mode, d=128)
        errors[mode] = ((decode_triplets(*idx, 4, 2, d=128) - t) ** 2).sum(-1)
    assert torch.all(errors["full"] <= errors["scalar"] + 1e-7)
    assert errors["local3x3"].mean() < errors["scalar"].mean()


@pytest.mark.parametrize("mode", ["scalar", "local3x3", "full"])
def test_scalar_mode_and_seeds(mode):
    t = _random_triplets(20, 64, seed=2)
    i_xi, i_eta, i_rho = round_triplets(t, 3, 1, mode, d=64)
    rho = t.norm(dim=-1)
    xi, eta = fold(t / rho[:, None])
    xi_cb, rho_cb = get_codebook("xi", None, 3), get_codebook("rho", 64, 1)
    assert i_xi.dtype == torch.int64
    if mode == "scalar":
        assert torch.equal(i_xi, xi_cb.index(xi)) and torch.equal(i_eta, xi_cb.index(eta))
        assert torch.equal(i_rho, rho_cb.index(rho))
    else:  # the chosen cell lies within one step of the seed for local3x3
        assert (i_xi - xi_cb.index(xi)).abs().max() <= (1 if mode == "local3x3" else 7)


@pytest.mark.parametrize("mode", ["scalar", "local3x3", "full"])
def test_zero_triplet_gets_placeholder_direction(mode):
    t = torch.zeros(3, 3)
    t[1] = torch.tensor([0.1, -0.2, 0.05])
    i_xi, i_eta, i_rho = round_triplets(t, 3, 2, mode, d=128)
    # the cell of (xi, eta) = (0, 0), i.e. of the direction (0, 0, 1)
    seed = get_codebook("xi", None, 3).index(torch.zeros(1)).item()
    assert (i_xi[0].item(), i_eta[0].item(), i_rho[0].item()) == (seed, seed, 0)
    assert (i_xi[2].item(), i_eta[2].item(), i_rho[2].item()) == (seed, seed, 0)


@pytest.mark.parametrize("mode", ["local3x3", "full"])
def test_ties_go_to_lowest_direction_index(mode):
    # the north pole is equidistant from the four cells around (0, 0): a four-way tie by symmetry
    m = 2**3
    t = torch.tensor([[0.0, 0.0, 0.2]])
    i_xi, i_eta, _ = round_triplets(t, 3, 2, mode, d=128)
    assert (i_xi.item(), i_eta.item()) == (m // 2 - 1, m // 2 - 1)


@pytest.mark.parametrize("shape", [(7,), (2, 3, 5), (1, 1, 1)], ids=str)
def test_batched_shapes_match_flat(shape):
    t = torch.randn(*shape, 3) * 0.2
    batched = round_triplets(t, 3, 2, d=128)
    flat = round_triplets(t.reshape(-1, 3), 3, 2, d=128)
    for a, b in zip(batched, flat, strict=True):
        assert a.shape == shape and torch.equal(a.reshape(-1), b)


@pytest.mark.parametrize("kwargs,needle", [
    ({"mode": "exact"}, "scalar, local3x3, full"),
    ({"b_dir": 9}, "0..8"),
    ({"b_rho": -1}, "0..8"),
], ids=["mode", "b_dir", "b_rho"])
def test_bad_rounding_arguments(kwargs, needle):
    args = {"b_dir": 3, "b_rho": 2, "mode": "local3x3"} | kwargs
    with pytest.raises(ValueError, match=needle.replace(".", r"\.")):
        round_triplets(torch.zeros(4, 3), args["b_dir"], args["b_rho"], args["mode"], d=128)


def test_every_pair_of_cells_is_reachable_at_b_dir_1():
    # with 2 centroids per axis (+-0.5) the 4 directions lie over the 4 quadrants; each must be chosen
    chosen = set()
    for sx, sy in itertools.product((-1.0, 1.0), repeat=2):
        t = torch.tensor([[0.3 * sx, 0.3 * sy, 0.1]])
        i_xi, i_eta, _ = round_triplets(t, 1, 1, d=128)
        chosen.add((i_xi.item(), i_eta.item()))
    assert chosen == {(0, 0), (0, 1), (1, 0), (1, 1)}
