"""Output folders: a command writes only into a new or empty folder, or one that holds only files it wrote.

`check_out_path` refuses an `--out` that is a file, lies under one, or cannot be written; `refuse_foreign`
refuses a folder holding files the command did not write (unless `--overwrite`). Each command lists what it
writes in its own manifest (`manifest_name(command)`, one relative path a line, recorded before the file is
written), so a later run knows its own files and `--overwrite` removes only those (`remove_owned`). While a
run writes, it holds the folder (`hold_folder`: a lock the operating system releases when the process ends,
however it ends), so a second run into the same folder is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from octopus_audio.errors import UsageError

MANIFEST = ".octopus-audio-files"  # generate's manifest
MANIFESTS = {"generate": MANIFEST, "eval": ".octopus-audio-eval-files"}


def manifest_name(command: str) -> str:
    """The file in which `command` lists what it wrote in a folder."""
    return MANIFESTS[command]


def nonempty(text: str) -> str:
    """argparse type of a path flag: the text itself, refusing the empty string (which a path would read as
    the current folder)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path; pass a file or folder name")
    return text


def path_arg(text: str) -> Path:
    """argparse type of a path flag, as a Path (`nonempty`)."""
    return Path(nonempty(text))


def _nearest_existing(path: Path) -> Path:
    for parent in (path, *path.parents):
        if parent.exists():
            return parent
    return Path(".")


def _refuse_under_file(path: Path, flag: str) -> None:
    """UsageError when the nearest existing parent of `path` is not a folder."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{flag} {path} lies under {parent}, which is a file; pass a path in a "
                                 f"folder")
            return


def check_writable(folder: str | Path, flag: str, named: str | Path | None = None) -> None:
    """UsageError when nothing can be created in `folder` (the message names the flag's value `named`, or the
    folder): its nearest existing folder refuses a new entry (a read-only or virtual file system, missing
    permissions).
    Probed by creating and removing an empty folder there, so the answer is the file system's own."""
    folder = Path(folder)
    where = _nearest_existing(folder)
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".octopus-audio-probe-", dir=where))
    except OSError as e:
        raise UsageError(f"{flag} {named or folder} cannot be written: {where} does not accept new files "
                         f"({e.strerror or type(e).__name__}); pass a path in a writable folder") from e


def check_out_path(path: str | Path, flag: str = "--out") -> None:
    """UsageError when the output folder `path` is empty text, an existing file, lies under a file, or
    cannot be written."""
    if str(path) == "":
        raise UsageError(f"{flag} is empty; pass a folder name")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path} is a file; {flag} takes a folder")
    _refuse_under_file(path, flag)
    check_writable(path, flag)


def check_out_file(path: str | Path, flag: str) -> None:
    """UsageError when the output file `path` is an existing folder, lies under a file, or its folder cannot
    be written."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a folder; {flag} takes a file name")
    _refuse_under_file(path, flag)
    check_writable(path.parent, flag, path)


def files_under(folder: str | Path) -> list[str]:
    """Relative POSIX paths of every file under `folder` (recursive, sorted); [] when it does not exist."""
    root = Path(folder)
    if not root.is_dir():
        return []
    out = []
    for dirpath, _, names in os.walk(root):
        out.extend((Path(dirpath) / n).relative_to(root).as_posix() for n in names)
    return sorted(out)


def read_manifest(folder: str | Path, command: str = "generate") -> set[str]:
    """The files `command` recorded as its own in `folder` (relative paths), with the manifest itself; a last
    line without its newline (a write cut short) is not counted."""
    name = manifest_name(command)
    path = Path(folder) / name
    if not path.is_file():
        return set()
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")[:-1]  # the part after the last newline is empty or torn
    return {line for line in lines if line} | {name}


class Manifest:
    """What `command` wrote in `folder`: `add` appends the names not listed yet (one write a call, so
    processes writing into one folder do not tear each other's lines); safe to call from several threads."""

    def __init__(self, folder: str | Path, command: str) -> None:
        self.folder = Path(folder)
        self.path = self.folder / manifest_name(command)
        self.known = read_manifest(folder, command)
        self._lock = threading.Lock()

    def add(self, files: Iterable[str | Path]) -> None:
        """Record `files` (paths inside the folder, absolute or relative to it), before they are written."""
        root = self.folder.resolve()
        names = {(root / f).resolve().relative_to(root).as_posix() for f in files}
        with self._lock:
            new = sorted(names - self.known)
            if not new:
                return
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                data = "".join(f"{n}\n" for n in new).encode("utf-8")
                while data:
                    data = data[os.write(fd, data):]
            finally:
                os.close(fd)
            self.known |= set(new) | {self.path.name}


def add_to_manifest(folder: str | Path, files: Iterable[str | Path], command: str = "generate") -> None:
    """Record `files` (paths inside `folder`) as written by `command`, before they are written."""
    Manifest(folder, command).add(files)


def remove_owned(folder: str | Path, owned: Iterable[str]) -> None:
    """Delete the files `owned` (relative paths) that exist under `folder`, then every folder this emptied;
    nothing else (a file of the user's beside them stays, and so does its folder)."""
    root = Path(folder)
    emptied: set[Path] = set()
    for name in sorted(owned):
        path = root / name
        if path.is_file() or path.is_symlink():
            path.unlink()
            emptied.update(p for p in path.parents if root in p.parents)
    for path in sorted(emptied, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):  # not empty: it holds something that is not ours
            path.rmdir()


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


@contextlib.contextmanager
def hold_folder(folder: str | Path, flag: str = "--out") -> Iterator[Path]:
    """Hold `folder` (created when missing) for the body: an exclusive `flock` on the folder itself, which
    the operating system drops when the process ends, a SIGKILL included, so a crashed run never leaves it
    held. A second holder, in this process or another, gets a UsageError at once. When the body raises and
    the folder was created here and is still empty, it is removed again (so a refused run leaves nothing)."""
    import fcntl

    path = Path(folder)
    created = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            raise UsageError(f"{flag} {path} is in use: another octopus-audio run is writing into it (it "
                             f"holds the folder until it ends); wait for it, or choose another {flag}") from e
        try:
            yield path
        except BaseException:
            for p in created:  # innermost first
                with contextlib.suppress(OSError):
                    p.rmdir()
            raise
    finally:
        os.close(fd)  # drops the lock
