"""The `train` command: a small AAR-architecture model (tokenizer, then transformer) on a folder of audio.

Data: folders of audio (`--data`) and/or the CC0 files of Debian's sonic-pi-samples (`--sonic-pi`), minus
the held-out list of `train_data.HELD_OUT`, read at 24 kHz mono (`sources.read_mono_24k`) and packed with
their condition embeddings (`conditioning.condition_vector`) into `--packed` (needs soundfile and the eval
conditioner); a machine without audio libraries trains from an existing `--packed` folder. The training
itself (checkpoints under `--out`, resume, export) is `aar_patch.train.train`."""

from __future__ import annotations

import argparse
import logging
import math
import sys
import tempfile
from pathlib import Path

from octopus_audio.aar_patch.train import SIZES, STAGES
from octopus_audio.errors import UsageError, error_prefix
from octopus_audio.outdir import check_out_path, nonempty

log = logging.getLogger(__name__)

CONDITIONER = "spectral"


# --- data ---------------------------------------------------------------------------------------------------

def _gather_sources(args: argparse.Namespace, scratch: Path) -> list[Path]:
    from octopus_audio.aar_patch import train_data

    files: list[Path] = []
    if args.sonic_pi:
        samples, copyright_path = train_data.install_sonic_pi(scratch)
        files += train_data.sonic_pi_cc0_files(samples, copyright_path)
    for folder in args.data or []:
        folder = Path(folder)
        if not folder.is_dir():
            raise UsageError(f"--data {folder} is not a folder; give folders of audio files")
        found = train_data.list_audio(folder)
        if not found:
            raise UsageError(f"--data {folder} holds no audio files ({', '.join(train_data.AUDIO_SUFFIXES)})")
        files += found
    seen: dict[str, Path] = {}
    held = sorted({p.name for p in files if p.stem in train_data.HELD_OUT})
    if held:
        log.warning("not training on %d held-out file name(s): %s", len(held), ", ".join(held))
    for p in files:  # one entry per stem: a shipped clip cut from a sonic-pi sample is that sample's audio
        if p.stem not in train_data.HELD_OUT and p.stem not in seen:
            seen[p.stem] = p
    return list(seen.values())


def prepare(args: argparse.Namespace, packed: Path) -> None:
    """Read, resample and embed the training files, and pack them under `packed`."""
    import numpy as np

    from octopus_audio.aar_patch import train_data
    from octopus_audio.eval import conditioning, sources

    files = _gather_sources(args, Path(tempfile.gettempdir()) / "octopus-audio-train")
    if not files:
        raise UsageError("no training audio: give --data FOLDER and/or --sonic-pi")
    conditioner = conditioning.make_conditioner(args.conditioner)
    clips = [sources.read_mono_24k(p) for p in files]
    cond = np.stack([conditioning.condition_vector(c, conditioner) for c in clips])
    train_data.pack([p.name for p in files], clips, cond, packed)
    seconds = sum(len(c) for c in clips) / train_data.SAMPLE_RATE
    log.warning("packed %d files (%.1f s of audio) with %s embeddings into %s", len(files), seconds,
                args.conditioner, packed)


