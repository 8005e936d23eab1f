"""Conditioning: 512-d L2-normalised audio embeddings of the 10 s, 48 kHz clip, cached on disk.

Backends (`--clap SPEC`):
- `hf:ID_OR_DIR`: transformers `ClapModel` and its `ClapFeatureExtractor` (the audio half of `ClapProcessor`)
  from a local directory saved with `save_pretrained` or a hub id (the released AAR used
  `laion/larger_clap_general`).
- `laion:FILE[#AMODEL]`: the laion-clap package with a local checkpoint (audio model `HTSAT-base` unless
  given; extra `clap-laion`, which pins numpy below 2).
- `spectral`: the offline stand-in, a deterministic embedding from log-mel statistics. It is not CLAP: a model
  trained on CLAP conditions gets an out-of-distribution condition, so numbers are comparable only with runs
  that used `spectral` too. Reports say which conditioner was used.
- `auto` (the CLI default): `hf:laion/larger_clap_general` when that model is in the local hub cache, else
  `spectral`, with a warning in the log.

Each conditioner has `name`, `fingerprint` (its weights' identity), `clap` (a CLAP model: the eval then also
computes a FAD on its embeddings of the outputs) and `embed(audio_48k_T)`.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from octopus_audio.errors import UsageError
from octopus_audio.eval.identity import sha256_file
from octopus_audio.eval.sources import (
    CLAP_RATE,
    MODEL_RATE,
    Clip,
    check_folder_or_hub_id,
    hub_quiet,
    prepare,
    safe_id,
)

log = logging.getLogger(__name__)

EMBED_DIM = 512
DEFAULT_HF_CLAP = "laion/larger_clap_general"


def l2_normalise(v: np.ndarray, what: str) -> np.ndarray:
    """v / ||v|| as float32 (512,); raises on a wrong size, NaN or a zero vector (never a silent zero)."""
    v = np.asarray(v, dtype=np.float64).reshape(-1)
    if v.size != EMBED_DIM:
        raise ValueError(f"{what} gave a {v.size}-d embedding; AAR is conditioned on {EMBED_DIM}-d "
                         f"CLAP embeddings")
    norm = float(np.linalg.norm(v))
    if not np.isfinite(norm) or norm == 0.0:
        raise ValueError(f"{what} gave an embedding with norm {norm}; cannot normalise it")
    return (v / norm).astype(np.float32)


SPECTRAL_FFT, SPECTRAL_HOP, SPECTRAL_BANDS = 2048, 480, 64


class SpectralConditioner:
    """Deterministic 512-d stand-in: 8 statistics of each of 64 log-mel bands, centred and L2-normalised.

    Log10 mel power (n_fft 2048, hop 480 at 48 kHz, 64 Slaney bands up to 24 kHz, floor 1e-10); per band the
    mean, standard deviation, minimum, 10th / 50th / 90th percentile, maximum and mean absolute frame-to-frame
    change. Similar-sounding clips get nearby vectors, which is all the pipeline needs from it.
    """

    name = "spectral"
    fingerprint = "spectral-v1"
    clap = False  # a stand-in: its embeddings give adherence, not a CLAP FAD

    def embed(self, audio_T: np.ndarray) -> np.ndarray:
        from octopus_audio.audio_metrics.audio_pair import stft_frames
        from octopus_audio.audio_metrics.logmel import mel_filterbank

        x = np.asarray(audio_T, dtype=np.float64)
        # frames after the last nonzero sample (a short clip padded to 10 s) have zero power and a zero mel
        # spectrum: only the frames before are transformed (a 1 s output: 6 ms instead of 41 ms), the same
        # numbers as transforming all (tests/test_eval_conditioning.py)
        frames = 1 + x.size // SPECTRAL_HOP
        nonzero = x[::-1] != 0
        last = x.size - 1 - int(np.argmax(nonzero)) if nonzero.any() else -1  # the last nonzero sample
        # frame t reads samples t * hop - n_fft / 2 .. t * hop + n_fft / 2
        used = min(frames, (last + SPECTRAL_FFT // 2) // SPECTRAL_HOP + 1) if last >= 0 else 0
        mel_FM = np.zeros((frames, SPECTRAL_BANDS))
        if used:
            power = np.abs(stft_frames(x[:used * SPECTRAL_HOP], SPECTRAL_FFT, SPECTRAL_HOP)[:used]) ** 2
            bank = mel_filterbank(CLAP_RATE, SPECTRAL_FFT, SPECTRAL_BANDS)
            mel_FM[:used] = np.einsum("fk,mk->fm", power, bank)
        logmel_FM = np.log10(mel_FM + 1e-10)
        delta = (np.abs(np.diff(logmel_FM, axis=0)).mean(axis=0) if logmel_FM.shape[0] > 1
                 else np.zeros(SPECTRAL_BANDS))
        stats = [logmel_FM.mean(0), logmel_FM.std(0), logmel_FM.min(0),
                 *np.percentile(logmel_FM, [10, 50, 90], axis=0), logmel_FM.max(0), delta]
        v = np.concatenate(stats)
        return l2_normalise(v - v.mean(), self.name)


class HFClapConditioner:
    """transformers `ClapModel.get_audio_features` on `ClapFeatureExtractor` input; loaded on first use."""

    def __init__(self, source: str, device: str = "cpu") -> None:
        check_folder_or_hub_id(source, f"--clap hf:{source}")
        root = Path(source)
        if root.is_dir() and not ((root / "config.json").is_file()
                                  and (any(root.glob("*.safetensors")) or any(root.glob("*.bin")))):
            raise UsageError(f"--clap hf:{source} is a folder without a CLAP model (config.json and "
                             f"*.safetensors or *.bin weights); pass a folder saved with save_pretrained")
        self.source = source
        self.device = device
        self.clap = True
        self.name = f"hf:{source}"
        self._model = None
        self._features = None

    @functools.cached_property
    def fingerprint(self) -> str:
        """The weights' identity (cache folder, eval run fingerprint): see `_hf_fingerprint`."""
        return _hf_fingerprint(self.source)

    def _load(self) -> None:
        try:
            from transformers import ClapFeatureExtractor, ClapModel
        except ModuleNotFoundError as e:
            raise UsageError("`--clap hf:...` needs transformers: "
                             "pip install 'octopus-audio[clap-hf]'") from e
        try:
            with hub_quiet():
                model = ClapModel.from_pretrained(self.source)
                features = ClapFeatureExtractor.from_pretrained(self.source)
        except OSError as e:
            raise UsageError(f"could not load a CLAP model from {self.source!r} ({e}); pass a directory "
                             f"saved with save_pretrained, or a hub id that is reachable or already "
                             f"cached") from e
        self._model = model.eval().to(self.device)
        self._features = features

    def embed(self, audio_T: np.ndarray) -> np.ndarray:
        import torch

        if self._model is None:
            self._load()
        inputs = self._features([np.asarray(audio_T, dtype=np.float32)], sampling_rate=CLAP_RATE,
                                return_tensors="pt")
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        with torch.inference_mode():
            out = self._model.get_audio_features(**inputs)
        emb = out if isinstance(out, torch.Tensor) else out.pooler_output  # transformers 4 vs 5
        return l2_normalise(emb[0].float().cpu().numpy(), self.name)


