"""Log-mel mean squared error between a generated signal and the uncompressed reference."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from octopus_audio.audio_metrics.audio_pair import as_pair, stft_frames

N_MELS = 80
N_FFT = 1024
HOP = 256
MAG_FLOOR = 1e-5


def hz_to_mel(f):
    """Slaney's mel scale (librosa's default, htk=False): linear below 1 kHz, logarithmic above."""
    f = np.asarray(f, dtype=np.float64)
    log_region = 15.0 + np.log(np.maximum(f, 1e-12) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(f >= 1000.0, log_region, f * 3.0 / 200.0)


def mel_to_hz(m):
    m = np.asarray(m, dtype=np.float64)
    return np.where(m >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0)), m * 200.0 / 3.0)


@lru_cache(maxsize=8)
def mel_filterbank(sample_rate: int, n_fft: int = N_FFT, n_mels: int = N_MELS) -> np.ndarray:
    """(n_mels, n_fft//2+1) triangular mel filters from 0 Hz to Nyquist, Slaney scale and area normalisation.

    The same matrix as `librosa.filters.mel(sr, n_fft, n_mels)` with its defaults (a test checks it); written
    out here so that metrics need no librosa at run time.
    """
    fft_hz = np.linspace(0.0, sample_rate / 2.0, 1 + n_fft // 2)
    edges_hz = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(sample_rate / 2.0), n_mels + 2))
    widths = np.diff(edges_hz)
    ramps = edges_hz[:, None] - fft_hz[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    return weights * (2.0 / (edges_hz[2:] - edges_hz[:-2]))[:, None]


@lru_cache(maxsize=8)
def mel_layers(sample_rate: int, n_fft: int = N_FFT,
               n_mels: int = N_MELS) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]:
    """`mel_filterbank` as layers of bands whose bin ranges do not overlap: per layer (bands, first bins,
    weights over all bins), the weights of a layer's bands side by side (zero between them).

    A band's range runs from its first to its last nonzero weight; bands are placed greedily, in order, in the
    first layer whose last range ends before theirs starts (Slaney's triangles give two layers: the even and
    the odd bands). A band with no nonzero weight is in no layer (its mel value is 0).
    """
    fb_MK = mel_filterbank(sample_rate, n_fft, n_mels)
    layers = []  # [bands, first bins, end of the last range, weights]
    for m, w_K in enumerate(fb_MK):
        nonzero = np.flatnonzero(w_K)
        if nonzero.size == 0:
            continue
        lo, hi = int(nonzero[0]), int(nonzero[-1]) + 1
        layer = next((la for la in layers if la[2] <= lo), None)
        if layer is None:
            layer = [[], [], 0, np.zeros(fb_MK.shape[1])]
            layers.append(layer)
        layer[0].append(m)
        layer[1].append(lo)
        layer[2] = hi
        layer[3][lo:hi] = w_K[lo:hi]
    out = tuple((np.array(bands), np.array(starts), w_K) for bands, starts, _, w_K in layers)
    for array in (a for layer in out for a in layer):
        array.flags.writeable = False  # cached: shared by every call
    return out


def mel_spectrum(mag_FK: np.ndarray, sample_rate: int) -> np.ndarray:
    """(frames, 80) mel magnitudes `mag_FK @ mel_filterbank(sample_rate).T` of (frames, 513) STFT magnitudes,
    each band summed over its own bins only (`mel_layers`; at 24 kHz a band has 12.5 nonzero bins of 513 on
    average).

    Numpy's own loops (a product and an `add.reduceat` a layer), not BLAS: the same bits whatever the thread
    count (one process or many must agree). Equal to the full product up to the order of the sums (relative
    differences near 1e-15; tests/test_eval_metric_reference.py compares them); 0.2 ms on 94 frames
    against 2 ms for the full product by `np.einsum` (benchmarks/results/eval_speed.md, the metrics stage).
    """
    mel_FM = np.zeros((mag_FK.shape[0], N_MELS))
    for bands, starts, w_K in mel_layers(sample_rate):
        mel_FM[:, bands] = np.add.reduceat(mag_FK * w_K, starts, axis=1)
    return mel_FM


def log_mel(x_T: np.ndarray, sample_rate: int) -> np.ndarray:
    """(frames, 80) natural-log mel magnitudes `ln(max(mel, 1e-5))` of a float64 signal."""
    return np.log(np.maximum(mel_spectrum(np.abs(stft_frames(x_T, N_FFT, HOP)), sample_rate), MAG_FLOOR))


def logmel_mse(x, x_hat, sample_rate: int = 24000) -> float:
    """Log-mel MSE: `mean((ln(max(mel_hat, 1e-5)) - ln(max(mel, 1e-5)))^2)` over frames and 80 bands.

    x: reference (the uncompressed model output), x_hat: the output under a codec, both at `sample_rate` (the
    model's rate, 24 kHz for AAR). STFT: n_fft 1024, hop 256, periodic Hann, centred frames with zero padding;
    mel = the Slaney mel filterbank (librosa's default, 0 Hz to Nyquist; `mel_filterbank`) applied to the
    magnitude `|X|` (the vocoder convention that the 1e-5 floor comes from).

    How to read it: 0 means identical; it is in squared natural-log units, so 0.01 is about a 10% (0.1 neper)
    typical band error and a uniform gain g gives `(ln g)^2` (0.48 for g = 2) on bands above the floor. It
    weighs the perceptually dense low bands more than LSD does. Silence against silence is 0. Lower is better.
    """
    a, b = as_pair(x, x_hat)
    check_sample_rate(sample_rate)
    return logmel_mse_from_log_mels(log_mel(a, sample_rate), log_mel(b, sample_rate))


def check_sample_rate(sample_rate: int) -> None:
    """Raise ValueError unless `sample_rate` (Hz) is positive."""
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")


def logmel_mse_from_log_mels(mel_log: np.ndarray, mel_hat_log: np.ndarray) -> float:
    """Log-mel MSE of two equal-shape `log_mel` arrays, reference first: `mean((mel_hat_log - mel_log)^2)`."""
    return float(np.mean((mel_hat_log - mel_log) ** 2))
