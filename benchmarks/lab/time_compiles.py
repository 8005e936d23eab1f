"""Lab (no GPU needed): how long each Triton variant of an eval takes to compile for sm_90. The variants are
enumerated as count_variants.py does (the launchers' CUDA decisions imitated on the CPU) for the embedded
default model's shapes at --batch conditions, in bf16 (generation) and float32 (teacher forcing), for every
codec and width asked; each is compiled in a worker with `triton.compile` into an empty cache, and its wall
time printed as it finishes, then the slowest.

    PYTHONPATH=/tmp/t36only python benchmarks/lab/time_compiles.py --batch 16 --workers 2   # Triton 3.6
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="time-compiles-")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

UNITS = (1, 2, 4, 6, 9, 12, 16, 20, 25, 31, 37, 43, 50, 58, 66, 75)


def timed(item):
    from octopus_audio.aar_patch import compile_variants as compile_ahead

    start = time.perf_counter()
    error = compile_ahead.compile_launch(item)
    return item[0], time.perf_counter() - start, error


def main() -> None:
    from count_variants import _imitate_cuda
    from triton.backends.compiler import GPUTarget

    from octopus_audio.aar_patch import compile_variants as compile_ahead
    from octopus_audio.codecs import kernel_codecs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--codecs", default="all")
    parser.add_argument("--bits", default="2,3,4")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", default="", help="compile only variants whose label contains this")
    args = parser.parse_args()
    _imitate_cuda()
    target = GPUTarget("cuda", 90, 32)
    _, backend = compile_ahead.target_backend(target)
    codecs = list(kernel_codecs()) if args.codecs == "all" else args.codecs.split(",")
    found: dict = {}
    for dtype in (torch.bfloat16, torch.float32):
        shapes = compile_ahead.UnitShapes(args.heads, 64, UNITS, 2 * args.batch, dtype)
        for name in codecs:
            for b in (int(x) for x in args.bits.split(",")):
                for launch in compile_ahead.cache_launches(name, b, shapes, "cpu", backend=backend,
                                                           defer_checks=True):
                    found.setdefault(launch, f"{name} b={b}")
    todo = [launch for launch in found if args.only in launch.label()]
    print(f"{len(found)} variants, compiling {len(todo)} with {args.workers} workers", flush=True)
    times = []
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        for launch, seconds, error in pool.imap_unordered(timed, [(v, target) for v in todo]):
            times.append((seconds, found[launch], launch.label(), error))
            failed = f"  FAILED {error}" if error else ""
            print(f"{seconds:7.1f} s  {found[launch]:22s} {launch.label()}{failed}", flush=True)
    print(f"total {time.perf_counter() - start:.1f} s wall, {sum(t[0] for t in times):.1f} s compile")
    for seconds, config, label, _ in sorted(times, reverse=True)[:15]:
        print(f"slowest {seconds:7.1f} s  {config:22s} {label}")


if __name__ == "__main__":
    main()
