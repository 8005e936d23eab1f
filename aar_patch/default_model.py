"""Where the shipped default model lives: a small AAR-architecture model trained on CC0 audio
(MODEL_CARD.md)."""

from __future__ import annotations

from pathlib import Path

# The package folder `octopus_audio/default_model/` holds the two checkpoints in the released format
# (`sat.pth`: {"generator_state_dict": ...}, `aar.pth`: {"model_state_dict": ...}, fp16 tensors).
SAT_FILE = "sat.pth"
AAR_FILE = "aar.pth"


def default_model_dir() -> Path:
    """The `octopus_audio/default_model` folder of the installed package (editable installs too)."""
    import octopus_audio

    return Path(octopus_audio.__file__).resolve().parent / "default_model"


def default_paths() -> tuple[Path, Path]:
    """`(aar_path, sat_path)` of the shipped default model; FileNotFoundError if the weights are missing."""
    folder = default_model_dir()
    aar_path, sat_path = folder / AAR_FILE, folder / SAT_FILE
    missing = [str(p) for p in (aar_path, sat_path) if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"the default model's weights are missing ({', '.join(missing)}); reinstall octopus-audio, "
            f"or pass --aar and --sat checkpoints of your own")
    return aar_path, sat_path
