"""`octopus-audio eval` end to end with the golden AAR checkpoint (depth 2, random weights) on CPU."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import SHARED

from octopus_audio.aar_patch.config import DEFAULT_SINK_SCALES as S
from octopus_audio.eval.cli import default_clips_dir

GOLDEN = SHARED / "aar_reference" / "golden"


def golden_or_skip():
    if not (GOLDEN / "aar.pth").is_file() or not (GOLDEN / "sat_release.pt").is_file():
        reason = f"the golden AAR checkpoint is not at {GOLDEN} (set OCTOPUS_AUDIO_SHARED to ../shared)"
        print(reason)
        pytest.skip(reason)


def test_eval_cli_with_the_golden_model(tmp_path, capsys):
    golden_or_skip()
    torch = pytest.importorskip("torch")
    pytest.importorskip("soundfile")
    from octopus_audio.cli import main

    clips = tmp_path / "clips"
    clips.mkdir()
    shutil.copy(default_clips_dir() / "misc_crow.flac", clips)
    out = tmp_path / "out"
    args = ["eval", "--clips", str(clips), "--n", "1", "--codecs", "none,octopus", "--bits", "2",
            "--aar", str(GOLDEN / "aar.pth"), "--sat", str(GOLDEN / "sat_release.pt"), "--clap", "spectral",
            "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--no-progress", "--device", "cpu",
            "--threads", "1", "--draws", "1"]  # one draw: the floor samples with seed 43
    threads = torch.get_num_threads()
    try:
        assert main(args) == 0
        assert torch.get_num_threads() == 1
        check_run(out, args, capsys.readouterr().out)
    finally:
        torch.set_num_threads(threads)


def check_run(out: Path, args: list[str], printed: str) -> None:
    """The report of the run above; the reference regenerated here at the run's thread count (1): the
    tokenizer's decoder rounds differently with another count."""
    import soundfile as sf
    import torch

    import octopus_audio.aar_patch as aar_patch
    from octopus_audio.cli import main

    assert f"| octopus | 2 | 2 | {S} | 1 |" in printed and "index.html" in printed  # the default sink scales

    results = json.loads((out / "results.json").read_text())
    assert results["failures"] == []
    assert results["meta"]["conditioner"] == "spectral"
    assert results["meta"]["model"] == "aar.pth+sat_release.pt"
    groups = {(g["codec"], g["bits"]): g for g in results["groups"]}
    none = groups[("none", None)]["metrics"]
    # the patch with codec none reproduces the unpatched reference bit for bit
    assert (none["lsd_db"]["mean"], none["snr_db"]["mean"], none["latent_cos"]["mean"]) == (0.0, 120.0, 1.0)
    assert (none["tf_top1"]["mean"], none["tf_kl_nats"]["mean"]) == (1.0, 0.0)  # teacher-forced too
    octo = groups[("octopus", 2)]
    assert octo["clips_ok"] == 1 and octo["ratio"]["mean"] > 1.0 and octo["k_bits_per_coord"]["mean"] < 16.0
    assert octo["metrics"]["snr_db"]["mean"] < 120.0
    top1, kl = octo["metrics"]["tf_top1"]["mean"], octo["metrics"]["tf_kl_nats"]["mean"]
    assert 0.0 <= top1 <= 1.0 and 0.0 < kl < float("inf")
    assert results["meta"]["teacher_forced_precision"] == "fp32"
    assert results["meta"]["generation_precision"] == "fp32"
    assert "TF top-1 agreement" in printed

    names = sorted(p.name for p in (out / "wav").iterdir())
    assert names == ["misc_crow__00_input.wav", "misc_crow__00_reference.wav",
                     "misc_crow__00_reference_bf16_kv.wav", "misc_crow__00_reference_other_seed.wav",
                     "misc_crow__none.wav", f"misc_crow__octopus_b2_s{S}.wav"]
    kv = groups[("reference (bf16 KV)", None)]  # the bf16-KV floor: on with the other floor
    assert kv["clips_ok"] == 1 and kv["ratio"] is None and kv["metrics"]["tf_kl_nats"]["mean"] < 1e-3
    info = sf.info(out / "wav" / f"misc_crow__octopus_b2_s{S}.wav")
    assert (info.samplerate, info.frames) == (24000, 24000)

    # the reference is what aar_patch.generate gives for the stored condition and the run's sampling settings
    saved = np.load(out / "refs" / "misc_crow.npz")
    pipe = aar_patch.load_aar(str(GOLDEN / "aar.pth"), str(GOLDEN / "sat_release.pt")).eval()
    with torch.inference_mode():
        gen = aar_patch.generate(pipe, torch.from_numpy(saved["cond"])[None], cfg=4.0, top_k=200, top_p=0.95,
                                 seed=42)
    np.testing.assert_array_equal(gen.fhat[0].numpy(), saved["fhat"])
    np.testing.assert_array_equal(gen.audio[0, 0].numpy(), saved["audio"])
    np.testing.assert_array_equal(torch.cat(gen.tokens, dim=1)[0].numpy(), saved["tokens"])
    assert saved["token_sizes"].tolist() == [t.shape[1] for t in gen.tokens]

    # the sampling floor: the same model at seed 42 + 1, the sampled metrics against the reference
    from octopus_audio.audio_metrics.latent import latent_cosine
    from octopus_audio.audio_metrics.lsd import lsd_db
    from octopus_audio.audio_metrics.snr import snr_db

    with torch.inference_mode():
        other = aar_patch.generate(pipe, torch.from_numpy(saved["cond"])[None], cfg=4.0, top_k=200,
                                   top_p=0.95, seed=43)
    floor = groups[("reference (other seed)", None)]
    assert results["meta"]["floor_seed"] == 43 and floor["clips_ok"] == 1 and floor["ratio"] is None
    a, b = gen.audio[0, 0].numpy(), other.audio[0, 0].numpy()
    assert floor["metrics"]["lsd_db"]["mean"] == pytest.approx(lsd_db(a, b), rel=1e-9)
    assert floor["metrics"]["snr_db"]["mean"] == pytest.approx(snr_db(a, b), rel=1e-9)
    assert floor["metrics"]["latent_cos"]["mean"] == pytest.approx(
        latent_cosine(gen.fhat[0].numpy(), other.fhat[0].numpy()), rel=1e-9)
    assert floor["metrics"]["tf_kl_nats"] is None

    # rerunning the same command has nothing left to do and rewrites the same report
    before = (out / "results.json").read_text()
    assert main(args) == 0
    assert (out / "results.json").read_text() == before
