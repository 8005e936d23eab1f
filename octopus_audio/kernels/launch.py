"""What the launchers share: the autocast guard, power-of-two checks, split-K and packing shapes, device
facts, the attention and encode launch configurations."""

from __future__ import annotations

import dataclasses
import functools
import os

import torch
import triton.language as tl


def _outside_autocast(fn):
    """The launchers' torch math (query rotation, layouts) must stay fp32 under a caller's autocast: an
    autocast matmul would hand the kernels bf16 rotated queries beside fp32 decoded keys."""

    @functools.wraps(fn)
    def launcher(*args, **kwargs):
        if not (torch.is_autocast_enabled("cuda") or torch.is_autocast_enabled("cpu")):
            return fn(*args, **kwargs)  # the common case: no autocast to leave (two contexts cost ~10 us)
        with torch.autocast("cuda", enabled=False), torch.autocast("cpu", enabled=False):
            return fn(*args, **kwargs)

    return launcher


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _check_pow2(name: str, value: int | None, low: int, high: int) -> None:
    if value is not None and (value < low or value > high or value & (value - 1)):
        raise ValueError(f"{name} must be a power of two in [{low}, {high}], got {value}")


@functools.lru_cache(maxsize=16)
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


@functools.lru_cache(maxsize=16)
def device_capability(device: torch.device) -> tuple[int, int] | None:
    """The CUDA compute capability of `device` (None: not a CUDA device)."""
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _interpreter_16bit_dot() -> None:
    """Make the CPU interpreter's tl.dot read bfloat16 operands (it stores them as raw uint16 bits and would
    multiply the bit patterns as integers): widen 16-bit float operands to fp32 first, which is exact, so
    the interpreted dot equals the GPU's (exact products, fp32 accumulation). Idempotent."""
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    inner = builder.create_dot
    if getattr(inner, "widens_16bit", False):
        return

    def widen(x):
        if x.dtype.scalar.primitive_bitwidth == 16 and x.dtype.scalar.is_floating():
            data = x.data.view(np.uint16).astype(np.uint32) << 16 if x.dtype.scalar.is_bf16() else x.data
            data = data.view(np.float32) if x.dtype.scalar.is_bf16() else data.astype(np.float32)
            return interpreter.TensorHandle(data, tl.float32)
        return x

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return inner(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot.widens_16bit = True
    builder.create_dot = create_dot


def split_buffers(out: torch.Tensor, splits: int, rows: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(opart [splits, rows, d], lse [splits, rows]) fp32 partial buffers of a split-K launch whose merge
    writes `out`; a single split writes `out` directly and gets `out` for both (never read)."""
    if splits == 1:
        return out, out
    return (torch.empty(splits, rows, d, device=out.device, dtype=torch.float32),
            torch.empty(splits, rows, device=out.device, dtype=torch.float32))


def _cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints (triton.cdiv is a jit function: microseconds a call from Python)."""
    return -(-a // b)


def split_chunk(length: int, splits: int, step: int) -> tuple[int, int]:
    """(splits, chunk) of a split-K launch over `length` keys asking for `splits`: chunks are whole steps
    of `step` keys, and no split is left empty (at least one split, even for length 0)."""
    chunk = _cdiv(_cdiv(max(length, 1), max(1, splits)), step) * step
    return max(1, _cdiv(length, chunk)), chunk


@dataclasses.dataclass(frozen=True)
class AttnConfig:
    """Launch configuration of the attention kernel; a None field takes the launcher's heuristic
    (impls/flash.py, impls/score_tables.py).

    block_m: rows (query head x token pairs) per program, 1 (no tensor cores: FMAs and row sums) or 16..256;
    block_n: keys per step; block_w: native window keys per step (default block_n; the AAR window of 75
    keys pads to 128 at 64 a step, to 80 at 16); num_warps, num_stages (software pipelining of the loads;
    1: none); programs_per_sm: the split-K count aims at this many programs per multiprocessor;
    split_min_keys: no split gets fewer compressed keys than this (default 4 * block_n); window_split: when
    the store is split, the native window gets a split of its own instead of riding on the last one (default
    True). One query row per KV head of a kind with score tables runs the score-table kernel: there block_n
    is the keys per step of its score phase, block_v those of its value phase, num_warps and programs_per_sm
    as here.
    """

    block_m: int | None = None
    block_n: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    programs_per_sm: int | None = None
    split_min_keys: int | None = None
    window_split: bool | None = None
    block_v: int | None = None
    block_w: int | None = None

    def __post_init__(self) -> None:
        if self.block_m not in (None, 1):
            _check_pow2("block_m", self.block_m, 16, 256)
        _check_pow2("block_n", self.block_n, 16, 256)
        _check_pow2("num_warps", self.num_warps, 1, 16)
        if self.num_stages is not None and not 1 <= self.num_stages <= 4:
            raise ValueError(f"num_stages must be in 1..4, got {self.num_stages}")
        if self.programs_per_sm is not None and self.programs_per_sm < 1:
            raise ValueError(f"programs_per_sm must be >= 1, got {self.programs_per_sm}")
        _check_pow2("block_v", self.block_v, 8, 256)
        _check_pow2("block_w", self.block_w, 16, 256)
        if self.split_min_keys is not None and self.split_min_keys < 1:
            raise ValueError(f"split_min_keys must be >= 1, got {self.split_min_keys}")


@dataclasses.dataclass(frozen=True)
class EncodeConfig:
    """Launch configuration of the encode kernels (None: the heuristic): rows per program (block_t), warps,
    stages."""

    block_t: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None

    def __post_init__(self) -> None:
        _check_pow2("block_t", self.block_t, 16, 512)
        _check_pow2("num_warps", self.num_warps, 1, 16)
        if self.num_stages is not None and not 1 <= self.num_stages <= 4:
            raise ValueError(f"num_stages must be in 1..4, got {self.num_stages}")


def pack_shape(n: int, length: int) -> tuple[int, int, int]:
    """(W, WP, KP) of a field of `length` codes of n bits: words, words padded to a power of two, and the
    power-of-two bound on the number of codes that meet one word."""
    words = -(-length * n // 32)
    most = 1
    for w in range(words):
        first, last = (32 * w) // n, min(length - 1, (32 * w + 31) // n)
        most = max(most, last - first + 1)
    return words, _pow2(max(words, 1)), _pow2(most)

_DUMMIES: dict[torch.device, torch.Tensor] = {}


def unused_buffer(device: torch.device) -> torch.Tensor:
    """A one-element fp32 tensor on `device` for the pointer arguments a launch never reads (made once per
    device: a fresh torch.zeros per call is a memset a CUDA graph replays)."""
    t = _DUMMIES.get(device)
    if t is None:
        t = _DUMMIES[device] = torch.zeros(1, device=device, dtype=torch.float32)
    return t
