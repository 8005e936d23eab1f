"""Attention with no compressed key: torch's SDPA over the native keys alone.

A call whose store and wide prefix hold no token (a cache's first units, still in its native prefix and
window) has nothing to decode, so the fastest exact attention is the uncompressed one. The selector gives it
such a call when the Gluon kernel does not take it: at AAR's first scale (one query row a KV head, one native
key) the score-table kernel, built for long compressed contexts, took 0.289 ms at 2B = 512 rows x 16 heads on
an H100, this SDPA call 0.183 (benchmarks/results/kernels.md, the patch's attention scale by scale). GQA is
SDPA's own (`enable_gqa`, torch >= 2.5).

    softmax(scale * q K_win^T) V_win,   q [B, Hq, Tq, d], K_win, V_win [B, H, Tw, d], Hq = G * H

in q's dtype (the window is cast to it when they differ); query head h * G + g reads KV head h.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "sdpa"


def native_limit(length: int, wide_length: int, t_win: int) -> str | None:
    """Why this implementation does not take a call (None when it does): it takes only calls with no stored
    token (`length` and `wide_length` 0) and at least one native key."""
    if length or wide_length:
        return f"{length + wide_length} compressed keys to decode"
    if not t_win:
        return "no native key"
    return None


def attention_native(q_BHTD: torch.Tensor, k_window: torch.Tensor, v_window: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """SDPA of q over the native window alone -> [B, Hq, Tq, d] in q's dtype (the window cast to it; with
    query groups, SDPA's own GQA)."""
    k, v = k_window.to(q_BHTD.dtype), v_window.to(q_BHTD.dtype)
    return F.scaled_dot_product_attention(q_BHTD, k, v, scale=scale, enable_gqa=q_BHTD.shape[1] != k.shape[1])
