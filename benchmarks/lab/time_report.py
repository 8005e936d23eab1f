"""Lab (CPU): where `write_report` spends its time on a synthetic run folder of --clips clips shaped like the
default eval's (the two floor rows and 5 codecs x bits 2,3,4 per clip, input and reference WAVs: 19 WAVs of
1 s at 24 kHz per clip, rows as the runner writes them). Prints write_report's wall time and each stage's
alone (median of --repeat warm runs after one discarded run) and, with --profile, the cProfile top functions
of one run. --report times another version of eval/report.py (say main's) on the same folder; --out keeps
the folder, so two versions' reports can be compared file by file (`diff -r`).

    python benchmarks/lab/time_report.py --clips 100 --repeat 3
    git show main:eval/report.py > /tmp/report_main.py
    python benchmarks/lab/time_report.py --clips 100 --repeat 3 --report /tmp/report_main.py --out /tmp/before
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import json
import pstats
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from octopus_audio.eval import report as installed_report
from octopus_audio.eval.records import FLOOR, KV_FLOOR, Job
from octopus_audio.eval.run_files import wav_name
from octopus_audio.eval.spectrograms import spectrograms_drawn
from octopus_audio.wav import write_wav

RATE = 24000
CODECS = ("turboquant-mse", "turboquant-qjl", "polarquant", "octopus", "octopus-qjl")


def jobs() -> list[Job]:
    return [Job(FLOOR), Job(KV_FLOOR)] + [Job(c, b, b) for c in CODECS for b in (2, 3, 4)]


def sound(rng: np.random.Generator, base: np.ndarray | None = None) -> np.ndarray:
    """1 s of a chirp, harmonics and decaying noise bursts; near `base` when given (a codec's output)."""
    if base is not None:
        return base + rng.uniform(0.005, 0.05) * rng.standard_normal(base.size)
    t = np.arange(RATE) / RATE
    f0 = rng.uniform(80, 400) * (1 + t * rng.uniform(0, 3))
    x = sum(0.3 / k * np.sin(2 * np.pi * k * np.cumsum(f0) / RATE) for k in range(1, 6))
    bursts = np.exp(-((t[:, None] - rng.uniform(0, 1, 4)) % 1) * 20).sum(axis=1)
    return 0.6 * x + 0.1 * bursts * rng.standard_normal(t.size)


def make_run(out: Path, n_clips: int, seed: int = 0) -> tuple[list[dict], list[dict], list[Job], dict]:
    """The WAVs under out/wav and the (rows, clips, jobs, meta) `write_report` takes."""
    rng = np.random.default_rng(seed)
    (out / "wav").mkdir(parents=True, exist_ok=True)
    rows, clips = [], []
    for i in range(n_clips):
        cid = f"clip{i:03d}"
        clips.append({"clip": cid, "origin": f"/data/clips/{cid}.wav"})
        ref = sound(rng)
        write_wav(out / "wav" / wav_name(cid, "input", None), sound(rng), RATE)
        write_wav(out / "wav" / wav_name(cid, "reference", None), ref, RATE)
        for job in jobs():
            write_wav(out / "wav" / wav_name(cid, *job), sound(rng, ref), RATE)
            metrics = {"lsd_db": rng.uniform(1, 8), "logmel_mse": rng.uniform(0.01, 2),
                       "snr_db": rng.uniform(-5, 20), "latent_cos": rng.uniform(0.5, 1)}
            kv = None
            if job.codec != FLOOR:
                metrics |= {"tf_top1": rng.uniform(0.6, 1), "tf_kl_nats": rng.uniform(1e-4, 0.5)}
            if job.bits is not None:
                kv = {"ratio": 16 / (job.bits + 0.3), "k_bits": job.bits + 0.25, "v_bits": job.bits + 0.5}
            rows.append({"clip": cid, "origin": clips[-1]["origin"], "run": "lab", "clip_sha256": None,
                         "codec": job.codec, "bits": job.bits, "v_bits": job.v_bits, "seed": 3,
                         "status": "ok", "stage": None, "error": None, "metrics": metrics, "kv": kv,
                         "seconds": 1.0, "threads": 2})
    meta = {"model": "lab", "conditioner": "lab", "seed": 3, "floor_seed": 4}
    return rows, clips, jobs(), meta


def spectrograms(report, out: Path, clips, jobs, threads: int | None) -> None:
    """Every spectrogram of the run: `spectrograms_drawn` on `threads`, or an old report's serial
    `write_spectrograms`."""
    if hasattr(report, "write_spectrograms"):
        report.write_spectrograms(out, clips, jobs)
        return
    with spectrograms_drawn(out, clips, jobs, threads):
        pass


def timed_run(report, out: Path, args: tuple, threads: list[int]) -> dict[str, tuple[float, float]]:
    """One write_report's (wall, CPU) seconds, then each of its stages alone (spectrograms: on the default
    threads and on each count of `threads`; plots; the page; the tables and results.json). CPU: the
    process's, all threads (what other users of a shared machine do not change much)."""
    rows, clips, jobs, meta = args

    def wall(call) -> tuple[float, float]:
        start, cpu = time.perf_counter(), time.process_time()
        call()
        return time.perf_counter() - start, time.process_time() - cpu

    spent = {"write_report": wall(lambda: report.write_report(out, *args))}
    meta = {**meta, "clip_count": len(clips)}
    groups = report.aggregate(rows, jobs)
    spent["tables + results.json"] = wall(lambda: (
        report.aggregate(rows, jobs), json.dumps(report.equal_rate_entries(groups), indent=1),
        report.table_markdown(groups, meta), report.table_csv(groups)))
    spent["plot_metrics"] = wall(lambda: report.plot_metrics(groups, rows, out / "plots"))
    spent["spectrograms"] = wall(lambda: spectrograms(report, out, clips, jobs, None))
    for n in threads if not hasattr(report, "write_spectrograms") else ():
        spent[f"spectrograms, {n} threads"] = wall(lambda n=n: spectrograms(report, out, clips, jobs, n))
    plots = sorted(p.name for p in (out / "plots").glob("*.png"))
    spent["index_html"] = wall(lambda: report.index_html(out, rows, clips, jobs, groups, meta, plots))
    return spent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clips", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="cProfile one more run, print the top 25")
    p.add_argument("--threads", default="1", help="comma list: spectrograms alone on each thread count too")
    p.add_argument("--report", type=Path, help="a report.py to time instead of the installed one")
    p.add_argument("--out", type=Path, help="build the run folder here and keep it (default: temporary)")
    a = p.parse_args()
    threads = [int(n) for n in a.threads.split(",")]
    report = installed_report
    if a.report:
        spec = importlib.util.spec_from_file_location("octopus_audio.eval.report_timed", a.report)
        report = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(report)
    with tempfile.TemporaryDirectory(prefix="time-report-") as tmp:
        out = a.out or Path(tmp)
        start = time.perf_counter()
        args = make_run(out, a.clips)
        print(f"{a.clips} clips, {len(list((out / 'wav').iterdir()))} WAVs written in "
              f"{time.perf_counter() - start:.1f} s")
        timed_run(report, out, args, threads)  # warm: imports, matplotlib fonts, page cache
        runs = [timed_run(report, out, args, threads) for _ in range(a.repeat)]
        print(f"{'median of ' + str(a.repeat):>24}  wall s   CPU s   (wall of each run)")
        for key in runs[0]:
            walls, cpus = ([r[key][i] for r in runs] for i in (0, 1))
            print(f"{key:>24}: {statistics.median(walls):7.3f} {statistics.median(cpus):7.3f}   ("
                  + ", ".join(f"{v:.3f}" for v in walls) + ")")
        sizes = [f.stat().st_size for f in (out / "spec").iterdir()]
        print(f"spectrograms: {len(sizes)} PNGs, {sum(sizes) / 1e6:.2f} MB, "
              f"mean {np.mean(sizes) / 1e3:.1f} kB")
        if a.profile:
            prof = cProfile.Profile()
            prof.runcall(report.write_report, out, *args)
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
