"""The safetensors reader and writer (octopus_audio.tensorfile) and model folders (config.json + weights):
round trips, agreement with the official `safetensors` package both ways, one clear error per bad file."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch

from octopus_audio.errors import UsageError
from octopus_audio.tensorfile import load_tensors, save_tensors


def odd_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {"w.f32": torch.randn(3, 5, generator=g), "w.f16": torch.randn(7, generator=g).half(),
            "w.bf16": torch.randn(2, 1, 3, generator=g).bfloat16(),
            "w.f64": torch.randn(1, generator=g).double(),
            "ids": torch.arange(11, dtype=torch.int64).reshape(11, 1),
            "i32": torch.tensor([-5, 7], dtype=torch.int32),
            "mask": torch.tensor([True, False, True]), "bytes": torch.arange(256, dtype=torch.uint8),
            "i8": torch.tensor([-128, 127], dtype=torch.int8),
            "i16": torch.tensor([[-300]], dtype=torch.int16), "scalar": torch.tensor(2.5),
            "empty": torch.zeros(0, 4),
            "strided": torch.randn(4, 6, generator=g)[:, ::2]}


def test_round_trip_keeps_dtype_shape_and_bits(tmp_path):
    tensors = odd_tensors()
    save_tensors(tensors, tmp_path / "x.safetensors", {"note": "hi"})
    back, meta = load_tensors(tmp_path / "x.safetensors")
    assert meta == {"note": "hi"} and set(back) == set(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape, name
        assert torch.equal(back[name], t), name
    raw = (tmp_path / "x.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0 and json.loads(raw[8:8 + n])["w.f16"]["dtype"] == "F16"


def test_agrees_with_the_official_package_both_ways(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    tensors = {k: v.contiguous() for k, v in odd_tensors().items()}
    save_tensors(tensors, tmp_path / "ours.safetensors", {"a": "b"})
    theirs = st.load_file(str(tmp_path / "ours.safetensors"))
    assert set(theirs) == set(tensors) and all(torch.equal(theirs[k], v) for k, v in tensors.items())
    st.save_file(tensors, str(tmp_path / "theirs.safetensors"), metadata={"c": "d"})
    back, meta = load_tensors(tmp_path / "theirs.safetensors")
    assert meta == {"c": "d"} and all(torch.equal(back[k], v) for k, v in tensors.items())


def _file(tmp_path, header: dict | bytes, buffer: bytes = b"", length: int | None = None):
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + buffer)
    return path


F32_2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


def _short(tmp_path):
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"abc")
    return path


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing.safetensors", "No such file"),
    (_short, "too short"),
    (lambda p: _file(p, {"x": F32_2}, bytes(8), length=10_000), "exceeds the file"),
    (lambda p: _file(p, b"{not json"), "header is not JSON"),
    (lambda p: _file(p, b"[1, 2]"), "not a JSON object"),
    (lambda p: _file(p, {"x": {"dtype": "F12", "shape": [2], "data_offsets": [0, 8]}}, bytes(8)),
     "malformed entry"),
    (lambda p: _file(p, {"x": {**F32_2, "data_offsets": [0, 12]}}, bytes(12)), "does not fit its offsets"),
    (lambda p: _file(p, {"x": F32_2, "y": {**F32_2, "data_offsets": [4, 12]}}, bytes(12)), "overlap"),
    (lambda p: _file(p, {"x": F32_2}, bytes(12)), "4 bytes after the last tensor"),
], ids=["missing", "short", "header-length", "not-json", "not-object", "dtype", "offsets", "overlap",
        "trailing"])
def test_bad_files_raise_one_clear_error(tmp_path, make, message):
    with pytest.raises((ValueError, OSError), match=message):
        load_tensors(make(tmp_path))


def test_writer_refuses_what_the_format_cannot_hold(tmp_path):
    with pytest.raises(ValueError, match="cannot store 'c'"):
        save_tensors({"c": torch.zeros(2, dtype=torch.complex64)}, tmp_path / "c.safetensors")
    with pytest.raises(ValueError, match="strings to strings"):
        save_tensors({"x": torch.zeros(1)}, tmp_path / "m.safetensors", {"n": 1})


# --- model folders -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_pipe():
    from test_eval_perturbation import tiny_pipe as random_tiny_pipe

    return random_tiny_pipe()  # 2 layers, head dim 32, scales 1, 2, 4, 8, vocabulary 256


def test_a_saved_folder_loads_the_same_pipeline(tiny_pipe, tmp_path):
    from octopus_audio.aar_patch import load_aar
    from octopus_audio.aar_patch.model_folder import read_folder, save_model_folder

    cond = np.linspace(-1, 1, 512, dtype=np.float32)[None]
    save_model_folder(tiny_pipe, tmp_path / "m", torch.float32,
                      (cond, {"clip": "x.flac", "conditioner": "c"}))
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [
        "aar.safetensors", "config.json", "default_condition.npy", "sat.safetensors"]
    pipe = load_aar(tmp_path / "m")
    assert pipe.aar.config == tiny_pipe.aar.config and pipe.sat.config == tiny_pipe.sat.config
    want = tiny_pipe.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in pipe.state_dict().items())
    assert np.array_equal(read_folder(tmp_path / "m").condition(), cond)
    # the two weight files also load as a pair, and a half-precision folder loads to fp32
    pair = load_aar(tmp_path / "m" / "aar.safetensors", tmp_path / "m" / "sat.safetensors")
    assert all(torch.equal(v, want[k]) for k, v in pair.state_dict().items())
    save_model_folder(tiny_pipe, tmp_path / "h")
    half = load_aar(str(tmp_path / "h"))
    assert {p.dtype for p in half.parameters()} == {torch.float32}
    assert all(torch.equal(v, want[k].half().to(v.dtype)) for k, v in half.state_dict().items()
               if v.is_floating_point())
    assert read_folder(tmp_path / "h").condition() is None


def _edit_config(folder, edit):
    doc = json.loads((folder / "config.json").read_text())
    edit(doc)
    (folder / "config.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["transformer"]["config"].update(depth=3), r"does not match the transformer config in "
                                                           r"config.json \(stated vs implied by the weights: "
                                                           r"depth 3 vs 2\)"),
    (lambda d: d["tokenizer"]["config"].update(n_filters=8), "does not match the tokenizer config"),
    (lambda d: d["transformer"]["config"].update(heads=2), "the transformer config is invalid"),
    (lambda d: d["transformer"]["config"].update(depth=0), "the transformer config is invalid"),
    (lambda d: d.update(format="other"), "is not an octopus-audio model config"),
    (lambda d: d["tokenizer"].update(file="nowhere.safetensors"), "nowhere.safetensors, which do not exist"),
    (lambda d: d.pop("tokenizer"), 'has no "tokenizer"'),
], ids=["depth", "tokenizer-width", "unknown-field", "invalid-value", "format", "missing-file", "no-entry"])
def test_a_folder_whose_config_disagrees_is_refused(tiny_pipe, tmp_path, edit, message):
    from octopus_audio.aar_patch import load_aar
    from octopus_audio.aar_patch.model_folder import save_model_folder

    folder = save_model_folder(tiny_pipe, tmp_path / "m")
    _edit_config(folder, edit)
    with pytest.raises(UsageError, match=message):
        load_aar(folder)


def test_folder_errors_through_the_cli(tiny_pipe, tmp_path, capsys):
    from octopus_audio.aar_patch.model_folder import save_model_folder
    from octopus_audio.cli import main

    (tmp_path / "empty").mkdir()
    assert main(["generate", "--aar", str(tmp_path / "empty"), "--cond", str(tmp_path / "c.npy"),
                 "--out", str(tmp_path / "o")]) == 2
    assert "c.npy does not exist" in capsys.readouterr().err
    np.save(tmp_path / "c.npy", np.ones((1, 512), dtype=np.float32) / 512**0.5)
    assert main(["generate", "--aar", str(tmp_path / "empty"), "--cond", str(tmp_path / "c.npy"),
                 "--out", str(tmp_path / "o")]) == 2
    assert "is a folder without config.json" in capsys.readouterr().err
    folder = save_model_folder(tiny_pipe, tmp_path / "m")
    (folder / "sat.safetensors").write_bytes(b"\x08" + bytes(7) + b"garbage!")
    assert main(["generate", "--aar", str(folder), "--cond", str(tmp_path / "c.npy"),
                 "--out", str(tmp_path / "o")]) == 2
    assert "could not read" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_generate_and_eval_take_a_folder(tiny_pipe, tmp_path, capsys):
    from octopus_audio.aar_patch.model_folder import save_model_folder
    from octopus_audio.cli import main
    from octopus_audio.eval.cli import check_model_paths, model_name

    folder = save_model_folder(tiny_pipe, tmp_path / "tiny")
    cond = tmp_path / "c.npy"
    np.save(cond, np.ones((1, 512), dtype=np.float32) / 512**0.5)
    assert main(["generate", "--aar", str(folder), "--cond", str(cond), "--codec", "octopus", "--bits", "2",
                 "--sink-scales", "0", "--device", "cpu", "--out", str(tmp_path / "o")]) == 0
    assert "kv cache [octopus b=2 W=1, 2 layers, 15 tokens (8 native)]" in capsys.readouterr().out
    check_model_paths(str(folder), None)  # a folder alone is accepted
    assert model_name(str(folder), None) == "tiny"
    with pytest.raises(UsageError, match="--aar alone naming a model folder"):
        check_model_paths(str(folder / "aar.safetensors"), None)
