"""Every bad input stopped at the door, in one table: each CLI case through the real entry point exits 2 with
our one sentence and writes or changes no file (a fresh interpreter runs them all again and finds nothing else
on stderr), and each library check is a ValueError naming what was wrong and what is accepted."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from octopus_audio.cli import main

sf = pytest.importorskip("soundfile")

SEED_MAX = 2**64 - 1


# ---- inputs the cases write ------------------------------------------------------------------------------

def tone(path: Path, freq: float = 330.0, seconds: float = 0.5, rate: int = 24000) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(seconds * rate)) / rate
    sf.write(path, 0.3 * np.sin(2 * np.pi * freq * t), rate)
    return path


def cond_file(path: Path, fill: float | None = None) -> Path:
    """A (1, 512) condition: an L2-normalised vector, or every value `fill`."""
    v = np.full((1, 512), 1 / np.sqrt(512)) if fill is None else np.full((1, 512), fill)
    np.save(path, v.astype(np.float32))
    return path


def generate_argv(d: Path, *extra: str, cond: Path | None = None, out: Path | None = None) -> list[str]:
    cond = cond or cond_file(d / "cond.npy")
    return ["generate", "--cond", str(cond), "--out", str(out or d / "out"), "--device", "cpu", *extra]


def eval_argv(root: Path, *extra: str, out: Path | None = None) -> list[str]:
    """The prior run's command (one short clip, codec none, no floor rows, a copy of the embedded model),
    rooted at `root`; `extra` changes it."""
    return ["eval", "--clips", str(root / "clips"), "--codecs", "none", "--no-floor",
            "--aar", str(root / "ckpt" / "aar.pth"), "--sat", str(root / "ckpt" / "sat.pth"),
            "--clap", "spectral", "--cache-dir", str(root / "cache"), "--out", str(out or root / "run"),
            "--no-progress", "--device", "cpu", *extra]


@pytest.fixture(scope="module")
def prior_run(tmp_path_factory) -> Path:
    """An eval run made by the CLI, to rerun with something changed: the embedded default model written as
    released-format checkpoints aar.pth / sat.pth, one 0.5 s clip, `--codecs none --no-floor`."""
    from octopus_audio.aar_patch.default_model import default_paths
    from octopus_audio.tensorfile import load_tensors

    root = tmp_path_factory.mktemp("prior")
    aar, sat = default_paths()
    (root / "ckpt").mkdir()
    torch.save({"model_state_dict": load_tensors(aar)[0]}, root / "ckpt" / "aar.pth")
    torch.save({"generator_state_dict": load_tensors(sat)[0]}, root / "ckpt" / "sat.pth")
    tone(root / "clips" / "tone.wav")
    threads = torch.get_num_threads()
    try:
        assert main(eval_argv(root)) == 0
    finally:
        torch.set_num_threads(threads)
    assert (root / "run" / "settings.json").is_file()
    return root


def copy_prior(prior: Path, d: Path) -> Path:
    shutil.copytree(prior, d / "prior")
    return d / "prior"


def replace_checkpoint(path: Path) -> None:
    """The same file name, other weights: one tensor of the transformer moved by 1e-3."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    sd = saved["model_state_dict"]
    name = next(k for k, v in sd.items() if v.is_floating_point())
    sd[name] = sd[name] + 1e-3
    torch.save(saved, path)


def user_report(d: Path) -> Path:
    """A folder holding a user's own index.html, table.md and results.json."""
    out = d / "mine"
    out.mkdir()
    (out / "index.html").write_text("<p>my listening notes</p>")
    (out / "table.md").write_text("| my | table |\n")
    (out / "results.json").write_text('{"mine": true}\n')
    return out


# ---- the CLI table ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """`setup(case folder, prior run)` writes the inputs and returns argv; `says`: part of our sentence."""

    id: str
    setup: Callable[[Path, Path], list[str]]
    says: str


