"""Training a small AAR-architecture model (tokenizer, then transformer) on packed audio: model sizes, the
optimisation loop of one stage with checkpoints and resume, the two stages, the release-format export.

`train(args, data)` runs the stages on a `train_data.PackedAudio` (the `octopus-audio train` command,
`eval/train_cli.py`, reads, embeds and packs the audio first). Training state (weights, optimizer, step) is
checkpointed under `--out` every `--ckpt-every` steps and at the end; a rerun with the same `--out` resumes.
Every step draws its randomness from a generator seeded with (seed, stage, step), so a resumed run equals an
uninterrupted one. The release-format fp16 weights (`sat.pth`, `aar.pth`) are exported to `--out` after each
stage."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from octopus_audio.errors import UsageError

log = logging.getLogger(__name__)

STAGES = ("sat", "aar", "all")
SIZES = ("default", "tiny")


# --- sizes --------------------------------------------------------------------------------------------------

def model_configs(size: str):
    """`(SATConfig, AARConfig, SATLossConfig)` of a named size: `default` is the shipped model (the release's
    16 scales and 24 kHz, 1 s windows; head dim 64), `tiny` a 64-sample, 4-scale model for tests."""
    from octopus_audio.aar_patch.aar import AARConfig
    from octopus_audio.aar_patch.sat import SATConfig
    from octopus_audio.aar_patch.train_sat import SATLossConfig

    if size == "default":
        return (SATConfig(n_filters=16, lstm_layers=1, dimension=64, latent_dim=64, codebook_size=512),
                AARConfig(depth=4, embed_dim=256, num_heads=4, vocab_size=512, latent_dim=64),
                SATLossConfig())
    if size == "tiny":
        patch_nums = (1, 2, 4, 8)
        return (SATConfig(n_filters=4, ratios=(2, 2, 2), lstm_layers=1, dimension=8, latent_dim=8,
                          codebook_size=16, patch_nums=patch_nums, num_phi=2, phi_kernel=3),
                AARConfig(depth=1, embed_dim=64, num_heads=1, vocab_size=16, latent_dim=8,
                          patch_nums=patch_nums),
                SATLossConfig(stft_sizes=(16, 32, 64)))
    raise UsageError(f"unknown model size {size!r}; choose one of {', '.join(SIZES)}")


# --- one training stage -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StageConfig:
    """Optimisation settings of one stage. `max_seconds` stops the stage early (checkpointed, resumable);
    with `fit_steps`, a fresh stage shortens `steps` after `probe_steps` timed steps so that it ends in time;
    `stop_after` ends this call after that many steps (checkpointed, resumable), e.g. to split a run."""

    steps: int
    batch: int
    lr: float
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    warmup: int = 100
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    ckpt_every: int = 500
    log_every: int = 50
    max_seconds: float | None = None
    fit_steps: bool = False
    probe_steps: int = 40
    stop_after: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(self.betas))
        if self.steps < 1 or self.batch < 1 or self.ckpt_every < 1 or self.log_every < 1:
            raise UsageError(f"steps, batch, ckpt-every and log-every must be >= 1 (got {self.steps}, "
                             f"{self.batch}, {self.ckpt_every}, {self.log_every})")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise UsageError(f"the learning rate must be a finite number > 0, got {self.lr}")
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise UsageError(f"a stage's time budget must be > 0 minutes, got {self.max_seconds / 60:g}")

    def lr_at(self, step: int, total: int) -> float:
        """Linear warmup, then cosine decay to `min_lr_ratio * lr` at `total` steps."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        frac = min(1.0, (step - self.warmup) / max(1, total - self.warmup))
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def step_generator(seed: int, stage: str, step: int) -> torch.Generator:
    """The CPU generator of one step: seeded with (seed, stage, step) only, so resuming needs no RNG state."""
    return torch.Generator().manual_seed((seed * 1_000_003 + STAGES.index(stage) * 7_919 + step) % (2**63))


