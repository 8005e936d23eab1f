"""The one dispatch point between the codec library and octopus_audio.kernels: the fused kernels or the
PyTorch reference, and which kernel implementations may run.

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
A cache asks once per sequence, at its first unit (`CachePlan`): the per-call path then runs the chosen ops
with no environment, backend or kernel-table lookups. Inside `reference_backend(why)` the sequences that
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

from octopus_audio import rotation
from octopus_audio.codecs.base import KeyState
from octopus_audio.packing import num_words
from octopus_audio.values import ValueState

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


def _announce(backend: str, why: str) -> None:
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
        _announce("reference", f"codec {codec.name}: plain SDPA over native K/V")
        return "reference"
    if codec is not None and codec.kernel_decode is None:
        _announce("reference", f"codec {codec.name} has no kernel decode kind")
        return "reference"
    forced = _forced_reference.get()
    if forced is not None:
        _announce("reference", forced)
        return "reference"
    if asked == "reference":
        _announce("reference", f"{ENV_VAR}=reference")
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
        _announce("triton", f"{ENV_VAR}={asked}")
        return "triton"
    if device.type == "cuda" and ok:
        _announce("triton", f"auto: CUDA tensors on {device}")
        return "triton"
    _announce("reference", f"auto: {why}" if not ok else f"auto: tensors on {device}")
    return "reference"


def _ops():
    return _kernel_ops()[0]


# ---- the kernels' view of a codec (tables and rotations as octopus_audio.kernels.KernelCodec) ----

def kernel_limit(codec, for_encode: bool = True) -> str | None:
    """Why the fused kernels cannot run this codec (None when they can): its decode kind (registered, with a
    key encode for `for_encode`), head dim and code width, and the codec's own `kernel_limit`."""
    from octopus_audio.kernels import kind_named
    from octopus_audio.kernels.spec import MAX_CODE_BITS, MAX_HEAD_DIM, MIN_HEAD_DIM

    if codec.kernel_decode is None:
        return f"codec {codec.name} has no kernel decode kind"
    try:
        kind = kind_named(codec.kernel_decode)
    except ValueError as e:
        return f"codec {codec.name}: {e}"
    if for_encode and kind.encode is None:
        return f"the {kind.name} kind has no kernel key encode"
    if not MIN_HEAD_DIM <= codec.head_dim <= MAX_HEAD_DIM:
        return f"head dim {codec.head_dim} is outside the kernels' {MIN_HEAD_DIM}..{MAX_HEAD_DIM}"
    if codec.layout.code_bits > MAX_CODE_BITS:
        return f"{codec.layout.code_bits}-bit codes are wider than the kernels' {MAX_CODE_BITS}"
    return codec.kernel_limit(for_encode)


def kernel_codec(codec, num_heads: int, device):
    """`codec` (a RotationCodec with a `kernel_decode` kind) as octopus_audio.kernels.KernelCodec on
    `device`, built from its declaration (layout, rotations, tables), cached on the codec."""
    from octopus_audio.codecs.qjl import QJL_STREAM
    from octopus_audio.kernels import KernelCodec

    device = torch.device(device)

    def make():
        layout = codec.layout
        qjl_signs = codec.signs(num_heads, device, stream=QJL_STREAM) if codec.qjl else None
        kc = KernelCodec(codec.kernel_decode, codec.head_dim, layout.code_bits, layout.num_codes,
                         codec.signs(num_heads, device), rotation.hadamard(codec.head_dim, device), qjl_signs,
                         codec.kernel_tables(device), codec.kernel_params(), codec.name)
        return kc.to(device)

    return codec._cached(("kernel_codec", num_heads, str(device)), make)


# ---- what one generation of a cache runs, decided once at its first unit ----