def _npy_object(d: Path) -> Path:
    np.save(d / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return d / "objects.npy"


def _npz(d: Path) -> Path:
    np.savez(d / "cond.npz", cond=np.ones((1, 512), dtype=np.float32))
    return d / "cond.npz"


def _text(d: Path, name: str = "cond.txt") -> Path:
    (d / name).write_text("0.1 0.2 0.3\n")
    return d / name


def _with_file(d: Path, name: str, content: str = "mine") -> Path:
    (d / name).parent.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(content)
    return d / name


CASES = [
    # seeds: torch's generator takes 0 .. 2**64 - 1; the eval's N draws sample with seed .. seed + N - 1, the
    # floor row's with seed + N .. seed + 2N - 1
    Case("generate-seed-negative", lambda d, p: generate_argv(d, "--seed", "-1"),
         "--seed must be an integer from 0 to 2**64 - 1"),
    Case("generate-seed-2**64", lambda d, p: generate_argv(d, "--seed", str(SEED_MAX + 1)),
         "--seed must be an integer from 0 to 2**64 - 1"),
    Case("eval-seed-negative", lambda d, p: eval_argv(d, "--seed", "-1"),
         "--seed must be an integer from 0 to 2**64 - 1"),
    Case("eval-seed-leaves-no-floor-seed",
         lambda d, p: ["eval", "--seed", str(SEED_MAX), "--draws", "1", "--clap", "spectral", "--out",
                       str(d / "run")],
         "leaves no seed for the sampling-floor row, which samples with --seed + 1"),
    Case("eval-seed-leaves-no-draw-seed",
         lambda d, p: ["eval", "--seed", str(SEED_MAX - 2), "--draws", "4", "--no-floor", "--clap",
                       "spectral", "--out", str(d / "run")],
         "leaves no seed for draw 3, which samples with --seed + 3"),
    Case("eval-draws-0", lambda d, p: eval_argv(d, "--draws", "0"), "--draws must be an integer >= 1"),
    # condition arrays: a (B, 512) float .npy, finite, within +-100
    Case("generate-cond-1e30", lambda d, p: generate_argv(d, cond=cond_file(d / "big.npy", 1e30)),
         "holds a value of magnitude 1e+30; accepted: finite values within +-100"),
    Case("generate-cond-101", lambda d, p: generate_argv(d, cond=cond_file(d / "big.npy", -101.0)),
         "holds a value of magnitude 101; accepted: finite values within +-100"),
    Case("generate-cond-nan", lambda d, p: generate_argv(d, cond=cond_file(d / "nan.npy", float("nan"))),
         "contains NaN or infinite values"),
    Case("generate-cond-inf", lambda d, p: generate_argv(d, cond=cond_file(d / "inf.npy", float("inf"))),
         "contains NaN or infinite values"),
    Case("generate-cond-text-file", lambda d, p: generate_argv(d, cond=_text(d)),
         "is not a .npy file (it does not start with the .npy header)"),
    Case("generate-cond-npz", lambda d, p: generate_argv(d, cond=_npz(d)),
         "is not a .npy file (a .npz archive)"),
    Case("generate-cond-objects", lambda d, p: generate_argv(d, cond=_npy_object(d)),
         "must be a float array of shape (B, 512); got dtype object"),
    Case("generate-cond-folder", lambda d, p: generate_argv(d, cond=d), "is a folder; --cond takes one file"),
    # --clip names one audio file
    Case("generate-clip-folder",
         lambda d, p: ["generate", "--clip", str(tone(d / "clips" / "a.wav").parent),
                       "--out", str(d / "out")],
         "is a folder; --clip takes one file"),
    # bit widths: each codec's own declared range
    Case("generate-octopus-bits-8", lambda d, p: generate_argv(d, "--codec", "octopus", "--bits", "8"),
         "octopus does not take --bits 8 (it takes 1..7)"),
    Case("generate-octopus-qjl-bits-8",
         lambda d, p: generate_argv(d, "--codec", "octopus-qjl", "--bits", "8"),
         "octopus-qjl does not take --bits 8 (it takes 1..7)"),
    Case("generate-turboquant-bits-9",
         lambda d, p: generate_argv(d, "--codec", "turboquant-mse", "--bits", "9"),
         "turboquant-mse does not take --bits 9 (it takes 1..8)"),
    Case("generate-polarquant-bits-0", lambda d, p: generate_argv(d, "--codec", "polarquant", "--bits", "0"),
         "polarquant does not take --bits 0 (it takes 1..8)"),
    Case("eval-octopus-bits-8", lambda d, p: eval_argv(d, "--codecs", "none,octopus", "--bits", "2,8"),
         "octopus does not take --bits 8 (it takes 1..7)"),
    Case("eval-turboquant-qjl-bits-9", lambda d, p: eval_argv(d, "--codecs", "turboquant-qjl", "--bits", "9"),
         "turboquant-qjl does not take --bits 9 (it takes 1..8)"),
    # --codec none stores the cache uncompressed: --bits is refused, not ignored
    Case("generate-none-with-bits", lambda d, p: generate_argv(d, "--codec", "none", "--bits", "4"),
         "--codec none keeps the KV cache uncompressed and takes no --bits"),
    Case("eval-none-with-bits", lambda d, p: eval_argv(d, "--bits", "4"),
         "--codecs none keeps the KV cache uncompressed and takes no --bits"),
    # output folders
    Case("generate-out-is-a-file", lambda d, p: generate_argv(d, out=_with_file(d, "afile")),
         "is a file; --out takes a folder"),
    Case("generate-out-under-a-file", lambda d, p: generate_argv(d, out=_with_file(d, "afile") / "sub"),
         "lies under"),
    Case("generate-latents-is-a-folder", lambda d, p: generate_argv(d, "--save-latents", str(d)),
         "is a folder; --save-latents takes a file name"),
    Case("generate-out-holds-other-files",
         lambda d, p: generate_argv(d, out=_with_file(d, "out/mine.wav").parent),
         "holds files that `octopus-audio generate` did not write (mine.wav)"),
    Case("generate-latents-under-a-file",
         lambda d, p: generate_argv(d, "--save-latents", str(_with_file(d, "afile") / "lat.pt")),
         "lies under"),
    Case("eval-out-is-a-file", lambda d, p: eval_argv(d, out=_with_file(d, "afile")),
         "is a file; --out takes a folder"),
    Case("eval-out-under-a-file", lambda d, p: eval_argv(d, out=_with_file(d, "afile") / "sub" / "run"),
         "lies under"),
    Case("eval-out-holds-a-users-report", lambda d, p: eval_argv(copy_prior(p, d), out=user_report(d)),
         "holds files that `octopus-audio eval` did not write (index.html and 2 more)"),
    # a rerun into an earlier run's folder with anything different
    Case("eval-rerun-checkpoint-replaced",
         lambda d, p: (replace_checkpoint(copy_prior(p, d) / "ckpt" / "aar.pth"), eval_argv(d / "prior"))[1],
         "holds a run made with other settings (aar_sha256 differ"),
    Case("eval-rerun-other-seed", lambda d, p: eval_argv(copy_prior(p, d), "--seed", "7"),
         "holds a run made with other settings (seed differ; seed was 42, now 7)"),
    Case("eval-rerun-other-window", lambda d, p: eval_argv(copy_prior(p, d), "--window", "2"),
         "holds a run made with other settings (window differ; window was 1, now 2)"),
    # paths to conditioner weights and datasets are checked before anything loads
    Case("eval-clap-folder-missing",
         lambda d, p: eval_argv(copy_prior(p, d), "--clap", f"hf:{d / 'no-clap'}"),
         "is neither a folder nor a hub id"),
    Case("eval-dataset-folder-missing",
         lambda d, p: ["eval", "--clips", "audioset-20k", "--dataset", str(d / "no-data"),
                       "--clap", "spectral", "--out", str(d / "run")], "is neither a folder nor a hub id"),
]


def snapshot(root: Path) -> dict[str, tuple]:
    """Every file and folder under `root`: size, mtime and sha256 of each file."""
    out: dict[str, tuple] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.relpath(os.path.join(dirpath, name), root) + "/"] = ()
        for name in files:
            path = Path(dirpath) / name
            st = path.stat()
            out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns,
                                                hashlib.sha256(path.read_bytes()).hexdigest())
    return out


