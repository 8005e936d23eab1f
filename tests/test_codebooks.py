"""Marginal densities, the Lloyd-Max solver and the shipped codebooks against the DESIGN section 7 oracles,
independent quadrature and Monte Carlo on random unit vectors."""

from __future__ import annotations

import functools
import logging
import math

import numpy as np
import pytest
import torch
from scipy import integrate

from octopus_audio import codebooks, marginals
from octopus_audio.cli import main
from octopus_audio.codebooks import get_codebook
from octopus_audio.lloyd_max import lloyd_max
from octopus_audio.octahedral import fold


def _unit_vectors(n: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(n, d, generator=g, dtype=torch.float64)
    return u / u.norm(dim=-1, keepdim=True)


@functools.cache
def _shared_unit_vectors(d: int) -> torch.Tensor:
    return _unit_vectors(2_000_000 // d, d, seed=d)


def _quantize(x: torch.Tensor, cb: codebooks.Codebook) -> torch.Tensor:
    return cb.centroids_f64[torch.searchsorted(cb.boundaries.double(), x.contiguous())]


# DESIGN section 7: E||u - u_hat||^2 per vector at d = 128 (turboquant-mse); the triplet-norm Lloyd-Max MSE
COORD_ORACLE_D128 = {1: 0.3609, 2: 0.1160, 3: 0.03397, 4: 0.00931}
RHO_ORACLE_D128 = {1: 1.200e-3, 2: 3.717e-4, 3: 1.058e-4, 4: 2.847e-5}


@pytest.mark.parametrize("bits", sorted(COORD_ORACLE_D128), ids=lambda b: f"b{b}")
def test_coord_lloyd_max_matches_turboquant_oracle(bits):
    fresh = lloyd_max(marginals.coord(128), bits)
    assert 128 * fresh.distortion == pytest.approx(COORD_ORACLE_D128[bits], rel=0.01)
    shipped = get_codebook("coord", 128, bits)
    assert 128 * shipped.distortion == pytest.approx(COORD_ORACLE_D128[bits], rel=0.01)


@pytest.mark.parametrize("bits", sorted(RHO_ORACLE_D128), ids=lambda b: f"b{b}")
def test_rho_lloyd_max_matches_triplet_norm_oracle(bits):
    fresh = lloyd_max(marginals.rho(128), bits)
    assert fresh.distortion == pytest.approx(RHO_ORACLE_D128[bits], rel=0.01)


@pytest.mark.parametrize("d", [16, 128, 512], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("bits", [1, 3], ids=lambda b: f"b{b}")
def test_coord_distortion_matches_monte_carlo_on_unit_vectors(d, bits):
    # guards the density: the solver's distortion must be what random unit vectors actually see
    u = _shared_unit_vectors(d)
    cb = get_codebook("coord", d, bits)
    empirical = ((u - _quantize(u, cb)) ** 2).sum(-1).mean().item()
    assert empirical == pytest.approx(d * cb.distortion, rel=0.005)


@pytest.mark.parametrize("bits", [0, 1, 2, 4], ids=lambda b: f"b{b}")
def test_rho_distortion_matches_monte_carlo_on_unit_vectors(bits):
    u = _shared_unit_vectors(128)
    rho = u[:, :126].reshape(-1, 3).norm(dim=-1)
    cb = get_codebook("rho", 128, bits)
    empirical = ((rho - _quantize(rho, cb)) ** 2).mean().item()
    assert empirical == pytest.approx(cb.distortion, rel=0.01)


@pytest.mark.parametrize("level", [2, 3, 5], ids=lambda lv: f"level{lv}")
def test_polar_distortion_matches_monte_carlo_on_unit_vectors(level):
    # the level-l angle depends only on its block of 2^l coordinates, whose direction is uniform
    u = _unit_vectors(200_000, 2**level, seed=level)
    radii = u
    for _ in range(level - 1):  # radii of the pairs of the previous level
        radii = radii.reshape(radii.shape[0], -1, 2).norm(dim=-1)
    pairs = radii.reshape(radii.shape[0], -1, 2)
    psi = torch.atan2(pairs[..., 1], pairs[..., 0])
    cb = get_codebook(f"polar{level}", None, 2)
    empirical = ((psi - _quantize(psi, cb)) ** 2).mean().item()
    assert empirical == pytest.approx(cb.distortion, rel=0.01)


def test_xi_marginal_facts():
    f = marginals.xi()
    assert f(np.array([0.0, 1.0, -1.0])) == pytest.approx([1 / math.pi] * 3, abs=1e-14)
    grid = np.linspace(0, 1, 100_001)
    values = f(grid)
    assert grid[np.argmax(values)] == pytest.approx(0.5, abs=1e-4)
    assert values.max() == pytest.approx(0.6002, abs=1e-4)
    total = integrate.quad(f, -1, 1, points=[0], epsabs=1e-13)[0]
    second = integrate.quad(lambda x: x * x * f(x), -1, 1, points=[0], epsabs=1e-13)[0]
    assert total == pytest.approx(1.0, abs=1e-10)
    assert second == pytest.approx(0.32006, abs=1e-5)


@pytest.mark.parametrize("x", [0.05, 0.3, 0.5, 0.77, 0.99])
def test_xi_marginal_equals_numerical_marginal_of_joint(x):
    kink = 1 - x  # the joint is not smooth where the fold starts
    numeric = integrate.quad(lambda e: marginals.xi_joint(np.float64(x), np.float64(e)), -1, 1,
                             points=[-kink, 0, kink], epsabs=1e-13)[0]
    assert marginals.xi()(np.float64(x)) == pytest.approx(numeric, rel=1e-10)
    assert marginals.xi()(np.float64(-x)) == pytest.approx(numeric, rel=1e-10)


def test_xi_marginal_matches_histogram_of_folded_uniform_directions():
    g = torch.Generator().manual_seed(3)
    n = torch.randn(400_000, 3, generator=g, dtype=torch.float64)
    xi, eta = fold(n)
    edges = np.linspace(-1, 1, 41)
    f = marginals.xi()
    for coord in (xi, eta):
        counts, _ = np.histogram(coord.numpy(), bins=edges)
        expected = np.array([integrate.quad(f, a, b)[0] for a, b in zip(edges[:-1], edges[1:], strict=True)])
        expected *= n.shape[0]
        z = (counts - expected) / np.sqrt(expected)
        assert np.abs(z).max() < 5, f"histogram deviates by {np.abs(z).max():.1f} sigma"


@pytest.mark.parametrize("marginal", [marginals.coord(8), marginals.coord(1024), marginals.rho(8),
                                      marginals.rho(1024), marginals.polar(1), marginals.polar(2),
                                      marginals.polar(10)], ids=lambda m: m.name)
def test_densities_integrate_to_one(marginal):
    points = np.linspace(marginal.lo, marginal.hi, 65)[1:-1]
    total = integrate.quad(marginal, marginal.lo, marginal.hi, points=points, limit=500, epsabs=1e-13)[0]
    assert total == pytest.approx(1.0, abs=1e-9)


def test_lloyd_max_fixed_point_by_independent_quadrature():
    f = marginals.xi()
    res = lloyd_max(f, 2)
    edges = np.concatenate([[-1.0], res.boundaries, [1.0]])
    for i, c in enumerate(res.centroids):
        pts = [0.0] if edges[i] < 0 < edges[i + 1] else None
        mass = integrate.quad(f, edges[i], edges[i + 1], points=pts)[0]
        first = integrate.quad(lambda x: x * f(x), edges[i], edges[i + 1], points=pts)[0]
        assert c == pytest.approx(first / mass, abs=1e-12)
    np.testing.assert_allclose(res.boundaries, (res.centroids[:-1] + res.centroids[1:]) / 2, atol=1e-15)
    distortion = sum(integrate.quad(lambda x, c=c: (x - c) ** 2 * f(x), edges[i], edges[i + 1])[0]
                     for i, c in enumerate(res.centroids))
    assert res.distortion == pytest.approx(distortion, rel=1e-9)


def test_lloyd_max_bits0_is_mean_and_variance():
    res = lloyd_max(marginals.rho(64), 0)
    mean = integrate.quad(lambda r: r * marginals.rho(64)(r), 0, 1, epsabs=1e-14)[0]
    second = integrate.quad(lambda r: r * r * marginals.rho(64)(r), 0, 1, epsabs=1e-14)[0]
    assert res.centroids[0] == pytest.approx(mean, abs=1e-12)
    assert res.distortion == pytest.approx(second - mean * mean, rel=1e-9)


@pytest.mark.parametrize("bits", [0, 1, 3, 6], ids=lambda b: f"b{b}")
def test_polar1_is_uniform_circle_codebook(bits):
    cb = get_codebook("polar1", None, bits)
    m = 2**bits
    expected = torch.tensor([(i + 0.5) * 2 * math.pi / m for i in range(m)], dtype=torch.float64)
    assert (cb.centroids_f64 - expected).abs().max().item() <= 1e-15
    solver = lloyd_max(marginals.polar(1), bits)  # the generic solver agrees with the closed form
    np.testing.assert_allclose(solver.centroids, expected.numpy(), atol=1e-9)
    assert cb.distortion == pytest.approx((2 * math.pi / m) ** 2 / 12, rel=1e-12)


@pytest.mark.parametrize("kind,d,bits", [("coord", 128, 4), ("rho", 64, 3), ("xi", None, 5),
                                         ("polar3", None, 2), ("coord", 16, 8)], ids=str)
def test_shipped_codebook_equals_fresh_computation(kind, d, bits):
    assert codebooks.check_entry(kind, d, bits) <= codebooks.CHECK_TOL


@pytest.mark.parametrize("kind,d", [("coord", 128), ("rho", 256), ("xi", None), ("polar7", None)], ids=str)
def test_codebook_layout(kind, d):
    for bits in range(9):
        cb = get_codebook(kind, d, bits)
        assert cb.centroids.dtype == torch.float32 and cb.boundaries.dtype == torch.float32
        assert cb.centroids.shape == (2**bits,) and cb.boundaries.shape == (2**bits - 1,)
        assert torch.all(cb.centroids[1:] > cb.centroids[:-1])
        assert torch.equal(cb.boundaries, (cb.centroids[1:] + cb.centroids[:-1]) / 2)
    assert get_codebook(kind, d, 3) is get_codebook(kind, d, 3)


def test_codebook_index_rule_boundary_goes_low():
    cb = get_codebook("xi", None, 2)
    x = torch.cat([cb.boundaries, cb.boundaries + 1e-6, torch.tensor([-1.0, 1.0])])
    assert cb.index(x).tolist() == [0, 1, 2, 1, 2, 3, 0, 3]


def test_unshipped_codebook_is_computed_with_a_log_line(caplog):
    codebooks._codebook.cache_clear()  # another test may have asked for it already
    with caplog.at_level(logging.INFO, logger="octopus_audio.codebooks"):
        cb = get_codebook("coord", 512, 2)
    assert "not shipped" in caplog.text
    assert 512 * cb.distortion == pytest.approx(0.1175, rel=0.02)  # tends to the Gaussian 0.1175 as d grows


@pytest.mark.parametrize("kind,d,bits,needle", [
    ("bogus", 128, 2, "allowed: coord, rho, xi, polar1..polar10"),
    ("coord", 100, 2, "power of two in 8..1024"),
    ("coord", 2048, 2, "power of two in 8..1024"),
    ("rho", None, 2, "power of two in 8..1024"),
    ("coord", 128, 9, "0..8"),
    ("xi", None, -1, "0..8"),
    ("polar11", None, 2, "polar1..polar10"),
], ids=["kind", "d100", "d2048", "rho-no-d", "bits9", "bits-neg", "polar11"])
def test_bad_codebook_requests_name_what_is_allowed(kind, d, bits, needle):
    with pytest.raises(ValueError, match=needle.replace(".", r"\.")):
        get_codebook(kind, d, bits)


def test_codebooks_command_lists_shipped_files(capsys):
    assert main(["codebooks"]) == 0
    out = capsys.readouterr().out
    assert "coord_d128.json" in out and "polar8.json" in out and "xi.json" in out


def test_shipped_files_are_small():
    total = sum(p.stat().st_size for p in codebooks.CODEBOOK_DIR.glob("*.json"))
    assert 0 < total < 1_000_000
