"""Tests of the default-model training: data selection, the training quantizer, losses, resume, export, and
the shipped weights."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from octopus_audio.aar_patch import train, train_data
from octopus_audio.aar_patch.aar import AAR
from octopus_audio.aar_patch.multiscale_vq import Codebook
from octopus_audio.aar_patch.sat import SAT
from octopus_audio.aar_patch.train_aar import AARLossConfig, aar_token_losses, whiten_condition_init_
from octopus_audio.aar_patch.train_sat import SATLossConfig, ema_update_, quantize_for_training, sat_losses
from octopus_audio.errors import UsageError
from octopus_audio.eval import train_cli
from octopus_audio.eval.cli import default_clips_dir

COPYRIGHT = """Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/

Files: *
Copyright: 2016 Someone
License: MIT

Files: etc/samples/a_one.flac
 etc/samples/b_two.flac
Copyright: 2013 A
License: CC0

Files: etc/samples/c_three.flac
Copyright: 2013 C
License: CC-BY-SA-4.0

Files: etc/samples/b_*.flac
Copyright: 2014 B
License: CC-BY-4.0

License: CC0
 Long text of the license.
"""


@pytest.fixture(autouse=True)
def one_thread():
    """The tiny models' ops are far too small for intra-op threads; on a busy 2-core machine they only
    spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_models() -> tuple[SAT, AAR, SATLossConfig]:
    sat_cfg, aar_cfg, loss_cfg = train.model_configs("tiny")
    torch.manual_seed(0)
    aar = AAR(aar_cfg)
    aar.init_weights(seed=0)
    return SAT(sat_cfg), aar, loss_cfg


# --- data -----------------------------------------------------------------------------------------------

def test_dep5_license_is_the_last_matching_paragraph():
    rules = train_data.parse_dep5(COPYRIGHT)
    assert train_data.license_of(rules, "etc/samples/a_one.flac") == "CC0"
    assert train_data.license_of(rules, "etc/samples/b_two.flac") == "CC-BY-4.0"  # a later glob overrides
    assert train_data.license_of(rules, "etc/samples/c_three.flac") == "CC-BY-SA-4.0"
    assert train_data.license_of(rules, "etc/samples/d_four.flac") == "MIT"  # only the catch-all entry


def test_cc0_selection_reads_each_files_own_entry(tmp_path):
    samples = tmp_path / "samples"
    samples.mkdir()
    for name in ("a_one.flac", "b_two.flac", "c_three.flac", "d_four.flac", "README.md"):
        (samples / name).write_bytes(b"")
    (tmp_path / "copyright").write_text(COPYRIGHT)
    chosen = train_data.sonic_pi_cc0_files(samples, tmp_path / "copyright")
    assert [p.name for p in chosen] == ["a_one.flac"]


def test_held_out_files_and_clips_cut_from_them_are_not_trained_on(tmp_path):
    folder = tmp_path / "audio"
    folder.mkdir()
    names = [f"{train_data.HELD_OUT[0]}.flac", "kept_one.wav", f"{train_data.HELD_OUT[-1]}.wav",
             "kept_two.flac"]
    for name in names:
        (folder / name).write_bytes(b"")
    args = type("Args", (), {"sonic_pi": False, "data": [str(folder), str(default_clips_dir())]})()
    chosen = train_cli._gather_sources(args, tmp_path)
    stems = [p.stem for p in chosen]
    assert "kept_one" in stems and "kept_two" in stems
    assert not set(stems) & set(train_data.HELD_OUT)
    assert len(stems) == len(set(stems))
    clip_sources = train_data.clip_sources(default_clips_dir())
    from_held_out = {c for c, src in clip_sources.items() if src in train_data.HELD_OUT}
    assert from_held_out, "the shipped clips include some held-out sources (see MODEL_CARD.md)"
    assert not {Path(c).stem for c in from_held_out} & set(stems)


