"""Exact 1-D densities the codecs quantize: coordinate, triplet norm, octahedral coordinate, polar angles.

Every density is normalised on its interval and evaluated in float64 on numpy arrays. They are the marginals
of a vector drawn uniformly from the unit sphere S^{d-1} (DESIGN section 2):

- `coord(d)`: one coordinate u, `f(u) = (1-u^2)^((d-3)/2) / B(1/2, (d-1)/2)` on [-1, 1]
  (u^2 ~ Beta(1/2, (d-1)/2)).
- `rho(d)`: the norm r of three coordinates, `f(r) = 2 r^2 (1-r^2)^((d-5)/2) / B(3/2, (d-3)/2)` on [0, 1]
  (r^2 ~ Beta(3/2, (d-3)/2)).
- `xi()`: the first octahedral coordinate of a direction uniform on S^2. The joint density of (xi, eta) on
  the square is `1/(4 pi ||q||^3)` (q the unfolded L1-unit point, whose face normal has L1-dot 1 with q);
  integrating over eta piecewise (inside and outside the diamond |xi|+|eta| <= 1, both quadratic in eta) gives
  the closed form `f(xi) = [ (1-x)/(3x^2-2x+1) + x/(3x^2-4x+2) ] / (pi sqrt(x^2+(1-x)^2))`, x = |xi|,
  on [-1, 1].
- `polar(level)`: level 1 is uniform on [0, 2 pi); level l >= 2 has `f(psi) ~ sin^n(2 psi)`, n = 2^(l-1)-1, on
  [0, pi/2] (each side of the pair is the norm of 2^(l-1) coordinates).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy.special import betaln


@dataclass(frozen=True)
class Marginal:
    """A normalised density on [lo, hi]; `breakpoints` are interior points where it is not smooth;
    `symmetric` means f(lo + hi - x) = f(x)."""

    name: str
    lo: float
    hi: float
    density: Callable[[np.ndarray], np.ndarray] = field(repr=False)
    breakpoints: tuple[float, ...] = ()
    symmetric: bool = False

    def __post_init__(self) -> None:
        if not self.lo < self.hi:
            raise ValueError(f"marginal {self.name}: need lo < hi, got [{self.lo}, {self.hi}]")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.density(np.asarray(x, dtype=np.float64))


def _check_d(d: int, minimum: int) -> None:
    if not isinstance(d, int) or d < minimum:
        raise ValueError(f"dimension d must be an integer >= {minimum}, got {d!r}")


def _sphere_density(lead: float, power: int, a: float, b: float, lo: float) -> Callable:
    """x -> lead * x^power * (1 - x^2)^(b - 1) / B(a, b) on [lo, 1], 0 elsewhere (x^2 ~ Beta(a, b), times the
    change of variables)."""
    log_norm = betaln(a, b)
    expo = b - 1

    def density(x: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            out = lead * x**power * np.exp(expo * np.log1p(-np.minimum(x * x, 1.0)) - log_norm)
        return np.where((x >= lo) & (x <= 1.0), out, 0.0)

    return density


def coord(d: int) -> Marginal:
    """One coordinate of a uniform unit vector in R^d."""
    _check_d(d, 3)
    density = _sphere_density(1.0, 0, 0.5, (d - 1) / 2, -1.0)
    return Marginal(f"coord(d={d})", -1.0, 1.0, density, symmetric=True)


def rho(d: int) -> Marginal:
    """Norm of three coordinates of a uniform unit vector in R^d."""
    _check_d(d, 4)
    return Marginal(f"rho(d={d})", 0.0, 1.0, _sphere_density(2.0, 2, 1.5, (d - 3) / 2, 0.0))


def xi() -> Marginal:
    """First octahedral coordinate of a direction uniform on S^2 (closed form, see the module docstring)."""

    def density(v: np.ndarray) -> np.ndarray:
        x = np.abs(v)
        s = np.sqrt(x * x + (1.0 - x) ** 2)
        out = ((1.0 - x) / (3 * x * x - 2 * x + 1) + x / (3 * x * x - 4 * x + 2)) / (math.pi * s)
        return np.where(x <= 1.0, out, 0.0)

    return Marginal("xi", -1.0, 1.0, density, breakpoints=(0.0,), symmetric=True)


def xi_joint(xi_: np.ndarray, eta: np.ndarray) -> np.ndarray:
    """Joint density of the octahedral coordinates (xi, eta) on [-1, 1]^2: 1 / (4 pi ||q(xi, eta)||^3)."""
    ax, ay = np.abs(xi_), np.abs(eta)
    z = 1.0 - ax - ay
    inside = z >= 0
    x = np.where(inside, ax, 1.0 - ay)
    y = np.where(inside, ay, 1.0 - ax)
    return 1.0 / (4 * math.pi * (x * x + y * y + z * z) ** 1.5)


def polar(level: int) -> Marginal:
    """Angle of level `level` of the recursive polar transform of a uniform unit vector."""
    if not isinstance(level, int) or level < 1:
        raise ValueError(f"polar level must be an integer >= 1, got {level!r}")
    if level == 1:
        return Marginal("polar1", 0.0, 2 * math.pi, lambda p: np.where((p >= 0) & (p <= 2 * math.pi),
                                                                         1 / (2 * math.pi), 0.0))
    n = 2 ** (level - 1) - 1
    # int_0^{pi/2} sin^n(2 psi) dpsi = B(1/2, (n+1)/2) / 2
    log_norm = betaln(0.5, (n + 1) / 2) - math.log(2.0)

    def density(p: np.ndarray) -> np.ndarray:
        s = np.clip(np.sin(2 * p), 0.0, 1.0)
        with np.errstate(divide="ignore"):
            out = np.exp(n * np.log(s) - log_norm)
        return np.where((p >= 0) & (p <= math.pi / 2), out, 0.0)

    return Marginal(f"polar{level}", 0.0, math.pi / 2, density, symmetric=True)
