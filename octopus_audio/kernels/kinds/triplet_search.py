"""The triplet kind's search tables: the local3x3 candidates that can win in each region of the octahedral
grid, and the lookup table that places a folded coordinate in its region (built on the host, read by the key
encode).

Regions: with pruning (b_dir <= PRUNE_MAX_DIR_BITS) a region is a half-cell: the xi axis is cut at the xi
boundaries and at the xi centroids (2M - 1 thresholds, M = 2^b_dir), so the seed cell is region >> 1 and a
region is one quarter of a seed cell. Its candidates are those of the seed's clamped 3x3 (duplicates dropped)
that come within MARGIN of the best score of that 3x3 somewhere in the region widened by MARGIN: the others
lose to a listed candidate by more than MARGIN everywhere a seed can place the triplet, far beyond any fp32
rounding, so the best listed candidate is the reference's local3x3 choice. Deciding it is exact 2-D geometry:
on each piece of the folded square where the octahedral unfolding is affine (a quadrant's upper or lower
half), "candidate k scores within MARGIN of candidate m" is a half-plane in (xi, eta), and k is kept when the
region's piece clipped by all its half-planes is not empty (float64 polygon clipping, conservative: a piece
that degenerates to a segment or a point still keeps k). At most 4 candidates survive per region up to
b_dir = 6 (6 at 7 and 8). Without pruning a region is a seed cell listing its whole clamped 3x3.

Each region's row lists its candidates' flat direction indices in increasing order (the reference's tie
rule), FIELD bits each (`field_bits`: 8 up to b_dir = 3, 16 up to 7, 32 beyond), padded with M*M, whose
direction is NaN (a NaN score never wins and never counts as the runner-up). The kernel reads a triplet's row
(one word, two at 16 bits) and then each candidate's direction (n_x, n_y, n_z, 0) from a table of M*M + 1
16-byte rows: at b_dir = 3 (octopus b=2) the two tables are 1 KB each, so a warp's gathers meet at most 8
of their 128-byte lines (the L1's tag lookups, not the instructions, bounded the key encode on the H200 with
16 KB rows of directions).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

PRUNE_MAX_DIR_BITS = 5  # pruned regions up to 32 x 32 cells (about 4 s of host clipping at 32; 4x per bit)
MARGIN = 1e-5  # region widening (folded units) and score slack (L1-normalised triplets) of the pruning
RHO_LOOKUP_BITS = 3  # from 7 rho boundaries the lookup (2 loads' worth) beats a compare per boundary
LUT_EDGE_GUARD = 2.0**-22  # no threshold this close below a lookup cell's upper edge (fp32 rounding of x + 1)
MAX_LUT_SCALE = 1 << 12  # lookup cells of 1/4096 at the finest (8193 rows of 8 bytes)


def field_bits(b_dir: int) -> int:
    """Bits a candidate's flat index takes in a row: the M*M directions and the padding index M*M fit."""
    return 8 if 4**b_dir < 255 else 16 if 4**b_dir < 65535 else 32


