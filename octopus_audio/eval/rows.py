"""The eval's result rows on disk: one JSON line per (clip, codec, bits, sink and wide scales, draw) in
`rows/rank<R>.jsonl`, appended as each finishes (a torn last line from a killed writer is dropped), merged
over ranks and reruns."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from octopus_audio.eval.records import Job

log = logging.getLogger(__name__)

ROWS_DIR = "rows"
MERGED_ROWS = "rows.jsonl"


WIDE_FIELDS = ("wide_scales", "wide_bits")  # written only in the rows of jobs with wide scales (`job_fields`)


def row_key(row: dict) -> tuple:
    """(clip, codec, key bits, value bits, sink scales, wide scales, wide bits, draw): the row's clip, its
    `records.Job`, its draw. A row written before value bits were recorded had both equal; one written before
    sink scales were, none (0 for a codec row, None for the floors and `none`, as those rows carry it now);
    one without wide scales (`job_fields`), none likewise; one written before draws were, draw 0."""
    none = None if row["bits"] is None else 0
    job = (row["codec"], row["bits"], row.get("v_bits", row["bits"]), row.get("sink_scales", none),
           row.get("wide_scales", none), row.get("wide_bits"))
    return row["clip"], *job, row.get("draw", 0)


def job_of(row: dict) -> Job:
    """The row's job: its `row_key` without the clip and the draw."""
    return Job(*row_key(row)[1:-1])


def job_fields(job: Job) -> dict:
    """A row's fields of its job: all but WIDE_FIELDS for a job without wide scales, whose rows are written
    as before wide scales existed (`row_key` reads them back as none)."""
    fields = job._asdict()
    return fields if job.wide_scales else {k: v for k, v in fields.items() if k not in WIDE_FIELDS}


def current_rows(rows: Iterable[dict], run_id: str, clip_hashes: dict[str, str | None]) -> list[dict]:
    """The rows written by this run's fingerprint (`run`) for the clips' current audio (`clip_sha256`): the
    only rows a rerun may reuse or report. A clip that fails to load has hash None, as its error rows do."""
    return [r for r in rows if r.get("run") == run_id and r["clip"] in clip_hashes
            and r.get("clip_sha256") == clip_hashes[r["clip"]]]


def read_rows(path: Path) -> list[dict]:
    """The rows of one JSONL file; a torn last line (a killed writer) or any unparseable line is skipped."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                log.warning("%s line %d is not a complete JSON row (an interrupted write); ignoring it",
                            path, n)
    return rows


def all_rows(out_dir: Path) -> list[dict]:
    rows = []
    for path in sorted((out_dir / ROWS_DIR).glob("*.jsonl")):
        rows.extend(read_rows(path))
    return rows


def merge_rows(rows: Iterable[dict]) -> dict[tuple, dict]:
    """One row per key: an `ok` row wins over an error; otherwise the later row wins."""
    merged: dict[tuple, dict] = {}
    for row in rows:
        key = row_key(row)
        old = merged.get(key)
        if old is None or row["status"] == "ok" or old["status"] != "ok":
            merged[key] = row
    return merged


class RowWriter:
    """Appends rows to this rank's JSONL file, one write + flush + fsync per row; repairs a torn last line."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):
                keep = data.rfind(b"\n") + 1
                log.warning("%s ends in a torn row (an interrupted write); dropping its last %d bytes",
                            path, len(data) - keep)
                with open(path, "r+b") as f:
                    f.truncate(keep)
        self.path = path
        self._f = open(path, "a", encoding="utf-8")

    def write(self, row: dict) -> None:
        self._f.write(json.dumps(row, sort_keys=True) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()
