"""A new user's first commands: the README's one-line `generate` with no condition, `--version`, the help
texts, `--compare`'s count, the cache folder under XDG_CACHE_HOME, and keys and values at their own widths
(`--k-bits` / `--v-bits`, `v_bits=` in the Python API) with the accounting that follows from them."""

from __future__ import annotations

import json
import re
import wave

import numpy as np
import pytest
import torch

from octopus_audio.aar_patch.patch import DEFAULT_SINK_SCALES
from octopus_audio.cli import main

# DESIGN section 2: the codec names, as the CLI spells them
DESIGN_CODECS = ("none", "turboquant-mse", "turboquant-qjl", "polarquant", "octopus", "octopus-qjl")
SINKS = f"-s{DEFAULT_SINK_SCALES}" if DEFAULT_SINK_SCALES else ""  # the default sink scales, in WAV names


def read_wav(path) -> np.ndarray:
    with wave.open(str(path), "rb") as f:
        assert (f.getnchannels(), f.getsampwidth(), f.getframerate()) == (1, 2, 24000)
        return np.frombuffer(f.readframes(f.getnframes()), dtype="<i2").astype(np.float64) / 32767


def test_the_readme_one_liner_runs_as_written(tmp_path, capsys):
    out = tmp_path / "gen"
    assert main(["generate", "--codec", "octopus", "--bits", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "conditioning on the default condition, the `spectral` embedding of the shipped clip " \
           "octopus_audio/clips/loop_amen.flac" in printed
    assert "wrote 1 WAV file to" in printed
    (wav,) = out.glob("*.wav")
    assert wav.name == f"loop_amen_000_seed42_octopus-b2{SINKS}.wav"
    audio = read_wav(wav)
    assert audio.size == 24000 and np.isfinite(audio).all()
    assert np.sqrt(np.mean(audio**2)) > 0.01  # sound, not silence


def test_compare_counts_both_files(tmp_path, capsys):
    out = tmp_path / "gen"
    assert main(["generate", "--codec", "turboquant-mse", "--bits", "3", "--compare", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.glob("*.wav")) == ["loop_amen_000_seed42_none.wav",
                                                     f"loop_amen_000_seed42_turboquant-mse-b3{SINKS}.wav"]
    assert "wrote 2 WAV files to" in printed
    label = f"turboquant-mse b=3 S={DEFAULT_SINK_SCALES}" if DEFAULT_SINK_SCALES else "turboquant-mse b=3"
    assert f"compare {label} vs uncompressed (1 row): LSD" in printed


def test_the_default_condition_is_the_named_clips_spectral_embedding():
    pytest.importorskip("soundfile")
    pytest.importorskip("soxr")
    from octopus_audio.aar_patch.default_model import default_condition, default_model_dir
    from octopus_audio.eval.cli import default_clips_dir
    from octopus_audio.eval.conditioning import SpectralConditioner
    from octopus_audio.eval.sources import CLAP_RATE, ClipRef, decode, prepare

    about = json.loads((default_model_dir() / "config.json").read_text())["default_condition"]
    assert about["conditioner"] == "spectral"
    path = default_clips_dir() / about["clip"]
    clip = decode(ClipRef(clip_id=path.stem, origin=str(path), path=str(path)))
    expected = SpectralConditioner().embed(prepare(clip, CLAP_RATE))
    cond, what, stem = default_condition()
    assert cond.shape == (1, 512) and cond.dtype == np.float32
    np.testing.assert_allclose(cond[0], expected, rtol=0, atol=1e-6)
    assert stem == path.stem and about["clip"] in what


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == "octopus-audio 0.1.0"


def test_help_speaks_to_users_and_lists_the_codecs(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert "octopus-audio generate --codec octopus --bits 2 --out out/gen" in top
    assert "one subcommand per module" not in top  # the code's structure is not the user's business
    for command in ("generate", "eval", "probe", "bench", "codebooks", "train"):
        assert re.search(rf"^    {command} ", top, re.M), command
    for command in ("generate", "eval"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert all(name in text for name in DESIGN_CODECS), text
        assert "--k-bits" in text and "--v-bits" in text


@pytest.mark.parametrize("xdg", [None, "", "custom"], ids=["unset", "empty", "set"])
def test_the_conditioning_cache_follows_xdg_cache_home(monkeypatch, tmp_path, xdg):
    from octopus_audio.eval.conditioning import default_cache_dir

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    if xdg is None:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / xdg) if xdg else "")
    base = tmp_path / "custom" if xdg else tmp_path / "home" / ".cache"
    assert default_cache_dir() == base / "octopus-audio" / "conditioning"


def test_eval_uses_the_xdg_cache(monkeypatch, tmp_path):
    import octopus_audio.eval.runner as runner

    pytest.importorskip("soundfile")
    seen = {}
    monkeypatch.setattr(runner, "evaluate", lambda refs, out, config, make_backend, conditioner, **kw:
                        seen.update(dir=conditioner.cache_dir))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert main(["eval", "--codecs", "octopus", "--bits", "2", "--clap", "spectral", "--n", "1",
                 "--out", str(tmp_path / "out"), "--no-progress", "--device", "cpu"]) == 0
    assert seen["dir"] == tmp_path / "xdg" / "octopus-audio" / "conditioning"


# --- keys and values at their own widths -------------------------------------------------------------------

def test_cli_k2_v4_reports_its_bits_per_coordinate(tmp_path, capsys):
    """octopus b=2 keys at head dim 64: 16 + 22 x 7 = 170 bits, 6 int32 words = 176 bits = 2.75 per
    coordinate; 4-bit values: 64 x 4 = 256 bits + 4 groups x (fp16 scale + fp16 minimum) = 384 = 6.0."""
    out = tmp_path / "gen"
    assert main(["generate", "--codec", "octopus", "--k-bits", "2", "--v-bits", "4", "--sink-scales", "0",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "kv cache [octopus K b=2 V b=4 W=1, 4 layers, 455 tokens (75 native)]" in printed
    assert "K 2.75 bits/coord, V 6.00 bits/coord" in printed
    # the bytes: 4 layers x 2 rows (guidance runs a conditional and an unconditional row) x 4 heads x 380
    # compressed tokens x (22 + 48) bytes = 851,200 = 0.81 MiB
    assert "(compressed 0.81 + native window" in printed
    assert [p.name for p in out.glob("*.wav")] == ["loop_amen_000_seed42_octopus-k2v4.wav"]


def test_cli_bits_flags_default_to_each_other(tmp_path, capsys):
    assert main(["generate", "--codec", "octopus", "--bits", "3", "--v-bits", "2", "--sink-scales", "0",
                 "--out", str(tmp_path / "a")]) == 0
    assert "kv cache [octopus K b=3 V b=2 W=1" in capsys.readouterr().out
    assert main(["generate", "--codec", "octopus", "--k-bits", "3", "--out", str(tmp_path / "b")]) == 2
    assert "needs --bits (for example --bits 2), or both --k-bits and --v-bits" in capsys.readouterr().err
    assert main(["generate", "--codec", "octopus", "--bits", "2", "--v-bits", "9", "--out",
                 str(tmp_path / "c")]) == 2
    assert "--v-bits 9: values take 1..8 bits" in capsys.readouterr().err
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def test_python_api_accounts_keys_and_values_apart():
    from octopus_audio.aar_patch import compressed_kv, generate, load_aar
    from octopus_audio.aar_patch.default_model import default_condition

    pipe = load_aar()
    cond = torch.from_numpy(default_condition()[0])
    with compressed_kv(pipe, "octopus", 2, v_bits=4, sink_scales=0) as handle:
        generate(pipe, cond, seed=42)
        assert all((c.bits, c.v_bits, c.value_quantizer.bits) == (2, 4, 4) for c in handle.caches)
    stats = handle.last_stats
    assert (stats.config.bits, stats.config.v_bits) == (2, 4)
    total = stats.total
    assert (total.k_bits, total.v_bits) == (2.75, 6.0)
    for layer in stats.layers:
        rows_tokens = 2 * 4 * (455 - 75)  # (conditional + unconditional row) x heads x compressed tokens
        assert (layer.k_bytes, layer.v_bytes) == (22 * rows_tokens, 48 * rows_tokens)
    assert total.k_bytes + total.v_bytes == 4 * 70 * 2 * 4 * 380
    assert "K b=2 V b=4" in stats.line() and "v_bits=4" in repr(handle)
    with compressed_kv(pipe, "octopus", 3) as same:  # v_bits None: the values take the key width
        assert same.config.v_bits == 3 and same.caches[0].value_quantizer.bits == 3


def test_cache_decodes_values_at_their_own_width():
    from octopus_audio import CompressedKVCache, get_codec
    from octopus_audio.values import ValueQuantizer

    g = torch.Generator().manual_seed(0)
    units = [(torch.randn(1, 2, t, 64, generator=g), torch.randn(1, 2, t, 64, generator=g))
             for t in (3, 5, 2)]
    cache = CompressedKVCache("turboquant-mse", 2, 64, window=1, seed=5, v_bits=5)
    for k, v in units:
        cache.append(k, v)
    k_hat, v_hat = cache.decoded_kv()
    k_old = torch.cat([k for k, _ in units[:2]], 2)
    v_old = torch.cat([v for _, v in units[:2]], 2)
    codec, quant = get_codec("turboquant-mse", 2, 64, seed=5), ValueQuantizer(5, 64)
    torch.testing.assert_close(k_hat[:, :, :8], codec.decode(codec.encode(k_old)), rtol=0, atol=0)
    torch.testing.assert_close(v_hat[:, :, :8], quant.decode(quant.encode(v_old)), rtol=0, atol=0)
    assert cache.bytes_breakdown()["v_bytes"] == 2 * 8 * (64 * 5 // 8 + 4 * 4)
    assert "v_bits=5" in repr(cache)