def row_words(k: int, b_dir: int) -> int:
    """32-bit words a region's row of k candidates takes."""
    return -(-k * field_bits(b_dir) // 32)


def dir_offset(regions: int, k: int, b_dir: int) -> int:
    """Where the direction rows start in `TripletSearchTables.table` (fp32 elements; 16-byte aligned)."""
    return -(-regions * regions * row_words(k, b_dir) // 4) * 4


@dataclass(frozen=True)
class TripletSearchTables:
    """table fp32 [dir_offset + 4 (M*M + 1)]: from 0 the rows [R*R, row_words] (row rx * R + ry; int32 words
    stored as fp32 bits: candidate j in bits [F j mod 32, + F) of word F j // 32, F = field_bits), then the
    direction rows [M*M + 1, 4] (n_x, n_y, n_z, 0) of the direction table's fp32 vectors, row M*M NaN.
    lut [2L + 1, 2] fp32: for lookup cell j (x in [j/L - 1, (j+1)/L - 1)), the one region threshold in it
    (+inf if none) and, as int32 bits, the number of thresholds below the cell; so region(x) = lut[j, 1] +
    (x > lut[j, 0]) with j = min(floor((x + 1) L), 2L). half: regions are half-cells (seed = region >> 1).
    Rows 2L + 1 on: the same lookup of the rho index (the number of rho boundaries below a score in [-1, 1])
    at scale rho_scale, when the rho codebook has at least RHO_LOOKUP_BITS bits (else rho_scale 0, no
    rows)."""

    table: torch.Tensor
    lut: torch.Tensor
    k: int
    lut_scale: int
    half: bool
    b_dir: int
    rho_scale: int = 0

    @property
    def regions(self) -> int:
        """R: regions per axis."""
        return (1 << self.b_dir) << int(self.half)

    def rows(self) -> torch.Tensor:
        """[R*R, k] int64: each region's candidate flat indices (M*M: padding), unpacked from the table."""
        words = self.table[: self.regions**2 * row_words(self.k, self.b_dir)].view(torch.int32)
        words = words.long().reshape(self.regions**2, -1) & 0xFFFFFFFF
        f = field_bits(self.b_dir)
        j = torch.arange(self.k, device=words.device)
        return (words[:, (f * j) // 32] >> ((f * j) % 32)) & ((1 << f) - 1)

    def directions(self) -> torch.Tensor:
        """[M*M + 1, 4] fp32: the direction rows (row M*M NaN)."""
        return self.table[dir_offset(self.regions, self.k, self.b_dir):].reshape(-1, 4)


def _clip(poly: list, a: float, b: float, c: float) -> list:
    """The convex polygon `poly` (vertex list) cut to a x + b y + c >= 0 (Sutherland-Hodgman, one edge)."""
    out = []
    for i, p in enumerate(poly):
        q = poly[(i + 1) % len(poly)]
        fp, fq = a * p[0] + b * p[1] + c, a * q[0] + b * q[1] + c
        if fp >= 0:
            out.append(p)
        if (fp >= 0) != (fq >= 0):
            w = fp / (fp - fq)
            out.append((p[0] + w * (q[0] - p[0]), p[1] + w * (q[1] - p[1])))
    return out


def _affine_pieces(x0: float, x1: float, y0: float, y1: float):
    """(polygon, A): the rectangle [x0, x1] x [y0, y1] cut into the pieces of the folded square where the
    unfolded point p = A @ (xi, eta, 1) is affine: per quadrant (signs sx, sy) the upper half
    p = (xi, eta, 1 - |xi| - |eta|) and the lower half
    p = (sx (1 - |eta|), sy (1 - |xi|), 1 - |xi| - |eta|)."""
    rect = [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]
    for sx in (1.0, -1.0):
        for sy in (1.0, -1.0):
            quad = _clip(_clip(rect, sx, 0.0, 0.0), 0.0, sy, 0.0)
            if not quad:
                continue
            upper = _clip(quad, -sx, -sy, 1.0)
            if upper:
                yield upper, np.array([[1, 0, 0], [0, 1, 0], [-sx, -sy, 1]], dtype=np.float64)
            lower = _clip(quad, sx, sy, -1.0)
            if lower:
                yield lower, np.array([[0, -sx * sy, sx], [-sx * sy, 0, sy], [-sx, -sy, 1]], dtype=np.float64)


def _can_win(k: int, others: list[int], pieces: list, dirs: np.ndarray) -> bool:
    """Whether candidate k scores within MARGIN of every other candidate somewhere on the pieces."""
    for poly, a in pieces:
        for m in others:
            g = (dirs[k] - dirs[m]) @ a  # (n_k - n_m) . p as coefficients of (xi, eta, 1)
            poly = _clip(poly, g[0], g[1], g[2] + MARGIN)
            if not poly:
                break
        if poly:
            return True
    return False


def _thresholds(centroids: np.ndarray, boundaries: np.ndarray, half: bool) -> np.ndarray:
    return np.sort(np.concatenate([boundaries, centroids])) if half else boundaries


@functools.lru_cache(maxsize=16)
def _candidate_lists(centroids: tuple, boundaries: tuple, directions: bytes, half: bool) -> tuple:
    """Per region (row-major rx * R + ry) the tuple of its candidates' flat indices (increasing)."""
    c, b = np.array(centroids), np.array(boundaries)
    m = c.size
    dirs = np.frombuffer(directions, dtype=np.float32).reshape(m * m, 3).astype(np.float64)
    edges = np.concatenate([[-1.0], _thresholds(c, b, half), [1.0]])
    lists = []
    for rx in range(edges.size - 1):
        for ry in range(edges.size - 1):
            ix, iy = (rx >> 1, ry >> 1) if half else (rx, ry)
            cand = sorted({min(max(ix + dx, 0), m - 1) * m + min(max(iy + dy, 0), m - 1)
                           for dx in (-1, 0, 1) for dy in (-1, 0, 1)})
            if half:
                pieces = list(_affine_pieces(edges[rx] - MARGIN, edges[rx + 1] + MARGIN,
                                             edges[ry] - MARGIN, edges[ry + 1] + MARGIN))
                cand = [k for k in cand if _can_win(k, [j for j in cand if j != k], pieces, dirs)]
            lists.append(tuple(cand))
    return tuple(lists)


def _lookup(thresholds: np.ndarray) -> tuple[torch.Tensor, int] | None:
    """(lut [2L + 1, 2] fp32, L): the smallest power of two L up to MAX_LUT_SCALE whose cells of width 1/L
    hold at most one threshold each and none within LUT_EDGE_GUARD below a cell's upper edge (where fp32
    rounding of (x + 1) L may already give the next cell); None where there is none (a threshold just below
    a dyadic edge stays below it at every finer scale)."""
    t = thresholds.astype(np.float64)
    scale = 2
    while True:
        cell = np.floor((t + 1.0) * scale).astype(np.int64)
        upper = (cell + 1) / scale - 1.0
        if np.unique(cell).size == cell.size and not np.any(upper - t < LUT_EDGE_GUARD):
            break
        scale *= 2
        if scale > MAX_LUT_SCALE:
            return None
    j = np.arange(2 * scale + 1)
    thr = np.full(j.size, np.inf, dtype=np.float32)
    thr[cell] = thresholds.astype(np.float32)
    below = np.searchsorted(t, j / scale - 1.0, side="left").astype(np.int32)  # thresholds < the cell's start
    lut = torch.stack([torch.from_numpy(thr), torch.from_numpy(below).view(torch.float32)], 1)
    return lut.contiguous(), scale


def search_tables(directions: torch.Tensor, centroids: torch.Tensor, boundaries: torch.Tensor,
                  rho_boundaries: torch.Tensor, device: torch.device | None = None) -> TripletSearchTables:
    """The tables of one direction grid: `directions` [M*M, 3] fp32 (row i_xi * M + i_eta), the xi codebook's
    M centroids and M - 1 boundaries (ascending), and the rho codebook's boundaries (ascending, in (0, 1)),
    on `device` (default: the directions')."""
    m = centroids.numel()
    c = centroids.detach().double().cpu().numpy()
    b = boundaries.detach().double().cpu().numpy()
    dirs32 = directions.detach().float().cpu().contiguous()
    if tuple(dirs32.shape) != (m * m, 3) or b.size != m - 1:
        raise ValueError(f"a direction grid of {m} xi centroids needs {m - 1} boundaries and a [{m * m}, 3] "
                         f"direction table, got {b.size} and {tuple(dirs32.shape)}")
    half = m <= 1 << PRUNE_MAX_DIR_BITS
    lists = _candidate_lists(tuple(c), tuple(b), dirs32.numpy().tobytes(), half)
    k = max(len(cand) for cand in lists)
    b_dir = m.bit_length() - 1
    f = field_bits(b_dir)
    flat = np.full((len(lists), k), m * m, dtype=np.uint64)
    for r, cand in enumerate(lists):
        flat[r, : len(cand)] = cand
    words = np.zeros((len(lists), row_words(k, b_dir)), dtype=np.uint64)
    for j in range(k):
        words[:, (f * j) // 32] |= flat[:, j] << np.uint64((f * j) % 32)
    start = dir_offset(m << int(half), k, b_dir)
    table = torch.full((start + 4 * (m * m + 1),), float("nan"))
    table[: words.size] = torch.from_numpy(words.astype(np.uint32).view(np.float32).reshape(-1))
    dirs = table[start:].view(m * m + 1, 4)
    dirs[: m * m, :3] = dirs32
    dirs[: m * m, 3] = 0.0
    found = _lookup(_thresholds(c, b, half))
    if found is None:
        raise ValueError(f"the {m} xi centroids and boundaries admit no region lookup table of at most "
                         f"{MAX_LUT_SCALE} cells a unit (a threshold within {LUT_EDGE_GUARD:.1e} below a "
                         "cell edge)")
    lut, scale = found
    rho_scale = 0  # the rho index by compares or a binary search (encode_math._index) where it stays 0
    rho = rho_boundaries.detach().double().cpu().numpy()
    found = _lookup(rho) if rho.size >= (1 << RHO_LOOKUP_BITS) - 1 else None
    if found is not None:
        lut, rho_scale = torch.cat([lut, found[0]]), found[1]
    dev = device if device is not None else directions.device
    return TripletSearchTables(table.to(dev), lut.to(dev), k, scale, half, b_dir, rho_scale)


def region(x: torch.Tensor, lut: torch.Tensor, scale: int) -> torch.Tensor:
    """The number of thresholds below each x (fp32; a value on one goes lower) by a lookup table of `_lookup`
    (rows from the table's start), in plain PyTorch as the kernel computes it (encode_math._region)."""
    j = torch.floor((x + 1) * scale).clamp(0, 2 * scale).long()
    return lut[j, 1].view(torch.int32).long() + (x > lut[j, 0]).long()


def search_reference(t_N3: torch.Tensor, tables: TripletSearchTables) -> torch.Tensor:
    """Flat direction index per triplet t[N, 3] (fp32) by the tables, in plain PyTorch, as the kernel does it:
    the folded coordinates of t / ||t||_1 (a zero triplet searches as (0, 0, 1), the reference's placeholder),
    their regions from the lookup table, each listed candidate's score (t_x n_x + t_y n_y) + t_z n_z in fp32
    (the reference's arithmetic) and the first of the largest."""
    t = t_N3.float()
    zero = t.abs().sum(-1) == 0
    tz = torch.where(zero, torch.ones_like(t[:, 2]), t[:, 2])
    l1 = (t[:, 0].abs() + t[:, 1].abs()) + tz.abs()
    px, py = t[:, 0] / l1, t[:, 1] / l1
    lower = tz < 0
    xi = torch.where(lower, torch.where(px < 0, py.abs() - 1, 1 - py.abs()), px)
    eta = torch.where(lower, torch.where(py < 0, px.abs() - 1, 1 - px.abs()), py)
    lut = tables.lut.to(t.device)
    region_ = region(xi, lut, tables.lut_scale) * tables.regions + region(eta, lut, tables.lut_scale)
    flat = tables.rows().to(t.device)[region_]  # [N, K]
    cand = tables.directions().to(t.device)[flat]  # [N, K, 4]
    s = (t[:, 0, None] * cand[..., 0] + t[:, 1, None] * cand[..., 1]) + tz[:, None] * cand[..., 2]
    s = torch.where(s.isnan(), torch.full_like(s, float("-inf")), s)
    first = (s == s.max(-1, keepdim=True).values).long().argmax(-1, keepdim=True)
    return flat.gather(1, first)[:, 0]
