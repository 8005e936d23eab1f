"""Signal-to-noise ratio (dB) of a generated signal against the uncompressed reference."""

from __future__ import annotations

import numpy as np

from octopus_audio.audio_metrics.audio_pair import as_pair

LIMIT_DB = 120.0
_RATIO = 10.0 ** (-LIMIT_DB / 10.0)  # 1e-12


def snr_db(x, x_hat) -> float:
    """SNR in dB: `10 log10(sum x^2 / max(sum (x - x_hat)^2, 1e-12 sum x^2))`, so it lies in [-120, 120].

    x: reference (the uncompressed model output), x_hat: the output under a codec (any shapes with the same
    number of samples). The 1e-12 floor caps identical signals at 120 dB. Two cases the formula leaves open
    are defined here, so the result is never NaN:
    - silence against silence (both all zeros): 120 dB, the value for identical signals;
    - a silent reference against a non-silent estimate: -120 dB (the numerator gets the mirror floor
      `max(sum x^2, 1e-12 sum (x - x_hat)^2)`, which only matters when the error is 10^12 times the signal).

    How to read it: waveform fidelity, phase included; x_hat = 0.9 x gives 20 dB, 0 dB means the error is as
    loud as the signal. Sampling in AAR is stochastic, so once a codec changes one sampled token the waveforms
    diverge and SNR falls towards 0 dB or below even when the audio sounds alike: read it with LSD and
    log-mel. Higher is better.
    """
    a, b = as_pair(x, x_hat)
    signal = float(np.sum(a * a))
    noise = float(np.sum((a - b) ** 2))
    if signal == 0.0 and noise == 0.0:
        return LIMIT_DB
    return float(10.0 * np.log10(max(signal, _RATIO * noise) / max(noise, _RATIO * signal)))
