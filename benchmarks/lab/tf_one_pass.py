"""Teacher forcing in one block-causal pass (the default) against the model's scale loop (the reference): the
time of a pass and how far the row numbers lie apart, uncompressed and under each codec.

    python benchmarks/lab/tf_one_pass.py --size full --device cuda --batch 100 --codecs all --bits 2

The model is bench_aar.py's random-weight AAR (`--size full`: d16, width 1024) or the embedded default
(`--size default`). Conditions are random unit vectors; the forced tokens are a generation of the model
(bf16 fast path on CUDA). For each setting it prints the seconds of one pass each way (synchronised, after a
warm-up pass), and over the batch the largest |top-1 difference| and relative KL difference of the rows,
each against the reference distributions of the same way."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_aar import build_pipeline  # noqa: E402  (the benchmarks folder is not a package)

from octopus_audio import CODECS  # noqa: E402
from octopus_audio.aar_patch import compressed_kv, generate, load_aar  # noqa: E402
from octopus_audio.cache.backend import reference_backend  # noqa: E402
from octopus_audio.eval.fidelity import fidelity, teacher_forced_probs  # noqa: E402


def timed(fn, device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", choices=("full", "small", "default"), default="default")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--codecs", default="all")
    p.add_argument("--bits", type=int, default=2)
    args = p.parse_args()
    device = torch.device(args.device)
    pipe = (load_aar() if args.size == "default" else build_pipeline(args.size, torch.device("cpu")))
    pipe = pipe.to(device).float().eval()
    g = torch.Generator().manual_seed(0)
    cond = torch.randn(args.batch, pipe.aar.config.cond_dim, generator=g)
    cond = torch.nn.functional.normalize(cond, dim=-1).to(device)
    tokens = generate(pipe, cond, seed=list(range(args.batch))).tokens
    codecs = [c for c in CODECS] if args.codecs == "all" else args.codecs.split(",")
    ref = {}
    with torch.inference_mode(), reference_backend("lab: teacher forcing as the eval runs it"):
        for setting in ["unpatched", *codecs]:
            patch = (contextlib.nullcontext() if setting == "unpatched"
                     else compressed_kv(pipe, setting, args.bits))
            with patch:
                ways = {}
                for way, loop in (("one pass", False), ("scale loop", True)):
                    teacher_forced_probs(pipe, cond, tokens, scale_loop=loop)  # warm-up
                    probs, sec = timed(lambda: teacher_forced_probs(pipe, cond, tokens, scale_loop=loop),  # noqa: B023
                                       device)
                    ways[way] = (torch.cat(probs, 1), sec)
            if setting == "unpatched":
                ref = {way: probs for way, (probs, _) in ways.items()}
            one, loop = (fidelity(ref[w], ways[w][0]) for w in ("one pass", "scale loop"))
            top1 = max(abs(a - b) for a, b in zip(one["top1_agreement"], loop["top1_agreement"], strict=True))
            kl = max(abs(a - b) / max(b, 1e-12) for a, b in zip(one["kl_nats"], loop["kl_nats"], strict=True))
            mean_kl = sum(loop["kl_nats"]) / len(loop["kl_nats"])
            print(f"{setting} b={args.bits} B={args.batch} {args.size} on {device}: one pass "
                  f"{ways['one pass'][1]:.3f} s, scale loop {ways['scale loop'][1]:.3f} s; rows: max |top-1 "
                  f"diff| {top1:.4f}, max KL rel diff {kl:.2e} (mean KL {mean_kl:.3g})", flush=True)


if __name__ == "__main__":
    main()
