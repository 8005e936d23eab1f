"""The `octopus-audio` command line: one subcommand per module, each with `add_arguments` and `run`."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from octopus_audio.errors import UsageError

# subcommand -> (module, one-line help). Modules are imported only when their command runs, so a missing
# optional dependency of one command never breaks another.
COMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("octopus_audio.aar_patch.generate_cli", "generate audio with AAR under a KV-cache codec"),
    "eval": ("octopus_audio.eval.cli", "batch-evaluate codecs against the uncompressed output"),
    "probe": ("octopus_audio.probe", "synthetic codec tables (MSE, inner products, needle, ablations)"),
    "bench": ("octopus_audio.bench", "GPU kernel benchmarks: fused attention and encode vs SDPA"),
    "codebooks": ("octopus_audio.codebooks", "inspect or regenerate the shipped Lloyd-Max codebooks"),
    "train": ("octopus_audio.aar_patch.train", "train a small AAR-architecture model on a folder of audio"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's default prints usage + exits 2; keep it to one line
        usage = self.prog if self.prog.startswith("octopus-audio") else "octopus-audio"
        self.exit(2, f"octopus-audio: error: {message} (see `{usage} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="octopus-audio", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module_name)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name and not module_name.startswith(e.name):
                p.set_defaults(_missing=f"`octopus-audio {name}` needs the package `{e.name}`; "
                               f"install it (for example `pip install 'octopus-audio[eval]'`)")
            else:
                p.set_defaults(_missing=f"`octopus-audio {name}` is not available in this build")
            continue
        module.add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "_missing", None):
        print(f"octopus-audio: error: {args._missing}.", file=sys.stderr)
        return 2
    module = importlib.import_module(args._module)
    try:
        return int(module.run(args) or 0)
    except UsageError as e:
        print(f"octopus-audio {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"octopus-audio {args.command}: interrupted; finished work is kept and a rerun resumes.",
              file=sys.stderr)
        return 130
    except Exception as e:  # a failure, not a usage error: one line unless debugging is asked for
        if os.environ.get("OCTOPUS_AUDIO_DEBUG"):
            raise
        print(f"octopus-audio {args.command}: failed: {type(e).__name__}: {e} "
              f"(set OCTOPUS_AUDIO_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
