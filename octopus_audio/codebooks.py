"""Lloyd-Max codebooks of every codec: shipped as JSON in octopus_audio/codebooks/, else computed on demand;
also the `octopus-audio codebooks` command (list, --regenerate, --check).

Kinds (the density each is optimal for is in `octopus_audio.marginals`):
- "coord" (d, bits): a rotated coordinate, turboquant.
- "rho" (d, bits): the norm of a triplet, octopus.
- "xi" (bits): an octahedral coordinate, octopus (used for both xi and eta).
- "polar1" .. "polar10" (bits): the polarquant angle of that level; level 1 is uniform on the circle, with
  centroids (i + 1/2) 2 pi / 2^bits (docs/formats.md).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from octopus_audio.errors import UsageError

log = logging.getLogger(__name__)

CODEBOOK_DIR = Path(__file__).with_name("codebooks")
MAX_BITS = 8
ALLOWED_D = tuple(2**k for k in range(3, 11))  # 8 .. 1024
MAX_POLAR_LEVEL = 10  # log2(1024)
D_KINDS = ("coord", "rho")
KINDS = D_KINDS + ("xi",) + tuple(f"polar{level}" for level in range(1, MAX_POLAR_LEVEL + 1))
SHIPPED_D = (16, 32, 64, 128, 256)
SHIPPED_POLAR_LEVELS = tuple(range(1, 9))
CHECK_TOL = 1e-9


@dataclass(frozen=True, eq=False)
class Codebook:
    """A scalar codebook. centroids: float32 [2^bits] ascending; boundaries: float32 [2^bits - 1], the fp32
    midpoints (c_i + c_{i+1}) / 2; distortion: E[(X - Q(X))^2] under the kind's density (float64 centroids);
    d is None for kinds that do not depend on the dimension."""

    kind: str
    d: int | None
    bits: int
    centroids: torch.Tensor
    boundaries: torch.Tensor
    distortion: float
    centroids_f64: torch.Tensor = field(repr=False)

    def __post_init__(self) -> None:
        m = 2**self.bits
        if self.centroids.shape != (m,) or self.boundaries.shape != (m - 1,):
            raise ValueError(f"codebook {self.kind} bits={self.bits}: expected {m} centroids and "
                             f"{m - 1} boundaries, got {tuple(self.centroids.shape)} and "
                             f"{tuple(self.boundaries.shape)}")

    def index(self, x: torch.Tensor) -> torch.Tensor:
        """Nearest-centroid index: #{i : x > boundary_i} (a value on a boundary goes to the lower index)."""
        return torch.searchsorted(self.boundaries.to(x.device), x.float().contiguous(), right=False)


def _validate(kind: str, d: int | None, bits: int) -> None:
    if kind not in KINDS:
        raise ValueError(f"codebook kind {kind!r} is unknown; allowed: coord, rho, xi, "
                         f"polar1..polar{MAX_POLAR_LEVEL}")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 0 <= bits <= MAX_BITS:
        raise ValueError(f"codebook bits must be an integer in 0..{MAX_BITS}, got {bits!r}")
    if kind in D_KINDS or d is not None:
        if isinstance(d, bool) or not isinstance(d, int) or d not in ALLOWED_D:
            raise ValueError(f"codebook dimension d must be a power of two in 8..1024, got {d!r}")


def _file_name(kind: str, d: int | None) -> str:
    return f"{kind}_d{d}.json" if kind in D_KINDS else f"{kind}.json"


def _marginal(kind: str, d: int | None):
    """The density of `kind` (octopus_audio.marginals, imported here: scipy is only needed to compute)."""
    from octopus_audio import marginals

    if kind == "coord":
        return marginals.coord(d)
    if kind == "rho":
        return marginals.rho(d)
    if kind == "xi":
        return marginals.xi()
    return marginals.polar(int(kind.removeprefix("polar")))


def compute(kind: str, d: int | None, bits: int) -> tuple[np.ndarray, float]:
    """Fresh float64 centroids and distortion (no cache, no shipped file)."""
    _validate(kind, d, bits)
    if kind == "polar1":  # uniform on the circle: exact
        m = 2**bits
        width = 2 * math.pi / m
        return (np.arange(m) + 0.5) * width, width * width / 12
    from octopus_audio.lloyd_max import lloyd_max

    result = lloyd_max(_marginal(kind, d if kind in D_KINDS else None), bits)
    return result.centroids, result.distortion


@functools.cache
def _shipped(kind: str, d: int | None) -> dict[int, tuple[np.ndarray, float]]:
    path = CODEBOOK_DIR / _file_name(kind, d)
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {int(b): (np.asarray(e["centroids"], dtype=np.float64), float(e["distortion"]))
            for b, e in data["codebooks"].items()}


@functools.cache
def _codebook(kind: str, d: int | None, bits: int) -> Codebook:
    entry = _shipped(kind, d).get(bits)
    if entry is None:
        log.info("codebook %s d=%s bits=%d is not shipped; computing it now", kind, d, bits)
        entry = compute(kind, d, bits)
    c64, distortion = entry
    c32 = torch.tensor(c64, dtype=torch.float32)
    boundaries = ((c32[:-1] + c32[1:]) / 2).contiguous()
    return Codebook(kind, d, bits, c32, boundaries, distortion, torch.tensor(c64, dtype=torch.float64))


