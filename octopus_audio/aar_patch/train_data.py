"""Training data for the default model: CC0 files of Debian's sonic-pi-samples (chosen by the package's
copyright file), any folder of audio, packed into .npy arrays that a machine without audio libraries reads,
and random 1 s crops drawn from them. Reading and embedding the audio is the caller's (`eval/train_cli.py`:
`eval.sources.read_mono_24k`, `eval.conditioning.condition_vector`)."""

from __future__ import annotations

import fnmatch
import json
import logging
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger(__name__)

SAMPLE_RATE = 24000
CROP_SAMPLES = 24000  # 1 s, the AAR tokenizer's window (75 latent frames)
SONIC_PI_PACKAGE = "sonic-pi-samples"
SONIC_PI_SAMPLES = Path("/usr/share/sonic-pi/samples")
SONIC_PI_COPYRIGHT = Path("/usr/share/doc/sonic-pi-samples/copyright")
SONIC_PI_SOURCE_DIR = "etc/samples"  # where the copyright file's `Files:` globs put the samples
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".aiff", ".aif", ".mp3")

# Held out from training, kept for the model card's reconstruction figures and scripts/check_conditioning.py:
# 16 CC0 sonic-pi samples, one or two per family, chosen by hand (length >= 0.4 s) before any training.
# Shipped clips cut from one of these files are not trained on either (see `clip_sources`).
HELD_OUT = (
    "ambi_drone", "ambi_piano", "bass_hit_c", "bass_thick_c", "bd_boom", "drum_cymbal_open",
    "drum_snare_hard", "drum_tom_mid_hard", "elec_chime", "elec_lo_snare", "guit_harmonics",
    "loop_breakbeat", "loop_mika", "perc_till", "tabla_ghe5", "vinyl_rewind",
)


# --- licenses ---------------------------------------------------------------------------------------------

def parse_dep5(text: str) -> list[tuple[list[str], str]]:
    """The `(globs, license)` of each `Files:` paragraph of a Debian machine-readable copyright file, in
    order."""
    rules = []
    for paragraph in text.split("\n\n"):
        fields: dict[str, str] = {}
        current = None
        for line in paragraph.splitlines():
            if line[:1] in (" ", "\t"):
                if current is not None:
                    fields[current] += "\n" + line.strip()
            elif ":" in line:
                current, value = line.split(":", 1)
                fields[current] = value.strip()
        if "Files" in fields and "License" in fields:
            rules.append((fields["Files"].split(), fields["License"].splitlines()[0].strip()))
    return rules


def license_of(rules: list[tuple[list[str], str]], source_path: str) -> str | None:
    """The license DEP-5 gives `source_path`: the last paragraph whose globs match it wins."""
    found = None
    for globs, license_name in rules:
        if any(fnmatch.fnmatchcase(source_path, g) for g in globs):
            found = license_name
    return found


def sonic_pi_cc0_files(samples_dir: Path = SONIC_PI_SAMPLES,
                       copyright_path: Path = SONIC_PI_COPYRIGHT) -> list[Path]:
    """The sample files whose own entry in the package's copyright file says CC0, sorted by name."""
    rules = parse_dep5(copyright_path.read_text(encoding="utf-8"))
    return [p for p in sorted(samples_dir.iterdir())
            if p.suffix in AUDIO_SUFFIXES and license_of(rules, f"{SONIC_PI_SOURCE_DIR}/{p.name}") == "CC0"]


def install_sonic_pi(dest: Path) -> tuple[Path, Path]:
    """`(samples_dir, copyright_path)` of sonic-pi-samples: the system's copy when installed, else the package
    fetched with `apt-get download` and unpacked under `dest` with `dpkg -x` (no root needed)."""
    if SONIC_PI_SAMPLES.is_dir() and SONIC_PI_COPYRIGHT.is_file():
        return SONIC_PI_SAMPLES, SONIC_PI_COPYRIGHT
    root = dest / "sonic-pi-samples"
    samples = root / SONIC_PI_SAMPLES.relative_to("/")
    copyright_path = root / SONIC_PI_COPYRIGHT.relative_to("/")
    if not samples.is_dir():
        if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
            raise RuntimeError("sonic-pi-samples is not installed and this system has no apt-get/dpkg to "
                               "fetch it; install the Debian package or pass a folder of audio with --data")
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(["apt-get", "download", SONIC_PI_PACKAGE], cwd=tmp, check=True)
            (deb,) = Path(tmp).glob("sonic-pi-samples_*.deb")
            subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    return samples, copyright_path


