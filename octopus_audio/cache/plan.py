"""What one sequence of a cache runs, decided once at its first unit (`CachePlan`): the key and value encodes
and the fused attention, the kernels or the codec library. The plan takes tensors (units, the store, the
native segment, queries), never the cache."""

from __future__ import annotations

import functools

import torch

from octopus_audio.cache.backend import announce, attention_backend, kernel_ops, requested
from octopus_audio.cache.kernel_view import kernel_codec, kernel_limit
from octopus_audio.cache.store import CacheStore
from octopus_audio.codecs.base import KeyState
from octopus_audio.packing import num_words
from octopus_audio.values import ValueState


class CachePlan:
    """The ops a CompressedKVCache runs for one sequence (one layout), chosen once when its first unit
    arrives, so the per-call path does no backend, environment or kernel-codec lookups.

    backend: "triton" or "reference" (`backend.attention_backend` for the device and codec); kernel: the
    kernels' view of the codec (KernelCodec, built once and cached on the codec) when the encode or attention
    kernel runs; kernel_encode / kernel_attention: whether those kernels run (else the codec library and the
    cache's reference attention); gluon: whether the kernels' selector may pick the Gluon kernels
    (OCTOPUS_AUDIO_KERNELS is not `triton`); used: per op, the kernel implementations that ran and why
    (`kernels_used`).
    encode_keys(codec, k) -> KeyState, encode_values(quantizer, v) -> ValueState (data checks are the
    caller's); `fused_encoder` the one-launch unit encode into a store; attention(q, scale, store,
    native_kv, quantizer) -> [B, Hq, Tq, d]: the fused attention, one softmax over the store and the native
    tokens (prefix and window, one segment the kernels take as their window).
    """

    def __init__(self, codec, num_heads: int, device: torch.device, wide=None) -> None:
        self.backend = attention_backend(device, codec)
        self.native = not codec.compressed
        self.kernel = None
        self.kernel_encode = self.kernel_attention = False
        self.gluon = False  # the Gluon attention and key encode where in scope (kernels/select.py)
        self.used: dict[str, dict[str, str]] = {}
        if self.backend == "triton":
            why_encode, why_attend = kernel_limit(codec), kernel_limit(codec, for_encode=False)
            if why_attend is None and wide is not None and kernel_limit(wide, for_encode=False) is not None:
                why_attend = f"the wide prefix's codec: {kernel_limit(wide, for_encode=False)}"
            if why_encode is not None:
                announce("reference", f"encode: {why_encode}")
            if why_attend is not None:
                announce("reference", f"attention: {why_attend}")
            self.kernel_encode, self.kernel_attention = why_encode is None, why_attend is None
            if self.kernel_encode or self.kernel_attention:
                self.kernel = kernel_codec(codec, num_heads, device)
            self.ops = kernel_ops()
            self.gluon = requested() != "triton"
            self._packed_keys, self._packed_values = self.ops.PackedKeys, self.ops.PackedValues
        self._empty = None  # (batch, PackedKeys, PackedValues) of an empty store, for window-only attention

    def fused_encoder(self, quantizer):
        """`encode_unit` bound to `quantizer` (keys and values of a unit in one launch, written into the store
        in place, data checks recorded by the kernel) when this plan runs the encode kernels and the values
        come in groups it takes; else None (separate encodes, then copies into the store)."""
        if quantizer is None or not self.kernel_encode or quantizer.group < 8 or quantizer.group & (
                quantizer.group - 1):
            return None
        self.used.setdefault("unit encode", {}).setdefault("triton", "keys and values in one launch")
        return functools.partial(self.encode_unit, quantizer)

    def encode_unit(self, quantizer, k: torch.Tensor, v: torch.Tensor, store: CacheStore,
                    flags: torch.Tensor | None) -> None:
        """Tokens k, v [B, H, T, d] encoded in one launch into `store`'s buffers from its `length` on (room
        reserved by the caller, who also advances `length`); `flags`: the deferred-check row the kernel writes
        (None: no record)."""
        keys, values = store.packed(self._packed_keys, self._packed_values, quantizer)
        self.ops.encode_unit(k, v, self.kernel, keys, values, store.length, flags)

    def encode_keys(self, codec, k: torch.Tensor) -> KeyState:
        """k [B, H, T, d] -> KeyState (codec none: k itself, the store copies it)."""
        if self.native:
            return KeyState(dtype=k.dtype, native=k, written_by=codec.state_tag)
        if self.kernel_encode:
            p = self.ops.encode_keys(k, self.kernel, gluon=self.gluon, record=self.used)
            return KeyState(dtype=k.dtype, codes=p.codes, gamma=p.gamma, signs=p.signs, gamma_r=p.gamma_r,
                            written_by=codec.state_tag)
        return codec.encode_unchecked(k)

    def encode_values(self, quantizer, v: torch.Tensor) -> ValueState:
        """v [B, H, T, d] -> ValueState (quantizer None: v itself, the store copies it)."""
        if quantizer is None:
            return ValueState(dtype=v.dtype, native=v)
        if self.backend == "triton":
            p = self.ops.encode_values(v, quantizer.bits, quantizer.group, check_range=False)
            return ValueState(dtype=v.dtype, codes=p.codes, scale=p.scale, minimum=p.minimum)
        return quantizer.encode_unchecked(v)

    def attention(self, q: torch.Tensor, scale: float, store: CacheStore | None,
                  native_kv: tuple[torch.Tensor, torch.Tensor] | None, quantizer, wide=None) -> torch.Tensor:
        """The fused attention (`kernel_attention` plans only) of q [B, Hq, Tq, d] over the store's valid
        tokens (None: an empty store), the wide prefix (`wide`: its (store, plan, quantizer), None: none) and
        the native K, V [B, H, T_native, d] (the prefix then the window; None: none), values decoded by
        `quantizer`'s widths -> [B, Hq, Tq, d]."""
        if store is not None:
            keys, values = store.packed(self._packed_keys, self._packed_values, quantizer)
        else:
            keys, values = self._empty_store(q, quantizer)
        k_win, v_win = native_kv if native_kv is not None else (None, None)
        if wide is not None:
            w_store, w_plan, w_quant = wide
            w_keys, w_values = w_store.packed(self._packed_keys, self._packed_values, w_quant)
            wide = self.ops.WideSegment(w_keys, w_values, w_store.length, w_plan.kernel)
        return self.ops.attention(q, keys, values, 0 if store is None else store.length, k_win, v_win,
                                  self.kernel, scale=scale, gluon=self.gluon, record=self.used, wide=wide)

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
