"""Every bad input stopped at the door, in one table: each CLI case through the real entry point exits 2 with
our one sentence and writes or changes no file (a fresh interpreter runs them all again and finds nothing else
on stderr, nor a crash), and each library check is a ValueError naming what was wrong and what is
accepted. A run into a folder another run holds is refused the same way (two real processes)."""

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
from octopus_audio.eval.cli import CPU_DRAWS

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


def _damaged_settings(prior: Path, text: str) -> Path:
    """The prior run's settings.json replaced by `text` (empty, not JSON, null, a list)."""
    (prior / "run" / "settings.json").write_text(text)
    return prior


def _junk_checkpoint(prior: Path) -> Path:
    """The prior run's transformer checkpoint replaced by bytes that are no checkpoint."""
    (prior / "ckpt" / "aar.pth").write_bytes(b"not a checkpoint\n")
    return prior


def _escaping_folder(d: Path) -> Path:
    """A model folder (the embedded one's config) whose config.json names transformer weights outside it."""
    from octopus_audio.aar_patch.default_model import default_model_dir

    doc = json.loads((default_model_dir() / "config.json").read_text())
    doc["transformer"]["file"] = "../aar.safetensors"
    (d / "m").mkdir()
    (d / "m" / "config.json").write_text(json.dumps(doc))
    shutil.copy(default_model_dir() / "aar.safetensors", d / "aar.safetensors")
    return d / "m"


