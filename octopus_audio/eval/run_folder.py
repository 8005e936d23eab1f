"""An eval run's output folder: its settings.json (the run's fingerprint and every clip's audio hash), which a
rerun must match to resume (a thread count that differs is only warned about); a folder that is not an eval
run's is never written into without --overwrite."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from octopus_audio.errors import UsageError
from octopus_audio.eval.embeddings import EMBEDDINGS_DIR
from octopus_audio.eval.rows import MERGED_ROWS, ROWS_DIR
from octopus_audio.outdir import refuse_foreign

SETTINGS_FILE = "settings.json"
WRITTEN_BY = "octopus-audio eval"  # settings.json's mark: the folder is an eval run's
CLIPS_KEY = "clip_sha256"  # settings.json: {clip id: sha256 of its decoded audio} of every clip run here
RUN_STATE = (SETTINGS_FILE, ROWS_DIR, MERGED_ROWS, "refs", "wav", EMBEDDINGS_DIR)  # what --overwrite deletes

log = logging.getLogger(__name__)


def read_settings(out_dir: Path) -> dict | None:
    """The folder's settings.json when an eval run wrote it (it carries WRITTEN_BY), else None."""
    path = out_dir / SETTINGS_FILE
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return settings if isinstance(settings, dict) and settings.get("written_by") == WRITTEN_BY else None


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 24 else text[:20] + '..."'


def check_fingerprint(out_dir: Path, fingerprint: dict, old: dict) -> None:
    """UsageError naming what differs when the run in `out_dir` (settings `old`) has another fingerprint."""
    keys = (set(old) | set(fingerprint)) - {CLIPS_KEY}
    diff = sorted(k for k in keys if old.get(k) != fingerprint.get(k))
    if diff:
        first = diff[0]
        raise UsageError(f"{out_dir} holds a run made with other settings ({', '.join(diff)} differ; {first} "
                         f"was {_short(old.get(first))}, now {_short(fingerprint.get(first))}); rerun with "
                         f"the same model, conditioner and settings to resume it, pass --overwrite to start "
                         f"afresh, or choose a new --out")


def claim_out_dir(out_dir: Path, fingerprint: dict, clip_hashes: dict[str, str | None],
                  overwrite: bool = False) -> None:
    """Rank 0, before any generation: make `out_dir` this run's folder, or refuse with a UsageError.

    New or empty: it becomes this run's. An eval run's folder (settings.json with WRITTEN_BY): resumed when
    its fingerprint matches, refused otherwise; `overwrite` deletes its RUN_STATE first (other files stay).
    Any other folder holding files: refused unless `overwrite`. settings.json then records the fingerprint
    and every clip's audio hash (clips added by this run joined to those already there).
    """
    old = read_settings(out_dir)
    if old is not None and overwrite:
        import shutil

        for name in RUN_STATE:
            target = out_dir / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
        old = None
    if old is None:
        refuse_foreign(out_dir, set(), "eval", overwrite)
    else:
        check_fingerprint(out_dir, fingerprint, old)
    clips = {**(old or {}).get(CLIPS_KEY, {}), **clip_hashes}
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{SETTINGS_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({**fingerprint, CLIPS_KEY: clips}, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, out_dir / SETTINGS_FILE)


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
