"""Compressed KV cache of one attention layer: the newest W units and the first P tokens native, the other
units encoded once into packed buffers. Its parts live beside it: the store and its growth (cache_store), the
native tokens (cache_native), the backend plan (backend), the data checks (cache_checks), the byte accounting
(cache_accounting)."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Sequence

import torch

from octopus_audio import backend as _backend
from octopus_audio.cache_accounting import bytes_breakdown, fp16_bytes
from octopus_audio.cache_checks import DeferredFlags, check_caches, check_layout, check_unit
from octopus_audio.cache_native import NativeSegment
from octopus_audio.cache_store import CacheStore, empty_store
from octopus_audio.codecs import get_codec
from octopus_audio.codecs.base import require_tensor
from octopus_audio.reference import attend
from octopus_audio.values import ValueQuantizer


@dataclasses.dataclass
class _Sequence:
    """What one sequence (its first unit to `reset`) holds, and what its first unit decided: the layout
    (B, H, dtype, device), the ops (`plan`), whether checks are deferred, the fused encode (or None)."""

    layout: tuple
    plan: _backend.CachePlan
    deferred: bool
    fused: Callable | None
    native: NativeSegment | None = None  # the prefix and the window (None before the first native token)
    store: CacheStore | None = None
    units_left: int = 0  # units that have left the window (their tokens to the prefix or the store)
    flushed: int = 0  # units whose deferred record is complete (fused: the window is recorded late)
    # dtype -> (decoded K chunks, decoded V chunks, store tokens they cover): the reference path decodes each
    # stored token once a sequence
    decoded: dict = dataclasses.field(default_factory=dict)


def sequence_capacities(units: Sequence[int], window: int, native_prefix: int = 0) -> tuple[int, int]:
    """(store tokens, native tokens at their peak) of one sequence of `units` (tokens per unit, in order)
    appended to a cache with `window` and `native_prefix`: the `capacity` and `native_capacity` that hold the
    sequence with no growth and no spare room."""
    prefix = store = peak = 0
    held: list[int] = []  # the window's units
    for t in units:
        held.append(t)
        if len(held) > window:  # the oldest leaves: its first tokens to the prefix, the rest stored
            leaving = held.pop(0)
            keep = min(max(native_prefix - prefix, 0), leaving)
            prefix += keep
            store += leaving - keep
        peak = max(peak, prefix + sum(held))
    return store, peak


class CompressedKVCache:
    """KV cache of one attention layer with compressed keys (any codec) and group-quantized values.

    append(k, v): one unit (k, v [B, H, T_unit, d]); the newest `window` units stay native, and a unit is
    encoded exactly once, when it leaves the window (window=0 encodes every unit at once).
    native_prefix: the sequence's first `native_prefix` tokens stay native for good (an "attention sink":
    AAR's coarsest scales, which every later token attends to; `aar_patch.patch_aar(sink_scales=S)` passes
    the tokens of its first S scales). Tokens, not units: a unit's size is the caller's chunking (a language
    model may append a whole prompt as one unit), and a unit leaving the window is split where the prefix
    ends (its first tokens native, the rest encoded). The prefix and the window are held back to back in one
    native buffer (`cache_native`), so attention reads them as one native segment with no concatenation,
    and the accounting counts the prefix as native bytes.
    attend(q [B, Hq, Tq, d], scale) -> [B, Hq, Tq, d] in q's dtype: one softmax over the compressed store and
    the native tokens (prefix and window); Hq = G * H, query head j uses KV head j // G. Codec `none` stores
    native K/V and attends with plain SDPA in the native dtype (bit-identical to SDPA over the concatenated
    K/V).
    The codec's seed is used as is (per layer: `octopus_audio.rotation.layer_seed(base_seed, layer)`).
    Values use `v_bits` bits (None: the same `bits` as keys), in groups of `v_group` channels.
    capacity: tokens the compressed store is allocated for when it is first written (None: just the first
    unit); past it the store grows by doubling. native_capacity: the same for the native buffer (prefix and
    window), sized at the first unit. A caller that knows the sequence (AAR: `sequence_capacities`) avoids the
    growth copies and the spare capacity.

    Data checks (finite keys; values finite, and within the fp16 range when quantized): `defer_checks` None
    (default) checks each unit at `append` on the CPU and defers the check on CUDA, where reading the result
    would stall the host once per unit; True / False force either. Deferred, each append only updates a
    device-side record (no host sync), and `check()` raises the same ValueError later: call it when the
    sequence ends (the AAR patch does, at `kv_caching(False)`); `decoded_kv` checks too. Layout, backend
    and kernel tables are decided once per sequence, at its first unit (after `reset()`).

    Compared with a transformers cache layer (`update(k, v)` returns the whole K/V for the model's own
    attention), this cache never hands out K/V: the layer calls `append` then `attend`, so the store stays
    packed and attention runs from it. `num_tokens` is the layer's sequence length; `reset` its `reset`.
    """

    def __init__(self, codec: str, bits: int, head_dim: int, window: int = 1, v_group: int = 16,
                 seed: int = 0, v_bits: int | None = None, capacity: int | None = None,
                 defer_checks: bool | None = None, native_prefix: int = 0, native_capacity: int | None = None,
                 **codec_options) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError(f"window must be an integer >= 0 (units kept native), got {window!r}")
        if isinstance(native_prefix, bool) or not isinstance(native_prefix, int) or native_prefix < 0:
            raise ValueError(f"native_prefix must be an integer >= 0 (the sequence's first tokens kept "
                             f"native), got {native_prefix!r}")
        for name, value in (("capacity", capacity), ("native_capacity", native_capacity)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be None or an integer >= 0 (tokens), got {value!r}")
        if defer_checks not in (None, True, False):
            raise ValueError(f"defer_checks must be None (defer on CUDA), True or False, "
                             f"got {defer_checks!r}")
        self.capacity = capacity
        self.native_capacity = native_capacity
        self.native_prefix = native_prefix
        self.defer_checks = defer_checks
        self.codec = get_codec(codec, bits, head_dim, seed=seed, **codec_options)
        self.codec_name = codec
        self.bits = bits
        self.v_bits = bits if v_bits is None else v_bits
        self.head_dim = head_dim
        self.window = window
        self.v_group = v_group
        self.seed = seed
        self.value_quantizer = (ValueQuantizer(self.v_bits, head_dim, v_group) if self.codec.compressed
                                else None)
        self._flags: DeferredFlags | None = None  # kept across reset(): a graph replay writes the last ones
        self.checks_pending = False  # units appended since the last deferred check
        self.reset()

    # ---- state ----
    def reset(self) -> None:
        """Drop every token (buffers included). Unchecked deferred checks are dropped with them."""
        self._seq: _Sequence | None = None
        self.checks_pending = False

    @property
    def store(self) -> CacheStore | None:
        """The compressed store of the current sequence (None before its first encoded unit)."""
        return None if self._seq is None else self._seq.store

    @property
    def _native(self) -> NativeSegment | None:
        return None if self._seq is None else self._seq.native

    @property
    def _plan(self) -> _backend.CachePlan | None:
        return None if self._seq is None else self._seq.plan

    @property
    def _fused(self) -> Callable | None:
        return None if self._seq is None else self._seq.fused

    @property
    def length(self) -> int:
        """Tokens in the compressed store."""
        return 0 if self.store is None else self.store.length

    @property
    def window_tokens(self) -> int:
        return 0 if self._native is None else self._native.window_tokens

    @property
    def prefix_tokens(self) -> int:
        """Tokens of the native prefix held (at most `native_prefix`)."""
        return 0 if self._native is None else self._native.prefix_tokens

    @property
    def num_tokens(self) -> int:
        """All tokens held (compressed store + native prefix + native window)."""
        return self.length + (0 if self._native is None else self._native.tokens)

    def __len__(self) -> int:
        return self.num_tokens

    @property
    def num_units(self) -> int:
        seq = self._seq
        return 0 if seq is None else seq.units_left + (0 if seq.native is None else len(seq.native.units))

    @property
    def device(self) -> torch.device | None:
        return None if self._seq is None else self._seq.layout[3]

    @property
    def backend(self) -> str:
        """The attention backend that runs for this cache ("triton" or "reference")."""
        if self._seq is not None:
            return self._seq.plan.backend
        return _backend.attention_backend(None, self.codec)

    @property
    def checks_deferred(self) -> bool:
        """Whether the units held are checked later (`check()`) rather than at `append`."""
        return self._seq is not None and self._seq.deferred

    def window_kv(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Native window K, V [B, H, T_window, d] (views of the native buffer; None when empty)."""
        return self._native.window_kv() if self.window_tokens else None

    def native_kv(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Every native token, the prefix then the window, K and V [B, H, T_native, d]: one view of the native
        buffer, nothing copied (None when none is held). What attention reads beside the store."""
        return None if self._native is None else self._native.kv()

    # ---- accounting ----
    @property
    def _rows(self) -> int:
        return 0 if self._seq is None else self._seq.layout[0] * self._seq.layout[1]

    @property
    def nbytes(self) -> int:
        """Bytes held: compressed store (valid tokens) plus the native prefix and window."""
        b = self.bytes_breakdown()
        return b["k_bytes"] + b["v_bytes"] + b["native_bytes"]

    @property
    def native_nbytes(self) -> int:
        """fp16 bytes of the same K and V (what an uncompressed fp16 cache would hold)."""
        return fp16_bytes(self._rows, self.num_tokens, self.head_dim)

    def bytes_breakdown(self) -> dict[str, int]:
        """Key, value, prefix and window bytes plus token counts (`cache_accounting.bytes_breakdown`)."""
        return bytes_breakdown(self.store, self._native, self._rows, self.head_dim)

    def prepare(self, num_heads: int, device: torch.device | str) -> None:
        """Build before the first sequence what a sequence of `num_heads` KV heads on `device` needs from the
        host: the kernels' view of the codec (its tables and rotation signs, cached on the codec) and the
        codec's own sign vectors. On CUDA each of those host-to-device copies is a host sync, six per layer
        for octopus; made here, a generation copies nothing from the host. Optional: the first unit of the
        first sequence builds them otherwise."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:  # as a tensor's device says it: "cuda:0"
            device = torch.device("cuda", torch.cuda.current_device())
        _backend.CachePlan(self.codec, num_heads, device)
        if self.codec.compressed:
            from octopus_audio.codecs.qjl import QJL_STREAM

            self.codec.signs(num_heads, device)
            if self.codec.qjl:
                self.codec.signs(num_heads, device, stream=QJL_STREAM)

    # ---- data checks (cache_checks) ----
    def check(self) -> None:
        """Run the deferred data checks of the units appended so far (one host sync; nothing to do when the
        checks are immediate or already done). Raises the ValueError `append` would have raised."""
        check_caches([self])

    def deferred_flags(self) -> DeferredFlags | None:
        """The device-side record the current (or last) sequence's deferred checks write, or None. A CUDA
        graph that captured a sequence rewrites these same tensors on each replay: `check_flags([...])`
        after a replay checks it."""
        return self._flags

    def flush_checks(self) -> None:
        """Deferred and fused: record the window units (the kernel records a unit only when it encodes it),
        so the record covers every unit. Device work only."""
        seq = self._seq
        if seq is None or not (seq.deferred and seq.fused) or seq.native is None:
            return
        first = max(seq.flushed, seq.units_left)
        for i, (k, v) in enumerate(seq.native.window_units()[first - seq.units_left:]):
            self._flags.record(first + i, k, v)
        seq.flushed = self.num_units

    def _check_data(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Finite keys; values finite (and within fp16 when quantized): now (one host sync) or deferred."""
        seq = self._seq
        if not seq.deferred:
            check_unit(k, v, self.value_quantizer is not None)
        elif k.numel():
            unit = self.num_units
            if seq.fused:
                self._flags.row(unit)  # written by the encode kernel, or by flush_checks in the window
            else:
                self._flags.record(unit, k, v)
            self.checks_pending = True

    # ---- append ----
    def _begin(self, k: torch.Tensor) -> _Sequence:
        """The first unit of a sequence: fix its layout and the ops and checks the sequence runs."""
        device = k.device
        plan = _backend.CachePlan(self.codec, k.shape[1], device)
        deferred = device.type == "cuda" if self.defer_checks is None else self.defer_checks
        if deferred:
            # fresh each sequence (a graph that captured one keeps rewriting the record it saw)
            self._flags = DeferredFlags(device, self.value_quantizer is not None)
        return _Sequence((k.shape[0], k.shape[1], k.dtype, device), plan, deferred,
                         plan.fused_encoder(self.value_quantizer))

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Add one unit (k, v [B, H, T_unit, d]); the oldest window unit beyond `window` leaves the window
        (its tokens to the native prefix while it has room, the rest encoded into the store)."""
        first = self._seq is None
        layout = None if first else self._seq.layout
        # a later unit of the sequence's own layout skips the checks (the per-unit fast path)
        if first or (k.shape != v.shape or k.ndim != 4 or k.shape[0] != layout[0] or k.shape[1] != layout[1]
                     or not k.shape[2] or k.shape[3] != self.head_dim or k.dtype != layout[2]
                     or v.dtype != layout[2] or k.device != layout[3] or v.device != layout[3]):
            check_layout(k, v, self.head_dim, layout)
            self.codec.check_keys(k)
        if first:
            self._seq = self._begin(k)
        try:
            self._check_data(k, v)
        except ValueError:
            if first:
                self.reset()
            raise
        if not self.window:  # window 0: the unit leaves as it arrives, never kept in a window
            self._leave(k, v, buffered=False)
            return
        native = self._native_segment(k, k.shape[2])
        if len(native.units) == self.window:  # the oldest leaves first: the new unit takes its place
            self._leave(*native.oldest(), buffered=True)
        native.push(k, v)

    def _native_segment(self, k: torch.Tensor, n: int) -> NativeSegment:
        """The sequence's native buffer, created for `native_capacity` tokens (at least n) at first use."""
        seq = self._seq
        if seq.native is None:
            seq.native = NativeSegment(k, max(n, self.native_capacity or 0))
        return seq.native

    def _leave(self, k: torch.Tensor, v: torch.Tensor, buffered: bool) -> None:
        """The oldest unit leaves the window (k, v: views of it in the native buffer when `buffered`, else the
        unit as appended): its first tokens join the native prefix while it has room, the rest are encoded
        into the store."""
        seq, t = self._seq, k.shape[2]
        held = 0 if seq.native is None else seq.native.prefix_tokens
        keep = min(max(self.native_prefix - held, 0), t)
        if keep and seq.deferred and seq.fused:
            self._flags.record(seq.units_left, k, v)  # the fused encode checks only the tokens it encodes
        if keep < t:
            self._compress(k.narrow(2, keep, t - keep), v.narrow(2, keep, t - keep), kernel_checks=not keep)
        if buffered:
            seq.native.pop(keep)
        elif keep:
            self._native_segment(k, keep).extend_prefix(k.narrow(2, 0, keep), v.narrow(2, 0, keep))
        seq.units_left += 1

    def _compress(self, k: torch.Tensor, v: torch.Tensor, kernel_checks: bool = True) -> None:
        """Encode the tokens of the unit leaving the window into the store (created at the first, grown as
        needed). `kernel_checks`: the fused encode writes the unit's deferred check (else it is recorded)."""
        seq, n = self._seq, k.shape[2]
        capacity = max(n, self.capacity or 0)
        if seq.fused is not None:
            if seq.store is None:
                seq.store = empty_store(self.codec, self.value_quantizer, k, capacity)
            seq.store.reserve(n)
            from octopus_audio.kernels import PackedKeys, PackedValues

            keys, values = seq.store.packed(PackedKeys, PackedValues, self.value_quantizer)
            flags = self._flags.row(seq.units_left) if seq.deferred and kernel_checks else None
            seq.fused(k, v, seq.plan.kernel, keys, values, seq.store.length, flags)
            seq.store.length += n
        else:
            k_state = seq.plan.encode_keys(self.codec, k)
            v_state = seq.plan.encode_values(self.value_quantizer, v)
            if seq.store is None:
                seq.store = CacheStore(k_state.with_capacity(capacity), v_state.with_capacity(capacity), n)
            else:
                seq.store.reserve(n)
                seq.store.write(k_state, v_state, n)

    # ---- reorder and rollback (what a language model's generation asks of its cache) ----
    def select_rows(self, index: torch.Tensor) -> None:
        """Keep batch rows `index` of every held token, in that order: row i becomes the old row index[i]
        (a beam search's reorder; repeats allowed, any length >= 1). `index` is a 1-D integer tensor whose
        entries lie in 0..B-1 (not checked here: that would cost a host sync). The store and the native buffer
        (prefix and window) are copied; nothing is encoded again. An empty cache has nothing to reorder."""
        seq = self._seq
        if isinstance(index, torch.Tensor) and (index.ndim != 1 or not index.numel()
                                                or index.dtype.is_floating_point or index.dtype.is_complex):
            index = None
        if not isinstance(index, torch.Tensor):
            raise ValueError("select_rows takes a 1-D integer tensor of batch rows (at least one)")
        if seq is None:
            return
        index = index.to(device=seq.layout[3], dtype=torch.long)
        if seq.store is not None:
            seq.store.select_rows(index)
        if seq.native is not None:
            seq.native.select_rows(index)
        seq.decoded.clear()
        seq.layout = (index.numel(), *seq.layout[1:])

    def crop(self, num_tokens: int) -> None:
        """Keep the first `num_tokens` held tokens in sequence order (the native prefix's, the store's, then
        the window's) and drop the rest: a rollback of the newest tokens (speculative decoding). What is kept
        stays as it is held: a token already encoded stays encoded, so the window may hold fewer than `window`
        units until new units arrive, and a prefix cut short fills again from the next units that leave the
        window. 0 empties the cache (`reset`)."""
        held = self.num_tokens
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, numbers.Integral) or not (
                0 <= num_tokens <= held):
            raise ValueError(f"crop keeps a number of tokens from 0 to the {held} held, got {num_tokens!r}")
        if num_tokens == held:
            return
        if num_tokens == 0:
            self.reset()
            return
        seq, prefix, stored = self._seq, self.prefix_tokens, self.length
        keep_stored = min(max(num_tokens - prefix, 0), stored)
        if keep_stored < stored:
            seq.store.length = keep_stored
            seq.decoded.clear()
        if seq.native is not None:  # the prefix's kept tokens, then the window's (back to back in the buffer)
            seq.native.crop(min(num_tokens, prefix) + max(num_tokens - prefix - stored, 0))
        seq.flushed = min(seq.flushed, self.num_units)

    # ---- attend ----
    def _check_query(self, q: torch.Tensor, scale: float, layout: tuple | None = None,
                     what: str = "attend", data: bool = False) -> int:
        """q's type and shape against the cache's (or `layout`'s) batch, heads and head dim, and the scale;
        `data` (the checked path: one host sync) also refuses NaN or Inf in q."""
        layout = layout or (None if self._seq is None else self._seq.layout)
        if layout is None:
            raise ValueError("attend called on an empty cache: append a unit first")
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not 0 < float(scale) < math.inf:
            raise ValueError(f"{what} takes a finite positive scale (the softmax temperature, usually "
                             f"1/sqrt(head_dim)), got {scale!r}")
        require_tensor(q, f"{what}'s q")
        B, H = layout[:2]
        expected = f"q [B={B}, Hq, Tq, {self.head_dim}] with Hq a multiple of H={H}"
        if q.ndim != 4:
            problem = f"q has {q.ndim} dims"
        elif q.shape[0] != B:
            problem = f"q's batch is {q.shape[0]}, the cache's {B}"
        elif q.shape[-1] != self.head_dim:
            problem = f"q's head_dim is {q.shape[-1]}, the cache's {self.head_dim}"
        elif q.shape[1] % H:
            problem = f"q's {q.shape[1]} heads are not a multiple of the cache's H={H} KV heads"
        else:
            problem = None
        if problem:
            raise ValueError(f"{what} takes {expected}; {problem} (got {tuple(q.shape)})")
        if data and not bool(torch.isfinite(q).all()):
            raise ValueError(f"{what} got non-finite queries (NaN or Inf): q must be finite")
        return q.shape[1] // H

    def attend(self, q: torch.Tensor, scale: float) -> torch.Tensor:
        """Attention of q [B, Hq, Tq, d] over all held tokens (one softmax) -> [B, Hq, Tq, d], q's dtype.
        Where the data checks are immediate (the CPU by default), NaN or Inf in q is refused too."""
        checked = self._seq is not None and not self._seq.deferred
        # the reference plan runs attend_reference, which checks q itself: one query check an attend
        self._check_query(q, scale, data=checked and self._seq.plan.backend != "reference")
        return self._seq.plan.attention(self, q, scale)

    def decoded_kv(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """All held K, V [B, H, T, d] in `dtype`, in sequence order: the native prefix, the decoded store, the
        window (runs `check()`)."""
        if self._seq is None:
            raise ValueError("decoded_kv called on an empty cache: append a unit first")
        self.check()
        return self._decoded_kv(dtype)

    def _decoded_store(self, dtype: torch.dtype) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The store's tokens decoded in `dtype`, as chunks along T. Each token is decoded once a sequence:
        the tokens stored since the last call are decoded and kept. A token's decode does not depend on the
        others (the codecs and the value quantizer decode token by token), so the chunks equal one decode of
        the whole store, bit for bit (tests/test_cache.py checks it for every codec)."""
        ks, vs, done = self._seq.decoded.get(dtype, ([], [], 0))
        if done < self.length:
            k_state, v_state = self.store.valid()
            ks.append(self.codec.decode(k_state.slice_t(done, self.length), dtype))
            vs.append(self.value_quantizer.decode(v_state.slice_t(done, self.length), dtype))
            self._seq.decoded[dtype] = (ks, vs, self.length)
        return ks, vs

    def _in_order(self, store_k: list[torch.Tensor],
                  store_v: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The native prefix, then the store's parts (`store_k`, `store_v`), then the window: every held token
        in sequence order, empty parts left out."""
        native = self._native
        ks, vs = [], []
        if native is not None and native.prefix_tokens:
            k, v = native.prefix_kv()
            ks.append(k)
            vs.append(v)
        ks += store_k
        vs += store_v
        if native is not None and native.window_tokens:
            k, v = native.window_kv()
            ks.append(k)
            vs.append(v)
        return ks, vs

    def _decoded_kv(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        store_k, store_v = [], []
        if self.length:
            if self.value_quantizer is None:
                k_state, v_state = self.store.valid()
                store_k, store_v = [k_state.native], [v_state.native]
            else:
                store_k, store_v = self._decoded_store(dtype)
        ks, vs = self._in_order(store_k, store_v)
        return torch.cat([k.to(dtype) for k in ks], 2), torch.cat([v.to(dtype) for v in vs], 2)

    def _plain_kv(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Codec none: every held token in sequence order (the prefix, the store's valid tokens, the window),
        one concatenation each (as the unpatched model's cache), cast to `dtype` when it differs. With nothing
        native (window 0, no prefix) the store's valid tokens are returned as a view, nothing copied: a
        preallocated native cache."""
        store_k, store_v = [], []
        if self.length:
            store_k = [self.store.keys.native.narrow(2, 0, self.length)]
            store_v = [self.store.values.native.narrow(2, 0, self.length)]
        ks, vs = self._in_order(store_k, store_v)
        k_all, v_all = (ks[0], vs[0]) if len(ks) == 1 else (torch.cat(ks, 2), torch.cat(vs, 2))
        if k_all.dtype != dtype:
            k_all, v_all = k_all.to(dtype), v_all.to(dtype)
        return k_all, v_all

    def attend_reference(self, q: torch.Tensor, scale: float) -> torch.Tensor:
        """Reference: decode the store, one SDPA over cat(prefix, decoded, window) in fp32 (codec none:
        native). NaN or Inf in q is refused where the data checks are immediate."""
        self._check_query(q, scale, data=self._seq is not None and not self._seq.deferred)
        if self.value_quantizer is None:
            k_all, v_all = self._plain_kv(q.dtype)
            q_c = q
        else:
            k_all, v_all = self._decoded_kv(torch.float32)
            q_c = q.to(torch.float32)
        return attend(q_c, k_all, v_all, scale).to(q.dtype)

    def attend_sequence(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, units: Sequence[int],
                        scale: float) -> torch.Tensor:
        """A whole sequence in one pass: what each unit's queries get from `attend` when the units are
        appended one by one (`reset`, then per unit `append` and `attend` of that unit's queries), computed
        for all units at once on the reference path and without touching the cache.

        q [B, Hq, T, d], k and v [B, H, T, d], `units` the tokens of each unit in order (summing to T).
        Returns [B, Hq, T, d] in q's dtype. A query of unit i attends, in one softmax, to the native keys and
        values of units i-W+1 .. i (the window W as it stands after unit i's append) and of the native prefix
        (the sequence's first `native_prefix` tokens), and to the other tokens of units 0 .. i-W as the store
        holds them: each token encoded as `append` encodes it (the backend's choice: the encode kernels for
        CUDA tensors, the library otherwise; they give the same codes but at exact near-ties) and decoded by
        the codec library and the value quantizer (a token's code does not depend on the others, so one
        encode of the sequence is the per-unit encode; the prefix and the last W units, never stored, are not
        encoded: `stored_span`), in fp32 as `attend_reference`. Codec none: the native keys of units 0 .. i,
        SDPA in q's dtype. This is teacher forcing's pass (`eval.fidelity`): one masked attention a layer
        instead of one a unit; it equals the unit-by-unit reference up to float rounding
        (tests/test_cache.py). Runs the immediate data checks on every token.
        """
        check_layout(k, v, self.head_dim, None)
        self._check_query(q, scale, (k.shape[0], k.shape[1]), "attend_sequence", data=True)
        if isinstance(units, (str, bytes)) or any(isinstance(n, bool) or not isinstance(n, numbers.Integral)
                                                  or n < 1 for n in units) or sum(units) != k.shape[2]:
            raise ValueError(f"attend_sequence takes units, the tokens of each unit (integers >= 1), summing "
                             f"to the T = {k.shape[2]} tokens of k and v; got {list(units)!r}")
        if q.shape[2] != k.shape[2] or q.device != k.device:
            raise ValueError(f"attend_sequence takes q with one query per key (T = {k.shape[2]}) on k's "
                             f"device, got {tuple(q.shape)} on {q.device}")
        self.codec.check_keys(k)
        check_unit(k, v, self.value_quantizer is not None)
        unit_T = torch.repeat_interleave(torch.arange(len(units), device=k.device),
                                         torch.tensor(list(units), device=k.device))
        age_TT = unit_T[:, None] - unit_T[None, :]  # query's unit - key's unit: >= 0 where the key is visible
        if self.value_quantizer is None:
            return attend(q, k.to(q.dtype), v.to(q.dtype), scale, age_TT >= 0)
        start, stop = self.stored_span(units)
        keys, values, visible = [], [], []
        if stop > start:
            k_state, v_state = self._encode_sequence(k[:, :, start:stop], v[:, :, start:stop])
            keys.append(self.codec.decode(k_state, torch.float32))
            values.append(self.value_quantizer.decode(v_state, torch.float32))
            visible.append((age_TT >= self.window)[:, start:stop])
        if self.window or start:  # the native keys (window and prefix) beside the store's decoded ones
            prefix_T = torch.arange(k.shape[2], device=k.device) < start
            keys.append(k.float())
            values.append(v.float())
            visible.append((age_TT >= 0) & ((age_TT < self.window) | prefix_T[None, :]))
        return attend(q.float(), torch.cat(keys, 2), torch.cat(values, 2), scale,
                      torch.cat(visible, 1)).to(q.dtype)

    def stored_span(self, units: Sequence[int]) -> tuple[int, int]:
        """The tokens [start, stop) of a sequence of `units` that a generation encodes into the store: those
        that leave the window (all but the last `window` units'; no later query sees those stored) past the
        native prefix (the first `native_prefix` tokens). `attend_sequence` encodes just these."""
        stop = sum(units[:max(len(units) - self.window, 0)])
        return min(self.native_prefix, stop), stop

    def _encode_sequence(self, k: torch.Tensor, v: torch.Tensor) -> tuple:
        """(KeyState, ValueState) of tokens k, v [B, H, T, d] encoded as `append` would encode them: the
        backend's choice for their device (`CachePlan`), the data checks left to the caller."""
        plan = _backend.CachePlan(self.codec, k.shape[1], k.device)
        return plan.encode_keys(self.codec, k), plan.encode_values(self.value_quantizer, v)

    def __repr__(self) -> str:
        return (f"CompressedKVCache(codec={self.codec_name!r}, bits={self.bits}, v_bits={self.v_bits}, "
                f"head_dim={self.head_dim}, "
                f"window={self.window}, native_prefix={self.native_prefix}, v_group={self.v_group}, "
                f"seed={self.seed}, backend={self.backend!r}, "
                f"kernels={self._plan.kernels_used() if self._plan else None!r}, "
                f"tokens={self.num_tokens}, compressed={self.length}, nbytes={self.nbytes})")
