"""The eval report's spectrogram thumbnails: one palette PNG per WAV of a run folder (`spectrogram_png`),
drawn on a thread pool (`spectrograms_drawn`) so the report's plots can be drawn meanwhile."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from octopus_audio.eval.run_files import spectrogram_name, wav_name

log = logging.getLogger(__name__)

# spectrogram threads at most (one a core below it). numpy's FFT and ufuncs, soundfile's reads and PNG's zlib
# release the GIL; the Python around them holds it for 30-34% of an image (py-spy --gil samples), so about 3
# threads keep the GIL busy and more add switching (on 2 cores, 8 or 16 threads spent 7-25% more CPU than 1;
# benchmarks/lab/time_report.py). Not measured on more than 2 cores.
SPECTROGRAM_THREADS = 8


@functools.cache
def _magma_palette() -> bytes:
    """The spectrograms' 256 magma colours as PIL's `putpalette` takes them (flat RGB bytes), built once."""
    from matplotlib import colormaps

    lut = (colormaps["magma"](np.arange(256) / 255.0)[:, :3] * 255.0 + 0.5).astype(np.uint8)
    return lut.tobytes()


def spectrogram_png(wav_path: Path, png_path: Path, ref_db: float | None = None, frames: int = 200) -> float:
    """Log-power spectrogram thumbnail: 129 frequency rows (n_fft 256, low at the bottom), about `frames`
    columns, 80 dB range, magma colours, stored as an 8-bit palette PNG (a few kB to tens of kB).

    Returns the image's 0 dB level, so a clip's codec images can share the reference's scale (`ref_db`).
    Safe to call from several threads at once (`spectrograms_drawn` does).
    """
    import soundfile
    from PIL import Image

    from octopus_audio.audio_metrics.audio_pair import stft_frames

    audio, _ = soundfile.read(str(wav_path), dtype="float64", always_2d=True)
    x = audio.mean(axis=1)
    hop = max(64, x.size // frames)
    power_db = 10.0 * np.log10(np.abs(stft_frames(x, 256, hop)) ** 2 + 1e-10)
    top = float(power_db.max()) if ref_db is None else ref_db
    index = np.clip(np.round((power_db.T[::-1] - (top - 80.0)) * (255.0 / 80.0)), 0, 255).astype(np.uint8)
    image = Image.fromarray(np.ascontiguousarray(index), mode="P")
    image.putpalette(_magma_palette())
    image.save(png_path, optimize=True)
    return top


def spectrogram_threads() -> int:
    """One spectrogram thread a core this process may run on, at most SPECTROGRAM_THREADS."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(SPECTROGRAM_THREADS, cores))


def _submit_spectrograms(pool: Executor, out_dir: Path, clips: Sequence[dict],
                         jobs: Sequence[tuple]) -> list[Future]:
    """Queue a `spectrogram_png` for each WAV of the run: every clip's input and reference on its own scale,
    then every job's WAV of a clip with a reference on that reference's scale.

    All inputs and references are queued before any job's WAV, so a worker takes a job's WAV only once every
    reference is running or done: waiting there for its reference's level never waits on a queued task (no
    deadlock, with one worker too).
    """
    spec, wav = out_dir / "spec", out_dir / "wav"
    spec.mkdir(parents=True, exist_ok=True)
    _magma_palette()  # built here, so the workers never touch matplotlib

    def draw(name: str, ref: Future | None = None) -> float:
        level = None if ref is None else ref.result()
        return spectrogram_png(wav / name, spec / spectrogram_name(name), level)

    futures, refs = [], {}  # refs: clip id -> its reference's future
    for clip in clips:
        for kind in ("input", "reference"):
            name = wav_name(clip["clip"], kind, None)
            if (wav / name).is_file():
                futures.append(pool.submit(draw, name))
                if kind == "reference":
                    refs[clip["clip"]] = futures[-1]
    for cid, ref in refs.items():
        for job in jobs:
            name = wav_name(cid, *job)
            if (wav / name).is_file():
                futures.append(pool.submit(draw, name, ref))
    return futures


@contextlib.contextmanager
def spectrograms_drawn(out_dir: Path, clips: Sequence[dict], jobs: Sequence[tuple],
                       threads: int | None = None) -> Iterator[None]:
    """Draws every WAV's spectrogram under spec/ on `threads` threads (default `spectrogram_threads()`) while
    the body runs; on exit all are written, or the first failure is raised (the rest cancelled).

    The files are those of one `spectrogram_png` call per WAV in turn, byte for byte: each image depends only
    on its WAV and its clip's reference level.
    """
    threads = threads or spectrogram_threads()
    with ThreadPoolExecutor(threads, thread_name_prefix="spectrogram") as pool:
        futures = _submit_spectrograms(pool, out_dir, clips, jobs)
        log.debug("drawing %d spectrograms on %d threads", len(futures), threads)
        try:
            yield
            for future in futures:
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise
