"""What the sm_90 Gluon kernels take: the attention (gluon/flash.py) and the polarquant key encode
(gluon/encode.py) each declare here which calls they run and, when not, why. Pure functions of the device,
the installed Triton and the call: this module imports no Gluon, so the selector (octopus_audio/kernels/
select.py) asks it everywhere and imports the kernels only where it says they can run.

The kernels' compile-time codec ids derive from the kinds registry (`codec_id`: the kind's registry id and
the QJL side-car), and the kinds they decode are those of `KEY_BITS`.
"""

from __future__ import annotations

import torch

from ...kinds import DecodeKind
from ...kinds.polar import KIND as POLAR
from ...kinds.scalar import KIND as SCALAR
from ...kinds.triplet import KIND as TRIPLET

CAPABILITY = (9, 0)  # wgmma and the warp-group register split: Hopper
HEAD_DIM = 64  # the kernel's tiles are laid out for d = 64
MAX_ROWS = 80  # query rows (G * Tq) a program: 64 as wgmma rows, 16 swapped
# the kinds the attention decodes (gluon/decode.py) and their key code bits (turboquant-mse, polarquant b
# 1..4; turboquant-qjl b 2..5; octopus* b 1..4: 3b + 1 bits); with the QJL side-car: QJL_KINDS
KEY_BITS = {SCALAR: range(1, 5), POLAR: range(1, 5), TRIPLET: range(4, 14)}
QJL_KINDS = (SCALAR, TRIPLET)
VALUE_BITS = (2, 4, 8)  # a value word is whole groups or within one (16 channels a group)
VALUE_GROUP = 16
PROGRAMS_PER_SM = 2  # resident programs of the kernel (8 warps at 128 registers)
# the key encode: the code widths at which gluon/encode.py's kernel was measured faster than the Triton
# encode's (H200, 64k tokens x 16 heads, benchmarks/results/kernels.md)
ENCODE_BITS = {POLAR: (1, 2)}
ENCODE_DTYPES = (torch.bfloat16, torch.float16)


def codec_id(kind: DecodeKind, has_qjl: bool) -> int | None:
    """The attention kernel's CODEC id of a kind with or without the QJL side-car (2 * the kind's registry
    id, plus 1 with QJL: gluon/decode.py's TQM, TQJ, POL, OCT, OCJ), None where it has no decode for it."""
    if kind not in KEY_BITS or (has_qjl and kind not in QJL_KINDS):
        return None
    return 2 * kind.id + int(bool(has_qjl))


def codec_limit(kind: DecodeKind, has_qjl: bool, head_dim: int, code_bits: int, v_bits: int,
                v_group: int) -> str | None:
    """Why the Gluon attention cannot run a codec and value quantizer (None when it can)."""
    if codec_id(kind, has_qjl) is None:
        return f"no Gluon decode for the {kind.name} kind{' with QJL' if has_qjl else ''}"
    if head_dim != HEAD_DIM:
        return f"head dim {head_dim} (the Gluon kernel takes {HEAD_DIM})"
    bits = KEY_BITS[kind]
    if code_bits not in bits:
        return (f"{code_bits}-bit key codes (the Gluon kernel's {kind.name} decode takes "
                f"{bits[0]}..{bits[-1]})")
    if v_bits not in VALUE_BITS or v_group != VALUE_GROUP:
        return (f"values of {v_bits} bits in groups of {v_group} (the Gluon kernel takes "
                f"{', '.join(map(str, VALUE_BITS))} bits in groups of {VALUE_GROUP})")
    return None


def wide_limit(*, kind: DecodeKind, has_qjl: bool, head_dim: int, code_bits: int, v_bits: int, v_group: int,
               same_rotation: bool) -> str | None:
    """Why the Gluon attention cannot read a wide store beside the main one (None: it can): the wide codec and
    value quantizer in `codec_limit`'s scope, and the main codec's rotation (the kernel rotates the queries
    once and scores both stores with them; a wide prefix built by the cache shares its seed)."""
    why = codec_limit(kind, has_qjl, head_dim, code_bits, v_bits, v_group)
    if why is not None:
        return f"a wide prefix of {why}"
    if not same_rotation:
        return "a wide prefix with a rotation of its own (the Gluon kernel rotates the queries once)"
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
                q_dtype: torch.dtype, window_dtype: torch.dtype | None, kind: DecodeKind, has_qjl: bool,
                head_dim: int, code_bits: int, v_bits: int, v_group: int, rows: int, programs: int,
                sm_count: int) -> str | None:
    """Why one attention call does not run the Gluon kernel (None: it does). capability: the CUDA device's
    (None: not a CUDA device); api_error: why the installed Triton lacks the Gluon API used (None: it has
    it); rows: query rows a KV head (G * Tq); programs: batch rows x KV heads; window_dtype None: no window.

    Scope: sm_90, not under the interpreter, bf16 queries and window, a codec in `codec_limit`'s scope,
    2..80 rows a KV head (one row runs the single-row paths: score tables, split-K over long contexts), and
    at least PROGRAMS_PER_SM programs an SM: the kernel has no split-K, so where the grid is smaller,
    split-K fills the GPU (the Gluon kernel was measured faster at 2B >= 128 rows x 16 heads)."""
    why = device_limit(capability, api_error, interpreting)
    if why is not None:
        return why
    if q_dtype != torch.bfloat16 or window_dtype not in (None, torch.bfloat16):
        return f"queries {q_dtype}, window {window_dtype} (the Gluon kernel takes bf16)"
    why = codec_limit(kind, has_qjl, head_dim, code_bits, v_bits, v_group)
    if why is not None:
        return why
    if not 2 <= rows <= MAX_ROWS:
        return f"{rows} query rows a KV head (the Gluon kernel takes 2..{MAX_ROWS})"
    if programs < PROGRAMS_PER_SM * sm_count:
        return (f"{programs} (batch row, KV head) programs, under {PROGRAMS_PER_SM} an SM on {sm_count} SMs "
                f"(split-K splits the keys)")
    return None


def encode_limit(*, capability: tuple[int, int] | None, api_error: str | None, interpreting: bool,
                 k_dtype: torch.dtype, kind: DecodeKind, has_qjl: bool, head_dim: int,
                 code_bits: int) -> str | None:
    """Why one key encode does not run the Gluon kernel (None: it does): sm_90, not under the interpreter,
    16-bit keys of d = 64, a kind and code width in ENCODE_BITS."""
    why = device_limit(capability, api_error, interpreting)
    if why is not None:
        return why
    if k_dtype not in ENCODE_DTYPES:
        return f"{k_dtype} keys (the Gluon encode takes bf16 and fp16)"
    widths = ENCODE_BITS.get(kind, ()) if not has_qjl else ()
    if not widths:
        return f"no Gluon encode for the {kind.name} kind{' with QJL' if has_qjl else ''}"
    if head_dim != HEAD_DIM:
        return f"head dim {head_dim} (the Gluon encode takes {HEAD_DIM})"
    if code_bits not in widths:
        return (f"{code_bits}-bit {kind.name} codes (the Gluon encode runs {', '.join(map(str, widths))} "
                f"bits, where it was measured faster)")
    return None
