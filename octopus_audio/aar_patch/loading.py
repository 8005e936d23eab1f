"""Load AAR checkpoints (released or our own) strictly, with one clear sentence for every kind of bad file.

Accepted formats, for either file: `{"model_state_dict": sd}` (transformer), `{"generator_state_dict": sd}`
(tokenizer), or a plain state dict, as a PyTorch checkpoint (the released `.pth`) or a `.safetensors` file;
keys may carry a `module.` prefix. Floating tensors (fp16 files too) are cast to fp32. The model's sizes are
inferred from the state dict. A model folder (`config.json` and two safetensors files, `model_folder.py`)
loads as one argument; the embedded default model is one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from os import PathLike
from pathlib import Path

import torch

from octopus_audio.errors import UsageError

from .aar import AAR, AARConfig
from .generation import AARPipeline
from .model_folder import CONFIG_FILE, check_config, read_folder, read_weights

log = logging.getLogger(__name__)

_WRAPPERS = {"model_state_dict": "transformer", "generator_state_dict": "tokenizer"}
_TOKENIZER_PREFIXES = ("encoder.", "decoder.", "quantizer.")
_TRANSFORMER_PREFIXES = ("blocks.", "word_embed.", "class_emb.", "head.", "head_nm.", "pos_1LC", "lvl_embed.")
_FLAG = {"transformer": "--aar", "tokenizer": "--sat"}


def read_state_dict(path: str | PathLike, want: str) -> dict[str, torch.Tensor]:
    """Read a checkpoint file and return the plain fp32 state dict of a `want` ('transformer'|'tokenizer')."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"the {want} checkpoint {path} does not exist"
                         + (" (it is a directory)" if path.is_dir() else ""))
    try:
        obj = (read_weights(path) if path.suffix == ".safetensors"
               else torch.load(path, map_location="cpu", weights_only=True))
    except UsageError:
        raise
    except Exception as e:  # torch.load raises many types for truncated or foreign files
        reason = str(e).strip().splitlines()[0].split(". ")[0][:120] if str(e).strip() else "no message"
        raise UsageError(f"could not read {path} as a PyTorch checkpoint; the file is truncated, corrupt or "
                         f"of another kind ({type(e).__name__}: {reason})") from e
    if not isinstance(obj, Mapping):
        raise UsageError(f"{path} holds a {type(obj).__name__}, not a state dict; pass an AAR {want} "
                         f"checkpoint")
    sd = obj
    for key, kind in _WRAPPERS.items():
        if key in obj:
            sd = obj[key]
            _check_kind(kind, want, path)
            break
    if not isinstance(sd, Mapping) or not sd:
        raise UsageError(f"{path} holds no state dict (an empty or non-mapping entry); pass an AAR {want} "
                         f"checkpoint")
    sd = {(k.removeprefix("module.") if isinstance(k, str) else k): v for k, v in sd.items()}
    not_tensors = [str(k) for k, v in sd.items() if not isinstance(v, torch.Tensor)]
    if not_tensors:
        raise UsageError(f"{path} is not a state dict: {len(not_tensors)} entries are not tensors "
                         f"({_first(not_tensors)})")
    _check_kind(_kind_of(sd), want, path)
    return {k: (v.float() if v.is_floating_point() else v) for k, v in sd.items()}


def _kind_of(sd: Mapping[str, torch.Tensor]) -> str:
    if any(k.startswith(_TOKENIZER_PREFIXES) for k in sd):
        return "tokenizer"
    if any(k.startswith(_TRANSFORMER_PREFIXES) for k in sd):
        return "transformer"
    return "unknown"


def _check_kind(kind: str, want: str, path: Path) -> None:
    if kind == "unknown":
        raise UsageError(f"{path} is neither an AAR transformer nor an SAT tokenizer state dict; "
                         f"pass an AAR {want} checkpoint")
    if kind != want:
        raise UsageError(f"{path} is an AAR {kind} checkpoint, not a {want}; pass it with {_FLAG[kind]}")


