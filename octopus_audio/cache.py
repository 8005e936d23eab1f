"""Compressed KV cache: the newest W units native, older units encoded once into packed buffers."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from octopus_audio import backend as _backend
from octopus_audio.codecs import get_codec
from octopus_audio.codecs.base import KeyState
from octopus_audio.values import FP16_MAX, ValueQuantizer, ValueState

_FP16_BYTES = 2


@dataclasses.dataclass
class CacheStore:
    """The compressed store: per-field buffers preallocated along T (grown by doubling); tokens [0, length)
    are valid. `keys` is a KeyState and `values` a ValueState whose tensors are [B, H, capacity, ...]
    (formats.md); for codec `none` they hold `native` K and V."""

    keys: KeyState
    values: ValueState
    length: int = 0

    @property
    def capacity(self) -> int:
        return self.keys.num_tokens

    def valid(self) -> tuple[KeyState, ValueState]:
        """Views of the valid tokens [0, length)."""
        return self.keys.slice_t(0, self.length), self.values.slice_t(0, self.length)

    @property
    def nbytes(self) -> tuple[int, int]:
        """(key bytes, value bytes) of the valid tokens."""
        k, v = self.valid()
        return k.nbytes, v.nbytes


class CompressedKVCache:
    """KV cache of one attention layer with compressed keys (any codec) and group-quantized values.

    append(k, v): one unit (k, v [B, H, T_unit, d]); the newest `window` units stay native, and a unit is
    encoded exactly once, when it leaves the window (window=0 encodes every unit at once).
    attend(q [B, Hq, Tq, d], scale) -> [B, Hq, Tq, d] in q's dtype: one softmax over the compressed store and
    the window; Hq = G * H, query head j uses KV head j // G. Codec `none` stores native K/V and attends with
    plain SDPA in the native dtype (bit-identical to SDPA over the concatenated K/V).
    The codec's seed is used as is (per layer: `octopus_audio.rotation.layer_seed(base_seed, layer)`).
    Values use the same `bits` as keys, in groups of `v_group` channels.
    capacity: tokens the compressed store is allocated for when it is first written (None: just the first
    unit); past it the store grows by doubling. A caller that knows the sequence (AAR: the scales before the
    window) avoids the growth copies and the spare capacity.
    """

    def __init__(self, codec: str, bits: int, head_dim: int, window: int = 1, v_group: int = 16,
                 seed: int = 0, capacity: int | None = None, **codec_options) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError(f"window must be an integer >= 0 (units kept native), got {window!r}")
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int)
                                     or capacity < 0):
            raise ValueError(f"capacity must be None or an integer >= 0 (tokens), got {capacity!r}")
        self.capacity = capacity
        self.codec = get_codec(codec, bits, head_dim, seed=seed, **codec_options)
        self.codec_name = codec
        self.bits = bits
        self.head_dim = head_dim
        self.window = window
        self.v_group = v_group
        self.seed = seed
        self.value_quantizer = None if codec == "none" else ValueQuantizer(bits, head_dim, v_group)
        self.reset()

    # ---- state ----
    def reset(self) -> None:
        """Drop every token (buffers included)."""
        self.store: CacheStore | None = None
        self._window: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._layout: tuple | None = None  # (B, H, dtype, device) of the units held
        self._units_compressed = 0

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
        return _backend.attention_backend(self.device, self.codec_name)

    def window_kv(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Native window K, V [B, H, T_window, d] (None when the window is empty)."""
        if not self._window:
            return None
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

    # ---- append ----
    def _check_unit(self, k: torch.Tensor, v: torch.Tensor) -> None:
        if k.ndim != 4 or k.shape != v.shape or k.shape[-1] != self.head_dim:
            raise ValueError(f"append takes k and v of one shape [B, H, T_unit, {self.head_dim}], "
                             f"got {tuple(k.shape)} and {tuple(v.shape)}")
        if k.dtype != v.dtype or k.device != v.device:
            raise ValueError(f"k and v must share dtype and device, got {k.dtype}/{v.dtype}, "
                             f"{k.device}/{v.device}")
        layout = (k.shape[0], k.shape[1], k.dtype, k.device)
        if self._layout is not None and layout != self._layout:
            raise ValueError(f"this cache holds units of (batch, heads, dtype, device) = {self._layout}; "
                             f"got {layout}; reset() first to change them")
        self.codec.check_keys(k)
        # one host sync per unit: finite keys; values finite (and within fp16 when quantized)
        if self.value_quantizer is None:
            ok = torch.isfinite(k).all() & torch.isfinite(v).all()
        else:
            ok = torch.isfinite(k).all() & (v.abs().amax().float() <= FP16_MAX)
        if not bool(ok.item()):
            what = "keys" if not bool(torch.isfinite(k).all()) else "values"
            detail = "" if self.value_quantizer is None else " (values within the fp16 range, |v| <= 65504)"
            raise ValueError(f"append got non-finite {what}: keys and values must be finite{detail}")

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Add one unit (k, v [B, H, T_unit, d]); the oldest window unit beyond `window` is encoded."""
        self._check_unit(k, v)
        if self._layout is None:
            self._layout = (k.shape[0], k.shape[1], k.dtype, k.device)
        self._window.append((k, v))
        while len(self._window) > self.window:
            self._compress(*self._window.pop(0))

    def _compress(self, k: torch.Tensor, v: torch.Tensor) -> None:
        be = _backend.attention_backend(k.device, self.codec_name)
        k_state = _backend.encode_keys(self.codec, k, be)
        if self.value_quantizer is None:
            v_state = ValueState(dtype=v.dtype, native=v.contiguous().clone())
        else:
            v_state = _backend.encode_values(self.value_quantizer, v, be)
        n = k.shape[2]
        if self.store is None:
            cap = max(n, self.capacity or 0)
            self.store = CacheStore(k_state.with_capacity(cap), v_state.with_capacity(cap), 0)
        elif self.store.length + n > self.store.capacity:
            cap = max(self.store.length + n, 2 * self.store.capacity)
            self.store.keys = self.store.keys.slice_t(0, self.store.length).with_capacity(cap)
            self.store.values = self.store.values.slice_t(0, self.store.length).with_capacity(cap)
        self.store.keys.write_t(self.store.length, k_state)
        self.store.values.write_t(self.store.length, v_state)
        self.store.length += n
        self._units_compressed += 1

    # ---- attend ----
    def _check_query(self, q: torch.Tensor) -> int:
        if self._layout is None:
            raise ValueError("attend called on an empty cache: append a unit first")
        B, H = self._layout[:2]
        if q.ndim != 4 or q.shape[0] != B or q.shape[-1] != self.head_dim or q.shape[1] % H:
            raise ValueError(f"attend takes q [B={B}, Hq, Tq, {self.head_dim}] with Hq a multiple of H={H}, "
                             f"got {tuple(q.shape)}")
        return q.shape[1] // H

    def attend(self, q: torch.Tensor, scale: float) -> torch.Tensor:
        """Attention of q [B, Hq, Tq, d] over all held tokens (one softmax) -> [B, Hq, Tq, d], q's dtype."""
        self._check_query(q)
        return _backend.attention(self, q, scale, _backend.attention_backend(q.device, self.codec_name))

    def decoded_kv(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """All held K, V [B, H, T, d] in `dtype`: the decoded store then the native window."""
        ks, vs = [], []
        if self.length:
            k_state, v_state = self.store.valid()
            ks.append(self.codec.decode(k_state, dtype))
            vs.append(v_state.native.to(dtype) if self.value_quantizer is None
                      else self.value_quantizer.decode(v_state, dtype))
        win = self.window_kv()
        if win is not None:
            ks.append(win[0].to(dtype))
            vs.append(win[1].to(dtype))
        return torch.cat(ks, 2), torch.cat(vs, 2)

    def attend_reference(self, q: torch.Tensor, scale: float) -> torch.Tensor:
        """Reference: decode the store, one SDPA over cat(decoded, window) in fp32 (codec none: native)."""
        groups = self._check_query(q)
        if self.value_quantizer is None:
            k_all, v_all = self.decoded_kv(q.dtype)
            q_c = q
        else:
            k_all, v_all = self.decoded_kv(torch.float32)
            q_c = q.to(torch.float32)
        if groups > 1:
            k_all = k_all.repeat_interleave(groups, dim=1)
            v_all = v_all.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(q_c, k_all, v_all, scale=scale).to(q.dtype)

    def __repr__(self) -> str:
        return (f"CompressedKVCache(codec={self.codec_name!r}, bits={self.bits}, head_dim={self.head_dim}, "
                f"window={self.window}, v_group={self.v_group}, seed={self.seed}, backend={self.backend!r}, "
                f"tokens={self.num_tokens}, compressed={self.length}, nbytes={self.nbytes})")
