"""Clip sources: the shipped clips/ folder, any folder of audio files, AudioSet-20k streamed by `datasets`.

A source lists `ClipRef`s (cheap: a path or the undecoded bytes); `decode` turns one into a mono `Clip`, and
`prepare` resamples and pads or crops it for a consumer (48 kHz for CLAP, 24 kHz for the model). Decoding is
left to the runner so that one unreadable clip becomes a recorded error instead of stopping the run.
"""

from __future__ import annotations

import contextlib
import io
import logging
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from octopus_audio.errors import UsageError

log = logging.getLogger(__name__)

CLIP_SECONDS = 10.0
CLAP_RATE = 48000
MODEL_RATE = 24000
AUDIOSET_NAME = "audioset-20k"


@dataclass(frozen=True)
class ClipRef:
    """One clip before decoding: a file path or encoded bytes (exactly one), an id and where it came from."""

    clip_id: str
    origin: str
    path: str | None = None
    data: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if (self.path is None) == (self.data is None):
            raise ValueError(f"clip {self.clip_id!r}: give exactly one of path and data")


@dataclass(frozen=True)
class Clip:
    """A decoded clip: mono float32 samples at the file's own rate."""

    clip_id: str
    origin: str
    audio_T: np.ndarray
    sample_rate: int


@dataclass(frozen=True)
class DatasetSpec:
    """Where `audioset-20k` streams from; the defaults are the hub's AudioSet, balanced config, train split.

    `path` is what `datasets.load_dataset` takes first: a hub id or a local folder laid out like one (data
    files plus a README whose `configs:` name `name`). `shuffle_buffer` rows are read ahead for the seeded
    shuffle.
    """

    path: str = "agkphysics/AudioSet"
    name: str | None = "balanced"
    split: str = "train"
    audio_column: str = "audio"
    id_column: str = "video_id"
    shuffle_buffer: int = 1000

    def __post_init__(self) -> None:
        if self.shuffle_buffer < 1:
            raise ValueError(f"shuffle_buffer must be at least 1, got {self.shuffle_buffer}")


def audio_extensions() -> frozenset[str]:
    """File suffixes (lowercase, with the dot) of the formats the installed libsndfile reads."""
    import soundfile

    formats = {k.lower() for k in soundfile.available_formats()}
    exts = {f".{k}" for k in formats}
    if "aiff" in formats:
        exts.add(".aif")
    if "ogg" in formats:
        exts.update({".oga", ".opus"})
    return frozenset(exts)