PROC = Path("/proc/octopus-audio-no-such-folder")  # /proc accepts no new entries, whoever runs the test


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
    # --sink-scales: counts of first scales kept native, within the model's scales
    Case("generate-sink-scales-negative",
         lambda d, p: generate_argv(d, "--codec", "octopus", "--bits", "2", "--sink-scales", "-1"),
         "--sink-scales must be an integer >= 0"),
    Case("generate-sink-scales-17",
         lambda d, p: generate_argv(d, "--codec", "octopus", "--bits", "2", "--sink-scales", "17"),
         "--sink-scales must be 0 .. 16 (the model's scales), got 17"),
    Case("generate-none-with-sink-scales", lambda d, p: generate_argv(d, "--sink-scales", "3"),
         "--codec none keeps every scale native and takes no --sink-scales"),
    Case("eval-sink-scales-17",
         lambda d, p: eval_argv(copy_prior(p, d), "--codecs", "octopus", "--sink-scales", "0,17"),
         "--sink-scales 17 is more than the model's 16 scales"),
    Case("eval-sink-scales-twice", lambda d, p: eval_argv(d, "--codecs", "octopus", "--sink-scales", "3,3"),
         "--sink-scales must be a comma list of distinct integers >= 0"),
    Case("eval-sink-scales-text", lambda d, p: eval_argv(d, "--codecs", "octopus", "--sink-scales", "3,x"),
         "--sink-scales must be a comma list of integers >= 0"),
    Case("eval-none-with-sink-scales", lambda d, p: eval_argv(d, "--sink-scales", "3"),
         "--codecs none keeps every scale native and takes no --sink-scales"),
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
         "holds a run made with other settings (seed differs; seed was 42, now 7)"),
    Case("eval-rerun-other-window", lambda d, p: eval_argv(copy_prior(p, d), "--window", "2"),
         "holds a run made with other settings (window differs; window was 1, now 2)"),
    Case("eval-rerun-other-seed-and-window",
         lambda d, p: eval_argv(copy_prior(p, d), "--seed", "7", "--window", "2"),
         "holds a run made with other settings (seed and window differ; seed was 42, now 7)"),
    # paths to conditioner weights and datasets are checked before anything loads
    Case("eval-clap-folder-missing",
         lambda d, p: eval_argv(copy_prior(p, d), "--clap", f"hf:{d / 'no-clap'}"),
         "is neither a folder nor a hub id"),
    Case("eval-dataset-folder-missing",
         lambda d, p: ["eval", "--clips", "audioset-20k", "--dataset", str(d / "no-data"),
                       "--clap", "spectral", "--out", str(d / "run")], "is neither a folder nor a hub id"),
    # --threads: at most the cores (100000 used to print its sentence and then segfault in OpenMP)
    Case("eval-threads-100000", lambda d, p: eval_argv(d, "--threads", "100000"),
         "--threads must be an integer >= 1 and at most the"),
    # the cache's settings: checked before anything is written (they used to fail every row, then refuse the
    # corrected rerun as another fingerprint)
    Case("eval-window-negative", lambda d, p: eval_argv(d, "--window", "-1"),
         "--window must be an integer >= 0, got -1"),
    Case("eval-v-group-0", lambda d, p: eval_argv(d, "--v-group", "0"),
         "--v-group must be an integer >= 1, got 0"),
    Case("eval-v-group-negative", lambda d, p: eval_argv(d, "--v-group", "-1"),
         "--v-group must be an integer >= 1, got -1"),
    Case("eval-v-group-3", lambda d, p: eval_argv(copy_prior(p, d), "--v-group", "3", out=d / "new"),
         "--v-group 3: value group 3 must divide the head dim 64"),
    Case("eval-v-group-1000", lambda d, p: eval_argv(copy_prior(p, d), "--v-group", "1000", out=d / "new"),
         "--v-group 1000: value group 1000 must divide the head dim 64"),
    Case("eval-checkpoint-unreadable",
         lambda d, p: eval_argv(_junk_checkpoint(copy_prior(p, d)), out=d / "new"),
         "aar.pth as a PyTorch checkpoint; the file is truncated, corrupt or of another kind"),
    Case("eval-cache-dir-is-a-file", lambda d, p: eval_argv(d, "--cache-dir", str(_with_file(d, "afile"))),
         "is a file; --cache-dir takes a folder"),
    # guidance: finite and within +-1e6 (1e308 turned into inf in float32 and failed inside sampling)
    Case("generate-cfg-1e308", lambda d, p: generate_argv(d, "--cfg", "1e308"),
         "--cfg must be a finite number within +-1e+06"),
    Case("eval-cfg-1e308", lambda d, p: eval_argv(d, "--cfg", "1e308"),
         "--cfg must be a finite number within +-1e+06"),
    Case("eval-cfg-nan", lambda d, p: eval_argv(d, "--cfg", "nan"), "--cfg must be a finite number"),
    # outputs that cannot be written are found before generating (they used to fail after, leaving a WAV)
    *([Case("generate-out-in-proc", lambda d, p: generate_argv(d, out=PROC),
            "cannot be written: /proc does not accept new files"),
       Case("generate-latents-in-proc",
            lambda d, p: generate_argv(d, "--save-latents", str(PROC / "lat.pt")),
            "--save-latents /proc/octopus-audio-no-such-folder/lat.pt cannot be written"),
       Case("eval-out-in-proc", lambda d, p: eval_argv(d, out=PROC), "cannot be written")]
      if Path("/proc").is_dir() else []),
    Case("generate-latents-exist",
         lambda d, p: generate_argv(d, "--save-latents", str(_with_file(d, "lat.pt"))),
         "lat.pt already exists; pass --overwrite to replace it or choose another --save-latents"),
    Case("generate-out-empty", lambda d, p: ["generate", "--cond", str(cond_file(d / "c.npy")), "--out", ""],
         "argument --out: an empty path"),
    Case("eval-out-empty", lambda d, p: eval_argv(d, "--out", ""), "argument --out: an empty path"),
    Case("eval-clips-empty", lambda d, p: eval_argv(d, "--clips", ""), "argument --clips: an empty path"),
    # train: paths and numbers before any data is read (a packed FILE raised FileExistsError; -1 steps and a
    # NaN learning rate started training)
    Case("train-packed-is-a-file",
         lambda d, p: ["train", "--data", str(tone(d / "clips" / "a.wav").parent), "--packed",
                       str(_with_file(d, "afile")), "--out", str(d / "o")],
         "is a file; --packed takes a folder"),
    Case("train-aar-steps-negative",
         lambda d, p: ["train", "--packed", str(d / "packed"), "--out", str(d / "o"), "--aar-steps", "-1"],
         "--aar-steps must be an integer >= 1, got -1"),
    Case("train-aar-lr-nan",
         lambda d, p: ["train", "--packed", str(d / "packed"), "--out", str(d / "o"), "--aar-lr", "nan"],
         "--aar-lr must be a finite number > 0, got nan"),
    Case("train-out-is-a-file",
         lambda d, p: ["train", "--packed", str(d / "packed"), "--out", str(_with_file(d, "afile"))],
         "is a file; --out takes a folder"),
    # messages that name the actual problem
    Case("eval-unknown-codec-with-bits", lambda d, p: eval_argv(d, "--codecs", "foo", "--bits", "2"),
         "unknown codec 'foo'; accepted: all or a comma list of"),
    Case("eval-clips-is-a-file", lambda d, p: eval_argv(copy_prior(p, d), "--clips", str(tone(d / "a.wav"))),
         "a.wav is a file; --clips takes a folder of audio files or audioset-20k"),
    *[Case(f"eval-settings-{name}",
           (lambda d, p, text=text: eval_argv(_damaged_settings(copy_prior(p, d), text))),
           f"settings.json is damaged ({why})")
      for name, text, why in (("invalid", "{not json", "it is not valid JSON"), ("empty", "", "it is empty"),
                              ("null", "null", "it holds null instead of a JSON object"),
                              ("list", "[1, 2]", "it holds [1, 2] instead of a JSON object"))],
    Case("generate-model-folder-escapes", lambda d, p: generate_argv(d, "--aar", str(_escaping_folder(d))),
         "names the transformer weights '../aar.safetensors', outside the folder"),
    Case("generate-bits-not-an-integer", lambda d, p: generate_argv(d, "--codec", "octopus", "--bits", "x"),
         "argument --bits: invalid int value: 'x'"),
    # list flags refuse empty items (--bits '' used to run the default widths)
    Case("eval-bits-empty", lambda d, p: eval_argv(d, "--codecs", "octopus", "--bits", ""),
         "--bits is empty; pass a comma list such as 2,3,4"),
    Case("eval-bits-empty-item", lambda d, p: eval_argv(d, "--codecs", "octopus", "--bits", "2,,3"),
         "--bits '2,,3' has an empty item"),
    Case("eval-v-bits-trailing-comma", lambda d, p: eval_argv(d, "--codecs", "octopus", "--v-bits", "4,"),
         "--v-bits '4,' has an empty item"),
    Case("eval-codecs-trailing-comma", lambda d, p: eval_argv(d, "--codecs", "octopus,"),
         "--codecs 'octopus,' has an empty item"),
    # the output folder is never read as input
    Case("eval-clips-inside-out",
         lambda d, p: eval_argv(copy_prior(p, d), "--clips", str(d / "prior" / "run" / "wav")),
         "lies inside --out"),
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


