"""The batch runner: per clip, the uncompressed reference and every (codec, bits), one condition and seed.

Clips run in batches (`evaluate(batch_size=...)`, `run_batch`): each generation and teacher-forced pass covers
the batch, every clip sampling from its own random stream with the run's seed, so a row is what a batch of
one gives up to float rounding and a run resumes under any batch size (the batch size is no part of the run's
fingerprint). Results are appended one JSON row per (clip, codec, bits, sink scales) to `rows/rank<R>.jsonl`
as each job finishes for the batch; a rerun skips rows already done (`status: ok`) and retries failed ones; a
clip that fails to load, condition or generate is recorded with its error and the run goes on. Under
`torchrun` the clips are sharded over the processes (gloo on CPU, nccl on GPUs, one GPU each); rank 0 merges
every rank's rows into `rows.jsonl` and writes the report.

Unless turned off (`EvalConfig.floor`, `--no-floor`), each clip also gets one "sampling floor" row, codec
`reference (other seed)`: the uncompressed model generated once more with the seed `floor_seed(seed)` (the
run's seed + 1; the model seeds one generator once per generation, so the two draws are independent), and
its sampled-output metrics against the reference: how far two independent samples of the same uncompressed
model lie apart. (The codec rows share the reference's seed, so they agree with it until a flipped token and
usually lie nearer; a codec row as far as the floor has kept nothing of the reference's sample.) It has no
teacher-forced metrics (the unpatched model on the reference's tokens is the reference itself) and no KV
numbers (nothing is compressed).

`EvalConfig.bf16_floor` (on in the CLI, off with `--no-floor` too) adds a second floor row, codec
`reference (bf16 KV)` (KV_FLOOR): the uncompressed model at the reference's seed with every key and value
rounded to bfloat16 as it enters the KV cache (the patch's `kv_dtype`, codec none): the smallest
perturbation of the cache a 16-bit store makes, i.e. how near ANY perturbation of the cache can keep the
sampled outputs. It has every metric a codec row has, teacher-forced ones included (the model with the
rounded cache fed the reference's tokens), and no KV numbers (16-bit storage is what the ratios compare with).

Each row holds the audio/latent metrics of the sampled output (eval/metrics.py), the scale where its tokens
first part ways with the reference's (eval/parting.py), and two teacher-forced ones (eval/fidelity.py): the
model under the codec is fed the reference's own tokens, so its next-scale
distributions are compared with the reference's on the same inputs, free of sampling divergence. The
reference's tokens are saved with it (`refs/<clip>.npz`), so a resumed run computes them without generating.

Row identity: every row carries `clip_sha256` (the hash of its clip's decoded audio, eval/identity.py) and
`run` (a digest of the run's fingerprint: the model's and conditioner's weights by sha256, every EvalConfig
field that changes a number, precision, library version); a rerun reuses a row only when both match, so a
clip replaced under the same name gets new rows. `settings.json` holds the fingerprint and the clips' hashes;
a clip whose audio differs from the audio its files were made from loses its rows and files and runs again
(eval/run_folder.py), so every WAV, spectrogram and saved reference is its clip's. A rerun into the same
folder with another fingerprint is refused (UsageError, one sentence naming what differs) unless
`overwrite`, which removes every file the manifest lists and starts afresh. A folder without our
`settings.json` that holds any file is refused too (unless `overwrite`): eval never writes beside files it
did not write. Rank 0 holds the folder while the run works (outdir.hold_folder); a second run is refused.

The model sits behind a small backend interface (`generate(cond_BD, seeds)`, `teacher_forced(cond_BD,
tokens)`, `compressed(codec, bits)`, `bf16_kv()`; eval/backends.py) so tests can inject a fake;
`AARBackend` adapts `octopus_audio.aar_patch.generate`, `compressed_kv` and
`eval.fidelity.teacher_forced_probs` to it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from octopus_audio.errors import UsageError
from octopus_audio.eval.backends import Backend, Generated
from octopus_audio.eval.beside import Beside
from octopus_audio.eval.distributed import DistInfo, ProcessGroup
from octopus_audio.eval.identity import audio_sha256, clip_sha256, digest
from octopus_audio.eval.metrics import MetricReference
from octopus_audio.eval.parting import parting_metrics
from octopus_audio.eval.records import FLOOR, KV_FLOOR, EvalConfig, Job, floor_seed
from octopus_audio.eval.rows import (
    MERGED_ROWS,
    ROWS_DIR,
    RowWriter,
    all_rows,
    current_rows,
    merge_rows,
    row_key,
)
from octopus_audio.eval.run_files import as_generated, load_reference, save_reference, wav_files, wav_name
from octopus_audio.eval.run_folder import EVAL, claimed, run_fingerprint, warn_thread_change
from octopus_audio.eval.sources import CLAP_RATE, CLIP_SECONDS, ClipRef, decode, prepare
from octopus_audio.outdir import Manifest
from octopus_audio.wav import write_wav

log = logging.getLogger(__name__)

def batch_size_problem(batch_size) -> str | None:
    """The sentence for a batch size that is not an integer >= 1, else None."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        return f"--batch-size must be an integer >= 1 (clips generated together), got {batch_size!r}"
    return None


