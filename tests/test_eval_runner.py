"""The eval runner with a fake AAR pipeline injected: resume after an interrupt, recorded failures, torchrun
sharding, settings checks, teacher-forced fidelity on the saved reference tokens. The fakes here are also used
by test_eval_report.py and the torchrun child."""

import contextlib
import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from octopus_audio.aar_patch.config import DEFAULT_SINK_SCALES
from octopus_audio.errors import UsageError
from octopus_audio.eval.backends import AARBackend, LazyBackend
from octopus_audio.eval.batch import kv_summary
from octopus_audio.eval.records import FLOOR, KV_FLOOR, REFERENCE, EvalConfig, Job
from octopus_audio.eval.runner import evaluate
from octopus_audio.eval.sources import list_folder

sf = pytest.importorskip("soundfile")
torch = pytest.importorskip("torch")

CODECS = ("none", "octopus", "turboquant-mse")
BITS = (2, 4)
FAKE_PATCH_NUMS = (1, 4, 16)  # scales of the fake model
FAKE_VOCAB = 16
SINKS = f"_s{DEFAULT_SINK_SCALES}"  # what a codec's file names end with at the default sink scales


class FakeGeneration:
    def __init__(self, tokens, audio, fhat):
        self.tokens, self.audio, self.fhat = tokens, audio, fhat


class FakeSAT:
    """The tokenizer's encoder as the eval's latent embedding uses it: (B, 1, N) -> (B, 8, N // 400)
    frames, a fixed mix of each frame's samples."""

    mix = torch.from_numpy(np.random.default_rng(7).standard_normal((400, 8))).float()

    def encode_latent(self, audio_B1N):
        frames = audio_B1N.reshape(audio_B1N.shape[0], -1, 400)
        return (frames @ self.mix).transpose(1, 2)


class FakePipe:
    """Stands in for AARPipeline: counts generations, can stop the run (KeyboardInterrupt) or fail a codec;
    remembers the tokens each teacher-forced pass was given."""

    sat = FakeSAT()

    def __init__(self, interrupt_at=None, fail_codec=None, fail_cond=None):
        self.active = None
        self.fail_cond = fail_cond  # (_cond_key of a clip, pipe.active): that clip's generation fails there
        self.calls = 0
        self.interrupt_at = interrupt_at
        self.fail_codec = fail_codec
        self.forced = []  # (active codec, tokens as tuples)


def _cond_key(cond_BD) -> int:
    return int(abs(float(cond_BD.sum())) * 1e6) % 100_000


def fake_generate(pipe, cond_BD, cfg, top_k, top_p, seed):
    """Deterministic in (condition, seed) per row (`seed`: an int, or one per row as the eval passes them);
    under a codec, noise of size 2^-bits, different per codec. One call, however many rows."""
    pipe.calls += 1
    if pipe.interrupt_at is not None and pipe.calls >= pipe.interrupt_at:
        raise KeyboardInterrupt
    if pipe.active is not None and pipe.active == pipe.fail_codec:
        raise RuntimeError("injected generation failure")
    seeds = [seed] * cond_BD.shape[0] if isinstance(seed, int) else list(seed)
    rows = [_fake_row(pipe, cond_BD[i], s) for i, s in enumerate(seeds)]
    return FakeGeneration([torch.cat([r[0][si] for r in rows]) for si in range(len(FAKE_PATCH_NUMS))],
                          torch.cat([r[1] for r in rows]), torch.cat([r[2] for r in rows]))


def _fake_row(pipe, cond_D, seed):
    if pipe.fail_cond is not None and (_cond_key(cond_D), pipe.active) == pipe.fail_cond:
        raise RuntimeError("injected failure of one clip")
    key = _cond_key(cond_D)
    base = np.random.default_rng([seed, key]).standard_normal(6000 + 128 * 75)
    tokens = np.random.default_rng([seed, key, 1]).integers(0, FAKE_VOCAB, sum(FAKE_PATCH_NUMS))
    if pipe.active is not None and pipe.active[0] != "none":
        codec, bits = pipe.active
        noise = np.random.default_rng([seed, key, len(codec), bits]).standard_normal(base.size)
        base = base + noise * 2.0 ** -bits * (1.0 + 0.5 * (codec == "turboquant-mse"))
        tokens = (tokens + 1) % FAKE_VOCAB  # sampling diverged: no token of the reference survives
    audio = torch.from_numpy(0.1 * base[:6000]).float().reshape(1, 1, -1)
    fhat = torch.from_numpy(base[6000:]).float().reshape(1, 128, 75)
    splits = np.split(tokens, np.cumsum(FAKE_PATCH_NUMS)[:-1])
    return [torch.from_numpy(t).reshape(1, -1) for t in splits], audio, fhat


def fake_teacher_forced(pipe, cond_BD, tokens, cfg):
    """Per scale (B, pn, V) softmax of logits fixed by (condition, forced tokens) per row; under a codec the
    logits get noise of size 2^-bits, so agreement rises and KL falls with bits; codec `none` changes
    nothing."""
    B = cond_BD.shape[0]
    assert [tuple(t.shape) for t in tokens] == [(B, pn) for pn in FAKE_PATCH_NUMS]
    rows = []
    for i in range(B):
        pipe.forced.append((pipe.active, tuple(int(v) for t in tokens for v in t[i].reshape(-1))))
        key = _cond_key(cond_BD[i])
        probs = []
        for si, t in enumerate(tokens):
            seed = [key, si, *(int(v) for v in t[i].reshape(-1))]
            logits = np.random.default_rng(seed).standard_normal((1, t.shape[1], FAKE_VOCAB))
            if pipe.active is not None and pipe.active[0] != "none":
                codec, bits = pipe.active
                noise = np.random.default_rng([*seed, len(codec), bits]).standard_normal(logits.shape)
                logits = logits + 4.0 * noise * 2.0 ** -bits
            probs.append(torch.softmax(torch.from_numpy(logits).float(), dim=-1))
        rows.append(probs)
    return [torch.cat([r[si] for r in rows]) for si in range(len(tokens))]


