"""GPU sweep of the query-block attention kernel at AAR shapes: correctness against decode-then-SDPA, then
launch configurations (AttnConfig) timed against bf16 SDPA. Writes sweep_block_attention.{json,md} to --out.

Run from the repository root on the device (no editable install there):
    PYTHONPATH=$PWD python3 benchmarks/lab/sweep_block_attention.py --out $OUT
Shapes: 2B rows x 16 heads, 75 queries against 380 compressed + 75 native keys, d=64 (AAR), octopus b=2 at
B = 1, 64, 512 and turboquant-mse b=2 at B = 64. The compressed stores are random packed codes built by
octopus_audio.apps.bench._random_store (the decode cost does not depend on the codes). Times: medians of
triton.testing.do_bench (L2 flushed); "host us": the launcher's CPU time per call (100 calls queued, no
sync; B <= 64 only).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from pathlib import Path

DEVICE = "cuda"
# (label, AttnConfig kwargs); index = job config id, so workers rebuild them by index. "default" is the
# library's launch. The octopus direction-decode modes this sweep also compared (table, unfold, folded) are
# gone from the kernels; their figures are in benchmarks/results/kernels.md ("Measured and removed").
W4 = dict(block_m=128, block_n=64, num_warps=4, tile_words=True)
CANDIDATES = [
    ("default", {}),
    ("m128 n64 w4 tiles", W4),
    ("m128 n32 w4 tiles", {**W4, "block_n": 32}),
    ("m128 n64 w4 tiles, window 32 a step", {**W4, "block_w": 32}),
    ("m128 n64 w4 tiles, window 16 a step", {**W4, "block_w": 16}),
    ("m128 n64 w4 tiles stages2", {**W4, "num_stages": 2}),
    ("m128 n64 w4 gathers", {**W4, "tile_words": False}),
    ("m128 n32 w4 gathers", {**W4, "block_n": 32, "tile_words": False}),
    ("m128 n64 w4 gathers, window rides the last split", {**W4, "tile_words": False, "window_split": False}),
    ("m128 n128 w8 tiles", {**W4, "block_n": 128, "num_warps": 8}),
    ("m128 n128 w8 gathers", {**W4, "block_n": 128, "num_warps": 8, "tile_words": False}),
    ("m128 n64 w8 tiles", {**W4, "num_warps": 8}),
    ("m64 n64 w4 tiles", {**W4, "block_m": 64}),
    ("m128 n64 w4 tiles, window rides the last split", {**W4, "window_split": False}),
    ("m128 n64 w4 tiles, splits >= 64 keys", {**W4, "split_min_keys": 64, "programs_per_sm": 16}),
]
_INDEX = {label: i for i, (label, _) in enumerate(CANDIDATES)}
# (codec, bits, B): the timed problems; turboquant-mse runs a subset
PROBLEMS = [("octopus", 2, 1), ("octopus", 2, 64), ("octopus", 2, 512), ("turboquant-mse", 2, 64)]
TQ_SUBSET = tuple(_INDEX[label] for label in ("default", "m128 n64 w4 tiles", "m128 n32 w4 tiles",
                                              "m128 n128 w8 tiles", "m128 n128 w8 gathers"))
# correctness on the GPU: (codec, bits, B, query dtype, candidate index)
CHECKS = [(c, b, batch, dt, _INDEX[label]) for c, b, batch, dt, label in [
    ("octopus", 2, 2, "bfloat16", "default"), ("octopus", 2, 2, "float32", "default"),
    ("octopus", 2, 2, "bfloat16", "m128 n64 w4 tiles"),
    ("octopus", 2, 2, "float32", "m128 n64 w4 gathers"),
    ("octopus-qjl", 3, 2, "bfloat16", "m128 n64 w4 tiles"),
    ("octopus", 3, 2, "float16", "m128 n32 w4 tiles"),
    ("octopus", 2, 2, "bfloat16", "m128 n64 w4 tiles, window 16 a step"),
    ("octopus-qjl", 2, 2, "float32", "m128 n64 w8 tiles"),
    ("octopus", 2, 1, "bfloat16", "m128 n128 w8 tiles"),
    ("turboquant-mse", 2, 2, "bfloat16", "m128 n128 w8 tiles"),
    ("turboquant-qjl", 3, 2, "float32", "m128 n32 w4 tiles"),
    ("polarquant", 2, 2, "bfloat16", "m64 n64 w4 tiles"),
    ("octopus", 4, 1, "bfloat16", "default"),
    ("octopus-qjl", 3, 2, "bfloat16", "default"),
    ("octopus-qjl", 3, 2, "float32", "m128 n64 w4 gathers"),
    ("octopus", 3, 2, "float16", "m128 n64 w4 gathers, window rides the last split"),
    ("turboquant-qjl", 3, 2, "bfloat16", "default")]]


def _shape(batch: int):
    from octopus_audio.apps.bench import AttnShape

    return AttnShape(f"AAR B={batch}", 2 * batch, 16, 75, 380, 75, 64)


def _inputs(codec_name: str, bits: int, batch: int, dtype_name: str = "bfloat16"):
    """(library codec, value quantizer, key/value states, q, window K/V, kernel codec) on cuda."""
    import torch

    from octopus_audio.apps.bench import _random_store
    from octopus_audio.cache import kernel_codec
    from octopus_audio.codecs import get_codec
    from octopus_audio.values import ValueQuantizer

    s = _shape(batch)
    dev = torch.device(DEVICE)
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator(device=dev).manual_seed(1234 + batch)
    codec = get_codec(codec_name, bits, s.d)
    ks, vs = _random_store(s, codec, bits, gen, dev)
    q = torch.randn(s.rows, s.heads, s.tq, s.d, generator=gen, device=dev).to(dtype)
    k_win = torch.randn(s.rows, s.heads, s.window, s.d, generator=gen, device=dev).to(dtype)
    v_win = torch.randn(s.rows, s.heads, s.window, s.d, generator=gen, device=dev).to(dtype)
    kc = kernel_codec(codec, s.heads, dev)
    return codec, ValueQuantizer(bits, s.d), ks, vs, q, k_win, v_win, kc


def _ours(inputs, cand: int, length: int = 380):
    from octopus_audio.kernels import AttnConfig, PackedKeys, PackedValues, ops

    codec, quant, ks, vs, q, k_win, v_win, kc = inputs
    keys = PackedKeys(ks.codes, ks.gamma, ks.signs, ks.gamma_r)
    values = PackedValues(vs.codes, vs.scale, vs.minimum, quant.bits)
    _, kwargs = CANDIDATES[cand]
    cfg = AttnConfig(**kwargs)
    return lambda: ops.attention(q, keys, values, length, k_win, v_win, kc, config=cfg)


def _reference(inputs):
    """The library path in fp32: decode the store, concatenate the window, SDPA (math in fp32)."""
    import torch
    import torch.nn.functional as F

    codec, quant, ks, vs, q, k_win, v_win, kc = inputs
    k_all = torch.cat([codec.decode(ks, torch.float32), k_win.float()], 2)
    v_all = torch.cat([quant.decode(vs, torch.float32), v_win.float()], 2)
    return F.scaled_dot_product_attention(q.float(), k_all, v_all)


def _warm(job) -> str:
    """Compile one (codec, bits, batch, candidate, dtype) in a worker process: '' or the error."""
    import torch

    codec_name, bits, batch, cand, dtype_name = job
    try:
        _ours(_inputs(codec_name, bits, batch, dtype_name), cand)()
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # reported; the main process repeats the job and records it
        return f"{type(e).__name__}: {e}"


def _rel(got, want) -> tuple[float, float]:
    """(relative RMS error, max abs error / max abs reference)."""
    got, want = got.float(), want.float()
    return (((got - want).norm() / want.norm()).item(),
            ((got - want).abs().max() / want.abs().max()).item())


def _host_us(fn, calls: int = 100) -> float:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for sweep_block_attention.json and .md")
    ap.add_argument("--rep-ms", type=float, default=25.0, help="timed milliseconds per measurement")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1),
                    help="processes compiling in parallel first (0: compile in the main process)")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    import triton

    if not torch.cuda.is_available():
        raise SystemExit("this sweep needs a CUDA GPU")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    jobs = [(c, b, batch, i, "bfloat16") for c, b, batch in PROBLEMS
            for i in (range(len(CANDIDATES)) if c == "octopus" else TQ_SUBSET)]
    jobs += [(c, b, batch, i, dt) for c, b, batch, dt, i in CHECKS]
    warm_errors = {}
    if args.workers > 0:
        print(f"compiling {len(jobs)} jobs in {args.workers} processes ...", flush=True)
        with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
            warm_errors = {j: e for j, e in zip(jobs, pool.map(_warm, jobs, chunksize=1), strict=True) if e}
        for j, e in warm_errors.items():
            print(f"  warm-up error {j}: {e}", flush=True)
    print(f"compiled in {time.time() - t0:.0f} s", flush=True)

    checks = []
    for c, b, batch, dt, i in CHECKS:
        row = {"codec": c, "bits": b, "B": batch, "dtype": dt, "config": CANDIDATES[i][0]}
        try:
            inputs = _inputs(c, b, batch, dt)
            row["rel_rms"], row["max_rel"] = _rel(_ours(inputs, i)(), _reference(inputs))
            tol = 1e-4 if dt == "float32" else 5e-3
            row["ok"] = row["rel_rms"] <= tol
        except Exception as e:
            row["error"], row["ok"] = f"{type(e).__name__}: {e}", False
        checks.append(row)
        print(f"check {row}", flush=True)

    rows, sdpa = [], {}
    for c, b, batch in PROBLEMS:
        s = _shape(batch)
        if batch not in sdpa:
            gen = torch.Generator(device=DEVICE).manual_seed(7)
            q0 = torch.randn(s.rows, s.heads, s.tq, s.d, generator=gen, device=DEVICE, dtype=torch.bfloat16)
            k0 = torch.randn(s.rows, s.heads, s.length + s.window, s.d, generator=gen, device=DEVICE,
                             dtype=torch.bfloat16)
            v0 = torch.randn_like(k0)
            fn = lambda q0=q0, k0=k0, v0=v0: F.scaled_dot_product_attention(q0, k0, v0)  # noqa: E731
            sdpa[batch] = {"ms": triton.testing.do_bench(fn, warmup=5, rep=args.rep_ms, return_mode="median"),
                           "host_us": _host_us(fn)}
            print(f"SDPA bf16 B={batch}: {sdpa[batch]['ms']:.4f} ms", flush=True)
        inputs = _inputs(c, b, batch)
        ref = _reference(inputs)
        for i in (range(len(CANDIDATES)) if c == "octopus" else TQ_SUBSET):
            label, kwargs = CANDIDATES[i]
            row = {"codec": c, "bits": b, "B": batch, "config": label, "kwargs": kwargs}
            try:
                fn = _ours(inputs, i)
                row["rel_rms"], row["max_rel"] = _rel(fn(), ref)
                row["ms"] = triton.testing.do_bench(fn, warmup=5, rep=args.rep_ms, return_mode="median")
                row["host_us"] = _host_us(fn) if batch <= 64 else float("nan")
                row["sdpa_ms"] = sdpa[batch]["ms"]
                row["x_sdpa"] = row["ms"] / row["sdpa_ms"]
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"
            rows.append(row)
            print(f"{c} b={b} B={batch} {label}: " + (row.get("error") or
                  f"{row['ms']:.4f} ms = {row['x_sdpa']:.2f}x SDPA, host {row['host_us']:.0f} us, "
                  f"rel err {row['rel_rms']:.1e}"), flush=True)
        del inputs, ref
        torch.cuda.empty_cache()

    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": os.environ.get("OCTOPUS_AUDIO_COMMIT", ""), "total_s": round(time.time() - t0, 1),
            "warm_up_errors": {repr(k): v for k, v in warm_errors.items()}}
    (out / "sweep_block_attention.json").write_text(json.dumps(
        {"meta": meta, "sdpa": sdpa, "checks": checks, "rows": rows}, indent=1, default=str))
    md = [f"GPU {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, {meta['total_s']} s", "",
          "| check | B | dtype | config | rel RMS | max rel | ok |",
          "| --- | --- | --- | --- | --- | --- | --- |"]
    md += [f"| {r['codec']} b={r['bits']} | {r['B']} | {r['dtype']} | {r['config']} | "
           f"{r.get('rel_rms', float('nan')):.1e} | {r.get('max_rel', float('nan')):.1e} | "
           f"{r['ok']}{' ' + r['error'][:80] if 'error' in r else ''} |" for r in checks]
    md += ["", "| codec | B | config | ms | SDPA bf16 ms | x SDPA | host us (SDPA host us) | rel err |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "error" in r:
            md.append(f"| {r['codec']} b={r['bits']} | {r['B']} | {r['config']} | error: {r['error'][:100]} "
                      "| | | | |")
            continue
        md.append(f"| {r['codec']} b={r['bits']} | {r['B']} | {r['config']} | {r['ms']:.4f} | "
                  f"{r['sdpa_ms']:.4f} | {r['x_sdpa']:.2f} | {r['host_us']:.0f} "
                  f"({sdpa[r['B']]['host_us']:.0f}) | {r['rel_rms']:.1e} |")
    best = {}
    for r in (r for r in rows if "ms" in r):
        key = (r["codec"], r["B"])
        if key not in best or r["ms"] < best[key]["ms"]:
            best[key] = r
    md += ["", "fastest per problem: " + "; ".join(
        f"{c} B={b}: {r['config']} {r['ms']:.4f} ms ({r['x_sdpa']:.2f}x SDPA)" for (c, b), r in best.items())]
    (out / "sweep_block_attention.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    failed = [r for r in checks if not r["ok"]]
    print(f"total {time.time() - t0:.0f} s; {len(failed)} failed checks")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