KV_NUMBERS = ("ratio", "k_bits", "v_bits")  # a row's "kv": the patch stats' totals the report prints


def kv_summary(stats: Any) -> dict[str, float | None]:
    """KV compression ratio and effective bits per K / V coordinate: the `total` of a patch handle's
    `stats().as_dict()` (aar_patch.CacheStats); a number that is NaN (nothing compressed) becomes None (shown
    as '-' in reports), never 0."""
    total = stats.as_dict()["total"]
    return {name: float(total[name]) if math.isfinite(total[name]) else None for name in KV_NUMBERS}


# per clip ------------------------------------------------------------------------------------------------

def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class Clip:
    """One clip of a batch while it runs: its ref, the jobs it still needs, its rows' common fields, and (once
    loaded) its condition, reference output and reference teacher-forced distributions."""

    def __init__(self, ref: ClipRef, todo: Sequence[Job], run_id: str) -> None:
        self.ref = ref
        self.todo = list(todo)
        self.base = {"clip": ref.clip_id, "origin": ref.origin, "run": run_id, "clip_sha256": None}
        self.cond_D: np.ndarray | None = None
        self.reference: Generated | None = None
        self.metric_ref: MetricReference | None = None  # the reference's spectra, computed once for its rows
        self.probs_ref: list | None = None


def _each(call: Callable[[list], list], items: list) -> list:
    """`call(items)` (one result per item, in order); if it raises, `call([item])` for each item alone, the
    exception standing in for the result of an item that fails alone: one bad clip fails only its own rows."""
    if not items:
        return []
    try:
        return call(items)
    except Exception as e:
        if len(items) == 1:
            return [e]
    out = []
    for item in items:
        try:
            out.extend(call([item]))
        except Exception as e:
            out.append(e)
    return out


def _stack(clips: Sequence[Clip]) -> np.ndarray:
    return np.stack([c.cond_D for c in clips])


def _references(out_dir: Path, clips: list[Clip], backend: Backend, seed: int, files: Manifest) -> list:
    """Each clip's uncompressed output (or the exception that stopped it): from `refs/<clip>.npz` when an
    earlier run saved it for the same row identity (the clip's audio hash and the run's fingerprint digest),
    else generated, all missing ones in one batch."""
    results: dict[int, Any] = {}
    missing = []
    for i, clip in enumerate(clips):
        path = out_dir / "refs" / f"{clip.ref.clip_id}.npz"
        wav = out_dir / "wav" / wav_name(clip.ref.clip_id, "reference", None)
        identity = json.dumps({"run": clip.base["run"], "clip_sha256": clip.base["clip_sha256"]},
                              sort_keys=True)
        saved = load_reference(path, clip.cond_D, identity) if path.is_file() else None
        if saved is None:
            missing.append((i, identity))
            continue
        if not wav.is_file():
            files.add(wav_files(wav.name))
            write_wav(wav, saved.audio, backend.sample_rate)
        results[i] = saved

    def generate(items: list) -> list:
        batch = [clips[i] for i, _ in items]
        return [as_generated(g) for g in backend.generate(_stack(batch), [seed] * len(batch))]

    for (i, identity), out in zip(missing, _each(generate, missing), strict=True):
        if not isinstance(out, Exception):
            try:
                save_reference(out_dir, clips[i].ref.clip_id, clips[i].cond_D, out, identity,
                               backend.sample_rate, files)
            except Exception as e:
                out = e
        results[i] = out
    return [results[i] for i in range(len(clips))]


