"""The eval under torchrun on CPU (gloo): the real default model in two processes gives the rows and WAVs of
one process; a process that dies leaves the other's rows and the rerun resumes; a refusal reaches every
process; the device each process takes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from octopus_audio.errors import UsageError
from octopus_audio.eval.cli import default_clips_dir
from octopus_audio.eval.distributed import DistInfo, resolve_device
from octopus_audio.eval.sources import list_folder

torch = pytest.importorskip("torch")
pytest.importorskip("soundfile")

TESTS = Path(__file__).resolve().parent


def env_1_thread(tmp_path: Path) -> dict:
    """One intra-op thread per process, the reference attention (as a CPU eval runs by default, whatever
    kernel test ran before in this session), and a conditioning cache of the test's own."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return {**env, "OMP_NUM_THREADS": "1", "XDG_CACHE_HOME": str(tmp_path / "xdg")}


def torchrun(args: list[str], env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           "2", *args], capture_output=True, text=True, timeout=timeout, env=env)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# the real default model ---------------------------------------------------------------------------------

DEFAULT_MODEL_CLIPS = ("ambi_choir.flac", "ambi_piano.flac", "misc_crow.flac")  # 3: rank 0 runs two


@pytest.mark.slow
def test_the_default_model_under_torchrun_gives_the_rows_and_wavs_of_one_process(tmp_path):
    """`torchrun --nproc_per_node 2 -m octopus_audio eval` with the embedded model, gloo on CPU, against the
    same eval in one process: every merged row equal but its wall time (`seconds`), every WAV byte for byte,
    each reference's saved tokens equal, and the tables equal. One clip a batch in both runs: a batch's
    matmuls round differently from one clip's (README, determinism), and a rank's batches hold other clips
    than the single process's."""
    clips = tmp_path / "clips"
    clips.mkdir()
    for name in DEFAULT_MODEL_CLIPS:
        (clips / name).write_bytes((default_clips_dir() / name).read_bytes())
    env = env_1_thread(tmp_path)

    def args(out: str) -> list[str]:
        return ["-m", "octopus_audio", "eval", "--clips", str(clips), "--codecs", "octopus", "--bits", "2",
                "--no-floor", "--clap", "spectral", "--device", "cpu", "--threads", "1", "--no-progress",
                "--batch-size", "1", "--draws", "1", "--out", str(tmp_path / out)]

    one = subprocess.run([sys.executable, *args("one")], capture_output=True, text=True, timeout=300,
                         env=env)
    assert one.returncode == 0, one.stderr[-3000:]
    two = torchrun(args("two"), env)
    assert two.returncode == 0, two.stderr[-3000:]

    shards = {p.name: read_jsonl(p) for p in sorted((tmp_path / "two" / "rows").iterdir())}
    assert {name: [r["clip"] for r in rows] for name, rows in shards.items()} == {
        "rank0.jsonl": ["ambi_choir"] * 2 + ["misc_crow"] * 2, "rank1.jsonl": ["ambi_piano"] * 2}
    rows_one, rows_two = (read_jsonl(tmp_path / d / "rows.jsonl") for d in ("one", "two"))
    assert [r["status"] for r in rows_one] == ["ok"] * 6  # the reference's own row and octopus b=2 a clip
    assert all(r["metrics"]["lsd_db"] > 0 for r in rows_one if r["codec"] == "octopus")  # changed the output
    for r in rows_one + rows_two:
        assert r.pop("seconds") > 0
    assert rows_two == rows_one

    wavs = sorted(p.name for p in (tmp_path / "one" / "wav").iterdir())
    assert len(wavs) == 3 * 3  # input, reference, octopus at 2 bits per clip
    assert sorted(p.name for p in (tmp_path / "two" / "wav").iterdir()) == wavs
    for name in wavs:
        alone, shared = ((tmp_path / d / "wav" / name).read_bytes() for d in ("one", "two"))
        assert shared == alone, name
    for name in DEFAULT_MODEL_CLIPS:
        refs = [np.load(tmp_path / d / "refs" / f"{Path(name).stem}.npz") for d in ("one", "two")]
        assert np.array_equal(refs[0]["tokens"], refs[1]["tokens"])
    for name in ("table.md", "table.csv"):
        assert (tmp_path / "two" / name).read_text() == (tmp_path / "one" / name).read_text()


# a process that dies, a refusal: the fake pipeline of test_eval_runner -----------------------------------