def safe_id(name: str) -> str:
    """A file-name-safe clip id: path separators become '-', anything but [A-Za-z0-9._-] becomes '_'."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name.replace("/", "-").replace("\\", "-")).strip("._")
    return cleaned or "clip"


def unique_ids(names: list[str]) -> list[str]:
    """One clip id per name, unique in the list: `safe_id(name)`, and for a name whose id is taken, that id
    with the smallest suffix `-2`, `-3`, ... that no other name's id has either (`a-2`, `a`, `a` become
    `a-2`, `a`, `a-3`). Ids are compared ignoring case, since they name files (`refs/<id>.npz`) and some
    file systems do too."""
    bases = [safe_id(name) for name in names]
    taken = {b.lower() for b in bases}
    used: set[str] = set()
    out = []
    for base in bases:
        candidate, n = base, 1
        while candidate.lower() in used or (candidate != base and candidate.lower() in taken):
            n += 1
            candidate = f"{base}-{n}"
        used.add(candidate.lower())
        out.append(candidate)
    return out


def seeded_choice(count: int, n: int, seed: int) -> list[int]:
    """Indices of n items out of count chosen with `random.Random(seed)`, increasing (all if n >= count)."""
    if n <= 0:
        raise UsageError(f"--n must be a positive number of clips, got {n}")
    if n >= count:
        return list(range(count))
    return sorted(random.Random(seed).sample(range(count), n))


def list_folder(folder: str | Path, n: int, seed: int, out: Path | None = None) -> list[ClipRef]:
    """Audio files under `folder` (recursive, sorted by relative path), a seeded choice of n of them. The
    output folder `out` is never read as input: a `folder` inside it is refused, and when it lies inside
    `folder` its files are not listed."""
    root = Path(folder)
    if root.exists() and not root.is_dir():
        raise UsageError(f"--clips {root} is a file; --clips takes a folder of audio files or "
                         f"{AUDIOSET_NAME} (for one clip: octopus-audio generate --clip FILE)")
    if not root.is_dir():
        raise UsageError(f"clips folder {str(root)!r} does not exist; pass a folder of audio files or "
                         f"{AUDIOSET_NAME!r}")
    skip = None if out is None else out.resolve()
    if skip is not None and (root.resolve() == skip or skip in root.resolve().parents):
        raise UsageError(f"--clips {root} lies inside --out {out}: eval never reads its output folder as "
                         f"input; pass a folder of clips outside it")
    exts = audio_extensions()
    files = sorted((p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in exts
                    and (skip is None or skip not in p.resolve().parents)),
                   key=lambda p: p.relative_to(root).as_posix())
    if not files:
        raise UsageError(f"no audio files in {str(root)!r}; readable suffixes here: "
                         f"{', '.join(sorted(exts))}")
    chosen = [files[i] for i in seeded_choice(len(files), n, seed)]
    if len(chosen) < n:
        log.info("%s holds %d audio files, fewer than --n %d: using all of them", root, len(chosen), n)
    ids = unique_ids([p.relative_to(root).with_suffix("").as_posix() for p in chosen])
    return [ClipRef(clip_id=i, origin=str(p), path=str(p)) for i, p in zip(ids, chosen, strict=True)]


HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def check_folder_or_hub_id(spec: str, what: str) -> None:
    """UsageError when `spec` is neither an existing folder nor shaped like a hub id (`name` or
    `namespace/name`): a path that does not exist is named as such, before any network call. `what` names
    the argument in the message (`--dataset PATH`)."""
    if not Path(spec).is_dir() and not HUB_ID.fullmatch(spec):
        raise UsageError(f"{what} is neither a folder nor a hub id (`name` or `namespace/name`); pass an "
                         f"existing folder or a hub id")


@contextlib.contextmanager
def hub_quiet():
    """huggingface_hub's own warnings (HTTP retries) held back while a hub call runs whose failure the caller
    reports in one sentence of its own; errors still show."""
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def load_stream(spec: DatasetSpec):
    """The streaming split, exactly as for the hub: `load_dataset(path, name, split=..., streaming=True)`."""
    check_folder_or_hub_id(spec.path, f"--dataset {spec.path}")
    try:
        import datasets
    except ModuleNotFoundError as e:
        raise UsageError("the audioset-20k source needs the `datasets` package: "
                         "pip install 'octopus-audio[eval,audioset]'") from e
    try:
        with hub_quiet():
            return datasets.load_dataset(spec.path, spec.name, split=spec.split, streaming=True)
    except Exception as e:  # no network, unknown config, ...: one sentence for the user
        raise UsageError(f"could not open dataset {spec.path!r} (config {spec.name!r}, split "
                         f"{spec.split!r}): {type(e).__name__}: {e}; it needs the hub or a local copy in "
                         f"the hub layout (pass its folder with --dataset)") from e


def choose_rows(stream, spec: DatasetSpec, n: int, seed: int) -> list[ClipRef]:
    """n rows of an opened stream: seeded shuffle (shard order and a `shuffle_buffer`-row buffer), first n.

    The audio column is cast to `Audio(decode=False)`, so rows carry the encoded bytes and soundfile decodes
    them later; no audio backend of `datasets` is involved. The choice is reproducible for a given seed and
    dataset revision; it is a uniform draw over the split only when the buffer is at least the split size.
    """
    from datasets import Audio

    if n <= 0:
        raise UsageError(f"--n must be a positive number of clips, got {n}")
    stream = stream.cast_column(spec.audio_column, Audio(decode=False))
    stream = stream.shuffle(seed=seed, buffer_size=spec.shuffle_buffer)
    names, refs = [], []
    for i, row in enumerate(stream.take(n)):
        audio = row[spec.audio_column]
        name = str(row.get(spec.id_column) or Path(audio.get("path") or f"row{i:05d}").stem)
        origin = f"{spec.path}:{spec.name}:{spec.split}:{name}"
        names.append(name)
        if audio.get("bytes") is not None:
            refs.append((origin, None, audio["bytes"]))
        elif audio.get("path"):
            refs.append((origin, audio["path"], None))
        else:
            raise UsageError(f"dataset row {name!r} has neither audio bytes nor a path in column "
                             f"{spec.audio_column!r}")
    if not refs:
        raise UsageError(f"dataset {spec.path!r} split {spec.split!r} yielded no rows")
    ids = unique_ids(names)
    return [ClipRef(clip_id=i, origin=o, path=p, data=d) for i, (o, p, d) in zip(ids, refs, strict=True)]


def list_clips(source: str, n: int, seed: int, dataset: DatasetSpec | None = None,
               out: Path | None = None) -> list[ClipRef]:
    """`audioset-20k` (streamed per `dataset`) or a folder of audio files (never those of the output folder
    `out`); a seeded choice of n clips."""
    if source == AUDIOSET_NAME:
        spec = dataset or DatasetSpec()
        return choose_rows(load_stream(spec), spec, n, seed)
    return list_folder(source, n, seed, out)


def decode(ref: ClipRef) -> Clip:
    """Decode with soundfile, average the channels to mono. Raises on unreadable or empty audio."""
    import soundfile

    source = ref.path if ref.path is not None else io.BytesIO(ref.data)
    audio, rate = soundfile.read(source, dtype="float32", always_2d=True)
    if audio.shape[0] == 0:
        raise ValueError(f"clip {ref.clip_id!r} has no samples")
    mono = audio.mean(axis=1, dtype=np.float64).astype(np.float32)
    if not np.all(np.isfinite(mono)):
        raise ValueError(f"clip {ref.clip_id!r} has non-finite samples")
    return Clip(clip_id=ref.clip_id, origin=ref.origin, audio_T=mono, sample_rate=int(rate))


def resample(x_T: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Band-limited resampling with soxr (`VHQ`), float32 out; the signal unchanged when the rates match."""
    if rate_in == rate_out:
        return np.asarray(x_T, dtype=np.float32)
    try:
        import soxr
    except ModuleNotFoundError as e:
        raise UsageError("resampling clips needs the `soxr` package: "
                         "pip install 'octopus-audio[eval]'") from e
    x = np.asarray(x_T, dtype=np.float64)
    return soxr.resample(x, rate_in, rate_out, quality="VHQ").astype(np.float32)


def fit_length(x_T: np.ndarray, length: int) -> np.ndarray:
    """The first `length` samples, zero-padded at the end when the signal is shorter."""
    if x_T.shape[0] >= length:
        return x_T[:length].copy()
    return np.pad(x_T, (0, length - x_T.shape[0]))


def prepare(clip: Clip, rate: int, seconds: float = CLIP_SECONDS) -> np.ndarray:
    """The clip at `rate`, padded or cropped to `seconds` (float32, shape (round(rate*seconds),))."""
    return fit_length(resample(clip.audio_T, clip.sample_rate, rate), int(round(rate * seconds)))


def read_mono_24k(path: Path) -> np.ndarray:
    """A file as the model hears it: float32 mono at 24 kHz (`decode`'s channel mean, `resample`), scaled
    down only where the peak exceeds 0.999 (as the shipped clips were). What `octopus-audio train` packs."""
    clip = decode(ClipRef(clip_id=path.stem, origin=str(path), path=str(path)))
    x_T = resample(clip.audio_T, clip.sample_rate, MODEL_RATE)
    peak = float(np.abs(x_T).max(initial=0.0))
    return (x_T * (0.999 / peak) if peak > 0.999 else x_T).astype(np.float32)
