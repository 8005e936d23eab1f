"""Which kernels run: the Gluon kernels for sm_90 where a call is in their scope, else the Triton kernels.
Attention: gluon_flash.py where `gluon_limit` finds the call in scope, else flash.py; the polarquant key
encode: gluon_encode.py where `encode_limit` does, else encode.py. The decisions are pure functions; their
callers feed them the device, the installed Triton and the call, and say once which kernel runs and why.

OCTOPUS_AUDIO_ATTENTION_KERNEL in {auto, triton} (default auto): auto runs the Gluon kernels where in scope;
triton always runs the Triton kernels (for tests and benchmarks that time them; the name is the attention's,
the first Gluon kernel, and covers the key encode too). Read once per cache sequence
(octopus_audio.backend.CachePlan), passed to `flash.attention` and `encode.encode_keys` as `gluon`.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import re

import torch

log = logging.getLogger(__name__)

ENV_VAR = "OCTOPUS_AUDIO_ATTENTION_KERNEL"
KERNEL_CHOICES = ("auto", "triton")
CAPABILITY = (9, 0)  # wgmma and the warp-group register split: Hopper
HEAD_DIM = 64  # the kernel's tiles are laid out for d = 64
MAX_ROWS = 80  # query rows (G * Tq) a program: 64 as wgmma rows, 16 swapped
# key code bits (turboquant-mse, polarquant b 1..4; turboquant-qjl b 2..5; octopus* b 1..4: 3b + 1 bits)
KEY_BITS = {"scalar": range(1, 5), "polar": range(1, 5), "triplet": range(4, 14)}
VALUE_BITS = (2, 4, 8)  # a value word is whole groups or within one (16 channels a group)
VALUE_GROUP = 16
PROGRAMS_PER_SM = 2  # resident programs of the kernel (8 warps at 128 registers)
# the key encode: the code widths at which gluon_encode.py's kernel was measured faster than encode.py's
# (H200, 64k tokens x 16 heads, benchmarks/results/kernels.md)
ENCODE_BITS = {"polar": (1, 2)}
ENCODE_DTYPES = (torch.bfloat16, torch.float16)
_announced: set[tuple[str, ...]] = set()


def requested_kernel() -> str:
    """The attention kernel the environment asks for (auto when unset)."""
    value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if value not in KERNEL_CHOICES:
        raise ValueError(f"{ENV_VAR}={value!r} is not an attention kernel choice; allowed: "
                         f"{', '.join(KERNEL_CHOICES)}")
    return value


def codec_id(decode: str, has_qjl: bool) -> int | None:
    """The Gluon kernel's CODEC id of a key decode section with or without the QJL side-car (gluon_decode's
    TQM, TQJ, POL, OCT, OCJ), None where it has none."""
    return {("scalar", False): 0, ("scalar", True): 1, ("polar", False): 2, ("triplet", False): 3,
            ("triplet", True): 4}.get((decode, bool(has_qjl)))


def codec_limit(decode: str, has_qjl: bool, head_dim: int, code_bits: int, v_bits: int,
                v_group: int) -> str | None:
    """Why the Gluon kernel cannot run a codec and value quantizer (None when it can)."""
    if codec_id(decode, has_qjl) is None:
        return f"no Gluon decode for section {decode!r}{' with QJL' if has_qjl else ''}"
    if head_dim != HEAD_DIM:
        return f"head dim {head_dim} (the Gluon kernel takes {HEAD_DIM})"
    if code_bits not in KEY_BITS[decode]:
        bits = KEY_BITS[decode]
        return f"{code_bits}-bit key codes (the Gluon kernel's {decode} decode takes {bits[0]}..{bits[-1]})"
    if v_bits not in VALUE_BITS or v_group != VALUE_GROUP:
        return (f"values of {v_bits} bits in groups of {v_group} (the Gluon kernel takes "
                f"{', '.join(map(str, VALUE_BITS))} bits in groups of {VALUE_GROUP})")
    return None


def device_limit(capability: tuple[int, int] | None, api_error: str | None, interpreting: bool) -> str | None:
    """Why no Gluon kernel runs on this device and Triton (None: they can): a CUDA device of compute
    capability 9.0, compiled kernels (not TRITON_INTERPRET=1), a Triton with the Gluon API used."""
    if capability is None:
        return "not a CUDA device"
    if interpreting:
        return "TRITON_INTERPRET=1"
    if tuple(capability) != CAPABILITY:
        return f"compute capability {capability[0]}.{capability[1]} (the Gluon kernels are for 9.0)"
    return api_error


def gluon_limit(*, capability: tuple[int, int] | None, api_error: str | None, interpreting: bool,
                q_dtype: torch.dtype, window_dtype: torch.dtype | None, decode: str, has_qjl: bool,
                head_dim: int, code_bits: int, v_bits: int, v_group: int, rows: int, programs: int,
                sm_count: int) -> str | None:
    """Why one attention call does not run the Gluon kernel (None: it does). capability: the CUDA device's
    (None: not a CUDA device); api_error: why the installed Triton lacks the Gluon API used (None: it has
    it); rows: query rows a KV head (G * Tq); programs: batch rows x KV heads; window_dtype None: no window.

    Scope: sm_90, not under the interpreter, bf16 queries and window, a codec in `codec_limit`'s scope,
    2..80 rows a KV head (one row runs flash.py's single-row paths: score tables, split-K over long
    contexts), and at least PROGRAMS_PER_SM programs an SM: the kernel has no split-K, so where the grid is
    smaller, flash.py's splits fill the GPU (the Gluon kernel was measured faster at 2B >= 128 rows x 16
    heads)."""
    why = device_limit(capability, api_error, interpreting)
    if why is not None:
        return why
    if q_dtype != torch.bfloat16 or window_dtype not in (None, torch.bfloat16):
        return f"queries {q_dtype}, window {window_dtype} (the Gluon kernel takes bf16)"
    why = codec_limit(decode, has_qjl, head_dim, code_bits, v_bits, v_group)
    if why is not None:
        return why
    if not 2 <= rows <= MAX_ROWS:
        return f"{rows} query rows a KV head (the Gluon kernel takes 2..{MAX_ROWS})"
    if programs < PROGRAMS_PER_SM * sm_count:
        return (f"{programs} (batch row, KV head) programs, under {PROGRAMS_PER_SM} an SM on {sm_count} SMs "
                f"(flash.py splits the keys)")
    return None


def encode_limit(*, capability: tuple[int, int] | None, api_error: str | None, interpreting: bool,
                 k_dtype: torch.dtype, decode: str, has_qjl: bool, head_dim: int,
                 code_bits: int) -> str | None:
    """Why one key encode does not run the Gluon kernel (None: it does): sm_90, not under the interpreter,
    16-bit keys of d = 64, a section and code width in ENCODE_BITS."""
    why = device_limit(capability, api_error, interpreting)
    if why is not None:
        return why
    if k_dtype not in ENCODE_DTYPES:
        return f"{k_dtype} keys (the Gluon encode takes bf16 and fp16)"
    widths = ENCODE_BITS.get(decode, ()) if not has_qjl else ()
    if not widths:
        return f"no Gluon encode for section {decode!r}{' with QJL' if has_qjl else ''}"
    if head_dim != HEAD_DIM:
        return f"head dim {head_dim} (the Gluon encode takes {HEAD_DIM})"
    if code_bits not in widths:
        return (f"{code_bits}-bit {decode} codes (the Gluon encode runs {', '.join(map(str, widths))} bits, "
                f"where it was measured faster)")
    return None


@functools.cache
def gluon_api() -> str | None:
    """Why the installed Triton cannot run the Gluon kernels (None when it can): gluon_flash and
    gluon_encode must import and gl.warp_specialize take (partitions, worker warps, worker registers), as from
    Triton 3.6."""
    try:
        from triton.experimental.gluon import language as gl

        from . import gluon_encode, gluon_flash  # noqa: F401  (import every Gluon name the kernels use)
    except Exception as exc:  # any import failure means the Gluon kernel cannot run
        return f"the installed Triton lacks the Gluon API ({type(exc).__name__}: {exc})"
    params = list(inspect.signature(gl.warp_specialize).parameters)
    if params[:3] != ["functions_and_args", "worker_num_warps", "worker_num_regs"]:
        return f"the installed Triton's gl.warp_specialize takes ({', '.join(params[:3])}), not the 3.6 form"
    return None


@functools.lru_cache(maxsize=16)
def device_capability(device: torch.device) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def announce(kernel: str, why: str, op: str = "attention") -> None:
    """Log once which kernel runs an op (attention, key encode) and why (once per reason, whatever its
    numbers)."""
    said = ("said", op, kernel, why)  # this exact reason seen before: the common case, no substitution
    if said in _announced:
        return
    _announced.add(said)
    key = (op, kernel, re.sub(r"\d+", "N", why))
    if key not in _announced:
        _announced.add(key)
        log.info("octopus-audio %s kernel: %s (%s)", op, kernel, why)
