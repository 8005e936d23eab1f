"""Which path a cache's sequence runs, the fused kernels or the PyTorch reference: the one switch between the
codec library and octopus_audio.kernels.

OCTOPUS_AUDIO_KERNELS (default auto), the one switch, for debugging and timing:
- auto: the kernels for CUDA tensors when `octopus_audio.kernels` imports (the kernels' selector,
  octopus_audio/kernels/select.py, picks the implementation of each call, the sm_90 Gluon kernels where in
  scope), else the PyTorch reference;
- reference: the PyTorch reference;
- kernels: the kernels, the selector free (an error where they cannot run: CPU tensors run them only under
  TRITON_INTERPRET=1);
- triton: the kernels as `kernels`, the Triton implementations only (never the Gluon kernels).
The choice is logged once. A codec that does not compress (`none`) always takes the reference path (plain SDPA
over native K/V), and so does one that declares no kernel decode kind (announced once). The variables it
replaces (OCTOPUS_AUDIO_BACKEND, OCTOPUS_AUDIO_ATTENTION_KERNEL) are an error naming the new setting.
A cache asks once per sequence, at its first unit (`plan.CachePlan`): the per-call path then runs the chosen
ops with no environment, backend or kernel-table lookups. Inside `reference_backend(why)` the sequences that
start take the reference whatever the environment asks (the eval's fp32 teacher forcing on CUDA).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
from collections.abc import Iterator

import torch

log = logging.getLogger(__name__)

ENV_VAR = "OCTOPUS_AUDIO_KERNELS"
CHOICES = ("auto", "reference", "kernels", "triton")
# the variables OCTOPUS_AUDIO_KERNELS replaces, and what each of their values is now
REPLACED = {"OCTOPUS_AUDIO_BACKEND": {"auto": "auto", "reference": "reference", "triton": "kernels"},
            "OCTOPUS_AUDIO_ATTENTION_KERNEL": {"auto": "auto", "triton": "triton"}}
KERNEL_OPS = ("encode_keys", "encode_values", "encode_unit", "attention")
_announced: set[tuple[str, str]] = set()
_forced_reference: contextvars.ContextVar[str | None] = contextvars.ContextVar("octopus_audio_reference",
                                                                             default=None)


def requested() -> str:
    """What OCTOPUS_AUDIO_KERNELS asks for (auto when unset); ValueError for another value, or for a variable
    it replaced (naming the setting that does the same now)."""
    for old, values in REPLACED.items():
        if old in os.environ:
            now = values.get(os.environ[old].strip().lower())
            hint = f"{ENV_VAR}={now}" if now else f"{ENV_VAR} (one of {', '.join(CHOICES)})"
            raise ValueError(f"{old} is replaced by {ENV_VAR}: unset it and set {hint}")
    value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV_VAR}={value!r} is not a kernels setting; allowed: {', '.join(CHOICES)}")
    return value


@contextlib.contextmanager
def reference_backend(why: str) -> Iterator[None]:
    """Context manager: caches that start a sequence inside it run the PyTorch reference (announced once with
    `why`), whatever OCTOPUS_AUDIO_KERNELS asks; sequences already started keep their plan."""
    token = _forced_reference.set(why)
    try:
        yield
    finally:
        _forced_reference.reset(token)


@functools.cache
def _kernel_ops():
    """(the kernels package or None, reason it is unavailable)."""
    try:
        import octopus_audio.kernels as ops
    except Exception as exc:  # any import failure means the kernels cannot run
        return None, f"importing octopus_audio.kernels failed ({type(exc).__name__}: {exc})"
    missing = [name for name in KERNEL_OPS if not callable(getattr(ops, name, None))]
    if missing:
        return None, f"octopus_audio.kernels lacks {', '.join(missing)}"
    return ops, ""


def kernels_available() -> tuple[bool, str]:
    """Whether the Triton kernel entry points import, and why not."""
    ops, why = _kernel_ops()
    return ops is not None, why


def announce(backend: str, why: str) -> None:
    """Log once that `backend` runs, and why."""
    if (backend, why) not in _announced:
        _announced.add((backend, why))
        log.info("octopus-audio attention backend: %s (%s)", backend, why)


def attention_backend(device: torch.device | str | None = None, codec=None) -> str:
    """"triton" or "reference" for tensors on `device` (None: cuda if available, else cpu) and `codec` (a
    KeyCodec, or None for any codec the kernels serve)."""
    asked = requested()
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if codec is not None and not codec.compressed:
        announce("reference", f"codec {codec.name}: plain SDPA over native K/V")
        return "reference"
    if codec is not None and codec.kernel_decode is None:
        announce("reference", f"codec {codec.name} has no kernel decode kind")
        return "reference"
    forced = _forced_reference.get()
    if forced is not None:
        announce("reference", forced)
        return "reference"
    if asked == "reference":
        announce("reference", f"{ENV_VAR}=reference")
        return "reference"
    ok, why = kernels_available()
    runnable = device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    if asked in ("kernels", "triton"):
        if not ok:
            raise RuntimeError(f"{ENV_VAR}={asked} but the Triton kernels cannot be used: {why}")
        if not runnable:
            raise RuntimeError(
                f"{ENV_VAR}={asked} but the tensors are on {device}: the kernels need CUDA tensors "
                f"(or TRITON_INTERPRET=1 on CPU); set {ENV_VAR}=reference or auto"
            )
        announce("triton", f"{ENV_VAR}={asked}")
        return "triton"
    if device.type == "cuda" and ok:
        announce("triton", f"auto: CUDA tensors on {device}")
        return "triton"
    announce("reference", f"auto: {why}" if not ok else f"auto: tensors on {device}")
    return "reference"


def kernel_ops():
    """The kernels package (`octopus_audio.kernels`), or None where it does not import."""
    return _kernel_ops()[0]