def test_crops_are_seeded_and_short_files_are_zero_padded():
    clips = [np.full(10, 0.5, np.float32), np.arange(100, dtype=np.float32) / 100]
    data = train_data.PackedAudio(np.concatenate(clips).astype(np.float16), np.array([0, 10, 110]),
                                  np.eye(2, 4, dtype=np.float32), ("a", "b"))
    a1, f1 = train_data.sample_crops(data, 6, torch.Generator().manual_seed(3), crop=32)
    a2, f2 = train_data.sample_crops(data, 6, torch.Generator().manual_seed(3), crop=32)
    assert torch.equal(a1, a2) and torch.equal(f1, f2) and a1.shape == (6, 1, 32)
    for b in range(6):
        if f1[b] == 0:
            assert torch.all(a1[b, 0, :10] == 0.5) and torch.all(a1[b, 0, 10:] == 0)
        else:
            row = a1[b, 0].numpy()
            start = int(round(float(row[0]) * 100))
            expected = (np.arange(start, start + 32) / 100).astype(np.float16)
            np.testing.assert_allclose(row, expected, atol=1e-3)


# --- tokenizer training -----------------------------------------------------------------------------------

def test_training_quantizer_picks_the_inference_tokens():
    sat, _, loss_cfg = tiny_models()
    audio = torch.randn(3, 1, sat.config.audio_length)
    gen = torch.Generator().manual_seed(0)
    z = sat.encode_latent(audio)  # distinct random codewords (an init from the batch would make exact ties)
    with torch.no_grad():  # the inference path, with the codebooks as they are before the update
        expected_tokens, expected_f_hat = sat.quantizer.quantize(z.detach())
    before = sat.quantizer.vq.layers[-1]._codebook.embed.clone()
    z.retain_grad()
    f_hat_st, _, tokens, _ = quantize_for_training(sat.quantizer, z, loss_cfg, gen, update=True)
    assert all(torch.equal(a, b) for a, b in zip(tokens, expected_tokens, strict=True))
    torch.testing.assert_close(f_hat_st, expected_f_hat)  # the decoder sees the quantized latent's values
    f_hat_st.sum().backward()
    torch.testing.assert_close(z.grad, torch.ones_like(z))  # and its gradient goes straight to the encoder
    assert not torch.equal(before, sat.quantizer.vq.layers[-1]._codebook.embed)  # EMA update after the pass


def test_ema_update_moves_codes_to_their_means_and_restarts_dead_ones():
    codebook = Codebook(4, 2)
    codebook.embed.copy_(torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [5.0, 5.0]]))
    codebook.embed_avg.copy_(codebook.embed)
    codebook.cluster_size.copy_(torch.tensor([1.0, 1.0, 1.0, 0.0]))
    target = torch.tensor([[1.0, 1.0], [3.0, 1.0], [9.0, 1.0], [0.0, 8.0]])
    idx = torch.tensor([0, 0, 1, 2])
    restarts = ema_update_(codebook, target, idx, decay=0.5, dead_fraction=0.5,
                           picks_K=torch.tensor([7, 6, 5, 4]))
    # code 0: size 0.5*1 + 0.5*2 = 1.5, avg 0.5*(0,0) + 0.5*(4,2) = (2,1) -> embed ~ (1.333, 0.667)
    np.testing.assert_allclose(codebook.cluster_size[:3].numpy(), [1.5, 1.0, 1.0])
    np.testing.assert_allclose(codebook.embed[0].numpy(), [2 / 1.5, 1 / 1.5], rtol=1e-4)
    np.testing.assert_allclose(codebook.embed[1].numpy(), [9.5, 0.5], rtol=1e-4)
    # code 3 was never used: size 0 < 0.5 * (4/4) -> restarted from target 4 % 4 = 0, with the mean usage
    assert int(restarts) == 1
    np.testing.assert_allclose(codebook.embed[3].numpy(), [1.0, 1.0])
    assert float(codebook.cluster_size[3]) == 1.0


