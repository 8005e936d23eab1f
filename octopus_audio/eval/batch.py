"""One batch of the eval: every row its clips still need, each job generated once for all their draws, each
row finished (metrics, embeddings, WAVs) and emitted as soon as its job has run (`run_batch`)."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from octopus_audio.errors import UsageError
from octopus_audio.eval.backends import Backend, Generated
from octopus_audio.eval.beside import Beside
from octopus_audio.eval.embeddings import (
    adherence,
    conditioner_vector,
    embedding_path,
    save_embeddings,
    spectral_frames,
)
from octopus_audio.eval.identity import audio_sha256
from octopus_audio.eval.metrics import MetricReference
from octopus_audio.eval.parting import parting_metrics
from octopus_audio.eval.records import FLOOR, KV_FLOOR, REFERENCE, Job, Unit
from octopus_audio.eval.rows import job_fields
from octopus_audio.eval.run_files import as_generated, load_reference, save_reference, wav_files, wav_name
from octopus_audio.eval.run_folder import EVAL
from octopus_audio.eval.sources import CLAP_RATE, CLIP_SECONDS, ClipRef, decode, prepare
from octopus_audio.outdir import Manifest
from octopus_audio.wav import write_wav

if TYPE_CHECKING:
    from octopus_audio.eval.records import EvalConfig

log = logging.getLogger(__name__)

# worker threads that finish a GPU run's rows (metrics, embeddings, WAVs) beside the next generation: numpy's
# FFTs and ufuncs release the GIL for most of an output's host work (compare eval/spectrograms.py's count),
# and one thread would lag a job of 128 outputs (about 15 ms of host work each). Not measured on a GPU.
BESIDE_THREADS = 4

KV_NUMBERS = ("ratio", "k_bits", "v_bits")  # a row's "kv": the patch stats' totals the report prints


def kv_summary(stats: Any) -> dict[str, float | None]:
    """KV compression ratio and effective bits per K / V coordinate: the `total` of a patch handle's
    `stats().as_dict()` (aar_patch.CacheStats); a number that is NaN (nothing compressed) becomes None (shown
    as '-' in reports), never 0."""
    total = stats.as_dict()["total"]
    return {name: float(total[name]) if math.isfinite(total[name]) else None for name in KV_NUMBERS}


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _teacher_forced(job: Job) -> bool:
    """Whether a job's draw-0 row has teacher-forced numbers: every job but the reference's own rows and the
    sampling floor (the unpatched model fed the reference's tokens is the reference itself)."""
    return job.codec not in (REFERENCE, FLOOR)


class Clip:
    """One clip of a batch while it runs: its ref, the rows (units) it still needs, its rows' common fields,
    and (once loaded) its condition, draw-0 reference output and reference teacher-forced distributions."""

    def __init__(self, ref: ClipRef, todo: Sequence[Unit], run_id: str) -> None:
        self.ref = ref
        self.todo = list(todo)
        self.base = {"clip": ref.clip_id, "origin": ref.origin, "run": run_id, "clip_sha256": None}
        self.cond_D: np.ndarray | None = None
        self.reference: Generated | None = None
        self.metric_ref: MetricReference | None = None  # the reference's spectra, computed once for its rows
        self.probs_ref: list | None = None

    @property
    def identity(self) -> str:
        """The JSON of the row identity (the run's fingerprint digest, the clip's audio hash) that its saved
        reference and its outputs' embedding files carry."""
        return json.dumps({"run": self.base["run"], "clip_sha256": self.base["clip_sha256"]}, sort_keys=True)


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
        wav = out_dir / "wav" / wav_name(clip.ref.clip_id, REFERENCE, None)
        identity = clip.identity
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


def run_batch(batch: Sequence[tuple[ClipRef, Sequence[Unit]]], out_dir: Path, config: EvalConfig,
              backend: Backend, conditioner, emit: Callable[[dict], None], run_id: str = "",
              finish_beside: bool = False) -> None:
    """Every row (`Unit`: a job at a draw) each clip of `batch` still needs (its `todo`); each finished or
    failed row is passed to `emit`, each job's rows as soon as that job has run for the whole batch.

    Per batch: the draw-0 reference (one generation of every clip without a saved one), then each job of
    `config.row_jobs()` in order: one generation of all its draws of all clips (patched once for the batch;
    the reference's draw 0 is the one just made), the reference's teacher-forced pass before the first job
    that needs it, each codec's own for its draw-0 rows, the latent embeddings of every output
    (`backend.latents`), then each row: at draw 0 (but the reference's own) the sampled output's metrics
    against the reference (its first parting scale among them, eval/parting.py), its teacher-forced numbers
    and its WAV; at every draw its embeddings (`emb/...npz`, eval/embeddings.py) and its condition adherence.
    Every file is listed in the run's manifest (outdir.Manifest) before it is written. Every row samples from
    its own random stream (`backend.generate`'s per-row seeds: `config.sample_seed`, the seed a batch of one
    uses), so batching changes no row but through float rounding. A clip that fails to load or condition gets
    its error rows and leaves the batch; a batched call that raises is retried row by row (`_each`), so a bad
    clip fails only its own rows.

    Every row carries its identity: `run` (`run_id`, the digest of the run's fingerprint) and `clip_sha256`
    (the hash of the audio decoded here, None when it fails to load), its `draw` and its `seed`. An ok row
    records its wall time (`seconds`: its share of its job's generation and teacher forcing, plus its own
    metrics and embeddings) and the intra-op thread count it ran with (`threads`); neither reaches the
    report. The KV_FLOOR row runs as a codec row does, under `backend.bf16_kv()` instead of a codec, and
    records no KV numbers.

    `finish_beside` (a GPU run): each job's rows are finished (host metrics, embeddings, WAVs, emits) on
    BESIDE_THREADS worker threads while the next job generates (`eval.beside.Beside`); the rows are the
    same, `emit` one call at a time.
    """
    import torch

    from octopus_audio.eval.fidelity import fidelity_rows

    emit_lock = threading.Lock()
    files = Manifest(out_dir, EVAL)  # every file is listed here before it is written

    def emit_row(row: dict) -> None:
        with emit_lock:
            emit(row)

    def fail(clip: Clip, units: Sequence[Unit], stage: str, e: BaseException) -> None:
        log.warning("clip %s: %s failed: %s", clip.ref.clip_id, stage, _error_text(e))
        for job, draw in units:
            emit_row({**clip.base, **job_fields(job), "draw": draw,
                      "seed": config.sample_seed(job.codec, draw), "status": "error", "stage": stage,
                      "error": _error_text(e), "metrics": None, "kv": None, "adherence": None,
                      "embeddings": None, "seconds": None, "threads": None})

    def sample(job: Job) -> Callable[[list], list]:
        """Generation of (clip, draw) pairs, each with its own seed."""
        return lambda pairs: backend.generate(np.stack([c.cond_D for c, _ in pairs]),
                                              [config.sample_seed(job.codec, d) for _, d in pairs])

    def forced(cs: list[Clip]) -> list:
        return backend.teacher_forced(_stack(cs), [c.reference.tokens for c in cs])

    def latents(outs: list[Generated]) -> list:
        return backend.latents(np.stack([o.audio for o in outs]))

    clips = []
    for ref, todo in batch:
        clip = Clip(ref, todo, run_id)
        if _prepare(clip, out_dir, backend, conditioner, fail, files):
            clips.append(clip)
    first = [c for c in clips if any(u.draw == 0 for u in c.todo)]  # what draw 0's rows compare with
    for clip, out in zip(first, _references(out_dir, first, backend, config.seed, files), strict=True):
        if isinstance(out, Exception):
            fail(clip, clip.todo, "reference", out)
            clip.todo = []
        else:
            clip.reference = out
            clip.metric_ref = MetricReference(out.audio, out.fhat, backend.sample_rate)
    clips = [c for c in clips if c.todo]

    def finish(units: list[tuple[Clip, int]], job: Job, outs: list, embedded: list, forced_of: dict, kv,
               share: float) -> None:
        """Each (clip, draw)'s row of `job`: its embeddings and adherence, at draw 0 (not the reference's
        own) also its sampled output's metrics, teacher-forced numbers (when `forced_of` has them) and WAV;
        emitted; or its error row."""
        for (clip, draw), out, latent in zip(units, outs, embedded, strict=True):
            unit = Unit(job, draw)
            if isinstance(out, Exception):
                fail(clip, [unit], "generate", out)
                continue
            if isinstance(latent, Exception):
                fail(clip, [unit], "embed", latent)
                continue
            paired = draw == 0 and job.codec != REFERENCE
            teacher_forced = forced_of.get(clip, {}) if paired else {}
            if isinstance(teacher_forced, Exception):
                fail(clip, [unit], "fidelity", teacher_forced)
                continue
            start = time.perf_counter()
            out = as_generated(out)
            metrics = None
            try:  # the floor row's forced_of is empty: sampled-output metrics only (the module docstring)
                if paired:
                    metrics = {**clip.metric_ref.compare(out.audio, out.fhat),
                               **parting_metrics(clip.reference.tokens, out.tokens), **teacher_forced}
            except Exception as e:
                fail(clip, [unit], "metrics", e)
                continue
            try:
                cond = conditioner_vector(out.audio, conditioner)
                frames = spectral_frames(out.audio, backend.sample_rate)
                adhere = adherence(cond, clip.cond_D)
            except Exception as e:
                fail(clip, [unit], "embed", e)
                continue
            emb = embedding_path(clip.ref.clip_id, job, draw)
            files.add([emb])
            save_embeddings(out_dir, emb, clip.identity, latent, frames, cond)
            if paired:
                name = wav_name(clip.ref.clip_id, *job)
                files.add(wav_files(name))
                write_wav(out_dir / "wav" / name, out.audio, backend.sample_rate)
            emit_row({**clip.base, **job_fields(job), "draw": draw,
                      "seed": config.sample_seed(job.codec, draw), "status": "ok", "stage": None,
                      "error": None, "metrics": metrics, "kv": kv, "adherence": adhere, "embeddings": emb,
                      "seconds": round(share + time.perf_counter() - start, 3),
                      "threads": torch.get_num_threads()})

    with Beside(finish_beside, BESIDE_THREADS) as beside:
        for job in config.row_jobs():
            units = [(c, u.draw) for c in clips for u in c.todo if u.job == job]
            if not units:
                continue
            if _teacher_forced(job):
                _reference_probs(clips, forced, fail)
                # a clip whose reference distributions failed has its draw-0 rows failed already
                units = [(c, d) for c, d in units if d != 0 or c.probs_ref is not None]
            start = time.perf_counter()
            made = {(c, 0): c.reference for c, d in units if job.codec == REFERENCE and d == 0}
            pending = [u for u in units if u not in made]
            kv = None
            try:
                if job.codec in (REFERENCE, FLOOR):
                    context = contextlib.nullcontext()
                elif job.codec == KV_FLOOR:
                    context = backend.bf16_kv()
                else:
                    context = backend.compressed(*job)
                with context as handle:
                    made.update(zip(pending, _each(sample(job), pending), strict=True))
                    ok = [u for u in pending if not isinstance(made[u], Exception)]
                    if job.codec not in (REFERENCE, FLOOR, KV_FLOOR) and ok:
                        kv = kv_summary(handle.stats())
                    done = [c for c, d in ok if d == 0 and _teacher_forced(job)]
                    probs_hats = _each(forced, done)
            except Exception as e:  # the patch itself (or its stats) failed: every row of this job
                for clip, draw in units:
                    fail(clip, [Unit(job, draw)], "generate", e)
                continue
            outs = [made[u] for u in units]
            ok = [as_generated(o) for o in outs if not isinstance(o, Exception)]
            found = iter(_each(latents, ok))
            embedded = [o if isinstance(o, Exception) else next(found) for o in outs]
            # every clip's teacher-forced numbers at once, where the distributions are
            forced_of = dict(zip(done, probs_hats, strict=True))  # clip -> its distributions or their error
            compared = [c for c in done if not isinstance(forced_of[c], Exception)]
            try:
                rows = fidelity_rows([c.probs_ref for c in compared], [forced_of[c] for c in compared])
            except Exception as e:
                rows = [e] * len(compared)
            forced_of.update(zip(compared, rows, strict=True))  # clip -> its two numbers or their error
            beside.submit(finish, units, job, outs, embedded, forced_of, kv,
                          (time.perf_counter() - start) / len(units))


def _reference_probs(clips: list[Clip], forced: Callable, fail: Callable) -> None:
    """The unpatched model on each clip's reference tokens (`clip.probs_ref`), once, for the clips whose
    draw-0 rows need them: what every codec's teacher-forced numbers are compared with. A clip whose pass
    fails gets those rows failed and dropped from its todo."""
    need = [c for c in clips if c.probs_ref is None and any(u.draw == 0 and _teacher_forced(u.job)
                                                            for u in c.todo)]
    for clip, p in zip(need, _each(forced, need), strict=True):
        if isinstance(p, Exception):
            lost = [u for u in clip.todo if u.draw == 0 and _teacher_forced(u.job)]
            fail(clip, lost, "fidelity", p)
            clip.todo = [u for u in clip.todo if u not in lost]
        else:
            clip.probs_ref = p


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