def run_batch(batch: Sequence[tuple[ClipRef, Sequence[Job]]], out_dir: Path, config: EvalConfig,
              backend: Backend, conditioner, emit: Callable[[dict], None], run_id: str = "",
              finish_beside: bool = False) -> None:
    """Every job each clip of `batch` still needs (its `todo`); each finished or failed job is passed to
    `emit` as one row, each job's rows as soon as that job has run for the whole batch.

    Per batch: the reference (one generation of every clip without a saved one), the floor rows, the
    reference's teacher-forced pass, then each job: one generation of the batch under the codec (patched once
    for the batch) and one teacher-forced pass, then each clip's metrics and row. Every row of clip i samples
    from its own random stream (`backend.generate`'s per-row seeds, the same seed a batch of one uses), so
    batching changes no row but through float rounding. A clip that fails to load or condition gets its error
    rows and leaves the batch; a batched call that raises is retried clip by clip (`_each`), so a bad clip
    fails only its own rows.

    Every row carries its identity: `run` (`run_id`, the digest of the run's fingerprint) and `clip_sha256`
    (the hash of the audio decoded here, None when it fails to load). An ok row records its wall time
    (`seconds`: its share of its batch's generation and teacher forcing, plus its own metrics) and the
    intra-op thread count it ran with (`threads`); neither reaches the report. Every row records the sampling
    seed of its output (`seed`): the run's seed, or `floor_seed(seed)` for the FLOOR row. The KV_FLOOR row
    runs as a codec row does, under `backend.bf16_kv()` instead of a codec, and records no KV numbers.

    `finish_beside` (a GPU run): each job's rows are finished (host metrics, WAVs, emits) on a worker thread
    while the next job generates (`eval.beside.Beside`); the rows are the same, `emit` one call at a time.
    """
    import torch

    from octopus_audio.eval.fidelity import fidelity_rows

    emit_lock = threading.Lock()
    files = Manifest(out_dir, EVAL)  # every file is listed here before it is written

    def emit_row(row: dict) -> None:
        with emit_lock:
            emit(row)

    def seed_of(codec: str) -> int:
        return floor_seed(config.seed) if codec == FLOOR else config.seed

    def fail(clip: Clip, jobs, stage: str, e: BaseException) -> None:
        log.warning("clip %s: %s failed: %s", clip.ref.clip_id, stage, _error_text(e))
        for job in jobs:
            emit_row({**clip.base, **job._asdict(), "seed": seed_of(job.codec), "status": "error",
                      "stage": stage, "error": _error_text(e), "metrics": None, "kv": None, "seconds": None,
                      "threads": None})

    def sample(seed: int) -> Callable[[list[Clip]], list]:
        return lambda cs: backend.generate(_stack(cs), [seed] * len(cs))

    def forced(cs: list[Clip]) -> list:
        return backend.teacher_forced(_stack(cs), [c.reference.tokens for c in cs])

    def ok(clip: Clip, job: Job, out: Generated, metrics: dict, kv, seconds: float) -> None:
        name = wav_name(clip.ref.clip_id, *job)
        files.add(wav_files(name))
        write_wav(out_dir / "wav" / name, out.audio, backend.sample_rate)
        emit_row({**clip.base, **job._asdict(), "seed": seed_of(job.codec), "status": "ok", "stage": None,
                  "error": None, "metrics": metrics, "kv": kv, "seconds": round(seconds, 3),
                  "threads": torch.get_num_threads()})

    clips = []
    for ref, todo in batch:
        clip = Clip(ref, todo, run_id)
        if _prepare(clip, out_dir, backend, conditioner, fail, files):
            clips.append(clip)
    for clip, out in zip(clips, _references(out_dir, clips, backend, config.seed, files), strict=True):
        if isinstance(out, Exception):
            fail(clip, clip.todo, "reference", out)
        else:
            clip.reference = out
            clip.metric_ref = MetricReference(out.audio, out.fhat, backend.sample_rate)
    clips = [c for c in clips if c.reference is not None]

    def finish(these: list[Clip], job: Job, outs: list, forced_of: dict, kv, share: float) -> None:
        """Each clip's row of `job`: its sampled output's metrics (and teacher-forced numbers, when
        `forced_of` has them), its WAV, emitted; or its error row."""
        for clip, out in zip(these, outs, strict=True):
            if isinstance(out, Exception):
                fail(clip, [job], "generate", out)
                continue
            teacher_forced = forced_of.get(clip, {})
            if isinstance(teacher_forced, Exception):
                fail(clip, [job], "fidelity", teacher_forced)
                continue
            start = time.perf_counter()
            out = as_generated(out)
            try:  # the floor row's forced_of is empty: sampled-output metrics only (the module docstring)
                metrics = {**clip.metric_ref.compare(out.audio, out.fhat),
                           **parting_metrics(clip.reference.tokens, out.tokens), **teacher_forced}
            except Exception as e:
                fail(clip, [job], "metrics", e)
                continue
            ok(clip, job, out, metrics, kv, share + time.perf_counter() - start)

    with Beside(finish_beside) as beside:
        floor = [c for c in clips if Job(FLOOR) in c.todo]
        start = time.perf_counter()
        others = _each(sample(floor_seed(config.seed)), floor)
        beside.submit(finish, floor, Job(FLOOR), others, {}, None,
                      (time.perf_counter() - start) / max(len(floor), 1))

        clips = [c for c in clips if any(job != Job(FLOOR) for job in c.todo)]
        # the unpatched model on the reference's own tokens: what every codec is compared with
        probs = _each(forced, clips)
        for clip, p in zip(clips, probs, strict=True):
            if isinstance(p, Exception):
                fail(clip, [job for job in clip.todo if job != Job(FLOOR)], "fidelity", p)
            else:
                clip.probs_ref = p
        clips = [c for c in clips if c.probs_ref is not None]

        for job in dict.fromkeys(job for c in clips for job in c.todo if job != Job(FLOOR)):
            these = [c for c in clips if job in c.todo]
            start = time.perf_counter()
            try:
                context = (backend.bf16_kv() if job.codec == KV_FLOOR
                           else backend.compressed(job.codec, job.bits, job.v_bits, job.sink_scales))
                with context as handle:
                    outs = _each(sample(config.seed), these)
                    kv = None
                    if job.codec != KV_FLOOR and any(not isinstance(o, Exception) for o in outs):
                        kv = kv_summary(handle.stats())
                    done = [c for c, o in zip(these, outs, strict=True) if not isinstance(o, Exception)]
                    probs_hats = _each(forced, done)
            except Exception as e:  # the patch itself (or its stats) failed: every clip's row of this job
                for clip in these:
                    fail(clip, [job], "generate", e)
                continue
            # every clip's teacher-forced numbers at once, where the distributions are
            forced_of = dict(zip(done, probs_hats, strict=True))  # clip -> its distributions or their error
            compared = [c for c in done if not isinstance(forced_of[c], Exception)]
            try:
                rows = fidelity_rows([c.probs_ref for c in compared], [forced_of[c] for c in compared])
            except Exception as e:
                rows = [e] * len(compared)
            forced_of.update(zip(compared, rows, strict=True))  # clip -> its two numbers or their error
            beside.submit(finish, these, job, outs, forced_of, kv, (time.perf_counter() - start) / len(these))


