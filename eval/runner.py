"""The batch runner: per clip, the uncompressed reference and every (codec, bits), one condition and seed.

Results are appended one JSON row per (clip, codec, bits) to `rows/rank<R>.jsonl` as they finish; a rerun
skips rows already done (`status: ok`) and retries failed ones; a clip that fails to load, condition or
generate is recorded with its error and the run goes on. Under `torchrun` the clips are sharded over the
processes (gloo on CPU, nccl on GPUs, one GPU each); rank 0 merges every rank's rows into `rows.jsonl` and
writes the report.

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

Each row holds the audio/latent metrics of the sampled output (eval/metrics.py) and two teacher-forced ones
(eval/fidelity.py): the model under the codec is fed the reference's own tokens, so its next-scale
distributions are compared with the reference's on the same inputs, free of sampling divergence. The
reference's tokens are saved with it (`refs/<clip>.npz`), so a resumed run computes them without generating.

Row identity: every row carries `clip_sha256` (the hash of its clip's decoded audio, eval/identity.py) and
`run` (a digest of the run's fingerprint: the model's and conditioner's weights by sha256, every EvalConfig
field that changes a number, precision, library version); a rerun reuses a row only when both match, so a
clip replaced under the same name gets new rows. `settings.json` holds the fingerprint and the clips' hashes;
a rerun into the same folder with another fingerprint is refused (UsageError, one sentence naming what
differs) unless `overwrite`, which starts afresh. A folder without our `settings.json` that holds any file is
refused too (unless `overwrite`): eval never writes beside files it did not write.

The model sits behind a small backend interface (`generate(cond, seed)`, `teacher_forced(cond, tokens)`,
`compressed(codec, bits)`) so tests can inject a fake; `AARBackend` adapts `octopus_audio.aar_patch.generate`,
`compressed_kv` and `eval.fidelity.teacher_forced_probs` to it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np

from octopus_audio.aar_patch.generation import SamplingConfig
from octopus_audio.errors import UsageError
from octopus_audio.eval.backends import Backend, Generated
from octopus_audio.eval.distributed import DistInfo, ProcessGroup
from octopus_audio.eval.identity import audio_sha256, clip_sha256, digest
from octopus_audio.eval.metrics import compute_metrics
from octopus_audio.eval.rows import (
    MERGED_ROWS,
    ROWS_DIR,
    RowWriter,
    all_rows,
    current_rows,
    merge_rows,
    row_key,
)
from octopus_audio.eval.run_folder import claim_out_dir, run_fingerprint, warn_thread_change
from octopus_audio.eval.sources import CLAP_RATE, CLIP_SECONDS, ClipRef, decode, prepare
from octopus_audio.wav import write_wav

log = logging.getLogger(__name__)

FLOOR = "reference (other seed)"  # the sampling-floor row's codec (never a real codec name)
KV_FLOOR = "reference (bf16 KV)"  # the bf16-KV floor row's codec (never a real codec name)
FLOOR_SEED_OFFSET = 1


def floor_seed(seed: int) -> int:
    """The seed of the sampling floor's second uncompressed generation: the run's seed + 1."""
    return seed + FLOOR_SEED_OFFSET


def compresses(codec: str) -> bool:
    """Whether a registered codec compresses (the native one gets a single row, without bits)."""
    from octopus_audio.codecs import codec_class

    return codec_class(codec).compressed


@dataclass(frozen=True)
class EvalConfig:
    """What is generated for each clip. `codecs` may include the native codec (one row, no bits: it checks the
    patch);
    `floor` adds the sampling-floor row (FLOOR: the uncompressed model at `floor_seed(seed)`); `bf16_floor`
    the bf16-KV row (KV_FLOOR: the uncompressed model, keys and values rounded to bf16 in the cache). The CLI
    turns both on unless `--no-floor`; `bf16_floor` is off here so a library caller opts in.

    Bit widths: with `k_bits` and `v_bits` None each codec runs at every width of `bits`, keys and values
    alike; when either is given, at every pair of a key width from `k_bits` (None: `bits`) and a value width
    from `v_bits` (None: `bits`)."""

    codecs: tuple[str, ...]
    bits: tuple[int, ...] = (2, 3, 4)
    seed: int = SamplingConfig.seed  # sampling: the released inference defaults, aar_patch's one definition
    cfg: float = SamplingConfig.cfg
    top_k: int = SamplingConfig.top_k
    top_p: float = SamplingConfig.top_p
    window: int = 1
    v_group: int = 16
    patch_seed: int = 0
    floor: bool = True
    bf16_floor: bool = False
    k_bits: tuple[int, ...] | None = None
    v_bits: tuple[int, ...] | None = None
    # Fields that choose which rows a run has, not what any row's numbers are: a rerun may change them and
    # keeps the rows it shares. Every other field is part of each row's identity (`identity()`), so a new
    # setting that changes a number is one new field above.
    JOB_FIELDS: ClassVar[tuple[str, ...]] = ("codecs", "bits", "floor", "bf16_floor", "k_bits", "v_bits")

    def __post_init__(self) -> None:
        from octopus_audio.codecs import CODECS

        known = tuple(CODECS)
        if not self.codecs:
            raise UsageError(f"no codecs to evaluate; accepted: all or a comma list of {', '.join(known)}")
        for c in self.codecs:
            if c not in known:
                raise UsageError(f"unknown codec {c!r}; accepted: all or a comma list of {', '.join(known)}")
        if len(set(self.codecs)) != len(self.codecs):
            raise UsageError(f"codec list {','.join(self.codecs)} names a codec twice")
        if any(compresses(c) for c in self.codecs):
            for flag, widths in (("--bits", self.bits), ("--k-bits", self.k_bits), ("--v-bits", self.v_bits)):
                if widths is None and flag != "--bits":
                    continue
                if not widths or any(isinstance(b, bool) or not isinstance(b, int) for b in widths):
                    raise UsageError(f"{flag} must be a comma list of integers such as 2,3,4, got {widths!r}")
                if len(set(widths)) != len(widths):
                    raise UsageError(f"{flag} {widths!r} names a width twice")
            from octopus_audio.codecs import bits_problem
            from octopus_audio.values import VALUE_BITS

            flag = "--bits" if self.k_bits is None else "--k-bits"
            for c in self.codecs:  # each codec's own supported bits, before any clip is generated
                for b in (self.k_bits or self.bits) if compresses(c) else ():
                    if bits_problem(c, b):
                        raise UsageError(bits_problem(c, b).replace("--bits", flag))
            flag = "--bits" if self.v_bits is None else "--v-bits"
            for b in self.v_bits or self.bits:
                if b not in VALUE_BITS:
                    raise UsageError(f"{flag} {b}: values take {VALUE_BITS[0]}..{VALUE_BITS[-1]} bits")
        from octopus_audio.aar_patch.generation import SEED_MAX, seed_problem

        problem = seed_problem(self.seed, "--seed")
        if problem:
            raise UsageError(problem)
        if self.floor and floor_seed(self.seed) > SEED_MAX:
            raise UsageError(f"--seed {self.seed} leaves no seed for the sampling-floor row, which samples "
                             f"with --seed + 1 (torch's generator takes 0 to {SEED_MAX}); pass --seed at "
                             f"most {SEED_MAX - FLOOR_SEED_OFFSET}, or --no-floor")
        for name in ("floor", "bf16_floor"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not math.isfinite(self.cfg):
            raise UsageError(f"--cfg must be a finite number, got {self.cfg!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise UsageError(f"--top-k must be an integer >= 0, got {self.top_k!r}")
        if not 0.0 <= self.top_p <= 1.0:
            raise UsageError(f"--top-p must be in [0, 1], got {self.top_p!r}")

    def bit_pairs(self) -> list[tuple[int, int]]:
        """(key bits, value bits) of every codec row, in report order (see the class docstring)."""
        if self.k_bits is None and self.v_bits is None:
            return [(b, b) for b in self.bits]
        return [(k, v) for k in (self.k_bits or self.bits) for v in (self.v_bits or self.bits)]

    def jobs(self) -> list[Job]:
        """Jobs in report order: the sampling floor and the bf16-KV floor first when on, then each codec at
        each bit pair; the floors and a codec that does not compress get bits None."""
        out = [Job(FLOOR)] if self.floor else []
        if self.bf16_floor:
            out.append(Job(KV_FLOOR))
        for c in self.codecs:
            out.extend([Job(c, k, v) for k, v in self.bit_pairs()] if compresses(c) else [Job(c)])
        return out

    def patch_configs(self) -> list:
        """The KV-cache patch of each compressed job (what `AARBackend.compressed` installs), in job order."""
        from octopus_audio.aar_patch.patch import PatchConfig

        return [PatchConfig(job.codec, job.bits, self.window, self.v_group, self.patch_seed, job.v_bits)
                for job in self.jobs() if job.bits is not None]

    def identity(self) -> dict:
        """The settings that must match for a rerun to reuse earlier rows: every field but JOB_FIELDS
        (codecs, bits and the floors may change: a rerun adds the missing rows)."""
        d = asdict(self)
        for name in self.JOB_FIELDS:
            del d[name]
        return d


class Job(NamedTuple):
    """One row per clip: a codec (or a floor row) at key bits `bits` and value bits `v_bits` (both None for
    the floors and `none`)."""

    codec: str
    bits: int | None = None
    v_bits: int | None = None


KV_NUMBERS = ("ratio", "k_bits", "v_bits")  # a row's "kv": the patch stats' totals the report prints


def kv_summary(stats: Any) -> dict[str, float | None]:
    """KV compression ratio and effective bits per K / V coordinate: the `total` of a patch handle's
    `stats().as_dict()` (aar_patch.CacheStats); a number that is NaN (nothing compressed) becomes None (shown
    as '-' in reports), never 0."""
    total = stats.as_dict()["total"]
    return {name: float(total[name]) if math.isfinite(total[name]) else None for name in KV_NUMBERS}


def wav_name(clip_id: str, codec: str, bits: int | None, v_bits: int | None = None) -> str:
    """`<clip>__00_input.wav`, `<clip>__00_reference.wav`, `<clip>__00_reference_other_seed.wav` (FLOOR),
    `<clip>__00_reference_bf16_kv.wav` (KV_FLOOR), `<clip>__<codec>_b<bits>.wav` (keys and values at one
    width) or `<clip>__<codec>_k<bits>v<v_bits>.wav`: sorting together."""
    if codec in ("input", "reference"):
        return f"{clip_id}__00_{codec}.wav"
    if codec == FLOOR:
        return f"{clip_id}__00_reference_other_seed.wav"
    if codec == KV_FLOOR:
        return f"{clip_id}__00_reference_bf16_kv.wav"
    if bits is None:
        return f"{clip_id}__{codec}.wav"
    return f"{clip_id}__{codec}_{bits_tag(bits, v_bits)}.wav"


def bits_tag(bits: int, v_bits: int | None) -> str:
    """`b2` when keys and values share the width (v_bits None or equal), else `k2v4`."""
    return f"b{bits}" if v_bits in (None, bits) else f"k{bits}v{v_bits}"


# per clip ------------------------------------------------------------------------------------------------

def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _as_generated(g: Generated) -> Generated:
    return Generated(np.asarray(g.audio, dtype=np.float32), np.asarray(g.fhat, dtype=np.float32),
                     [np.asarray(t, dtype=np.int64).reshape(-1) for t in g.tokens])


def _load_reference(path: Path, cond_D: np.ndarray, identity: str) -> Generated | None:
    """The saved reference if it was made for this clip's audio by this run's fingerprint (`identity`, the
    JSON of the row identity), with this condition, and holds its tokens; None (logged) if not."""
    with np.load(path) as saved:
        if "identity" not in saved or str(saved["identity"]) != identity:
            log.warning("%s was made for other audio or by another run; generating the reference again", path)
            return None
        if saved["cond"].shape != cond_D.shape or not np.array_equal(saved["cond"], cond_D):
            log.warning("%s was made with another condition; generating the reference again", path)
            return None
        if "tokens" not in saved:
            log.warning("%s has no tokens (an older run); generating the reference again", path)
            return None
        tokens = np.split(saved["tokens"], np.cumsum(saved["token_sizes"])[:-1])
        return Generated(saved["audio"], saved["fhat"], tokens)


def _reference(out_dir: Path, ref: ClipRef, cond_D: np.ndarray, backend: Backend, seed: int,
               row_id: dict) -> Generated:
    """The uncompressed output for this clip, from `refs/<clip>.npz` when an earlier run saved it for the
    same row identity (`row_id`: the clip's audio hash and the run's fingerprint digest).

    The npz holds audio, fhat, the condition, the tokens (all scales concatenated, with `token_sizes`) and the
    identity (JSON).
    """
    path = out_dir / "refs" / f"{ref.clip_id}.npz"
    wav = out_dir / "wav" / wav_name(ref.clip_id, "reference", None)
    identity = json.dumps(row_id, sort_keys=True)
    if path.is_file():
        saved = _load_reference(path, cond_D, identity)
        if saved is not None:
            if not wav.is_file():
                write_wav(wav, saved.audio, backend.sample_rate)
            return saved
    out = _as_generated(backend.generate(cond_D, seed))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
    np.savez(tmp, audio=out.audio, fhat=out.fhat, cond=cond_D, tokens=np.concatenate(out.tokens),
             token_sizes=np.array([t.size for t in out.tokens], dtype=np.int64), identity=np.array(identity))
    os.replace(tmp, path)
    write_wav(wav, out.audio, backend.sample_rate)
    return out


def run_clip(ref: ClipRef, todo: Sequence[Job], out_dir: Path, config: EvalConfig,
             backend: Backend, conditioner, emit: Callable[[dict], None], run_id: str = "") -> None:
    """Every job in `todo` for one clip; each finished or failed job is passed to `emit` as one row.

    Every row carries its identity: `run` (`run_id`, the digest of the run's fingerprint) and `clip_sha256`
    (the hash of the audio decoded here, None when it fails to load).

    An ok row records its wall time (`seconds`, generation + teacher forcing + metrics) and the intra-op
    thread count it ran with (`threads`); neither reaches the report. Every row records the sampling seed of
    its output (`seed`): the run's seed, or `floor_seed(seed)` for the FLOOR row. The KV_FLOOR row runs as a
    codec row does, under `backend.bf16_kv()` instead of a codec, and records no KV numbers.
    """
    import torch

    from octopus_audio.eval.fidelity import fidelity_row

    base = {"clip": ref.clip_id, "origin": ref.origin, "run": run_id, "clip_sha256": None}

    def seed_of(codec: str) -> int:
        return floor_seed(config.seed) if codec == FLOOR else config.seed

    def fail(jobs, stage: str, e: BaseException) -> None:
        log.warning("clip %s: %s failed: %s", ref.clip_id, stage, _error_text(e))
        for codec, bits, v_bits in jobs:
            emit({**base, "codec": codec, "bits": bits, "v_bits": v_bits, "seed": seed_of(codec),
                  "status": "error",
                  "stage": stage, "error": _error_text(e), "metrics": None, "kv": None, "seconds": None,
                  "threads": None})

    try:
        clip = decode(ref)
        base["clip_sha256"] = audio_sha256(clip.audio_T, clip.sample_rate)
        cond_audio = prepare(clip, CLAP_RATE)
        # the input as heard: the clip's own length (at most CLIP_SECONDS), not the padded 10 s
        own = min(CLIP_SECONDS, clip.audio_T.shape[0] / clip.sample_rate)
        input_audio = prepare(clip, backend.sample_rate, seconds=own)
    except Exception as e:
        return fail(todo, "load", e)
    (out_dir / "wav").mkdir(parents=True, exist_ok=True)
    write_wav(out_dir / "wav" / wav_name(ref.clip_id, "input", None), input_audio, backend.sample_rate)
    try:
        cond_D = np.asarray(conditioner.embed(cond_audio), dtype=np.float32)
    except UsageError:  # a conditioner that cannot load (--clap): the user's to fix, not this clip's failure
        raise
    except Exception as e:
        return fail(todo, "condition", e)
    try:
        reference = _reference(out_dir, ref, cond_D, backend, config.seed,
                               {"run": run_id, "clip_sha256": base["clip_sha256"]})
    except Exception as e:
        return fail(todo, "reference", e)
    if Job(FLOOR) in todo:
        _floor(ref, out_dir, config, backend, cond_D, reference, base, emit, fail)
    todo = [job for job in todo if job != Job(FLOOR)]
    if not todo:
        return None
    try:  # the unpatched model on the reference's own tokens: what every codec is compared with
        probs_ref = backend.teacher_forced(cond_D, reference.tokens)
    except Exception as e:
        return fail(todo, "fidelity", e)
    for job in todo:
        codec, bits, v_bits = job
        start = time.perf_counter()
        stage = "generate"
        try:
            context = backend.bf16_kv() if codec == KV_FLOOR else backend.compressed(codec, bits, v_bits)
            with context as handle:
                out = _as_generated(backend.generate(cond_D, config.seed))
                kv = None if codec == KV_FLOOR else kv_summary(handle.stats())
                stage = "fidelity"
                probs_hat = backend.teacher_forced(cond_D, reference.tokens)
        except Exception as e:
            fail([job], stage, e)
            continue
        try:
            metrics = {**compute_metrics(reference.audio, out.audio, reference.fhat, out.fhat,
                                         backend.sample_rate),
                       **fidelity_row(probs_ref, probs_hat)}
        except Exception as e:
            fail([job], "metrics", e)
            continue
        write_wav(out_dir / "wav" / wav_name(ref.clip_id, *job), out.audio, backend.sample_rate)
        emit({**base, "codec": codec, "bits": bits, "v_bits": v_bits, "seed": config.seed, "status": "ok",
              "stage": None,
              "error": None, "metrics": metrics, "kv": kv, "seconds": round(time.perf_counter() - start, 3),
              "threads": torch.get_num_threads()})


def _floor(ref: ClipRef, out_dir: Path, config: EvalConfig, backend: Backend, cond_D: np.ndarray,
           reference: Generated, base: dict, emit: Callable[[dict], None], fail: Callable) -> None:
    """The sampling-floor row: the uncompressed model (no patch) at `floor_seed(seed)`, its sampled-output
    metrics against the reference; no teacher-forced metrics and no KV numbers (see the module docstring)."""
    import torch

    start = time.perf_counter()
    seed = floor_seed(config.seed)
    try:
        other = _as_generated(backend.generate(cond_D, seed))
    except Exception as e:
        return fail([Job(FLOOR)], "generate", e)
    try:
        metrics = compute_metrics(reference.audio, other.audio, reference.fhat, other.fhat,
                                  backend.sample_rate)
    except Exception as e:
        return fail([Job(FLOOR)], "metrics", e)
    write_wav(out_dir / "wav" / wav_name(ref.clip_id, FLOOR, None), other.audio, backend.sample_rate)
    emit({**base, "codec": FLOOR, "bits": None, "v_bits": None, "seed": seed, "status": "ok", "stage": None,
          "error": None,
          "metrics": metrics, "kv": None, "seconds": round(time.perf_counter() - start, 3),
          "threads": torch.get_num_threads()})
    return None


def evaluate(refs: Sequence[ClipRef], out_dir: str | Path, config: EvalConfig,
             make_backend: Callable[[str], Backend], conditioner, meta: dict | None = None,
             device: str = "cpu", progress: bool = True, overwrite: bool = False) -> dict | None:
    """Run this process's shard of `refs`, then (rank 0) merge all rows and write the report.

    make_backend(device) builds the model backend once the device is known; `conditioner` has `name`,
    `fingerprint` and `embed(audio_48k_T)`. `meta` is added to the report (clip source, requested n, ...).
    `overwrite` starts afresh in a folder holding another run or other files (`claim_out_dir`). Returns the
    report's results on rank 0 and None on the other ranks.
    """
    from tqdm import tqdm

    out_dir = Path(out_dir)
    info = DistInfo.from_env()
    group = ProcessGroup(info, device)
    try:
        backend = make_backend(device)
        fingerprint = run_fingerprint(config, backend, conditioner, device)
        run_id = digest(fingerprint)
        clip_hashes = {r.clip_id: clip_sha256(r) for r in refs}
        problem = None
        if info.rank == 0:
            try:
                claim_out_dir(out_dir, fingerprint, clip_hashes, overwrite)
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
            for ref in mine:
                todo = [job for job in jobs if (ref.clip_id, *job) not in done]
                if todo:
                    run_clip(ref, todo, out_dir, config, backend, conditioner, emit, run_id)
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
    tmp = out_dir / f".{MERGED_ROWS}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")
    os.replace(tmp, out_dir / MERGED_ROWS)
    clips = [{"clip": r.clip_id, "origin": r.origin} for r in refs]
    if Job(FLOOR) in jobs:
        meta = {**meta, "floor_seed": floor_seed(settings["seed"])}
    return report.write_report(out_dir, rows, clips, jobs, {**settings, **meta})
