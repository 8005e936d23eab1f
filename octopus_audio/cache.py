"""Compressed KV cache of one attention layer: the newest W units native, older units encoded once into packed
buffers. Its parts live beside it: the store and its growth (cache_store), the backend plan (backend), the
data checks (cache_checks), the byte accounting (cache_accounting)."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Sequence

import torch

from octopus_audio import backend as _backend
from octopus_audio.cache_accounting import bytes_breakdown, fp16_bytes
from octopus_audio.cache_checks import DeferredFlags, check_caches, check_layout, check_unit
from octopus_audio.cache_store import CacheStore, empty_store, own_storage
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
    window: list[tuple[torch.Tensor, torch.Tensor]] = dataclasses.field(default_factory=list)
    store: CacheStore | None = None
    units_compressed: int = 0
    flushed: int = 0  # units whose deferred record is complete (fused: the window is recorded late)
    # dtype -> (decoded K chunks, decoded V chunks, store tokens they cover): the reference path decodes each
    # stored token once a sequence
    decoded: dict = dataclasses.field(default_factory=dict)


class CompressedKVCache:
    """KV cache of one attention layer with compressed keys (any codec) and group-quantized values.

    append(k, v): one unit (k, v [B, H, T_unit, d]); the newest `window` units stay native, and a unit is
    encoded exactly once, when it leaves the window (window=0 encodes every unit at once).
    attend(q [B, Hq, Tq, d], scale) -> [B, Hq, Tq, d] in q's dtype: one softmax over the compressed store and
    the window; Hq = G * H, query head j uses KV head j // G. Codec `none` stores native K/V and attends with
    plain SDPA in the native dtype (bit-identical to SDPA over the concatenated K/V).
    The codec's seed is used as is (per layer: `octopus_audio.rotation.layer_seed(base_seed, layer)`).
    Values use `v_bits` bits (None: the same `bits` as keys), in groups of `v_group` channels.
    capacity: tokens the compressed store is allocated for when it is first written (None: just the first
    unit); past it the store grows by doubling. A caller that knows the sequence (AAR: the scales before the
    window) avoids the growth copies and the spare capacity.

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
                 defer_checks: bool | None = None, **codec_options) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError(f"window must be an integer >= 0 (units kept native), got {window!r}")
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int)
                                     or capacity < 0):
            raise ValueError(f"capacity must be None or an integer >= 0 (tokens), got {capacity!r}")
        if defer_checks not in (None, True, False):
            raise ValueError(f"defer_checks must be None (defer on CUDA), True or False, "
                             f"got {defer_checks!r}")
        self.capacity = capacity
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
    def _window(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [] if self._seq is None else self._seq.window

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
        return sum(k.shape[2] for k, _ in self._window)

    @property
    def num_tokens(self) -> int:
        """All tokens held (compressed store + native window)."""
        return self.length + self.window_tokens

    def __len__(self) -> int:
        return self.num_tokens

    @property
    def num_units(self) -> int:
        return 0 if self._seq is None else len(self._seq.window) + self._seq.units_compressed

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
        """Native window K, V [B, H, T_window, d] (None when empty; a single unit's own tensors, no copy)."""
        window = self._window
        if not window:
            return None
        if len(window) == 1:
            return window[0]
        return torch.cat([k for k, _ in window], 2), torch.cat([v for _, v in window], 2)

    # ---- accounting ----
    @property
    def _rows(self) -> int:
        return 0 if self._seq is None else self._seq.layout[0] * self._seq.layout[1]

    @property
    def nbytes(self) -> int:
        """Bytes held: compressed store (valid tokens) plus the native window."""
        b = self.bytes_breakdown()
        return b["k_bytes"] + b["v_bytes"] + b["window_bytes"]

    @property
    def native_nbytes(self) -> int:
        """fp16 bytes of the same K and V (what an uncompressed fp16 cache would hold)."""
        return fp16_bytes(self._rows, self.num_tokens, self.head_dim)

    def bytes_breakdown(self) -> dict[str, int]:
        """Key, value and window bytes plus token counts (`cache_accounting.bytes_breakdown`)."""
        return bytes_breakdown(self.store, self._window, self._rows, self.head_dim)

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
        if seq is None or not (seq.deferred and seq.fused):
            return
        first = max(seq.flushed, seq.units_compressed)
        for i, (k, v) in enumerate(seq.window[first - seq.units_compressed:]):
            if k.numel():
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
        """Add one unit (k, v [B, H, T_unit, d]); the oldest window unit beyond `window` is encoded."""
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
        if self.window:  # the unit outlives this call (window 0: encoded below, never kept)
            k, v = own_storage(k), own_storage(v)
        window = self._seq.window
        window.append((k, v))
        while len(window) > self.window:
            self._compress(*window.pop(0))

    def _compress(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Encode one unit that left the window into the store (created at the first, grown as needed)."""
        seq, n = self._seq, k.shape[2]
        capacity = max(n, self.capacity or 0)
        if seq.fused is not None:
            if seq.store is None:
                seq.store = empty_store(self.codec, self.value_quantizer, k, capacity)
            seq.store.reserve(n)
            from octopus_audio.kernels import PackedKeys, PackedValues

            keys, values = seq.store.packed(PackedKeys, PackedValues, self.value_quantizer)
            flags = self._flags.row(seq.units_compressed) if seq.deferred else None
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
        seq.units_compressed += 1

    # ---- reorder and rollback (what a language model's generation asks of its cache) ----
    def select_rows(self, index: torch.Tensor) -> None:
        """Keep batch rows `index` of every held token, in that order: row i becomes the old row index[i]
        (a beam search's reorder; repeats allowed, any length >= 1). `index` is a 1-D integer tensor whose
        entries lie in 0..B-1 (not checked here: that would cost a host sync). The store and the window are
        copied; nothing is encoded again. An empty cache has nothing to reorder."""
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
        seq.window[:] = [(k.index_select(0, index), v.index_select(0, index)) for k, v in seq.window]
        seq.decoded.clear()
        seq.layout = (index.numel(), *seq.layout[1:])

    def crop(self, num_tokens: int) -> None:
        """Keep the first `num_tokens` held tokens (the store's, then the window's in order) and drop the
        rest: a rollback of the newest tokens (speculative decoding). What is kept stays as it is held: a
        token already encoded stays encoded, so the window may hold fewer than `window` units until new units
        arrive. 0 empties the cache (`reset`)."""
        held = self.num_tokens
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, numbers.Integral) or not (
                0 <= num_tokens <= held):
            raise ValueError(f"crop keeps a number of tokens from 0 to the {held} held, got {num_tokens!r}")
        if num_tokens == held:
            return
        if num_tokens == 0:
            self.reset()
            return
        seq = self._seq
        if num_tokens <= self.length:
            seq.window.clear()
            seq.store.length = num_tokens
            seq.decoded.clear()
        else:
            keep, window = num_tokens - self.length, []
            for k, v in seq.window:
                if keep <= 0:
                    break
                if k.shape[2] > keep:
                    k, v = own_storage(k[:, :, :keep]), own_storage(v[:, :, :keep])
                window.append((k, v))
                keep -= k.shape[2]
            seq.window[:] = window
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
        """All held K, V [B, H, T, d] in `dtype`: the decoded store, then the window (runs `check()`)."""
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

    def _decoded_kv(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        ks, vs = [], []
        if self.length:
            if self.value_quantizer is None:
                k_state, v_state = self.store.valid()
                ks.append(k_state.native.to(dtype))
                vs.append(v_state.native.to(dtype))
            else:
                k_chunks, v_chunks = self._decoded_store(dtype)
                ks += k_chunks
                vs += v_chunks
        for k, v in self._window:
            ks.append(k.to(dtype))
            vs.append(v.to(dtype))
        return torch.cat(ks, 2), torch.cat(vs, 2)

    def _native_kv(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Codec none: the store's valid tokens then the window, one concatenation each (as the unpatched
        model's cache), cast to `dtype` when it differs. With nothing in the window (window 0) the store's
        valid tokens are returned as a view, nothing copied: a preallocated native cache."""
        ks, vs = [], []
        if self.length:
            ks.append(self.store.keys.native.narrow(2, 0, self.length))
            vs.append(self.store.values.native.narrow(2, 0, self.length))
        for k, v in self._window:
            ks.append(k)
            vs.append(v)
        k_all, v_all = (ks[0], vs[0]) if len(ks) == 1 else (torch.cat(ks, 2), torch.cat(vs, 2))
        if k_all.dtype != dtype:
            k_all, v_all = k_all.to(dtype), v_all.to(dtype)
        return k_all, v_all

    def attend_reference(self, q: torch.Tensor, scale: float) -> torch.Tensor:
        """Reference: decode the store, one SDPA over cat(decoded, window) in fp32 (codec none: native). NaN
        or Inf in q is refused where the data checks are immediate."""
        self._check_query(q, scale, data=self._seq is not None and not self._seq.deferred)
        if self.value_quantizer is None:
            k_all, v_all = self._native_kv(q.dtype)
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
        values of units i-W+1 .. i (the window W as it stands after unit i's append) and to units 0 .. i-W
        as the store holds them: each token encoded as `append` encodes it (the backend's choice: the encode
        kernels for CUDA tensors, the library otherwise; they give the same codes but at exact near-ties) and
        decoded by the codec library and the value quantizer (a token's code does not depend on the others, so
        one encode of the sequence is the per-unit encode; the last W units, never stored, are not encoded),
        in fp32 as `attend_reference`. Codec none: the native keys of units 0 .. i, SDPA in q's dtype. This is
        teacher forcing's pass (`eval.fidelity`): one masked attention a layer instead of one a unit; it
        equals the unit-by-unit reference up to float rounding (tests/test_cache.py). Runs the immediate
        data checks on every token.
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
        n_store = self.stored_tokens(units)
        keys, values, visible = [], [], []
        if n_store:
            k_state, v_state = self._encode_sequence(k[:, :, :n_store], v[:, :, :n_store])
            keys.append(self.codec.decode(k_state, torch.float32))
            values.append(self.value_quantizer.decode(v_state, torch.float32))
            visible.append((age_TT >= self.window)[:, :n_store])
        if self.window:  # the window's native keys beside the store's decoded ones
            keys.append(k.float())
            values.append(v.float())
            visible.append((age_TT >= 0) & (age_TT < self.window))
        return attend(q.float(), torch.cat(keys, 2), torch.cat(values, 2), scale,
                      torch.cat(visible, 1)).to(q.dtype)

    def stored_tokens(self, units: Sequence[int]) -> int:
        """Tokens of a sequence of `units` that a generation stores: all but the last `window` units' (no
        later query sees those stored, so `attend_sequence` does not encode them)."""
        return sum(units[:max(len(units) - self.window, 0)])

    def _encode_sequence(self, k: torch.Tensor, v: torch.Tensor) -> tuple:
        """(KeyState, ValueState) of tokens k, v [B, H, T, d] encoded as `append` would encode them: the
        backend's choice for their device (`CachePlan`), the data checks left to the caller."""
        plan = _backend.CachePlan(self.codec, k.shape[1], k.device)
        return plan.encode_keys(self.codec, k), plan.encode_values(self.value_quantizer, v)

    def __repr__(self) -> str:
        return (f"CompressedKVCache(codec={self.codec_name!r}, bits={self.bits}, v_bits={self.v_bits}, "
                f"head_dim={self.head_dim}, "
                f"window={self.window}, v_group={self.v_group}, seed={self.seed}, backend={self.backend!r}, "
                f"kernels={self._plan.kernels_used() if self._plan else None!r}, "
                f"tokens={self.num_tokens}, compressed={self.length}, nbytes={self.nbytes})")
