"""What the launchers share: the autocast guard, power-of-two checks, the Hadamard matrix, device facts."""

from __future__ import annotations

import functools
import math
import os

import torch

from .naive import hadamard
from .spec import KernelCodec


def _outside_autocast(fn):
    """The launchers' torch math (query rotation, layouts) must stay fp32 under a caller's autocast: an
    autocast matmul would hand the kernels bf16 rotated queries beside fp32 decoded keys."""

    @functools.wraps(fn)
    def launcher(*args, **kwargs):
        with torch.autocast("cuda", enabled=False), torch.autocast("cpu", enabled=False):
            return fn(*args, **kwargs)

    return launcher


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _check_pow2(name: str, value: int | None, low: int, high: int) -> None:
    if value is not None and (value < low or value > high or value & (value - 1)):
        raise ValueError(f"{name} must be a power of two in [{low}, {high}], got {value}")


@functools.lru_cache(maxsize=16)
def _hadamard(d: int, device: torch.device) -> torch.Tensor:
    return hadamard(d, device)


def _rotate(x_BHRD: torch.Tensor, signs_HD: torch.Tensor) -> torch.Tensor:
    """R x per head: ((x * s_h) @ H_d) / sqrt(d) (H_d symmetric), float32."""
    d = x_BHRD.shape[-1]
    return ((x_BHRD * signs_HD[None, :, None, :]) @ _hadamard(d, x_BHRD.device)) / math.sqrt(d)


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def _octopus_lp(codec: KernelCodec) -> int:
    return max(16, _pow2(codec.key_codes))



def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"

