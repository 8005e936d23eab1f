"""Checkpoint loading: the accepted formats, and one clear UsageError for every kind of bad file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import SHARED

from octopus_audio.aar_patch import load_aar, load_aar_transformer, load_sat
from octopus_audio.aar_patch.aar import AAR, AARConfig
from octopus_audio.errors import UsageError

GOLDEN = SHARED / "aar_reference" / "golden"
TINY = AARConfig(depth=2, embed_dim=32, num_heads=2, cond_dim=16, vocab_size=24, latent_dim=8,
                 patch_nums=(1, 2, 5))


@pytest.fixture(scope="module")
def golden() -> Path:
    if not (GOLDEN / "aar.pth").is_file():
        reason = f"AAR golden files not found under {GOLDEN} (set OCTOPUS_AUDIO_SHARED to ../shared)"
        print(reason)
        pytest.skip(reason)
    return GOLDEN


@pytest.fixture(scope="module")
def tiny_sd() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return AAR(TINY).state_dict()


def save(tmp_path: Path, obj, name: str = "ckpt.pth") -> Path:
    path = tmp_path / name
    torch.save(obj, path)
    return path


def same_weights(model: AAR, sd: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(v, sd[k].to(v.dtype)) for k, v in model.state_dict().items())


@pytest.mark.parametrize("wrap, prefix", [(None, ""), ("model_state_dict", ""),
                                          ("model_state_dict", "module."), (None, "module.")],
                         ids=["plain", "wrapped", "wrapped-module-prefix", "plain-module-prefix"])
def test_accepted_transformer_formats(tmp_path, tiny_sd, wrap, prefix):
    sd = {prefix + k: v for k, v in tiny_sd.items()}
    model = load_aar_transformer(save(tmp_path, {wrap: sd} if wrap else sd))
    assert model.config == TINY and same_weights(model, tiny_sd)


def test_fp16_file_is_cast_to_fp32(tmp_path, tiny_sd):
    half = {k: (v.half() if v.is_floating_point() else v) for k, v in tiny_sd.items()}
    model = load_aar_transformer(save(tmp_path, {"model_state_dict": half}))
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert model.lvl_1L.dtype == torch.int64
    assert same_weights(model, half)


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(UsageError, match=r"transformer checkpoint .*nope\.pth does not exist"):
        load_aar_transformer(tmp_path / "nope.pth")
    with pytest.raises(UsageError, match=r"tokenizer checkpoint .*gone\.pt does not exist"):
        load_sat(tmp_path / "gone.pt")


def test_truncated_file_is_reported(tmp_path, tiny_sd):
    data = save(tmp_path, {"model_state_dict": tiny_sd}).read_bytes()
    cut = tmp_path / "cut.pth"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(UsageError, match=r"cut\.pth.*truncated"):
        load_aar_transformer(cut)


def test_tokenizer_given_as_transformer_and_back(golden):
    with pytest.raises(UsageError, match=r"sat_release\.pt is an AAR tokenizer checkpoint, not a "
                                         r"transformer; pass it with --sat"):
        load_aar_transformer(golden / "sat_release.pt")
    with pytest.raises(UsageError, match=r"aar\.pth is an AAR transformer checkpoint, not a tokenizer; "
                                         r"pass it with --aar"):
        load_sat(golden / "aar.pth")


def test_missing_keys_are_named_with_their_count(tmp_path, tiny_sd):
    sd = {k: v for k, v in tiny_sd.items() if k not in ("head.bias", "blocks.1.attn.q_bias")}
    with pytest.raises(UsageError, match=r"2 missing keys \(blocks\.1\.attn\.q_bias, head\.bias\)"):
        load_aar_transformer(save(tmp_path, sd))


def test_unexpected_keys_are_named_with_their_count(tmp_path, tiny_sd):
    extra = {f"extra.{i}": torch.zeros(1) for i in range(7)}
    with pytest.raises(UsageError, match=r"7 unexpected keys \(extra\.0, extra\.1, extra\.2, extra\.3, "
                                         r"extra\.4, and 2 more\)"):
        load_aar_transformer(save(tmp_path, {**tiny_sd, **extra}))


def test_wrong_shapes_are_named(tmp_path, tiny_sd):
    sd = dict(tiny_sd)
    sd["blocks.1.ffn.fc1.weight"] = torch.zeros(100, 32)
    with pytest.raises(UsageError, match=r"1 wrong shapes \(blocks\.1\.ffn\.fc1\.weight \(100, 32\) "
                                         r"instead of \(128, 32\)\)"):
        load_aar_transformer(save(tmp_path, sd))


def test_keys_that_fix_the_sizes_are_named_when_missing(tmp_path, tiny_sd):
    sd = {k: v for k, v in tiny_sd.items() if k != "word_embed.weight"}
    with pytest.raises(UsageError, match=r"lacks the keys that fix its sizes: word_embed\.weight"):
        load_aar_transformer(save(tmp_path, sd))


@pytest.mark.parametrize("obj, message", [
    (torch.zeros(3), "holds a Tensor, not a state dict"),
    ({"model_state_dict": {}}, "holds no state dict"),
    ({"model_state_dict": {"head.weight": 3}}, "1 entries are not tensors"),
    ({"optimizer": torch.zeros(1)}, "neither an AAR transformer nor an SAT tokenizer"),
], ids=["tensor", "empty", "not-tensors", "foreign"])
def test_files_of_another_kind(tmp_path, obj, message):
    with pytest.raises(UsageError, match=message):
        load_aar_transformer(save(tmp_path, obj))


def test_pipeline_needs_both_files_or_neither_for_the_default(tmp_path, monkeypatch):
    pipe = load_aar(None, None)  # the embedded default model (MODEL_CARD.md)
    config = pipe.aar.config
    assert config.embed_dim // config.num_heads == 64 and tuple(pipe.sat.patch_nums) == config.patch_nums
    import octopus_audio.aar_patch.default_model as default_model

    monkeypatch.setattr(default_model, "default_model_dir", lambda: tmp_path / "absent")
    with pytest.raises(UsageError, match="default model's weights are missing"):
        load_aar(None, None)
    with pytest.raises(UsageError, match="--aar was given without --sat"):
        load_aar(tmp_path / "a.pth", None)


def test_pipeline_from_golden_files(golden):
    pipe = load_aar(golden / "aar.pth", golden / "sat_release.pt")
    assert pipe.aar.config.depth == 2 and tuple(pipe.sat.patch_nums) == pipe.aar.config.patch_nums
    assert pipe.device == torch.device("cpu") and not pipe.training
