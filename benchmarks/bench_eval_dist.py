"""`octopus-audio eval` on 1 and on N GPUs (torchrun, a GPU per process): wall time; rows and WAVs compared.

Builds once under --work: the full-size AAR with random weights (as bench_aar.py builds it: AAR d16, width
1024, the SAT d128 tokenizer), saved as a model folder, and --clips synthetic clips (seeded chords and noise,
3 s at 24 kHz). Then, for each process count P in --procs, runs the same eval (`--aar` that folder, `--clap
spectral`, the codecs and bits given) afresh into --work/p<P>: P = 1 as one plain process, P > 1 under
`python -m torch.distributed.run --standalone --nproc_per_node P`. Wall time counts the whole command (start,
model load, every clip, the merge and report). Every run's merged rows are compared with the first run's:
rows equal but for their wall time (`seconds`), the largest difference of any metric otherwise, and the WAVs
byte for byte. Writes a Markdown table (and JSON beside it) to --out.

    python benchmarks/bench_eval_dist.py --procs 1 --work out/eval_dist --out $OUT/eval_dist.md  # then:
    python benchmarks/bench_eval_dist.py --procs 1,2 --work out/eval_dist --out $OUT/eval_dist.md
    python benchmarks/bench_eval_dist.py --size small --device cpu --procs 1,2 --clips 3 --threads 1 \\
        --work /tmp/evaldist-cpu --out /tmp/evaldist-cpu.md  # a smoke test of this script on the CPU (gloo)
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_aar import build_pipeline  # noqa: E402  (the benchmarks folder is not a package)

RATE = 24000


def prepare(work: Path, size: str, clips: int) -> tuple[Path, Path]:
    """The random-weight model folder and the synthetic clips under `work` (kept: a rerun reuses them)."""
    from octopus_audio.aar_patch.model_folder import save_model_folder
    from octopus_audio.wav import write_wav

    model, clip_dir = work / f"model-{size}", work / f"clips-{clips}"
    if not (model / "config.json").is_file():
        save_model_folder(build_pipeline(size, torch.device("cpu")), model, torch.float32)
    if len(list(clip_dir.glob("*.wav"))) != clips:
        clip_dir.mkdir(parents=True, exist_ok=True)
        t = np.arange(3 * RATE) / RATE
        for i in range(clips):
            rng = np.random.default_rng(i)
            freqs = rng.uniform(80, 4000, 3)
            tones = sum(np.sin(2 * np.pi * f * t + rng.uniform(0, 2 * np.pi)) for f in freqs)
            audio = 0.2 * tones / 3 + 0.02 * rng.standard_normal(t.size)
            write_wav(clip_dir / f"synth{i:03d}.wav", audio * np.exp(-t * rng.uniform(0, 2)), RATE)
    return model, clip_dir


def run_eval(procs: int, model: Path, clips: Path, out: Path, args: argparse.Namespace) -> float:
    """One eval afresh into `out` with `procs` processes; its wall time in seconds. A finished run's time is
    kept in `<out>.json` and reused while the command is the same (one call of this script per process count
    fits a 10-minute limit on command length)."""
    launch = ([sys.executable] if procs == 1 else
              [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(procs)])
    command = [*launch, "-m", "octopus_audio", "eval", "--aar", str(model), "--clips", str(clips),
               "--n-clips", str(args.clips), "--clap", "spectral", "--codecs", args.codecs, "--bits",
               args.bits, "--device", args.device, "--no-progress", "--overwrite", "--out", str(out)]
    if args.no_floor:
        command.append("--no-floor")
    if args.threads:
        command += ["--threads", str(args.threads)]
    done = out.with_suffix(".json")
    if done.is_file() and (out / "rows.jsonl").is_file():
        earlier = json.loads(done.read_text())
        if earlier["command"] == command:
            return earlier["seconds"]
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    done.write_text(json.dumps({"command": command, "seconds": seconds}) + "\n")
    return seconds


def read_rows(out: Path) -> dict[tuple, dict]:
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    return {(r["clip"], r["codec"], r["bits"], r["v_bits"], r.get("draw", 0)): r for r in rows}


def compare(first: Path, other: Path) -> dict:
    """Rows equal but for `seconds`, the largest metric difference, WAVs equal byte for byte."""
    a, b = read_rows(first), read_rows(other)
    if set(a) != set(b):
        raise RuntimeError(f"{other} holds other rows than {first}")
    same = sum({**a[k], "seconds": None} == {**b[k], "seconds": None} for k in a)
    worst = 0.0
    for k in a:
        for name, value in (a[k]["metrics"] or {}).items():
            other_value = (b[k]["metrics"] or {}).get(name)
            if value is not None and other_value is not None:
                worst = max(worst, abs(value - other_value))
    wavs = sorted(p.name for p in (first / "wav").iterdir())
    same_wavs = sum((other / "wav" / n).is_file()
                    and (other / "wav" / n).read_bytes() == (first / "wav" / n).read_bytes() for n in wavs)
    return {"rows": len(a), "rows_equal": same, "max_metric_diff": worst, "wavs": len(wavs),
            "wavs_equal": same_wavs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="Markdown file to write (JSON beside it)")
    parser.add_argument("--work", type=Path, required=True, help="folder for the model, clips and eval runs")
    parser.add_argument("--procs", default="1,2", help="comma list of process (GPU) counts; the first is the "
                                                       "baseline the others are compared with")
    parser.add_argument("--clips", type=int, default=100, help="synthetic clips (default 100)")
    parser.add_argument("--codecs", default="octopus", help="eval --codecs (default octopus)")
    parser.add_argument("--bits", default="2", help="eval --bits (default 2)")
    parser.add_argument("--no-floor", action="store_true", help="eval --no-floor")
    parser.add_argument("--size", choices=("full", "small"), default="full",
                        help="full: the released size; small: bench_aar.py's CPU smoke-test size")
    parser.add_argument("--device", default="cuda", help="eval --device (cuda: each process its local GPU)")
    parser.add_argument("--threads", type=int, default=None, help="eval --threads")
    parser.add_argument("--commit", default="unknown", help="git commit of the benchmarked tree")
    args = parser.parse_args(argv)
    procs = [int(p) for p in args.procs.split(",")]
    if args.device.startswith("cuda") and torch.cuda.device_count() < max(procs):
        raise SystemExit(f"--procs {args.procs} needs {max(procs)} GPUs; {torch.cuda.device_count()} visible")
    model, clips = prepare(args.work, args.size, args.clips)
    results = []
    for p in procs:
        seconds = run_eval(p, model, clips, args.work / f"p{p}", args)
        results.append({"procs": p, "seconds": round(seconds, 1),
                        **compare(args.work / f"p{procs[0]}", args.work / f"p{p}")})
    meta = {"date": datetime.date.today().isoformat(), "commit": args.commit, "host": platform.node(),
            "torch": torch.__version__, "device": torch.cuda.get_device_name(0)
            if args.device.startswith("cuda") else platform.processor() or "cpu",
            "command": " ".join(sys.argv), "size": args.size, "clips": args.clips, "codecs": args.codecs,
            "bits": args.bits, "floor": not args.no_floor}
    base = results[0]["seconds"]
    lines = [f"# eval on {', '.join(map(str, procs))} processes: {args.clips} synthetic clips, "
             f"{args.size}-size random-weight AAR", "", *(f"- {k}: {v}" for k, v in meta.items()), "",
             f"| processes | wall s | clips/s | speedup | rows equal to {procs[0]} process(es) (but seconds) "
             f"| largest metric difference | WAVs byte-equal |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        lines.append(f"| {r['procs']} | {r['seconds']} | {args.clips / r['seconds']:.2f} | "
                     f"{base / r['seconds']:.2f} | {r['rows_equal']}/{r['rows']} | "
                     f"{r['max_metric_diff']:.3g} | {r['wavs_equal']}/{r['wavs']} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