def _prepare(clip: Clip, out_dir: Path, backend: Backend, conditioner, fail: Callable,
             files: Manifest) -> bool:
    """Load the clip, write its input WAV and embed its condition (`clip.cond_D`); False (after its error
    rows) when it fails to load or condition. A conditioner that cannot load at all (a UsageError: --clap)
    stops the run: the user's to fix, not this clip's failure."""
    try:
        audio = decode(clip.ref)
        clip.base["clip_sha256"] = audio_sha256(audio.audio_T, audio.sample_rate)
        cond_audio = prepare(audio, CLAP_RATE)
        # the input as heard: the clip's own length (at most CLIP_SECONDS), not the padded 10 s
        own = min(CLIP_SECONDS, audio.audio_T.shape[0] / audio.sample_rate)
        input_audio = prepare(audio, backend.sample_rate, seconds=own)
    except Exception as e:
        fail(clip, clip.todo, "load", e)
        return False
    name = wav_name(clip.ref.clip_id, "input", None)
    files.add(wav_files(name))
    (out_dir / "wav").mkdir(parents=True, exist_ok=True)
    write_wav(out_dir / "wav" / name, input_audio, backend.sample_rate)
    try:
        clip.cond_D = np.asarray(conditioner.embed(cond_audio), dtype=np.float32)
    except UsageError:
        raise
    except Exception as e:
        fail(clip, clip.todo, "condition", e)
        return False
    return True


