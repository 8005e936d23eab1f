"""Compressed KV cache: the newest W units native, older units encoded once into packed buffers."""

from __future__ import annotations

import dataclasses
import math
import numbers

import torch

from octopus_audio import backend as _backend
from octopus_audio.codecs import get_codec
from octopus_audio.codecs.base import KeyState
from octopus_audio.reference import attend
from octopus_audio.values import FP16_MAX, ValueQuantizer, ValueState

_FP16_BYTES = 2
# (field name, token axis from the end) of each state class, read once (TensorState derives them per call)
_FIELDS = {cls: tuple((n, cls._t_dim(n)) for n in cls.tensor_field_names()) for cls in (KeyState, ValueState)}


def _present(state) -> list[tuple[str, int, torch.Tensor]]:
    """(name, token axis, tensor) of the fields `state` holds, in the class's field order."""
    out = []
    for name, t_dim in _FIELDS[type(state)]:
        t = getattr(state, name)
        if t is not None:
            out.append((name, t.ndim + t_dim, t))
    return out


def _narrow(state, length: int):
    """Tokens [0, length) of every field of `state` (views)."""
    fields = {name: t.narrow(axis, 0, length) for name, axis, t in _present(state)}
    return dataclasses.replace(state, **fields)


@dataclasses.dataclass
class CacheStore:
    """The compressed store: per-field buffers preallocated along T (grown by doubling); tokens [0, length)
    are valid. `keys` is a KeyState and `values` a ValueState whose tensors are [B, H, capacity, ...]
    (formats.md); for codec `none` they hold `native` K and V. Replace the buffers with `rebind`."""

    keys: KeyState
    values: ValueState
    length: int = 0

    def __post_init__(self) -> None:
        self.rebind(self.keys, self.values)

    def rebind(self, keys: KeyState, values: ValueState) -> None:
        """Take new buffers (same fields, more capacity); the per-write field list is derived here once."""
        self.keys, self.values = keys, values
        self._slots = ([(name, axis, t, True) for name, axis, t in _present(keys)]
                       + [(name, axis, t, False) for name, axis, t in _present(values)])
        name, axis, t, _ = self._slots[0]
        self._capacity = t.shape[axis]
        self._packed = None

    @property
    def capacity(self) -> int:
        return self._capacity

    def write(self, keys: KeyState, values: ValueState, n: int) -> None:
        """Copy n tokens (`keys`, `values` hold exactly them) into the buffers at `length`; length += n."""
        start = self.length
        for name, axis, buf, is_key in self._slots:
            buf.narrow(axis, start, n).copy_(getattr(keys if is_key else values, name))
        self.length = start + n

    def packed(self, packed_keys, packed_values, quantizer):
        """The whole buffers as the kernels' (PackedKeys, PackedValues), built once per binding."""
        if self._packed is None:
            k, v = self.keys, self.values
            self._packed = (packed_keys(k.codes, k.gamma, k.signs, k.gamma_r),
                            packed_values(v.codes, v.scale, v.minimum, quantizer.bits, quantizer.group))
        return self._packed

    def valid(self) -> tuple[KeyState, ValueState]:
        """Views of the valid tokens [0, length)."""
        return _narrow(self.keys, self.length), _narrow(self.values, self.length)

    @property
    def nbytes(self) -> tuple[int, int]:
        """(key bytes, value bytes) of the valid tokens."""
        k, v = self.valid()
        return k.nbytes, v.nbytes


