"""AAR's cosine self-attention with the released attribute names, so a KV-cache patch can duck-type it.

Attributes a patch may rely on (same names as the released code):
- `mat_qkv` (Linear, no bias), `q_bias`, `v_bias` (parameters), `zero_k_bias` (buffer): the fused projection
  uses the bias `cat(q_bias, zero_k_bias, v_bias)`;
- `scale_mul_1H11` (1, H, 1, 1): q is multiplied by `exp(min(scale_mul_1H11, max_scale_mul = ln 100))`,
  softmax `scale` 1 (`attn_l2_norm` is True: q and k are L2-normalised per head);
- `proj` (Linear with bias), `num_heads`, `head_dim`;
- `caching`, `cached_k`, `cached_v` and `kv_caching(enable)`: while caching, each call appends its unit-norm
  keys and its values, shaped [B, H, L, head_dim], along dim 2 and attends over the whole cache.
The math is split into `_qkv`, `_attend` and `_project` so a patch can reuse the pieces around its own cache.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    """Multi-head cosine attention: `forward(x_BLC, attn_bias) -> x_BLC` ([B, L, C] in and out)."""

    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim {embed_dim} must be a multiple of num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.attn_l2_norm = True  # cosine attention, as the released config (`cos_attn=True`)
        self.scale = 1.0  # softmax scale: q already carries exp(min(scale_mul_1H11, ln 100))
        self.max_scale_mul = float(torch.tensor(100.0, device="cpu").log())  # the release's float32 ln 100
        self.mat_qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=False)
        self.q_bias = nn.Parameter(torch.zeros(embed_dim))
        self.v_bias = nn.Parameter(torch.zeros(embed_dim))
        self.register_buffer("zero_k_bias", torch.zeros(embed_dim))
        self.scale_mul_1H11 = nn.Parameter(torch.full((1, num_heads, 1, 1), math.log(4.0)))
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.caching = False
        self.cached_k: torch.Tensor | None = None
        self.cached_v: torch.Tensor | None = None

    def kv_caching(self, enable: bool) -> None:
        """Turn the KV cache on or off; either way the cache starts empty."""
        self.caching = bool(enable)
        self.cached_k = None
        self.cached_v = None

    def _qkv(self, x_BLC: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project and normalise: q (scaled), k (unit norm per head), v (with its bias); each [B, H, L, D].

        In fp32 this is the release's math op for op. In half precision (autocast) the norms are computed in
        fp32 and applied as one per-row factor, so q and k take one pass each and stay in v's dtype.
        """
        B, L, C = x_BLC.shape
        bias = torch.cat((self.q_bias, self.zero_k_bias, self.v_bias))
        qkv_BL3HD = F.linear(x_BLC, self.mat_qkv.weight, bias).view(B, L, 3, self.num_heads, self.head_dim)
        q_BHLD, k_BHLD, v_BHLD = qkv_BL3HD.permute(2, 0, 3, 1, 4).unbind(0)
        scale_mul_1H11 = self.scale_mul_1H11.clamp_max(self.max_scale_mul).exp()
        if v_BHLD.dtype == torch.float32:
            return F.normalize(q_BHLD, dim=-1).mul(scale_mul_1H11), F.normalize(k_BHLD, dim=-1), v_BHLD
        dtype = v_BHLD.dtype
        q_norm_BHL1 = torch.linalg.vector_norm(q_BHLD, dim=-1, keepdim=True, dtype=torch.float32)
        k_norm_BHL1 = torch.linalg.vector_norm(k_BHLD, dim=-1, keepdim=True, dtype=torch.float32)
        q_BHLD = q_BHLD * (scale_mul_1H11.float() / q_norm_BHL1.clamp_min(1e-12)).to(dtype)
        k_BHLD = k_BHLD * (1.0 / k_norm_BHL1.clamp_min(1e-12)).to(dtype)
        return q_BHLD, k_BHLD, v_BHLD

    @staticmethod
    def _attend(q_BHLD: torch.Tensor, k_BHSD: torch.Tensor, v_BHSD: torch.Tensor,
                attn_bias: torch.Tensor | None) -> torch.Tensor:
        """Softmax attention with scale 1 (q already carries the cosine-attention scale): [B, H, L, D]."""
        if attn_bias is not None:
            attn_bias = attn_bias.to(q_BHLD.dtype)
        return F.scaled_dot_product_attention(q_BHLD, k_BHSD, v_BHSD, attn_mask=attn_bias, scale=1.0)

    def _project(self, o_BHLD: torch.Tensor) -> torch.Tensor:
        """Merge heads and apply the output projection: [B, H, L, D] -> [B, L, C]."""
        B, H, L, D = o_BHLD.shape
        return self.proj(o_BHLD.transpose(1, 2).reshape(B, L, H * D))

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor | None) -> torch.Tensor:
        q_BHLD, k_BHLD, v_BHLD = self._qkv(x)
        if self.caching:
            if self.cached_k is None:
                self.cached_k, self.cached_v = k_BHLD, v_BHLD
            else:
                self.cached_k = torch.cat((self.cached_k, k_BHLD), dim=2)
                self.cached_v = torch.cat((self.cached_v, v_BHLD), dim=2)
            k_BHLD, v_BHLD = self.cached_k, self.cached_v
        return self._project(self._attend(q_BHLD, k_BHLD, v_BHLD, attn_bias))

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, cosine=True, caching={self.caching}"
