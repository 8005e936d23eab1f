"""Transformer (AAR) training step: teacher forcing on the frozen tokenizer's tokens, cross-entropy over all
scales, and condition dropout to the unconditional embedding (what classifier-free guidance needs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from octopus_audio.aar_patch.aar import AAR
from octopus_audio.aar_patch.sat import SAT


@dataclass(frozen=True)
class AARLossConfig:
    """`cond_drop`: fraction of rows whose condition becomes `uncond_embedding`."""

    cond_drop: float = 0.1

    def __post_init__(self) -> None:
        if not 0.0 <= self.cond_drop < 1.0:
            raise ValueError(f"AARLossConfig.cond_drop must be in [0, 1), got {self.cond_drop}")


@torch.no_grad()
def teacher_forcing_batch(sat: SAT, audio_B1N: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(x_BLCv, target_BL)`: the next-scale inputs (B, L-1, Cv) and the token ids of all scales (B, L),
    from the tokenizer's inference path in fp32 (autocast off, so the ids are the ones `SAT.encode_audio`
    gives)."""
    with torch.autocast(audio_B1N.device.type, enabled=False):
        tokens = sat.encode_audio(audio_B1N.float())
        x_BLCv = sat.quantizer.teacher_forcing_input(tokens)
    return x_BLCv, torch.cat(tokens, dim=1)


def drop_conditions(aar: AAR, cond_BE: torch.Tensor, cond_drop: float,
                    generator: torch.Generator) -> torch.Tensor:
    """Replace each row by `uncond_embedding` with probability `cond_drop` (draws from the CPU
    `generator`)."""
    drop_B1 = (torch.rand(cond_BE.shape[0], 1, generator=generator) < cond_drop).to(cond_BE.device)
    return torch.where(drop_B1, aar.uncond_embedding.to(cond_BE.dtype), cond_BE)


@torch.no_grad()
def precompute_tokens(sat: SAT, crops: Callable[[int], tuple[torch.Tensor, torch.Tensor]], n: int, batch: int,
                      device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(x_NLCv, target_NL, file_N)` of `n` crops drawn by `crops(count) -> (audio_B1N, file_B)`, tokenized on
    `device` in chunks of `batch` (the tokenizer then runs once per crop instead of once per step)."""
    xs, targets, files = [], [], []
    for start in range(0, n, batch):
        audio_B1N, file_B = crops(min(batch, n - start))
        x_BLCv, target_BL = teacher_forcing_batch(sat, audio_B1N.to(device))
        xs.append(x_BLCv)
        targets.append(target_BL)
        files.append(file_B.to(device))
    return torch.cat(xs), torch.cat(targets), torch.cat(files)


@torch.no_grad()
def whiten_condition_init_(aar: AAR, cond_NE: torch.Tensor, components: int = 32, floor: float = 0.1) -> int:
    """Data-dependent init of `class_emb.fc1`: its first rows project a condition onto the main directions in
    which the training conditions differ (principal components of the conditions, made orthogonal to their
    mean), divided by the spread along each (at least `floor` times the largest), so that the file-to-file
    differences of nearly parallel embeddings (the spectral stand-in's cosines are ~0.9) reach the blocks at
    unit scale from the first step. Other rows keep their random init. Returns the rows set."""
    cond_NE = cond_NE.double().cpu()
    mean_E = cond_NE.mean(0)
    unit_E = mean_E / mean_E.norm()
    dev_NE = cond_NE - mean_E
    dev_NE = dev_NE - (dev_NE @ unit_E).unsqueeze(1) * unit_E
    _, s_K, vh_KE = torch.linalg.svd(dev_NE, full_matrices=False)
    k = int(min(components, aar.class_emb.fc1.out_features, (s_K > 1e-8 * s_K[0]).sum()))
    std_K = (s_K[:k] / max(cond_NE.shape[0] - 1, 1) ** 0.5).clamp_min(floor * s_K[0] / max(
        cond_NE.shape[0] - 1, 1) ** 0.5)
    weight = aar.class_emb.fc1.weight
    weight[:k] = (vh_KE[:k] / std_K.unsqueeze(1)).to(weight.dtype)
    return k


def aar_losses(aar: AAR, sat: SAT, audio_B1N: torch.Tensor, cond_BE: torch.Tensor, loss_cfg: AARLossConfig,
               generator: torch.Generator) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Cross-entropy of one batch of audio (tokenized here) and its detached parts (see
    `aar_token_losses`)."""
    x_BLCv, target_BL = teacher_forcing_batch(sat, audio_B1N)
    return aar_token_losses(aar, x_BLCv, target_BL, cond_BE, loss_cfg, generator)


def aar_token_losses(aar: AAR, x_BLCv: torch.Tensor, target_BL: torch.Tensor, cond_BE: torch.Tensor,
                     loss_cfg: AARLossConfig, generator: torch.Generator
                     ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Cross-entropy of one tokenized batch and its detached parts (`loss`, `acc`, `loss_last`: the last
    scale's CE), with condition dropout."""
    cond_BE = drop_conditions(aar, cond_BE, loss_cfg.cond_drop, generator)
    logits_BLV = aar(cond_BE, x_BLCv)
    ce_BL = F.cross_entropy(logits_BLV.float().transpose(1, 2), target_BL, reduction="none")
    loss = ce_BL.mean()
    last = aar.config.patch_nums[-1]
    parts = {"loss": loss.detach(), "acc": (logits_BLV.argmax(-1) == target_BL).float().mean(),
             "loss_last": ce_BL[:, -last:].mean().detach()}
    return loss, parts