def test_tokenizer_loss_is_finite_and_decreases_on_one_batch():
    sat, _, loss_cfg = tiny_models()
    t = torch.arange(sat.config.audio_length, dtype=torch.float32)
    audio = torch.stack([0.5 * torch.sin(0.3 * t), 0.3 * torch.sin(0.7 * t)]).unsqueeze(1)
    _, parts = sat_losses(sat, audio, loss_cfg, torch.Generator().manual_seed(0), init=True)
    assert all(np.isfinite(float(v)) for v in parts.values()) and float(parts["stft"]) > 0
    # the waveform part alone (the tiny STFT sizes see 64 samples, too few to move fast)
    loss_cfg = dataclasses.replace(loss_cfg, stft_weight=0.0)
    opt = torch.optim.Adam(sat.parameters(), lr=1e-2)
    l1 = []
    for step in range(40):
        loss, parts = sat_losses(sat, audio, loss_cfg, torch.Generator().manual_seed(step))
        opt.zero_grad()
        loss.backward()
        opt.step()
        l1.append(float(parts["l1"]))
    assert all(np.isfinite(l1))
    assert np.mean(l1[-5:]) < 0.8 * np.mean(l1[:5])


# --- transformer training ---------------------------------------------------------------------------------

def test_transformer_learns_a_fixed_token_batch_and_uses_the_condition():
    sat, aar, _ = tiny_models()
    gen = torch.Generator().manual_seed(1)
    tokens = [torch.randint(aar.config.vocab_size, (2, pn), generator=gen) for pn in aar.config.patch_nums]
    tokens[0] = torch.tensor([[3], [11]])
    x_BLCv = sat.quantizer.teacher_forcing_input(tokens).detach()
    target = torch.cat(tokens, dim=1)
    cond = torch.nn.functional.normalize(torch.randn(2, 512, generator=gen), dim=1)
    opt = torch.optim.Adam(aar.parameters(), lr=3e-3)
    losses = []
    for step in range(40):
        loss, parts = aar_token_losses(aar, x_BLCv, target, cond, AARLossConfig(cond_drop=0.0),
                                       torch.Generator().manual_seed(step))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert all(np.isfinite(losses)) and losses[-1] < 0.5 * losses[0]
    with torch.no_grad():  # the two rows differ only by their condition at the first token
        swapped = aar(cond.flip(0), x_BLCv)[:, 0].argmax(-1)
        kept = aar(cond, x_BLCv)[:, 0].argmax(-1)
    assert torch.equal(kept, target[:, 0]) and not torch.equal(swapped, kept)


def test_whitened_condition_rows_are_orthogonal_to_the_mean_and_spread_the_files():
    _, aar, _ = tiny_models()
    gen = torch.Generator().manual_seed(2)
    base = torch.randn(512, generator=gen)
    cond = torch.nn.functional.normalize(base + 0.05 * torch.randn(40, 512, generator=gen), dim=1)
    rows = whiten_condition_init_(aar, cond, components=8, floor=0.0)
    w = aar.class_emb.fc1.weight[:rows].detach().double()
    assert rows == 8
    np.testing.assert_allclose((w @ cond.double().mean(0)).numpy(), 0, atol=1e-5)
    proj = cond.double() @ w.T
    np.testing.assert_allclose(proj.std(0).numpy(), 1.0, rtol=1e-6)


def test_drop_rate_replaces_rows_with_the_unconditional_embedding():
    from octopus_audio.aar_patch.train_aar import drop_conditions

    _, aar, _ = tiny_models()
    cond = torch.ones(1000, 512)
    out = drop_conditions(aar, cond, 0.1, torch.Generator().manual_seed(0))
    dropped = (out == aar.uncond_embedding).all(dim=1)
    assert torch.equal(out[~dropped], cond[~dropped])
    assert 0.07 < dropped.float().mean() < 0.13


# --- the command: resume and export ------------------------------------------------------------------------

@pytest.fixture()
def packed(tmp_path) -> Path:
    rng = np.random.default_rng(0)
    clips = [(0.2 * rng.standard_normal(n)).astype(np.float32) for n in (40, 100, 300)]
    cond = rng.standard_normal((3, 512)).astype(np.float32)
    train_data.pack(["a.wav", "b.wav", "c.wav"], clips, cond / np.linalg.norm(cond, axis=1, keepdims=True),
                    tmp_path / "packed")
    return tmp_path / "packed"


def _train(packed: Path, out: Path, *extra: str) -> None:
    argv = ["--packed", str(packed), "--out", str(out), "--size", "tiny", "--sat-steps", "4",
            "--aar-steps", "4", "--sat-batch", "2", "--aar-batch", "2", "--log-every", "1",
            "--ckpt-every", "3", "--no-progress", "--aar-precompute", "8", "--whiten-cond", *extra]
    assert train_cli.main(argv) == 0


