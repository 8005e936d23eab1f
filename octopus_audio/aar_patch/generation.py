"""Next-scale generation with the KV cache: classifier-free guidance, top-k/top-p sampling, tokens -> audio.

Semantics are the released ones: the batch is doubled (rows [:B] conditioned, rows [B:] unconditional), scale
`si` mixes logits as `(1+t) cond - t uncond` with `t = cfg * (si / (S-1))`, keeps logits >= the k-th largest,
then drops the ascending-sorted prefix whose cumulative softmax mass is <= 1 - top_p (never the largest), and
draws one token per position with one `torch.multinomial` call per scale from a generator seeded once.

Two paths share that loop:
- reference (default on CPU): fp32 everywhere, `torch.multinomial`; this is what parity is judged on.
- fast (default on CUDA): blocks under bf16 autocast (SDPA/flash), embeddings, head and sampling in fp32, and
  the multinomial draw replaced by the identical exponential-race formula it is computed with
  (`argmax(p / q)`, `q ~ Exp(1)` from the same generator), so no host sync happens inside the loop.
`GraphedGenerator` additionally captures the fast loop in one CUDA graph for a fixed batch size.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from octopus_audio.errors import UsageError

from .aar import AAR
from .patch import replay_check

# (probs [N, V] fp32, scale index) -> token ids [N]
Draw = Callable[[torch.Tensor, int], torch.Tensor]

# Seeds: `torch.Generator.manual_seed` takes any integer from -2**63 to 2**64 - 1 (a negative one wraps onto
# the same unsigned range), so the non-negative ones, 0 .. 2**64 - 1, are every seed there is.
SEED_MAX = 2**64 - 1
# Conditions: finite, every value within +-COND_ABS_MAX. The model is trained on L2-normalised CLAP
# embeddings, whose every coordinate lies in [-1, 1]; the bound leaves room for unnormalised embeddings and
# stays far below where float32 arithmetic breaks (a value beyond about 1.8e19 overflows when squared, as a
# layer norm does; 1e30 used to pass the finiteness check and fail inside the model).
COND_ABS_MAX = 100.0
# Guidance: finite, within +-CFG_ABS_MAX. The guided logits `(1+t) cond - t uncond` (t up to cfg) are float32;
# 1e308 turned into inf there and sampling failed, while 1e20 still sampled (one token took all the mass, as
# it does from a few tens up: the release uses 4). The bound keeps (1+t) * logit finite for any logit below
# 3e32.
CFG_ABS_MAX = 1e6


def seed_problem(seed, what: str = "seed") -> str | None:
    """The sentence for a seed torch's generator does not take (not an int in 0..SEED_MAX), else None."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        return (f"{what} must be an integer from 0 to 2**64 - 1 = {SEED_MAX} (what torch's generator "
                f"takes), got {seed!r}")
    return None


def cfg_problem(cfg, what: str = "cfg") -> str | None:
    """The sentence for a guidance scale that is not a finite number within +-CFG_ABS_MAX, else None."""
    if isinstance(cfg, bool) or not isinstance(cfg, numbers.Real) or not abs(float(cfg)) <= CFG_ABS_MAX:
        return (f"{what} must be a finite number within +-{CFG_ABS_MAX:g} (the release uses 4), "
                f"got {cfg!r}")
    return None


def condition_problem(cond_BE: np.ndarray | torch.Tensor, what: str = "the condition") -> str | None:
    """The sentence for condition values outside the accepted range (NaN, Inf, or |x| > COND_ABS_MAX), else
    None. Shape and dtype are `check_condition`'s job."""
    x = torch.as_tensor(cond_BE).detach()
    peak = float(x.abs().amax()) if x.numel() else 0.0
    if not math.isfinite(peak):
        return f"{what} contains NaN or infinite values; pass finite CLAP embeddings"
    if peak > COND_ABS_MAX:
        return (f"{what} holds a value of magnitude {peak:.3g}; accepted: finite values within "
                f"+-{COND_ABS_MAX:g} (an L2-normalised CLAP embedding lies within +-1)")
    return None


@dataclass(frozen=True)
class Generation:
    """One generation: per-scale tokens [(B, pn)] (int64), latent fhat (B, Cv, T), audio (B, 1, n)."""

    tokens: list[torch.Tensor]
    fhat: torch.Tensor
    audio: torch.Tensor