def one_sentence(err: str, command: str, says: str) -> None:
    prefix = f"octopus-audio {command}: error: "
    assert err.startswith(prefix) and err.endswith("\n") and err.count("\n") == 1, repr(err)
    assert says in err, f"{says!r} not in {err!r}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cli_refuses_with_one_sentence_and_writes_nothing(case, tmp_path, prior_run, capsys):
    argv = case.setup(tmp_path, prior_run)
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert main(argv) == 2
    one_sentence(capsys.readouterr().err, argv[0], case.says)
    assert snapshot(tmp_path) == before


DRIVER = """
import json, os, sys, tempfile
from octopus_audio.cli import main

results = []
for argv in json.load(open(sys.argv[1])):
    with tempfile.TemporaryFile() as f:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            try:
                rc = main(argv)
            except SystemExit as e:
                rc = e.code
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        results.append({"rc": rc, "err": f.read().decode()})
json.dump(results, open(sys.argv[2], "w"))
"""


def test_a_fresh_interpreter_sees_only_our_sentence_on_stderr(tmp_path, prior_run):
    """The table once more in one new process, with file descriptor 2 captured per case: Python warnings,
    library log lines and C-level messages would all land there; only our sentence does."""
    argvs, befores = [], []
    for i, case in enumerate(CASES):
        d = tmp_path / f"case{i}"
        d.mkdir()
        argvs.append(case.setup(d, prior_run))
        befores.append(snapshot(d))
    (tmp_path / "argv.json").write_text(json.dumps(argvs))
    (tmp_path / "driver.py").write_text(DRIVER)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": ""}
    command = [sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "argv.json"),
               str(tmp_path / "results.json")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""
    results = json.loads((tmp_path / "results.json").read_text())
    for i, (case, result) in enumerate(zip(CASES, results, strict=True)):
        assert result["rc"] == 2, (case.id, result)
        one_sentence(result["err"], argvs[i][0], case.says)
        assert snapshot(tmp_path / f"case{i}") == befores[i], case.id


