"""Held-out figures of a trained tokenizer: log-mel MSE and SNR of its reconstruction of the held-out
files, beside the same figures for a trivial baseline (the file low-passed at 2 kHz). Used for
MODEL_CARD.md."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

LOWPASS_HZ = 2000.0
LOWPASS_ORDER = 8


@dataclass(frozen=True)
class ReconstructionRow:
    """One held-out file: its length and the two metrics for the tokenizer and for the low-pass baseline."""

    name: str
    seconds: float
    sat_logmel_mse: float
    sat_snr_db: float
    lowpass_logmel_mse: float
    lowpass_snr_db: float


def held_out_audio(samples_dir: Path, names: tuple[str, ...],
                   read: Callable[[Path], np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """`(file name, 24 kHz mono audio)` of the held-out stems found in `samples_dir`, each file read by
    `read` (the caller's decoder, e.g. `eval.sources.read_mono_24k`); every stem must be there."""
    from octopus_audio.aar_patch.train_data import AUDIO_SUFFIXES

    found = {p.stem: p for p in sorted(samples_dir.iterdir()) if p.suffix in AUDIO_SUFFIXES}
    missing = [n for n in names if n not in found]
    if missing:
        raise FileNotFoundError(f"held-out files missing from {samples_dir}: {', '.join(missing)}")
    return [(found[n].name, read(found[n])) for n in names]


@torch.no_grad()
def reconstruct(sat, audio_T: np.ndarray) -> np.ndarray:
    """The tokenizer's reconstruction of a whole signal: consecutive 1 s windows (the last zero-padded)
    encoded to tokens, decoded from them, concatenated and trimmed to the input length."""
    n = sat.config.audio_length
    windows = -(-len(audio_T) // n)
    padded = np.zeros(windows * n, np.float32)
    padded[: len(audio_T)] = audio_T
    x_B1N = torch.from_numpy(padded).view(windows, 1, n)
    y_B1N = sat.decode(sat.tokens_to_fhat(sat.encode_audio(x_B1N)))
    return y_B1N.reshape(-1)[: len(audio_T)].numpy().astype(np.float64)


def lowpass(audio_T: np.ndarray, sample_rate: int) -> np.ndarray:
    """The baseline: zero-phase Butterworth low-pass at 2 kHz (order 8, `scipy.signal.sosfiltfilt`)."""
    from scipy.signal import butter, sosfiltfilt

    sos = butter(LOWPASS_ORDER, LOWPASS_HZ, btype="low", fs=sample_rate, output="sos")
    return sosfiltfilt(sos, np.asarray(audio_T, np.float64))


def reconstruction_table(sat, clips: list[tuple[str, np.ndarray]],
                         sample_rate: int = 24000) -> list[ReconstructionRow]:
    """Per held-out file: tokenizer and baseline log-mel MSE and SNR against the file itself."""
    from octopus_audio.audio_metrics.logmel import logmel_mse
    from octopus_audio.audio_metrics.snr import snr_db

    rows = []
    for name, x in clips:
        x64 = np.asarray(x, np.float64)
        y, b = reconstruct(sat, x), lowpass(x64, sample_rate)
        rows.append(ReconstructionRow(name, len(x) / sample_rate, logmel_mse(x64, y, sample_rate),
                                      snr_db(x64, y), logmel_mse(x64, b, sample_rate), snr_db(x64, b)))
    return rows


def table_markdown(rows: list[ReconstructionRow]) -> str:
    """The rows and their means as a Markdown table."""
    lines = ["| held-out file | seconds | tokenizer log-mel MSE | 2 kHz low-pass log-mel MSE "
             "| tokenizer SNR dB | low-pass SNR dB |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| `{r.name}` | {r.seconds:.2f} | {r.sat_logmel_mse:.3f} | {r.lowpass_logmel_mse:.3f} "
                     f"| {r.sat_snr_db:.2f} | {r.lowpass_snr_db:.2f} |")
    mean = {k: float(np.mean([getattr(r, k) for r in rows])) for k in
            ("sat_logmel_mse", "lowpass_logmel_mse", "sat_snr_db", "lowpass_snr_db")}
    lines.append(f"| **mean of {len(rows)}** | | **{mean['sat_logmel_mse']:.3f}** | "
                 f"**{mean['lowpass_logmel_mse']:.3f}** | **{mean['sat_snr_db']:.2f}** | "
                 f"**{mean['lowpass_snr_db']:.2f}** |")
    return "\n".join(lines)
