"""Teacher-forced fidelity: how a KV codec changes the next-scale distributions on fixed inputs.

Why: sampled generations diverge after the first flipped token (every later scale reads the earlier ones),
so LSD / SNR / latent cosine against the uncompressed output mix the codec's error with the chaos of
sampling. Here the codec's model is fed the *reference* tokens at every scale, so each scale's guided
distribution is compared with the reference's on the same inputs:

- top-1 agreement: fraction of positions whose most likely token is the same (1 = identical decisions);
- KL(p_ref || p_codec) in nats per token, averaged over positions (0 = identical distributions).

Both are computed on the full guided distribution `softmax((1+t) l_cond - t l_uncond)` (no top-k / top-p).
The eval runner puts them in every row as `tf_top1` and `tf_kl_nats` (`FIDELITY_METRICS`).
"""

from __future__ import annotations

import math

import torch

from octopus_audio.aar_patch.generation import SamplingConfig, check_condition, run_scales
from octopus_audio.eval.metrics import MetricInfo

FIDELITY_METRICS: tuple[MetricInfo, ...] = (
    MetricInfo("tf_top1", "TF top-1 agreement", True),
    MetricInfo("tf_kl_nats", "TF KL (nats/token)", False),
)


@torch.inference_mode()
def teacher_forced_probs(pipe, cond_BE: torch.Tensor, tokens: list[torch.Tensor],
                         cfg: float = 4.0) -> list[torch.Tensor]:
    """Per scale, the guided next-token distribution [(B, pn, V)] with `tokens` forced as the inputs.

    Runs the model's own scale loop (so a patched model attends through its compressed cache) in fp32: a model
    held in another dtype is a ValueError (cast it with `.float()`), never a silent change of precision.
    """
    dtypes = {p.dtype for p in pipe.aar.parameters() if p.is_floating_point()}
    if dtypes != {torch.float32}:
        raise ValueError(f"teacher-forced fidelity runs the model in float32; its parameters are "
                         f"{sorted(str(d) for d in dtypes)} (call .float() on the pipeline first)")
    cond_BE = check_condition(pipe, cond_BE)
    patch_nums = pipe.aar.config.patch_nums
    if len(tokens) != len(patch_nums) or any(t.shape != (cond_BE.shape[0], pn)
                                              for t, pn in zip(tokens, patch_nums, strict=False)):
        raise ValueError(f"tokens must be {len(patch_nums)} tensors of shape (B, pn) for pn in {patch_nums}")
    probs: list[torch.Tensor] = []

    def forced(probs_NV: torch.Tensor, si: int) -> torch.Tensor:
        probs.append(probs_NV.view(cond_BE.shape[0], patch_nums[si], -1).float())
        return tokens[si].to(probs_NV.device).reshape(-1)

    run_scales(pipe, cond_BE, SamplingConfig(cfg=cfg, top_k=0, top_p=0.0), forced)
    return probs


def fidelity(probs_ref: list[torch.Tensor], probs_hat: list[torch.Tensor]) -> dict[str, list[float]]:
    """Per row: top-1 agreement and mean KL(p_ref || p_hat) over all positions of all scales."""
    p_BLV = torch.cat(probs_ref, dim=1).double()
    q_BLV = torch.cat(probs_hat, dim=1).double()
    agree_B = (p_BLV.argmax(-1) == q_BLV.argmax(-1)).double().mean(-1)
    # p log(p/q) with 0 log 0 = 0; q is a softmax of finite logits, so q > 0 wherever p > 0 up to underflow
    kl_BL = torch.where(p_BLV > 0, p_BLV * (p_BLV.clamp_min(1e-300).log() - q_BLV.clamp_min(1e-300).log()),
                        torch.zeros_like(p_BLV)).sum(-1)
    return {"top1_agreement": agree_B.tolist(), "kl_nats": kl_BL.mean(-1).tolist()}


def fidelity_row(probs_ref: list[torch.Tensor], probs_hat: list[torch.Tensor]) -> dict[str, float]:
    """The two `FIDELITY_METRICS` of one generation (B = 1), for an eval row."""
    shapes_ref, shapes_hat = [tuple(p.shape) for p in probs_ref], [tuple(p.shape) for p in probs_hat]
    if shapes_ref != shapes_hat:
        raise ValueError(f"the codec's distributions have shapes {shapes_hat}, the reference's {shapes_ref}")
    if shapes_ref[0][0] != 1:
        raise ValueError(f"an eval row holds one generation; got a batch of {shapes_ref[0][0]}")
    f = fidelity(probs_ref, probs_hat)
    row = {"tf_top1": f["top1_agreement"][0], "tf_kl_nats": f["kl_nats"][0]}
    if not all(math.isfinite(v) for v in row.values()):
        raise ValueError(f"teacher-forced fidelity is not finite ({row}): a distribution holds NaN or inf")
    return row
