"""The eval runner: per clip, the uncompressed reference and every (codec, bits, sink and wide scales), one
condition, each sampled `EvalConfig.draws` times (draw d with seed + d).

Clips run in batches (`evaluate(batch_size=...)`, eval/batch.py's `run_batch`): each generation and
teacher-forced pass covers the batch, every output sampling from its own random stream with its draw's seed,
so a row is what a batch of one gives up to float rounding and a run resumes under any batch size (the batch
size is no part of the run's fingerprint). Results are appended one JSON row per (clip, codec, bits, sink and
wide scales, draw) to `rows/rank<R>.jsonl` as each job finishes for the batch; a rerun skips rows already done
(`status: ok`) and retries failed ones; a clip that fails to load, condition or generate is recorded with its
error and the run goes on. Under `torchrun` the clips are sharded over the processes (gloo on CPU, nccl on
GPUs, one GPU each); rank 0 merges every rank's rows into `rows.jsonl` and writes the report.

The reference's own draws are rows too (codec REFERENCE: their adherence and embeddings, no paired metrics):
the sets the distribution metrics compare (eval/dist_report.py). Draw 0 of every other row has the paired
metrics below, teacher forcing and a WAV; every draw has its embeddings (`emb/`) and adherence.

Unless turned off (`EvalConfig.floor`, `--no-floor`), each clip also gets "sampling floor" rows, codec
`reference (other seed)`: the uncompressed model generated once more per draw with the seed
`floor_seed(seed, draws, draw)` (after the draws' seeds; seed + 1 with one draw: the model seeds one
generator once per generation, so the two samples are independent), and
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

Each paired row holds the audio/latent metrics of the sampled output (eval/metrics.py), the scale where its
tokens first part ways with the reference's (eval/parting.py), and two teacher-forced ones (eval/fidelity.py):
the model under the codec is fed the reference's own tokens, so its next-scale distributions are compared with
the reference's on the same inputs, free of sampling divergence. The reference's tokens are saved with it
(`refs/<clip>.npz`), so a resumed run computes them without generating.

Row identity: every row carries `clip_sha256` (the hash of its clip's decoded audio, eval/identity.py) and
`run` (a digest of the run's fingerprint: the model's and conditioner's weights by sha256, every EvalConfig
field that changes a number, precision, library version); a rerun reuses a row only when both match, so a
clip replaced under the same name gets new rows. `settings.json` holds the fingerprint and the clips' hashes;
a clip whose audio differs from the audio its files were made from loses its rows and files (WAVs,
spectrograms, embeddings, saved reference) and runs again (eval/run_folder.py), so every file is its clip's.
A rerun into the same folder with another fingerprint is refused (UsageError, one sentence naming what
differs) unless `overwrite`, which removes every file the manifest lists and starts afresh. A folder without
our `settings.json` that holds any file is refused too (unless `overwrite`): eval never writes beside files it
did not write. Rank 0 holds the folder while the run works (outdir.hold_folder); a second run is refused.

The model sits behind a small backend interface (`generate(cond_BD, seeds)`, `teacher_forced(cond_BD,
tokens)`, `compressed(*job)`, `bf16_kv()`, `latents(audio_BT)`; eval/backends.py) so tests can inject a
fake; `AARBackend` adapts `octopus_audio.aar_patch.generate`, `patch_aar` and
`eval.fidelity.teacher_forced_probs` to it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from octopus_audio.errors import UsageError
from octopus_audio.eval.backends import Backend
from octopus_audio.eval.batch import run_batch
from octopus_audio.eval.distributed import DistInfo, ProcessGroup
from octopus_audio.eval.embeddings import embeddings_of
from octopus_audio.eval.identity import clip_sha256, digest
from octopus_audio.eval.records import FLOOR, EvalConfig
from octopus_audio.eval.rows import (
    MERGED_ROWS,
    ROWS_DIR,
    RowWriter,
    all_rows,
    current_rows,
    merge_rows,
    row_key,
)
from octopus_audio.eval.run_folder import EVAL, claimed, run_fingerprint, warn_thread_change
from octopus_audio.eval.sources import ClipRef
from octopus_audio.outdir import Manifest

log = logging.getLogger(__name__)


def clips_per_batch(batch_size: int, draws: int) -> int:
    """Clips a batch takes with all their draws: batch_size generations at most, at least one clip."""
    return max(1, batch_size // draws)


def batch_size_problem(batch_size) -> str | None:
    """The sentence for a batch size that is not an integer >= 1, else None."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        return f"--batch-size must be an integer >= 1 (generations run together), got {batch_size!r}"
    return None


