"""Several draws per clip with the fake pipeline: the seeds of each draw, what is kept per draw (embeddings)
and for draw 0 only (paired metrics, teacher forcing, WAVs), the distribution table against a computation of
its own from the embedding files, the verdict on a codec that changes the sound and on one that does not,
resuming, and the CLI's --draws."""

import csv
import io
import json

import numpy as np
import pytest
from test_eval_runner import (
    SINKS,
    FakeConditioner,
    FakePipe,
    FakeSAT,
    fake_compressed_kv,
    fake_generate,
    fake_teacher_forced,
    make_clips,
    report_files,
)

from octopus_audio.eval.backends import AARBackend, LazyBackend
from octopus_audio.eval.records import FLOOR, REFERENCE, EvalConfig
from octopus_audio.eval.runner import evaluate
from octopus_audio.eval.sources import CLAP_RATE, MODEL_RATE, decode, list_folder, prepare

torch = pytest.importorskip("torch")
scipy_linalg = pytest.importorskip("scipy.linalg")

SEED, DRAWS, CLIPS = 3, 3, 10
LOUD = ("octopus", 2)  # the fake codec that changes the sound: 4x the amplitude


def loud_generate(pipe, cond_BD, cfg, top_k, top_p, seed):
    g = fake_generate(pipe, cond_BD, cfg, top_k, top_p, seed)
    if pipe.active == LOUD:
        g.audio = 4.0 * g.audio
    return g


def draws_config(**kw):
    return EvalConfig(**{"codecs": ("none", "octopus"), "bits": (2,), "seed": SEED, "draws": DRAWS, **kw})


def run(clips, out, cfg=None, pipe=None, batch_size=1, n=CLIPS):
    cfg = cfg or draws_config()
    pipe = pipe or FakePipe()

    def build():
        return AARBackend(pipe, cfg, "fake-aar", "cpu", generate_fn=loud_generate,
                          compressed_kv_fn=fake_compressed_kv, teacher_forced_fn=fake_teacher_forced)

    return evaluate(list_folder(clips, n=n, seed=0), out, cfg, lambda device: LazyBackend(build, "fake-aar"),
                    FakeConditioner(), meta={"clips": "test"}, progress=False, batch_size=batch_size)


