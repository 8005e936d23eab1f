"""A KV cache's bytes: the compressed store, the native prefix and window, an fp16 cache of the same
tokens."""

from __future__ import annotations

from octopus_audio.cache.native import NativeSegment
from octopus_audio.cache.store import CacheStore

FP16_BYTES = 2


def fp16_bytes(rows: int, tokens: int, head_dim: int) -> int:
    """Bytes of an fp16 cache of `tokens` keys and values in each of `rows` = B * H rows."""
    return 2 * rows * tokens * head_dim * FP16_BYTES


def bytes_breakdown(store: CacheStore | None, native: NativeSegment | None, rows: int, head_dim: int,
                    wide: CacheStore | None = None) -> dict[str, int]:
    """Key, value and native bytes plus token counts of a cache (`rows` = B * H, 0 when empty).

    k_bytes / v_bytes: compressed store (valid tokens); prefix_bytes / window_bytes: the native prefix and
    the native window (K and V, in the cache's dtype), native_bytes their sum; fp16_bytes: an fp16 cache of
    the same tokens; allocated_bytes: store buffers at capacity + the native buffer; tokens = store + prefix
    + window tokens. `wide`: the wide prefix's store (CompressedKVCache's `wide_prefix`), whose tokens and
    bytes count as compressed ones (store_tokens, k_bytes, v_bytes); wide_tokens: how many.
    """
    k_bytes, v_bytes = (0, 0) if store is None else store.nbytes
    prefix_bytes, window_bytes = (0, 0) if native is None else native.nbytes
    prefix_tokens = 0 if native is None else native.prefix_tokens
    window_tokens = 0 if native is None else native.window_tokens
    store_tokens = 0 if store is None else store.length
    allocated = 0 if native is None else native.allocated_bytes
    wide_tokens = 0
    for part in (store, wide):
        if part is not None:
            allocated += part.keys.nbytes + part.values.nbytes
    if wide is not None:
        wide_k, wide_v = wide.nbytes
        k_bytes, v_bytes, wide_tokens = k_bytes + wide_k, v_bytes + wide_v, wide.length
        store_tokens += wide_tokens
    tokens = store_tokens + prefix_tokens + window_tokens
    return {"k_bytes": k_bytes, "v_bytes": v_bytes, "prefix_bytes": prefix_bytes,
            "window_bytes": window_bytes, "native_bytes": prefix_bytes + window_bytes,
            "allocated_bytes": allocated, "fp16_bytes": fp16_bytes(rows, tokens, head_dim), "tokens": tokens,
            "prefix_tokens": prefix_tokens, "window_tokens": window_tokens, "store_tokens": store_tokens,
            "wide_tokens": wide_tokens, "rows": rows}
