"""Multi-scale residual VQ of the AAR tokenizer: per-scale codebooks, phi convs, area/linear resampling."""

from __future__ import annotations

from fractions import Fraction

import torch
import torch.nn.functional as F
from torch import nn


def phi_indices(num_scales: int, num_phi: int) -> tuple[int, ...]:
    """Phi conv used by each scale: argmin_j |tick_j - si/(num_scales-1)|, ties to the lower j.

    ticks = linspace(m, 1-m, num_phi) with margin m = 1/(2*num_phi) (1/(3*num_phi) when num_phi == 4, as in
    the VAR lineage). Exact rational arithmetic, so midpoints tie deterministically; for 16 scales and 6 convs
    this is (0,0,0,1,1,1,2,2,3,3,3,4,4,5,5,5).
    """
    if num_phi == 1:
        return (0,) * num_scales
    margin = Fraction(1, 3 * num_phi) if num_phi == 4 else Fraction(1, 2 * num_phi)
    ticks = [margin + (1 - 2 * margin) * Fraction(j, num_phi - 1) for j in range(num_phi)]
    out = []
    for si in range(num_scales):
        at = Fraction(si, max(num_scales - 1, 1))
        out.append(min(range(num_phi), key=lambda j: (abs(ticks[j] - at), j)))
    return tuple(out)


class Codebook(nn.Module):
    """One scale's codebook: buffers `inited`, `cluster_size`, `embed` (K, C), `embed_avg` (K, C)."""

    def __init__(self, codebook_size: int, dim: int) -> None:
        super().__init__()
        embed_KC = torch.empty(codebook_size, dim)
        nn.init.kaiming_uniform_(embed_KC)
        self.register_buffer("inited", torch.zeros(1))
        self.register_buffer("cluster_size", torch.zeros(codebook_size))
        self.register_buffer("embed", embed_KC)
        self.register_buffer("embed_avg", embed_KC.clone())

    def nearest(self, z_NC: torch.Tensor) -> torch.Tensor:
        """Index (N,) int64 of the nearest codeword in Euclidean distance, computed in fp32."""
        with torch.autocast(z_NC.device.type, enabled=False):
            e_KC = self.embed.float()
            dist_NK = torch.addmm(e_KC.square().sum(1), z_NC.float(), e_KC.t(), alpha=-2.0)
        return dist_NK.argmin(dim=1)


class ScaleQuantizer(nn.Module):
    """Nesting level of the released keys (`layers.N._codebook.embed`)."""

    def __init__(self, codebook_size: int, dim: int) -> None:
        super().__init__()
        self._codebook = Codebook(codebook_size, dim)


