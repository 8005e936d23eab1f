"""The eval's sampling floor: one more uncompressed generation per clip at seed + 1, its sampled metrics
against the reference, as the row `reference (other seed)`; on by default, off with --no-floor, resumable."""

import csv
import io
import json

import numpy as np
import pytest
from test_eval_runner import FakeConditioner, FakePipe, fake_generate, make_clips, run_fake

from octopus_audio.aar_patch.patch import DEFAULT_SINK_SCALES
from octopus_audio.audio_metrics.latent import latent_cosine
from octopus_audio.audio_metrics.logmel import logmel_mse
from octopus_audio.audio_metrics.lsd import lsd_db
from octopus_audio.audio_metrics.snr import snr_db
from octopus_audio.eval.records import FLOOR, KV_FLOOR, REFERENCE, EvalConfig, Job
from octopus_audio.eval.sources import CLAP_RATE, decode, list_folder, prepare

torch = pytest.importorskip("torch")
sf = pytest.importorskip("soundfile")

SEED = 3
FLOOR_SEED = 4  # documented: the run's seed + 1
SAMPLED = ("lsd_db", "logmel_mse", "snr_db", "latent_cos", "first_parting_scale")


def small_config(floor=True):
    return EvalConfig(codecs=("octopus",), bits=(2,), seed=SEED, floor=floor)


def rows_of(out):
    return [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]


def independent_generation(clip_path, seed):
    """The fake model's output for this clip at `seed`, computed here without the runner: condition from the
    clip's 48 kHz audio, one unpatched generation, converted as a float32 array."""
    (ref,) = [r for r in list_folder(clip_path.parent, n=100, seed=0) if r.clip_id == clip_path.stem]
    cond_D = FakeConditioner().embed(prepare(decode(ref), CLAP_RATE))
    g = fake_generate(FakePipe(), torch.from_numpy(cond_D)[None], cfg=4.0, top_k=200, top_p=0.95, seed=seed)
    return (g.audio.reshape(-1).numpy().astype(np.float32), g.fhat.numpy().astype(np.float32),
            [t.reshape(-1).numpy() for t in g.tokens])


def test_the_floor_row_holds_the_metrics_of_two_uncompressed_samples(tmp_path):
    clips = make_clips(tmp_path / "clips", n=2)
    out = tmp_path / "out"
    results = run_fake(clips, out, cfg=small_config())
    floors = [r for r in rows_of(out) if r["codec"] == FLOOR]
    assert [r["clip"] for r in floors] == ["clip0", "clip1"]
    for row in floors:
        assert (row["status"], row["bits"], row["seed"], row["kv"]) == ("ok", None, FLOOR_SEED, None)
        assert sorted(row["metrics"]) == sorted(SAMPLED)  # no teacher-forced numbers
        clip = clips / f"{row['clip']}.wav"
        ref_audio, ref_fhat, ref_tokens = independent_generation(clip, SEED)
        other_audio, other_fhat, other_tokens = independent_generation(clip, FLOOR_SEED)
        parting = next(s for s, (a, b) in enumerate(zip(ref_tokens, other_tokens, strict=True), start=1)
                       if (a != b).any())
        expected = {"lsd_db": lsd_db(ref_audio, other_audio),
                    "logmel_mse": logmel_mse(ref_audio, other_audio, 24000),
                    "snr_db": snr_db(ref_audio, other_audio),
                    "latent_cos": latent_cosine(ref_fhat, other_fhat), "first_parting_scale": parting}
        assert row["metrics"] == pytest.approx(expected, rel=1e-9)
        assert expected["snr_db"] < 10.0 and expected["latent_cos"] < 0.5  # two samples, not one
        third_audio, *_ = independent_generation(clips / f"{row['clip']}.wav", SEED + 2)
        assert row["metrics"]["lsd_db"] != pytest.approx(lsd_db(ref_audio, third_audio), rel=1e-6)
        wav, rate = sf.read(out / "wav" / f"{row['clip']}__00_reference_other_seed.wav", dtype="float32")
        assert rate == 24000 and np.abs(wav - np.clip(other_audio, -1, 1)).max() < 1.0 / 16384

    (group,) = [g for g in results["groups"] if g["codec"] == FLOOR]
    assert results["groups"][0] is group and results["meta"]["floor_seed"] == FLOOR_SEED
    assert group["clips_ok"] == 2 and group["bits"] is None
    assert (group["ratio"], group["metrics"]["tf_top1"], group["metrics"]["tf_kl_nats"]) == (None, None, None)
    lsd = [r["metrics"]["lsd_db"] for r in floors]
    assert group["metrics"]["lsd_db"] == pytest.approx({"min": min(lsd), "mean": np.mean(lsd),
                                                        "max": max(lsd)})

    md = (out / "table.md").read_text()
    line = next(ln for ln in md.splitlines() if ln.startswith(f"| {FLOOR} |"))  # the paired table's
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:5] == [FLOOR, "-", "-", "-", "2"]  # K bits, V bits, sink scales, clips
    assert cells[-6:] == ["-"] * 6  # TF top-1, TF KL, K+V bits, KV ratio, K/V bits
    assert "sampled with seed 4 against the uncompressed reference (seed 3)" in md
    table = csv.DictReader(io.StringIO((out / "table.csv").read_text()))
    (csv_row,) = [r for r in table if r["codec"] == FLOOR]
    assert csv_row["bits"] == "" and csv_row["tf_kl_nats_mean"] == "" and csv_row["ratio_mean"] == ""
    assert float(csv_row["snr_db_mean"]) == pytest.approx(np.mean([r["metrics"]["snr_db"] for r in floors]))
    page = (out / "index.html").read_text()
    assert f"<b>{FLOOR}</b>" in page and "src='wav/clip1__00_reference_other_seed.wav'" in page
    assert "src='spec/clip1__00_reference_other_seed.png'" in page and "(seed 4)" in page


