"""Output folders: a command writes only into a new or empty folder, or one that holds only files it wrote.

`check_out_path` refuses an `--out` that is a file or lies under one; `refuse_foreign` refuses a folder
holding files the command did not write (unless `--overwrite`). `generate` lists what it wrote in a manifest
(`MANIFEST`, one relative path a line) so a later run knows its own files; `eval` marks its folders with its
settings file instead (eval/runner.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from octopus_audio.errors import UsageError

MANIFEST = ".octopus-audio-files"


def _refuse_under_file(path: Path, flag: str) -> None:
    """UsageError when the nearest existing parent of `path` is not a folder."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{flag} {path} lies under {parent}, which is a file; pass a path in a "
                                 f"folder")
            return


def check_out_path(path: str | Path, flag: str = "--out") -> None:
    """UsageError when the output folder `path` is an existing file, or lies under a file."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path} is a file; {flag} takes a folder (new, empty, or one this command "
                         f"wrote)")
    _refuse_under_file(path, flag)


def check_out_file(path: str | Path, flag: str) -> None:
    """UsageError when the output file `path` is an existing folder, or lies under a file."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a folder; {flag} takes a file name")
    _refuse_under_file(path, flag)


def files_under(folder: str | Path) -> list[str]:
    """Relative POSIX paths of every file under `folder` (recursive, sorted); [] when it does not exist."""
    root = Path(folder)
    if not root.is_dir():
        return []
    out = []
    for dirpath, _, names in os.walk(root):
        out.extend((Path(dirpath) / n).relative_to(root).as_posix() for n in names)
    return sorted(out)


def read_manifest(folder: str | Path) -> set[str]:
    """The files a command recorded as its own in `folder` (relative paths), with the manifest itself."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return set()
    return {line for line in path.read_text(encoding="utf-8").splitlines() if line} | {MANIFEST}


def add_to_manifest(folder: str | Path, files: Iterable[str | Path]) -> None:
    """Record `files` (paths inside `folder`) as written by the command, before it writes them."""
    folder = Path(folder)
    names = {Path(f).resolve().relative_to(folder.resolve()).as_posix() for f in files}
    known = read_manifest(folder) - {MANIFEST}
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text("".join(f"{n}\n" for n in sorted(known | names)), encoding="utf-8")
    os.replace(tmp, folder / MANIFEST)


def refuse_foreign(folder: str | Path, owned: set[str], command: str, overwrite: bool,
                   flag: str = "--out") -> None:
    """UsageError when `folder` holds a file not in `owned` (relative paths) and `overwrite` is off."""
    if overwrite:
        return
    foreign = [f for f in files_under(folder) if f not in owned]
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise UsageError(f"{flag} {folder} holds files that `octopus-audio {command}` did not write "
                         f"({foreign[0]}{more}); choose a new or empty folder, or pass --overwrite to write "
                         f"into it anyway")