class FakeStats:
    def __init__(self, bits, v_bits=None, wide_scales=0):
        self.bits = bits
        self.v_bits = bits if v_bits is None else v_bits
        self.wide = 0.5 * wide_scales  # wide scales raise the stored bits

    def as_dict(self):  # the shape of aar_patch's CacheStats.as_dict()
        b, vb = self.bits + self.wide, self.v_bits + self.wide
        return {"config": {}, "total": {"ratio": 16.0 / (b + 0.5), "k_bits": b + 0.25, "v_bits": vb + 2.0},
                "layers": []}


@contextlib.contextmanager
def fake_compressed_kv(pipe, codec, bits, window=1, v_group=16, seed=0, v_bits=None, kv_dtype=None,
                       sink_scales=0, wide_scales=0, wide_bits=4):
    if kv_dtype is not None:  # the bf16-KV floor: the fakes add noise of 2^-16 and change every token
        assert (codec, bits, kv_dtype) == ("none", 16, torch.bfloat16)
        codec = KV_FLOOR
    pipe.active = (codec, bits)  # the fake's noise follows the key bits
    try:
        yield type("Handle", (), {"stats": lambda self: FakeStats(bits, v_bits, wide_scales)})()
    finally:
        pipe.active = None


class FakeConditioner:
    name = "fake-cond"
    fingerprint = "fake-cond-v1"
    clap = False

    def embed(self, audio_T):
        v = np.random.default_rng(int(abs(audio_T).sum() * 1000) % 2**32).standard_normal(512)
        return (v / np.linalg.norm(v)).astype(np.float32)


