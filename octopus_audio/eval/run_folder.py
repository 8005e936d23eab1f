"""An eval run's output folder: its settings.json (the run's fingerprint and every clip's audio hash), which a
rerun must match to resume (a thread count that differs is only warned about); its manifest (outdir.Manifest:
every file the run wrote, so --overwrite removes only those); and each clip's files (WAVs, spectrograms,
embeddings, saved reference), removed with the clip's rows whenever the clip's audio differs from the audio
they were made from. A folder that is not an eval run's is never written into without --overwrite."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from octopus_audio.errors import UsageError
from octopus_audio.eval.embeddings import EMBEDDINGS_DIR
from octopus_audio.eval.rows import ROWS_DIR, read_rows
from octopus_audio.outdir import Manifest, hold_folder, refuse_foreign, remove_owned

SETTINGS_FILE = "settings.json"
WRITTEN_BY = "octopus-audio eval"  # settings.json's mark: the folder is an eval run's
CLIPS_KEY = "clip_sha256"  # settings.json: {clip id: sha256 of its decoded audio} its files were made from
EVAL = "eval"  # the manifest's command
CLIP_FOLDERS = ("wav", "spec")  # files named `<clip>__<what>.<ext>` (run_files.wav_name, spectrogram_name)

log = logging.getLogger(__name__)


def _settings_problem(text: str) -> tuple[dict | None, str | None]:
    """(settings, None) for an eval run's settings.json text; (None, why) for a damaged one (not a JSON
    object); (None, None) for a JSON object without eval's mark (someone else's file)."""
    try:
        settings = json.loads(text)
    except ValueError:
        return None, "it is empty" if not text.strip() else "it is not valid JSON"
    if not isinstance(settings, dict):
        return None, f"it holds {json.dumps(settings)[:20]} instead of a JSON object"
    return (settings, None) if settings.get("written_by") == WRITTEN_BY else (None, None)


def read_settings(out_dir: Path, owned: set[str] = frozenset()) -> dict | None:
    """The folder's settings.json when an eval run wrote it (it carries WRITTEN_BY), None when there is none
    or it is someone else's file; a damaged one (unreadable, not a JSON object, or listed in `owned`, the
    manifest, without eval's mark) is a UsageError naming it."""
    path = out_dir / SETTINGS_FILE
    if not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        settings, why = None, f"it cannot be read as text ({type(e).__name__})"
    else:
        settings, why = _settings_problem(text)
    if why is None and settings is None and SETTINGS_FILE in owned:
        why = "it lacks the mark eval writes"
    if why is not None:
        raise UsageError(f"{path} is damaged ({why}): eval marks its run folders with this file and cannot "
                         f"tell which run made {out_dir}; pass --overwrite to start afresh there (it removes "
                         f"only the files eval wrote), or choose a new --out")
    return settings


def differ(names: Sequence[str]) -> str:
    """`seed differs`, `seed and window differ`, `a, b and c differ`."""
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f"{listed} differ{'s' if len(names) == 1 else ''}"


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 24 else text[:20] + '..."'


def check_fingerprint(out_dir: Path, fingerprint: dict, old: dict) -> None:
    """UsageError naming what differs when the run in `out_dir` (settings `old`) has another fingerprint."""
    keys = (set(old) | set(fingerprint)) - {CLIPS_KEY}
    diff = sorted(k for k in keys if old.get(k) != fingerprint.get(k))
    if diff:
        first = diff[0]
        raise UsageError(f"{out_dir} holds a run made with other settings ({differ(diff)}; {first} was "
                         f"{_short(old.get(first))}, now {_short(fingerprint.get(first))}); rerun with the "
                         f"same model, conditioner and settings to resume it, pass --overwrite to start "
                         f"afresh, or choose a new --out")


def clip_of(name: str) -> str | None:
    """The clip a file of the run belongs to, from its path relative to the run folder: `wav/<clip>__....wav`,
    `spec/<clip>__....png` (no part after the clip id holds `__`, and a clip id never ends in `_`),
    `emb/<clip>__...__d<draw>.npz` (embeddings.embedding_path: a WAV's name, then the draw) or
    `refs/<clip>.npz`; None for any other file."""
    folder, _, file = name.partition("/")
    if folder == EMBEDDINGS_DIR and "/" not in file:
        folder, file = CLIP_FOLDERS[0], file.rpartition("__")[0]  # the name of its row's WAV, without .wav
    if folder in CLIP_FOLDERS and "/" not in file and "__" in file:
        return file.rpartition("__")[0]
    if folder == "refs" and "/" not in file and file.endswith(".npz"):
        return file[:-4]
    return None


