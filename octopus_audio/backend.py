"""The one dispatch point between the codec library and octopus_audio.kernels: picks triton or reference.

OCTOPUS_AUDIO_BACKEND in {auto, reference, triton} (default auto): auto runs the Triton kernels for CUDA
tensors when `octopus_audio.kernels.ops` imports, else the PyTorch reference; a forced backend that cannot
run is an error (triton runs on CPU tensors only under TRITON_INTERPRET=1). The choice is logged once.
The codec `none` always takes the reference path (plain SDPA over native K/V).
"""

from __future__ import annotations

import functools
import logging
import os

import torch

log = logging.getLogger(__name__)

ENV_VAR = "OCTOPUS_AUDIO_BACKEND"
CHOICES = ("auto", "reference", "triton")
KERNEL_OPS = ("encode_keys", "encode_values", "attention")
_announced: set[tuple[str, str]] = set()


def requested_backend() -> str:
    """The backend the environment asks for (auto when unset)."""
    value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV_VAR}={value!r} is not a backend; allowed: {', '.join(CHOICES)}")
    return value


@functools.cache
def _kernel_ops():
    """(ops module or None, reason it is unavailable)."""
    try:
        from octopus_audio.kernels import ops
    except Exception as exc:  # any import failure means the kernels cannot run
        return None, f"importing octopus_audio.kernels.ops failed ({type(exc).__name__}: {exc})"
    missing = [name for name in KERNEL_OPS if not callable(getattr(ops, name, None))]
    if missing:
        return None, f"octopus_audio.kernels.ops lacks {', '.join(missing)}"
    return ops, ""


def kernels_available() -> tuple[bool, str]:
    """Whether the Triton kernel entry points import, and why not."""
    ops, why = _kernel_ops()
    return ops is not None, why


def _announce(backend: str, why: str) -> None:
    if (backend, why) not in _announced:
        _announced.add((backend, why))
        log.info("octopus-audio attention backend: %s (%s)", backend, why)


def attention_backend(device: torch.device | str | None = None, codec_name: str | None = None) -> str:
    """"triton" or "reference" for tensors on `device` (None: cuda if available, else cpu)."""
    requested = requested_backend()
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if codec_name == "none":
        _announce("reference", "codec none: plain SDPA over native K/V")
        return "reference"
    if requested == "reference":
        _announce("reference", f"{ENV_VAR}=reference")
        return "reference"
    ok, why = kernels_available()
    runnable = device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    if requested == "triton":
        if not ok:
            raise RuntimeError(f"{ENV_VAR}=triton but the Triton kernels cannot be used: {why}")
        if not runnable:
            raise RuntimeError(
                f"{ENV_VAR}=triton but the tensors are on {device}: the kernels need CUDA tensors "
                f"(or TRITON_INTERPRET=1 on CPU); set {ENV_VAR}=reference or auto"
            )
        _announce("triton", f"{ENV_VAR}=triton")
        return "triton"
    if device.type == "cuda" and ok:
        _announce("triton", f"auto: CUDA tensors on {device}")
        return "triton"
    _announce("reference", f"auto: {why}" if not ok else f"auto: tensors on {device}")
    return "reference"


def _ops():
    return _kernel_ops()[0]


# ---- one hook per op: the kernels when the backend is triton, the PyTorch reference otherwise ----

def encode_keys(codec, k: torch.Tensor, backend: str):
    """k [B, H, T, d] -> KeyState (finiteness already checked by the caller)."""
    if backend == "triton":
        return _ops().encode_keys(codec, k)
    return codec.encode_unchecked(k)


def encode_values(quantizer, v: torch.Tensor, backend: str):
    """v [B, H, T, d] -> ValueState (range already checked by the caller)."""
    if backend == "triton":
        return _ops().encode_values(quantizer, v)
    return quantizer.encode_unchecked(v)


def attention(cache, q: torch.Tensor, scale: float, backend: str) -> torch.Tensor:
    """One softmax over the cache's compressed store and native window: q [B, Hq, Tq, d] -> [B, Hq, Tq, d]."""
    if backend == "triton":
        return _ops().attention(cache, q, scale)
    return cache.attend_reference(q, scale)
