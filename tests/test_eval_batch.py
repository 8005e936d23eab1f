"""Batched evaluation with the fake pipeline: rows equal batch size 1's, a failing clip fails only its own
rows, an interrupted batch resumes under another batch size, and --batch-size is validated."""

import json

import pytest
from test_eval_runner import (
    FakeConditioner,
    FakePipe,
    _cond_key,
    config,
    make_clips,
    report_files,
    run_fake,
)

from octopus_audio.eval.records import FLOOR
from octopus_audio.eval.sources import CLAP_RATE, decode, list_folder, prepare

torch = pytest.importorskip("torch")

N_JOBS = 6  # the sampling floor + none + octopus and turboquant-mse at two widths each
N_ROWS = N_JOBS + 1  # and the reference's own row


def rows_of(out) -> list[dict]:
    return [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]


def key_of(clips, clip_id: str) -> int:
    """The fake's key for a clip's condition (what FakePipe.fail_cond names)."""
    ref = next(r for r in list_folder(clips, n=10, seed=0) if r.clip_id == clip_id)
    return _cond_key(FakeConditioner().embed(prepare(decode(ref), CLAP_RATE)))


@pytest.mark.parametrize("batch_size", [2, 3, 16], ids=["b2", "b3-uneven", "b16-all"])
def test_batched_rows_equal_unbatched(tmp_path, batch_size):
    clips = make_clips(tmp_path / "clips", n=5)
    one = FakePipe()
    run_fake(clips, tmp_path / "one", pipe=one)
    many = FakePipe()
    run_fake(clips, tmp_path / "many", pipe=many, batch_size=batch_size)
    assert report_files(tmp_path / "many") == report_files(tmp_path / "one")
    batches = -(-5 // batch_size)
    assert (one.calls, many.calls) == (5 * (N_JOBS + 1), batches * (N_JOBS + 1))  # + the reference
    # a clip's teacher-forced passes see its own reference tokens whatever the batch
    assert sorted(many.forced, key=repr) == sorted(one.forced, key=repr)


def test_a_failing_clip_in_a_batch_fails_only_its_own_rows(tmp_path):
    clips = make_clips(tmp_path / "clips", n=4)
    bad = key_of(clips, "clip2")
    pipe = FakePipe(fail_cond=(bad, ("octopus", 4)))  # clip2's generation under octopus b=4 raises
    run_fake(clips, tmp_path / "out", pipe=pipe, batch_size=4)
    rows = rows_of(tmp_path / "out")
    failed = [(r["clip"], r["codec"], r["bits"], r["stage"]) for r in rows if r["status"] == "error"]
    assert failed == [("clip2", "octopus", 4, "generate")]
    assert "injected failure of one clip" in next(r["error"] for r in rows if r["status"] == "error")
    # every other row is what an unbatched run without the failure gives
    run_fake(clips, tmp_path / "clean")
    clean = {(r["clip"], r["codec"], r["bits"]): r for r in rows_of(tmp_path / "clean")}
    for r in rows:
        if r["status"] == "ok":
            assert r["metrics"] == clean[(r["clip"], r["codec"], r["bits"])]["metrics"]
    assert sum(r["status"] == "ok" for r in rows) == 4 * N_ROWS - 1

    # a clip whose reference fails: all its rows are errors of stage `reference`, the batch goes on
    pipe = FakePipe(fail_cond=(bad, None))
    run_fake(clips, tmp_path / "ref", pipe=pipe, batch_size=4)
    rows = rows_of(tmp_path / "ref")
    assert {(r["clip"], r["stage"]) for r in rows if r["status"] == "error"} == {("clip2", "reference")}
    assert sum(r["status"] == "ok" for r in rows) == 3 * N_ROWS


def test_a_broken_file_leaves_the_batch_and_the_others_run(tmp_path):
    clips = make_clips(tmp_path / "clips", n=3, broken=True)
    run_fake(clips, tmp_path / "one")
    run_fake(clips, tmp_path / "many", batch_size=4)
    assert report_files(tmp_path / "many") == report_files(tmp_path / "one")
    rows = rows_of(tmp_path / "many")
    assert {r["stage"] for r in rows if r["clip"] == "clip_broken"} == {"load"}


def test_an_interrupted_batch_resumes_under_another_batch_size(tmp_path):
    clips = make_clips(tmp_path / "clips", n=5)
    run_fake(clips, tmp_path / "full")
    full = report_files(tmp_path / "full")
    # batches of 2: the first batch takes generations 1-7 (reference, floor, five jobs), the second's
    # reference is generation 8 and its floor 9; interrupting at 10 leaves it with its reference and floor
    # rows alone
    with pytest.raises(KeyboardInterrupt):
        run_fake(clips, tmp_path / "out", pipe=FakePipe(interrupt_at=10), batch_size=2)
    first = rows_of_rank(tmp_path / "out")
    assert [r["clip"] for r in first if r["codec"] == FLOOR] == ["clip0", "clip1", "clip2", "clip3"]
    assert len(first) == 2 * N_ROWS + 2 + 2
    pipe = FakePipe()
    run_fake(clips, tmp_path / "out", pipe=pipe, batch_size=3)
    assert report_files(tmp_path / "out") == full
    keys = [(r["clip"], r["codec"], r["bits"]) for r in rows_of_rank(tmp_path / "out")]
    assert len(keys) == len(set(keys)) == 5 * N_ROWS  # nothing lost, nothing twice
    # the rerun: clips 2, 3 (saved references, floors done) and clip4 in one batch of three: clip4's
    # reference, the floor (clip4 alone) and five codec jobs
    assert pipe.calls == 1 + 1 + 5


def rows_of_rank(out) -> list[dict]:
    return [json.loads(line) for line in (out / "rows" / "rank0.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("value, shown", [("0", "0"), ("-2", "-2"), ("x", "'x'"), ("1.5", "'1.5'")],
                         ids=["zero", "negative", "word", "fraction"])
def test_cli_refuses_a_bad_batch_size(tmp_path, capsys, value, shown):
    from octopus_audio.cli import main

    argv = ["eval", "--batch-size", value, "--clips", str(make_clips(tmp_path / "c", n=1)), "--clap",
            "spectral", "--codecs", "octopus", "--out", str(tmp_path / "o"), "--device", "cpu"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--batch-size must be an integer >= 1 (generations run together), got {shown}" in err
    assert "Traceback" not in err and not (tmp_path / "o").exists()


def test_cli_passes_the_batch_size_and_cpu_default(tmp_path, monkeypatch):
    import octopus_audio.eval.runner as runner
    from octopus_audio.cli import main
    from octopus_audio.eval.cli import CPU_BATCH

    seen = []
    monkeypatch.setattr(runner, "evaluate", lambda *a, **kw: seen.append(kw["batch_size"]))
    base = ["eval", "--clips", str(make_clips(tmp_path / "c", n=1)), "--clap", "spectral", "--codecs",
            "octopus", "--out", str(tmp_path / "o"), "--device", "cpu", "--no-progress",
            "--cache-dir", str(tmp_path / "cache")]
    assert main(base + ["--batch-size", "7"]) == 0
    assert main(base) == 0
    assert seen == [7, CPU_BATCH]


def test_evaluate_refuses_a_bad_batch_size(tmp_path):
    from octopus_audio.errors import UsageError
    from octopus_audio.eval.runner import evaluate

    with pytest.raises(UsageError, match="--batch-size must be an integer >= 1"):
        evaluate([], tmp_path / "o", config(), lambda device: None, FakeConditioner(), batch_size=0)
    assert not (tmp_path / "o").exists()