@dataclass(frozen=True)
class SamplingConfig:
    """Guidance and sampling settings; the defaults are the released inference defaults."""

    cfg: float = 4.0
    top_k: int = 200
    top_p: float = 0.95
    seed: int = 42

    def __post_init__(self) -> None:
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise UsageError(f"top_k must be an int >= 0 (0 keeps every token, 1 is greedy), "
                             f"got {self.top_k!r}")
        if not 0.0 <= float(self.top_p) <= 1.0:
            raise UsageError(f"top_p must be in [0, 1] (0 turns nucleus filtering off), got {self.top_p!r}")
        problem = cfg_problem(self.cfg)
        if problem:
            raise UsageError(problem)
        problem = seed_problem(self.seed)
        if problem:
            raise UsageError(problem)


class AARPipeline(nn.Module):
    """The transformer (`.aar`) and the tokenizer (`.sat`) that generation needs together."""

    def __init__(self, aar: AAR, sat: nn.Module) -> None:
        super().__init__()
        if tuple(sat.patch_nums) != tuple(aar.config.patch_nums):
            raise UsageError(f"the tokenizer's scales {tuple(sat.patch_nums)} differ from the transformer's "
                             f"{tuple(aar.config.patch_nums)}; pass a matching pair of checkpoints")
        self.aar = aar
        self.sat = sat

    @property
    def device(self) -> torch.device:
        return self.aar.pos_1LC.device

    def generate(self, cond_BE: torch.Tensor | np.ndarray, **kwargs) -> Generation:
        """Shorthand for `generate(self, cond_BE, **kwargs)`."""
        return generate(self, cond_BE, **kwargs)


# sampling -------------------------------------------------------------------------------------------------
def multinomial_draw(generator: torch.Generator) -> Draw:
    """The released draw: one `torch.multinomial` call per scale (one sample per row)."""
    return lambda probs_NV, si: torch.multinomial(probs_NV, num_samples=1, replacement=True,
                                                  generator=generator)[:, 0]


def exponential_draw(generator: torch.Generator) -> Draw:
    """The same draw without host syncs: multinomial with one sample is `argmax(p / q)`, `q ~ Exp(1)`."""
    return lambda probs_NV, si: (probs_NV / torch.empty_like(probs_NV).exponential_(1, generator=generator)
                                 ).argmax(dim=-1)


def per_row_draw(draw_of: Callable[[torch.Generator], Draw], generators: list[torch.Generator]) -> Draw:
    """Row i of the batch drawn by `draw_of(generators[i])` alone, as a batch of one would draw it: the rows'
    tokens do not depend on each other's random streams."""
    draws = [draw_of(g) for g in generators]

    def draw(probs_NV: torch.Tensor, si: int) -> torch.Tensor:
        probs_BlV = probs_NV.view(len(draws), -1, probs_NV.shape[-1])
        return torch.cat([d(probs_BlV[i], si) for i, d in enumerate(draws)])

    return draw


