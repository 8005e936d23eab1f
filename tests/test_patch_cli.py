"""`octopus-audio generate --codec C --bits B [--compare]`: WAVs, accounting and metrics lines, errors."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import SHARED

from octopus_audio.cli import main
from octopus_audio.outdir import MANIFEST, add_to_manifest, read_manifest

GOLDEN = SHARED / "aar_reference" / "golden"


@pytest.fixture(scope="module")
def cond(tmp_path_factory) -> Path:
    if not (GOLDEN / "io.pt").is_file():
        reason = f"AAR golden files not found under {GOLDEN} (set OCTOPUS_AUDIO_SHARED to ../shared)"
        print(reason)
        pytest.skip(reason)
    path = tmp_path_factory.mktemp("cond") / "c.npy"
    np.save(path, torch.load(GOLDEN / "io.pt", weights_only=True)["cond"][:1].numpy())
    return path


def argv(cond: Path, out: Path, *extra: str) -> list[str]:
    return ["generate", "--aar", str(GOLDEN / "aar.pth"), "--sat", str(GOLDEN / "sat_release.pt"), "--device",
            "cpu", "--cond", str(cond), "--out", str(out), "--top-k", "1", *extra]


def test_compare_writes_the_reference_beside_and_prints_metrics(cond, tmp_path, capsys):
    latents = tmp_path / "lat.pt"
    assert main(argv(cond, tmp_path / "o", "--codec", "octopus", "--bits", "2", "--compare",
                     "--save-latents", str(latents), "--sink-scales", "0")) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [MANIFEST, "c_000_seed42_none.wav",
                                                                   "c_000_seed42_octopus-b2.wav"]
    assert read_manifest(tmp_path / "o") == {MANIFEST, "c_000_seed42_none.wav", "c_000_seed42_octopus-b2.wav"}
    header = r"kv cache \[octopus b=2 W=1, 2 layers, 455 tokens \(75 native\)\]: "
    assert re.search(header + r".* 1\.98x \(4\.74x on the store\)", out), out
    m = re.search(r"compare octopus b=2 vs uncompressed \(1 row\): LSD (\S+) dB, SNR (\S+) dB, "
                  r"latent cosine (\S+)", out)
    assert m, out
    lsd, snr, cos = map(float, m.groups())
    assert lsd > 0 and snr < 120 and -1 <= cos < 1  # the compressed run differs from the reference
    assert torch.load(latents, weights_only=True)["fhat"].shape == (1, 128, 75)


def test_sink_scales_name_the_wavs_and_the_accounting(cond, tmp_path, capsys):
    assert main(argv(cond, tmp_path / "o", "--codec", "octopus", "--bits", "2", "--sink-scales", "3")) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "o").glob("*.wav")) == ["c_000_seed42_octopus-b2-s3.wav"]
    # the first 3 scales (1 + 2 + 4 tokens) native beside the window; both count as native bytes
    assert ("kv cache [octopus b=2 S=3 W=1, 2 layers, 455 tokens (7 in the sink scales + 75 in the window "
            "native)]") in out, out
    assert "on the store and sink scales" in out


def test_codec_none_prints_its_accounting(cond, tmp_path, capsys):
    assert main(argv(cond, tmp_path / "o", "--codec", "none", "--precision", "fp32")) == 0
    assert "kv cache [none b=16 W=1, 2 layers, 455 tokens" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (["--codec", "zip", "--bits", "2"], "unknown --codec 'zip'; allowed: none, "),
    (["--codec", "octopus", "--bits", "9"], "octopus does not take --bits 9 (it takes 1..7)"),
    (["--codec", "none", "--compare"], "--compare compares a compressed cache"),
], ids=["unknown-codec", "bits-out-of-range", "compare-none"])
def test_bad_codec_arguments_exit_2(cond, tmp_path, capsys, extra, message):
    assert main(argv(cond, tmp_path / "o", *extra)) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_compare_refuses_to_overwrite_the_reference(cond, tmp_path, capsys):
    out = tmp_path / "o"
    add_to_manifest(out, [out / "c_000_seed42_none.wav"])  # as an earlier generate leaves it
    (out / "c_000_seed42_none.wav").write_bytes(b"")
    assert main(argv(cond, out, "--codec", "octopus", "--bits", "3", "--compare")) == 2
    assert "c_000_seed42_none.wav already exists" in capsys.readouterr().err


@pytest.mark.parametrize("fast", [None, True, False], ids=["auto", "bf16", "fp32"])
def test_generate_runs_one_eager_generation_at_the_asked_precision(monkeypatch, fast):
    """The CLI generates once, eagerly, at --precision's `fast` (a graph pays only when replayed)."""
    import argparse
    import types

    from octopus_audio.aar_patch import generation
    from octopus_audio.eval import generate_cli

    calls = []

    def fake_generate(pipe, cond_BE, cfg, top_k, top_p, seed, fast):
        calls.append((tuple(cond_BE.shape), cfg, top_k, top_p, seed, fast))
        return "eager"

    monkeypatch.setattr(generation, "generate", fake_generate)
    pipe = types.SimpleNamespace(device=torch.device("cuda"))
    args = argparse.Namespace(cfg=4.0, top_k=200, top_p=0.95, seed=7)
    assert generate_cli._generate(pipe, torch.zeros(3, 512), args, fast) == "eager"
    assert calls == [((3, 512), 4.0, 200, 0.95, 7, fast)]
