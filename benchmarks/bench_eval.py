"""`octopus-audio eval` end to end, cold and warm, with the time of each stage.

Builds once under --work (as bench_eval_dist.py): the full-size AAR with random weights saved as a model
folder and --clips synthetic clips; or, with --shipped, takes the shipped clips and the embedded default model
(or --aar / --sat). Then runs the eval command's own entry point (`octopus_audio.cli.main`) twice, each in a
fresh process with an empty output folder: `cold` with an empty Triton cache (a new TRITON_CACHE_DIR under
--work), `warm` with the cache the cold run filled. Inside each run the stages are timed by wrapping the
functions that do them (nothing else changes): compile ahead (`aar_patch.compile_ahead.compile_ahead`), model
load, generation (`AARBackend.generate`: references, floors and every codec), teacher forcing
(`AARBackend.teacher_forced`), metrics (`MetricReference.compare`, which `compute_metrics` calls too), the
distribution metrics' embeddings (`AARBackend.latents`: the tokenizer's encoder on the model's device;
`conditioner_vector`: each output's conditioner embedding, on the host) and the report (`write_report`, with
the distribution's bootstrap timed inside it as `distribution`, not summed); `other` is the wall time left
(start-up, clip decoding and conditioning, rows). Time a stage spends off the main thread (a GPU run finishes
each job's rows, metrics included, on a worker thread while the next job generates) goes to its own column,
`<stage> beside`, and is not taken from the wall: it overlaps the main thread's. Writes Markdown and JSON.

    python benchmarks/bench_eval.py --work out/bench_eval --out $OUT/bench_eval.md  # GPU, 100 clips
    python benchmarks/bench_eval.py --size small --device cpu --clips 2 --codecs octopus --bits 2 \\
        --work /tmp/bench-eval-cpu --out /tmp/bench-eval-cpu.md  # a CPU smoke run
    python benchmarks/bench_eval.py --shipped --draws 8 --work /tmp/bv --out $OUT/verdict.md \\
        --keep $OUT/verdict_report.tar  # GPU: the default eval (16 shipped clips) with 8 draws
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_eval_dist import prepare  # noqa: E402  (the benchmarks folder is not a package)

STAGES = ("compile ahead", "model load", "generate", "teacher forced", "latents", "metrics",
          "conditioner embed", "report")
INSIDE = ("distribution",)  # timed inside a stage above: shown, not summed


def _timed(owner, name: str, stage: str, totals: dict) -> None:
    """Replace `owner.name` by a wrapper adding its wall time to totals[stage] (on the main thread) or to
    totals[f"{stage} beside"] (on another thread)."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            key = stage if threading.current_thread() is threading.main_thread() else f"{stage} beside"
            totals[key] = totals.get(key, 0.0) + time.perf_counter() - start

    setattr(owner, name, wrapper)


def stage_run(argv: list[str], report: Path) -> int:
    """In this process: the eval command with its stages timed; the totals written to `report`."""
    start = time.perf_counter()
    totals = dict.fromkeys(STAGES, 0.0)
    from octopus_audio.aar_patch import compile_ahead
    from octopus_audio.eval import backends, batch, cli, dist_report, metrics
    from octopus_audio.eval import report as report_module

    _timed(compile_ahead, "compile_ahead", "compile ahead", totals)
    _timed(cli, "load_model", "model load", totals)
    _timed(backends.AARBackend, "generate", "generate", totals)
    _timed(backends.AARBackend, "teacher_forced", "teacher forced", totals)
    _timed(backends.AARBackend, "latents", "latents", totals)
    _timed(metrics.MetricReference, "compare", "metrics", totals)
    _timed(batch, "conditioner_vector", "conditioner embed", totals)
    _timed(report_module, "write_report", "report", totals)
    _timed(dist_report, "distribution", "distribution", totals)
    from octopus_audio.cli import main

    code = main(argv)
    totals["wall"] = time.perf_counter() - start
    totals["other"] = totals["wall"] - sum(totals[s] for s in STAGES)
    import torch

    if torch.cuda.is_available():  # the eval's peak, for sizing --batch-size (GiB)
        totals["peak GPU GiB"] = torch.cuda.max_memory_allocated() / 2**30
    report.write_text(json.dumps({"exit": code, **totals}) + "\n")
    return code


