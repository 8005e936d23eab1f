"""Plain attention over decoded or native keys and values: the cache's reference path, the kernels' tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attend(q_BHqTD: torch.Tensor, k_BHTD: torch.Tensor, v_BHTD: torch.Tensor, scale: float,
           visible_TqT: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(scale * q k^T) v, one softmax over all T keys (or, with `visible_TqT`, over the keys a query's
    row marks True), in the inputs' dtype (SDPA).

    q [B, Hq, Tq, d], k and v [B, H, T, d] with Hq = G * H: query head j reads KV head j // G. Returns
    [B, Hq, Tq, d]. The reference path of `CompressedKVCache` calls it with the store decoded to fp32 and the
    native window appended (and `attend_sequence` with a mask per query); the kernel tests with the library's
    decode of a packed store in float64.
    """
    groups = q_BHqTD.shape[1] // k_BHTD.shape[1]
    if groups > 1:
        k_BHTD = k_BHTD.repeat_interleave(groups, dim=1)
        v_BHTD = v_BHTD.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q_BHqTD, k_BHTD, v_BHTD, attn_mask=visible_TqT, scale=scale)
