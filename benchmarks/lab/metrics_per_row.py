"""Per-row time of the eval's audio metrics: one-shot `compute_metrics` against one `MetricReference` a clip,
and the two parts made faster (STFT framing, the mel product) against their plain forms.

Synthetic clips of 24000 samples (one second at the model's rate) and 17 rows each, as the default eval has;
rounds interleave the ways, and the best round of each is printed (ms per row or per call).

    python benchmarks/lab/metrics_per_row.py --clips 6 --rounds 7
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from octopus_audio.audio_metrics.logmel import N_FFT, mel_filterbank, mel_spectrum
from octopus_audio.eval.metrics import MetricReference, compute_metrics

RATE, T, ROWS = 24000, 24000, 17


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=6, help="synthetic clips (default 6)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds; the best of each way is printed")
    args = parser.parse_args()

    rng = np.random.default_rng(0)

    def pair():
        audio = (0.1 * rng.standard_normal(T)).astype(np.float32)
        return audio, rng.standard_normal((1, 128, 75), np.float32)

    clips = [(pair(), [pair() for _ in range(ROWS)]) for _ in range(args.clips)]
    rows = args.clips * ROWS

    def one_shot():
        for (ref, ref_fhat), outs in clips:
            for audio, fhat in outs:
                compute_metrics(ref, audio, ref_fhat, fhat, RATE)

    def prepared():
        for (ref, ref_fhat), outs in clips:
            reference = MetricReference(ref, ref_fhat, RATE)
            for audio, fhat in outs:
                reference.compare(audio, fhat)

    x = clips[0][0][0].astype(np.float64)
    padded = np.pad(x, (N_FFT // 2, N_FFT // 2))
    hop = 256
    window = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(N_FFT) / N_FFT)

    def gathered():  # the framing as first written: an index array built, then every sample gathered
        index = np.arange(N_FFT)[None, :] + hop * np.arange(1 + (padded.size - N_FFT) // hop)[:, None]
        return padded[index] * window

    mag_FK = np.abs(np.fft.rfft(gathered(), axis=-1))
    fb_MK = mel_filterbank(RATE)
    ways = {  # name: (callable, how many units one call does)
        "compute_metrics, per row": (one_shot, rows),
        "MetricReference.compare, per row": (prepared, rows),
        "windowed frames by index gather (log-mel STFT)": (gathered, 1),
        "windowed frames by strided view": (
            lambda: np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::hop] * window, 1),
        "mel product, np.einsum over 513 bins": (lambda: np.einsum("fk,mk->fm", mag_FK, fb_MK), 1),
        "mel product, each band's own bins (mel_spectrum)": (lambda: mel_spectrum(mag_FK, RATE), 1),
    }
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(args.rounds):
        for name, (fn, units) in ways.items():
            repeat = 1 if units > 1 else 20
            start = time.perf_counter()
            for _ in range(repeat):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / (units * repeat))
    for name, seconds in best.items():
        print(f"{name:50s} {seconds * 1e3:7.3f} ms")


if __name__ == "__main__":
    main()
