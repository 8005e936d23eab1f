"""Where one eval generation's time goes: `AARBackend.generate` (what the eval runs per batch and job, the
tokens, latents and audio copied to the host) of a batch of random conditions under a codec, timed, then
profiled once with torch.profiler (the ops with the most self time, CPU and CUDA).

    python benchmarks/lab/profile_generate.py --size full --device cuda --batch 100 --codec octopus --bits 2
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_aar import build_pipeline  # noqa: E402  (the benchmarks folder is not a package)

from octopus_audio.aar_patch import compressed_kv, load_aar  # noqa: E402
from octopus_audio.eval.backends import AARBackend  # noqa: E402
from octopus_audio.eval.records import EvalConfig  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", choices=("full", "small", "default"), default="default")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--codec", default="octopus")
    p.add_argument("--bits", type=int, default=2)
    p.add_argument("--rows", type=int, default=20, help="profiler rows to print")
    args = p.parse_args()
    device = torch.device(args.device)
    pipe = load_aar() if args.size == "default" else build_pipeline(args.size, torch.device("cpu"))
    pipe = pipe.to(device).float().eval()
    backend = AARBackend(pipe, EvalConfig(codecs=(args.codec,)), "lab", str(device))
    cond = np.random.default_rng(0).standard_normal((args.batch, pipe.aar.config.cond_dim)).astype(np.float32)
    cond /= np.linalg.norm(cond, axis=1, keepdims=True)
    seeds = list(range(args.batch))
    with compressed_kv(pipe, args.codec, args.bits) if args.codec != "none" else contextlib.nullcontext():
        backend.generate(cond, seeds)  # warm-up: kernels, allocator
        times = []
        for _ in range(3):
            start = time.perf_counter()
            backend.generate(cond, seeds)
            times.append(time.perf_counter() - start)
        print(f"{args.codec} b={args.bits} B={args.batch} {args.size} on {device}: generate "
              f"{', '.join(f'{t:.3f}' for t in times)} s", flush=True)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            backend.generate(cond, seeds)
    keys = ["self_cpu_time_total"] + (["self_cuda_time_total"] if device.type == "cuda" else [])
    for key in keys:
        print(prof.key_averages().table(sort_by=key, row_limit=args.rows, max_name_column_width=60))


if __name__ == "__main__":
    main()
