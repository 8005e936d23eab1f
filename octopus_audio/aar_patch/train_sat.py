"""Tokenizer (SAT) training step: L1 + multi-resolution STFT reconstruction, commitment loss and EMA
codebooks with dead-code restarts, through the same multi-scale residual quantization that
`SAT.quantize_audio` runs at inference (so the tokens the transformer is trained on are the ones the
shipped tokenizer gives)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from octopus_audio.aar_patch.multiscale_vq import Codebook, MultiScaleQuantizer
from octopus_audio.aar_patch.sat import SAT


@dataclass(frozen=True)
class SATLossConfig:
    """Weights and settings of the tokenizer losses and of the EMA codebook update."""

    l1_weight: float = 1.0
    stft_weight: float = 1.0
    stft_sizes: tuple[int, ...] = (2048, 1024, 512, 256, 128)
    vq_weight: float = 1.0
    commit_beta: float = 0.25  # ||sg(f_hat) - z||^2 (pulls the encoder) beside ||f_hat - sg(z)||^2 (phi)
    ema_decay: float = 0.99
    dead_fraction: float = 0.01  # a code used less than this fraction of the mean usage is restarted

    def __post_init__(self) -> None:
        object.__setattr__(self, "stft_sizes", tuple(self.stft_sizes))
        if not 0.0 < self.ema_decay < 1.0:
            raise ValueError(f"SATLossConfig.ema_decay must be in (0, 1), got {self.ema_decay}")
        if not self.stft_sizes or any(n < 8 or n & (n - 1) for n in self.stft_sizes):
            raise ValueError(f"SATLossConfig.stft_sizes must be powers of two >= 8, got {self.stft_sizes}")
        for name in ("l1_weight", "stft_weight", "vq_weight", "commit_beta", "dead_fraction"):
            if getattr(self, name) < 0:
                raise ValueError(f"SATLossConfig.{name} must be >= 0, got {getattr(self, name)}")


def _stft_magnitude(x_BN: torch.Tensor, n: int) -> torch.Tensor:
    """|STFT| (Hann window n, hop n/4, centred), floored at 1e-5, in fp32."""
    window = torch.hann_window(n, device=x_BN.device)
    spec = torch.stft(x_BN.float(), n, hop_length=n // 4, window=window, return_complex=True)
    return spec.abs().clamp_min(1e-5)


def multires_stft_loss(x_hat_BN: torch.Tensor, x_BN: torch.Tensor, sizes: tuple[int, ...]) -> torch.Tensor:
    """Mean over FFT sizes of spectral convergence plus L1 of log magnitudes (Hann, hop n/4), in fp32."""
    total = x_BN.new_zeros((), dtype=torch.float32)
    for n in sizes:
        m_hat, m = _stft_magnitude(x_hat_BN, n), _stft_magnitude(x_BN, n)
        convergence = torch.linalg.norm(m - m_hat) / torch.linalg.norm(m).clamp_min(1e-7)
        total = total + convergence + (m.log() - m_hat.log()).abs().mean()
    return total / len(sizes)


@torch.no_grad()
def _init_codebook_(codebook: Codebook, target_NC: torch.Tensor, generator: torch.Generator) -> None:
    """First use: codewords drawn from this batch's targets (with replacement), unit EMA counts."""
    pick_K = torch.randint(target_NC.shape[0], (codebook.embed.shape[0],), generator=generator)
    codebook.embed.copy_(target_NC[pick_K.to(target_NC.device)])
    codebook.embed_avg.copy_(codebook.embed)
    codebook.cluster_size.fill_(1.0)
    codebook.inited.fill_(1.0)


@torch.no_grad()
def ema_update_(codebook: Codebook, target_NC: torch.Tensor, idx_N: torch.Tensor, decay: float,
                dead_fraction: float, picks_K: torch.Tensor) -> torch.Tensor:
    """EMA update of one codebook from its assigned targets; dead codes restart from targets of the batch.

    cluster_size <- decay * cluster_size + (1-decay) * counts; embed_avg likewise with the sums of the
    targets; embed = embed_avg / Laplace-smoothed cluster_size. A code whose cluster_size falls below
    `dead_fraction` times the mean usage per step (N/K) gets the target `picks_K[code] % N` (random
    non-negative ints drawn by the caller), with the mean usage as its count. No host sync; returns the
    number of restarts as a 0-d tensor."""
    K = codebook.embed.shape[0]
    target_NC = target_NC.float()
    counts_K = torch.bincount(idx_N, minlength=K).to(target_NC.dtype)
    sums_KC = torch.zeros_like(codebook.embed_avg).index_add_(0, idx_N, target_NC)
    codebook.cluster_size.mul_(decay).add_(counts_K, alpha=1 - decay)
    codebook.embed_avg.mul_(decay).add_(sums_KC, alpha=1 - decay)
    n = codebook.cluster_size.sum()
    smoothed_K = (codebook.cluster_size + 1e-5) / (n + K * 1e-5) * n
    codebook.embed.copy_(codebook.embed_avg / smoothed_K.unsqueeze(1))
    mean_usage = target_NC.shape[0] / K
    dead_K1 = (codebook.cluster_size < dead_fraction * mean_usage).unsqueeze(1)
    fresh_KC = target_NC[picks_K % target_NC.shape[0]]
    codebook.embed.copy_(torch.where(dead_K1, fresh_KC, codebook.embed))
    codebook.embed_avg.copy_(torch.where(dead_K1, fresh_KC * mean_usage, codebook.embed_avg))
    codebook.cluster_size.copy_(torch.where(dead_K1.squeeze(1), mean_usage, codebook.cluster_size))
    return dead_K1.sum()


