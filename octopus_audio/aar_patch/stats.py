"""The patch's accounting: the bytes one layer's compressed cache holds (`LayerStats`) and a generation's, per
layer and in total (`CacheStats`), with the rates the CLI line and the eval report print."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import PatchConfig

_FP16_BYTES = 2


@dataclasses.dataclass(frozen=True)
class LayerStats:
    """Bytes held by one layer's cache (all rows of the batch, all heads).

    tokens: units' tokens in the cache; window_tokens and prefix_tokens of them native (the window's and the
    sink scales'). k_bytes / v_bytes: the compressed store (packed codes and side fields) of the tokens held;
    native_bytes: the native window and prefix (K and V, in the model's dtype), prefix_bytes the prefix's
    share; fp16_bytes: what the same K and V would take in fp16; compressed_coords: B*H*d times the
    compressed tokens (per K or V), stored_coords the same of every token outside the window (the compressed
    store and the prefix); allocated_bytes: what the buffers occupy, including any spare capacity
    (reserved for the sequence when the model says its `patch_nums`; past that, or without them, the buffers
    grow by doubling).

    The rates (`k_bits`, `v_bits`, `store_ratio`) describe what the cache stores beyond the window: the
    compressed store and the native prefix, whose tokens count at their native width, so configurations with
    and without sink scales compare at what they really hold. The window, the same in every configuration,
    is left out of them (not of `ratio`).
    """

    layer: int
    tokens: int
    window_tokens: int
    k_bytes: int
    v_bytes: int
    native_bytes: int
    fp16_bytes: int
    compressed_coords: int
    allocated_bytes: int
    prefix_tokens: int
    prefix_bytes: int
    stored_coords: int

    @property
    def nbytes(self) -> int:
        return self.k_bytes + self.v_bytes + self.native_bytes

    @property
    def ratio(self) -> float:
        """fp16 bytes / cache bytes, the native window included."""
        return self.fp16_bytes / self.nbytes if self.nbytes else float("nan")

    @property
    def store_ratio(self) -> float:
        """fp16 bytes / bytes of what is stored beyond the window: the compressed store and the native prefix
        (the window left out)."""
        fp16_store = 2 * _FP16_BYTES * self.stored_coords
        stored = self.k_bytes + self.v_bytes + self.prefix_bytes
        return fp16_store / stored if self.stored_coords else float("nan")

    @property
    def k_bits(self) -> float:
        """Effective stored bits per key coordinate beyond the window: the compressed store (side fields
        included) and the native prefix at its native width. NaN when nothing lies beyond the window."""
        return self._bits(self.k_bytes)

    @property
    def v_bits(self) -> float:
        """Effective stored bits per value coordinate beyond the window: the compressed store
        (scales/minima included) and the native prefix at its native width."""
        return self._bits(self.v_bytes)

    def _bits(self, store_bytes: int) -> float:
        """8 * (K or V bytes of the store + half the prefix's bytes) per stored coordinate (NaN if none)."""
        if not self.stored_coords:
            return float("nan")
        return 8 * (store_bytes + self.prefix_bytes / 2) / self.stored_coords


@dataclasses.dataclass(frozen=True)
class CacheStats:
    """The accounting of one generation (or of the cache as it is now): per layer and in total."""

    config: PatchConfig
    layers: tuple[LayerStats, ...]

    def _sum(self, name: str) -> int:
        return sum(getattr(s, name) for s in self.layers)

    @property
    def total(self) -> LayerStats:
        return LayerStats(layer=-1, tokens=self.layers[0].tokens if self.layers else 0,
                          window_tokens=self.layers[0].window_tokens if self.layers else 0,
                          k_bytes=self._sum("k_bytes"), v_bytes=self._sum("v_bytes"),
                          native_bytes=self._sum("native_bytes"), fp16_bytes=self._sum("fp16_bytes"),
                          compressed_coords=self._sum("compressed_coords"),
                          allocated_bytes=self._sum("allocated_bytes"),
                          prefix_tokens=self.layers[0].prefix_tokens if self.layers else 0,
                          prefix_bytes=self._sum("prefix_bytes"), stored_coords=self._sum("stored_coords"))

    def line(self) -> str:
        """One line for the CLI: total bytes, what they replace, ratio and bits per coordinate."""
        t, c = self.total, self.config
        mib = 2.0**20
        sinks = bool(c.sink_scales)
        native = (f"{t.prefix_tokens} in the sink scales + {t.window_tokens} in the window native" if sinks
                  else f"{t.window_tokens} native")
        return (f"kv cache [{c.label} W={c.window}, {len(self.layers)} layers, {t.tokens} tokens "
                f"({native})]: {t.nbytes / mib:.2f} MiB (compressed {(t.k_bytes + t.v_bytes) / mib:.2f} + "
                f"native {'sink scales and ' * sinks}window {t.native_bytes / mib:.2f}) vs fp16 "
                f"{t.fp16_bytes / mib:.2f} MiB: {t.ratio:.2f}x ({t.store_ratio:.2f}x on the store"
                f"{' and sink scales' * sinks}); K {t.k_bits:.2f} bits/coord, V {t.v_bits:.2f} bits/coord; "
                f"buffers allocated {t.allocated_bytes / mib:.2f} MiB")

    def as_dict(self) -> dict:
        def row(s: LayerStats) -> dict:
            return {**dataclasses.asdict(s), "nbytes": s.nbytes, "ratio": s.ratio,
                    "store_ratio": s.store_ratio, "k_bits": s.k_bits, "v_bits": s.v_bits}
        config = dataclasses.asdict(self.config)
        config["kv_dtype"] = None if self.config.kv_dtype is None else str(self.config.kv_dtype)
        return {"config": config, "total": row(self.total),
                "layers": [row(s) for s in self.layers]}