def rows_of(out):
    return [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def draws_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("draws")
    clips = make_clips(root / "clips", n=CLIPS)
    from octopus_audio.eval import distribution

    saved = distribution.RESAMPLES  # a module fixture runs outside the conftest's function-scoped patch
    distribution.RESAMPLES = 64
    try:
        results = run(clips, root / "out", batch_size=4)
    finally:
        distribution.RESAMPLES = saved
    return clips, root / "out", results


def fake_output(clip_path, seed, active=None):
    """The fake model's output for a clip at a seed, computed here without the runner."""
    (ref,) = [r for r in list_folder(clip_path.parent, n=100, seed=0) if r.clip_id == clip_path.stem]
    cond_D = FakeConditioner().embed(prepare(decode(ref), CLAP_RATE))
    pipe = FakePipe()
    pipe.active = active
    g = loud_generate(pipe, torch.from_numpy(cond_D)[None], cfg=4.0, top_k=200, top_p=0.95, seed=seed)
    return g.audio.reshape(-1).numpy().astype(np.float32), cond_D


def test_every_row_has_every_draw_with_its_own_seed(draws_run):
    clips, out, results = draws_run
    rows = rows_of(out)
    jobs = [(REFERENCE, None), (FLOOR, None), ("none", None), ("octopus", 2)]
    assert [(r["clip"], r["codec"], r["bits"], r["draw"]) for r in rows] == [
        (f"clip{i}", c, b, d) for i in range(CLIPS) for c, b in jobs for d in range(DRAWS)]
    assert all(r["status"] == "ok" for r in rows) and results["rows"] == {"ok": len(rows), "failed": 0}
    for r in rows:  # draw d: seed + d; the floor's draws after all of those
        assert r["seed"] == (SEED + DRAWS + r["draw"] if r["codec"] == FLOOR else SEED + r["draw"])
        paired = r["draw"] == 0 and r["codec"] != REFERENCE
        assert (r["metrics"] is not None) is paired
        assert r["embeddings"] == f"emb/{r['clip']}__" + {REFERENCE: "00_reference", FLOOR:
                                                           "00_reference_other_seed", "none": "none",
                                                           "octopus": f"octopus_b2{SINKS}"}[r["codec"]] + \
            f"__d{r['draw']}.npz"
    assert results["meta"]["floor_seed"] == SEED + DRAWS and results["meta"]["draws"] == DRAWS
    # WAVs and the paired table: draw 0 only
    assert sorted(p.name for p in (out / "wav").iterdir() if p.name.startswith("clip0__")) == [
        "clip0__00_input.wav", "clip0__00_reference.wav", "clip0__00_reference_other_seed.wav",
        "clip0__none.wav", f"clip0__octopus_b2{SINKS}.wav"]
    groups = {(g["codec"], g["bits"]): g for g in results["groups"]}
    assert groups[("octopus", 2)]["clips_ok"] == CLIPS
    assert groups[("none", None)]["metrics"]["snr_db"]["min"] == 120.0


def test_the_embeddings_are_those_of_each_draws_output(draws_run):
    clips, out, _ = draws_run
    from octopus_audio.eval.conditioning import condition_vector
    from octopus_audio.eval.embeddings import load_embeddings, spectral_frames

    for r in rows_of(out):
        if r["clip"] not in ("clip0", "clip7") or r["codec"] == "none":
            continue
        active = LOUD if r["codec"] == "octopus" else None
        audio, cond_D = fake_output(clips / f"{r['clip']}.wav", r["seed"], active)
        identity = json.dumps({"run": r["run"], "clip_sha256": r["clip_sha256"]}, sort_keys=True)
        emb = load_embeddings(out, r["embeddings"], identity)
        latent = FakeSAT().encode_latent(torch.from_numpy(audio)[None, None])[0].T.numpy()
        np.testing.assert_allclose(emb["latent"], latent, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(emb["spectral"], spectral_frames(audio, MODEL_RATE))
        vector = condition_vector(audio, FakeConditioner())
        np.testing.assert_array_equal(emb["clap"], vector)
        v, c = vector.astype(np.float64), cond_D.astype(np.float64)
        cosine = float(v @ c) / np.linalg.norm(v) / np.linalg.norm(c)
        assert r["adherence"] == pytest.approx(cosine, rel=1e-12)
        with pytest.raises(ValueError, match="another run or for other audio"):
            load_embeddings(out, r["embeddings"], identity.replace(r["run"], "another"))


def frames_of(out, rows, codec, embedding):
    from octopus_audio.eval.embeddings import load_embeddings

    mine = [r for r in rows if r["codec"] == codec]
    return np.concatenate([np.atleast_2d(load_embeddings(out, r["embeddings"], json.dumps(
        {"run": r["run"], "clip_sha256": r["clip_sha256"]}, sort_keys=True))[embedding]) for r in mine])


def fad_of(x, y):
    """FAD from numpy's covariances and scipy's matrix square root: the textbook formula."""
    mu_x, mu_y = x.mean(0), y.mean(0)
    cov_x, cov_y = np.cov(x.astype(np.float64), rowvar=False), np.cov(y.astype(np.float64), rowvar=False)
    cross = np.real(scipy_linalg.sqrtm(cov_x @ cov_y))
    return float(((mu_x - mu_y) ** 2).sum() + np.trace(cov_x) + np.trace(cov_y) - 2 * np.trace(cross))


def test_the_distribution_table_agrees_with_the_embedding_files(draws_run):
    _, out, results = draws_run
    rows = rows_of(out)
    dist = results["distribution"]
    assert dist["embeddings"] == ["latent", "spectral"] and dist["draws"] == DRAWS
    groups = {(g["codec"], g["bits"]): g for g in dist["groups"]}
    assert list(groups) == [(REFERENCE, None), (FLOOR, None), ("none", None), ("octopus", 2)]
    for (codec, _), g in groups.items():
        assert (g["clips"], g["outputs"]) == (CLIPS, CLIPS * DRAWS)
        adherence = [r["adherence"] for r in rows if r["codec"] == codec]
        assert g["adherence"]["value"] == pytest.approx(np.mean(adherence), rel=1e-12)
        for emb in ("latent", "spectral"):
            if codec == FLOOR:
                assert emb not in g["fad"]  # what every FAD is measured against
                continue
            expected = fad_of(frames_of(out, rows, codec, emb), frames_of(out, rows, FLOOR, emb))
            assert g["fad"][emb]["value"] == pytest.approx(expected, rel=1e-5)
            floor = groups[(REFERENCE, None)]["fad"][emb]["value"]
            assert g["fad"][emb]["floor"]["value"] == floor
            assert g["fad"][emb]["low"] <= g["fad"][emb]["high"]
    # codec none: the reference's outputs exactly, every difference 0
    none = groups[("none", None)]
    assert none["fad"]["latent"]["value"] == groups[(REFERENCE, None)]["fad"]["latent"]["value"]
    assert (none["distinguishable"], none["verdict"]) == (False, "not distinguishable from uncompressed at "
                                                                 "this sample size")
    loud = groups[("octopus", 2)]
    assert loud["distinguishable"] is True
    assert "latent FAD higher" in loud["verdict"] and "spectral FAD higher" in loud["verdict"]
    assert loud["verdict_level"] == pytest.approx(1 - 0.05 / 3)
    assert groups[(REFERENCE, None)]["verdict"].startswith("the floor")

    md = (out / "table.md").read_text()
    assert "| row | K bits | V bits | sink scales | outputs | K+V bits/coord | latent FAD [95%] | " \
           "spectral FAD [95%] | adherence [95%] | verdict |" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("| octopus | 2 | 2 | 3 | 30 (10 x 3) |"))
    assert line.endswith(f"| {loud['verdict']} |")
    assert "seeds 3..5; the other-seed draws (`reference (other seed)`) use seeds 6..8" in md
    table = list(csv.DictReader(io.StringIO((out / "distribution.csv").read_text())))
    assert [(r["codec"], r["sink_scales"], r["distinguishable"]) for r in table] == [
        (REFERENCE, "", ""), (FLOOR, "", ""), ("none", "", "False"), ("octopus", "3", "True")]
    assert float(table[3]["fad_latent_value"]) == loud["fad"]["latent"]["value"]
    for name in ("dist_latent.png", "dist_spectral.png", "dist_adherence.png"):
        assert (out / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "index.html").read_text()
    assert "<h2>Distribution over draws</h2>" in page and "src='plots/dist_latent.png'" in page
    assert loud["verdict"].replace("'", "&#x27;") in page


def test_an_interrupted_run_with_draws_resumes_to_the_same_report(tmp_path, draws_run):
    clips, full_out, _ = draws_run
    # batches of 4 generations: 1 clip with its 3 draws (4 // 3); interrupt inside the third clip
    with pytest.raises(KeyboardInterrupt):
        run(clips, tmp_path / "out", pipe=FakePipe(interrupt_at=14), batch_size=4)
    run(clips, tmp_path / "out", batch_size=16)
    resumed, full = report_files(tmp_path / "out"), report_files(full_out)
    assert resumed.pop("html") != "" and full.pop("html") != ""  # the page shows the clips' paths from --out
    assert resumed == full


def test_few_clips_show_intervals_and_no_verdict_and_no_floor_no_fad(tmp_path):
    clips = make_clips(tmp_path / "clips", n=3)
    results = run(clips, tmp_path / "few", n=3)
    groups = {(g["codec"], g["bits"]): g for g in results["distribution"]["groups"]}
    loud = groups[("octopus", 2)]
    assert loud["distinguishable"] is None and loud["verdict"].startswith("no verdict: 3 clips")
    assert loud["fad"]["latent"]["low"] is not None  # intervals from 2 clips on
    results = run(clips, tmp_path / "nofloor", cfg=draws_config(floor=False), n=3)
    groups = {(g["codec"], g["bits"]): g for g in results["distribution"]["groups"]}
    assert list(groups) == [(REFERENCE, None), ("none", None), ("octopus", 2)]
    assert groups[("octopus", 2)]["fad"] == {} and groups[("octopus", 2)]["adherence"] is not None
    assert groups[("octopus", 2)]["verdict"] == "no verdict: the other-seed draws are off (--no-floor)"


def test_a_failed_draw_leaves_its_clip_out_of_that_row(tmp_path):
    clips = make_clips(tmp_path / "clips", n=3)
    from test_eval_runner import _cond_key

    (ref,) = [r for r in list_folder(clips, n=10, seed=0) if r.clip_id == "clip1"]
    bad = _cond_key(FakeConditioner().embed(prepare(decode(ref), CLAP_RATE)))
    results = run(clips, tmp_path / "out", pipe=FakePipe(fail_cond=(bad, LOUD)), n=3)
    failed = [(r["clip"], r["codec"], r["draw"]) for r in rows_of(tmp_path / "out") if r["status"] != "ok"]
    assert failed == [("clip1", "octopus", d) for d in range(DRAWS)]
    groups = {(g["codec"], g["bits"]): g for g in results["distribution"]["groups"]}
    assert (groups[("octopus", 2)]["clips"], groups[("octopus", 2)]["outputs"]) == (2, 2 * DRAWS)
    assert groups[("none", None)]["outputs"] == 3 * DRAWS


def test_the_cli_default_draws_by_device_and_the_flag(tmp_path, monkeypatch):
    import octopus_audio.eval.runner as runner
    from octopus_audio.cli import main
    from octopus_audio.eval import cli

    seen = []
    monkeypatch.setattr(runner, "evaluate", lambda refs, out, config, *a, **kw: seen.append(config.draws))
    base = ["eval", "--clips", str(make_clips(tmp_path / "c", n=1)), "--clap", "spectral", "--codecs",
            "octopus", "--out", str(tmp_path / "o"), "--device", "cpu", "--no-progress",
            "--cache-dir", str(tmp_path / "cache")]
    assert main(base) == 0 and main(base + ["--draws", "5"]) == 0
    assert seen == [cli.CPU_DRAWS, 5]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert cli.default_draws("auto") == cli.CUDA_DRAWS == 8 and cli.default_draws("cpu") == cli.CPU_DRAWS


class FakeClap(FakeConditioner):
    """The fake conditioner taken for a CLAP model: its embeddings of the outputs get a FAD of their own."""

    name = "fake-clap"
    clap = True


def test_a_clap_conditioner_adds_a_fad_on_its_embeddings(tmp_path):
    # 3 clips x 3 draws: 9 vectors of 512-d a set, fewer than dimensions (the Gram path)
    clips = make_clips(tmp_path / "clips", n=3)
    cfg = draws_config()

    def build():
        return AARBackend(FakePipe(), cfg, "fake-aar", "cpu", generate_fn=loud_generate,
                          compressed_kv_fn=fake_compressed_kv, teacher_forced_fn=fake_teacher_forced)

    out = tmp_path / "out"
    results = evaluate(list_folder(clips, n=3, seed=0), out, cfg,
                       lambda device: LazyBackend(build, "fake-aar"), FakeClap(), progress=False)
    dist = results["distribution"]
    assert dist["embeddings"] == ["latent", "spectral", "clap"]
    rows = rows_of(out)
    x, y = frames_of(out, rows, "octopus", "clap").astype(np.float64), frames_of(out, rows, FLOOR, "clap")
    a, b = x - x.mean(0), y.astype(np.float64) - y.mean(0)
    # cov = A^T A / (n - 1): tr sqrt(cov_x^1/2 cov_y cov_x^1/2) is the nuclear norm of A B^T / (n - 1)
    nuclear = np.linalg.svd(a @ b.T / (len(a) - 1), compute_uv=False).sum()
    expected = ((x.mean(0) - y.mean(0)) ** 2).sum() + (a * a).sum() / (len(a) - 1) + (b * b).sum() / (
        len(b) - 1) - 2 * nuclear
    (loud,) = [g for g in dist["groups"] if g["codec"] == "octopus"]
    assert loud["fad"]["clap"]["value"] == pytest.approx(expected, rel=1e-9)
    assert "CLAP FAD [95%]" in (out / "table.md").read_text()