def forget_clips(out_dir: Path, clips: Iterable[str], files: Manifest) -> None:
    """Drop every row of `clips` from the rank files and remove every file the run wrote for them (their WAVs,
    spectrograms, embeddings and saved references, as listed in the manifest): what a clip whose audio changed
    leaves behind. Rows first, so a run stopped half way never reuses a row whose files are gone."""
    clips = set(clips)
    for path in sorted((out_dir / ROWS_DIR).glob("*.jsonl")):
        rows = read_rows(path)
        kept = [r for r in rows if r.get("clip") not in clips]
        if len(kept) < len(rows):
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept), encoding="utf-8")
            os.replace(tmp, path)
    remove_owned(out_dir, {n for n in files.known if clip_of(n) in clips})


def claim_out_dir(out_dir: Path, fingerprint: dict, clip_hashes: dict[str, str | None],
                  overwrite: bool = False) -> None:
    """Rank 0, before any generation, holding the folder (outdir.hold_folder): make `out_dir` this run's
    folder, or refuse with a UsageError.

    New or empty: it becomes this run's. An eval run's folder (settings.json with WRITTEN_BY): resumed when
    its fingerprint matches, refused otherwise; `overwrite` first removes every file the manifest lists (the
    user's files beside them stay). A damaged settings.json is refused by name (unless `overwrite`). Any other
    folder holding files: refused unless `overwrite`. A clip whose audio differs from the audio its files were
    made from (settings.json's CLIPS_KEY) loses its rows and files (`forget_clips`): the run makes them again.
    settings.json then records the fingerprint and every clip's audio hash (clips of this run joined to those
    already there).
    """
    files = Manifest(out_dir, EVAL)
    try:
        old = read_settings(out_dir, files.known)
    except UsageError:
        if not overwrite:
            raise
        old = {}  # damaged: starting afresh replaces it
    if overwrite and (old is not None or files.known):
        remove_owned(out_dir, files.known | ({SETTINGS_FILE} if old is not None else set()))
        files, old = Manifest(out_dir, EVAL), None
    if old is None:
        refuse_foreign(out_dir, files.known, EVAL, overwrite)
    else:
        check_fingerprint(out_dir, fingerprint, old)
    made_from = (old or {}).get(CLIPS_KEY, {})
    stale = [c for c, h in clip_hashes.items() if c not in made_from or made_from[c] != h]
    if stale:
        forget_clips(out_dir, stale, files)
    clips = {**made_from, **clip_hashes}
    files.add([SETTINGS_FILE])
    tmp = out_dir / f".{SETTINGS_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({**fingerprint, CLIPS_KEY: clips}, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, out_dir / SETTINGS_FILE)


@contextlib.contextmanager
def claimed(out_dir: Path, fingerprint: dict, clip_hashes: dict[str, str | None],
            overwrite: bool = False) -> Iterator[None]:
    """Hold `out_dir` (outdir.hold_folder) and claim it (`claim_out_dir`) for the body; a refusal raises on
    entering, leaving no folder it created."""
    with hold_folder(out_dir):
        claim_out_dir(out_dir, fingerprint, clip_hashes, overwrite)
        yield


def precision_settings(device: str) -> dict[str, str]:
    """How each number is computed on `device`: generation at `aar_patch.generate`'s default precision for
    the device (bf16-autocast blocks on CUDA, fp32 elsewhere), teacher forcing always in fp32."""
    return {"generation_precision": "bf16-autocast" if device.startswith("cuda") else "fp32",
            "teacher_forced_precision": "fp32"}

def run_fingerprint(config, backend, conditioner, device: str) -> dict:
    """Everything a row's numbers depend on besides its clip and its job: the settings (EvalConfig.identity),
    the model (name and `identity`: checkpoint sha256), the conditioner (name and `fingerprint`: its weights'
    identity), the sample rate, the precision on `device` and the library version."""
    from octopus_audio import __version__

    return {"written_by": WRITTEN_BY, "version": __version__, **config.identity(), "model": backend.name,
            **backend.identity, "conditioner": conditioner.name,
            "conditioner_identity": conditioner.fingerprint,
            "sample_rate": backend.sample_rate, **precision_settings(device)}


def warn_thread_change(earlier_rows: Sequence[dict], rank: int) -> None:
    """Resuming with another intra-op thread count is allowed but changes float rounding (the tokenizer's
    decoder always; the codecs' attention sometimes, and a near-tie then flips a sampled token)."""
    import torch

    before = sorted({r["threads"] for r in earlier_rows if r.get("threads") is not None})
    now = torch.get_num_threads()
    if before and before != [now]:
        log.warning("rank %d resumes with %d intra-op threads; earlier rows ran with %s: float rounding "
                    "differs between thread counts, so rows may differ slightly from an uninterrupted run "
                    "(pass --threads %d to match)", rank, now, ", ".join(map(str, before)), before[0])
