"""Teacher-forced fidelity: how a KV codec changes the next-scale distributions on fixed inputs.

Why: sampled generations diverge after the first flipped token (every later scale reads the earlier ones),
so LSD / SNR / latent cosine against the uncompressed output mix the codec's error with the chaos of
sampling. Here the codec's model is fed the *reference* tokens at every scale, so each scale's guided
distribution is compared with the reference's on the same inputs:

- top-1 agreement: fraction of positions whose most likely token is the same (1 = identical decisions);
- KL(p_ref || p_codec) in nats per token, averaged over positions (0 = identical distributions).

Both are computed on the full guided distribution `softmax((1+t) l_cond - t l_uncond)` (no top-k / top-p).
The eval runner puts them in every row as `tf_top1` and `tf_kl_nats` (`FIDELITY_METRICS`), computed for all
rows of a batch at once where the distributions are (`fidelity_rows`).
"""

from __future__ import annotations

import math

import torch

from octopus_audio.aar_patch.generation import (
    SamplingConfig,
    check_condition,
    first_scale_input,
    guided_logits,
    next_scale_input,
    run_scales,
)
from octopus_audio.aar_patch.patch import forced_sequence
from octopus_audio.cache.backend import reference_backend
from octopus_audio.eval.metrics import MetricInfo

FIDELITY_METRICS: tuple[MetricInfo, ...] = (
    MetricInfo("tf_top1", "TF top-1 agreement", True),
    MetricInfo("tf_kl_nats", "TF KL (nats/token)", False),
)