def make_clips(folder: Path, n: int = 4, broken: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        t = np.arange(12000) / 24000
        sf.write(folder / f"clip{i}.wav", 0.3 * np.sin(2 * np.pi * (220 + 110 * i) * t), 24000)
    if broken:
        (folder / "clip_broken.wav").write_bytes(b"RIFF but not audio")
    return folder


def config(codecs=CODECS, bits=BITS):
    return EvalConfig(codecs=codecs, bits=bits, seed=3)


def run_fake(clips: Path, out: Path, pipe=None, cfg=None, n=10, batch_size=1, overwrite=False):
    cfg = cfg or config()
    pipe = pipe or FakePipe()
    refs = list_folder(clips, n=n, seed=0)

    def build():
        pipe.builds = getattr(pipe, "builds", 0) + 1
        return AARBackend(pipe, cfg, "fake-aar", "cpu", generate_fn=fake_generate,
                          compressed_kv_fn=fake_compressed_kv, teacher_forced_fn=fake_teacher_forced)

    def make_backend(device):
        return LazyBackend(build, "fake-aar")

    return evaluate(refs, out, cfg, make_backend, FakeConditioner(), meta={"clips": "test"}, progress=False,
                    batch_size=batch_size, overwrite=overwrite)


def report_files(out: Path) -> dict:
    """What must be equal between two runs: report files, merged rows without timings (seconds, and the
    thread count: the torchrun children run with 1), the WAV names."""
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    for r in rows:
        r.pop("seconds")
        r.pop("threads")
    return {"results": (out / "results.json").read_text(), "md": (out / "table.md").read_text(),
            "csv": (out / "table.csv").read_text(), "rows": rows,
            "wav": sorted(p.name for p in (out / "wav").iterdir()),
            "html": (out / "index.html").read_text().replace(str(out), "OUT")}


def test_interrupted_run_resumes_without_lost_or_duplicate_rows(tmp_path):
    clips = make_clips(tmp_path / "clips")
    n_jobs = 3 + 2 * len(BITS)  # the reference's own row, the sampling floor, none, two codecs x two widths
    run_fake(clips, tmp_path / "full")
    full = report_files(tmp_path / "full")
    assert len(full["rows"]) == 4 * n_jobs

    # generation 9 raises KeyboardInterrupt: clip0 done (7 generations: reference, floor, 5 jobs; its
    # reference row is the reference), clip1's reference is generation 8 and its floor generation 9
    with pytest.raises(KeyboardInterrupt):
        run_fake(clips, tmp_path / "resumed", pipe=FakePipe(interrupt_at=9))
    log = tmp_path / "resumed" / "rows" / "rank0.jsonl"
    first = log.read_text().splitlines()
    assert 0 < len(first) < 4 * n_jobs
    assert [json.loads(line)["clip"] for line in first if FLOOR in line] == ["clip0"]
    with open(log, "a") as f:  # a row torn by a kill in the middle of a write
        f.write('{"clip": "clip1", "codec": "octo')
    pipe = FakePipe()
    run_fake(clips, tmp_path / "resumed", pipe=pipe)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    keys = [(r["clip"], r["codec"], r["bits"]) for r in rows]
    assert len(keys) == len(set(keys)) == 4 * n_jobs  # nothing lost, nothing twice, torn line gone
    assert sorted(c for c, codec, _ in keys if codec == FLOOR) == [f"clip{i}" for i in range(4)]
    assert log.read_text().splitlines()[: len(first)] == first
    remaining = 4 * n_jobs - len(first)
    assert pipe.calls <= remaining + 2  # only the missing rows (+ references not saved yet) were generated
    assert report_files(tmp_path / "resumed") == full

    # a third run has nothing left to do
    pipe = FakePipe()
    run_fake(clips, tmp_path / "resumed", pipe=pipe)
    assert pipe.calls == 0 and not hasattr(pipe, "builds")  # the model was not even loaded
    assert report_files(tmp_path / "resumed") == full


def test_failures_are_recorded_and_the_run_goes_on(tmp_path):
    clips = make_clips(tmp_path / "clips", n=2, broken=True)
    results = run_fake(clips, tmp_path / "out", pipe=FakePipe(fail_codec=("octopus", 4)))
    rows = [json.loads(line) for line in (tmp_path / "out" / "rows.jsonl").read_text().splitlines()]
    broken = [r for r in rows if r["clip"] == "clip_broken"]
    assert len(broken) == 7 and all(r["status"] == "error" and r["stage"] == "load" for r in broken)
    failed_gen = [r for r in rows if r["status"] == "error" and r["stage"] == "generate"]
    assert {(r["clip"], r["codec"], r["bits"]) for r in failed_gen} == {("clip0", "octopus", 4),
                                                                        ("clip1", "octopus", 4)}
    assert all("injected generation failure" in r["error"] and r["metrics"] is None for r in failed_gen)
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == 2 * 7 - 2
    groups = {(g["codec"], g["bits"]): g for g in results["groups"]}
    assert groups[("octopus", 4)]["clips_ok"] == 0 and groups[("octopus", 4)]["metrics"]["snr_db"] is None
    assert groups[("octopus", 2)]["clips_ok"] == 2 and groups[("octopus", 2)]["clips_failed"] == 1
    assert len(results["failures"]) == 7 + 2 and results["rows"] == {"ok": 12, "failed": 9}
    # the codec-none row went through the patch and matches the reference exactly
    assert groups[("none", None)]["metrics"]["snr_db"] == {"min": 120.0, "mean": 120.0, "max": 120.0}
    # more bits, less damage: the fake's noise halves per bit (SNR +6 dB per bit)
    snr = {b: groups[("turboquant-mse", b)]["metrics"]["snr_db"]["mean"] for b in BITS}
    assert snr[4] - snr[2] == pytest.approx(12.04, abs=1.0)
    assert groups[("octopus", 2)]["ratio"]["mean"] == pytest.approx(16 / 2.5)
    assert "octopus" in (tmp_path / "out" / "table.md").read_text()
    # teacher-forced fidelity: exact through the patch with codec none, finite and in range otherwise
    for r in ok:
        if r["codec"] == REFERENCE:  # the reference's own row: the distribution metrics' only
            assert r["metrics"] is None and -1.0 <= r["adherence"] <= 1.0
            continue
        if r["codec"] == FLOOR:  # no teacher-forced metrics (see test_eval_floor.py)
            assert "tf_top1" not in r["metrics"] and "tf_kl_nats" not in r["metrics"]
            continue
        top1, kl = r["metrics"]["tf_top1"], r["metrics"]["tf_kl_nats"]
        if r["codec"] == "none":
            assert (top1, kl) == (1.0, 0.0)
        else:
            assert 0.0 <= top1 <= 1.0 and 0.0 < kl < 10.0
    for codec in ("octopus", "turboquant-mse"):  # the fake's logit noise halves per bit
        tf = {b: groups[(codec, b)]["metrics"] for b in BITS if groups[(codec, b)]["clips_ok"]}
        if 4 in tf:
            assert tf[4]["tf_kl_nats"]["mean"] < tf[2]["tf_kl_nats"]["mean"] / 4
            assert tf[4]["tf_top1"]["mean"] > tf[2]["tf_top1"]["mean"]

    # a rerun retries the failures (they fail again) and keeps one merged row per key
    run_fake(clips, tmp_path / "out", pipe=FakePipe(fail_codec=("octopus", 4)))
    rows = [json.loads(line) for line in (tmp_path / "out" / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * 7


def test_fidelity_forces_the_saved_reference_tokens(tmp_path, caplog):
    clips = make_clips(tmp_path / "clips", n=2)
    pipe = FakePipe()
    run_fake(clips, tmp_path / "out", pipe=pipe)
    refs = {}
    for clip in ("clip0", "clip1"):
        with np.load(tmp_path / "out" / "refs" / f"{clip}.npz") as saved:
            assert saved["token_sizes"].tolist() == list(FAKE_PATCH_NUMS)
            refs[clip] = tuple(saved["tokens"].tolist())
    # per clip: once unpatched, then once per (codec, bits), always on the reference's tokens
    assert [a for a, _ in pipe.forced] == [None, ("none", 16), ("octopus", 2), ("octopus", 4),
                                           ("turboquant-mse", 2), ("turboquant-mse", 4)] * 2
    assert [t for _, t in pipe.forced] == [refs["clip0"]] * 6 + [refs["clip1"]] * 6

    # a reference saved without tokens (an older run) is generated again, with the same result
    rows = tmp_path / "out" / "rows" / "rank0.jsonl"
    kept = [line for line in rows.read_text().splitlines() if '"clip": "clip0"' in line]
    rows.write_text("\n".join(kept) + "\n")
    path = tmp_path / "out" / "refs" / "clip1.npz"
    with np.load(path) as saved:
        np.savez(path, **{k: saved[k] for k in ("audio", "fhat", "cond", "identity")})
    before = report_files(tmp_path / "out")
    pipe = FakePipe()
    with caplog.at_level("WARNING"):
        run_fake(clips, tmp_path / "out", pipe=pipe)
    assert "has no tokens" in caplog.text
    assert pipe.calls == 1 + 6 and len(pipe.forced) == 6  # reference, floor, five codec jobs
    with np.load(path) as saved:
        assert tuple(saved["tokens"].tolist()) == refs["clip1"]
    assert report_files(tmp_path / "out") == before


def test_resuming_with_another_thread_count_warns(tmp_path, caplog):
    clips = make_clips(tmp_path / "clips", n=1)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        run_fake(clips, tmp_path / "out", cfg=config(codecs=("octopus",), bits=(2,)))
        torch.set_num_threads(2)
        with caplog.at_level("WARNING"):
            run_fake(clips, tmp_path / "out", cfg=config(codecs=("octopus",), bits=(2,)))  # nothing to run
            assert "intra-op threads" not in caplog.text
            run_fake(clips, tmp_path / "out", cfg=config(codecs=("octopus",), bits=(2, 3)))
        assert "resumes with 2 intra-op threads; earlier rows ran with 1" in caplog.text
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(line) for line in (tmp_path / "out" / "rows.jsonl").read_text().splitlines()]
    assert [(r["codec"], r["bits"], r["threads"]) for r in rows] == [(REFERENCE, None, 1), (FLOOR, None, 1),
                                                                      ("octopus", 2, 1), ("octopus", 3, 2)]


def test_a_fidelity_failure_is_recorded_as_its_stage(tmp_path):
    clips = make_clips(tmp_path / "clips", n=1)
    cfg = config(codecs=("octopus",), bits=(2,))

    def broken_teacher_forced(pipe, cond_BD, tokens, cfg):
        if pipe.active is not None:
            raise RuntimeError("injected fidelity failure")
        return fake_teacher_forced(pipe, cond_BD, tokens, cfg)

    backend = AARBackend(FakePipe(), cfg, "fake-aar", "cpu", generate_fn=fake_generate,
                         compressed_kv_fn=fake_compressed_kv, teacher_forced_fn=broken_teacher_forced)
    evaluate(list_folder(clips, n=1, seed=0), tmp_path / "out", cfg, lambda device: backend,
             FakeConditioner(), progress=False)
    rows = (tmp_path / "out" / "rows.jsonl").read_text().splitlines()
    ref, floor, row = [json.loads(line) for line in rows]
    assert (ref["codec"], ref["status"]) == (REFERENCE, "ok")
    assert (floor["codec"], floor["status"]) == (FLOOR, "ok")  # the floor needs no teacher forcing
    assert (row["status"], row["stage"]) == ("error", "fidelity")
    assert "injected fidelity failure" in row["error"]


def test_other_settings_in_the_same_folder_are_refused(tmp_path):
    clips = make_clips(tmp_path / "clips", n=1)
    run_fake(clips, tmp_path / "out", cfg=config(codecs=("octopus",), bits=(2,)))
    with pytest.raises(UsageError, match="seed differ"):
        run_fake(clips, tmp_path / "out", cfg=EvalConfig(codecs=("octopus",), bits=(2,), seed=4))
    # more codecs or bits with the same settings extend the run
    run_fake(clips, tmp_path / "out", cfg=config(codecs=("octopus", "polarquant"), bits=(2, 3)))
    assert len((tmp_path / "out" / "rows.jsonl").read_text().splitlines()) == 2 + 4  # reference, floor + 4


@pytest.mark.parametrize("stats,expected", [
    (FakeStats(2), {"ratio": 6.4, "k_bits": 2.25, "v_bits": 4.0}),
    (FakeStats(3, 4), {"ratio": 16.0 / 3.5, "k_bits": 3.25, "v_bits": 6.0}),
], ids=["b2", "k3v4"])
def test_kv_summary_reads_the_patch_stats(stats, expected):
    assert kv_summary(stats) == expected


def test_kv_summary_of_nothing_compressed_is_none_not_zero():
    class Uncompressed:
        def as_dict(self):
            return {"config": {}, "total": {"ratio": 1.0, "k_bits": float("nan"), "v_bits": float("nan")},
                    "layers": []}

    assert kv_summary(Uncompressed()) == {"ratio": 1.0, "k_bits": None, "v_bits": None}


@pytest.mark.parametrize("kwargs,match", [
    (dict(codecs=("octopus", "zip")), "unknown codec"),
    (dict(codecs=()), "no codecs"),
    (dict(codecs=("octopus",), bits=(0,)), "--bits"),
    (dict(codecs=("octopus",), bits=(2, 2)), "twice"),
    (dict(codecs=("octopus",), top_p=1.5), "--top-p"),
    (dict(codecs=("turboquant-mse", "octopus"), bits=(2, 8)),
     r"octopus does not take --bits 8 \(it takes 1\.\.7"),
], ids=["unknown-codec", "empty", "zero-bits", "repeated-bits", "top-p", "bits-the-codec-lacks"])
def test_config_errors_name_what_is_accepted(kwargs, match):
    with pytest.raises(UsageError, match=match):
        EvalConfig(**kwargs)


def test_cli_reports_bad_arguments_with_exit_code_2(tmp_path, capsys):
    from octopus_audio.cli import main

    assert main(["eval", "--threads", "0", "--out", str(tmp_path / "o"), "--clips", str(tmp_path)]) == 2
    assert "--threads must be an integer >= 1" in capsys.readouterr().err
    assert main(["eval", "--codecs", "zip", "--out", str(tmp_path / "o"), "--clips", str(tmp_path)]) == 2
    assert "unknown codec 'zip'" in capsys.readouterr().err
    assert main(["eval", "--aar", "x.pth", "--codecs", "none", "--out", str(tmp_path / "o"),
                 "--clips", str(make_clips(tmp_path / "c", n=1)), "--clap", "spectral"]) == 2
    assert "--aar and --sat together" in capsys.readouterr().err


CHILD = """
import sys
sys.path.insert(0, {tests!r})
import test_eval_runner as t
from pathlib import Path
from octopus_audio.eval import distribution
distribution.RESAMPLES = {resamples}  # as the parent test's (tests/conftest.py)
t.run_fake(Path({clips!r}), Path({out!r}))
"""


def test_two_processes_under_torchrun_give_the_same_results_as_one(tmp_path):
    clips = make_clips(tmp_path / "clips", n=5)
    run_fake(clips, tmp_path / "one")
    script = tmp_path / "child.py"
    from octopus_audio.eval import distribution

    script.write_text(CHILD.format(tests=str(Path(__file__).parent), clips=str(clips),
                                   out=str(tmp_path / "two"), resamples=distribution.RESAMPLES))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", str(script)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shards = sorted(p.name for p in (tmp_path / "two" / "rows").iterdir())
    assert shards == ["rank0.jsonl", "rank1.jsonl"]
    per_rank = [len((tmp_path / "two" / "rows" / s).read_text().splitlines()) for s in shards]
    assert per_rank == [3 * 7, 2 * 7]  # clips 0, 2, 4 on rank 0; 1, 3 on rank 1 (7 rows: reference, floor,
    # 5 jobs)
    assert report_files(tmp_path / "two") == report_files(tmp_path / "one")


def test_keys_and_values_at_widths_of_their_own(tmp_path, monkeypatch):
    clips = make_clips(tmp_path / "clips", n=1)
    cfg = EvalConfig(codecs=("octopus",), bits=(2,), v_bits=(2, 4), seed=3, floor=False, sink_scales=(0,))
    assert cfg.jobs() == [Job("octopus", 2, 2, 0, 0), Job("octopus", 2, 4, 0, 0)]  # no wide scales: 0
    assert EvalConfig(codecs=("octopus",), bits=(2, 3)).bit_pairs() == [(2, 2), (3, 3)]
    assert EvalConfig(codecs=("octopus",), bits=(2, 3), k_bits=(4,)).bit_pairs() == [(4, 2), (4, 3)]
    run_fake(clips, tmp_path / "out", cfg=cfg)
    out = tmp_path / "out"
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()][1:]  # after REFERENCE
    assert [(r["bits"], r["v_bits"], r["kv"]["v_bits"]) for r in rows] == [(2, 2, 4.0), (2, 4, 6.0)]
    assert sorted(p.name for p in (out / "wav").glob("*octopus*")) == ["clip0__octopus_b2.wav",
                                                                       "clip0__octopus_k2v4.wav"]
    md = (out / "table.md").read_text()
    assert "| codec | K bits | V bits | sink scales | clips |" in md
    assert re.search(r"\n\| octopus \| 2 \| 4 \| 0 \| 1 \|.*\| 4\.125 \| 6\.40 \| 2\.25 \| 6\.00 \|\n",
                     md), md
    page = (out / "index.html").read_text()
    assert "<th>K2 V4</th>" in page and "src='wav/clip0__octopus_k2v4.wav'" in page

    # rows written before value widths were recorded read as keys and values at one width: nothing reruns
    log = out / "rows" / "rank0.jsonl"
    old = [json.loads(line) for line in log.read_text().splitlines()]
    log.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "v_bits"}) + "\n" for r in old
                           if r["v_bits"] == r["bits"]) + json.dumps(old[2]) + "\n")
    pipe = FakePipe()
    run_fake(clips, out, pipe=pipe, cfg=cfg)
    assert pipe.calls == 0
    pipe = FakePipe()  # another value width extends the run by its own row
    run_fake(clips, out, pipe=pipe, cfg=EvalConfig(codecs=("octopus",), bits=(2,), v_bits=(2, 3, 4), seed=3,
                                                   floor=False, sink_scales=(0,)))
    assert pipe.calls == 1


