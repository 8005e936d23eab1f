"""Log-spectral distance (LSD, dB) between a generated signal and the uncompressed reference."""

from __future__ import annotations

import numpy as np

from octopus_audio.audio_metrics.audio_pair import as_pair, stft_frames

N_FFT = 2048
HOP = 512
POWER_FLOOR = 1e-10


def lsd_db(x, x_hat) -> float:
    """LSD in dB: `mean_t sqrt(mean_f (10 log10(P_hat + 1e-10) - 10 log10(P + 1e-10))^2)`.

    x: reference (the uncompressed model output), x_hat: the output under a codec; any shapes with T samples
    in all (see `as_pair`). STFT: n_fft 2048, hop 512, periodic Hann window, centred frames with zero padding,
    `P = |X|^2` (no normalisation). The 1e-10 floor makes silence against silence 0 dB.

    How to read it: 0 dB means identical power spectra; a uniform gain g on every bin gives `|20 log10 g|`
    (a copy at twice the amplitude gives 6.02 dB). It ignores phase, so a delayed copy can score near 0.
    Lower is better; codec noise shows mostly in quiet bins, so LSD grows faster than SNR drops.
    """
    a, b = as_pair(x, x_hat)
    return lsd_from_power_db(power_db(a), power_db(b))


def power_db(x_T: np.ndarray) -> np.ndarray:
    """(frames, 1025) floored power spectrum `10 log10(|X|^2 + 1e-10)` of a float64 signal (LSD's STFT)."""
    return 10.0 * np.log10(np.abs(stft_frames(x_T, N_FFT, HOP)) ** 2 + POWER_FLOOR)


def lsd_from_power_db(p_db: np.ndarray, p_hat_db: np.ndarray) -> float:
    """LSD of two `power_db` spectra of equal shape (reference first): `mean_t sqrt(mean_f (P_hat - P)^2)`."""
    diff_db = p_hat_db - p_db
    return float(np.mean(np.sqrt(np.mean(diff_db**2, axis=-1))))
