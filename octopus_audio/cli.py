"""The `octopus-audio` command line: one subcommand per module, each with `add_arguments` and `run`."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from octopus_audio.errors import UsageError, error_prefix

# subcommand -> (module, one-line help). Modules are imported only when their command runs, so a missing
# optional dependency of one command never breaks another.
COMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("octopus_audio.eval.generate_cli",
                 "1 s of audio under a KV-cache codec (default: the embedded model and condition)"),
    "eval": ("octopus_audio.eval.cli",
             "every codec at every width against the uncompressed output: tables, plots, a listening page"),
    "probe": ("octopus_audio.apps.probe",
              "synthetic codec tables: MSE, inner products, needle, equal-rate comparison"),
    "bench": ("octopus_audio.apps.bench",
              "(CUDA GPU) time the fused attention and encode kernels against SDPA"),
    "codebooks": ("octopus_audio.codebooks", "list, verify or regenerate the shipped Lloyd-Max codebooks"),
    "train": ("octopus_audio.eval.train_cli", "train a small AAR-architecture model on a folder of audio"),
}


DESCRIPTION = """Compress the key-value cache of next-scale autoregressive audio models (AAR) with
OCTOPUS and its peer codecs, and hear and measure what that does to the sound. Without
checkpoints, every command uses the small embedded default model."""

EPILOG = """examples:
  octopus-audio generate --codec octopus --bits 2 --out out/gen
      1 s of audio with a 2-bit OCTOPUS cache (default model, default condition)
  octopus-audio generate --codec octopus --bits 2 --compare --out out/gen
      the same, plus the uncompressed reference and one line of metrics against it
  octopus-audio generate --codec octopus --k-bits 2 --v-bits 4 --clip my.wav --out out/gen
      keys at 2 bits, values at 4, conditioned on your own clip
  octopus-audio eval --out out/eval
      every codec on the shipped clips; open out/eval/index.html to listen
  octopus-audio probe --out out/probe
      synthetic codec tables, rate-distortion curves, the equal-rate table

`octopus-audio COMMAND --help` lists a command's flags; OCTOPUS_AUDIO_DEBUG=1 shows tracebacks."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's default prints usage + exits 2; keep it to one line
        usage = self.prog if self.prog.startswith("octopus-audio") else "octopus-audio"
        command = usage.removeprefix("octopus-audio").strip() or None
        self.exit(2, f"{error_prefix(command)}{message} (see `{usage} --help`)\n")


def chosen_command(argv: list[str]) -> str | None:
    """The subcommand `argv` names (its first word that is not an option), or None."""
    words = [a for a in argv if not a.startswith("-")]
    return words[0] if words and words[0] in COMMANDS else None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; only `command`'s module is imported (for its flags), so a command loads
    nothing another command needs and the top-level help lists every command without importing any."""
    from octopus_audio import __version__

    parser = _Parser(prog="octopus-audio", description=DESCRIPTION, epilog=EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"octopus-audio {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module_name)
        if name != command:
            continue
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
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(chosen_command(argv))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "_missing", None):
        print(f"{error_prefix(args.command)}{args._missing}.", file=sys.stderr)
        return 2
    module = importlib.import_module(args._module)
    try:
        return int(module.run(args) or 0)
    except UsageError as e:
        print(f"{error_prefix(args.command)}{e}", file=sys.stderr)
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