class DeferredFlags:
    """The device-side record of one sequence's deferred data checks, written without a host sync: row u of
    `peaks` [rows, 2] (float32) says whether unit u's keys and values were fine, either as max |k| and
    max |v| (`record`: torch reductions, NaN and Inf propagate) or as 0 for fine and +inf for bad (the fused
    encode kernel writes row(u) while it encodes the unit); `units` rows are valid. `quantized`: values must
    also fit the fp16 range. Rows start at zero (grown by doubling) and 16 bytes apart (a view of [rows, 4]),
    so every row a kernel writes has the same pointer alignment (one compiled variant). A CUDA graph that
    captured the sequence zeroes and rewrites the same rows on each replay."""

    def __init__(self, device: torch.device, quantized: bool, rows: int = 16) -> None:
        self.quantized = quantized
        self.units = 0
        self.peaks = torch.zeros(rows, 4, dtype=torch.float32, device=device)[:, :2]
        self._split()

    def _split(self) -> None:
        self._rows = [(r, r[0], r[1]) for r in self.peaks.unbind(0)]

    def row(self, unit: int) -> torch.Tensor:
        """Row `unit` ([2] float32, a view starting 16-byte aligned), counted valid from now on."""
        if unit >= len(self._rows):
            rows = max(2 * len(self._rows), unit + 1)
            grown = torch.zeros(rows, 4, dtype=torch.float32, device=self.peaks.device)[:, :2]
            grown[:self.units].copy_(self.peaks[:self.units])
            self.peaks = grown
            self._split()
        self.units = max(self.units, unit + 1)
        return self._rows[unit][0]

    def record(self, unit: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """max |k| and max |v| of unit `unit` into its row: two reductions."""
        self.row(unit)
        _, peak_k, peak_v = self._rows[unit]
        torch.linalg.vector_norm(k, ord=math.inf, dtype=torch.float32, out=peak_k)
        torch.linalg.vector_norm(v, ord=math.inf, dtype=torch.float32, out=peak_v)

    def error(self, rows: list[list[float]]) -> ValueError | None:
        """The append error these rows (`peaks[:units]` read back) mean, the same sentence as the immediate
        check, or None when every unit was fine."""
        bad_k = any(not math.isfinite(pk) for pk, _ in rows)
        if self.quantized:
            bad_v = any(not pv <= FP16_MAX for _, pv in rows)
        else:
            bad_v = any(not math.isfinite(pv) for _, pv in rows)
        if not (bad_k or bad_v):
            return None
        return _append_error("keys" if bad_k else "values", self.quantized)


def _append_error(what: str, quantized: bool) -> ValueError:
    detail = " (values within the fp16 range, |v| <= 65504)" if quantized else ""
    return ValueError(f"append got non-finite {what}: keys and values must be finite{detail}")


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def check_flags(flags: list[DeferredFlags]) -> None:
    """Read several caches' deferred records with one host sync per device; the first bad one raises its
    ValueError. Does nothing while a CUDA graph is being captured (reading would break the capture)."""
    flags = [f for f in flags if f.units]
    if not flags or _capturing():
        return
    by_device: dict[torch.device, list[DeferredFlags]] = {}
    for f in flags:
        by_device.setdefault(f.peaks.device, []).append(f)
    rows: dict[int, list[list[float]]] = {}
    for group in by_device.values():
        values = torch.cat([f.peaks[:f.units] for f in group]).tolist()  # the one sync per device
        start = 0
        for f in group:
            rows[id(f)] = values[start:start + f.units]
            start += f.units
    for f in flags:
        err = f.error(rows[id(f)])
        if err is not None:
            raise err


def check_caches(caches, force: bool = False) -> None:
    """Run the deferred data checks of `caches` (those with unchecked units; every one with flags when
    `force`) with one host sync; raises the append ValueError of the first bad cache."""
    todo = [c for c in caches if c._flags is not None and (force or c._pending)]
    for c in todo:
        c._flush_checks()  # device work only: a graph capture records it
    if not todo or _capturing():
        return
    for c in todo:
        c._pending = False
    check_flags([c._flags for c in todo])


def _own_storage(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a copy of it when it is a view into a larger storage. A window unit outlives the forward pass
    that made it, and a view (the model's v is a slice of its fused q/k/v projection) would keep the whole
    projection alive: at AAR B=64 that was 0.63 GB more than the window's own bytes (H200)."""
    if t.untyped_storage().nbytes() > t.numel() * t.element_size():
        return t.clone(memory_format=torch.contiguous_format)
    return t


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
        self._pending = False  # units appended since the last deferred check
        self.reset()

    # ---- state ----
    def reset(self) -> None:
        """Drop every token (buffers included). Unchecked deferred checks are dropped with them."""
        self.store: CacheStore | None = None
        self._window: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._layout: tuple | None = None  # (B, H, dtype, device) of the units held
        self._plan: _backend.CachePlan | None = None
        self._deferred = False
        self._fused = None  # the fused encode launcher when the sequence uses it (`_fused_encoder`)
        self._flushed = 0  # units whose deferred record is complete (fused: the window is recorded late)
        self._units_compressed = 0
        self._pending = False

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
        return len(self._window) + self._units_compressed

    @property
    def device(self) -> torch.device | None:
        return None if self._layout is None else self._layout[3]

    @property
    def backend(self) -> str:
        """The attention backend that runs for this cache ("triton" or "reference")."""
        if self._plan is not None:
            return self._plan.backend
        return _backend.attention_backend(self.device, self.codec)

    @property
    def checks_deferred(self) -> bool:
        """Whether the units held are checked later (`check()`) rather than at `append`."""
        return self._deferred

    def window_kv(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Native window K, V [B, H, T_window, d] (None when empty; a single unit's own tensors, no copy)."""
        if not self._window:
            return None
        if len(self._window) == 1:
            return self._window[0]
        return torch.cat([k for k, _ in self._window], 2), torch.cat([v for _, v in self._window], 2)

    # ---- accounting ----
    @property
    def nbytes(self) -> int:
        """Bytes held: compressed store (valid tokens) plus the native window."""
        b = self.bytes_breakdown()
        return b["k_bytes"] + b["v_bytes"] + b["window_bytes"]

    @property
    def native_nbytes(self) -> int:
        """fp16 bytes of the same K and V (what an uncompressed fp16 cache would hold)."""
        if self._layout is None:
            return 0
        B, H = self._layout[:2]
        return 2 * B * H * self.num_tokens * self.head_dim * _FP16_BYTES

    def bytes_breakdown(self) -> dict[str, int]:
        """Key, value and window bytes plus token counts.

        k_bytes / v_bytes: compressed store (valid tokens); window_bytes (= native_bytes): the native window;
        fp16_bytes: an fp16 cache of the same tokens; allocated_bytes: store buffers at capacity + window;
        rows = B * H; tokens = store + window tokens.
        """
        k_bytes, v_bytes = (0, 0) if self.store is None else self.store.nbytes
        window_bytes = sum(t.numel() * t.element_size() for kv in self._window for t in kv)
        rows = 0 if self._layout is None else self._layout[0] * self._layout[1]
        allocated = window_bytes
        if self.store is not None:
            allocated += self.store.keys.nbytes + self.store.values.nbytes
        return {"k_bytes": k_bytes, "v_bytes": v_bytes, "window_bytes": window_bytes,
                "allocated_bytes": allocated, "native_bytes": window_bytes, "fp16_bytes": self.native_nbytes,
                "tokens": self.num_tokens, "window_tokens": self.window_tokens, "store_tokens": self.length,
                "rows": rows}

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

    # ---- data checks ----
    def check(self) -> None:
        """Run the deferred data checks of the units appended so far (one host sync; nothing to do when the
        checks are immediate or already done). Raises the ValueError `append` would have raised."""
        check_caches([self])

    def deferred_flags(self) -> DeferredFlags | None:
        """The device-side record the current (or last) sequence's deferred checks write, or None. A CUDA
        graph that captured a sequence rewrites these same tensors on each replay: `check_flags([...])`
        after a replay checks it."""
        return self._flags

    # ---- append ----
    def _check_first(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Everything about the first unit of a sequence (later units must match its layout)."""
        if k.ndim != 4 or k.shape != v.shape or k.shape[-1] != self.head_dim:
            raise ValueError(f"append takes k and v of one shape [B, H, T_unit, {self.head_dim}], "
                             f"got {tuple(k.shape)} and {tuple(v.shape)}")
        if k.numel() == 0:
            raise ValueError(f"append takes one unit of at least one token: k and v [B, H, T_unit, "
                             f"{self.head_dim}] with B, H, T_unit >= 1, got {tuple(k.shape)}")
        if k.dtype != v.dtype or k.device != v.device:
            raise ValueError(f"k and v must share dtype and device, got {k.dtype}/{v.dtype}, "
                             f"{k.device}/{v.device}")
        layout = (k.shape[0], k.shape[1], k.dtype, k.device)
        if self._layout is not None and layout != self._layout:
            raise ValueError(f"this cache holds units of (batch, heads, dtype, device) = {self._layout}; "
                             f"got {layout}; reset() first to change them")
        self.codec.check_keys(k)

    def _check_data(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Finite keys; values finite (and within fp16 when quantized): now (one host sync) or deferred."""
        if self._deferred:
            if k.numel():
                unit = self.num_units
                if self._fused:
                    self._flags.row(unit)  # written by the encode kernel, or by _flush_checks in the window
                else:
                    self._flags.record(unit, k, v)
                self._pending = True
            return
        if self.value_quantizer is None:
            ok = torch.isfinite(k).all() & torch.isfinite(v).all()
        else:
            ok = torch.isfinite(k).all() & (v.abs().amax().float() <= FP16_MAX)
        if not bool(ok.item()):
            what = "keys" if not bool(torch.isfinite(k).all()) else "values"
            raise _append_error(what, self.value_quantizer is not None)

    def _begin(self, k: torch.Tensor) -> None:
        """The first unit of a sequence: fix its layout and the ops and checks the sequence runs."""
        device = k.device
        self._plan = _backend.CachePlan(self.codec, k.shape[1], device)
        deferred = device.type == "cuda" if self.defer_checks is None else self.defer_checks
        if deferred:
            # fresh each sequence (a graph that captured one keeps rewriting the record it saw)
            self._flags = DeferredFlags(device, self.value_quantizer is not None)
        self._deferred = deferred
        self._layout = (k.shape[0], k.shape[1], k.dtype, device)
        self._fused = self._fused_encoder()

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Add one unit (k, v [B, H, T_unit, d]); the oldest window unit beyond `window` is encoded."""
        layout = self._layout
        if layout is None:
            self._check_first(k, v)
        elif (k.shape != v.shape or k.ndim != 4 or k.shape[0] != layout[0] or k.shape[1] != layout[1]
              or not k.shape[2] or k.shape[3] != self.head_dim or k.dtype != layout[2] or v.dtype != layout[2]
              or k.device != layout[3] or v.device != layout[3]):
            self._check_first(k, v)  # raises the precise error
        if layout is None:
            self._begin(k)
        try:
            self._check_data(k, v)
        except ValueError:
            if layout is None:
                self.reset()
            raise
        if self.window:  # the unit outlives this call (window 0: encoded below, never kept)
            k, v = _own_storage(k), _own_storage(v)
        self._window.append((k, v))
        while len(self._window) > self.window:
            self._compress(*self._window.pop(0))

    def _fused_encoder(self):
        """`encode_unit` (keys and values of a unit in one launch, written into the store in place, data
        checks recorded by the kernel) when this sequence's plan runs the encode kernels and the values come
        in groups it takes; else None (separate encodes, then copies into the store)."""
        plan, quant = self._plan, self.value_quantizer
        if quant is None or not plan.kernel_encode or quant.group < 8 or quant.group & (quant.group - 1):
            return None
        return plan.ops.encode_unit

    def _flush_checks(self) -> None:
        """Deferred and fused: record the window units (the kernel records a unit only when it encodes it),
        so the record covers every unit. Device work only."""
        if not (self._deferred and self._fused):
            return
        first = max(self._flushed, self._units_compressed)
        for i, (k, v) in enumerate(self._window[first - self._units_compressed:]):
            if k.numel():
                self._flags.record(first + i, k, v)
        self._flushed = self.num_units

    def _new_store(self, k: torch.Tensor, capacity: int) -> CacheStore:
        """Empty store buffers (formats.md) for `capacity` tokens of this sequence, for the fused encode."""
        B, H, _, d = k.shape
        quant = self.value_quantizer

        def buf(*tail, dtype, fill=False):
            return (torch.zeros if fill else torch.empty)(B, H, capacity, *tail, dtype=dtype, device=k.device)

        fields = {name: buf(*tail, dtype=dtype) for name, (tail, dtype) in self.codec.layout.fields().items()}
        keys = KeyState(dtype=k.dtype, written_by=self.codec.state_tag, **fields)
        words = -(-d * quant.bits // 32)
        # the padding bits of a value row's last word are never written by the kernel: zero them once
        padded = (d * quant.bits) % 32 != 0
        values = ValueState(dtype=k.dtype, codes=buf(words, dtype=torch.int32, fill=padded),
                            scale=buf(d // quant.group, dtype=torch.float16),
                            minimum=buf(d // quant.group, dtype=torch.float16))
        return CacheStore(keys, values, 0)

    def _compress(self, k: torch.Tensor, v: torch.Tensor) -> None:
        n = k.shape[2]
        store = self.store
        if self._fused is not None:
            if store is None:
                store = self.store = self._new_store(k, max(n, self.capacity or 0))
            elif store.length + n > store.capacity:
                self._grow(store, n)
            from octopus_audio.kernels import PackedKeys, PackedValues

            keys, values = store.packed(PackedKeys, PackedValues, self.value_quantizer)
            flags = self._flags.row(self._units_compressed) if self._deferred else None
            self._fused(k, v, self._plan.kernel, keys, values, store.length, flags)
            store.length += n
            self._units_compressed += 1
            return
        k_state = self._plan.encode_keys(self.codec, k)
        v_state = self._plan.encode_values(self.value_quantizer, v)
        if store is None:
            cap = max(n, self.capacity or 0)
            store = self.store = CacheStore(k_state.with_capacity(cap), v_state.with_capacity(cap), 0)
            store.length = n
        else:
            if store.length + n > store.capacity:
                self._grow(store, n)
            store.write(k_state, v_state, n)
        self._units_compressed += 1

    @staticmethod
    def _grow(store: CacheStore, n: int) -> None:
        """Room for n more tokens: the store's capacity doubles (at least), its valid tokens copied."""
        cap = max(store.length + n, 2 * store.capacity)
        keys, values = store.valid()
        store.rebind(keys.with_capacity(cap), values.with_capacity(cap))

    # ---- attend ----
    def _check_query(self, q: torch.Tensor, scale: float) -> int:
        if self._layout is None:
            raise ValueError("attend called on an empty cache: append a unit first")
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not 0 < float(scale) < math.inf:
            raise ValueError(f"attend takes a finite positive scale (the softmax temperature, usually "
                             f"1/sqrt(head_dim)), got {scale!r}")
        B, H = self._layout[:2]
        if q.ndim != 4 or q.shape[0] != B or q.shape[-1] != self.head_dim or q.shape[1] % H:
            raise ValueError(f"attend takes q [B={B}, Hq, Tq, {self.head_dim}] with Hq a multiple of H={H}, "
                             f"got {tuple(q.shape)}")
        return q.shape[1] // H

    def attend(self, q: torch.Tensor, scale: float) -> torch.Tensor:
        """Attention of q [B, Hq, Tq, d] over all held tokens (one softmax) -> [B, Hq, Tq, d], q's dtype."""
        self._check_query(q, scale)
        return self._plan.attention(self, q, scale)

    def decoded_kv(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """All held K, V [B, H, T, d] in `dtype`: the decoded store, then the window (runs `check()`)."""
        if self._layout is None:
            raise ValueError("decoded_kv called on an empty cache: append a unit first")
        self.check()
        return self._decoded_kv(dtype)

    def _decoded_kv(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        ks, vs = [], []
        if self.length:
            k_state, v_state = self.store.valid()
            if self.value_quantizer is None:
                ks.append(k_state.native.to(dtype))
                vs.append(v_state.native.to(dtype))
            else:
                ks.append(self.codec.decode(k_state, dtype))
                vs.append(self.value_quantizer.decode(v_state, dtype))
        for k, v in self._window:
            ks.append(k.to(dtype))
            vs.append(v.to(dtype))
        return torch.cat(ks, 2), torch.cat(vs, 2)

    def _native_kv(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Codec none: the store's valid tokens then the window, one concatenation each (as the unpatched
        model's cache), cast to `dtype` when it differs."""
        ks, vs = [], []
        if self.length:
            ks.append(self.store.keys.native.narrow(2, 0, self.length))
            vs.append(self.store.values.native.narrow(2, 0, self.length))
        for k, v in self._window:
            ks.append(k)
            vs.append(v)
        k_all, v_all = torch.cat(ks, 2), torch.cat(vs, 2)
        if k_all.dtype != dtype:
            k_all, v_all = k_all.to(dtype), v_all.to(dtype)
        return k_all, v_all

    def attend_reference(self, q: torch.Tensor, scale: float) -> torch.Tensor:
        """Reference: decode the store, one SDPA over cat(decoded, window) in fp32 (codec none: native)."""
        self._check_query(q, scale)
        if self.value_quantizer is None:
            k_all, v_all = self._native_kv(q.dtype)
            q_c = q
        else:
            k_all, v_all = self._decoded_kv(torch.float32)
            q_c = q.to(torch.float32)
        return attend(q_c, k_all, v_all, scale).to(q.dtype)

    def __repr__(self) -> str:
        return (f"CompressedKVCache(codec={self.codec_name!r}, bits={self.bits}, v_bits={self.v_bits}, "
                f"head_dim={self.head_dim}, "
                f"window={self.window}, v_group={self.v_group}, seed={self.seed}, backend={self.backend!r}, "
                f"tokens={self.num_tokens}, compressed={self.length}, nbytes={self.nbytes})")