class CachePlan:
    """The ops a CompressedKVCache runs for one generation (one layout), chosen once when its first unit
    arrives, so the per-call path does no backend, environment or kernel-codec lookups.

    backend: "triton" or "reference" (attention_backend for the device and codec); kernel: the kernels' view
    of the codec (KernelCodec, built once and cached on the codec) when the encode or attention kernel runs;
    gluon: whether the kernels' selector may pick the Gluon kernels (OCTOPUS_AUDIO_KERNELS is not `triton`);
    used: per op, the kernel implementations that ran and why (`kernels_used`).
    encode_keys(codec, k) -> KeyState, encode_values(quantizer, v) -> ValueState (data checks are the
    caller's), attention(cache, q, scale) -> [B, Hq, Tq, d]: one softmax over the store and the native tokens
    (prefix and window, one segment the kernels take as their window).
    """

    def __init__(self, codec, num_heads: int, device: torch.device) -> None:
        self.backend = attention_backend(device, codec)
        self.native = not codec.compressed
        self.kernel = None
        self.kernel_encode = self.kernel_attention = False
        self.gluon = False  # the Gluon attention and key encode where in scope (kernels/select.py)
        self.used: dict[str, dict[str, str]] = {}
        if self.backend == "triton":
            why_encode, why_attend = kernel_limit(codec), kernel_limit(codec, for_encode=False)
            if why_encode is not None:
                _announce("reference", f"encode: {why_encode}")
            if why_attend is not None:
                _announce("reference", f"attention: {why_attend}")
            self.kernel_encode, self.kernel_attention = why_encode is None, why_attend is None
            if self.kernel_encode or self.kernel_attention:
                self.kernel = kernel_codec(codec, num_heads, device)
            self.ops = _ops()
            self.gluon = requested() != "triton"
            from octopus_audio.kernels import PackedKeys, PackedValues

            self._packed_keys, self._packed_values = PackedKeys, PackedValues
        self._empty = None  # (batch, PackedKeys, PackedValues) of an empty store, for window-only attention

    def fused_encoder(self, quantizer):
        """`encode_unit` (keys and values of a unit in one launch, written into the store in place, data
        checks recorded by the kernel) when this plan runs the encode kernels and the values (`quantizer`)
        come in groups it takes; else None (separate encodes, then copies into the store)."""
        if quantizer is None or not self.kernel_encode or quantizer.group < 8 or quantizer.group & (
                quantizer.group - 1):
            return None
        self.used.setdefault("unit encode", {}).setdefault("triton", "keys and values in one launch")
        return self.ops.encode_unit

    def encode_keys(self, codec, k: torch.Tensor):
        """k [B, H, T, d] -> KeyState (codec none: k itself, the store copies it)."""
        if self.native:
            return KeyState(dtype=k.dtype, native=k, written_by=codec.state_tag)
        if self.kernel_encode:
            p = self.ops.encode_keys(k, self.kernel, gluon=self.gluon, record=self.used)
            return KeyState(dtype=k.dtype, codes=p.codes, gamma=p.gamma, signs=p.signs, gamma_r=p.gamma_r,
                            written_by=codec.state_tag)
        return codec.encode_unchecked(k)

    def encode_values(self, quantizer, v: torch.Tensor):
        """v [B, H, T, d] -> ValueState (quantizer None: v itself, the store copies it)."""
        if quantizer is None:
            return ValueState(dtype=v.dtype, native=v)
        if self.backend == "triton":
            p = self.ops.encode_values(v, quantizer.bits, quantizer.group, check_range=False)
            return ValueState(dtype=v.dtype, codes=p.codes, scale=p.scale, minimum=p.minimum)
        return quantizer.encode_unchecked(v)

    def attention(self, cache, q: torch.Tensor, scale: float) -> torch.Tensor:
        if not self.kernel_attention:
            return cache.attend_reference(q, scale)
        store, window = cache.store, cache.native_kv()  # the native segment: the prefix, then the window
        if store is not None:
            keys, values = store.packed(self._packed_keys, self._packed_values, cache.value_quantizer)
        else:
            keys, values = self._empty_store(q, cache.value_quantizer)
        k_win, v_win = window if window is not None else (None, None)
        return self.ops.attention(q, keys, values, cache.length, k_win, v_win, self.kernel, scale=scale,
                                  gluon=self.gluon, record=self.used)

    def kernels_used(self) -> str | None:
        """The kernel implementations that ran, per op (`attention: split-k, score-tables; key encode:
        triton`), None before any ran."""
        return "; ".join(f"{op}: {', '.join(impls)}" for op, impls in self.used.items()) or None

    def _empty_store(self, q: torch.Tensor, quant):
        """An empty store of the right shapes (the first scale attends to the window only)."""
        if self._empty is not None and self._empty[0] == q.shape[0]:
            return self._empty[1:]
        kc, heads = self.kernel, self.kernel.num_heads

        def empty(*tail, dtype):
            return torch.zeros(q.shape[0], heads, 0, *tail, dtype=dtype, device=q.device)

        keys = self._packed_keys(empty(kc.code_words, dtype=torch.int32), empty(dtype=torch.bfloat16),
                                 empty(num_words(kc.head_dim, 1), dtype=torch.int32) if kc.has_qjl else None,
                                 empty(dtype=torch.bfloat16) if kc.has_qjl else None)
        values = self._packed_values(empty(num_words(kc.head_dim, quant.bits), dtype=torch.int32),
                                     empty(kc.head_dim // quant.group, dtype=torch.float16),
                                     empty(kc.head_dim // quant.group, dtype=torch.float16), quant.bits,
                                     quant.group)
        self._empty = (q.shape[0], keys, values)
        return keys, values
