"""Transformer (AAR) training step: teacher forcing on the frozen tokenizer's tokens, cross-entropy over all
scales, and condition dropout to the unconditional embedding (what classifier-free guidance needs)."""

from __future__ import annotations

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
    """`(x_BLCv, target_BL)`: the next-scale inputs (B, L-1, Cv) and the token ids of all scales (B, L), from the
    tokenizer's inference path in fp32 (autocast off, so the ids are the ones `SAT.encode_audio` gives)."""
    with torch.autocast(audio_B1N.device.type, enabled=False):
        tokens = sat.encode_audio(audio_B1N.float())
        x_BLCv = sat.quantizer.teacher_forcing_input(tokens)
    return x_BLCv, torch.cat(tokens, dim=1)


def drop_conditions(aar: AAR, cond_BE: torch.Tensor, cond_drop: float, generator: torch.Generator) -> torch.Tensor:
    """Replace each row by `uncond_embedding` with probability `cond_drop` (draws from the CPU `generator`)."""
    drop_B1 = (torch.rand(cond_BE.shape[0], 1, generator=generator) < cond_drop).to(cond_BE.device)
    return torch.where(drop_B1, aar.uncond_embedding.to(cond_BE.dtype), cond_BE)


def aar_losses(aar: AAR, sat: SAT, audio_B1N: torch.Tensor, cond_BE: torch.Tensor, loss_cfg: AARLossConfig,
               generator: torch.Generator) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Cross-entropy of one batch and its detached parts (`loss`, `acc`, `loss_last`: the last scale's CE)."""
    x_BLCv, target_BL = teacher_forcing_batch(sat, audio_B1N)
    cond_BE = drop_conditions(aar, cond_BE, loss_cfg.cond_drop, generator)
    logits_BLV = aar(cond_BE, x_BLCv)
    ce_BL = F.cross_entropy(logits_BLV.float().transpose(1, 2), target_BL, reduction="none")
    loss = ce_BL.mean()
    last = aar.config.patch_nums[-1]
    parts = {"loss": loss.detach(), "acc": (logits_BLV.argmax(-1) == target_BL).float().mean(),
             "loss_last": ce_BL[:, -last:].mean().detach()}
    return loss, parts