CHILD = """
import os, sys, time
sys.path.insert(0, {tests!r})
import test_eval_runner as t
from pathlib import Path
from octopus_audio.errors import UsageError
from octopus_audio.eval import distribution
distribution.RESAMPLES = {resamples}  # as the parent test's (tests/conftest.py)

out, rank, mode = Path({out!r}), int(os.environ["RANK"]), {mode!r}
pipe = t.FakePipe()
real_generate = t.fake_generate

def dying_generate(p, *args, **kwargs):
    # the 10th generation of the dying rank (clip 2's reference and floor done): once the other rank has
    # written all its rows, this process dies as an OOM kill would, with no clean-up
    if p.calls == 9:
        other = out / "rows" / f"rank{{1 - rank}}.jsonl"
        while not other.exists() or len(other.read_text().splitlines()) < {other_rows}:
            time.sleep(0.05)
        os._exit(3)
    return real_generate(p, *args, **kwargs)

if mode == "dies" and rank == {dying}:
    t.fake_generate = dying_generate
try:
    t.run_fake(Path({clips!r}), out, pipe=pipe, n=3 if mode == "other-clips" and rank == 1 else 10)
except UsageError as e:
    (out.parent / f"refusal{{rank}}.txt").write_text(str(e))
    sys.exit(2)
(out.parent / f"generations{{rank}}.txt").write_text(str(pipe.calls))
"""