def run(name: str, eval_args: list[str], work: Path, cache: Path) -> dict:
    """One timed eval in a fresh process (Triton cache at `cache`) into work/run-<name>; its stage totals."""
    out, report = work / f"run-{name}", work / f"run-{name}.json"
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    command = [sys.executable, __file__, "--stage-run", str(report), "--", *eval_args, "--overwrite", "--out",
               str(out)]
    start = time.perf_counter()
    log_path = work / f"run-{name}.log"  # the eval's own output, there while it runs
    with log_path.open("w") as log_file:
        proc = subprocess.run(command, env=env, stdout=log_file, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: {' '.join(command)} exited {proc.returncode}:\n"
                           f"{log_path.read_text()[-4000:]}")
    print(f"{name}: {time.perf_counter() - start:.1f} s", flush=True)
    return {**json.loads(report.read_text()), "process_wall": time.perf_counter() - start}


def table(results: dict[str, dict]) -> str:
    cols = ("process_wall", "wall", *STAGES, "other", "metrics beside", "conditioner embed beside", *INSIDE,
            "peak GPU GiB")
    lines = ["| run | " + " | ".join(cols) + " |", "| --- |" + " ---: |" * len(cols)]
    for name, r in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{r[c]:.1f}" if c in r else "-" for c in cols) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--stage-run"]:
        return stage_run(argv[3:], Path(argv[1]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="Markdown file to write (JSON beside it)")
    parser.add_argument("--work", type=Path, required=True, help="folder for model, clips, caches, runs")
    parser.add_argument("--clips", type=int, default=100,
                        help="synthetic clips, or with --shipped shipped clips at most (default 100)")
    parser.add_argument("--codecs", default="all", help="eval --codecs (default all)")
    parser.add_argument("--bits", default="2,3,4", help="eval --bits (default 2,3,4)")
    parser.add_argument("--size", choices=("full", "small"), default="full", help="the random-weight AAR")
    parser.add_argument("--device", default="cuda", help="eval --device (default cuda)")
    parser.add_argument("--batch-size", default=None, help="eval --batch-size (default: eval's)")
    parser.add_argument("--commit", default="unknown", help="git commit of the benchmarked tree")
    parser.add_argument("--shipped", action="store_true",
                        help="the shipped clips and the embedded default model (or --aar / --sat) instead of "
                             "--clips synthetic clips and the random-weight model of --size")
    parser.add_argument("--aar", default=None, help="with --shipped: eval --aar")
    parser.add_argument("--sat", default=None, help="with --shipped: eval --sat")
    parser.add_argument("--draws", default=None, help="eval --draws (default: eval's)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="a tar file to write the warm run's report into (table.md, table.csv, "
                             "distribution.csv, results.json, plots/)")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.shipped:
        eval_args = ["eval", "--n-clips", str(args.clips), "--clap", "spectral", "--codecs", args.codecs,
                     "--bits", args.bits, "--device", args.device, "--no-progress"]
        eval_args += ["--aar", args.aar] if args.aar else []
        eval_args += ["--sat", args.sat] if args.sat else []
    else:
        model, clip_dir = prepare(args.work, args.size, args.clips)
        eval_args = ["eval", "--aar", str(model), "--clips", str(clip_dir), "--n-clips", str(args.clips),
                     "--clap", "spectral", "--codecs", args.codecs, "--bits", args.bits, "--device",
                     args.device, "--no-progress"]
    if args.batch_size:
        eval_args += ["--batch-size", args.batch_size]
    if args.draws:
        eval_args += ["--draws", args.draws]
    cache = args.work / f"triton-cache-{time.time_ns()}"  # empty: filled by the cold run, read by the warm
    results = {name: run(name, eval_args, args.work, cache) for name in ("cold", "warm")}
    import torch

    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu"
    now = datetime.datetime.now(datetime.timezone.utc)
    head = (f"# eval end to end: cold and warm\n\ndate {now:%Y-%m-%d %H:%M} UTC; {device}; torch "
            f"{torch.__version__}; commit {args.commit}\n\ncommand: `python benchmarks/bench_eval.py "
            f"{' '.join(argv)}`; eval: `octopus-audio {' '.join(eval_args)}`\n\nseconds; stages summed over "
            f"the run `other` the rest:\n\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(head + table(results) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"command": argv, "eval": eval_args, **results},
                                                        indent=1) + "\n")
    print(table(results))
    if args.keep:
        keep(args.work / "run-warm", args.keep)
    return 0


def keep(run_dir: Path, dest: Path) -> None:
    """The run's report into the tar file `dest`: table.md, table.csv, distribution.csv, results.json and
    plots/ (one file: what comes back from a GPU machine is counted in files)."""
    import tarfile

    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w") as tar:
        for name in ("table.md", "table.csv", "distribution.csv", "results.json", "plots"):
            tar.add(run_dir / name, arcname=name)


if __name__ == "__main__":
    sys.exit(main())