def test_sink_scales_run_as_widths_do(tmp_path):
    """--sink-scales 0,3: each count runs at every width, each row records its count (its key), the WAVs,
    table and curves tell them apart; rows written before the count was recorded read as 0 (nothing reruns),
    and another count extends the run by its own rows."""
    clips = make_clips(tmp_path / "clips", n=1)
    cfg = EvalConfig(codecs=("octopus", "none"), bits=(2, 4), seed=3, floor=False, sink_scales=(0, 3))
    assert cfg.jobs() == [Job("octopus", 2, 2, 0, 0), Job("octopus", 4, 4, 0, 0), Job("octopus", 2, 2, 3, 0),
                          Job("octopus", 4, 4, 3, 0), Job("none")]
    assert [c.sink_scales for c in cfg.patch_configs()] == [0, 0, 3, 3]
    out = tmp_path / "out"
    run_fake(clips, out, cfg=cfg)
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert [(r["codec"], r["bits"], r["sink_scales"]) for r in rows] == [
        (REFERENCE, None, None), ("octopus", 2, 0), ("octopus", 4, 0), ("octopus", 2, 3), ("octopus", 4, 3),
        ("none", None, None)]
    # the distribution metrics: one group a (codec, widths, sink scales), each of its own rows, never pooled
    dist = json.loads((out / "results.json").read_text())["distribution"]["groups"]
    assert [(g["codec"], g["bits"], g["sink_scales"], g["outputs"]) for g in dist] == [
        (REFERENCE, None, None, 1), ("octopus", 2, 0, 1), ("octopus", 4, 0, 1), ("octopus", 2, 3, 1),
        ("octopus", 4, 3, 1), ("none", None, None, 1)]
    table = list(csv.DictReader(io.StringIO((out / "distribution.csv").read_text())))
    assert [(r["codec"], r["bits"], r["sink_scales"]) for r in table][1:3] == [("octopus", "2", "0"),
                                                                            ("octopus", "4", "0")]
    adherence = json.loads((out / "plots" / "distribution.json").read_text())["adherence"]["codecs"]
    assert sorted(adherence) == ["none", "octopus S=0", "octopus S=3"]
    assert sorted(p.name for p in (out / "wav").glob("*octopus*")) == [
        "clip0__octopus_b2.wav", "clip0__octopus_b2_s3.wav", "clip0__octopus_b4.wav",
        "clip0__octopus_b4_s3.wav"]
    md = (out / "table.md").read_text()
    assert re.search(r"\n\| octopus \| 2 \| 2 \| 3 \| 1 \|", md)
    assert "\n| none | native | native | - | 1 |" in md
    curves = json.loads((out / "plots" / "rate_distortion.json").read_text())["tf_kl_nats"]["codecs"]
    assert sorted(curves) == ["octopus S=0", "octopus S=3"]
    page = (out / "index.html").read_text()
    assert "<th>b2 S3</th>" in page and "src='wav/clip0__octopus_b2_s3.wav'" in page

    log = out / "rows" / "rank0.jsonl"
    old = [json.loads(line) for line in log.read_text().splitlines()]
    log.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "sink_scales"}
                                      if r["sink_scales"] in (0, None) else r) + "\n" for r in old))
    pipe = FakePipe()
    run_fake(clips, out, pipe=pipe, cfg=cfg)
    assert pipe.calls == 0
    pipe = FakePipe()
    more = EvalConfig(codecs=("octopus", "none"), bits=(2, 4), seed=3, floor=False, sink_scales=(0, 3, 5))
    run_fake(clips, out, pipe=pipe, cfg=more)
    assert pipe.calls == 2  # octopus b2 and b4 at S=5
    with pytest.raises(UsageError, match="--sink-scales must be a comma list of distinct integers >= 0"):
        EvalConfig(codecs=("octopus",), sink_scales=(3, 3))
    with pytest.raises(UsageError, match="--sink-scales must be"):
        EvalConfig(codecs=("octopus",), sink_scales=(-1,))


