"""What an eval row's numbers depend on, by content: sha256 of clips' decoded audio and of checkpoint files.

A row is reused by a rerun only when its clip's audio hash and its run's identity (the model's and the
conditioner's weights, every setting that changes a number, the library version) are the ones it was written
with; eval/runner.py keeps both in each row and the run's fingerprint in `settings.json`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from octopus_audio.eval.sources import ClipRef, decode

_CHUNK = 1 << 20


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes (read in 1 MiB chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_path(path: str | Path) -> str:
    """Hex sha256 of a file, or of a folder: every file under it, by relative path and content, sorted."""
    path = Path(path)
    if not path.is_dir():
        return sha256_file(path)
    h = hashlib.sha256()
    for p in sorted(q for q in path.rglob("*") if q.is_file()):
        h.update(f"{p.relative_to(path).as_posix()}\0{sha256_file(p)}\n".encode())
    return h.hexdigest()


def audio_sha256(audio_T: np.ndarray, sample_rate: int) -> str:
    """Hex sha256 of decoded mono audio: its float32 samples and its sample rate."""
    samples = np.ascontiguousarray(audio_T, dtype=np.float32)
    return hashlib.sha256(samples.tobytes() + f"|{samples.shape}|{int(sample_rate)}".encode()).hexdigest()


def clip_sha256(ref: ClipRef) -> str | None:
    """`audio_sha256` of the clip as the runner decodes it; None when it cannot be decoded (the runner then
    records the load error in its rows)."""
    try:
        clip = decode(ref)
    except Exception:  # the same failure reaches the rows through run_clip, with its message
        return None
    return audio_sha256(clip.audio_T, clip.sample_rate)


def model_identity(aar: str | Path | None, sat: str | Path | None) -> dict[str, str]:
    """sha256 of the checkpoints a run loads: `aar_sha256` and `sat_sha256` (a file or a folder each), or
    `model_sha256` of a model folder (`aar` alone) or of the embedded default model's folder (`aar` None)."""
    if aar is None:
        from octopus_audio.aar_patch.default_model import default_model_dir

        return {"model_sha256": sha256_path(default_model_dir())}
    if sat is None:  # a model folder: config.json and its weights
        return {"model_sha256": sha256_path(aar)}
    return {"aar_sha256": sha256_path(aar), "sat_sha256": sha256_path(sat)}


def digest(obj) -> str:
    """A short (16 hex) sha256 of a JSON-able object, keys sorted: the identity a row carries."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]