@torch.inference_mode()
def teacher_forced_probs(pipe, cond_BE: torch.Tensor, tokens: list[torch.Tensor], cfg: float = 4.0,
                         scale_loop: bool | None = None) -> list[torch.Tensor]:
    """Per scale, the guided next-token distribution [(B, pn, V)] with `tokens` forced as the inputs, in fp32
    (a model held in another dtype is a ValueError: cast it with `.float()`, never a silent change of
    precision). Each scale's input is built from the forced tokens of the scales before it, as generation
    builds it from the sampled ones.

    Two ways, equal up to float rounding (tested): `scale_loop=True` runs the model's own scale loop (caching
    mode, so a patched model attends through its compressed cache scale by scale), the reference;
    `scale_loop=False` runs one pass of the whole sequence under the block-causal mask, as the model trains,
    a patched model's attention layers attending as their compressed caches serve each scale in a generation
    (`aar_patch.patch.forced_sequence`): one pass of dispatch instead of 16, but every attention over twice
    the keys under a mask and every key encoded at once. None (default) picks by device, as measured
    (benchmarks/results/eval_speed.md): the one pass on a GPU, where the loop is launch-bound (full-size
    model, 100 conditions: 0.94-1.98 s against 1.13-2.33 s), the loop on the CPU, where the one pass is slower
    (default model, 16 conditions, octopus b=2: 8.3 s against 4.8 s).
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
    tokens = [t.to(cond_BE.device) for t in tokens]
    if scale_loop is None:
        scale_loop = cond_BE.device.type == "cpu"
    if scale_loop:
        return _scale_loop_probs(pipe, cond_BE, tokens, cfg)
    aar, quantizer = pipe.aar, pipe.sat.quantizer
    cond_2BD, lvl_pos_1LC, x_2BlC = first_scale_input(aar, cond_BE)
    inputs = [x_2BlC]
    f_hat_BCT = cond_BE.new_zeros(cond_BE.shape[0], aar.config.latent_dim, patch_nums[-1])
    begin = patch_nums[0]
    for si, pn in enumerate(patch_nums[1:]):
        f_hat_BCT, next_BlCv = quantizer.next_scale_step(si, f_hat_BCT, tokens[si])
        inputs.append(next_scale_input(aar, next_BlCv, lvl_pos_1LC, begin, pn))
        begin += pn
    x_2BLC = torch.cat(inputs, dim=1)
    with forced_sequence(pipe, patch_nums):
        for block in aar.blocks:
            x_2BLC = block(x_2BLC, cond_2BD, aar.attn_bias_for_masking)
    logits_2BLV = aar.get_logits(x_2BLC, cond_2BD)
    return [guided_logits(logits_2BlV, si, len(patch_nums), cfg).softmax(dim=-1)
            for si, logits_2BlV in enumerate(logits_2BLV.split(list(patch_nums), dim=1))]


def _scale_loop_probs(pipe, cond_BE: torch.Tensor, tokens: list[torch.Tensor],
                      cfg: float) -> list[torch.Tensor]:
    """`teacher_forced_probs(..., scale_loop=True)`: the generation loop with the forced tokens drawn, every
    cache on the PyTorch reference (`cache.backend.reference_backend`), whatever the device."""
    probs: list[torch.Tensor] = []
    patch_nums = pipe.aar.config.patch_nums

    def forced(probs_NV: torch.Tensor, si: int) -> torch.Tensor:
        probs.append(probs_NV.view(cond_BE.shape[0], patch_nums[si], -1).float())
        return tokens[si].reshape(-1)

    with reference_backend("teacher forcing's scale loop: fp32 attention through the codec library"):
        run_scales(pipe, cond_BE, SamplingConfig(cfg=cfg, top_k=0, top_p=0.0), forced)
    return probs


FIDELITY_CHUNK = 16  # rows compared at once (float64 work buffers of ~ rows * L * V * 8 bytes each)


def fidelity(p_BLV: torch.Tensor, q_BLV: torch.Tensor) -> dict[str, list[float]]:
    """Per row b: top-1 agreement and mean KL(p || q) over the L positions of p_BLV[b] against q_BLV[b]
    (distributions over V; any device, computed in float64 there)."""
    agree, kl = [], []
    for start in range(0, p_BLV.shape[0], FIDELITY_CHUNK):
        p = p_BLV[start:start + FIDELITY_CHUNK].double()
        q = q_BLV[start:start + FIDELITY_CHUNK].double()
        agree.append((p.argmax(-1) == q.argmax(-1)).double().mean(-1))
        # p log(p/q) with 0 log 0 = 0; q is a softmax of finite logits: q > 0 wherever p > 0 up to underflow
        kl_BL = torch.where(p > 0, p * (p.clamp_min(1e-300).log() - q.clamp_min(1e-300).log()),
                            torch.zeros_like(p)).sum(-1)
        kl.append(kl_BL.mean(-1))
    return {"top1_agreement": torch.cat(agree).tolist(), "kl_nats": torch.cat(kl).tolist()}


def fidelity_rows(probs_ref: list[torch.Tensor], probs_hat: list[torch.Tensor]) -> list[dict | ValueError]:
    """The two `FIDELITY_METRICS` of each eval row: row i compares the (L, V) distributions probs_ref[i]
    (the reference's, every position of every scale) with probs_hat[i] (the codec's), all rows in one
    computation on their device. A row whose numbers are not finite gets, in its place, the ValueError the
    runner records as its error; distributions of different shapes are a ValueError for the call."""
    shapes_ref, shapes_hat = [tuple(p.shape) for p in probs_ref], [tuple(p.shape) for p in probs_hat]
    if shapes_ref != shapes_hat or len(set(shapes_ref)) > 1:
        raise ValueError(f"the codec's distributions have shapes {shapes_hat}, the reference's {shapes_ref}; "
                         f"each row's must be one (L, V)")
    if not probs_ref:
        return []
    f = fidelity(torch.stack(probs_ref), torch.stack(probs_hat))
    rows: list[dict | ValueError] = []
    for top1, kl in zip(f["top1_agreement"], f["kl_nats"], strict=True):
        row = {"tf_top1": top1, "tf_kl_nats": kl}
        rows.append(row if all(math.isfinite(v) for v in row.values()) else ValueError(
            f"teacher-forced fidelity is not finite ({row}): a distribution holds NaN or inf"))
    return rows
