"""Input checks shared by the metrics: two equal-length, finite, non-empty signals as float64 arrays."""

from __future__ import annotations

import numpy as np


def as_array(x, name: str) -> np.ndarray:
    """A float64 numpy copy of `x` (numpy array, torch tensor or sequence); tensors are moved to the CPU."""
    if hasattr(x, "detach"):
        x = x.detach().to("cpu").double().numpy()
    return np.asarray(x, dtype=np.float64)


def as_pair(x, x_hat, what: str = "signal") -> tuple[np.ndarray, np.ndarray]:
    """Both inputs flattened to 1-D float64 after checking that they match.

    Accepts any shape whose size is the sample count (for example (T,), (1, T) or (1, 1, T)); the two inputs
    must have the same number of elements, at least one, and only finite values. Raises ValueError otherwise.
    """
    return check_pair(as_array(x, "x").reshape(-1), as_array(x_hat, "x_hat").reshape(-1), what)


def check_pair(a: np.ndarray, b: np.ndarray, what: str = "signal") -> tuple[np.ndarray, np.ndarray]:
    """`as_pair`'s checks and ValueErrors for two inputs already flattened to 1-D float64; returns them."""
    if a.size == 0 or b.size == 0:
        raise ValueError(f"empty {what}: reference has {a.size} values, estimate has {b.size}")
    if a.size != b.size:
        raise ValueError(f"{what} lengths differ: reference {a.size}, estimate {b.size}")
    for name, v in (("reference", a), ("estimate", b)):
        bad = int(np.count_nonzero(~np.isfinite(v)))
        if bad:
            raise ValueError(f"the {name} {what} has {bad} non-finite values (NaN or inf)")
    return a, b


def stft_frames(x_T: np.ndarray, n_fft: int, hop: int) -> np.ndarray:
    """Complex STFT (frames, n_fft//2+1): periodic Hann window, centred frames, zero padding of n_fft//2.

    The same framing as `torch.stft(center=True, pad_mode="constant")` and librosa's `center=True` with zero
    padding; zero padding (not reflection) keeps it defined for signals shorter than n_fft/2.
    """
    window = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n_fft) / n_fft)
    padded = np.pad(x_T, (n_fft // 2, n_fft // 2))
    # frame t is padded[t*hop : t*hop + n_fft], read through a strided view (no gather; the product with the
    # window makes the one contiguous copy); 1 + (padded.size - n_fft) // hop frames
    frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop]
    return np.fft.rfft(frames * window, axis=-1)
