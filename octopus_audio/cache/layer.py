"""Compressed KV cache of one attention layer: the newest W units and the first P tokens native, the other
units encoded once into packed buffers. Its parts live beside it in this package: the store and its growth
(store), the native tokens (native), the ops a sequence runs (plan, chosen by backend), the checks (checks),
the byte accounting (accounting), the held tokens read back (readback)."""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable
from typing import NamedTuple

import torch

from octopus_audio.cache.accounting import bytes_breakdown, fp16_bytes
from octopus_audio.cache.backend import attention_backend
from octopus_audio.cache.checks import DeferredFlags, check_caches, check_layout, check_query, check_unit
from octopus_audio.cache.native import NativeSegment
from octopus_audio.cache.plan import CachePlan
from octopus_audio.cache.readback import DecodedStore, held_kv, plain_kv
from octopus_audio.cache.store import CacheStore, empty_store
from octopus_audio.codecs import get_codec
from octopus_audio.reference import attend
from octopus_audio.values import ValueQuantizer


@dataclasses.dataclass
class _Sequence:
    """What one sequence (its first unit to `reset`) holds, and what its first unit decided: the layout
    (B, H, dtype, device), the ops (`plan`), whether checks are deferred, the fused encode (or None)."""

    layout: tuple
    plan: CachePlan
    deferred: bool
    fused: Callable | None
    native: NativeSegment | None = None  # the prefix and the window (None before the first native token)
    store: CacheStore | None = None
    units_left: int = 0  # units that have left the window (their tokens to the prefix or the store)
    flushed: int = 0  # units whose deferred record is complete (fused: the window is recorded late)
    # the reference path decodes each stored token once a sequence
    decoded: DecodedStore = dataclasses.field(default_factory=DecodedStore)


class WidePrefix(NamedTuple):
    """A cache's wide prefix: its `tokens` (after the native prefix), the key `codec` and the
    `value_quantizer` they are stored with (`CompressedKVCache.wide`; `block_causal.attend_sequence` takes
    it)."""

    tokens: int
    codec: object
    value_quantizer: ValueQuantizer


class _SequencePart:
    """A read-only cache attribute that is a field of its current sequence (`_Sequence`), None before the
    sequence's first unit."""

    def __init__(self, field: str, doc: str) -> None:
        self.field, self.__doc__ = field, doc

    def __get__(self, cache, owner=None):
        if cache is None:
            return self
        seq = cache._seq
        return None if seq is None else getattr(seq, self.field)

    def __set__(self, cache, value) -> None:
        raise AttributeError(f"the cache's {self.field} is read-only (it belongs to the current sequence)")