def get_codebook(kind: str, d: int | None, bits: int) -> Codebook:
    """The codebook of `kind` for dimension d with 2^bits levels (cached). d is ignored (may be None) for
    "xi" and "polar<l>", which depend on bits only; raises ValueError naming what is allowed."""
    _validate(kind, d, bits)
    return _codebook(kind, d if kind in D_KINDS else None, bits)


def shipped_entries() -> list[tuple[str, int | None]]:
    """(kind, d) of every shipped file, each holding bits 0..MAX_BITS."""
    entries: list[tuple[str, int | None]] = [(k, d) for k in D_KINDS for d in SHIPPED_D]
    entries.append(("xi", None))
    entries += [(f"polar{level}", None) for level in SHIPPED_POLAR_LEVELS]
    return entries


def _density_text(kind: str, d: int | None) -> str:
    return "uniform on [0, 2pi)" if kind == "polar1" else _marginal(kind, d).name


def _write(kind: str, d: int | None, results: dict[int, tuple[np.ndarray, float]]) -> Path:
    payload = {
        "kind": kind,
        "d": d,
        "density": _density_text(kind, d),
        "codebooks": {str(b): {"distortion": dist, "centroids": [float(c) for c in cents]}
                      for b, (cents, dist) in sorted(results.items())},
    }
    path = CODEBOOK_DIR / _file_name(kind, d)
    path.write_text(json.dumps(payload, separators=(",", ":")) + "\n")
    return path


def regenerate(progress: bool = True) -> list[Path]:
    """Recompute every shipped codebook and rewrite its file."""
    from tqdm import tqdm

    CODEBOOK_DIR.mkdir(exist_ok=True)
    jobs = [(k, d, b) for k, d in shipped_entries() for b in range(MAX_BITS + 1)]
    results: dict[tuple[str, int | None], dict[int, tuple[np.ndarray, float]]] = {}
    for kind, d, bits in tqdm(jobs, desc="codebooks", disable=not progress):
        results.setdefault((kind, d), {})[bits] = compute(kind, d, bits)
    paths = [_write(kind, d, res) for (kind, d), res in results.items()]
    _shipped.cache_clear()
    _codebook.cache_clear()
    return paths


def check_entry(kind: str, d: int | None, bits: int) -> float:
    """Largest difference between the shipped entry and a fresh computation (centroids absolute, distortion
    relative); raises LookupError if the entry is not shipped."""
    entry = _shipped(kind, d).get(bits)
    if entry is None:
        raise LookupError(f"codebook {kind} d={d} bits={bits} is not shipped")
    fresh_c, fresh_dist = compute(kind, d, bits)
    shipped_c, shipped_dist = entry
    if fresh_c.shape != shipped_c.shape:
        return math.inf
    return max(float(np.max(np.abs(fresh_c - shipped_c))), abs(fresh_dist - shipped_dist) / fresh_dist)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--regenerate", action="store_true",
                       help="recompute every shipped codebook and rewrite it")
    group.add_argument("--check", action="store_true",
                       help=f"verify the shipped codebooks equal a fresh computation to {CHECK_TOL:g}")


def run(args: argparse.Namespace) -> int:
    if args.regenerate:
        paths = regenerate()
        total = sum(p.stat().st_size for p in paths)
        print(f"wrote {len(paths)} files ({total / 1024:.0f} KiB) to {CODEBOOK_DIR}")
        return 0
    if args.check:
        from tqdm import tqdm

        jobs = [(k, d, b) for k, d in shipped_entries() for b in range(MAX_BITS + 1)]
        bad = []
        for kind, d, bits in tqdm(jobs, desc="checking"):
            try:
                diff = check_entry(kind, d, bits)
            except LookupError as e:
                bad.append(str(e))
                continue
            if not diff <= CHECK_TOL:
                bad.append(f"{kind} d={d} bits={bits}: differs by {diff:.3g}")
        for line in bad:
            print(line)
        print(f"{len(jobs) - len(bad)} of {len(jobs)} shipped codebooks match a fresh computation")
        return 1 if bad else 0
    rows = []
    for kind, d in shipped_entries():
        path = CODEBOOK_DIR / _file_name(kind, d)
        if not path.exists():
            raise UsageError(f"the shipped codebook file {path.name} is missing; run "
                             f"`octopus-audio codebooks --regenerate`")
        bits = sorted(_shipped(kind, d))
        rows.append(f"{path.name:<18} {kind:<7} d={str(d or '-'):<5} bits {bits[0]}..{bits[-1]}  "
                    f"{path.stat().st_size / 1024:6.1f} KiB  {_density_text(kind, d)}")
    print("\n".join(rows))
    print("other (kind, d, bits) with d a power of two in 8..1024, bits 0..8, polar levels up to 10 are "
          "computed on demand")
    return 0
