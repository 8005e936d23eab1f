"""Lloyd-Max scalar quantizer for a 1-D density on an interval (quadrature, Newton-accelerated Lloyd steps).

The quantizer with m = 2^bits levels minimises E[(X - Q(X))^2]. At its fixed point every boundary is the
midpoint of its two neighbouring centroids and every centroid is the conditional mean of its cell. Plain Lloyd
steps converge linearly, at a rate that approaches 1 as m grows (tens of thousands of steps at m = 256), so
after a few Lloyd steps from a quantile start we solve the fixed-point equations on the boundaries by damped
Newton (the Jacobian is tridiagonal), then run Lloyd steps until the relative distortion change is below
`tol`.

Integrals use 16-point Gauss-Legendre on every piece of a fine grid (uniform panels, the density's breakpoints
and the current boundaries), with moments taken about each cell's midpoint so narrow cells keep their digits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import solve_banded

from octopus_audio.marginals import Marginal

_GL_X, _GL_W = np.polynomial.legendre.leggauss(16)


@dataclass(frozen=True)
class LloydMaxResult:
    """centroids (m,) ascending, boundaries (m-1,) = midpoints, distortion E[(X - Q(X))^2], iterations run."""

    centroids: np.ndarray
    boundaries: np.ndarray
    distortion: float
    iterations: int


class _CellIntegrals:
    """Mass, conditional mean and within-cell squared error of every cell, by composite Gauss-Legendre."""

    def __init__(self, marginal: Marginal, panels: int) -> None:
        grid = np.linspace(marginal.lo, marginal.hi, panels + 1)
        inner = [b for b in marginal.breakpoints if marginal.lo < b < marginal.hi]
        self.edges = np.unique(np.concatenate([grid, np.asarray(inner, dtype=np.float64)]))
        self.marginal = marginal

    def __call__(self, boundaries: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        m = boundaries.size + 1
        lo, hi = self.marginal.lo, self.marginal.hi
        pts = np.sort(np.concatenate([self.edges, boundaries]))
        a, b = pts[:-1], pts[1:]
        cell = np.searchsorted(boundaries, 0.5 * (a + b), side="right")  # the cell each piece lies in
        cell_edges = np.concatenate([[lo], boundaries, [hi]])
        mid = 0.5 * (cell_edges[:-1] + cell_edges[1:])
        half = 0.5 * (b - a)
        x = (0.5 * (a + b))[:, None] + half[:, None] * _GL_X[None, :]
        w = half[:, None] * _GL_W[None, :] * self.marginal(x)
        y = x - mid[cell][:, None]
        m0 = np.bincount(cell, w.sum(1), minlength=m)
        m1 = np.bincount(cell, (w * y).sum(1), minlength=m)
        m2 = np.bincount(cell, (w * y * y).sum(1), minlength=m)
        if np.any(m0 <= 0):
            raise RuntimeError(f"Lloyd-Max on {self.marginal.name}: a cell has no probability mass")
        mean = mid + m1 / m0
        sq_err = np.maximum(m2 - m1 * m1 / m0, 0.0)
        return m0, mean, sq_err


def _quantile_start(marginal: Marginal, integrals: _CellIntegrals, m: int) -> np.ndarray:
    """Boundaries halfway between the (i + 1/2)/m quantiles: a start inside the basin of the fixed point."""
    e = integrals.edges
    half = 0.5 * (e[1:] - e[:-1])
    x = (0.5 * (e[1:] + e[:-1]))[:, None] + half[:, None] * _GL_X[None, :]
    mass = (half[:, None] * _GL_W[None, :] * marginal(x)).sum(1)
    cdf = np.concatenate([[0.0], np.cumsum(mass)])
    cdf /= cdf[-1]
    keep = np.concatenate([[True], np.diff(cdf) > 0])  # np.interp needs strictly increasing x
    centroids = np.interp((np.arange(m) + 0.5) / m, cdf[keep], e[keep])
    return 0.5 * (centroids[:-1] + centroids[1:])


def _valid(boundaries: np.ndarray, lo: float, hi: float) -> bool:
    return bool(boundaries[0] > lo and boundaries[-1] < hi and np.all(np.diff(boundaries) > 0))


def _newton(marginal: Marginal, integrals: _CellIntegrals, boundaries: np.ndarray,
            max_steps: int = 100) -> np.ndarray:
    lo, hi = marginal.lo, marginal.hi
    scale = hi - lo
    for _ in range(max_steps):
        mass, mean, _ = integrals(boundaries)
        resid = boundaries - 0.5 * (mean[:-1] + mean[1:])
        norm = np.max(np.abs(resid))
        if norm < 1e-15 * scale:
            break
        edges = np.concatenate([[lo], boundaries, [hi]])
        f_edges = marginal(edges)
        d_lower = f_edges[:-1] * (mean - edges[:-1]) / mass  # d mean_i / d (lower edge of cell i)
        d_upper = f_edges[1:] * (edges[1:] - mean) / mass  # d mean_i / d (upper edge of cell i)
        n = boundaries.size
        band = np.zeros((3, n))
        band[1] = 1.0 - 0.5 * (d_upper[:-1] + d_lower[1:])
        band[0, 1:] = -0.5 * d_upper[1:-1]  # J[j, j+1]: boundary j+1 is the upper edge of cell j+1
        band[2, :-1] = -0.5 * d_lower[1:-1]  # J[j+1, j]: boundary j is the lower edge of cell j+1
        step = solve_banded((1, 1), band, -resid)
        t = 1.0
        while t > 1e-8:
            trial = boundaries + t * step
            if _valid(trial, lo, hi):
                _, mean_t, _ = integrals(trial)
                if np.max(np.abs(trial - 0.5 * (mean_t[:-1] + mean_t[1:]))) < norm:
                    boundaries = trial
                    break
            t *= 0.5
        else:
            break  # Newton stalled (only near the round-off floor); Lloyd steps finish the job
    return boundaries


def _symmetrize(values: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return 0.5 * (values + (lo + hi - values[::-1]))


def lloyd_max(marginal: Marginal, bits: int, *, tol: float = 1e-10, panels: int = 2048,
              max_lloyd_steps: int = 100_000) -> LloydMaxResult:
    """Lloyd-Max quantizer with 2^bits levels for `marginal`; iterates until |D_k - D_{k-1}| <= tol * D_k.

    bits = 0 gives the single centroid E[X] with distortion Var[X]. A symmetric density gets an exactly
    symmetric codebook. Raises RuntimeError if the Lloyd steps do not converge.
    """
    if not isinstance(bits, int) or not 0 <= bits <= 12:
        raise ValueError(f"bits must be an integer in 0..12, got {bits!r}")
    lo, hi = marginal.lo, marginal.hi
    integrals = _CellIntegrals(marginal, panels)
    m = 2**bits
    if m == 1:
        _, mean, sq_err = integrals(np.zeros(0))
        if marginal.symmetric:
            mean = np.array([0.5 * (lo + hi)])
        return LloydMaxResult(mean, np.zeros(0), float(sq_err.sum()), 0)

    boundaries = _quantile_start(marginal, integrals, m)
    for _ in range(20):  # a few Lloyd steps before Newton
        _, mean, _ = integrals(boundaries)
        boundaries = 0.5 * (mean[:-1] + mean[1:])
    boundaries = _newton(marginal, integrals, boundaries)
    if marginal.symmetric:
        boundaries = _symmetrize(boundaries, lo, hi)

    previous = np.inf
    for step in range(1, max_lloyd_steps + 1):
        _, centroids, sq_err = integrals(boundaries)
        if marginal.symmetric:
            centroids = _symmetrize(centroids, lo, hi)
        distortion = float(sq_err.sum())
        boundaries = 0.5 * (centroids[:-1] + centroids[1:])
        if abs(previous - distortion) <= tol * distortion:
            # the exact distortion of these centroids with their midpoint cells
            mass, mean, sq_err = integrals(boundaries)
            final = float(np.sum(sq_err + mass * (mean - centroids) ** 2))
            return LloydMaxResult(centroids, boundaries, final, step)
        previous = distortion
    raise RuntimeError(f"Lloyd-Max on {marginal.name} with {bits} bits did not converge in {max_lloyd_steps} "
                       f"steps (last relative change {abs(previous - distortion) / distortion:.3g})")