class CompressedKVCache:
    """KV cache of one attention layer with compressed keys (any codec) and group-quantized values.

    append(k, v): one unit (k, v [B, H, T_unit, d]); the newest `window` units stay native, and a unit is
    encoded exactly once, when it leaves the window (window=0 encodes every unit at once).
    native_prefix: the sequence's first `native_prefix` tokens stay native for good (an "attention sink":
    AAR's coarsest scales, which every later token attends to; `aar_patch.patch_aar(sink_scales=S)` passes
    the tokens of its first S scales). Tokens, not units: a unit's size is the caller's chunking (a language
    model may append a whole prompt as one unit), and a unit leaving the window is split where the prefix
    ends (its first tokens native, the rest encoded). The prefix and the window are held back to back in one
    native buffer (`native.NativeSegment`), so attention reads them as one native segment with no
    concatenation, and the accounting counts the prefix as native bytes.
    wide_prefix: the next `wide_prefix` tokens after the native prefix are stored at other widths,
    `wide_bits` key bits and `wide_v_bits` value bits (None: `wide_bits`), in a store of their own (AAR's
    scales after the sink scales, which later tokens also attend to: `patch_aar(wide_scales=N)`). Tokens, as
    the prefix, counted as compressed bytes at their own widths; attention reads both stores in one softmax
    (the split-K kernel takes the wide store as a second segment; `cache.wide` says what it holds).
    attend(q [B, Hq, Tq, d], scale) -> [B, Hq, Tq, d] in q's dtype: one softmax over the compressed store and
    the native tokens (prefix and window); Hq = G * H, query head j uses KV head j // G. Codec `none` stores
    native K/V and attends with plain SDPA in the native dtype (bit-identical to SDPA over the concatenated
    K/V).
    The codec's seed is used as is (per layer: `octopus_audio.rotation.layer_seed(base_seed, layer)`).
    Values use `v_bits` bits (None: the same `bits` as keys), in groups of `v_group` channels.
    capacity: tokens the compressed store is allocated for when it is first written (None: just the first
    unit); past it the store grows by doubling. native_capacity: the same for the native buffer (prefix and
    window), sized at the first unit; given, the buffer also goes back to it after a larger unit has left the
    window. A caller that knows the sequence (AAR: `layout.sequence_capacities`)
    avoids the growth copies and the spare capacity.

    Data checks (finite keys; values finite, and within the fp16 range when quantized): `defer_checks` None
    (default) checks each unit at `append` on the CPU and defers the check on CUDA, where reading the result
    would stall the host once per unit; True / False force either. Deferred, each append only updates a
    device-side record (no host sync), and `check()` raises the same ValueError later: call it when the
    sequence ends (the AAR patch does, at `kv_caching(False)`); `decoded_kv` checks too. Layout, backend
    and kernel tables are decided once per sequence, at its first unit (after `reset()`).

    Compared with a transformers cache layer (`update(k, v)` returns the whole K/V for the model's own
    attention), this cache never hands out K/V: the layer calls `append` then `attend`, so the store stays
    packed and attention runs from it. `num_tokens` is the layer's sequence length; `reset` its `reset`.
    A whole sequence attending at once as this cache would serve it unit by unit (teacher forcing) is no part
    of this per-layer contract: `block_causal.attend_sequence`, given this cache's codec, value quantizer,
    window and native prefix.
    """

    def __init__(self, codec: str, bits: int, head_dim: int, window: int = 1, v_group: int = 16,
                 seed: int = 0, v_bits: int | None = None, capacity: int | None = None,
                 defer_checks: bool | None = None, native_prefix: int = 0, native_capacity: int | None = None,
                 wide_prefix: int = 0, wide_bits: int | None = None, wide_v_bits: int | None = None,
                 **codec_options) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError(f"window must be an integer >= 0 (units kept native), got {window!r}")
        if isinstance(native_prefix, bool) or not isinstance(native_prefix, int) or native_prefix < 0:
            raise ValueError(f"native_prefix must be an integer >= 0 (the sequence's first tokens kept "
                             f"native), got {native_prefix!r}")
        if isinstance(wide_prefix, bool) or not isinstance(wide_prefix, int) or wide_prefix < 0:
            raise ValueError(f"wide_prefix must be an integer >= 0 (the tokens after the native prefix "
                             f"stored at wide_bits), got {wide_prefix!r}")
        if wide_prefix and (isinstance(wide_bits, bool) or not isinstance(wide_bits, int)):
            raise ValueError(f"wide_prefix={wide_prefix} needs wide_bits, the key bits of those tokens (an "
                             f"integer width the codec takes), got {wide_bits!r}")
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
        self.wide_prefix = wide_prefix
        self._wide: CompressedKVCache | None = None
        if wide_prefix:
            if not self.codec.compressed:
                raise ValueError(f"wide_prefix stores tokens at other widths, but codec {codec!r} stores "
                                 f"every token native: use a codec that compresses, or wide_prefix=0")
            # the wide tokens' store: a cache of its own (window 0: each part encoded as it arrives); its
            # data-check record is never read, this cache checks every token of a unit
            self._wide = CompressedKVCache(codec, wide_bits, head_dim, window=0, v_group=v_group, seed=seed,
                                           v_bits=wide_v_bits, capacity=wide_prefix, defer_checks=True,
                                           **codec_options)
        self._flags: DeferredFlags | None = None  # kept across reset(): a graph replay writes the last ones
        self.checks_pending = False  # units appended since the last deferred check
        self.reset()

    # ---- state ----
    def reset(self) -> None:
        """Drop every token (buffers included). Unchecked deferred checks are dropped with them."""
        self._seq: _Sequence | None = None
        self.checks_pending = False
        if self._wide is not None:
            self._wide.reset()

    store = _SequencePart("store", "The compressed store of the current sequence (a CacheStore; None before "
                                   "its first encoded unit).")
    _native = _SequencePart("native", "The native prefix and window (a NativeSegment), or None.")
    _plan = _SequencePart("plan", "The CachePlan the current sequence runs, or None.")
    _fused = _SequencePart("fused", "The plan's fused unit encode the sequence runs, or None.")

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
    def wide_tokens(self) -> int:
        """Tokens of the wide prefix held (at most `wide_prefix`), in the wide store."""
        return 0 if self._wide is None else self._wide.length

    @property
    def wide(self) -> WidePrefix | None:
        """The wide prefix (`WidePrefix`: its tokens, key codec and value quantizer), None without one."""
        if self._wide is None:
            return None
        return WidePrefix(self.wide_prefix, self._wide.codec, self._wide.value_quantizer)

    @property
    def num_tokens(self) -> int:
        """All tokens held (compressed stores + native prefix + native window)."""
        return self.length + self.wide_tokens + (0 if self._native is None else self._native.tokens)

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
        return attention_backend(None, self.codec)

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
        """Key, value, prefix and window bytes plus token counts (`accounting.bytes_breakdown`); the wide
        prefix's tokens and bytes count as compressed (`store_tokens`, `k_bytes`, `v_bytes`), and
        `wide_tokens` says how many of them it holds."""
        wide = None if self._wide is None else self._wide.store
        return bytes_breakdown(self.store, self._native, self._rows, self.head_dim, wide)

    def prepare(self, num_heads: int, device: torch.device | str) -> None:
        """Build before the first sequence what a sequence of `num_heads` KV heads on `device` needs from the
        host: the kernels' view of the codec (its tables and rotation signs, cached on the codec) and the
        codec's own sign vectors. On CUDA each of those host-to-device copies is a host sync, six per layer
        for octopus; made here, a generation copies nothing from the host. Optional: the first unit of the
        first sequence builds them otherwise."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:  # as a tensor's device says it: "cuda:0"
            device = torch.device("cuda", torch.cuda.current_device())
        CachePlan(self.codec, num_heads, device)
        if self._wide is not None:
            self._wide.prepare(num_heads, device)
        if self.codec.compressed:
            from octopus_audio.codecs.qjl import QJL_STREAM

            self.codec.signs(num_heads, device)
            if self.codec.qjl:
                self.codec.signs(num_heads, device, stream=QJL_STREAM)

    # ---- data checks (checks) ----
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
        wide = None if self._wide is None else self._wide.codec
        plan = CachePlan(self.codec, k.shape[1], device, wide=wide)
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
            seq.native = NativeSegment(k, max(n, self.native_capacity or 0), reserved=self.native_capacity)
        return seq.native

    def _leave(self, k: torch.Tensor, v: torch.Tensor, buffered: bool) -> None:
        """The oldest unit leaves the window (k, v: views of it in the native buffer when `buffered`, else the
        unit as appended): its first tokens join the native prefix while it has room, the next the wide
        prefix while it has room, the rest are encoded into the store."""
        seq, t = self._seq, k.shape[2]
        held = 0 if seq.native is None else seq.native.prefix_tokens
        keep = min(max(self.native_prefix - held, 0), t)
        wide = 0 if self._wide is None else min(max(self.wide_prefix - self._wide.length, 0), t - keep)
        if (keep or wide) and seq.deferred and seq.fused:
            self._flags.record(seq.units_left, k, v)  # the fused encode checks only the tokens it encodes
        if wide:
            self._wide.append(k.narrow(2, keep, wide), v.narrow(2, keep, wide))
        done = keep + wide
        if done < t:
            self._compress(k.narrow(2, done, t - done), v.narrow(2, done, t - done), kernel_checks=not done)
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
            flags = self._flags.row(seq.units_left) if seq.deferred and kernel_checks else None
            seq.fused(k, v, seq.store, flags)
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
        if self._wide is not None:
            self._wide.select_rows(index)
        seq.decoded.clear()
        seq.layout = (index.numel(), *seq.layout[1:])

    def crop(self, num_tokens: int) -> None:
        """Keep the first `num_tokens` held tokens in sequence order (the native prefix's, the wide prefix's,
        the store's, then the window's) and drop the rest: a rollback of the newest tokens (speculative
        decoding). What is kept stays as it is held: a token already encoded stays encoded, so the window may
        hold fewer than `window` units until new units arrive, and a prefix (native or wide) cut short fills
        again from the next units that leave the window. 0 empties the cache (`reset`)."""
        held = self.num_tokens
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, numbers.Integral) or not (
                0 <= num_tokens <= held):
            raise ValueError(f"crop keeps a number of tokens from 0 to the {held} held, got {num_tokens!r}")
        if num_tokens == held:
            return
        if num_tokens == 0:
            self.reset()
            return
        seq, prefix, wide, stored = self._seq, self.prefix_tokens, self.wide_tokens, self.length
        keep_wide = min(max(num_tokens - prefix, 0), wide)
        if keep_wide < wide:
            self._wide.crop(keep_wide)
        keep_stored = min(max(num_tokens - prefix - wide, 0), stored)
        if keep_stored < stored:
            seq.store.length = keep_stored
            seq.decoded.clear()
        if seq.native is not None:  # the prefix's kept tokens, then the window's (back to back in the buffer)
            seq.native.crop(min(num_tokens, prefix) + max(num_tokens - prefix - wide - stored, 0))
        seq.flushed = min(seq.flushed, self.num_units)

    # ---- attend ----
    def _check_query(self, q: torch.Tensor, scale: float, data: bool) -> None:
        """q's type and shape against the cache's batch, heads and head dim, and the scale
        (`checks.check_query`; `data`: also refuse NaN or Inf in q, one host sync)."""
        if self._seq is None:
            raise ValueError("attend called on an empty cache: append a unit first")
        B, H = self._seq.layout[:2]
        check_query(q, scale, B, H, self.head_dim, data=data)

    def attend(self, q: torch.Tensor, scale: float) -> torch.Tensor:
        """Attention of q [B, Hq, Tq, d] over all held tokens (one softmax) -> [B, Hq, Tq, d], q's dtype: the
        fused kernels where the sequence's plan runs them, else `attend_reference`. Where the data checks are
        immediate (the CPU by default), NaN or Inf in q is refused too."""
        seq = self._seq
        checked = seq is not None and not seq.deferred
        # the reference plan runs attend_reference, which checks q itself: one query check an attend
        self._check_query(q, scale, data=checked and seq.plan.backend != "reference")
        if not seq.plan.kernel_attention:
            return self.attend_reference(q, scale)
        wide = self._wide
        wide = None if wide is None or not wide.length else (wide.store, wide._seq.plan, wide.value_quantizer)
        return seq.plan.attention(q, scale, seq.store, self.native_kv(), self.value_quantizer, wide)

    def decoded_kv(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """All held K, V [B, H, T, d] in `dtype`, in sequence order: the native prefix, the decoded wide
        prefix and store, the window (runs `check()`)."""
        if self._seq is None:
            raise ValueError("decoded_kv called on an empty cache: append a unit first")
        self.check()
        return self._decoded_kv(dtype)

    def _decoded_kv(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        seq = self._seq
        wide = self._wide._decoded_kv(dtype) if self.wide_tokens else None
        return held_kv(seq.native, seq.store, self.codec, self.value_quantizer, seq.decoded, dtype, wide)

    def attend_reference(self, q: torch.Tensor, scale: float) -> torch.Tensor:
        """Reference: decode the stores, one SDPA over cat(prefix, decoded wide prefix and store, window) in
        fp32 (codec none: native). NaN or Inf in q is refused where the data checks are immediate."""
        self._check_query(q, scale, data=self._seq is not None and not self._seq.deferred)
        if self.value_quantizer is None:
            k_all, v_all = plain_kv(self._native, self.store, q.dtype)
            q_c = q
        else:
            k_all, v_all = self._decoded_kv(torch.float32)
            q_c = q.to(torch.float32)
        return attend(q_c, k_all, v_all, scale).to(q.dtype)

    def __repr__(self) -> str:
        wide = self._wide
        wide = ("" if wide is None else
                f"wide_prefix={self.wide_prefix}, wide_bits={wide.bits}, wide_v_bits={wide.v_bits}, ")
        return (f"CompressedKVCache(codec={self.codec_name!r}, bits={self.bits}, v_bits={self.v_bits}, "
                f"head_dim={self.head_dim}, window={self.window}, native_prefix={self.native_prefix}, {wide}"
                f"v_group={self.v_group}, seed={self.seed}, backend={self.backend!r}, "
                f"kernels={self._plan.kernels_used() if self._plan else None!r}, "
                f"tokens={self.num_tokens}, compressed={self.length + self.wide_tokens}, "
                f"nbytes={self.nbytes})")