def test_the_limits_themselves_are_accepted(tmp_path):
    """The edges of each documented range pass the checks that refuse what lies beyond them."""
    from octopus_audio.aar_patch.generation import COND_ABS_MAX, SamplingConfig, condition_problem
    from octopus_audio.codecs import bits_problem, get_codec
    from octopus_audio.eval.runner import EvalConfig

    assert SamplingConfig(seed=0).seed == 0 and SamplingConfig(seed=SEED_MAX).seed == SEED_MAX
    assert EvalConfig(codecs=("octopus",), bits=(7,), seed=SEED_MAX - 1).seed == SEED_MAX - 1
    assert EvalConfig(codecs=("octopus",), bits=(7,), seed=SEED_MAX, floor=False).seed == SEED_MAX
    assert EvalConfig(codecs=("octopus",), seed=SEED_MAX - 3, draws=2).seed == SEED_MAX - 3  # up to seed + 3
    assert EvalConfig(codecs=("octopus",), seed=SEED_MAX - 1, draws=2, floor=False).draws == 2
    assert condition_problem(np.full((2, 512), COND_ABS_MAX)) is None
    assert condition_problem(np.zeros((1, 512))) is None
    assert bits_problem("octopus", 7) is None and bits_problem("turboquant-mse", 8) is None
    assert get_codec("octopus", 8, 64, dir_bits=8).bits == 8  # 8 with an explicit split


# ---- the library's checks ---------------------------------------------------------------------------------

def _cache(codec: str = "octopus", units: int = 0):
    from octopus_audio import CompressedKVCache

    cache = CompressedKVCache(codec, 2, 64, window=1, defer_checks=False)
    g = torch.Generator().manual_seed(0)
    for _ in range(units):
        cache.append(torch.randn(1, 2, 3, 64, generator=g), torch.randn(1, 2, 3, 64, generator=g))
    return cache


def _q(heads: int = 2, tq: int = 5) -> torch.Tensor:
    return torch.randn(1, heads, tq, 64, generator=torch.Generator().manual_seed(1))


def _encode(name: str, bits: int = 2, seed: int = 0, heads: int = 3):
    from octopus_audio import get_codec

    k = torch.randn(1, heads, 7, 64, generator=torch.Generator().manual_seed(2))
    return get_codec(name, bits, 64, seed=seed).encode(k)


def _decode(writer: tuple, reader: tuple, strip: bool = False):
    from octopus_audio import get_codec

    state = _encode(*writer)
    if strip:  # as a state assembled by hand: no writer recorded, only its fields to go by
        import dataclasses

        state = dataclasses.replace(state, written_by=None)
    return get_codec(reader[0], reader[1], 64, seed=reader[2]).decode(state)


def _scores(name: str):
    from octopus_audio import get_codec

    return get_codec(name, 2, 64).scores(_q(heads=2), _encode(name, heads=3))


def _sampling(seed):
    from octopus_audio.aar_patch.generation import SamplingConfig

    return SamplingConfig(seed=seed)


def _get_codec(name: str, bits: int):
    from octopus_audio import get_codec

    return get_codec(name, bits, 64)