class LaionClapConditioner:
    """laion-clap `CLAP_Module(enable_fusion=False, amodel=...)` with a checkpoint; loaded on first use."""

    def __init__(self, checkpoint: str, amodel: str = "HTSAT-base", device: str = "cpu") -> None:
        path = Path(checkpoint)
        if not path.is_file():
            raise UsageError(f"CLAP checkpoint {checkpoint!r} does not exist; `--clap laion:FILE` takes a "
                             f"laion-clap .pt checkpoint on disk")
        self.checkpoint = str(path.resolve())
        self.amodel = amodel
        self.device = device
        self.clap = True
        self.name = f"laion:{path.name}#{amodel}"
        self._model = None

    @functools.cached_property
    def fingerprint(self) -> str:
        """The checkpoint's content (sha256) and the audio model: the cache folder, the eval fingerprint."""
        return "laion-" + _short_hash(f"{sha256_file(self.checkpoint)}|{self.amodel}")

    def embed(self, audio_T: np.ndarray) -> np.ndarray:
        if self._model is None:
            try:
                import laion_clap
            except ModuleNotFoundError as e:
                raise UsageError("`--clap laion:...` needs laion-clap: "
                                 "pip install 'octopus-audio[clap-laion]' (it pins numpy below 2; use a "
                                 "separate environment)") from e
            model = laion_clap.CLAP_Module(enable_fusion=False, amodel=self.amodel, device=self.device)
            model.load_ckpt(self.checkpoint, verbose=False)
            self._model = model
        x_BT = np.asarray(audio_T, dtype=np.float32)[None, :]
        return l2_normalise(self._model.get_audio_embedding_from_data(x=x_BT, use_tensor=False)[0], self.name)


