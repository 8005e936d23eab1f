"""`octopus-audio bench`: GPU timings of the fused kernels (attention from the compressed cache, encode).

Rows: attention through the public `CompressedKVCache.attend` (the launch a user's cache makes; with `--tune`,
the launcher with each class's fastest configuration as an extra row) at AAR shapes (2B rows, 16 heads, d=64,
75 queries against 380 compressed + 75 native keys)
and at long context (1 query, 8k/32k/128k keys, d=64 x 16 heads and d=128 x 32 heads), every kernel codec
at each bit width, against torch SDPA in bf16 over the same number of native keys and against the library's
decode-then-SDPA; encode throughput at 64k tokens x 16 heads. Each row: median time (CUDA events through
triton.testing.do_bench, L2 flushed between runs), GB/s on the bytes the kernel must move (compressed store +
window + q + out), that rate as a fraction of the measured device-to-device copy bandwidth (bytes read plus
written), and the speedup over SDPA: torch's default pick, and (CUDA-graph times) the fastest of the SDPA
backends that take the shape (flash, cuDNN, efficient, math: `sdpa_backends`), the strongest bf16 baseline
torch offers there. Encode-k rows run `encode_keys` at its defaults and are marked [gluon]
where its Gluon kernel ran (OCTOPUS_AUDIO_KERNELS=triton times the Triton kernels instead). Needs
only torch, triton, numpy (the device machine has no more).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import math
import os
import subprocess
import time
from pathlib import Path

from octopus_audio.apps.timing import backend_graph_ms, bench_ms, copy_bandwidth, graphed, sdpa_backends
from octopus_audio.errors import UsageError

log = logging.getLogger(__name__)

AAR_BATCHES = (1, 64, 512)
LONG_KEYS = (8192, 32768, 131072)
LONG_DIMS = ((64, 16), (128, 32))  # (head dim, heads)
ENCODE_TOKENS, ENCODE_HEADS, ENCODE_DIM = 65536, 16, 64
_DEVICE = "cuda"  # the benchmark runs on the current CUDA device


@dataclasses.dataclass(frozen=True)
class AttnShape:
    """One attention problem: `rows` batch rows x `heads` KV heads (no GQA here), `tq` queries per head
    against `length` compressed + `window` native keys."""

    label: str
    rows: int
    heads: int
    tq: int
    length: int
    window: int
    d: int


def attention_shapes(suite: str) -> list[AttnShape]:
    aar = [AttnShape(f"AAR B={b} (2B={2 * b} rows x 16 h, 75 q x 455 k, d=64)", 2 * b, 16, 75, 380, 75, 64)
           for b in AAR_BATCHES]
    long = [AttnShape(f"1 q x {n // 1024}k keys, {h} h, d={d}", 1, h, 1, n - 1, 1, d)
            for d, h in LONG_DIMS for n in LONG_KEYS]
    return aar + long


@dataclasses.dataclass(frozen=True)
class Job:
    """One benchmark row to produce: kind in {attention, encode-k, encode-v}; config: an AttnConfig or
    EncodeConfig (None: the launchers' heuristics)."""

    kind: str
    codec: str
    bits: int
    shape: AttnShape | None = None
    config: object = None

    @property
    def launch(self) -> str:
        """What the row times: the public `cache.attend`, or the launcher with a tuned configuration."""
        return "cache.attend" if self.config is None else f"tuned {self.config!r}"


def shape_class(shape: AttnShape) -> str:
    """The tuning class of an attention shape: one launch configuration serves each class."""
    return "aar" if shape.tq > 1 else f"long-d{shape.d}"


def tuning_jobs() -> dict[str, list[Job]]:
    """Candidate launch configurations per class, timed on the default codec at b=2 (the targets name it)."""
    from octopus_audio.codecs import DEFAULT_CODEC
    from octopus_audio.kernels import AttnConfig, EncodeConfig

    aar = AttnShape("tune AAR B=64", 128, 16, 75, 380, 75, 64)
    aar_cfgs = [AttnConfig(128, 64, 4, 1), AttnConfig(128, 64, 8, 1), AttnConfig(128, 128, 8, 1),
                AttnConfig(128, 128, 4, 1), AttnConfig(64, 64, 4, 1)]
    # one query row: the score-table path (block_n = keys per score step, block_v per value step)
    long_cfgs = [AttnConfig(block_n=bn, block_v=bv, num_warps=nw, programs_per_sm=pps)
                 for bn, bv, nw, pps in ((128, 64, 4, 8), (256, 64, 8, 4), (128, 32, 4, 8), (256, 64, 8, 8),
                                         (256, 32, 8, 4), (128, 64, 4, 4), (128, 64, 4, 6), (256, 64, 8, 3))]
    jobs = {"aar": [Job("attention", DEFAULT_CODEC, 2, aar, config=c) for c in aar_cfgs]}
    for d, h in LONG_DIMS:
        shape = AttnShape(f"tune 1 q x 128k, d={d}", 1, h, 1, LONG_KEYS[-1] - 1, 1, d)
        jobs[f"long-d{d}"] = [Job("attention", DEFAULT_CODEC, 2, shape, config=c) for c in long_cfgs]
    enc_cfgs = [EncodeConfig(32, 4, 1), EncodeConfig(16, 4, 1), EncodeConfig(64, 4, 1),
                EncodeConfig(64, 8, 1), EncodeConfig(128, 8, 1),
                EncodeConfig(32, 2, 1)]  # octopus: a third more resident warps (kernels.md, Encode)
    jobs["encode-k"] = [Job("encode-k", DEFAULT_CODEC, 2, config=c) for c in enc_cfgs]
    jobs["encode-v"] = [Job("encode-v", "values", 2, config=c) for c in enc_cfgs]
    return jobs


def plan(suite: str, codecs: list[str], bits: list[int], chosen: dict[str, object]) -> list[Job]:
    """The rows of a suite: attention through the public `CompressedKVCache.attend` (the launch users get),
    plus, where `--tune` chose a configuration for the shape's class, the launcher with it as an extra row;
    encode with the class's chosen configuration (None: the launchers' heuristics)."""
    jobs = []
    for shape in attention_shapes(suite):
        cfg = chosen.get(shape_class(shape))
        for name in codecs:
            for b in bits:
                jobs.append(Job("attention", name, b, shape))
                if cfg is not None:
                    jobs.append(Job("attention", name, b, shape, config=cfg))
    for name in codecs:
        for b in bits:
            jobs.append(Job("encode-k", name, b, config=chosen.get("encode-k")))
    for b in bits:
        jobs.append(Job("encode-v", "values", b, config=chosen.get("encode-v")))
    return jobs


# ---------------------------------------------------------------- inputs


def _random_store(shape: AttnShape, codec, bits: int, gen, device):
    """A compressed store of random packed codes (every bit pattern is a valid code; the decode cost does not
    depend on the values), gamma ~ 1, and value scales of a unit-range group."""
    import torch

    from octopus_audio.codecs.base import KeyState
    from octopus_audio.packing import num_words
    from octopus_audio.values import ValueState

    b, h, n, d = shape.rows, shape.heads, shape.length, shape.d

    def words(w):
        return torch.randint(-2**31, 2**31 - 1, (b, h, n, w), generator=gen, device=device, dtype=torch.int32)

    def uniform(lo, hi, *tail, dtype):
        return (torch.rand(b, h, n, *tail, generator=gen, device=device) * (hi - lo) + lo).to(dtype)

    ks = KeyState(dtype=torch.bfloat16, codes=words(codec.code_words),
                  gamma=uniform(0.5, 1.5, dtype=torch.bfloat16),
                  signs=words(num_words(d, 1)) if codec.qjl else None,
                  gamma_r=uniform(0.05, 0.3, dtype=torch.bfloat16) if codec.qjl else None)
    vs = ValueState(dtype=torch.bfloat16, codes=words(num_words(d, bits)),
                    scale=uniform(0.5, 1.5, d // 16, dtype=torch.float16) / (2**bits - 1),
                    minimum=uniform(-1.0, -0.5, d // 16, dtype=torch.float16))
    return ks, vs


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _attention_inputs(job: Job, device) -> dict:
    """What a row times. Default launch (`job.config` None): a `CompressedKVCache` on `device` holding
    `length` random N(0, 1) bf16 keys and values appended as one unit (encoded by the cache's own kernels) and
    the window as the next unit, timed through the public `cache.attend`. A tuning configuration: a store of
    random packed codes given to the kernels' `attention` launcher with that configuration."""
    import torch

    from octopus_audio import CompressedKVCache
    from octopus_audio.cache import kernel_codec
    from octopus_audio.codecs import get_codec
    from octopus_audio.kernels import PackedKeys, PackedValues
    from octopus_audio.values import ValueQuantizer

    s = job.shape
    gen = torch.Generator(device=device).manual_seed(1234)

    def normal(n):
        return torch.randn(s.rows, s.heads, n, s.d, generator=gen, device=device, dtype=torch.bfloat16)

    q = normal(s.tq)
    k_win, v_win = normal(s.window), normal(s.window)
    if job.config is None:
        cache = CompressedKVCache(job.codec, job.bits, s.d, window=1, capacity=s.length)
        cache.append(normal(s.length), normal(s.length))
        cache.append(k_win, v_win)
        ks, vs = cache.store.valid()
        return {"codec": cache.codec, "quant": cache.value_quantizer, "ks": ks, "vs": vs, "q": q,
                "k_win": k_win, "v_win": v_win, "cache": cache}
    codec = get_codec(job.codec, job.bits, s.d)
    ks, vs = _random_store(s, codec, job.bits, gen, device)
    return {"codec": codec, "quant": ValueQuantizer(job.bits, s.d), "ks": ks, "vs": vs, "q": q,
            "k_win": k_win, "v_win": v_win, "keys": PackedKeys(ks.codes, ks.gamma, ks.signs, ks.gamma_r),
            "values": PackedValues(vs.codes, vs.scale, vs.minimum, job.bits),
            "kernel": kernel_codec(codec, s.heads, device)}


def _ours_attention(job: Job, inputs: dict):
    """The timed call: `cache.attend(q, 1/sqrt(d))` (default launch) or the launcher with the row's config."""
    from octopus_audio.kernels import attention

    q, scale = inputs["q"], 1.0 / math.sqrt(job.shape.d)
    if "cache" in inputs:
        cache = inputs["cache"]
        return lambda: cache.attend(q, scale)
    keys, values, k_win, v_win = inputs["keys"], inputs["values"], inputs["k_win"], inputs["v_win"]
    return lambda: attention(q, keys, values, job.shape.length, k_win, v_win, inputs["kernel"], scale=scale,
                             config=job.config)


def _encode_inputs(job: Job, device):
    import torch

    gen = torch.Generator(device=device).manual_seed(99)
    x = torch.randn(1, ENCODE_HEADS, ENCODE_TOKENS, ENCODE_DIM, generator=gen, device=device)
    return x.to(torch.bfloat16)


def _ours_encode(job: Job, x):
    from octopus_audio.cache import kernel_codec
    from octopus_audio.codecs import get_codec
    from octopus_audio.kernels import encode_keys, encode_values

    if job.kind == "encode-v":
        return lambda: encode_values(x, job.bits, check_range=False, config=job.config)
    kc = kernel_codec(get_codec(job.codec, job.bits, ENCODE_DIM), ENCODE_HEADS, x.device)
    gluon = _gluon_requested()
    return lambda: encode_keys(x, kc, config=job.config, gluon=gluon)


def _gluon_requested() -> bool:
    """Whether the Gluon kernels may run (OCTOPUS_AUDIO_KERNELS, as the cache reads it)."""
    from octopus_audio.cache.backend import requested

    return requested() != "triton"


def _key_encode_kernel(job: Job, x) -> str:
    """Which kernel `_ours_encode` runs for an encode-k row: gluon or triton."""
    from octopus_audio.cache import kernel_codec
    from octopus_audio.codecs import get_codec
    from octopus_audio.kernels.select import encode_gluon_limit

    kc = kernel_codec(get_codec(job.codec, job.bits, ENCODE_DIM), ENCODE_HEADS, x.device)
    ok = job.config is None and _gluon_requested() and encode_gluon_limit(x, kc) is None
    return "gluon" if ok else "triton"


def warm(job: Job) -> str:
    """Compile the job's kernels (one run); used by the parallel warm-up workers. Returns an error or ''."""
    import torch

    try:
        device = torch.device(_DEVICE)
        if job.kind == "attention":
            _ours_attention(job, _attention_inputs(job, device))()
        else:
            _ours_encode(job, _encode_inputs(job, device))()
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # reported by the main run, which repeats the job
        return f"{type(e).__name__}: {e}"


# ---------------------------------------------------------------- timing


def _sdpa_inputs(shape: AttnShape, device):
    import torch

    n = shape.length + shape.window
    gen = torch.Generator(device=device).manual_seed(7)
    bf16 = torch.bfloat16
    k = torch.randn(shape.rows, shape.heads, n, shape.d, generator=gen, device=device, dtype=bf16)
    q = torch.randn(shape.rows, shape.heads, shape.tq, shape.d, generator=gen, device=device, dtype=bf16)
    return q, k, torch.randn_like(k)


def _attention_row(job: Job, rep_ms: float, sdpa_ms: dict) -> dict:
    import torch
    import torch.nn.functional as F

    device = torch.device(_DEVICE)
    s = job.shape
    row = {"kind": "attention", "shape": s.label, "codec": job.codec, "bits": job.bits,
           "launch": job.launch}
    if s not in sdpa_ms:
        q0, k0, v0 = _sdpa_inputs(s, device)
        sdpa_ms[s] = bench_ms(lambda: F.scaled_dot_product_attention(q0, k0, v0), rep_ms)
        sdpa_ms[s, "graph"] = bench_ms(graphed(lambda: F.scaled_dot_product_attention(q0, k0, v0)), rep_ms)
        sdpa_ms[s, "backends"] = backend_graph_ms(sdpa_backends(q0, k0, v0), rep_ms)
        del q0, k0, v0
    inputs = _attention_inputs(job, device)
    codec, quant, ks, vs, q = (inputs[k] for k in ("codec", "quant", "ks", "vs", "q"))
    k_win, v_win = inputs["k_win"], inputs["v_win"]
    ours = _ours_attention(job, inputs)
    out = ours()
    ms = bench_ms(ours, rep_ms)
    try:
        row["graph_ms"] = bench_ms(graphed(ours), rep_ms)
        row["sdpa_graph_ms"] = sdpa_ms[s, "graph"]
        row["speedup_vs_sdpa_graph"] = row["sdpa_graph_ms"] / row["graph_ms"]
        row["sdpa_backends_graph_ms"] = backends = sdpa_ms[s, "backends"]
        if backends:
            best = min(backends, key=backends.get)
            row["sdpa_best_backend"], row["sdpa_best_graph_ms"] = best, backends[best]
            row["speedup_vs_best_graph"] = row["sdpa_best_graph_ms"] / row["graph_ms"]
    except RuntimeError as e:
        row["note"] = f"CUDA-graph capture failed: {e}"

    def decode_sdpa():
        k_all = torch.cat([codec.decode(ks, torch.bfloat16), k_win], 2)
        v_all = torch.cat([quant.decode(vs, torch.bfloat16), v_win], 2)
        return F.scaled_dot_product_attention(q, k_all, v_all, scale=1.0 / math.sqrt(s.d))

    try:
        ref = decode_sdpa().float()
        row["rel_err_vs_decode_sdpa"] = ((out.float() - ref).norm() / ref.norm()).item()
        del ref
        row["decode_sdpa_ms"] = bench_ms(decode_sdpa, max(rep_ms / 4, 10))
        row["speedup_vs_decode_sdpa"] = row["decode_sdpa_ms"] / ms
    except torch.OutOfMemoryError:
        row["note"] = "decode-then-SDPA ran out of GPU memory"
    moved = (_nbytes(*ks.tensors().values()) + _nbytes(*vs.tensors().values())
             + _nbytes(k_win, v_win, q) + _nbytes(out))
    sdpa_bytes = 2 * s.rows * s.heads * (s.length + s.window) * s.d * 2 + 2 * _nbytes(q)
    row.update({"ms": ms, "sdpa_bf16_ms": sdpa_ms[s], "bytes": moved, "sdpa_bytes": sdpa_bytes,
                "gbps": moved / (ms * 1e-3) / 1e9, "speedup_vs_sdpa": sdpa_ms[s] / ms,
                "sdpa_gbps": sdpa_bytes / (sdpa_ms[s] * 1e-3) / 1e9})
    return row


def _encode_row(job: Job, x, rep_ms: float) -> dict:

    from octopus_audio.codecs import get_codec
    from octopus_audio.values import ValueQuantizer

    row = {"kind": job.kind, "shape": f"{ENCODE_TOKENS // 1024}k tokens x {ENCODE_HEADS} h, d={ENCODE_DIM}",
           "codec": job.codec, "bits": job.bits}
    ours = _ours_encode(job, x)
    out = ours()
    ms = bench_ms(ours, rep_ms)
    if job.kind == "encode-v":
        quant = ValueQuantizer(job.bits, ENCODE_DIM)
        ref_fn = lambda: quant.encode_unchecked(x)  # noqa: E731
        fields = ("codes", "scale", "minimum")
    else:
        codec = get_codec(job.codec, job.bits, ENCODE_DIM)
        ref_fn = lambda: codec.encode_unchecked(x)  # noqa: E731
        fields = ("codes", "gamma", "signs", "gamma_r")
        row["kernel"] = _key_encode_kernel(job, x)
    got = {f: getattr(out, f) for f in fields if getattr(out, f) is not None}
    moved = _nbytes(x, *got.values())
    row.update({"ms": ms, "bytes": moved, "gbps": moved / (ms * 1e-3) / 1e9})
    ref = ref_fn()
    row["mismatch"] = {f: (t != getattr(ref, f)).float().mean().item() for f, t in got.items()}
    row["matches_reference"] = not any(row["mismatch"].values())
    del ref
    row["reference_ms"] = bench_ms(ref_fn, max(rep_ms / 4, 10))
    row["speedup_vs_reference"] = row["reference_ms"] / ms
    return row


def tune(candidates: dict[str, list[Job]], rep_ms: float) -> tuple[dict[str, object], list[dict]]:
    """Time each class's candidates (ours only) and keep the fastest configuration per class."""
    import torch

    chosen, report = {}, []
    for cls, jobs in candidates.items():
        best = None
        for job in jobs:
            try:
                if job.kind == "attention":
                    fn = _ours_attention(job, _attention_inputs(job, torch.device(_DEVICE)))
                else:
                    fn = _ours_encode(job, _encode_inputs(job, torch.device(_DEVICE)))
                fn()
                ms = bench_ms(fn, rep_ms)
            except Exception as e:
                report.append({"class": cls, "config": repr(job.config), "error": f"{type(e).__name__}: {e}"})
                continue
            report.append({"class": cls, "config": repr(job.config), "ms": ms})
            if best is None or ms < best[0]:
                best = (ms, job.config)
            torch.cuda.empty_cache()
        if best is not None:
            chosen[cls] = best[1]
    return chosen, report


def run_rows(jobs: list[Job], rep_ms: float, copy_gbps: float, partial: Path | None = None) -> list[dict]:
    """Every job's row (a failing job is recorded with its error and the rest still run); the rows so far are
    rewritten to `partial` after each one, the failing row included. An error that leaves the GPU unusable
    (a sticky CUDA error) stops the run with a RuntimeError naming that row."""
    import torch

    rows: list[dict] = []
    sdpa_ms: dict[AttnShape, float] = {}
    x = None
    for job in jobs:
        try:
            if job.kind == "attention":
                row = _attention_row(job, rep_ms, sdpa_ms)
            else:
                x = _encode_inputs(job, torch.device(_DEVICE)) if x is None else x
                row = _encode_row(job, x, rep_ms)
            row["frac_copy_bw"] = row["gbps"] / copy_gbps
        except Exception as e:
            row = {"kind": job.kind, "shape": job.shape.label if job.shape else "", "codec": job.codec,
                   "bits": job.bits, "launch": job.launch,
                   "error": f"{type(e).__name__}: {e}"}
        rows.append(row)
        log.info("%s", row)
        if partial is not None:
            partial.write_text(json.dumps(rows, indent=1, default=str))
        try:
            torch.cuda.empty_cache()
        except RuntimeError as e:
            where = {k: row.get(k) for k in ("kind", "shape", "codec", "bits", "launch", "error")}
            raise RuntimeError(f"the GPU is unusable after the row {where}: {e}") from e
    return rows


# ---------------------------------------------------------------- report


def _fmt(v, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def table(rows: list[dict]) -> str:
    head = ("| kind | shape | codec | b | ours ms | SDPA bf16 ms | x vs SDPA | ours ms (graph) "
            "| SDPA ms (graph) | x vs SDPA (graph) | fastest SDPA backend ms (graph) | x vs fastest (graph) "
            "| decode+SDPA ms | x vs decode+SDPA | MB moved | GB/s | of copy BW | rel err / exact |")
    lines = [head, "|" + " --- |" * 18]
    for r in rows:
        codec = r["codec"]
        if "error" in r:
            lines.append(f"| {r['kind']} | {r['shape']} | {codec} | {r['bits']} | error: {r['error'][:120]} |"
                         + " |" * 13)
            continue
        if r["kind"] == "attention":
            check = _fmt(r.get("rel_err_vs_decode_sdpa"), ".1e")
            tuned = r.get("launch", "cache.attend") != "cache.attend"
            best_sdpa = (f"{r['sdpa_best_backend']} {r['sdpa_best_graph_ms']:.4f}" if "sdpa_best_backend" in r
                         else "n/a")
            shape = r["shape"] + (f" [{r['launch']}]" if tuned else "")
            lines.append(
                f"| attention | {shape} | {codec} | {r['bits']} | {r['ms']:.4f} "
                f"| {r['sdpa_bf16_ms']:.4f} | {r['speedup_vs_sdpa']:.2f} "
                f"| {_fmt(r.get('graph_ms'), '.4f')} | {_fmt(r.get('sdpa_graph_ms'), '.4f')} "
                f"| {_fmt(r.get('speedup_vs_sdpa_graph'), '.2f')} "
                f"| {best_sdpa} | {_fmt(r.get('speedup_vs_best_graph'), '.2f')} "
                f"| {_fmt(r.get('decode_sdpa_ms'), '.3f')} "
                f"| {_fmt(r.get('speedup_vs_decode_sdpa'), '.1f')} | {r['bytes'] / 1e6:.1f} "
                f"| {r['gbps']:.0f} | {r['frac_copy_bw']:.0%} | {check} |")
        else:
            diff = ", ".join(f"{f} {m:.0e}" for f, m in r.get("mismatch", {}).items() if m)
            check = "exact" if r.get("matches_reference") else f"differ: {diff}"
            shape = r["shape"] + (f" [{r['kernel']}]" if r.get("kernel") == "gluon" else "")
            lines.append(
                f"| {r['kind']} | {shape} | {codec} | {r['bits']} | {r['ms']:.4f} | | | | | | | "
                f"| {r['reference_ms']:.3f} (library) | {r['speedup_vs_reference']:.1f} "
                f"| {r['bytes'] / 1e6:.1f} | {r['gbps']:.0f} | {r['frac_copy_bw']:.0%} | {check} |")
    return "\n".join(lines)


def _commit() -> str:
    """The checkout's commit (OCTOPUS_AUDIO_COMMIT when the tree travelled without its .git)."""
    if os.environ.get("OCTOPUS_AUDIO_COMMIT"):
        return os.environ["OCTOPUS_AUDIO_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _warm_all(jobs: list[Job], workers: int) -> dict[Job, str]:
    """Compile every job's kernels in `workers` processes first (Triton's compiler is single-threaded and
    holds the GIL; its disk cache then serves the timed run)."""
    import multiprocessing

    if workers <= 1:
        return {}
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        return dict(zip(jobs, pool.map(warm, jobs, chunksize=1), strict=True))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="out/bench", help="folder for bench.md and bench.json")
    parser.add_argument("--suite", choices=("quick", "full"), default="full",
                        help="quick: the first of --bits only; full: every codec at every --bits")
    parser.add_argument("--codecs", default="all",
                        help="comma list of codecs with a kernel decode kind, or all (default all)")
    parser.add_argument("--bits", default="2,3,4", help="comma list of bit widths (default 2,3,4)")
    parser.add_argument("--rep-ms", type=float, default=60.0, help="timed milliseconds per measurement")
    parser.add_argument("--workers", type=int, default=-1,
                        help="processes compiling the kernels in parallel first (-1: one a core, at most 16)")
    parser.add_argument("--tune", action="store_true",
                        help="first time a few launch configurations per shape class and use the fastest")
    parser.add_argument("--no-attention", action="store_true", help="skip the attention rows")
    parser.add_argument("--no-encode", action="store_true", help="skip the encode rows")


def run(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        raise UsageError("the benchmark needs a CUDA GPU, and torch sees none on this machine.")
    from octopus_audio.codecs import kernel_codecs

    kernel = kernel_codecs()
    codecs = list(kernel) if args.codecs == "all" else [c.strip() for c in args.codecs.split(",")]
    bad = [c for c in codecs if c not in kernel]
    if bad:
        raise UsageError(f"unknown codec(s) {', '.join(bad)}; allowed: {', '.join(kernel)} or all")
    try:
        bits = [int(b) for b in args.bits.split(",")]
    except ValueError:
        raise UsageError(f"--bits must be a comma list of integers, got {args.bits!r}") from None
    if args.suite == "quick":
        bits = bits[:1]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    workers = min(16, os.cpu_count() or 1) if args.workers < 0 else args.workers
    chosen, tuning = {}, []
    if args.tune:
        candidates = tuning_jobs()
        _warm_all([j for js in candidates.values() for j in js], workers)
        chosen, tuning = tune(candidates, args.rep_ms)
    jobs = plan(args.suite, codecs, bits, chosen)
    if args.no_attention:
        jobs = [j for j in jobs if j.kind != "attention"]
    if args.no_encode:
        jobs = [j for j in jobs if j.kind == "attention"]
    warm_errors = {j: e for j, e in _warm_all(jobs, workers).items() if e}
    t_warm = time.time() - t0
    copy_gbps = copy_bandwidth(args.rep_ms)
    (out_dir / "tuning.json").write_text(json.dumps({"chosen": {k: repr(v) for k, v in chosen.items()},
                                                     "tuning": tuning}, indent=1))
    rows = run_rows(jobs, args.rep_ms, copy_gbps, partial=out_dir / "rows_partial.json")
    import triton

    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": _commit(), "command": "octopus-audio bench " + " ".join(
                f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                if k in ("suite", "codecs", "bits", "rep_ms")) + (" --tune" if args.tune else ""),
            "copy_gbps": copy_gbps, "warm_up_s": round(t_warm, 1), "total_s": round(time.time() - t0, 1),
            "chosen_configs": {k: repr(v) for k, v in chosen.items()}, "tuning": tuning,
            "warm_up_errors": {f"{j.kind} {j.codec} b={j.bits} {j.shape.label if j.shape else ''}": e
                               for j, e in warm_errors.items()}}
    tune_md = "".join(f"| {t['class']} | {t['config']} | {_fmt(t.get('ms'), '.4f')} | {t.get('error', '')} "
                      "|\n" for t in tuning)
    md = (f"date {meta['date']}; GPU {meta['gpu']}; torch {meta['torch']}; triton {meta['triton']}; "
          f"commit {meta['commit']}\n\ncommand: `{meta['command']}`\n\ndevice-to-device copy: "
          f"{copy_gbps:.0f} GB/s (read + write)\n\n" + table(rows)
          + "\n\nlaunch configurations tried (octopus b=2; the fastest per class is used above):\n\n"
          "| class | config | ms | error |\n| --- | --- | --- | --- |\n" + tune_md)
    (out_dir / "bench.md").write_text(md)
    (out_dir / "bench.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    print(md)
    print(f"warm-up {t_warm:.0f} s, total {meta['total_s']:.0f} s; {len(warm_errors)} warm-up errors")
    return 0