def test_no_floor_omits_it_and_a_later_run_adds_only_the_floor(tmp_path):
    clips = make_clips(tmp_path / "clips", n=2)
    out = tmp_path / "out"
    results = run_fake(clips, out, cfg=small_config(floor=False))
    assert [r["codec"] for r in rows_of(out)] == [REFERENCE, "octopus"] * 2
    assert [g["codec"] for g in results["groups"]] == ["octopus"] and "floor_seed" not in results["meta"]
    assert FLOOR not in (out / "table.md").read_text() and FLOOR not in (out / "index.html").read_text()
    assert not list((out / "wav").glob("*other_seed*"))

    pipe = FakePipe()  # the same folder with the floor on: two floor generations, nothing else
    run_fake(clips, out, pipe=pipe, cfg=small_config())
    assert pipe.calls == 2 and pipe.forced == []  # references loaded; no teacher forcing for the floor
    assert [(r["clip"], r["codec"]) for r in rows_of(out)] == [
        (clip, codec) for clip in ("clip0", "clip1") for codec in (REFERENCE, FLOOR, "octopus")]


@pytest.mark.parametrize("interrupt_at", [2, 5], ids=["during-clip0-floor", "during-clip1-floor"])
def test_an_interrupted_run_resumes_with_one_floor_row_per_clip(tmp_path, interrupt_at):
    clips = make_clips(tmp_path / "clips", n=2)
    out = tmp_path / "out"
    # generations per clip: reference, floor, octopus b2; so 2 is clip0's floor and 5 is clip1's
    with pytest.raises(KeyboardInterrupt):
        run_fake(clips, out, pipe=FakePipe(interrupt_at=interrupt_at), cfg=small_config())
    log = out / "rows" / "rank0.jsonl"
    before = [json.loads(line) for line in log.read_text().splitlines()]
    assert len([r for r in before if r["codec"] == FLOOR]) == (interrupt_at - 2) // 3
    run_fake(clips, out, cfg=small_config())
    run_fake(clips, out, cfg=small_config())  # nothing left: no row appended
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(r["clip"] for r in logged if r["codec"] == FLOOR) == ["clip0", "clip1"]
    assert len(logged) == 6 and all(r["status"] == "ok" for r in logged)
    assert [r["clip"] for r in rows_of(out) if r["codec"] == FLOOR] == ["clip0", "clip1"]


@pytest.mark.parametrize("flags,floor", [([], True), (["--no-floor"], False)], ids=["default", "no-floor"])
def test_the_cli_flag_turns_both_floors_off(tmp_path, monkeypatch, flags, floor):
    import octopus_audio.eval.runner as runner
    from octopus_audio.cli import main

    seen = {}

    def fake_evaluate(refs, out_dir, config, make_backend, conditioner, **kwargs):
        seen["config"] = config
        return None

    monkeypatch.setattr(runner, "evaluate", fake_evaluate)
    clips = make_clips(tmp_path / "clips", n=1)
    assert main(["eval", "--clips", str(clips), "--codecs", "octopus", "--bits", "2", "--clap", "spectral",
                 "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), "--no-progress",
                 "--device", "cpu", *flags]) == 0
    assert seen["config"].floor is floor and seen["config"].bf16_floor is floor
    assert seen["config"].jobs()[:2] == ([Job(FLOOR), Job(KV_FLOOR)] if floor
                                         else [Job("octopus", 2, 2, DEFAULT_SINK_SCALES, 0)])