def test_cli_bit_width_flags(tmp_path, monkeypatch, capsys):
    import octopus_audio.eval.runner as runner
    from octopus_audio.cli import main

    seen = {}
    monkeypatch.setattr(runner, "evaluate", lambda refs, out, config, *a, **kw: seen.update(config=config))
    clips = make_clips(tmp_path / "clips", n=1)
    base = ["eval", "--clips", str(clips), "--codecs", "octopus", "--clap", "spectral", "--no-progress",
            "--device", "cpu", "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")]
    assert main(base + ["--k-bits", "2,3", "--v-bits", "4"]) == 0
    assert seen["config"].bit_pairs() == [(2, 4), (3, 4)]
    assert main(base + ["--bits", "3", "--v-bits", "2,4"]) == 0
    assert seen["config"].bit_pairs() == [(3, 2), (3, 4)]
    assert main(base + ["--v-bits", "x"]) == 2
    assert "--v-bits must be a comma list of integers" in capsys.readouterr().err
    assert main(base + ["--k-bits", "8"]) == 2
    assert "octopus does not take --k-bits 8" in capsys.readouterr().err
    assert main(base + ["--v-bits", "9"]) == 2
    assert "--v-bits 9: values take 1..8 bits" in capsys.readouterr().err


def tone(path: Path, freq: float, seconds: float = 0.5, rate: int = 24000) -> Path:
    t = np.arange(int(seconds * rate)) / rate
    sf.write(path, 0.3 * np.sin(2 * np.pi * freq * t), rate)
    return path


