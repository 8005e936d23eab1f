"""A KV cache's bytes: the compressed store, the native window, an fp16 cache of the same tokens."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from octopus_audio.cache_store import CacheStore

FP16_BYTES = 2


def fp16_bytes(rows: int, tokens: int, head_dim: int) -> int:
    """Bytes of an fp16 cache of `tokens` keys and values in each of `rows` = B * H rows."""
    return 2 * rows * tokens * head_dim * FP16_BYTES


def bytes_breakdown(store: CacheStore | None, window: Sequence[tuple[torch.Tensor, torch.Tensor]], rows: int,
                    head_dim: int) -> dict[str, int]:
    """Key, value and window bytes plus token counts of a cache (`rows` = B * H, 0 when empty).

    k_bytes / v_bytes: compressed store (valid tokens); window_bytes (= native_bytes): the native window;
    fp16_bytes: an fp16 cache of the same tokens; allocated_bytes: store buffers at capacity + window;
    tokens = store + window tokens.
    """
    k_bytes, v_bytes = (0, 0) if store is None else store.nbytes
    window_bytes = sum(t.numel() * t.element_size() for kv in window for t in kv)
    window_tokens = sum(k.shape[2] for k, _ in window)
    store_tokens = 0 if store is None else store.length
    allocated = window_bytes
    if store is not None:
        allocated += store.keys.nbytes + store.values.nbytes
    tokens = store_tokens + window_tokens
    return {"k_bytes": k_bytes, "v_bytes": v_bytes, "window_bytes": window_bytes,
            "allocated_bytes": allocated, "native_bytes": window_bytes,
            "fp16_bytes": fp16_bytes(rows, tokens, head_dim), "tokens": tokens,
            "window_tokens": window_tokens, "store_tokens": store_tokens, "rows": rows}