def evaluate(refs: Sequence[ClipRef], out_dir: str | Path, config: EvalConfig,
             make_backend: Callable[[str], Backend], conditioner, meta: dict | None = None,
             device: str = "cpu", progress: bool = True, overwrite: bool = False,
             batch_size: int = 1) -> dict | None:
    """Run this process's shard of `refs`, then (rank 0) merge all rows and write the report.

    make_backend(device) builds the model backend once the device is known; `conditioner` has `name`,
    `fingerprint` and `embed(audio_48k_T)`. `meta` is added to the report (clip source, requested n, ...).
    `overwrite` starts afresh in a folder holding another run or other files (`claim_out_dir`).
    `batch_size`: clips generated together (`run_batch`); it schedules the work and changes no row but
    through float rounding, so it is no part of the run's fingerprint. Returns the report's results on rank 0
    and None on the other ranks.
    """
    from tqdm import tqdm

    problem = batch_size_problem(batch_size)
    if problem:
        raise UsageError(problem)

    out_dir = Path(out_dir)
    info = DistInfo.from_env()
    group = ProcessGroup(info, device)
    held = contextlib.ExitStack()  # rank 0 holds the folder until the run ends
    try:
        backend = make_backend(device)
        fingerprint = run_fingerprint(config, backend, conditioner, device)
        run_id = digest(fingerprint)
        clip_hashes = {r.clip_id: clip_sha256(r) for r in refs}
        problem = None
        if info.rank == 0:  # the ranks of one torchrun share the folder: rank 0 holds it for them all
            try:
                held.enter_context(claimed(out_dir, fingerprint, clip_hashes, overwrite))
            except UsageError as e:  # every rank raises it (start_together), none waits for rank 0
                problem = str(e)
        group.start_together(problem, fingerprint, [(r.clip_id, clip_hashes[r.clip_id]) for r in refs])
        jobs = config.jobs()
        earlier = [r for r in merge_rows(current_rows(all_rows(out_dir), run_id, clip_hashes)).values()
                   if r["status"] == "ok"]
        done = {row_key(r) for r in earlier}
        mine = list(refs)[info.rank::info.world]
        total = len(mine) * len(jobs)
        finished = sum((r.clip_id, *job) in done for r in mine for job in jobs)
        if finished < total:
            warn_thread_change(earlier, info.rank)
        Manifest(out_dir, EVAL).add([f"{ROWS_DIR}/rank{info.rank}.jsonl"])
        writer = RowWriter(out_dir / ROWS_DIR / f"rank{info.rank}.jsonl")
        bar = tqdm(total=total, initial=finished, desc=f"eval rank {info.rank}/{info.world}", unit="row",
                   position=info.rank, disable=not progress, dynamic_ncols=True)

        def emit(row: dict) -> None:
            writer.write(row)
            bar.update(1)

        import torch

        log.info("rank %d on %s: %d intra-op threads (--threads, or torch's default: OMP_NUM_THREADS=%s)",
                 info.rank, device, torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS", "unset"))
        start = time.perf_counter()
        try:
            work = [(ref, [job for job in jobs if (ref.clip_id, *job) not in done]) for ref in mine]
            work = [(ref, todo) for ref, todo in work if todo]
            if work:  # the sizes its generations run at (the last batch may be short): kernels compile ahead
                backend.expect_batches(sorted({min(batch_size, len(work) - i)
                                               for i in range(0, len(work), batch_size)}))
            for i in range(0, len(work), batch_size):
                run_batch(work[i:i + batch_size], out_dir, config, backend, conditioner, emit, run_id,
                          finish_beside=str(device).startswith("cuda"))
        finally:
            bar.close()
            writer.close()
        log.info("rank %d: %d clips, %d rows run, %.1f s with %d intra-op threads", info.rank, len(mine),
                 total - finished, time.perf_counter() - start, torch.get_num_threads())
        group.barrier()
        settings = {k: v for k, v in fingerprint.items() if k != "written_by"}
        results = (_finish(out_dir, refs, jobs, settings, meta or {}, run_id, clip_hashes)
                   if info.rank == 0 else None)
        group.barrier()
        return results
    finally:
        held.close()
        group.close()


def _finish(out_dir: Path, refs: Sequence[ClipRef], jobs, settings: dict, meta: dict, run_id: str,
            clip_hashes: dict[str, str | None]) -> dict:
    """Rank 0: merge every rank's rows of this run's identity (only this run's clips and jobs; each row's
    origin is where its clip is now), write rows.jsonl and the report."""
    from octopus_audio.eval import report

    merged = merge_rows(current_rows(all_rows(out_dir), run_id, clip_hashes))
    wanted = [(r.clip_id, *job) for r in refs for job in jobs]
    missing = [k for k in wanted if k not in merged]
    if missing:
        raise RuntimeError(f"{len(missing)} rows are missing after every rank finished (first: {missing[0]})")
    origin = {r.clip_id: r.origin for r in refs}
    rows = [{**merged[k], "origin": origin[k[0]]} for k in wanted]
    Manifest(out_dir, EVAL).add([MERGED_ROWS, *report.report_files()])
    tmp = out_dir / f".{MERGED_ROWS}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")
    os.replace(tmp, out_dir / MERGED_ROWS)
    clips = [{"clip": r.clip_id, "origin": r.origin} for r in refs]
    if Job(FLOOR) in jobs:
        meta = {**meta, "floor_seed": floor_seed(settings["seed"])}
    return report.write_report(out_dir, rows, clips, jobs, {**settings, **meta})