def test_colliding_file_names_give_distinct_clips_with_their_own_rows(tmp_path):
    clips = tmp_path / "clips"
    clips.mkdir()
    freqs = {"a-2.flac": 220.0, "a.flac": 330.0, "a.wav": 440.0}
    for name, freq in freqs.items():
        tone(clips / name, freq)
    cfg = config(codecs=("octopus",), bits=(2, 3))  # three rows per clip: the floor, b=2, b=3
    results = run_fake(clips, tmp_path / "out", cfg=cfg)
    refs = list_folder(clips, n=10, seed=0)
    assert [(r.clip_id, Path(r.origin).name) for r in refs] == [("a-2", "a-2.flac"), ("a", "a.flac"),
                                                                ("a-3", "a.wav")]
    rows = [json.loads(line) for line in (tmp_path / "out" / "rows.jsonl").read_text().splitlines()]
    assert sorted((r["clip"], r["codec"], r["bits"]) for r in rows) == sorted(
        (c, j, b) for c in ("a-2", "a", "a-3")
        for j, b in ((REFERENCE, None), (FLOOR, None), ("octopus", 2), ("octopus", 3)))
    assert all(g["clips_ok"] == 3 and g["clips_failed"] == 0 for g in results["groups"])
    # each clip's saved reference was made from its own file: the condition is that file's embedding
    from octopus_audio.eval.sources import CLAP_RATE, decode, prepare

    for ref in refs:
        with np.load(tmp_path / "out" / "refs" / f"{ref.clip_id}.npz") as saved:
            cond = FakeConditioner().embed(prepare(decode(ref), CLAP_RATE))
            np.testing.assert_array_equal(saved["cond"], cond)
    assert len({r["clip_sha256"] for r in rows}) == 3


