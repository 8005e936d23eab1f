"""The AAR transformer: AdaLN blocks with cosine attention over 16 scales; loads the released checkpoint.

Sections: 1. config (frozen, validated, inferable from a state dict); 2. building blocks (conditioning MLP,
FFN, AdaLN block, AdaLN before the head); 3. the model with its teacher-forcing (training) forward.
Generation with the KV cache lives in `generation.py`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from octopus_audio.errors import UsageError

from .attention import SelfAttention
from .sat import RELEASE_PATCH_NUMS  # the tokenizer's scale layout: tokens a scale


# 1. config ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AARConfig:
    """Sizes of an AAR transformer; the defaults are the released `AAR_d16` model."""

    depth: int = 16
    embed_dim: int = 1024
    num_heads: int = 16
    cond_dim: int = 512
    vocab_size: int = 1024
    latent_dim: int = 128
    patch_nums: tuple[int, ...] = RELEASE_PATCH_NUMS
    mlp_ratio: float = 4.0
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("depth", "embed_dim", "num_heads", "cond_dim", "vocab_size", "latent_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"AARConfig.{name} must be a positive int, got {value!r}")
        object.__setattr__(self, "patch_nums", tuple(self.patch_nums))
        pn = self.patch_nums
        if len(pn) < 2 or any(not isinstance(p, int) or p < 1 for p in pn) or list(pn) != sorted(set(pn)):
            raise ValueError(f"AARConfig.patch_nums must be at least two strictly increasing positive ints, "
                             f"got {pn!r}")
        if self.embed_dim % self.num_heads != 0:
            raise ValueError(f"AARConfig.embed_dim {self.embed_dim} must be a multiple of num_heads "
                             f"{self.num_heads}")
        hidden = self.embed_dim * self.mlp_ratio
        if self.mlp_ratio <= 0 or hidden != int(hidden):
            raise ValueError(f"AARConfig.mlp_ratio * embed_dim must be a positive integer, got "
                             f"{self.mlp_ratio} * {self.embed_dim}")
        if not self.norm_eps > 0:
            raise ValueError(f"AARConfig.norm_eps must be > 0, got {self.norm_eps}")

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def mlp_hidden(self) -> int:
        return int(self.embed_dim * self.mlp_ratio)

    @property
    def num_scales(self) -> int:
        return len(self.patch_nums)

    @property
    def seq_len(self) -> int:
        """Tokens over all scales (455 for the release)."""
        return sum(self.patch_nums)

    @classmethod
    def from_state_dict(cls, sd: Mapping[str, torch.Tensor]) -> AARConfig:
        """Infer the sizes from a (prefix-free) transformer state dict; missing keys are a UsageError."""
        needed = ("word_embed.weight", "class_emb.fc1.weight", "head.weight", "lvl_1L",
                  "blocks.0.attn.scale_mul_1H11", "blocks.0.ffn.fc1.weight")
        missing = [k for k in needed if k not in sd]
        if missing:
            raise UsageError(f"the transformer state dict lacks the keys that fix its sizes: "
                             f"{', '.join(missing)}")
        embed_dim, latent_dim = sd["word_embed.weight"].shape
        depth = 1 + max(int(m.group(1)) for k in sd if (m := re.match(r"blocks\.(\d+)\.", k)))
        lvl_1L = sd["lvl_1L"].reshape(-1).long()
        counts = torch.bincount(lvl_1L).tolist()
        if lvl_1L.numel() == 0 or (lvl_1L.diff() < 0).any() or 0 in counts:
            raise UsageError("the transformer state dict has an `lvl_1L` that is not a sorted run of scale "
                             "levels 0, 1, 2, ...; the file is not an AAR checkpoint")
        try:
            return cls(depth=depth, embed_dim=int(embed_dim),
                       num_heads=int(sd["blocks.0.attn.scale_mul_1H11"].shape[1]),
                       cond_dim=int(sd["class_emb.fc1.weight"].shape[1]),
                       vocab_size=int(sd["head.weight"].shape[0]),
                       latent_dim=int(latent_dim), patch_nums=tuple(counts),
                       mlp_ratio=sd["blocks.0.ffn.fc1.weight"].shape[0] / embed_dim)
        except ValueError as e:
            raise UsageError(f"the transformer state dict describes an impossible model: {e}") from e


# 2. building blocks ---------------------------------------------------------------------------------------
class ConditionMLP(nn.Module):
    """`class_emb`: the 512-d CLAP embedding -> width, two bias-free linears with GELU (tanh) between."""

    def __init__(self, cond_dim: int, embed_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cond_dim, embed_dim, bias=False)
        self.fc2 = nn.Linear(embed_dim, embed_dim, bias=False)

    def forward(self, cond_BE: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(cond_BE), approximate="tanh"))


class FFN(nn.Module):
    """Position-wise MLP: fc1, GELU (tanh), fc2."""

    def __init__(self, embed_dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, hidden)
        self.fc2 = nn.Linear(hidden, embed_dim)

    def forward(self, x_BLC: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x_BLC), approximate="tanh"))


class AdaLNBlock(nn.Module):
    """Transformer block whose LayerNorm scale/shift and residual gains come from the condition (AdaLN)."""

    def __init__(self, config: AARConfig) -> None:
        super().__init__()
        C = config.embed_dim
        self.embed_dim = C
        self.attn = SelfAttention(C, config.num_heads)
        self.ffn = FFN(C, config.mlp_hidden)
        self.ln_wo_grad = nn.LayerNorm(C, eps=config.norm_eps, elementwise_affine=False)
        self.ada_lin = nn.Sequential(nn.SiLU(), nn.Linear(C, 6 * C))

    def forward(self, x_BLC: torch.Tensor, cond_BD: torch.Tensor,
                attn_bias: torch.Tensor | None) -> torch.Tensor:
        ada_B16C = self.ada_lin(cond_BD).view(-1, 1, 6, self.embed_dim)
        gamma1, gamma2, scale1, scale2, shift1, shift2 = ada_B16C.unbind(2)
        # addcmul: one pass for each modulation and each gated residual (fp32 out under bf16 autocast)
        h_BLC = torch.addcmul(shift1, self.ln_wo_grad(x_BLC), scale1.add(1))
        x_BLC = torch.addcmul(x_BLC, self.attn(h_BLC, attn_bias), gamma1)
        h_BLC = torch.addcmul(shift2, self.ln_wo_grad(x_BLC), scale2.add(1))
        return torch.addcmul(x_BLC, self.ffn(h_BLC), gamma2)


class AdaLNBeforeHead(nn.Module):
    """`head_nm`: LayerNorm modulated by the condition, right before the logits head."""

    def __init__(self, config: AARConfig) -> None:
        super().__init__()
        C = config.embed_dim
        self.embed_dim = C
        self.ln_wo_grad = nn.LayerNorm(C, eps=config.norm_eps, elementwise_affine=False)
        self.ada_lin = nn.Sequential(nn.SiLU(), nn.Linear(C, 2 * C))

    def forward(self, x_BLC: torch.Tensor, cond_BD: torch.Tensor) -> torch.Tensor:
        scale, shift = self.ada_lin(cond_BD).view(-1, 1, 2, self.embed_dim).unbind(2)
        return self.ln_wo_grad(x_BLC).mul(scale.add(1)).add_(shift)


# 3. the model ---------------------------------------------------------------------------------------------
class AAR(nn.Module):
    """Next-scale prediction transformer over the tokenizer's 16 scales, conditioned on a CLAP embedding.

    Shapes: B batch, L = sum(patch_nums) tokens, C width, V vocabulary, Cv latent dim, E condition dim.
    """

    def __init__(self, config: AARConfig | None = None) -> None:
        super().__init__()
        self.config = config = config or AARConfig()
        C, L = config.embed_dim, config.seq_len
        self.patch_nums = config.patch_nums

        # 1. inputs: condition MLP (also the start token), unconditional embedding, word/pos/level embeddings
        self.class_emb = ConditionMLP(config.cond_dim, C)
        self.register_buffer("uncond_embedding", torch.zeros(1, config.cond_dim))
        self.first_l = config.patch_nums[0]
        self.pos_start = nn.Parameter(torch.zeros(1, self.first_l, C))
        self.pos_1LC = nn.Parameter(torch.zeros(1, L, C))
        self.word_embed = nn.Linear(config.latent_dim, C)
        # `_weight` skips nn.Embedding's own init (init_weights does it; on the meta device it would be slow)
        self.lvl_embed = nn.Embedding(config.num_scales, C, _weight=torch.empty(config.num_scales, C))
        # index buffers are computed on the CPU (on the meta device these ops would import torch._dynamo)
        device = torch.empty(0).device  # the device of an enclosing `with torch.device(...)`, else cpu
        lvl_L = torch.tensor([si for si, pn in enumerate(config.patch_nums) for _ in range(pn)], device="cpu")
        self.register_buffer("lvl_1L", lvl_L.view(1, L).to(device))
        # block-causal mask: a query of scale i sees keys of scales <= i
        visible_LL = lvl_L.view(L, 1) >= lvl_L.view(1, L)
        mask_LL = torch.zeros(L, L, device="cpu").masked_fill(~visible_LL, -math.inf)
        self.register_buffer("attn_bias_for_masking", mask_LL.view(1, 1, L, L).to(device))

        # 2. blocks and 3. head
        self.blocks = nn.ModuleList(AdaLNBlock(config) for _ in range(config.depth))
        self.head_nm = AdaLNBeforeHead(config)
        self.head = nn.Linear(C, config.vocab_size)
        if not self.pos_1LC.is_meta:
            self.init_weights()

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """Random initialisation for training or benchmarks (truncated normal linears, small AdaLN gains)."""
        gen = torch.Generator(device=self.pos_1LC.device)  # drawn where the model lives (fast on a GPU)
        if seed is not None:
            gen.manual_seed(seed)
        std = math.sqrt(1.0 / self.config.embed_dim / 3)

        def normal_(t: torch.Tensor, s: float) -> None:
            t.copy_(torch.randn(t.shape, generator=gen, device=t.device).clamp_(-2, 2).mul_(s))

        for m in self.modules():
            if isinstance(m, nn.Linear):
                normal_(m.weight, std)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.Embedding):
                normal_(m.weight, std)
        for t in (self.pos_start, self.pos_1LC):
            normal_(t, std)
        normal_(self.uncond_embedding, 1.0 / math.sqrt(self.config.cond_dim))
        # the head keeps the plain std: logits of order 1, so random-weight sampling is not uniform
        for block in self.blocks:
            block.ada_lin[-1].weight.mul_(0.5)
            block.attn.scale_mul_1H11.fill_(math.log(4.0))
            block.attn.proj.weight.div_(math.sqrt(2 * self.config.depth))
            block.ffn.fc2.weight.div_(math.sqrt(2 * self.config.depth))
        self.head_nm.ada_lin[-1].weight.mul_(0.5)

    def condition(self, cond_BE: torch.Tensor) -> torch.Tensor:
        """`class_emb` of a batch of conditions: [B, E] -> [B, C]."""
        return self.class_emb(cond_BE)

    def get_logits(self, x_BLC: torch.Tensor, cond_BD: torch.Tensor) -> torch.Tensor:
        """AdaLN + head, in fp32: [B, L, C] -> [B, L, V]."""
        return self.head(self.head_nm(x_BLC.float(), cond_BD.float()).float()).float()

    def forward(self, cond_BE: torch.Tensor, x_BLCv_wo_first_l: torch.Tensor,
                cond_drop_prob: float = 0.0, generator: torch.Generator | None = None) -> torch.Tensor:
        """Teacher-forcing forward: logits [B, L, V] for all scales at once under the block-causal mask.

        `x_BLCv_wo_first_l` [B, L - first_l, Cv] holds the area-downsampled next-scale inputs of scales 1..S-1
        (the tokenizer's `teacher_forcing_input`). With `cond_drop_prob` > 0, that fraction of rows is
        replaced by the unconditional embedding (classifier-free guidance training).
        """
        B = x_BLCv_wo_first_l.shape[0]
        L = self.config.seq_len
        if cond_drop_prob > 0:
            drop_B1 = torch.rand(B, 1, device=cond_BE.device, generator=generator) < cond_drop_prob
            cond_BE = torch.where(drop_B1, self.uncond_embedding.to(cond_BE.dtype), cond_BE)
        cond_BD = self.class_emb(cond_BE)
        sos_BlC = cond_BD.unsqueeze(1).expand(B, self.first_l, -1) + self.pos_start
        x_BLC = torch.cat((sos_BlC, self.word_embed(x_BLCv_wo_first_l.float())), dim=1)
        x_BLC = x_BLC + (self.lvl_embed(self.lvl_1L) + self.pos_1LC)
        attn_bias = self.attn_bias_for_masking[:, :, :L, :L]
        for block in self.blocks:
            x_BLC = block(x_BLC, cond_BD, attn_bias)
        return self.get_logits(x_BLC, cond_BD)

    def extra_repr(self) -> str:
        c = self.config
        return (f"depth={c.depth}, width={c.embed_dim}, heads={c.num_heads}x{c.head_dim}, "
                f"vocab={c.vocab_size}, scales={c.num_scales}, tokens={c.seq_len}")