# --- the command --------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    data = parser.add_argument_group("data")
    data.add_argument("--data", action="append", metavar="DIR",
                      help="a folder of audio files to train on (repeatable), e.g. clips/")
    data.add_argument("--sonic-pi", action="store_true",
                      help="add the CC0 files of Debian's sonic-pi-samples (fetched with apt-get download "
                           "when not installed), selected by the package's copyright file")
    data.add_argument("--packed", metavar="DIR", required=True, type=nonempty,
                      help="packed training arrays (.npy): written here from --data/--sonic-pi, else read "
                           "from here")
    data.add_argument("--prepare-only", action="store_true", help="pack the data and stop")
    data.add_argument("--conditioner", default=CONDITIONER,
                      help=f"condition embedding of each file (default {CONDITIONER}, the offline stand-in)")
    train = parser.add_argument_group("training")
    train.add_argument("--out", metavar="DIR", type=nonempty,
                       help="checkpoints, logs and exported sat.pth / aar.pth")
    train.add_argument("--stage", choices=STAGES, default="all", help="which model to train (default all)")
    train.add_argument("--size", choices=SIZES, default="default",
                       help="model sizes (default: the shipped one)")
    train.add_argument("--sat", metavar="PATH",
                       help="with --stage aar: the tokenizer checkpoint (default: the sat stage's state in "
                            "--out)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--device", default="auto", help="auto (cuda when present), cpu or cuda")
    train.add_argument("--sat-steps", type=int, default=20000)
    train.add_argument("--aar-steps", type=int, default=20000)
    train.add_argument("--sat-batch", type=int, default=32)
    train.add_argument("--aar-batch", type=int, default=64)
    train.add_argument("--sat-lr", type=float, default=5e-4)
    train.add_argument("--aar-lr", type=float, default=6e-4)
    train.add_argument("--sat-minutes", type=float,
                       help="time budget of the tokenizer stage (fits its steps)")
    train.add_argument("--aar-minutes", type=float,
                       help="time budget of the transformer stage (fits its steps)")
    train.add_argument("--aar-precompute", type=int, default=0, metavar="N",
                       help="tokenize N random crops once before the transformer stage and train on them "
                            "(0: tokenize each batch's fresh crops)")
    train.add_argument("--whiten-cond", action="store_true",
                       help="initialise the condition MLP's first layer from the conditions' principal "
                            "directions")
    train.add_argument("--stop-after", type=int, metavar="STEPS",
                       help="end each stage's call after STEPS more steps (checkpointed; a rerun resumes)")
    train.add_argument("--ckpt-every", type=int, default=500)
    train.add_argument("--log-every", type=int, default=50)
    train.add_argument("--no-progress", action="store_true", help="no progress bar")


# flag -> the least value it takes (integers); learning rates and time budgets are finite numbers > 0
AT_LEAST = {"--sat-steps": 1, "--aar-steps": 1, "--sat-batch": 1, "--aar-batch": 1, "--ckpt-every": 1,
            "--log-every": 1, "--stop-after": 1, "--aar-precompute": 0}
POSITIVE = ("--sat-lr", "--aar-lr", "--sat-minutes", "--aar-minutes")


def check_args(args: argparse.Namespace) -> None:
    """Every number and path of the command, before any data is read or any file written."""
    from octopus_audio.aar_patch.generation import seed_problem
    from octopus_audio.aar_patch.train import train_device

    def value(flag: str):
        return getattr(args, flag[2:].replace("-", "_"))

    for flag, low in AT_LEAST.items():
        v = value(flag)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < low):
            raise UsageError(f"{flag} must be an integer >= {low}, got {v!r}")
    for flag in POSITIVE:
        v = value(flag)
        if v is not None and not (math.isfinite(v) and v > 0):
            raise UsageError(f"{flag} must be a finite number > 0, got {v!r}")
    problem = seed_problem(args.seed, "--seed")
    if problem:
        raise UsageError(problem)
    train_device(args.device)
    packed = Path(args.packed)
    if args.data or args.sonic_pi:
        check_out_path(packed, "--packed")  # written
    elif packed.exists() and not packed.is_dir():
        raise UsageError(f"--packed {packed} is a file; --packed takes the folder `train --prepare-only` "
                         f"packs the data into")
    if args.out is not None and not args.prepare_only:
        check_out_path(args.out)


def run(args: argparse.Namespace) -> int:
    from octopus_audio.aar_patch.train import train
    from octopus_audio.aar_patch.train_data import load_packed

    check_args(args)
    packed = Path(args.packed)
    if args.data or args.sonic_pi:
        prepare(args, packed)
    elif args.prepare_only:
        raise UsageError("--prepare-only needs data to pack: give --data FOLDER and/or --sonic-pi")
    if args.prepare_only:
        return 0
    if not args.out:
        raise UsageError("--out DIR is required to train (checkpoints and exported weights go there)")
    try:
        data = load_packed(packed)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from e
    train(args, data)
    return 0


def build_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse `train` arguments outside the `octopus-audio` dispatcher."""
    parser = argparse.ArgumentParser(prog="octopus-audio train", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """`python -m octopus_audio.eval.train_cli ...`: the same as `octopus-audio train ...`."""
    args = build_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return run(args)
    except UsageError as e:
        print(f"{error_prefix('train')}{e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