def _atomic_save(obj: object, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def run_stage(name: str, model: torch.nn.Module, loss_fn: Callable[[int, torch.Generator], tuple],
              cfg: StageConfig, out_dir: Path, seed: int, meta: dict, progress: bool = True) -> dict:
    """Train `model` with AdamW on `loss_fn(step, generator) -> (loss, parts)`; resume from and checkpoint to
    `out_dir/<name>_state.pt`. Returns the state's summary (`step`, `total_steps`, `history`)."""
    from tqdm import tqdm

    state_path = out_dir / f"{name}_state.pt"
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "pos_" not in n and p.requires_grad]
    no_decay = [p for n, p in model.named_parameters() if (p.ndim < 2 or "pos_" in n) and p.requires_grad]
    device = next(model.parameters()).device
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=cfg.betas,
                            fused=device.type == "cuda")
    step, total, history = 0, cfg.steps, []
    if state_path.is_file():
        state = torch.load(state_path, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"], strict=True)
        opt.load_state_dict(state["optim"])
        step, total, history = state["step"], state["total_steps"], state["history"]
        log.info("%s: resumed at step %d of %d from %s", name, step, total, state_path)

    def save() -> None:
        _atomic_save({"step": step, "total_steps": total, "history": history, "meta": meta,
                      "model": model.state_dict(), "optim": opt.state_dict()}, state_path)

    t0 = time.monotonic()
    sums: dict[str, torch.Tensor] = {}
    count, probe_t0, fresh = 0, None, step == 0
    bar = tqdm(total=total, initial=step, desc=name, disable=not progress, dynamic_ncols=True)
    model.train()
    stop_at = total if cfg.stop_after is None else min(total, step + cfg.stop_after)
    while step < stop_at:
        if cfg.max_seconds is not None and time.monotonic() - t0 > cfg.max_seconds:
            log.warning("%s: time budget reached at step %d of %d; checkpointed, rerun to resume",
                        name, step, total)
            break
        for group in opt.param_groups:
            group["lr"] = cfg.lr_at(step, total)
        loss, parts = loss_fn(step, step_generator(seed, name if name in STAGES else "all", step))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        for k, v in {**parts, "grad_norm": grad_norm}.items():
            sums[k] = sums.get(k, 0) + v.detach().float()
        count += 1
        bar.update(1)
        if fresh and cfg.fit_steps and cfg.max_seconds is not None:
            if step == 5:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                probe_t0 = time.monotonic()
            elif step == 5 + cfg.probe_steps and probe_t0 is not None:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                per_step = (time.monotonic() - probe_t0) / cfg.probe_steps
                left = cfg.max_seconds - (time.monotonic() - t0)
                fitted = step + max(0, int(0.93 * left / per_step))
                if fitted < total:
                    log.warning("%s: %.1f ms per step; %d steps fit the time budget (asked %d)",
                                name, per_step * 1e3, fitted, total)
                    total, stop_at = fitted, min(stop_at, fitted)
                    bar.total = total
        if step % cfg.log_every == 0 or step == stop_at:
            row = {"step": step, "lr": cfg.lr_at(step - 1, total), "seconds": round(time.monotonic() - t0, 1),
                   **{k: round(float(v) / count, 5) for k, v in sums.items()}}
            if not all(math.isfinite(v) for v in row.values()):
                save()
                raise FloatingPointError(f"{name}: a loss is not finite at step {step}: {row}")
            history.append(row)
            log.info("%s %s", name, json.dumps(row))
            bar.set_postfix({k: row[k] for k in row if k not in ("step", "seconds", "lr")})
            sums, count = {}, 0
        if step % cfg.ckpt_every == 0:
            save()
    bar.close()
    save()
    (out_dir / f"{name}_history.json").write_text(json.dumps(history, indent=0))
    return {"step": step, "total_steps": total, "history": history}


# --- export -------------------------------------------------------------------------------------------------

def export_release(model: torch.nn.Module, path: Path, wrapper_key: str) -> int:
    """Write `{wrapper_key: state dict}` with floating tensors in fp16 (the released checkpoint format);
    bytes."""
    sd = {k: (v.detach().to("cpu", torch.float16) if v.is_floating_point() else v.detach().cpu())
          for k, v in model.state_dict().items()}
    _atomic_save({wrapper_key: sd}, path)
    return path.stat().st_size


# --- the stages ---------------------------------------------------------------------------------------------

def train_device(spec: str) -> torch.device:
    """The device `--device` names: auto (cuda when present), cpu or cuda (UsageError when not here)."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec not in ("cpu", "cuda") or (spec == "cuda" and not torch.cuda.is_available()):
        raise UsageError(f"--device {spec} is not available here; use auto, cpu or cuda (when a GPU is "
                         f"present)")
    return torch.device(spec)


def train_sat_stage(args: argparse.Namespace, data, device: torch.device, out: Path):
    """Stage 1: the tokenizer. Returns the SAT (also exported to out/sat.pth) and whether its stage is
    done."""
    from octopus_audio.aar_patch.sat import SAT
    from octopus_audio.aar_patch.train_data import sample_crops
    from octopus_audio.aar_patch.train_sat import codebooks_inited, sat_losses

    sat_cfg, _, loss_cfg = model_configs(args.size)
    torch.manual_seed(args.seed)
    sat = SAT(sat_cfg).to(device)
    cfg = StageConfig(steps=args.sat_steps, batch=args.sat_batch, lr=args.sat_lr, ckpt_every=args.ckpt_every,
                      log_every=args.log_every, betas=(0.8, 0.99),
                      max_seconds=None if args.sat_minutes is None else args.sat_minutes * 60,
                      fit_steps=args.sat_minutes is not None, stop_after=args.stop_after)
    state = {"init": not (out / "sat_state.pt").is_file()}

    def loss_fn(step: int, gen: torch.Generator):
        audio_B1N, _ = sample_crops(data, cfg.batch, gen, sat_cfg.audio_length)
        init = state["init"] and step == 0
        loss, parts = sat_losses(sat, audio_B1N.to(device), loss_cfg, gen, update=True, init=init)
        return loss, parts

    meta = {"sat_config": dataclasses.asdict(sat_cfg), "loss": dataclasses.asdict(loss_cfg),
            "stage": dataclasses.asdict(cfg), "seed": args.seed, "files": list(data.names)}
    summary = run_stage("sat", sat, loss_fn, cfg, out, args.seed, meta, progress=not args.no_progress)
    if not codebooks_inited(sat):
        raise RuntimeError("the tokenizer's codebooks were never initialised (no training step ran)")
    size = export_release(sat, out / "sat.pth", "generator_state_dict")
    log.warning("sat: step %d/%d, exported %s (%.2f MB)", summary["step"], summary["total_steps"],
                out / "sat.pth", size / 1e6)
    return sat.eval(), summary["step"] >= summary["total_steps"]


def load_trained_sat(args: argparse.Namespace, device: torch.device, out: Path):
    """The tokenizer for `--stage aar`: the `--sat` checkpoint when given, else the training state of an
    earlier `--stage sat` run in `out` (fp32)."""
    from octopus_audio.aar_patch.loading import load_sat
    from octopus_audio.aar_patch.sat import SAT

    if args.sat:
        return load_sat(args.sat).to(device).eval()
    path = out / "sat_state.pt"
    if not path.is_file():
        raise UsageError(f"--stage aar needs a trained tokenizer: {path} is missing (run --stage sat first)")
    sat = SAT(model_configs(args.size)[0])
    sat.load_state_dict(torch.load(path, map_location="cpu", weights_only=True)["model"], strict=True)
    return sat.to(device).eval()


def train_aar_stage(args: argparse.Namespace, data, sat, device: torch.device, out: Path):
    """Stage 2: the transformer on the frozen tokenizer's tokens. Returns the AAR (exported to
    out/aar.pth)."""
    from octopus_audio.aar_patch.aar import AAR
    from octopus_audio.aar_patch.train_aar import (
        AARLossConfig,
        aar_losses,
        aar_token_losses,
        precompute_tokens,
        whiten_condition_init_,
    )
    from octopus_audio.aar_patch.train_data import sample_crops

    aar_cfg = model_configs(args.size)[1]
    if data.cond.shape[1] != aar_cfg.cond_dim:
        raise UsageError(f"the packed condition vectors have {data.cond.shape[1]} dims but the transformer "
                         f"takes {aar_cfg.cond_dim}; repack with a {aar_cfg.cond_dim}-d conditioner")
    aar = AAR(aar_cfg)
    aar.init_weights(seed=args.seed)
    cond_NE = torch.from_numpy(data.cond).float()
    if args.whiten_cond:
        rows = whiten_condition_init_(aar, cond_NE)
        log.info("aar: class_emb.fc1 rows 0..%d set to the whitened principal directions of the conditions",
                 rows - 1)
    aar.to(device)
    cond_NE = cond_NE.to(device)
    for p in sat.parameters():
        p.requires_grad_(False)
    loss_cfg = AARLossConfig()
    cfg = StageConfig(steps=args.aar_steps, batch=args.aar_batch, lr=args.aar_lr, weight_decay=0.05,
                      ckpt_every=args.ckpt_every, log_every=args.log_every, grad_clip=2.0,
                      max_seconds=None if args.aar_minutes is None else args.aar_minutes * 60,
                      fit_steps=args.aar_minutes is not None, stop_after=args.stop_after)
    amp = device.type == "cuda"
    # the tokenizer's ids as its fp32 inference gives them (the transformer itself runs under bf16 autocast)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.aar_precompute:
        crop_gen = step_generator(args.seed, "all", 0)
        x_NLCv, target_NL, file_N = precompute_tokens(
            sat, lambda count: sample_crops(data, count, crop_gen, sat.config.audio_length),
            args.aar_precompute, 1024, device)
        log.info("aar: tokenized %d crops once, up front", args.aar_precompute)

    def loss_fn(step: int, gen: torch.Generator):
        if args.aar_precompute:
            pick_B = torch.randint(args.aar_precompute, (cfg.batch,), generator=gen).to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                return aar_token_losses(aar, x_NLCv[pick_B], target_NL[pick_B], cond_NE[file_N[pick_B]],
                                        loss_cfg, gen)
        audio_B1N, file_B = sample_crops(data, cfg.batch, gen, sat.config.audio_length)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            return aar_losses(aar, sat, audio_B1N.to(device), cond_NE[file_B.to(device)], loss_cfg, gen)

    meta = {"aar_config": dataclasses.asdict(aar_cfg), "loss": dataclasses.asdict(loss_cfg),
            "stage": dataclasses.asdict(cfg), "seed": args.seed, "files": list(data.names)}
    summary = run_stage("aar", aar, loss_fn, cfg, out, args.seed, meta, progress=not args.no_progress)
    size = export_release(aar, out / "aar.pth", "model_state_dict")
    log.warning("aar: step %d/%d, exported %s (%.2f MB)", summary["step"], summary["total_steps"],
                out / "aar.pth", size / 1e6)
    return aar.eval()


def train(args: argparse.Namespace, data) -> None:
    """Train the stages `args.stage` asks for (the `train` command's flags) on `data`, a
    `train_data.PackedAudio`, into `args.out`; a stage checkpointed there before resumes."""
    device = train_device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    sat, sat_done = train_sat_stage(args, data, device, out) if args.stage in ("sat", "all") else (None, True)
    if args.stage in ("aar", "all") and not sat_done:
        log.warning("the tokenizer stage is not finished; rerun with the same --out to resume it before the "
                    "transformer stage starts")
    elif args.stage in ("aar", "all"):
        sat = sat if sat is not None else load_trained_sat(args, device, out)
        train_aar_stage(args, data, sat, device, out)
    (out / "train_args.json").write_text(json.dumps({k: v for k, v in vars(args).items()
                                                     if not k.startswith("_")}, indent=1, default=str))
