"""A model folder: `config.json` and the transformer's and tokenizer's weights as safetensors files.

`config.json`:
```
{"format": "octopus-audio-model", "version": 1,
 "transformer": {"file": "aar.safetensors", "config": {AARConfig fields}},
 "tokenizer": {"file": "sat.safetensors", "config": {SATConfig fields}},
 "default_condition": {"file": "default_condition.npy", "clip": "...", "conditioner": "spectral"}}
```
(`default_condition` is optional: a (1, cond_dim) float32 array that `generate` uses when it is given no
condition, and where it came from). The weights are plain state dicts with the released key names (floating
tensors in any float dtype, cast to fp32 on loading); each file's shapes must imply the configuration that
`config.json` states, or loading stops with one sentence naming the fields that differ.
"""

from __future__ import annotations

import dataclasses
import json
from os import PathLike
from pathlib import Path

import numpy as np
import torch

from octopus_audio.errors import UsageError
from octopus_audio.tensorfile import load_tensors, save_tensors

from .aar import AARConfig
from .sat import SATConfig

CONFIG_FILE = "config.json"
FORMAT = "octopus-audio-model"
VERSION = 1
AAR_FILE = "aar.safetensors"
SAT_FILE = "sat.safetensors"


@dataclasses.dataclass(frozen=True)
class ModelFolder:
    """What a folder's `config.json` says: where each file is and the configurations they must match."""

    root: Path
    aar_file: Path
    sat_file: Path
    aar_config: AARConfig
    sat_config: SATConfig
    default_condition: dict | None

    def condition(self) -> np.ndarray | None:
        """The default condition (1, cond_dim) float32, or None when the folder names none."""
        if self.default_condition is None:
            return None
        path = self.root / self.default_condition["file"]
        try:
            cond = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise UsageError(f"could not read the default condition {path} ({e})") from e
        if cond.shape != (1, self.aar_config.cond_dim) or not np.isfinite(cond).all():
            raise UsageError(f"the default condition {path} must be a finite (1, {self.aar_config.cond_dim}) "
                             f"array, got shape {cond.shape}")
        return cond.astype(np.float32)


def read_folder(path: str | PathLike) -> ModelFolder:
    """Parse and check `path/config.json` (UsageError with one sentence when it is missing or wrong)."""
    root = Path(path)
    config_path = root / CONFIG_FILE
    if not config_path.is_file():
        raise UsageError(f"{root} is a folder without {CONFIG_FILE}; a model folder holds {CONFIG_FILE}, "
                         f"{AAR_FILE} and {SAT_FILE} (or pass --aar FILE --sat FILE checkpoints)")
    try:
        doc = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"could not read {config_path} as JSON ({e})") from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise UsageError(f"{config_path} is not an octopus-audio model config (expected \"format\": "
                         f"\"{FORMAT}\", \"version\": {VERSION})")
    parts = {}
    for key, cls in (("transformer", AARConfig), ("tokenizer", SATConfig)):
        entry = doc.get(key)
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
            raise UsageError(f"{config_path} has no \"{key}\": {{\"file\": ..., \"config\": ...}} entry")
        try:
            config = cls(**entry.get("config", {}))
        except (TypeError, ValueError) as e:
            fields = ", ".join(f.name for f in dataclasses.fields(cls))
            raise UsageError(f"{config_path}: the {key} config is invalid ({e}); its fields are "
                             f"{fields}") from e
        file = _inside(root, entry["file"], f"the {key} weights", config_path)
        if not file.is_file():
            raise UsageError(f"{config_path} names the {key} weights {entry['file']}, which do not exist")
        parts[key] = (file, config)
    cond = doc.get("default_condition")
    if cond is not None and not (isinstance(cond, dict) and isinstance(cond.get("file"), str)):
        raise UsageError(f"{config_path}: \"default_condition\" must be {{\"file\": ..., ...}}")
    if cond is not None:
        _inside(root, cond["file"], "the default condition", config_path)
    return ModelFolder(root, parts["transformer"][0], parts["tokenizer"][0], parts["transformer"][1],
                       parts["tokenizer"][1], cond)


def _inside(root: Path, name: str, what: str, config_path: Path) -> Path:
    """`root / name`, refused (UsageError) unless it lies inside the folder: a model folder is self-contained,
    so its config never reaches files elsewhere (an absolute path, `..`, a link out of the folder)."""
    path = root / name
    if root.resolve() not in path.resolve().parents:
        raise UsageError(f"{config_path} names {what} {name!r}, outside the folder; a model folder's files "
                         f"lie inside it, named relative to it (such as {AAR_FILE})")
    return path


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors (UsageError when the file is not one)."""
    try:
        return load_tensors(path)[0]
    except (OSError, ValueError) as e:
        raise UsageError(f"could not read {path} as a safetensors file: {e}") from e


def check_config(stated, implied, what: str, path: Path) -> None:
    """The configuration the weights imply must be the one config.json states."""
    differ = [f"{f.name} {getattr(stated, f.name)!r} vs {getattr(implied, f.name)!r}"
              for f in dataclasses.fields(stated) if getattr(stated, f.name) != getattr(implied, f.name)]
    if differ:
        raise UsageError(f"{path} does not match the {what} config in {CONFIG_FILE} (stated vs implied by "
                         f"the weights: {'; '.join(differ)})")


def save_model_folder(pipe, folder: str | PathLike, dtype: torch.dtype = torch.float16,
                      default_condition: tuple[np.ndarray, dict] | None = None) -> Path:
    """Write `pipe` (an AARPipeline) as a model folder: floating tensors in `dtype`, config.json, and the
    optional default condition (array (1, cond_dim), description {"clip": ..., "conditioner": ...})."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    def cast(sd: dict) -> dict:
        return {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in sd.items()}

    save_tensors(cast(pipe.aar.state_dict()), folder / AAR_FILE, {"format": FORMAT, "part": "transformer"})
    save_tensors(cast(pipe.sat.state_dict()), folder / SAT_FILE, {"format": FORMAT, "part": "tokenizer"})
    doc = {"format": FORMAT, "version": VERSION,
           "transformer": {"file": AAR_FILE, "config": dataclasses.asdict(pipe.aar.config)},
           "tokenizer": {"file": SAT_FILE, "config": dataclasses.asdict(pipe.sat.config)}}
    if default_condition is not None:
        cond, about = default_condition
        np.save(folder / "default_condition.npy", np.asarray(cond, dtype=np.float32).reshape(1, -1))
        doc["default_condition"] = {"file": "default_condition.npy", **about}
    (folder / CONFIG_FILE).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return folder