def test_a_clip_replaced_under_the_same_name_never_reuses_its_rows(tmp_path):
    clips = make_clips(tmp_path / "clips", n=2)
    run_fake(clips, tmp_path / "out")
    tone(clips / "clip0.wav", 1234.0)  # new content, same name
    pipe = FakePipe()
    run_fake(clips, tmp_path / "out", pipe=pipe)
    assert pipe.calls == 7  # clip0 again: reference, floor, five jobs; clip1 reused
    run_fake(clips, tmp_path / "fresh")  # what a run that never saw the old clip0 reports
    assert report_files(tmp_path / "out") == report_files(tmp_path / "fresh")
    settings = json.loads((tmp_path / "out" / "settings.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "out" / "rows.jsonl").read_text().splitlines()]
    assert {r["clip_sha256"] for r in rows if r["clip"] == "clip0"} == {settings["clip_sha256"]["clip0"]}

    # a rerun from another folder: a file of the same name with other audio gets new rows, one with the
    # same audio reuses them under its new path
    other = tmp_path / "other"
    other.mkdir()
    tone(other / "clip0.wav", 555.0)
    (other / "clip1.wav").write_bytes((clips / "clip1.wav").read_bytes())
    pipe = FakePipe()
    run_fake(other, tmp_path / "out", pipe=pipe)
    assert pipe.calls == 7
    rows = [json.loads(line) for line in (tmp_path / "out" / "rows.jsonl").read_text().splitlines()]
    assert {r["origin"] for r in rows} == {str(other / "clip0.wav"), str(other / "clip1.wav")}


def test_a_folder_of_other_files_is_left_alone_and_overwrite_starts_afresh(tmp_path):
    clips = make_clips(tmp_path / "clips", n=1)
    out = tmp_path / "out"
    out.mkdir()
    mine = {"index.html": b"<p>my page</p>", "table.md": b"| mine |", "results.json": b'{"mine": 1}'}
    for name, data in mine.items():
        (out / name).write_bytes(data)
    with pytest.raises(UsageError, match="holds files that `octopus-audio eval` did not write"):
        run_fake(clips, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == mine

    run_fake(clips, tmp_path / "run", cfg=config(codecs=("octopus",), bits=(2,)))
    (tmp_path / "run" / "notes.txt").write_text("keep me")
    with pytest.raises(UsageError, match="seed differ"):
        run_fake(clips, tmp_path / "run", cfg=EvalConfig(codecs=("octopus",), bits=(2,), seed=4))
    refs = list_folder(clips, n=1, seed=0)
    pipe = FakePipe()
    cfg = EvalConfig(codecs=("octopus",), bits=(2,), seed=4)
    backend = AARBackend(pipe, cfg, "fake-aar", "cpu", generate_fn=fake_generate,
                         compressed_kv_fn=fake_compressed_kv, teacher_forced_fn=fake_teacher_forced)
    evaluate(refs, tmp_path / "run", cfg, lambda device: backend, FakeConditioner(), progress=False,
             overwrite=True)
    assert pipe.calls == 3  # everything again: reference, floor, octopus b=2
    rows = [json.loads(line) for line in (tmp_path / "run" / "rows" / "rank0.jsonl").read_text().splitlines()]
    assert [r["seed"] for r in rows] == [4, 5, 4]  # only the new run's rows (the floor samples with seed + 1)
    assert (tmp_path / "run" / "notes.txt").read_text() == "keep me"


def test_another_checkpoint_under_the_same_name_is_refused(tmp_path):
    from octopus_audio.eval.identity import model_identity

    clips = make_clips(tmp_path / "clips", n=1)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    torch.save({"w": torch.ones(3)}, ckpt / "aar.pth")
    torch.save({"w": torch.zeros(3)}, ckpt / "sat.pth")
    cfg = config(codecs=("octopus",), bits=(2,))

    def run(**kw):
        identity = model_identity(ckpt / "aar.pth", ckpt / "sat.pth")
        backend = AARBackend(FakePipe(), cfg, "aar.pth+sat.pth", "cpu", generate_fn=fake_generate,
                             compressed_kv_fn=fake_compressed_kv, teacher_forced_fn=fake_teacher_forced,
                             identity=identity)
        return evaluate(list_folder(clips, n=1, seed=0), tmp_path / "out", cfg, lambda device: backend,
                        FakeConditioner(), progress=False, **kw)

    run()
    torch.save({"w": torch.full((3,), 2.0)}, ckpt / "aar.pth")
    with pytest.raises(UsageError, match=r"aar_sha256 differ"):
        run()
    run(overwrite=True)


@pytest.mark.parametrize("n,batch_size,sizes", [(4, 3, [1, 3]), (4, 2, [2]), (4, 8, [4]), (3, 1, [1])],
                         ids=["short-last", "even", "one-batch", "unbatched"])
def test_the_backend_is_told_the_batch_sizes_it_will_generate(tmp_path, monkeypatch, n, batch_size, sizes):
    """Before the first batch the backend hears every batch size the run generates (the last batch may be
    short), so on CUDA it compiles those variants ahead; a resumed run with nothing left never loads it."""
    told = []
    monkeypatch.setattr(AARBackend, "expect_batches", lambda self, s: told.append(list(s)))
    clips = make_clips(tmp_path / "clips")
    pipe = FakePipe()
    run_fake(clips, tmp_path / "out", pipe=pipe, n=n, batch_size=batch_size)
    assert told == [sizes] and pipe.builds == 1
    run_fake(clips, tmp_path / "out", pipe=pipe, n=n, batch_size=batch_size)
    assert told == [sizes] and pipe.builds == 1


def _finishing_beside(monkeypatch):
    """run_batch as a GPU run calls it: each job's rows finished on the worker thread."""
    from octopus_audio.eval import runner

    inner = runner.run_batch
    monkeypatch.setattr(runner, "run_batch", lambda *a, **k: inner(*a, **{**k, "finish_beside": True}))


def test_rows_finished_beside_the_next_generation_equal_rows_finished_in_line(tmp_path, monkeypatch):
    from octopus_audio.eval import metrics

    clips = make_clips(tmp_path / "clips", n=3, broken=True)
    pipe = dict(fail_codec=("octopus", 4), fail_cond=None)
    run_fake(clips, tmp_path / "inline", pipe=FakePipe(**pipe), batch_size=2)
    threads = set()
    compare = metrics.MetricReference.compare

    def recorded(self, *args):
        import threading

        threads.add(threading.current_thread().name)
        return compare(self, *args)

    monkeypatch.setattr(metrics.MetricReference, "compare", recorded)
    _finishing_beside(monkeypatch)
    run_fake(clips, tmp_path / "beside", pipe=FakePipe(**pipe), batch_size=2)
    assert threads and all(name.startswith("eval-rows") for name in threads)
    assert report_files(tmp_path / "beside") == report_files(tmp_path / "inline")


def test_an_error_finishing_rows_beside_stops_the_run(tmp_path, monkeypatch):
    from octopus_audio.eval import batch

    def broken_disk(path, audio, rate):
        if "octopus" in Path(path).name:
            raise OSError("injected: no space left on device")
        return None

    monkeypatch.setattr(batch, "write_wav", broken_disk)
    _finishing_beside(monkeypatch)
    with pytest.raises(OSError, match="no space left"):
        run_fake(make_clips(tmp_path / "clips", n=2), tmp_path / "out")


def clip_files(out: Path, clip: str) -> dict[str, object]:
    """Every file of `clip` a run folder holds: its WAVs and spectrograms (bytes), its outputs' embeddings
    and its saved reference (each array), by relative path."""
    files: dict[str, object] = {}
    for folder in ("wav", "spec"):
        for p in sorted((out / folder).glob(f"{clip}__*")):
            files[f"{folder}/{p.name}"] = p.read_bytes()
    for p in [*sorted((out / "emb").glob(f"{clip}__*")), out / "refs" / f"{clip}.npz"]:
        if p.exists():
            with np.load(p) as saved:
                files[p.relative_to(out).as_posix()] = {k: saved[k].tolist() for k in saved.files}
    return files


def test_a_clip_replaced_then_restored_has_every_file_of_its_content(tmp_path):
    """Replace a clip under its name, then restore it, adding a width: after each rerun every WAV,
    spectrogram, embedding and saved reference of that clip is the one a fresh run on the same audio writes
    (none left from the other audio), and the other clip's files are untouched."""
    clips = make_clips(tmp_path / "clips", n=2)
    original = (clips / "clip0.wav").read_bytes()
    out = tmp_path / "out"
    first, later = config(codecs=("octopus",), bits=(2, 4)), config(codecs=("octopus",), bits=(2, 3))

    def fresh(name: str, cfg) -> Path:
        """A run that never saw the other audio: the clips as they are now, copied, into a new folder."""
        copy = tmp_path / f"{name}-clips"
        copy.mkdir()
        for p in clips.iterdir():
            (copy / p.name).write_bytes(p.read_bytes())
        run_fake(copy, tmp_path / name, cfg=cfg)
        return tmp_path / name

    run_fake(clips, out, cfg=first)
    kept = clip_files(out, "clip1")
    tone(clips / "clip0.wav", 1234.0, seconds=1.5)  # other audio, another length, the same name
    run_fake(clips, out, cfg=first)
    assert clip_files(out, "clip0") == clip_files(fresh("replaced", first), "clip0")
    assert {f"wav/clip0__octopus_b4{SINKS}.wav", f"emb/clip0__octopus_b4{SINKS}__d0.npz"} <= set(
        clip_files(out, "clip0"))  # the names checked gone below
    (clips / "clip0.wav").write_bytes(original)  # restored, and one more width asked for
    pipe = FakePipe()
    run_fake(clips, out, pipe=pipe, cfg=later)
    assert pipe.calls == 4 + 1  # clip0 whole again (reference, floor, b2, b3); clip1 only its b3
    restored = clip_files(out, "clip0")
    assert restored == clip_files(fresh("restored", later), "clip0")
    assert f"wav/clip0__octopus_b4{SINKS}.wav" not in restored  # made from the other audio: gone
    assert f"emb/clip0__octopus_b4{SINKS}__d0.npz" not in restored
    assert {k: v for k, v in clip_files(out, "clip1").items() if k in kept} == kept
    settings = json.loads((out / "settings.json").read_text())
    with np.load(out / "refs" / "clip0.npz") as saved:
        assert json.loads(str(saved["identity"]))["clip_sha256"] == settings["clip_sha256"]["clip0"]


def test_every_file_a_run_writes_is_in_its_manifest(tmp_path):
    """The manifest lists every file an eval run wrote (so --overwrite can remove exactly those), report
    files, spectrograms, every draw's embeddings and rows included; a file the report starts writing must be
    listed too."""
    from octopus_audio.outdir import files_under, read_manifest

    clips = make_clips(tmp_path / "clips", n=2, broken=True)
    run_fake(clips, tmp_path / "out", cfg=EvalConfig(codecs=("none", "octopus"), bits=(2,), seed=3,
                                                     bf16_floor=True, draws=2))
    written = set(files_under(tmp_path / "out"))
    assert {"index.html", "results.json", "settings.json", "rows.jsonl", "rows/rank0.jsonl",
            f"spec/clip0__octopus_b2{SINKS}.png", "plots/rate_distortion.json", "distribution.csv",
            "plots/dist_latent.png", "plots/dist_adherence.png", "plots/distribution.json",
            f"emb/clip0__octopus_b2{SINKS}__d1.npz", "emb/clip0__00_reference__d1.npz"} <= written
    assert written == read_manifest(tmp_path / "out", "eval")


def test_overwrite_removes_only_what_the_run_wrote(tmp_path):
    """Files the user put inside the run's own folders stay through --overwrite (so do the folders holding
    them); every file of the earlier run goes, a WAV the new run does not write again included."""
    clips = make_clips(tmp_path / "clips", n=1)
    out = tmp_path / "run"
    run_fake(clips, out, cfg=config(codecs=("octopus",), bits=(2, 4)))
    mine = {"wav/my_recording.wav": b"RIFF mine", "rows/README.txt": b"my notes", "refs/mine.npz": b"mine",
            "spec/clip0__mine.png": b"my picture", "notes.txt": b"keep me"}
    for name, data in mine.items():
        (out / name).write_bytes(data)
    cfg = EvalConfig(codecs=("octopus",), bits=(2,), seed=4)
    with pytest.raises(UsageError, match="seed differs"):
        run_fake(clips, out, cfg=cfg)
    run_fake(clips, out, cfg=cfg, overwrite=True)
    for name, data in mine.items():
        assert (out / name).read_bytes() == data, name
    assert (out / "wav" / f"clip0__octopus_b2{SINKS}.wav").exists()  # the names the checks below use
    assert not (out / "wav" / f"clip0__octopus_b4{SINKS}.wav").exists()
    assert not (out / "spec" / f"clip0__octopus_b4{SINKS}.png").exists()
    assert (out / "emb" / f"clip0__octopus_b2{SINKS}__d0.npz").exists()
    assert not (out / "emb" / f"clip0__octopus_b4{SINKS}__d0.npz").exists()
    rows = [json.loads(line) for line in (out / "rows" / "rank0.jsonl").read_text().splitlines()]
    assert [(r["codec"], r["seed"]) for r in rows] == [(REFERENCE, 4), (FLOOR, 5), ("octopus", 4)]
    assert clip_files(out, "clip0") == {**clip_files(fresh_run(tmp_path, clips, cfg), "clip0"),
                                        "spec/clip0__mine.png": b"my picture"}


def fresh_run(tmp_path: Path, clips: Path, cfg) -> Path:
    out = tmp_path / "fresh"
    run_fake(clips, out, cfg=cfg)
    return out


def test_a_damaged_settings_file_is_named_and_overwrite_starts_afresh(tmp_path):
    clips = make_clips(tmp_path / "clips", n=1)
    cfg = config(codecs=("octopus",), bits=(2,))
    run_fake(clips, tmp_path / "out", cfg=cfg)
    (tmp_path / "out" / "settings.json").write_text("")
    with pytest.raises(UsageError, match=r"settings.json is damaged \(it is empty\)"):
        run_fake(clips, tmp_path / "out", cfg=cfg)
    (tmp_path / "out" / "settings.json").write_text('{"mine": true}')  # eval's own file, without its mark
    with pytest.raises(UsageError, match="it lacks the mark eval writes"):
        run_fake(clips, tmp_path / "out", cfg=cfg)
    run_fake(clips, tmp_path / "out", cfg=cfg, overwrite=True)
    assert report_files(tmp_path / "out") == report_files(fresh_run(tmp_path, clips, cfg))


def test_the_output_folder_is_never_listed_as_clips(tmp_path):
    """--out inside --clips: the run's own WAVs are not clips of the next run; --clips inside --out is
    refused."""
    clips = make_clips(tmp_path / "clips", n=1)
    out = clips / "out"
    run_fake(clips, out)
    assert len(list((out / "wav").glob("*.wav"))) > 1
    assert [r.clip_id for r in list_folder(clips, n=10, seed=0, out=out)] == ["clip0"]
    assert len(list_folder(clips, n=10, seed=0)) > 1  # what the second run used to read
    with pytest.raises(UsageError, match="lies inside --out"):
        list_folder(out / "wav", n=10, seed=0, out=out)
