"""The README stays a product README: short table cells, no commit hashes or run numbers, every flag named.

Checked on README.md: no Markdown table cell over 300 characters; no commit-hash-like token (7-40 lowercase
hex digits with at least one digit and one letter a-f, as a whole word), no "session N" / "run N" and no date;
every long option of the `octopus-audio` parser and of each subcommand's parser appears. Checked on the
product code (octopus_audio/**/*.py): no commit-hash-like token in a comment or a docstring (hashes belong in
the results files). Each checker is also run on small examples of its own, so none can pass vacuously.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
PACKAGE = REPO / "octopus_audio"
MAX_CELL = 300

FENCE_RE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CELL_SPLIT_RE = re.compile(r"(?<!\\)\|")
HASH_RE = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
RUN_NUMBER_RE = re.compile(r"\b(?:session|run)\s*#?\s*\d+\b|\b(?:session|run)\d+", re.IGNORECASE)
DATE_RE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")


def long_cells(text: str, limit: int = MAX_CELL) -> list[str]:
    """The cells of the Markdown tables in `text` (fenced blocks left out) longer than `limit` characters."""
    out = []
    for line in FENCE_RE.sub("", text).splitlines():
        stripped = line.strip()
        if stripped.startswith("|"):
            out += [c.strip() for c in CELL_SPLIT_RE.split(stripped.strip("|")) if len(c.strip()) > limit]
    return out


def hash_tokens(text: str) -> list[str]:
    """The commit-hash-like tokens of `text`."""
    return HASH_RE.findall(text)


def run_numbers(text: str) -> list[str]:
    """Every "session N", "run N" or "runN" in `text`."""
    return RUN_NUMBER_RE.findall(text)


def dates(text: str) -> list[str]:
    """Every ISO date in `text` (a dated run log or a dated raw path)."""
    return DATE_RE.findall(text)


def comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and every module, class and function docstring of Python `source`."""
    out = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
           if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((node.body[0].lineno, doc))
    return out


def long_options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}


def cli_long_options() -> dict[str, set[str]]:
    """Each subcommand's long options (and the top level's, under ''), from the parsers the CLI builds."""
    from octopus_audio.cli import COMMANDS, build_parser

    out = {"": long_options(build_parser(None))}
    for name in COMMANDS:
        parser = build_parser(name)
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        assert not sub.choices[name].get_default("_missing"), f"`{name}` cannot be built here"
        out[name] = long_options(sub.choices[name])
    return out


def missing_options(text: str, options: set[str]) -> list[str]:
    """The options of `options` that `text` never names as a whole word (`--d` is not named by `--device`)."""
    return sorted(o for o in options if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text))


# --- the README and the product code ---------------------------------------------------------------------

def test_readme_table_cells_are_short():
    long = long_cells(README.read_text(encoding="utf-8"))
    assert not long, f"{len(long)} README table cells over {MAX_CELL} chars, the first: {long[0][:80]}..."


def test_readme_names_no_commit_or_run():
    text = README.read_text(encoding="utf-8")
    assert not hash_tokens(text), f"commit-hash-like tokens in README.md: {hash_tokens(text)}"
    assert not run_numbers(text), f"session or run numbers in README.md: {run_numbers(text)}"
    assert not dates(text), f"dates in README.md (dated logs and paths belong in the results): {dates(text)}"


def test_product_comments_name_no_commit():
    found = [f"{p.relative_to(REPO)}:{line}: {token}" for p in sorted(PACKAGE.rglob("*.py"))
             for line, text in comments_and_docstrings(p.read_text(encoding="utf-8"))
             for token in hash_tokens(text)]
    assert not found, ("commit hashes in product comments or docstrings (they belong in the results files):\n"
                       + "\n".join(found))


@pytest.mark.parametrize("command", ["", "generate", "eval", "probe", "bench", "codebooks", "train"],
                         ids=lambda c: c or "top-level")
def test_readme_names_every_flag(command):
    options = cli_long_options()[command]
    assert options, f"no long options found for {command or 'the top level'}"
    missing = missing_options(README.read_text(encoding="utf-8"), options)
    assert not missing, f"`octopus-audio {command}` flags the README never names: {', '.join(missing)}"


def test_every_command_is_checked():
    from octopus_audio.cli import COMMANDS

    assert set(COMMANDS) == {"generate", "eval", "probe", "bench", "codebooks", "train"}


# --- the checkers on examples of their own -----------------------------------------------------------------

def test_long_cells_on_examples():
    short, long = "x" * MAX_CELL, "y" * (MAX_CELL + 1)
    table = f"| a | b |\n| --- | --- |\n| {short} | {long} |\n"
    assert long_cells(table) == [long]
    assert long_cells(f"| `[--check \\| {long[:200]}` | {long[:200]} |") == []  # an escaped pipe splits none
    assert long_cells(f"| `a \\| {long[:200]}` |") == []
    assert long_cells(f"| `a \\| {long}` |") == [f"`a \\| {long}`"]
    assert long_cells(f"```\n| {long} |\n```\ntext {long}\n") == []  # fenced blocks and prose are not tables


def test_hash_tokens_on_examples():
    assert hash_tokens("at commit e49f20d, (2ce4654), df704e6-7113ebd and "
                       "`a5765855a3e50a7b5499a457f0948f1136170657`.") == \
        ["e49f20d", "2ce4654", "df704e6", "7113ebd", "a5765855a3e50a7b5499a457f0948f1136170657"]
    assert hash_tokens("deadbeef facade 1234567 1e-20 fp16 abc123 0x1f2e3d4c E49F20D run15_e49f20d") == []
    assert hash_tokens("a" * 6 + "1") == ["aaaaaa1"]
    assert hash_tokens("a" * 40 + "1") == []  # 41 digits: no commit hash


def test_run_numbers_on_examples():
    assert run_numbers("measured in session 13, run 55 and run68 (Session #4)") == \
        ["session 13", "run 55", "run68", "Session #4"]
    assert run_numbers("a rerun resumes; run the tests; runs 3 codecs; the run's rows; 16 runs") == []


def test_dates_on_examples():
    assert dates("on 2026-12-02, see raw/2026-12-01/cpu-probe/table.md") == ["2026-12-02", "2026-12-01"]
    assert dates("b = 2-3-4, 1e-20, 16-bit, 2**64 - 1") == []


def test_missing_options_on_examples():
    options = {"--d", "--device", "--n", "--n-clips"}
    assert missing_options("`--device` and --n-clips", options) == ["--d", "--n"]
    assert missing_options("| `--d` | `--n N` |", {"--d", "--n"}) == []


def test_comments_and_docstrings_on_example():
    source = '"""Module e49f20d."""\nx = "not a docstring 2ce4654"  # a comment at 715db33\n' \
             'def f():\n    """Function 9d78b21."""\n'
    found = [t for _, text in comments_and_docstrings(source) for t in hash_tokens(text)]
    assert sorted(found) == ["715db33", "9d78b21", "e49f20d"]
