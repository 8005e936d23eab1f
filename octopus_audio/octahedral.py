"""The octahedral map of 3-D directions and OCTOPUS's joint rounding of triplets (PyTorch reference, fp32).

A direction n is projected to the L1 sphere, p = n / ||n||_1; the upper half (z >= 0) maps to
(xi, eta) = (p_x, p_y) and the lower half is folded over the diamond's edges,
(xi, eta) = (sgn(p_x)(1-|p_y|), sgn(p_y)(1-|p_x|)), with sign(0) = +1 (docs/formats.md). Directions are
quantized on the product grid of the xi codebook: flat index i_xi * 2^b_dir + i_eta into
`direction_table(b_dir)`. A triplet t is coded as rho_hat * n_hat, rho_hat from the rho codebook of dim d.
"""

from __future__ import annotations

import functools

import torch

from octopus_audio.codebooks import get_codebook

ROUNDING_MODES = ("scalar", "local3x3", "full")
MAX_DIR_BITS = 8
_FULL_CHUNK_ELEMENTS = 1 << 21  # triplets x directions per chunk of the full search (a few tens of MB)


def _sgn(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= 0, torch.ones_like(x), -torch.ones_like(x))


def fold(n_N3: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Octahedral coordinates (xi, eta) in [-1, 1]^2 of directions n[..., 3] (any norm; zero gives (0, 0))."""
    if n_N3.shape[-1] != 3:
        raise ValueError(f"fold expects a last dimension of 3, got shape {tuple(n_N3.shape)}")
    x, y, z = n_N3.unbind(-1)
    l1 = (x.abs() + y.abs() + z.abs()).clamp_min(torch.finfo(n_N3.dtype).tiny)
    px, py = x / l1, y / l1
    lower = z < 0
    xi = torch.where(lower, _sgn(px) * (1 - py.abs()), px)
    eta = torch.where(lower, _sgn(py) * (1 - px.abs()), py)
    return xi, eta


def unfold(xi_N: torch.Tensor, eta_N: torch.Tensor) -> torch.Tensor:
    """Unit directions n[..., 3] of octahedral coordinates (the inverse of `fold` on unit vectors)."""
    z = 1 - xi_N.abs() - eta_N.abs()
    lower = z < 0
    x = torch.where(lower, _sgn(xi_N) * (1 - eta_N.abs()), xi_N)
    y = torch.where(lower, _sgn(eta_N) * (1 - xi_N.abs()), eta_N)
    n = torch.stack([x, y, z], dim=-1)
    return n / torch.linalg.vector_norm(n, dim=-1, keepdim=True)


def _check_bits(b_dir: int, b_rho: int) -> None:
    if isinstance(b_dir, bool) or not isinstance(b_dir, int) or not 0 <= b_dir <= MAX_DIR_BITS:
        raise ValueError(f"direction bits b_dir must be an integer in 0..{MAX_DIR_BITS}, got {b_dir!r}")
    if isinstance(b_rho, bool) or not isinstance(b_rho, int) or not 0 <= b_rho <= 8:
        raise ValueError(f"norm bits b_rho must be an integer in 0..8, got {b_rho!r}")


@functools.cache
def _direction_table(b_dir: int) -> torch.Tensor:
    c = get_codebook("xi", None, b_dir).centroids.double()  # the fp32 centroids, exactly
    m = c.numel()
    xi = c.repeat_interleave(m)  # row i_xi * m + i_eta
    eta = c.repeat(m)
    return unfold(xi, eta).float()


def direction_table(b_dir: int) -> torch.Tensor:
    """Decoded unit directions [4^b_dir, 3] fp32, row i_xi * 2^b_dir + i_eta (the fp32 xi centroids unfolded
    in float64, then rounded)."""
    _check_bits(b_dir, 0)
    return _direction_table(b_dir).clone()


@functools.lru_cache(maxsize=64)
def _rounding_tables(b_dir: int, b_rho: int, d: int, device: str) -> tuple[torch.Tensor, ...]:
    """round_triplets' constants on `device`, copied there once (a copy from pageable host memory waits for
    the device's queue to drain, so per-call copies would stall every CUDA encode): the xi boundaries, the rho
    centroids and boundaries, the direction table transposed [3, 4^b_dir] and the zero triplet's placeholder
    direction (0, 0, 1)."""
    xi_cb, rho_cb = get_codebook("xi", None, b_dir), get_codebook("rho", d, b_rho)
    return (xi_cb.boundaries.to(device), rho_cb.centroids.to(device), rho_cb.boundaries.to(device),
            _direction_table(b_dir).to(device).T.contiguous(), torch.tensor([0.0, 0.0, 1.0], device=device))


def _pick(cost: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """Column of the least cost per row; ties go to the lowest flat direction index."""
    best = cost.min(dim=-1, keepdim=True).values
    masked = torch.where(cost == best, flat, torch.full_like(flat, torch.iinfo(flat.dtype).max))
    return masked.argmin(dim=-1, keepdim=True)


def _candidate_costs(t_N3: torch.Tensor, rho2_N: torch.Tensor, flat_NK: torch.Tensor, table_3M: torch.Tensor,
                     rho_centroids: torch.Tensor,
                     rho_boundaries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cost ||t - rho_hat n_hat||^2 = rho^2 - 2 rho_hat s + rho_hat^2 and the rho index, per candidate.
    Every mode computes it with this one function, so equal candidates give bit-equal costs."""
    tx, ty, tz = (t_N3[:, j, None] for j in range(3))
    s = tx * table_3M[0][flat_NK] + ty * table_3M[1][flat_NK] + tz * table_3M[2][flat_NK]
    i_rho = torch.searchsorted(rho_boundaries, s.contiguous(), right=False)
    rho_hat = rho_centroids[i_rho]
    cost = (rho2_N[:, None] - 2 * rho_hat * s) + rho_hat * rho_hat
    return cost, i_rho


def round_triplets(t_N3: torch.Tensor, b_dir: int, b_rho: int, mode: str = "local3x3", *,
                   d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize triplets t[..., 3] (fp32 arithmetic) to (i_xi, i_eta, i_rho), int64 of shape t.shape[:-1].

    mode "scalar": nearest xi and eta centroids of the folded direction, rho_hat nearest ||t||.
    mode "local3x3" (default): from those seeds, the 9 neighbouring direction cells (clamped to the grid); for
    each, s = t . n_hat and rho_hat = the rho centroid nearest s; keep the least
    rho^2 - 2 rho_hat s + rho_hat^2.
    mode "full": the same over all 4^b_dir directions (chunked). Ties go to the lowest flat direction index.
    A zero triplet stores the placeholder direction (0, 0, 1) (the seeds of xi = eta = 0) and the rho index
    nearest 0. The rho codebook is get_codebook("rho", d, b_rho).
    """
    if mode not in ROUNDING_MODES:
        raise ValueError(f"rounding mode {mode!r} is unknown; allowed: {', '.join(ROUNDING_MODES)}")
    _check_bits(b_dir, b_rho)
    if t_N3.shape[-1] != 3:
        raise ValueError(f"round_triplets expects a last dimension of 3, got shape {tuple(t_N3.shape)}")
    batch_shape = t_N3.shape[:-1]
    t = t_N3.reshape(-1, 3).float()
    device = t.device
    xi_bounds, rho_c, rho_bounds, table, placeholder = _rounding_tables(b_dir, b_rho, d, str(device))
    m = 2**b_dir

    rho2 = (t * t).sum(-1)
    rho = rho2.sqrt()
    zero = rho == 0
    n = torch.where(zero[:, None], placeholder, t / torch.where(zero, 1.0, rho)[:, None])
    xi, eta = fold(n)
    i_xi = torch.searchsorted(xi_bounds, xi.contiguous(), right=False)
    i_eta = torch.searchsorted(xi_bounds, eta.contiguous(), right=False)

    if mode == "scalar":
        i_rho = torch.searchsorted(rho_bounds, rho.contiguous(), right=False)
    else:
        if mode == "local3x3":  # (table [3, 4^b_dir]: one gather per coordinate)
            offsets = torch.arange(-1, 2, device=device)
            cand_xi = (i_xi[:, None, None] + offsets[None, :, None]).clamp(0, m - 1)
            cand_eta = (i_eta[:, None, None] + offsets[None, None, :]).clamp(0, m - 1)
            flat = (cand_xi * m + cand_eta).reshape(-1, 9)
            cost, rho_idx = _candidate_costs(t, rho2, flat, table, rho_c, rho_bounds)
            col = _pick(cost, flat)
            best_flat, i_rho = flat.gather(1, col)[:, 0], rho_idx.gather(1, col)[:, 0]
        else:
            chunk = max(1, _FULL_CHUNK_ELEMENTS // (m * m))
            all_flat = torch.arange(m * m, device=device)
            best_flat = torch.empty_like(i_xi)
            i_rho = torch.empty_like(i_xi)
            for start in range(0, t.shape[0], chunk):
                sl = slice(start, start + chunk)
                flat = all_flat[None, :]  # broadcast over the rows of the chunk
                cost, rho_idx = _candidate_costs(t[sl], rho2[sl], flat, table, rho_c, rho_bounds)
                col = _pick(cost, flat)
                best_flat[sl], i_rho[sl] = col[:, 0], rho_idx.gather(1, col)[:, 0]
        keep = ~zero
        i_xi = torch.where(keep, best_flat // m, i_xi)
        i_eta = torch.where(keep, best_flat % m, i_eta)
        i_rho = torch.where(keep, i_rho, torch.searchsorted(rho_bounds, rho.contiguous(), right=False))
    return i_xi.reshape(batch_shape), i_eta.reshape(batch_shape), i_rho.reshape(batch_shape)


def decode_triplets(i_xi: torch.Tensor, i_eta: torch.Tensor, i_rho: torch.Tensor, b_dir: int, b_rho: int, *,
                    d: int) -> torch.Tensor:
    """t_hat[..., 3] = C_rho[i_rho] * D[i_xi * 2^b_dir + i_eta] (fp32)."""
    _check_bits(b_dir, b_rho)
    table = _direction_table(b_dir).to(i_xi.device)
    rho_c = get_codebook("rho", d, b_rho).centroids.to(i_xi.device)
    return rho_c[i_rho][..., None] * table[i_xi * 2**b_dir + i_eta]