def draw_noise(generator: torch.Generator | list[torch.Generator], batch: int, patch_nums: tuple[int, ...],
               vocab_size: int, out: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Every scale's Exp(1) noise [(batch * pn, V)], in the order `exponential_draw` draws it in the loop;
    with a list of `batch` generators, row i's noise comes from generator i in the order a batch of one draws
    it (`per_row_draw`).

    Fills `out` in place when given (the static buffers of a CUDA graph).
    """
    generators = generator if isinstance(generator, list) else [generator]
    if out is None:
        out = [torch.empty(batch * pn, vocab_size, device=generators[0].device) for pn in patch_nums]
    for row, g in enumerate(generators):
        for noise_NV in out:
            noise_NV.view(len(generators), -1, noise_NV.shape[-1])[row].exponential_(1, generator=g)
    return out


def noise_draw(noise: list[torch.Tensor]) -> Draw:
    """The exponential-race draw from noise drawn beforehand (`draw_noise`): scale si uses `noise[si]`."""
    return lambda probs_NV, si: (probs_NV / noise[si]).argmax(dim=-1)


def sample_top_k_top_p(logits_BlV: torch.Tensor, top_k: int, top_p: float, draw: Draw,
                       si: int = 0) -> torch.Tensor:
    """Filter logits by top-k then top-p (the release's rules), draw one id per position: [B,l,V] -> [B,l]."""
    B, l, V = logits_BlV.shape
    if top_k > 0:
        kth_Bl1 = logits_BlV.topk(min(top_k, V), dim=-1, sorted=False).values.amin(-1, keepdim=True)
        logits_BlV = logits_BlV.masked_fill(logits_BlV < kth_Bl1, -math.inf)
    if top_p > 0:
        sorted_BlV, order_BlV = logits_BlV.sort(dim=-1, descending=False)
        drop_sorted_BlV = sorted_BlV.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p)
        drop_sorted_BlV[..., -1:] = False
        drop_BlV = drop_sorted_BlV.scatter(-1, order_BlV, drop_sorted_BlV)
        logits_BlV = logits_BlV.masked_fill(drop_BlV, -math.inf)
    return draw(logits_BlV.softmax(dim=-1).view(B * l, V), si).view(B, l)


# the scale loop -------------------------------------------------------------------------------------------
def run_scales(pipe: AARPipeline, cond_BE: torch.Tensor, sampling: SamplingConfig, draw: Draw,
               autocast_dtype: torch.dtype | None = None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """All scales with the KV cache on: returns the per-scale tokens [(B, pn)] and the latent fhat (B, Cv, T).

    Only the blocks run under `autocast_dtype` (None: the model's own dtype); embeddings, head, guidance,
    sampling and the tokenizer's next-scale step stay in fp32. Shapes are static, nothing reads tensor values
    on the host, so the loop can be captured in a CUDA graph.
    """
    aar, quantizer = pipe.aar, pipe.sat.quantizer
    cfg = aar.config
    autocast = (torch.autocast(cond_BE.device.type, dtype=autocast_dtype) if autocast_dtype is not None
                else contextlib.nullcontext())
    cond_2BD, lvl_pos_1LC, x_2BlC = first_scale_input(aar, cond_BE)
    f_hat_BCT = cond_BE.new_zeros(cond_BE.shape[0], cfg.latent_dim, cfg.patch_nums[-1])
    tokens: list[torch.Tensor] = []
    begin = 0
    for block in aar.blocks:
        block.attn.kv_caching(True)
    try:
        for si, pn in enumerate(cfg.patch_nums):
            begin += pn
            with autocast:
                for block in aar.blocks:
                    x_2BlC = block(x_2BlC, cond_2BD, None)
            logits_BlV = guided_logits(aar.get_logits(x_2BlC, cond_2BD), si, cfg.num_scales, sampling.cfg)
            idx_Bl = sample_top_k_top_p(logits_BlV, sampling.top_k, sampling.top_p, draw, si)
            tokens.append(idx_Bl)
            f_hat_BCT, next_BlCv = quantizer.next_scale_step(si, f_hat_BCT, idx_Bl)
            if next_BlCv is not None:
                x_2BlC = next_scale_input(aar, next_BlCv, lvl_pos_1LC, begin, cfg.patch_nums[si + 1])
    finally:
        for block in aar.blocks:
            block.attn.kv_caching(False)
    return tokens, f_hat_BCT


def first_scale_input(aar: AAR, cond_BE: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The guided batch's conditions `cond_2BD` (rows [:B] conditioned, rows [B:] unconditional), the level +
    position embedding `lvl_pos_1LC` of every token, and the first scale's input x_2BlC (start tokens)."""
    B, first_l = cond_BE.shape[0], aar.config.patch_nums[0]
    cond_2BD = aar.class_emb(torch.cat((cond_BE, aar.uncond_embedding.expand(B, -1)), dim=0))
    lvl_pos_1LC = aar.lvl_embed(aar.lvl_1L) + aar.pos_1LC
    x_2BlC = (cond_2BD.unsqueeze(1).expand(2 * B, first_l, -1) + aar.pos_start.expand(2 * B, first_l, -1)
              + lvl_pos_1LC[:, :first_l])
    return cond_2BD, lvl_pos_1LC, x_2BlC


def next_scale_input(aar: AAR, next_BlCv: torch.Tensor, lvl_pos_1LC: torch.Tensor, begin: int,
                     pn: int) -> torch.Tensor:
    """The input of the scale whose `pn` tokens start at `begin`, from the tokenizer's next-scale latent
    [B, pn, Cv]: word embedding + level/position embedding, repeated for the guided batch [2B, pn, C]."""
    x_BlC = aar.word_embed(next_BlCv.float()) + lvl_pos_1LC[:, begin:begin + pn]
    return x_BlC.repeat(2, 1, 1)


def guided_logits(logits_2BlV: torch.Tensor, si: int, num_scales: int, cfg: float) -> torch.Tensor:
    """Classifier-free guidance at scale `si`: `(1+t) cond - t uncond` with `t = cfg * si / (S-1)`, rows [:B]
    of the guided batch conditioned, rows [B:] unconditional: [2B, l, V] -> [B, l, V]."""
    B = logits_2BlV.shape[0] // 2
    t = cfg * (si / (num_scales - 1))
    return (1 + t) * logits_2BlV[:B] - t * logits_2BlV[B:]


def check_condition(pipe: AARPipeline, cond_BE: torch.Tensor | np.ndarray) -> torch.Tensor:
    """A (B, E) float condition on the model's device, or a UsageError naming the expected shape."""
    E = pipe.aar.config.cond_dim
    shape = tuple(cond_BE.shape)
    if len(shape) != 2 or shape[0] < 1 or shape[1] != E:
        raise UsageError(f"the condition must have shape (B, {E}), one {E}-d CLAP embedding per row; "
                         f"got shape {shape}")
    cond_BE = torch.as_tensor(np.asarray(cond_BE) if isinstance(cond_BE, np.ndarray) else cond_BE)
    if not cond_BE.is_floating_point():
        raise UsageError(f"the condition must be a float array of shape (B, {E}); got dtype {cond_BE.dtype}")
    problem = condition_problem(cond_BE)
    if problem:
        raise UsageError(problem)
    return cond_BE.to(pipe.device, torch.float32)


def resolve_fast(fast: bool | None, device: torch.device) -> bool:
    """`fast=None` means the fast path on CUDA and the fp32 reference path elsewhere."""
    return device.type == "cuda" if fast is None else bool(fast)


@torch.inference_mode()
def generate(pipe: AARPipeline, cond_BE: torch.Tensor | np.ndarray, cfg: float = 4.0, top_k: int = 200,
             top_p: float = 0.95, seed: int | Sequence[int] = 42, *, fast: bool | None = None) -> Generation:
    """Generate one second of audio per condition row.

    cond_BE: (B, 512) CLAP embeddings. seed: one int seeds one generator that every row draws from (the
    released behaviour); a sequence of B ints gives row i a generator of its own seeded with `seed[i]`, so its
    tokens equal a batch of one with that seed, whatever its batch-mates (up to float rounding in the batched
    matmuls). fast: None picks bf16 autocast on CUDA and fp32 elsewhere (see module docstring); False forces
    the fp32 reference path that reproduces the released code.
    Returns tokens [(B, pn)] per scale, fhat (B, Cv, T) and audio (B, 1, samples).
    """
    sampling = SamplingConfig(cfg=cfg, top_k=top_k, top_p=top_p)  # the seeds: seeded_generators checks them
    _check_top_k(pipe, sampling)
    cond_BE = check_condition(pipe, cond_BE)
    generators = seeded_generators(seed, cond_BE.shape[0], pipe.device)
    fast = resolve_fast(fast, pipe.device)
    make = exponential_draw if fast else multinomial_draw
    if isinstance(generators, torch.Generator):
        draw = make(generators)
    elif fast:  # every row's noise drawn before the loop, as the inline per-row draw takes it (tested equal):
        c = pipe.aar.config  # a scale's draw is one division and argmax for the batch, not one per row
        draw = noise_draw(draw_noise(generators, cond_BE.shape[0], c.patch_nums, c.vocab_size))
    else:
        draw = per_row_draw(make, generators)
    if fast:
        tokens, f_hat = run_scales(pipe, cond_BE, sampling, draw, torch.bfloat16)
    else:
        tokens, f_hat = run_scales(pipe, cond_BE, sampling, draw)
    return Generation(tokens=tokens, fhat=f_hat, audio=pipe.sat.decode(f_hat))


def seeded_generators(seed: int | Sequence[int], batch: int,
                      device: torch.device) -> torch.Generator | list[torch.Generator]:
    """One generator seeded with `seed` (an int), or one per row seeded with `seed[i]` (a sequence of `batch`
    ints); a UsageError for a seed torch does not take or a sequence of another length."""
    if isinstance(seed, int) and not isinstance(seed, bool):
        seeds, single = [seed], True
    else:
        seeds, single = list(seed), False
        if len(seeds) != batch:
            raise UsageError(f"per-row seeds: one per condition row, {batch} here; got {len(seeds)}")
    generators = []
    for s in seeds:
        problem = seed_problem(s)
        if problem:
            raise UsageError(problem)
        g = torch.Generator(device=device)
        g.manual_seed(s)
        generators.append(g)
    return generators[0] if single else generators


def _check_top_k(pipe: AARPipeline, sampling: SamplingConfig) -> None:
    V = pipe.aar.config.vocab_size
    if sampling.top_k > V:
        raise UsageError(f"top_k must be at most the vocabulary size {V} (0 keeps every token), "
                         f"got {sampling.top_k}")


class GraphedGenerator:
    """The fast path for one batch size and sampling setting, captured once as a CUDA graph and replayed.

    `GraphedGenerator(pipe, batch, cfg, top_k, top_p)(cond_BE, seed) -> Generation` gives the tokens of
    `generate(..., fast=True)` for the same inputs: the exponential noise of every scale is drawn before the
    replay from a generator seeded with `seed`, in the order the eager loop draws it (`seed` a sequence of
    `batch` ints: row i's noise from its own generator, as `generate` does). Capture the graph after
    any patching of the model: a graph replays the kernels it saw at capture time. A model patched with a
    compressed KV cache (`patch_aar`) is captured the same way; the patch's data checks, which cannot read
    the device inside a capture, run after each replay (`patch.replay_check`), before anything is returned.
    """

    def __init__(self, pipe: AARPipeline, batch: int, cfg: float = 4.0, top_k: int = 200,
                 top_p: float = 0.95) -> None:
        if pipe.device.type != "cuda":
            raise UsageError(f"CUDA graphs need the model on a CUDA device; it is on {pipe.device}")
        self.pipe = pipe
        self.sampling = SamplingConfig(cfg=cfg, top_k=top_k, top_p=top_p)
        _check_top_k(pipe, self.sampling)
        c = pipe.aar.config
        with torch.inference_mode():
            self.cond_BE = torch.zeros(batch, c.cond_dim, device=pipe.device)
            self.noise = [torch.ones(batch * pn, c.vocab_size, device=pipe.device) for pn in c.patch_nums]
            side = torch.cuda.Stream(pipe.device)
            side.wait_stream(torch.cuda.current_stream(pipe.device))
            with torch.cuda.stream(side):
                self._run()  # warm-up outside the capture: library handles, workspaces, autotuning
            torch.cuda.current_stream(pipe.device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.tokens, self.f_hat = self._run()
            self._check = replay_check(pipe)  # a KV-cache patch's data checks, run after each replay

    def _run(self) -> tuple[list[torch.Tensor], torch.Tensor]:
        return run_scales(self.pipe, self.cond_BE, self.sampling, noise_draw(self.noise), torch.bfloat16)

    @torch.inference_mode()
    def __call__(self, cond_BE: torch.Tensor | np.ndarray, seed: int | Sequence[int] = 42) -> Generation:
        cond_BE = check_condition(self.pipe, cond_BE)
        if cond_BE.shape != self.cond_BE.shape:
            raise UsageError(f"this graph was captured for a condition of shape {tuple(self.cond_BE.shape)}; "
                             f"got {tuple(cond_BE.shape)}")
        generators = seeded_generators(seed, cond_BE.shape[0], self.pipe.device)
        self.cond_BE.copy_(cond_BE)
        c = self.pipe.aar.config
        draw_noise(generators, cond_BE.shape[0], c.patch_nums, c.vocab_size, out=self.noise)
        self.graph.replay()
        self._check()
        f_hat = self.f_hat.clone()
        tokens = [t.clone() for t in self.tokens]
        return Generation(tokens=tokens, fhat=f_hat, audio=self.pipe.sat.decode(f_hat))
