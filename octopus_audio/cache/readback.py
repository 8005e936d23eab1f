"""A cache's held tokens read back as K and V in sequence order (the native prefix, the store, the window):
decoded by the codec library (`held_kv`, each stored token decoded once a sequence: `DecodedStore`) or, for
a codec that does not compress, as stored (`plain_kv`). What the reference attention and `decoded_kv` read."""

from __future__ import annotations

import torch

from octopus_audio.cache.native import NativeSegment
from octopus_audio.cache.store import CacheStore


class DecodedStore:
    """The store's tokens decoded, per dtype, as chunks along T. Each token is decoded once a sequence: the
    tokens stored since the last call are decoded and kept. A token's decode does not depend on the others
    (the codecs and the value quantizer decode token by token), so the chunks equal one decode of the whole
    store, bit for bit (tests/test_cache.py checks it for every codec). `clear` after the store's tokens
    change other than by growing (a reorder of rows, a crop)."""

    def __init__(self) -> None:
        self._chunks: dict[torch.dtype, tuple[list[torch.Tensor], list[torch.Tensor], int]] = {}

    def clear(self) -> None:
        self._chunks.clear()

    def chunks(self, store: CacheStore, codec, quantizer,
               dtype: torch.dtype) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The decoded K and V chunks [B, H, T_chunk, d] of `store`'s valid tokens, in order, in `dtype`."""
        ks, vs, done = self._chunks.get(dtype, ([], [], 0))
        if done < store.length:
            k_state, v_state = store.valid()
            ks.append(codec.decode(k_state.slice_t(done, store.length), dtype))
            vs.append(quantizer.decode(v_state.slice_t(done, store.length), dtype))
            self._chunks[dtype] = (ks, vs, store.length)
        return ks, vs


def in_order(native: NativeSegment | None, store_k: list[torch.Tensor],
             store_v: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The native prefix, then the store's parts (`store_k`, `store_v`), then the window: every held token in
    sequence order, empty parts left out."""
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


def held_kv(native: NativeSegment | None, store: CacheStore | None, codec, quantizer, decoded: DecodedStore,
            dtype: torch.dtype, wide: tuple[torch.Tensor, torch.Tensor] | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Every held K, V [B, H, T, d] in `dtype`, in sequence order: the native prefix, the wide prefix's K, V
    (`wide`, already decoded; None: none), the store decoded by `codec` and `quantizer` (None: a codec that
    does not compress, its native K/V as stored), the window."""
    store_k, store_v = [], []
    if store is not None and store.length:
        if quantizer is None:
            k_state, v_state = store.valid()
            store_k, store_v = [k_state.native], [v_state.native]
        else:
            store_k, store_v = decoded.chunks(store, codec, quantizer, dtype)
    if wide is not None:
        store_k, store_v = [wide[0], *store_k], [wide[1], *store_v]
    ks, vs = in_order(native, store_k, store_v)
    return torch.cat([k.to(dtype) for k in ks], 2), torch.cat([v.to(dtype) for v in vs], 2)


def plain_kv(native: NativeSegment | None, store: CacheStore | None,
             dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Codec none: every held token in sequence order (the prefix, the store's valid tokens, the window), one
    concatenation each (as the unpatched model's cache), cast to `dtype` when it differs. With nothing native
    (window 0, no prefix) the store's valid tokens are returned as a view, nothing copied: a preallocated
    native cache."""
    store_k, store_v = [], []
    if store is not None and store.length:
        store_k = [store.keys.native.narrow(2, 0, store.length)]
        store_v = [store.values.native.narrow(2, 0, store.length)]
    ks, vs = in_order(native, store_k, store_v)
    k_all, v_all = (ks[0], vs[0]) if len(ks) == 1 else (torch.cat(ks, 2), torch.cat(vs, 2))
    if k_all.dtype != dtype:
        k_all, v_all = k_all.to(dtype), v_all.to(dtype)
    return k_all, v_all
