"""Writing mono 16-bit PCM WAV files (what browsers and players read), shared by `generate` and `eval`."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


def write_wav(path: str | Path, audio_N: np.ndarray, sample_rate: int) -> None:
    """Mono 16-bit PCM WAV, written atomically (a temporary file renamed into place).

    Samples outside [-1, 1] are clipped and their count is logged. soundfile writes it when installed (the
    `audio` / `eval` extras); without it the standard library's `wave` module writes the same PCM16.
    """
    path = Path(path)
    audio_N = np.asarray(audio_N, dtype=np.float32).reshape(-1)
    clipped = int(np.count_nonzero(np.abs(audio_N) > 1.0))
    if clipped:
        log.warning("%s: %d of %d samples outside [-1, 1] were clipped", path, clipped, audio_N.size)
    audio_N = np.clip(audio_N, -1.0, 1.0)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.wav")
    try:
        import soundfile
    except ModuleNotFoundError:  # the core install has no audio packages
        log.info("soundfile is not installed; writing %s with the standard-library wave module", path)
        soundfile = None
    if soundfile is not None:
        soundfile.write(str(tmp), audio_N, sample_rate, subtype="PCM_16", format="WAV")
    else:
        import wave

        with wave.open(str(tmp), "wb") as f:
            f.setnchannels(1)
            f.setsampwidth(2)
            f.setframerate(sample_rate)
            f.writeframes(np.round(audio_N * 32767.0).astype("<i2").tobytes())
    os.replace(tmp, path)