LIBRARY = [
    ("append-unit-of-0-tokens",
     lambda: _cache().append(torch.zeros(1, 2, 0, 64), torch.zeros(1, 2, 0, 64)),
     r"append takes one unit of at least one token: .* got \(1, 2, 0, 64\)"),
    ("append-0-tokens-after-a-unit",
     lambda: _cache(units=1).append(torch.zeros(1, 2, 0, 64), torch.zeros(1, 2, 0, 64)),
     "append takes one unit of at least one token"),
    ("append-batch-of-0", lambda: _cache().append(torch.zeros(0, 2, 3, 64), torch.zeros(0, 2, 3, 64)),
     "with B, H, T_unit >= 1"),
    ("decoded-kv-of-an-empty-cache", lambda: _cache().decoded_kv(), "decoded_kv called on an empty cache"),
    ("attend-scale-nan", lambda: _cache(units=2).attend(_q(), float("nan")),
     r"attend takes a finite positive scale .*, got nan"),
    ("attend-scale-inf", lambda: _cache(units=2).attend(_q(), float("inf")), "finite positive scale"),
    ("attend-scale-0", lambda: _cache(units=2).attend(_q(), 0.0), "finite positive scale"),
    ("attend-scale-negative", lambda: _cache(units=2).attend(_q(), -0.125), "finite positive scale"),
    ("attend-scale-not-a-number", lambda: _cache(units=2).attend(_q(), "0.125"), "finite positive scale"),
    ("attend-reference-scale-nan", lambda: _cache(units=2).attend_reference(_q(), float("nan")),
     "finite positive scale"),
    ("attend-none-scale-nan", lambda: _cache("none", units=2).attend(_q(), float("nan")),
     "finite positive scale"),
    *[(f"scores-heads-{name}", (lambda name=name: _scores(name)),
       r"scores takes queries \[\.\.\., H, Tq, 64\] with the state's batch and heads \(1, 3\)")
      for name in ("none", "turboquant-mse", "turboquant-qjl", "polarquant", "octopus", "octopus-qjl")],
    ("decode-another-codecs-state", lambda: _decode(("turboquant-mse", 2), ("polarquant", 2, 0)),
     r"written by turboquant-mse\(bits=2, head_dim=64, seed=0\); polarquant\(bits=2, .*\) decodes only"),
    ("decode-another-bit-widths-state", lambda: _decode(("octopus", 2), ("octopus", 3, 0)),
     r"written by octopus\(bits=2, .*\); octopus\(bits=3"),
    ("decode-another-seeds-state", lambda: _decode(("octopus", 2, 0), ("octopus", 2, 1)),
     r"written by octopus\(.*seed=0.*\); octopus\(.*seed=1"),
    ("decode-qjl-state-without-qjl", lambda: _decode(("octopus-qjl", 2), ("octopus", 2, 0), strip=True),
     "decodes a state with the fields codes, gamma; this one holds codes, gamma, gamma_r, signs"),
    ("decode-untagged-other-width", lambda: _decode(("octopus", 2), ("octopus", 3, 0), strip=True),
     "decodes 7 code words per key; this state has 5"),
    ("decode-native-state-as-octopus", lambda: _decode(("none", 2), ("octopus", 2, 0)),
     r"written by none\(head_dim=64\)"),
    ("get-codec-octopus-bits-8", lambda: _get_codec("octopus", 8),
     "does not support bits=8: allowed 1..7 with the default split"),
    ("get-codec-turboquant-bits-9", lambda: _get_codec("turboquant-mse", 9),
     "does not support bits=9: allowed 1..8"),
    ("sampling-seed-2**64", lambda: _sampling(SEED_MAX + 1),
     r"seed must be an integer from 0 to 2\*\*64 - 1"),
    ("sampling-seed-negative", lambda: _sampling(-1), r"seed must be an integer from 0 to 2\*\*64 - 1"),
]


@pytest.mark.parametrize("call, match", [c[1:] for c in LIBRARY], ids=[c[0] for c in LIBRARY])
def test_library_refuses_with_a_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_numpy_scale_and_a_matching_state_are_accepted():
    """What the checks let through still works: a numpy float scale, a state decoded by its own codec."""
    from octopus_audio import get_codec

    out = _cache(units=2).attend(_q(), np.float32(0.125))
    assert out.shape == (1, 2, 5, 64) and torch.isfinite(out).all()
    state = _encode("octopus", heads=2)
    assert get_codec("octopus", 2, 64, rounding="scalar").decode(state).shape == (1, 2, 7, 64)
    assert get_codec("octopus", 2, 64).scores(_q(heads=2), state).shape == (1, 2, 5, 7)
