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
    p = np.abs(stft_frames(a, N_FFT, HOP)) ** 2
    p_hat = np.abs(stft_frames(b, N_FFT, HOP)) ** 2
    diff_db = 10.0 * np.log10(p_hat + POWER_FLOOR) - 10.0 * np.log10(p + POWER_FLOOR)
    return float(np.mean(np.sqrt(np.mean(diff_db**2, axis=-1))))