def _short_hash(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()[:16]


def _hf_fingerprint(source: str) -> str:
    """The weights' identity by content: a local directory's config and weight files (sha256), or for a hub id
    the revision (commit) the local hub cache holds, else the id alone (a hub id is then trusted by name)."""
    root = Path(source)
    if root.is_dir():
        parts = [f"{p.name}|{sha256_file(p)}" for p in sorted(root.iterdir())
                 if p.name == "config.json" or p.suffix in (".safetensors", ".bin")]
        return "hf-dir-" + _short_hash("\n".join(parts))
    config = _hf_cached_file(source)
    revision = Path(config).parent.name if config else "uncached"
    return "hf-id-" + _short_hash(f"{source}@{revision}")


def _hf_cached_file(model_id: str) -> str | None:
    """The local hub cache's `config.json` of `model_id` (inside its snapshot folder, named by revision), or
    None when it is not cached."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ModuleNotFoundError:
        return None
    try:
        found = try_to_load_from_cache(model_id, "config.json")
    except ValueError:  # not a valid hub id (a path that does not exist, ...)
        return None
    return found if isinstance(found, str) else None


def default_cache_dir() -> Path:
    """Where embeddings are cached by default: `$XDG_CACHE_HOME/octopus-audio/conditioning`, XDG_CACHE_HOME
    defaulting to `~/.cache` (unset or empty) as the XDG base-directory specification says."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "octopus-audio" / "conditioning"


def make_conditioner(spec: str, device: str = "cpu"):
    """The conditioner named by `spec`: `spectral`, `auto`, `hf:ID_OR_DIR` or `laion:FILE[#AMODEL]`."""
    if spec == "spectral":
        return SpectralConditioner()
    if spec == "auto":
        if _hf_cached_file(DEFAULT_HF_CLAP) is not None:
            return HFClapConditioner(DEFAULT_HF_CLAP, device)
        log.warning("no CLAP weights found (%s is not in the local hub cache): conditioning with the offline "
                    "`spectral` stand-in; pass --clap hf:ID_OR_DIR or laion:FILE for real CLAP embeddings",
                    DEFAULT_HF_CLAP)
        return SpectralConditioner()
    kind, _, arg = spec.partition(":")
    if kind == "hf" and arg:
        return HFClapConditioner(arg, device)
    if kind == "laion" and arg:
        file, _, amodel = arg.partition("#")
        return LaionClapConditioner(file, amodel or "HTSAT-base", device)
    raise UsageError(f"unknown --clap {spec!r}; accepted: auto, spectral, hf:HUB_ID_OR_DIR, "
                     f"laion:FILE[#AMODEL]")


def condition_vector(audio_24k: np.ndarray, conditioner) -> np.ndarray:
    """The condition of a whole file as the eval pipeline computes it for a clip: the 24 kHz audio resampled
    to 48 kHz, padded or cropped to 10 s, embedded by `conditioner` (e.g. `make_conditioner("spectral")`)."""
    clip = Clip(clip_id="train", origin="train", audio_T=audio_24k, sample_rate=MODEL_RATE)
    return np.asarray(conditioner.embed(prepare(clip, CLAP_RATE)), dtype=np.float32)


@dataclass
class CachedConditioner:
    """Wraps a conditioner with an on-disk cache keyed by the audio's content hash and the backend's identity.

    Files: `<cache_dir>/<backend name>-<fingerprint>/<sha256 of the float32 samples>.npy`, written atomically,
    so several processes may share one cache.
    """

    inner: object
    cache_dir: Path
    hits: int = field(default=0, init=False)
    misses: int = field(default=0, init=False)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def fingerprint(self) -> str:
        return self.inner.fingerprint

    @property
    def clap(self) -> bool:
        return self.inner.clap

    def path_for(self, audio_T: np.ndarray) -> Path:
        samples = np.ascontiguousarray(audio_T, dtype=np.float32)
        key = hashlib.sha256(samples.tobytes() + str(samples.shape).encode()).hexdigest()
        folder = f"{safe_id(self.inner.name)[:60]}-{self.inner.fingerprint}"
        return Path(self.cache_dir) / folder / f"{key}.npy"

    def embed(self, audio_T: np.ndarray) -> np.ndarray:
        path = self.path_for(audio_T)
        if path.is_file():
            self.hits += 1
            return l2_normalise(np.load(path), f"cache file {path}")
        self.misses += 1
        emb = self.inner.embed(audio_T)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            np.save(f, emb)
        os.replace(tmp, path)
        return emb