def exit_code(argv: list[str]) -> int:
    """`main(argv)`'s exit code, argparse's own refusals (a SystemExit) included."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def one_sentence(err: str, command: str, says: str) -> None:
    prefix = f"octopus-audio {command}: error: "
    assert err.startswith(prefix) and err.endswith("\n") and err.count("\n") == 1, repr(err)
    assert says in err, f"{says!r} not in {err!r}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cli_refuses_with_one_sentence_and_writes_nothing(case, tmp_path, prior_run, capsys):
    argv = case.setup(tmp_path, prior_run)
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert exit_code(argv) == 2
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


def test_a_held_folder_is_refused_and_released(tmp_path):
    """One holder at a time, in one process too; the folder is free again when its holder ends, and a body
    that fails leaves no folder the hold created."""
    from octopus_audio.errors import UsageError
    from octopus_audio.outdir import hold_folder

    with hold_folder(tmp_path / "a"):
        with pytest.raises(UsageError, match=r"--out .*a is in use: another octopus-audio run is writing"):
            with hold_folder(tmp_path / "a"):
                pass
    with hold_folder(tmp_path / "a"):
        pass
    with pytest.raises(UsageError, match="refused"):
        with hold_folder(tmp_path / "b" / "c"):
            raise UsageError("refused")
    assert not (tmp_path / "b").exists() and (tmp_path / "a").is_dir()


def test_a_second_run_into_a_busy_folder_is_refused_and_a_killed_run_holds_nothing(tmp_path, prior_run):
    """Two real processes: the first eval holds its --out (stopped with SIGSTOP while it works), the same
    command started beside it exits 2 with one sentence and changes nothing; the first is then SIGKILLed,
    and a third run goes ahead, finishing the work without a duplicate row."""
    import signal
    import time

    root = copy_prior(prior_run, tmp_path)
    tone(root / "clips" / "tone2.wav", 550.0)
    out = tmp_path / "busy"
    command = [sys.executable, "-m", "octopus_audio", *eval_argv(root, out=out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    with open(tmp_path / "first.err", "w") as err:
        first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, env=env)
    try:
        deadline = time.monotonic() + 300
        while not (out / "settings.json").exists():  # written once the run holds the folder
            assert first.poll() is None, (tmp_path / "first.err").read_text()[-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(first.pid, signal.SIGSTOP)
        before = snapshot(out)
        second = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        assert second.returncode == 2, second.stderr[-2000:]
        one_sentence(second.stderr, "eval", f"--out {out} is in use: another octopus-audio run is writing")
        assert snapshot(out) == before
    finally:
        first.kill()  # SIGKILL, stopped or not: the operating system drops its hold
        first.wait()
    third = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert third.returncode == 0, third.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    # each clip: the reference's own rows and codec none's, at each of the CPU's default draws
    assert sorted((r["clip"], r["codec"], r["draw"]) for r in rows) == [
        (clip, codec, draw) for clip in ("tone", "tone2") for codec in ("none", "reference")
        for draw in range(CPU_DRAWS)]
    assert all(r["status"] == "ok" for r in rows)
    logged = [json.loads(line) for line in (out / "rows" / "rank0.jsonl").read_text().splitlines()]
    assert len({(r["clip"], r["codec"], r["draw"]) for r in logged}) == len(logged)  # nothing written twice


def test_the_limits_themselves_are_accepted(tmp_path):
    """The edges of each documented range pass the checks that refuse what lies beyond them."""
    from octopus_audio.aar_patch.generation import COND_ABS_MAX, SamplingConfig, condition_problem
    from octopus_audio.codecs import bits_problem, get_codec
    from octopus_audio.eval.records import EvalConfig

    assert SamplingConfig(seed=0).seed == 0 and SamplingConfig(seed=SEED_MAX).seed == SEED_MAX
    assert EvalConfig(codecs=("octopus",), bits=(7,), seed=SEED_MAX - 1).seed == SEED_MAX - 1
    assert EvalConfig(codecs=("octopus",), bits=(7,), seed=SEED_MAX, floor=False).seed == SEED_MAX
    assert EvalConfig(codecs=("octopus",), seed=SEED_MAX - 3, draws=2).seed == SEED_MAX - 3  # up to seed + 3
    assert EvalConfig(codecs=("octopus",), seed=SEED_MAX - 1, draws=2, floor=False).draws == 2
    assert condition_problem(np.full((2, 512), COND_ABS_MAX)) is None
    assert condition_problem(np.zeros((1, 512))) is None
    assert bits_problem("octopus", 7) is None and bits_problem("turboquant-mse", 8) is None
    assert get_codec("octopus", 8, 64, dir_bits=8).bits == 8  # 8 with an explicit split
    from octopus_audio.aar_patch.generation import CFG_ABS_MAX
    from octopus_audio.eval.cli import check_threads, check_v_group, usable_cores

    assert SamplingConfig(cfg=CFG_ABS_MAX).cfg == SamplingConfig(cfg=-CFG_ABS_MAX).cfg * -1 == 1e6
    assert EvalConfig(codecs=("none",), window=0, v_group=64, cfg=1e6).window == 0
    check_threads(usable_cores())
    check_v_group(64, 64)
    check_v_group(1, 64)


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


def _sampling_cfg(cfg):
    from octopus_audio.aar_patch.generation import SamplingConfig

    return SamplingConfig(cfg=cfg)


def _deferred(v: torch.Tensor):
    """A cache whose checks are deferred (as on CUDA), after one unit with values `v`."""
    from octopus_audio import CompressedKVCache

    cache = CompressedKVCache("octopus", 2, 64, window=0, defer_checks=True)
    cache.append(torch.zeros_like(v), v)
    return cache


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
    ("sampling-cfg-1e308", lambda: _sampling_cfg(1e308), r"cfg must be a finite number within \+-1e\+06"),
    ("sampling-cfg-nan", lambda: _sampling_cfg(float("nan")), "cfg must be a finite number"),
    # values: finite ones beyond fp16 are named as such (they used to be called non-finite)
    ("append-values-beyond-fp16",
     lambda: _cache().append(torch.zeros(1, 2, 3, 64), torch.full((1, 2, 3, 64), 1e6)),
     r"append got values beyond the fp16 range \(max \|v\| = 1e\+06\): .*\|v\| <= 65504"),
    ("append-values-nan",
     lambda: _cache().append(torch.zeros(1, 2, 3, 64), torch.full((1, 2, 3, 64), float("nan"))),
     r"append got non-finite values \(NaN or Inf\)"),
    ("append-keys-inf",
     lambda: _cache().append(torch.full((1, 2, 3, 64), float("inf")), torch.zeros(1, 2, 3, 64)),
     r"append got non-finite keys \(NaN or Inf\)"),
    ("append-values-beyond-fp16-deferred",
     lambda: _deferred(torch.full((1, 2, 3, 64), 7e4)).check(),
     r"append got values beyond the fp16 range \(max \|v\| = 7e\+04\)"),
    # queries: NaN refused where the checks are immediate; batch, head_dim and heads named apart
    ("attend-nan-query", lambda: _cache(units=2).attend(_q().fill_(float("nan")), 0.125),
     r"attend got non-finite queries \(NaN or Inf\)"),
    ("attend-reference-inf-query",
     lambda: _cache(units=2).attend_reference(_q().fill_(float("inf")), 0.125), "non-finite queries"),
    ("attend-none-nan-query", lambda: _cache("none", units=2).attend(_q().fill_(float("nan")), 0.125),
     "non-finite queries"),
    ("attend-wrong-batch", lambda: _cache(units=2).attend(torch.zeros(2, 2, 5, 64), 0.125),
     r"q's batch is 2, the cache's 1 \(got \(2, 2, 5, 64\)\)"),
    ("attend-wrong-head-dim", lambda: _cache(units=2).attend(torch.zeros(1, 2, 5, 32), 0.125),
     "q's head_dim is 32, the cache's 64"),
    ("attend-wrong-heads", lambda: _cache(units=2).attend(torch.zeros(1, 3, 5, 64), 0.125),
     "q's 3 heads are not a multiple of the cache's H=2 KV heads"),
    ("attend-3-dims", lambda: _cache(units=2).attend(torch.zeros(2, 5, 64), 0.125), "q has 3 dims"),
    # numpy arrays: refused with the conversion to use (they used to raise AttributeError)
    ("append-numpy", lambda: _cache().append(np.zeros((1, 2, 3, 64), np.float32), np.zeros((1, 2, 3, 64))),
     "append's k must be a torch.Tensor, got a numpy.ndarray; convert it with torch.from_numpy"),
    ("append-numpy-values", lambda: _cache().append(torch.zeros(1, 2, 3, 64), np.zeros((1, 2, 3, 64))),
     "append's v must be a torch.Tensor, got a numpy.ndarray"),
    ("append-numpy-after-a-unit",
     lambda: _cache(units=1).append(np.zeros((1, 2, 3, 64), np.float32), np.zeros((1, 2, 3, 64), np.float32)),
     "append's k must be a torch.Tensor"),
    ("attend-numpy", lambda: _cache(units=2).attend(_q().numpy(), 0.125),
     "attend's q must be a torch.Tensor, got a numpy.ndarray; convert it with torch.from_numpy"),
    ("attend-list", lambda: _cache(units=2).attend([[0.0]], 0.125),
     "attend's q must be a torch.Tensor, got a list"),
    ("encode-numpy", lambda: _get_codec("octopus", 2).encode(np.zeros((1, 2, 3, 64), np.float32)),
     "keys must be a torch.Tensor, got a numpy.ndarray"),
    ("scores-numpy", lambda: _get_codec("turboquant-mse", 2).scores(_q().numpy(), _encode("turboquant-mse")),
     "queries must be a torch.Tensor, got a numpy.ndarray"),
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
