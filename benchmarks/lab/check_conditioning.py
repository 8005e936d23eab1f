"""Conditioning check of a model (default: the shipped one): is audio generated from a held-out file's
embedding nearer to that file than to a randomly chosen other held-out file?

For each held-out file i (aar_patch/train_data.HELD_OUT, never trained on) and each seed, one second is
generated from i's condition (the `spectral` embedding of the whole file, as the eval pipeline computes it;
released sampling defaults cfg 4, top-k 200, top-p 0.95). Log-mel distance: mean squared difference of the
time-averaged log-mel spectra (the eval metric's 80-band `ln(max(mel, 1e-5))`, 24 kHz, n_fft 1024, hop 256)
of the generated second and of the whole file; time-averaged because generation is not aligned in time with
the file. A case succeeds when d(generated_i, file_i) < d(generated_i, file_j) for a held-out file j != i
drawn at random (seeded). Also printed: the share over all j != i, and how often file i is the nearest.

    python benchmarks/lab/check_conditioning.py [--aar PATH --sat PATH] [--seeds 4] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def mean_log_mel(x_T: np.ndarray, sample_rate: int = 24000) -> np.ndarray:
    """(80,) time-averaged log-mel spectrum of a signal (the eval log-mel, averaged over frames)."""
    from octopus_audio.audio_metrics.logmel import log_mel

    return log_mel(np.asarray(x_T, np.float64), sample_rate).mean(axis=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aar", help="transformer checkpoint (default: the shipped model)")
    parser.add_argument("--sat", help="tokenizer checkpoint (default: the shipped model)")
    parser.add_argument("--seeds", type=int, default=4, help="generations per held-out file (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random choice of the other file")
    parser.add_argument("--cfg", type=float, default=4.0)
    parser.add_argument("--json", help="write the figures and every case here")
    args = parser.parse_args(argv)

    import torch

    from octopus_audio.aar_patch.default_model import default_paths
    from octopus_audio.aar_patch.generation import generate
    from octopus_audio.aar_patch.loading import load_aar
    from octopus_audio.aar_patch.train_data import HELD_OUT, install_sonic_pi
    from octopus_audio.aar_patch.train_report import held_out_audio
    from octopus_audio.eval.conditioning import condition_vector, make_conditioner
    from octopus_audio.eval.sources import read_mono_24k

    aar_path, sat_path = (args.aar, args.sat) if args.aar or args.sat else default_paths()
    pipe = load_aar(aar_path, sat_path)
    samples_dir, _ = install_sonic_pi(Path("/tmp/octopus-audio-train"))
    clips = held_out_audio(samples_dir, HELD_OUT, read_mono_24k)
    conditioner = make_conditioner("spectral")
    cond_NE = torch.from_numpy(np.stack([condition_vector(x, conditioner) for _, x in clips]))
    ref_NM = np.stack([mean_log_mel(x) for _, x in clips])
    n = len(clips)
    rng = np.random.default_rng(args.seed)
    cases, own_rank_first, pair_wins, pairs = [], 0, 0, 0
    t0 = time.monotonic()
    for s in range(args.seeds):
        with torch.no_grad():
            audio_N1T = generate(pipe, cond_NE, cfg=args.cfg, seed=1000 + s).audio
        for i in range(n):
            gen_M = mean_log_mel(audio_N1T[i, 0].numpy())
            d_N = ((ref_NM - gen_M) ** 2).mean(axis=1)
            j = int(rng.choice([k for k in range(n) if k != i]))
            cases.append({"file": clips[i][0], "seed": 1000 + s, "other": clips[j][0],
                          "d_own": float(d_N[i]), "d_other": float(d_N[j]), "nearer": bool(d_N[i] < d_N[j])})
            others = np.delete(d_N, i)
            pair_wins += int((d_N[i] < others).sum())
            pairs += len(others)
            own_rank_first += int(d_N[i] < others.min())
    share = float(np.mean([c["nearer"] for c in cases]))
    result = {"aar": str(aar_path), "sat": str(sat_path), "held_out_files": n, "seeds": args.seeds,
              "cases": len(cases), "nearer_than_random_other": share,
              "nearer_than_each_other": pair_wins / pairs,
              "own_file_nearest": own_rank_first / len(cases), "cfg": args.cfg,
              "seconds": round(time.monotonic() - t0, 1), "per_case": cases}
    print(f"held-out files: {n}, generations per file: {args.seeds}, cases: {len(cases)}")
    print(f"nearer to its own file than to a random other held-out file: {share:.1%} (pass: > 60%)")
    print(f"nearer than each other held-out file (all pairs): {pair_wins / pairs:.1%}")
    print(f"own file the nearest of all {n}: {own_rank_first / len(cases):.1%} (chance {1 / n:.1%})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0 if share > 0.6 else 1


if __name__ == "__main__":
    sys.exit(main())
