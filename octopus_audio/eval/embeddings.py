"""Per-output embeddings of the eval's distribution metrics, and the file each output's are kept in.

Kinds (`EMBEDDINGS`, what each FAD of the report is computed on):
- `latent`: the run's own tokenizer's encoder frames, `sat.encode_latent(audio)` (the continuous latents
  before quantization, as fadtk's EnCodec embedding takes EnCodec's): (75, C) an output of the default model,
  one C-dimensional vector per latent frame. Computed where the model is (`Backend.latents`).
- `spectral`: the log-mel metric's frames (`audio_metrics.logmel.log_mel`: 80 Slaney bands of |STFT|, n_fft
  1024, hop 256 at 24 kHz, natural log floored at 1e-5): (94, 80) an output.
- `clap` (only when the run's conditioner is a CLAP model): its embedding of the output, one 512-d vector.

Each output's conditioner embedding (`conditioner_vector`: the output embedded as a clip is, at 48 kHz padded
to 10 s) also gives its condition adherence (`adherence`: the cosine with its clip's condition). The
conditioner embeds outputs without the on-disk cache of clip conditions (`uncached`): outputs are not reused.

Files: `emb/<clip>__<row>__d<draw>.npz` (`embedding_path`), float32 arrays `latent`, `spectral` and `cond`
and the row identity they were computed for; the report reads them back only for that identity.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from octopus_audio.audio_metrics.logmel import log_mel
from octopus_audio.eval.run_files import wav_name

LATENT, SPECTRAL, CLAP = "latent", "spectral", "clap"
OFFLINE_EMBEDDINGS = (LATENT, SPECTRAL)  # computed for every run
EMBEDDINGS_DIR = "emb"
_COND = "cond"  # the file's conditioner embedding (CLAP's FAD vector when the conditioner is CLAP)


def embeddings_of(conditioner_is_clap: bool) -> tuple[str, ...]:
    """The FAD embeddings of a run: the offline two, and `clap` when the conditioner is a CLAP model."""
    return OFFLINE_EMBEDDINGS + ((CLAP,) if conditioner_is_clap else ())


def spectral_frames(audio_T: np.ndarray, sample_rate: int) -> np.ndarray:
    """(frames, 80) float32: the log-mel metric's frames of one output."""
    return log_mel(np.asarray(audio_T, dtype=np.float64).reshape(-1), sample_rate).astype(np.float32)


def uncached(conditioner):
    """The conditioner without the on-disk cache (`conditioning.CachedConditioner`) that clip conditions go
    through: eval outputs are embedded once and not kept."""
    from octopus_audio.eval.conditioning import CachedConditioner

    return conditioner.inner if isinstance(conditioner, CachedConditioner) else conditioner


def conditioner_vector(audio_T: np.ndarray, conditioner) -> np.ndarray:
    """(512,) float32: an output (24 kHz) embedded as the eval embeds a clip's condition."""
    from octopus_audio.eval.conditioning import condition_vector

    return condition_vector(np.asarray(audio_T, dtype=np.float32).reshape(-1), uncached(conditioner))


def adherence(vector_D: np.ndarray, cond_D: np.ndarray) -> float:
    """Cosine similarity of an output's conditioner embedding with its clip's condition (1: the same
    direction; the reference's own value is what a codec's is read against)."""
    v, c = np.asarray(vector_D, dtype=np.float64), np.asarray(cond_D, dtype=np.float64)
    norm = float(np.linalg.norm(v) * np.linalg.norm(c))
    if not np.isfinite(norm) or norm == 0.0:
        raise ValueError(f"condition adherence of vectors with norms {np.linalg.norm(v)} and "
                         f"{np.linalg.norm(c)}")
    return float(v @ c) / norm


def embedding_path(clip_id: str, job: tuple, draw: int) -> str:
    """`emb/<clip>__<row as its WAV is named>__d<draw>.npz` (`job`: the row's `records.Job`), relative to the
    run folder."""
    return f"{EMBEDDINGS_DIR}/{wav_name(clip_id, *job)[:-4]}__d{draw}.npz"


def save_embeddings(out_dir: Path, relative: str, identity: str, latent_TC: np.ndarray,
                    spectral_FM: np.ndarray, cond_D: np.ndarray) -> None:
    """One output's embeddings, written atomically (tmp file, then rename)."""
    path = out_dir / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
    np.savez(tmp, **{LATENT: np.asarray(latent_TC, dtype=np.float32),
                     SPECTRAL: np.asarray(spectral_FM, dtype=np.float32),
                     _COND: np.asarray(cond_D, dtype=np.float32), "identity": np.array(identity)})
    os.replace(tmp, path)


def load_embeddings(out_dir: Path, relative: str, identity: str) -> dict[str, np.ndarray]:
    """{latent, spectral, clap: the conditioner vector} of one output; ValueError when the file is missing
    or was written for another row identity (its row is then not counted, never read as another's)."""
    path = out_dir / relative
    try:
        with np.load(path) as f:
            if str(f["identity"]) != identity:
                raise ValueError(f"{path} was written by another run or for other audio")
            return {LATENT: f[LATENT], SPECTRAL: f[SPECTRAL], CLAP: f[_COND]}
    except (OSError, KeyError) as e:
        raise ValueError(f"{path} cannot be read ({type(e).__name__}: {e})") from e