def test_resume_equals_uninterrupted_training(packed, tmp_path):
    _train(packed, tmp_path / "straight")
    _train(packed, tmp_path / "split", "--stop-after", "3")  # sat stops at 3 of 4; aar waits for it
    assert not (tmp_path / "split" / "aar_state.pt").exists()
    _train(packed, tmp_path / "split", "--stop-after", "3")  # sat 3 -> 4, aar 0 -> 3
    _train(packed, tmp_path / "split")  # aar 3 -> 4
    for name in ("sat", "aar"):
        a = torch.load(tmp_path / "straight" / f"{name}_state.pt", weights_only=True)
        b = torch.load(tmp_path / "split" / f"{name}_state.pt", weights_only=True)
        assert a["step"] == b["step"] == 4
        for key, value in a["model"].items():
            assert torch.equal(value, b["model"][key]), f"{name} {key} differs after resume"
        assert a["history"][-1] == {**b["history"][-1], "seconds": a["history"][-1]["seconds"]}
    history = json.loads((tmp_path / "split" / "sat_history.json").read_text())
    assert [row["step"] for row in history] == [1, 2, 3, 4]


def test_exported_weights_are_fp16_in_the_release_wrappers_and_load_strictly(packed, tmp_path):
    from octopus_audio.aar_patch.loading import load_aar

    _train(packed, tmp_path / "run")
    sat_file = torch.load(tmp_path / "run" / "sat.pth", weights_only=True)
    aar_file = torch.load(tmp_path / "run" / "aar.pth", weights_only=True)
    assert list(sat_file) == ["generator_state_dict"] and list(aar_file) == ["model_state_dict"]
    for sd in (sat_file["generator_state_dict"], aar_file["model_state_dict"]):
        assert {v.dtype for v in sd.values() if v.is_floating_point()} == {torch.float16}
    pipe = load_aar(tmp_path / "run" / "aar.pth", tmp_path / "run" / "sat.pth")
    state = torch.load(tmp_path / "run" / "aar_state.pt", weights_only=True)["model"]
    torch.testing.assert_close(pipe.aar.head.weight, state["head.weight"].half().float())


def test_usage_errors(packed, tmp_path):
    with pytest.raises(UsageError, match="needs data"):
        train_cli.run(train_cli.build_args(["--packed", str(packed), "--prepare-only"]))
    with pytest.raises(UsageError, match="not a packed training folder"):
        train_cli.run(train_cli.build_args(["--packed", str(tmp_path / "nothing"), "--out",
                                            str(tmp_path / "o")]))
    with pytest.raises(UsageError, match="unknown model size"):
        train.model_configs("huge")


# --- the shipped default model -----------------------------------------------------------------------------

def test_shipped_default_model_loads_strictly_within_budget():
    from octopus_audio.aar_patch.default_model import default_model_dir, default_paths
    from octopus_audio.aar_patch.loading import load_aar
    from octopus_audio.aar_patch.sat import RELEASE_PATCH_NUMS
    from octopus_audio.tensorfile import load_tensors

    folder = default_model_dir()
    assert sorted(p.name for p in folder.iterdir() if p.name != "__pycache__") == [
        "aar.safetensors", "config.json", "default_condition.npy", "sat.safetensors"]
    assert sum(p.stat().st_size for p in folder.iterdir()) <= 20_000_000
    pipe = load_aar(folder)
    assert pipe.aar.config.head_dim == 64
    assert tuple(pipe.aar.config.patch_nums) == RELEASE_PATCH_NUMS and pipe.aar.config.seq_len == 455
    assert pipe.sat.config.codebook_size == pipe.aar.config.vocab_size
    for path in default_paths():
        tensors, meta = load_tensors(path)
        assert {v.dtype for v in tensors.values() if v.is_floating_point()} == {torch.float16}
        assert meta["format"] == "octopus-audio-model"
    as_pair = load_aar(*default_paths()).state_dict()  # the two files alone load the same weights
    assert all(torch.equal(v, as_pair[k]) for k, v in pipe.state_dict().items())