def _contribution(quantizer: MultiScaleQuantizer, si: int, idx_Bl: torch.Tensor) -> torch.Tensor:
    """Scale si's tokens -> their addition to f_hat (B, C, T): lookup, linear upsampling (not the last scale),
    phi. The same operations as `MultiScaleQuantizer.next_scale_step`, with gradients into phi."""
    h_BCl = quantizer.embed_tokens(si, idx_Bl)
    if si != len(quantizer.patch_nums) - 1:
        h_BCl = F.interpolate(h_BCl, size=quantizer.num_frames, mode="linear")
    return quantizer.vq.quant_resi.qresi_ls[quantizer.phi_index[si]](h_BCl)


def quantize_for_training(quantizer: MultiScaleQuantizer, z_BCT: torch.Tensor, loss_cfg: SATLossConfig,
                          generator: torch.Generator, update: bool = True, init: bool = False
                          ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """Multi-scale residual quantization with gradients: `(f_hat_st, vq_loss, tokens, restarts)`.

    The tokens are chosen exactly as `MultiScaleQuantizer.quantize` chooses them (same residual, same
    nearest search); `f_hat_st` is the straight-through latent (values of f_hat, gradient to z); `vq_loss =
    mean over scales of beta*||sg(f_hat_s) - z||^2 + ||f_hat_s - sg(z)||^2` with f_hat_s the running sum
    after scale s (VAR's form). With `update`, once the pass is done, each codebook gets its EMA update
    from the downsampled residuals assigned to it; with `init` each codebook is first filled with random
    residuals of this batch (the first step of a fresh training run)."""
    batch, channels, _ = z_BCT.shape
    z_BCT = z_BCT.float()
    z_ng_BCT = z_BCT.detach()
    rest_BCT = z_ng_BCT
    f_hat_BCT = torch.zeros_like(z_ng_BCT)
    vq_loss = z_BCT.new_zeros(())
    tokens, assigned = [], []
    last = len(quantizer.patch_nums) - 1
    for si, pn in enumerate(quantizer.patch_nums):
        target_BCl = rest_BCT if si == last else F.interpolate(rest_BCT, size=pn, mode="area")
        target_NC = target_BCl.transpose(1, 2).reshape(-1, channels)
        codebook = quantizer.vq.layers[si]._codebook
        if init:
            _init_codebook_(codebook, target_NC, generator)
        idx_N = codebook.nearest(target_NC)
        idx_Bl = idx_N.view(batch, pn)
        h_BCT = _contribution(quantizer, si, idx_Bl)
        f_hat_BCT = f_hat_BCT + h_BCT
        rest_BCT = rest_BCT - h_BCT.detach()
        vq_loss = vq_loss + loss_cfg.commit_beta * F.mse_loss(f_hat_BCT.detach(), z_BCT) \
            + F.mse_loss(f_hat_BCT, z_ng_BCT)
        tokens.append(idx_Bl)
        assigned.append((target_NC, idx_N))
    restarts = z_BCT.new_zeros((), dtype=torch.long)
    if update:  # after the pass, so the pass itself is exactly the inference quantization
        K = quantizer.vq.layers[0]._codebook.embed.shape[0]
        picks_SK = torch.randint(2**31 - 1, (len(assigned), K), generator=generator)
        picks_SK = picks_SK.to(z_BCT.device, non_blocking=True)
        for si, (target_NC, idx_N) in enumerate(assigned):
            restarts = restarts + ema_update_(quantizer.vq.layers[si]._codebook, target_NC, idx_N,
                                              loss_cfg.ema_decay, loss_cfg.dead_fraction, picks_SK[si])
    f_hat_st_BCT = (f_hat_BCT.detach() - z_ng_BCT) + z_BCT
    return f_hat_st_BCT, vq_loss / len(quantizer.patch_nums), tokens, restarts


def codebooks_inited(sat: SAT) -> bool:
    """Whether every codebook has been initialised (the `inited` buffers; one host sync)."""
    return bool(torch.stack([layer._codebook.inited for layer in sat.quantizer.vq.layers]).all())


def sat_losses(sat: SAT, audio_B1N: torch.Tensor, loss_cfg: SATLossConfig, generator: torch.Generator,
               update: bool = True, init: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Total loss of one batch and its detached parts (`l1`, `stft`, `vq`, `restarts`), no host sync."""
    z_BCT = sat.encode_latent(audio_B1N)
    f_hat_BCT, vq_loss, _, restarts = quantize_for_training(sat.quantizer, z_BCT, loss_cfg, generator, update,
                                                            init)
    audio_hat_B1N = sat.decode(f_hat_BCT)
    x_BN, x_hat_BN = audio_B1N.squeeze(1).float(), audio_hat_B1N.squeeze(1)
    l1 = (x_hat_BN - x_BN).abs().mean()
    stft = multires_stft_loss(x_hat_BN, x_BN, loss_cfg.stft_sizes)
    total = loss_cfg.l1_weight * l1 + loss_cfg.stft_weight * stft + loss_cfg.vq_weight * vq_loss
    parts = {"loss": total.detach(), "l1": l1.detach(), "stft": stft.detach(), "vq": vq_loss.detach(),
             "restarts": restarts.float()}
    return total, parts