def _first(items: list[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", and {len(items) - limit} more" if len(items) > limit else "")


def transformer_from_state_dict(sd: Mapping[str, torch.Tensor], source: str = "the state dict") -> AAR:
    """Build the AAR that `sd` describes and load it strictly; problems are one UsageError naming the keys."""
    config = AARConfig.from_state_dict(sd)
    with torch.device("meta"):
        model = AAR(config)  # no allocation, no random init: every tensor comes from `sd`
    expected = model.state_dict()
    missing = [k for k in expected if k not in sd]
    unexpected = [k for k in sd if k not in expected]
    wrong = [f"{k} {tuple(sd[k].shape)} instead of {tuple(v.shape)}" for k, v in expected.items()
             if k in sd and tuple(sd[k].shape) != tuple(v.shape)]
    found = (("missing keys", missing), ("unexpected keys", unexpected), ("wrong shapes", wrong))
    problems = [f"{len(items)} {what} ({_first(items)})" for what, items in found if items]
    if problems:
        raise UsageError(f"{source} does not match the AAR transformer it implies (depth={config.depth}, "
                         f"width={config.embed_dim}, heads={config.num_heads}): " + "; ".join(problems))
    # assign=True swaps the meta tensors for the loaded ones (to_empty on meta would import sympy: 1 s)
    model.load_state_dict({k: v.to(expected[k].dtype).contiguous() for k, v in sd.items()}, strict=True,
                          assign=True)
    return model.eval()


def load_aar_transformer(path: str | PathLike) -> AAR:
    """The transformer of an AAR checkpoint file, in fp32 on the CPU, in eval mode."""
    return transformer_from_state_dict(read_state_dict(path, "transformer"), source=str(path))


def load_sat(path: str | PathLike, patch_nums: tuple[int, ...] | None = None):
    """The SAT tokenizer of a checkpoint file, in fp32 on the CPU, in eval mode."""
    from .sat import SAT

    sd = read_state_dict(path, "tokenizer")
    try:
        return SAT.from_state_dict(sd, patch_nums).eval()
    except UsageError as e:
        raise UsageError(f"{path}: {e}") from e


def load_aar(aar_path: str | PathLike | None = None, sat_path: str | PathLike | None = None,
             device: str | torch.device = "cpu") -> AARPipeline:
    """Load a transformer and its tokenizer as one `AARPipeline` (fp32, eval mode) on `device`.

    `load_aar(None, None)` loads the shipped default model (MODEL_CARD.md); `load_aar(FOLDER)` a model folder
    (`config.json` with the two weight files, as `model_folder.save_model_folder` writes); `load_aar(AAR_FILE,
    SAT_FILE)` two checkpoints (released `.pth` or `.safetensors`).
    """
    if aar_path is None and sat_path is None:
        return _load_default(device)
    if sat_path is None and Path(aar_path).is_dir():
        return load_folder(aar_path, device)
    if aar_path is None or sat_path is None:
        given, absent = ("--aar", "--sat") if sat_path is None else ("--sat", "--aar")
        raise UsageError(f"{given} was given without {absent}; pass both checkpoints, a model folder, or "
                         f"neither for the default model")
    aar = load_aar_transformer(aar_path)
    sat = load_sat(sat_path, aar.config.patch_nums)
    return _pipeline(aar, sat, aar_path, sat_path, device)


def load_folder(folder: str | PathLike, device: str | torch.device = "cpu") -> AARPipeline:
    """A model folder's pipeline; the weights' shapes must imply the configurations its config.json states."""
    mf = read_folder(folder)
    aar = load_aar_transformer(mf.aar_file)
    check_config(mf.aar_config, aar.config, "transformer", mf.aar_file)
    sat = load_sat(mf.sat_file, aar.config.patch_nums)
    check_config(mf.sat_config, sat.config, "tokenizer", mf.sat_file)
    return _pipeline(aar, sat, mf.aar_file, mf.sat_file, device)


def model_patch_nums(aar_path: str | PathLike | None = None,
                     sat_path: str | PathLike | None = None) -> tuple[int, ...]:
    """The scales (tokens per scale) of the model `load_aar(aar_path, sat_path)` loads, read before loading
    it: from `config.json` for the default model and a model folder (cheap), from the transformer's state
    dict for a checkpoint file (read whole, as loading reads it)."""
    if aar_path is None and sat_path is None:
        from .default_model import default_model_dir

        aar_path = default_model_dir()
    if sat_path is None and Path(aar_path).is_dir():
        return read_folder(aar_path).aar_config.patch_nums
    return AARConfig.from_state_dict(read_state_dict(aar_path, "transformer")).patch_nums


def _pipeline(aar: AAR, sat, aar_path, sat_path, device) -> AARPipeline:
    """The two parts as one pipeline, once they are checked to fit together."""
    if sat.latent_dim != aar.config.latent_dim:
        raise UsageError(f"the tokenizer {sat_path} has {sat.latent_dim}-d latents but the transformer "
                         f"{aar_path} reads {aar.config.latent_dim}-d inputs; pass a matching pair")
    codebook = sat.config.codebook_size
    if codebook != aar.config.vocab_size:
        raise UsageError(f"the tokenizer {sat_path} has {codebook}-entry codebooks but the transformer "
                         f"{aar_path} predicts {aar.config.vocab_size} ids; pass a matching pair")
    return AARPipeline(aar, sat).to(device).eval()


def _load_default(device: str | torch.device) -> AARPipeline:
    """The shipped default model: a small AAR-architecture model trained on CC0 audio (MODEL_CARD.md)."""
    from .default_model import default_model_dir

    folder = default_model_dir()
    if not (folder / CONFIG_FILE).is_file():
        raise UsageError(f"the default model's weights are missing ({folder / CONFIG_FILE}); reinstall "
                         f"octopus-audio, or pass --aar and --sat checkpoints of your own")
    log.info("no checkpoint given: loading the embedded default model from %s", folder)
    return load_folder(folder, device)