def clip_sources(clips_dir: Path) -> dict[str, str]:
    """Map each shipped clip's file name to the stem of the sonic-pi sample it was cut from, read from the
    clips folder's attribution (any line that names both the clip and a `<stem>.flac`)."""
    sources: dict[str, str] = {}
    names = [p.name for p in sorted(clips_dir.iterdir()) if p.suffix in AUDIO_SUFFIXES]
    text = "\n".join(p.read_text(encoding="utf-8", errors="replace")
                     for p in sorted(clips_dir.iterdir()) if p.suffix in (".md", ".txt", ".json", ".csv"))
    for name in names:
        stem = Path(name).stem
        for line in text.splitlines():
            if stem in line and ".flac" in line:
                for word in line.replace("/", " ").replace("`", " ").replace('"', " ").split():
                    if word.endswith(".flac") and Path(word).stem != stem:
                        sources[name] = Path(word).stem
                    elif word.endswith(".flac"):
                        sources.setdefault(name, stem)
    return sources


# --- audio ------------------------------------------------------------------------------------------------

def list_audio(folder: Path) -> list[Path]:
    """Audio files directly inside `folder`, sorted."""
    return [p for p in sorted(folder.iterdir()) if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES]


# --- packed arrays ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PackedAudio:
    """Every file's 24 kHz mono samples end to end (`audio`, float16), file i at `offsets[i]:offsets[i+1]`,
    its condition vector `cond[i]` (float32, (N, D)) and name."""

    audio: np.ndarray
    offsets: np.ndarray
    cond: np.ndarray
    names: tuple[str, ...]

    def __post_init__(self) -> None:
        n = len(self.names)
        if (self.offsets.shape != (n + 1,) or self.cond.shape[0] != n
                or int(self.offsets[-1]) != len(self.audio)):
            raise ValueError(f"inconsistent packed data: {n} names, offsets {self.offsets.shape}, cond "
                             f"{self.cond.shape}, {len(self.audio)} samples (offsets[-1] must equal that)")
        if n == 0:
            raise ValueError("packed data holds no files; give at least one audio file")

    def clip(self, i: int) -> np.ndarray:
        return self.audio[self.offsets[i]: self.offsets[i + 1]].astype(np.float32)


def pack(names: list[str], clips: list[np.ndarray], cond: np.ndarray, out_dir: Path) -> PackedAudio:
    """Write `audio.npy` (float16), `offsets.npy`, `cond.npy`, `names.json` under `out_dir` and return
    them."""
    out_dir.mkdir(parents=True, exist_ok=True)
    offsets = np.concatenate([[0], np.cumsum([len(c) for c in clips])]).astype(np.int64)
    data = PackedAudio(np.concatenate(clips).astype(np.float16), offsets, np.asarray(cond, np.float32),
                       tuple(names))
    np.save(out_dir / "audio.npy", data.audio)
    np.save(out_dir / "offsets.npy", data.offsets)
    np.save(out_dir / "cond.npy", data.cond)
    (out_dir / "names.json").write_text(json.dumps(list(names), indent=0))
    return data


def load_packed(folder: Path) -> PackedAudio:
    """Read what `pack` wrote (numpy only: runs where soundfile and librosa are missing)."""
    files = ("audio.npy", "offsets.npy", "cond.npy", "names.json")
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} is not a packed training folder (missing {', '.join(missing)}); "
                                f"make one with `octopus-audio train --sonic-pi --prepare-only --packed "
                                f"{folder}`")
    return PackedAudio(np.load(folder / "audio.npy"), np.load(folder / "offsets.npy"),
                       np.load(folder / "cond.npy"), tuple(json.loads((folder / "names.json").read_text())))


def sample_crops(data: PackedAudio, batch: int, generator: torch.Generator,
                 crop: int = CROP_SAMPLES) -> tuple[torch.Tensor, torch.Tensor]:
    """`(audio_B1N, file_B)`: `batch` files drawn uniformly, each a random `crop`-sample window
    (zero-padded at the end when the file is shorter), all randomness from `generator`."""
    file_B = torch.randint(len(data.names), (batch,), generator=generator)
    u_B = torch.rand(batch, generator=generator, dtype=torch.float64)
    audio_BN = np.zeros((batch, crop), np.float32)
    for b, i in enumerate(file_B.tolist()):
        lo, hi = int(data.offsets[i]), int(data.offsets[i + 1])
        start = lo + int(u_B[b] * (max(hi - lo - crop, 0) + 1))
        piece = data.audio[start: min(start + crop, hi)]
        audio_BN[b, : len(piece)] = piece
    return torch.from_numpy(audio_BN).unsqueeze(1), file_B