class Phi(nn.Conv1d):
    """h -> (1 - ratio) * h + ratio * conv1d(h), kernel k with 'same' zero padding."""

    def __init__(self, dim: int, kernel_size: int, ratio: float) -> None:
        super().__init__(dim, dim, kernel_size, padding=kernel_size // 2)
        self.ratio = ratio

    def forward(self, h_BCT: torch.Tensor) -> torch.Tensor:
        return h_BCT * (1.0 - self.ratio) + super().forward(h_BCT) * self.ratio


class PhiSet(nn.Module):
    """The shared phi convs (`qresi_ls.{j}`)."""

    def __init__(self, dim: int, num_phi: int, kernel_size: int, ratio: float) -> None:
        super().__init__()
        self.qresi_ls = nn.ModuleList(Phi(dim, kernel_size, ratio) for _ in range(num_phi))


class ResidualVQ(nn.Module):
    """Container fixing the released key names: optional projections, phi convs, per-scale codebooks."""

    def __init__(self, dimension: int, latent_dim: int, codebook_size: int, num_scales: int, num_phi: int,
                 phi_kernel: int, phi_ratio: float) -> None:
        super().__init__()
        if dimension != latent_dim:
            self.project_in = nn.Linear(dimension, latent_dim)
            self.project_out = nn.Linear(latent_dim, dimension)
        else:
            self.project_in = nn.Identity()
            self.project_out = nn.Identity()
        self.quant_resi = PhiSet(latent_dim, num_phi, phi_kernel, phi_ratio)
        self.layers = nn.ModuleList(ScaleQuantizer(codebook_size, latent_dim) for _ in range(num_scales))


class MultiScaleQuantizer(nn.Module):
    """Next-scale residual quantization of a latent (B, C, T) with T = patch_nums[-1].

    Scale si has patch_nums[si] tokens. Its codewords h (B, C, pn) are linearly upsampled to T (not at the
    last scale), passed through phi[phi_index[si]] and added to f_hat. The transformer's input for scale si+1
    is f_hat area-downsampled to patch_nums[si+1]. f_hat lives in the codebook space (C = latent_dim);
    `to_latent` / `from_latent` map between it and the SEANet space (identity when the two widths agree).
    """

    def __init__(self, dimension: int, latent_dim: int, codebook_size: int, patch_nums: tuple[int, ...],
                 num_phi: int, phi_kernel: int, phi_ratio: float) -> None:
        super().__init__()
        self.patch_nums = tuple(patch_nums)
        self.latent_dim = latent_dim
        self.phi_index = phi_indices(len(self.patch_nums), num_phi)
        self.vq = ResidualVQ(dimension, latent_dim, codebook_size, len(self.patch_nums), num_phi, phi_kernel,
                             phi_ratio)

    @property
    def num_frames(self) -> int:
        return self.patch_nums[-1]

    def extra_repr(self) -> str:
        return f"patch_nums={self.patch_nums}, phi_index={self.phi_index}"

    def to_latent(self, z_BDT: torch.Tensor) -> torch.Tensor:
        """SEANet output (B, dimension, T) -> quantizer space (B, latent_dim, T) via project_in."""
        return self.vq.project_in(z_BDT.transpose(1, 2)).transpose(1, 2)

    def from_latent(self, f_hat_BCT: torch.Tensor) -> torch.Tensor:
        """Quantizer space (B, latent_dim, T) -> decoder input (B, dimension, T) via project_out."""
        return self.vq.project_out(f_hat_BCT.transpose(1, 2)).transpose(1, 2)

    def embed_tokens(self, si: int, idx_Bl: torch.Tensor) -> torch.Tensor:
        """Codebook lookup of scale si: ids (B, pn) -> codewords (B, C, pn)."""
        return F.embedding(idx_Bl, self.vq.layers[si]._codebook.embed).transpose(1, 2)

    def _scale_contribution(self, si: int, h_BCl: torch.Tensor) -> torch.Tensor:
        if si != len(self.patch_nums) - 1:
            h_BCl = F.interpolate(h_BCl, size=self.num_frames, mode="linear")
        return self.vq.quant_resi.qresi_ls[self.phi_index[si]](h_BCl)

    def next_scale_step(self, si: int, f_hat_BCT: torch.Tensor,
                        idx_Bl: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Add scale si's tokens to f_hat; return (new f_hat (B, C, T), next scale's input (B, pn_next, C), or
        None after the last scale). Out of place, no host syncs."""
        f_hat_BCT = f_hat_BCT + self._scale_contribution(si, self.embed_tokens(si, idx_Bl))
        if si == len(self.patch_nums) - 1:
            return f_hat_BCT, None
        next_BCl = F.interpolate(f_hat_BCT, size=self.patch_nums[si + 1], mode="area")
        return f_hat_BCT, next_BCl.transpose(1, 2)

    def _check_tokens(self, tokens: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> int:
        if len(tokens) != len(self.patch_nums):
            raise ValueError(f"expected {len(self.patch_nums)} token tensors (one per scale), "
                             f"got {len(tokens)}")
        batch = tokens[0].shape[0]
        for si, (idx_Bl, pn) in enumerate(zip(tokens, self.patch_nums, strict=True)):
            if tuple(idx_Bl.shape) != (batch, pn):
                raise ValueError(f"tokens of scale {si} must have shape ({batch}, {pn}), "
                                 f"got {tuple(idx_Bl.shape)}")
        return batch

    def tokens_to_fhat(self, tokens: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> torch.Tensor:
        """16 id tensors (B, pn) -> f_hat (B, C, T), accumulated scale by scale."""
        batch = self._check_tokens(tokens)
        embed = self.vq.layers[0]._codebook.embed
        f_hat_BCT = embed.new_zeros(batch, self.latent_dim, self.num_frames)
        for si, idx_Bl in enumerate(tokens):
            f_hat_BCT, _ = self.next_scale_step(si, f_hat_BCT, idx_Bl)
        return f_hat_BCT

    def teacher_forcing_input(self, tokens: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The transformer's inputs for scales 1.. built from the tokens: (B, sum(patch_nums[1:]), C)."""
        batch = self._check_tokens(tokens)
        embed = self.vq.layers[0]._codebook.embed
        f_hat_BCT = embed.new_zeros(batch, self.latent_dim, self.num_frames)
        next_inputs = []
        for si, idx_Bl in enumerate(tokens[:-1]):
            f_hat_BCT, next_BlC = self.next_scale_step(si, f_hat_BCT, idx_Bl)
            next_inputs.append(next_BlC)
        return torch.cat(next_inputs, dim=1)

    def quantize(self, z_BCT: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Residual-quantize a latent (B, C, T) in the quantizer space: (16 id tensors (B, pn) int64, f_hat).

        Scale si: area-downsample the residual to pn (the last scale uses it as is), nearest codeword per
        position, then subtract the scale's contribution from the residual and add it to f_hat.
        """
        batch, channels, length = z_BCT.shape
        if channels != self.latent_dim or length != self.num_frames:
            raise ValueError(f"latent must have shape (B, {self.latent_dim}, {self.num_frames}), "
                             f"got {tuple(z_BCT.shape)}")
        rest_BCT = z_BCT
        f_hat_BCT = torch.zeros_like(z_BCT)
        tokens = []
        for si, pn in enumerate(self.patch_nums):
            if si != len(self.patch_nums) - 1:
                target_BCl = F.interpolate(rest_BCT, size=pn, mode="area")
            else:
                target_BCl = rest_BCT
            idx_N = self.vq.layers[si]._codebook.nearest(target_BCl.transpose(1, 2).reshape(-1, channels))
            idx_Bl = idx_N.view(batch, pn)
            contribution_BCT = self._scale_contribution(si, self.embed_tokens(si, idx_Bl))
            f_hat_BCT = f_hat_BCT + contribution_BCT
            rest_BCT = rest_BCT - contribution_BCT
            tokens.append(idx_Bl)
        return tokens, f_hat_BCT
