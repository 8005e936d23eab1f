"""--wide-scales and --wide-bits in the eval: the jobs they add (each count of wide scales at every width and
count of sink scales), one sentence per bad input (exit 2), the rows, names and labels of wide jobs beside the
unchanged ones of a run without them, a fingerprint that refuses other wide bits on resume, and on a tiny real
model more stored bits per coordinate the more scales are wide."""

import csv
import io
import json

import pytest
from test_eval_perturbation import run_real, tiny_pipe
from test_eval_runner import FakePipe, make_clips, run_fake

from octopus_audio.errors import UsageError
from octopus_audio.eval.records import FLOOR, KV_FLOOR, EvalConfig, Job

torch = pytest.importorskip("torch")


def eval_argv(tmp_path, *flags: str) -> list[str]:
    return ["eval", "--clips", str(tmp_path / "clips"), "--clap", "spectral", "--no-progress", "--device",
            "cpu", "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), *flags]


def config_of(tmp_path, *flags: str) -> EvalConfig:
    """The EvalConfig the eval command makes of `flags` (nothing loaded, nothing run)."""
    from octopus_audio.cli import build_parser
    from octopus_audio.eval.cli import eval_config

    return eval_config(build_parser("eval").parse_args(eval_argv(tmp_path, *flags)))


def rows_of(out):
    return [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]


def test_each_count_of_wide_scales_runs_at_every_width_and_count_of_sink_scales(tmp_path):
    config = config_of(tmp_path, "--codecs", "octopus,none", "--bits", "2,3", "--sink-scales", "0,2",
                       "--wide-scales", "0,4")
    octopus = [Job("octopus", b, b, s, w, 4 if w else None) for s in (0, 2) for w in (0, 4) for b in (2, 3)]
    assert config.jobs() == [Job(FLOOR), Job(KV_FLOOR), *octopus, Job("none")]
    assert [(c.sink_scales, c.wide_scales, c.wide_bits) for c in config.patch_configs()] == [
        (j.sink_scales, j.wide_scales, 4) for j in octopus]
    assert [c.label for c in config.patch_configs()][-1] == "octopus b=3 S=2 wide=4@4/4"
    # unset: no wide scales, and a fingerprint without wide bits (a run made before the flags resumes)
    default = config_of(tmp_path, "--codecs", "octopus")
    assert (default.wide_scales, default.wide_bits) == ((0,), 4) and "wide_bits" not in default.identity()
    assert config_of(tmp_path, "--codecs", "octopus", "--wide-bits", "3").identity()["wide_bits"] == 3


@pytest.mark.parametrize("flags, sentence", [
    (("--codecs", "octopus", "--wide-scales", "-1"),
     "--wide-scales must be a comma list of distinct integers >= 0 such as 0,4 (the scales after the sink "
     "scales stored at --wide-bits), got (-1,)"),
    (("--codecs", "octopus", "--wide-scales", "4,4"),
     "--wide-scales must be a comma list of distinct integers"),
    (("--codecs", "octopus", "--wide-scales", "4,x"),
     "--wide-scales must be a comma list of integers >= 0 such as 0,4, got '4,x'"),
    (("--codecs", "octopus", "--wide-scales", ""), "--wide-scales is empty"),
    (("--codecs", "octopus", "--wide-scales", "4", "--wide-bits", "8"),
     "octopus does not take --wide-bits 8 (it takes 1..7"),
    (("--codecs", "turboquant-mse", "--wide-scales", "4", "--wide-bits", "0"),
     "turboquant-mse does not take --wide-bits 0 (it takes 1..8"),
    (("--codecs", "octopus", "--wide-bits", "x"), "argument --wide-bits: invalid int value: 'x'"),
    (("--codecs", "none", "--wide-scales", "4"),
     "--codecs none keeps every scale native and takes no --wide-scales; drop --wide-scales 4, or add a "
     "codec that compresses (for example --codecs none,octopus)"),
    (("--codecs", "octopus", "--sink-scales", "0,3", "--wide-scales", "4,14"),
     "--sink-scales 3 + --wide-scales 14 is more than the model's 16 scales; pass counts whose sum is at "
     "most 16"),
], ids=["negative", "twice", "text", "empty", "bits-the-codec-lacks", "zero-bits", "bits-text", "codec-none",
        "more-than-the-model"])
def test_bad_wide_scales_are_refused_with_one_sentence(tmp_path, capsys, flags, sentence):
    from octopus_audio.cli import main

    make_clips(tmp_path / "clips", n=1)
    try:
        code = main(eval_argv(tmp_path, *flags))
    except SystemExit as e:  # argparse's own refusal (an int flag given text)
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert sentence in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_wide_rows_are_named_and_labelled_beside_the_unchanged_rows(tmp_path):
    """A run without wide scales, resumed with --wide-scales 0,4: its rows are reused (same fingerprint), the
    wide jobs alone generate, their rows record their wide scales and bits (the others nothing new), and the
    WAVs, tables, curves and page tell them apart; other wide bits are refused on resume."""
    clips = make_clips(tmp_path / "clips", n=1)
    out = tmp_path / "out"

    def cfg(**kw):
        return EvalConfig(**{"codecs": ("octopus", "none"), "bits": (2,), "seed": 3, "floor": False,
                             "sink_scales": (0, 2), **kw})

    run_fake(clips, out, cfg=cfg())
    before = rows_of(out)
    pipe = FakePipe()
    run_fake(clips, out, pipe=pipe, cfg=cfg(wide_scales=(0, 4)))
    assert pipe.calls == 2  # octopus b2 with 4 wide scales, at 0 and at 2 sink scales
    rows = rows_of(out)
    assert [r for r in rows if "wide_scales" not in r] == before  # the rows without wide scales, unchanged
    assert [(r["codec"], r["sink_scales"], r.get("wide_scales"), r.get("wide_bits")) for r in rows] == [
        ("reference", None, None, None), ("octopus", 0, None, None), ("octopus", 0, 4, 4),
        ("octopus", 2, None, None), ("octopus", 2, 4, 4), ("none", None, None, None)]
    kv = [r["kv"]["k_bits"] for r in rows if r["codec"] == "octopus"]
    assert kv[1] > kv[0] and kv[3] > kv[2]  # the fake's wide scales store more bits
    assert sorted(p.name for p in (out / "wav").glob("*octopus*")) == [
        "clip0__octopus_b2.wav", "clip0__octopus_b2_s2.wav", "clip0__octopus_b2_s2_w4x4.wav",
        "clip0__octopus_b2_w4x4.wav"]
    assert sorted(p.name for p in (out / "emb").glob("*w4x4*")) == [
        "clip0__octopus_b2_s2_w4x4__d0.npz", "clip0__octopus_b2_w4x4__d0.npz"]

    md = (out / "table.md").read_text()
    assert "\n| octopus | 2 | 2 | 0 | 1 |" in md and "\n| octopus | 2 | 2 | 2 W4@4 | 1 |" in md
    assert "Wide scales (W4@4 after the sink scales)" in md
    for name in ("table.csv", "distribution.csv"):
        table = list(csv.reader(io.StringIO((out / name).read_text())))
        assert table[0][:6] == ["codec", "bits", "v_bits", "sink_scales", "wide_scales", "wide_bits"]
        cells = [r[:6] for r in table[1:] if r[0] in ("octopus", "none")]
        assert cells == [["octopus", "2", "2", "0", "0", ""], ["octopus", "2", "2", "0", "4", "4"],
                         ["octopus", "2", "2", "2", "0", ""], ["octopus", "2", "2", "2", "4", "4"],
                         ["none", "", "", "", "", ""]], name
    curves = json.loads((out / "plots" / "rate_distortion.json").read_text())["tf_kl_nats"]["codecs"]
    assert sorted(curves) == ["octopus S=0 W=0", "octopus S=0 W=4@4", "octopus S=2 W=0", "octopus S=2 W=4@4"]
    page = (out / "index.html").read_text()
    assert "<th>b2 S2 W4@4</th>" in page and "src='wav/clip0__octopus_b2_s2_w4x4.wav'" in page
    assert "id='c0-octopus-b2-s2-w4x4'" in page

    with pytest.raises(UsageError, match="wide_bits differs; wide_bits was null, now 3"):
        run_fake(clips, out, cfg=cfg(wide_scales=(0, 4), wide_bits=3))


def test_wide_scales_store_more_bits_on_a_tiny_model(tmp_path):
    """The real patch under a tiny AAR (scales 1, 2, 4, 8): keys and values of the first 2 and of all 4 scales
    at 4 bits, the rest at 2, store more bits per coordinate than none wide, the more the more scales are."""
    clips = make_clips(tmp_path / "clips", n=1)
    cfg = EvalConfig(codecs=("octopus",), bits=(2,), seed=3, floor=False, sink_scales=(0,),
                     wide_scales=(0, 2, 4))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model's ops are too small for intra-op threads
    try:
        results = run_real(clips, tmp_path / "out", tiny_pipe(), cfg)
    finally:
        torch.set_num_threads(threads)
    assert results["rows"]["failed"] == 0
    rows = [r for r in rows_of(tmp_path / "out") if r["codec"] == "octopus"]
    assert [r.get("wide_scales", 0) for r in rows] == [0, 2, 4]
    rates = [(r["kv"]["k_bits"] + r["kv"]["v_bits"]) / 2 for r in rows]
    assert rates[0] < rates[1] < rates[2], rates


def test_equal_rate_tables_compare_codecs_at_the_same_wide_scales():
    """Made-up aggregates of two codecs at 0 and 2 wide scales: one equal-rate table per count, each codec
    read against the others at its own count only."""
    from test_eval_report import _group

    from octopus_audio.eval.report import _equal_rate_lines, equal_rate_entries

    codecs = (("octopus", 0.1), ("turboquant-mse", 0.12))
    groups = [{**_group(codec, b, 0, b + 1 + 0.2 * w + (0.5 if codec == "octopus" else 0), kl / b),
               "wide_scales": w, "wide_bits": 4 if w else None}
              for codec, kl in codecs for w in (0, 2) for b in (2, 3, 4)]
    text = "\n".join(_equal_rate_lines(groups))
    assert "at equal rate, 0 wide scales" in text and "at equal rate, 2 wide scales" in text
    assert "Codecs are compared at the same count of wide scales." in text and "sink scale" not in text
    heads = [line for line in text.splitlines() if line.startswith("| codec |")]
    assert len(heads) == 2
    assert "turboquant-mse W=0 at this rate" in heads[0] and "W=2" not in heads[0]
    assert "turboquant-mse W=2@4 at this rate" in heads[1] and "W=0" not in heads[1]
    entries = equal_rate_entries(groups)
    assert entries and all((e["wide_scales"] == 2) == e["label"].endswith(" W2@4") for e in entries)
    assert all(e["peer"].endswith("W=2@4" if e["wide_scales"] else "W=0") for e in entries)