def run_children(tmp_path: Path, out: Path, mode: str, dying: int = -1, other_rows: int = 0):
    from test_eval_runner import make_clips

    clips = make_clips(tmp_path / "clips", n=5)
    script = tmp_path / f"child_{mode}.py"
    from octopus_audio.eval import distribution

    script.write_text(CHILD.format(tests=str(TESTS), clips=str(clips), out=str(out), mode=mode, dying=dying,
                                   other_rows=other_rows, resamples=distribution.RESAMPLES))
    return clips, torchrun([str(script)], env_1_thread(tmp_path), timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("dying,rerun", [(0, "alone"), (1, "torchrun")],
                         ids=["rank0-the-merger-dies-rerun-alone", "rank1-dies-rerun-under-torchrun"])
def test_a_process_that_dies_leaves_the_others_rows_and_the_rerun_resumes(tmp_path, dying, rerun):
    """Clips 0, 2, 4 on rank 0 and 1, 3 on rank 1 (7 rows each: the reference's own, floor + 5 jobs). One
    rank dies at its 10th generation after the other wrote all its rows: the survivor's rows stay as written,
    the dead rank's finished ones too (its first clip, its second clip's reference and floor rows). The
    rerun (the same torchrun command, or one process when a GPU is gone) runs only the dead rank's missing
    jobs and gives the rows and report of one uninterrupted process."""
    from test_eval_runner import FakePipe, report_files, run_fake

    out = tmp_path / "two"
    survivor_rows = (3 if dying == 1 else 2) * 7
    clips, proc = run_children(tmp_path, out, "dies", dying, survivor_rows)
    assert proc.returncode != 0
    assert not (out / "rows.jsonl").exists()
    survivor, dead = out / "rows" / f"rank{1 - dying}.jsonl", out / "rows" / f"rank{dying}.jsonl"
    kept = {p: p.read_bytes() for p in (survivor, dead)}
    assert len(read_jsonl(survivor)) == survivor_rows
    assert [(r["clip"], r["status"]) for r in read_jsonl(dead)] == [(f"clip{dying}", "ok")] * 7 + [
        (f"clip{dying + 2}", "ok")] * 2

    if rerun == "torchrun":  # rank 1 runs its second clip's 5 jobs (its reference was saved), rank 0 none
        _, proc = run_children(tmp_path, out, "rerun")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert [int((tmp_path / f"generations{r}.txt").read_text()) for r in (0, 1)] == [0, 5]
    else:  # one process runs rank 0's missing jobs: its second clip's 5 (reference saved), its third clip's 7
        pipe = FakePipe()
        run_fake(clips, out, pipe=pipe)
        assert pipe.calls == 5 + 7
    for path, before in kept.items():
        assert path.read_bytes()[: len(before)] == before
    assert survivor.read_bytes() == kept[survivor]
    run_fake(clips, tmp_path / "one")
    assert report_files(out) == report_files(tmp_path / "one")


@pytest.mark.parametrize("mode,expected", [
    ("foreign-folder", "holds files that `octopus-audio eval` did not write"),
    ("other-clips", "torchrun process 1 lists 3 clips and process 0 5, differing from clip {first} on "
                    "(a name or its audio); every process must read the same --clips"),
], ids=["rank0-refuses-the-folder", "the-processes-list-other-clips"])
def test_a_refusal_reaches_every_process(tmp_path, mode, expected):
    """What one process refuses, all do, with the same sentence, and at once (no process waits at a barrier
    for one that gave up): rank 0 refusing a folder it did not write, or the processes listing other clips."""
    out = tmp_path / "two"
    if mode == "foreign-folder":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    clips, proc = run_children(tmp_path, out, mode)
    assert proc.returncode != 0
    if mode == "other-clips":  # the first clip the two listings (sorted, then drawn by seed) disagree on
        ids = [[r.clip_id for r in list_folder(clips, n=n, seed=0)] for n in (3, 10)]
        expected = expected.format(first=next(i for i in range(3) if ids[0][i] != ids[1][i]) + 1)
    refusals = [(tmp_path / f"refusal{r}.txt").read_text() for r in (0, 1)]
    assert refusals[0] == refusals[1] and expected in refusals[0], refusals
    assert not (out / "rows").exists()
    if mode == "foreign-folder":
        assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


# the device of each process -----------------------------------------------------------------------------

def fake_gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize("spec,info,gpus,expected", [
    ("auto", DistInfo(0, 1, 0), 0, "cpu"),
    ("cpu", DistInfo(1, 2, 1), 2, "cpu"),
    ("auto", DistInfo(1, 2, 1), 2, "cuda:1"),
    ("cuda", DistInfo(3, 4, 1), 2, "cuda:1"),  # the second node of two: its local rank's GPU
    ("cuda:1", DistInfo(0, 1, 0), 2, "cuda:1"),
], ids=["auto-without-gpu", "cpu-under-torchrun", "auto-under-torchrun", "cuda-local-rank", "cuda-1-alone"])
def test_each_process_takes_its_local_ranks_gpu(monkeypatch, spec, info, gpus, expected):
    fake_gpus(monkeypatch, gpus)
    assert resolve_device(spec, info) == expected


@pytest.mark.parametrize("spec,info,gpus,match", [
    ("gpu", DistInfo(0, 1, 0), 1, r"unknown --device 'gpu'; accepted: auto, cpu, cuda, cuda:N"),
    ("cuda:x", DistInfo(0, 1, 0), 1, r"unknown --device 'cuda:x'"),
    ("cuda", DistInfo(0, 1, 0), 0, r"--device cuda:0: no CUDA GPU is visible; pass --device cpu"),
    ("auto", DistInfo(2, 3, 2), 2, r"local rank 2 would take GPU 2 but 2 GPUs are visible; pass "
                                   r"--nproc_per_node at most 2"),
    ("cuda:0", DistInfo(1, 2, 1), 2, r"would put all 2 torchrun processes on one GPU; pass --device cuda"),
    ("cuda:3", DistInfo(0, 1, 0), 1, r"--device cuda:3 names GPU 3 but 1 GPU is visible"),
], ids=["unknown", "bad-index", "cuda-without-gpu", "more-processes-than-gpus", "one-gpu-for-all",
        "index-past-the-gpus"])
def test_a_device_no_process_can_use_is_refused(monkeypatch, spec, info, gpus, match):
    fake_gpus(monkeypatch, gpus)
    with pytest.raises(UsageError, match=match):
        resolve_device(spec, info)


def test_every_eval_flag_passes_through_torchruns_parser():
    """torchrun parses the whole command line with abbreviations on, so a flag after `-m octopus_audio eval`
    that abbreviates its own flags is refused there (`--n`: --nnodes, --nproc-per-node, ...): each eval flag
    has a spelling torchrun hands on untouched (`--n-clips` for `--n`)."""
    import argparse

    from torch.distributed.run import get_args_parser

    from octopus_audio.eval.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    passing = {}
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        passing[action.dest] = []
        for flag in action.option_strings:
            argv = ["--nproc_per_node", "2", "-m", "octopus_audio", "eval", flag, "1", "--out", "o"]
            try:
                args = get_args_parser().parse_args(argv)
            except SystemExit:
                continue
            if args.training_script_args == argv[4:]:
                passing[action.dest].append(flag)
    assert passing["n"] == ["--n-clips"]
    assert not [dest for dest, flags in passing.items() if not flags]


def test_the_gpu_is_made_current_before_the_conditioner_is_built(monkeypatch, tmp_path):
    """`eval --device cuda` makes the local rank's GPU the current one before any CUDA work (the conditioner
    may load onto the GPU; Triton launches and NCCL's object collectives use the current GPU)."""
    from test_eval_runner import make_clips

    import octopus_audio.eval.conditioning as conditioning
    from octopus_audio.cli import main

    fake_gpus(monkeypatch, 2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    order = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: order.append(("set_device", str(d))))

    def conditioner(spec, device):
        order.append(("conditioner", device))
        raise UsageError("stop here")

    monkeypatch.setattr(conditioning, "make_conditioner", conditioner)
    assert main(["eval", "--device", "cuda", "--clips", str(make_clips(tmp_path / "c", n=1)),
                 "--out", str(tmp_path / "o"), "--clap", "spectral", "--no-progress"]) == 2
    assert order == [("set_device", "cuda:1"), ("conditioner", "cuda:1")]
