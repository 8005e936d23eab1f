"""Seeded randomized Walsh-Hadamard rotation R = H_d diag(s) / sqrt(d) shared by every key codec."""

from __future__ import annotations

import functools
import hashlib
import math

import torch

MIN_HEAD_DIM = 8
MAX_HEAD_DIM = 1024
SUPPORTED_HEAD_DIMS = tuple(2**i for i in range(3, 11))


def check_head_dim(d: int) -> int:
    """Return `d` if it is a supported head dim (a power of two in 8..1024), else raise ValueError."""
    if not isinstance(d, int) or isinstance(d, bool) or d not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"head dim {d!r} is not supported: it must be a power of two "
            f"from {MIN_HEAD_DIM} to {MAX_HEAD_DIM} "
            f"(one of {', '.join(map(str, SUPPORTED_HEAD_DIMS))})"
        )
    return d


@functools.lru_cache(maxsize=32)
def _hadamard_cpu(d: int) -> torch.Tensor:
    h_DD = torch.ones(1, 1, dtype=torch.float32)
    while h_DD.shape[0] < d:
        h_DD = torch.cat([torch.cat([h_DD, h_DD], 1), torch.cat([h_DD, -h_DD], 1)], 0)
    return h_DD


_DEVICE_CACHE: dict[tuple[int, str], torch.Tensor] = {}


def hadamard(d: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The Sylvester Hadamard matrix H_d (entries +-1, symmetric, unnormalised) as float32 on `device`."""
    check_head_dim(d)
    device = torch.device(device) if device is not None else torch.device("cpu")
    key = (d, str(device))
    if key not in _DEVICE_CACHE:
        _DEVICE_CACHE[key] = _hadamard_cpu(d).to(device)
    return _DEVICE_CACHE[key]


def layer_seed(base_seed: int, layer: int) -> int:
    """The codec seed of layer `layer` of a model patched with `base_seed` (formats.md)."""
    return int(base_seed) * 1_000_003 + int(layer)


def _generator_seed(seed: int, head: int, stream: int) -> int:
    digest = hashlib.sha256(f"octopus-audio:{int(seed)}:{int(head)}:{int(stream)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@functools.lru_cache(maxsize=4096)
def _sign_vector_cached(seed: int, head: int, d: int, stream: int) -> torch.Tensor:
    gen = torch.Generator(device="cpu")
    gen.manual_seed(_generator_seed(seed, head, stream))
    bits_D = torch.randint(0, 2, (d,), generator=gen, dtype=torch.int64)
    return (bits_D * 2 - 1).to(torch.float32)


def sign_vector(seed: int, head: int, d: int, stream: int = 0) -> torch.Tensor:
    """The +-1 vector s (float32 [d], CPU) for head `head` of a codec built with `seed`.

    A torch.Generator is seeded from a hash of (seed, head, stream), so the vector depends on nothing else
    (not on the device, the batch, or how many heads there are). stream=0 is the main rotation R,
    stream=1 the independent QJL rotation R'.
    """
    check_head_dim(d)
    if head < 0 or stream < 0:
        raise ValueError(f"head ({head}) and stream ({stream}) must be >= 0")
    return _sign_vector_cached(int(seed), int(head), d, int(stream)).clone()


def head_signs(seed: int, num_heads: int, d: int, stream: int = 0, device=None) -> torch.Tensor:
    """Sign vectors of heads 0..num_heads-1 stacked as float32 [H, d] on `device`."""
    check_head_dim(d)
    s_HD = torch.stack([_sign_vector_cached(int(seed), h, d, int(stream)) for h in range(num_heads)])
    return s_HD.to(device) if device is not None else s_HD


def num_heads_of(x: torch.Tensor) -> int:
    """Heads of a [..., H, T, d] tensor (a 2-D tensor [T, d] is one head)."""
    return 1 if x.ndim == 2 else x.shape[-3]


def _signs_for(x: torch.Tensor, signs_HD: torch.Tensor) -> torch.Tensor:
    if signs_HD.shape[0] != num_heads_of(x):
        raise ValueError(
            f"sign vectors for {signs_HD.shape[0]} heads given for a tensor with {num_heads_of(x)} heads"
        )
    s = signs_HD.to(device=x.device, dtype=torch.float32)
    return s if x.ndim == 2 else s[:, None, :]  # [H, 1, d] broadcasts over [..., H, T, d]


def rotate(x: torch.Tensor, signs_HD: torch.Tensor) -> torch.Tensor:
    """R x = H diag(s) x / sqrt(d) along the last dim, per head (dim -3), in float32."""
    d = x.shape[-1]
    return ((x.to(torch.float32) * _signs_for(x, signs_HD)) @ hadamard(d, x.device)) * (1.0 / math.sqrt(d))


def unrotate(y: torch.Tensor, signs_HD: torch.Tensor) -> torch.Tensor:
    """R^T y = diag(s) H y / sqrt(d) along the last dim, per head (dim -3), in float32."""
    d = y.shape[-1]
    return ((y.to(torch.float32) @ hadamard(d, y.device)) * (1.0 / math.sqrt(d))) * _signs_for(y, signs_HD)