def evaluate(refs: Sequence[ClipRef], out_dir: str | Path, config: EvalConfig,
             make_backend: Callable[[str], Backend], conditioner, meta: dict | None = None,
             device: str = "cpu", progress: bool = True, overwrite: bool = False,
             batch_size: int = 1) -> dict | None:
    """Run this process's shard of `refs`, then (rank 0) merge all rows and write the report.

    make_backend(device) builds the model backend once the device is known; `conditioner` has `name`,
    `fingerprint`, `clap` (a CLAP model: its FAD too) and `embed(audio_48k_T)`. `meta` is added to the report
    (clip source, requested n, ...). `overwrite` starts afresh in a folder holding another run or other files
    (`claim_out_dir`).
    `batch_size`: generations run together (`run_batch`): a batch takes `clips_per_batch(batch_size, draws)`
    clips with all their draws; it schedules the work and changes no row but through float rounding, so it
    is no part of the run's fingerprint. Returns the report's results on rank 0 and None on the other ranks.
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
        units = config.units()
        earlier = [r for r in merge_rows(current_rows(all_rows(out_dir), run_id, clip_hashes)).values()
                   if r["status"] == "ok"]
        done = {row_key(r) for r in earlier}
        mine = list(refs)[info.rank::info.world]
        total = len(mine) * len(units)
        finished = sum((r.clip_id, *job, draw) in done for r in mine for job, draw in units)
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
            work = [(ref, [u for u in units if (ref.clip_id, *u.job, u.draw) not in done]) for ref in mine]
            work = [(ref, todo) for ref, todo in work if todo]
            step = clips_per_batch(batch_size, config.draws)
            batches = [work[i:i + step] for i in range(0, len(work), step)]
            sizes = {sum(u.job == job for _, todo in b for u in todo)
                     for b in batches for job in config.jobs()}
            if work:  # the sizes its generations run at (a last batch may be short): kernels compile ahead
                backend.expect_batches(sorted(sizes - {0}))
            for b in batches:
                run_batch(b, out_dir, config, backend, conditioner, emit, run_id,
                          finish_beside=str(device).startswith("cuda"))
        finally:
            bar.close()
            writer.close()
        log.info("rank %d: %d clips, %d rows run, %.1f s with %d intra-op threads", info.rank, len(mine),
                 total - finished, time.perf_counter() - start, torch.get_num_threads())
        group.barrier()
        settings = {k: v for k, v in fingerprint.items() if k != "written_by"}
        meta = {**(meta or {}), "fad_embeddings": list(embeddings_of(conditioner.clap))}
        results = (_finish(out_dir, refs, config, settings, meta, run_id, clip_hashes)
                   if info.rank == 0 else None)
        group.barrier()
        return results
    finally:
        held.close()
        group.close()


def _finish(out_dir: Path, refs: Sequence[ClipRef], config: EvalConfig, settings: dict, meta: dict,
            run_id: str, clip_hashes: dict[str, str | None]) -> dict:
    """Rank 0: merge every rank's rows of this run's identity (only this run's clips, jobs and draws; each
    row's origin is where its clip is now), write rows.jsonl and the report."""
    from octopus_audio.eval import report

    merged = merge_rows(current_rows(all_rows(out_dir), run_id, clip_hashes))
    wanted = [(r.clip_id, *job, draw) for r in refs for job, draw in config.units()]
    missing = [k for k in wanted if k not in merged]
    if missing:
        raise RuntimeError(f"{len(missing)} rows are missing after every rank finished (first: {missing[0]})")
    origin = {r.clip_id: r.origin for r in refs}
    rows = [{**merged[k], "origin": origin[k[0]]} for k in wanted]
    Manifest(out_dir, EVAL).add([MERGED_ROWS, *report.report_files(meta["fad_embeddings"])])
    tmp = out_dir / f".{MERGED_ROWS}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")
    os.replace(tmp, out_dir / MERGED_ROWS)
    clips = [{"clip": r.clip_id, "origin": r.origin} for r in refs]
    if config.floor:
        meta = {**meta, "floor_seed": config.sample_seed(FLOOR, 0)}
    return report.write_report(out_dir, rows, clips, config.jobs(), {**settings, **meta})
