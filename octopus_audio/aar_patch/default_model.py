"""Where the shipped default model lives: a small AAR-architecture model trained on CC0 audio
(MODEL_CARD.md), and the default condition `generate` uses when it is given none."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# The package folder `octopus_audio/default_model/` is a model folder (model_folder.py): config.json,
# aar.safetensors and sat.safetensors (fp16 tensors), and default_condition.npy, the `spectral` embedding of
# a shipped clip (config.json names it; the kind of condition the model was trained on).


def default_model_dir() -> Path:
    """The `octopus_audio/default_model` folder of the installed package (editable installs too)."""
    import octopus_audio

    return Path(octopus_audio.__file__).resolve().parent / "default_model"


def default_paths() -> tuple[Path, Path]:
    """`(aar_path, sat_path)`: the shipped default model's two safetensors files (`load_aar` takes them as a
    pair, `load_sat` the second); FileNotFoundError if the weights are missing."""
    from octopus_audio.errors import UsageError

    from .model_folder import read_folder

    try:
        folder = read_folder(default_model_dir())
    except UsageError as e:
        raise FileNotFoundError(f"the default model's weights are missing or broken ({e}); reinstall "
                                f"octopus-audio, or pass --aar and --sat checkpoints of your own") from e
    return folder.aar_file, folder.sat_file


def default_condition() -> tuple[np.ndarray, str, str]:
    """(condition (1, 512) float32, what it is in words, the file-name stem for outputs)."""
    from octopus_audio.errors import UsageError

    from .model_folder import read_folder

    folder = read_folder(default_model_dir())
    cond = folder.condition()
    if cond is None:
        raise UsageError(f"{folder.root} names no default condition; pass --clip FILE or --cond FILE.npy")
    about = folder.default_condition
    clip = about.get("clip", "?")
    return (cond,
            f"the `{about.get('conditioner', '?')}` embedding of the shipped clip octopus_audio/clips/{clip} "
            f"(pass --clip FILE or --cond FILE.npy for another)", Path(clip).stem)
