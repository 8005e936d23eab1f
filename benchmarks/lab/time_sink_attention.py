"""The attention at AAR shapes with sink scales (the first S scales kept native in the cache's native prefix)
against S=0, through the public `CompressedKVCache.attend`.

Per codec, bits, batch and S: a cache (window 1, the release's 16 scales, buffers reserved as the patch
reserves them) is fed random bf16 K/V scale by scale; then (1) the last scale's attend, 75 queries x 455 keys
(2B rows x 16 heads, d=64), median of triton's do_bench (L2 flushed) and replayed from a CUDA graph, as
`octopus-audio bench` times it, each output checked against the cache's reference path; (2) one whole
sequence, 16 appends and attends from an empty cache (`reset` first), eager, timed with do_bench: what a
generation's attention layer does, the native buffer's writes included. The ratio to S=0's time is the
figure of merit (issue 36: within 5%). A configuration `S+N@B` adds per-scale widths: the N scales after the
S sink scales stored at B-bit keys and values (the cache's wide prefix, which the Gluon kernel reads as one
more ring tile where its widths are in scope).

    python benchmarks/lab/time_sink_attention.py --sink-scales 0,3,5,2+4@4 --batches 64,512 --out OUT.json
    # on the CPU (no timing worth reading; checks that every path runs and agrees with the reference):
    TRITON_INTERPRET=1 OCTOPUS_AUDIO_KERNELS=kernels python benchmarks/lab/time_sink_attention.py \\
        --device cpu --batches 1 --heads 2 --sink-scales 0,3
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch

from octopus_audio import CompressedKVCache
from octopus_audio.aar_patch.aar import RELEASE_PATCH_NUMS
from octopus_audio.apps.timing import graphed as _graphed
from octopus_audio.cache import sequence_capacities


def parse_config(text: str) -> tuple[int, int, int]:
    """`S` or `S+N@B` -> (sink scales, wide scales, wide bits)."""
    sinks, _, rest = text.partition("+")
    wide, _, wide_bits = rest.partition("@")
    return int(sinks), int(wide or 0), int(wide_bits or 4)


def make_cache(codec: str, bits: int, sinks: int, wide: int = 0, wide_bits: int = 4) -> CompressedKVCache:
    prefix = sum(RELEASE_PATCH_NUMS[:sinks])
    wide_tokens = sum(RELEASE_PATCH_NUMS[sinks:sinks + wide])
    capacity, native_capacity = sequence_capacities(RELEASE_PATCH_NUMS, 1, prefix, wide_tokens)
    return CompressedKVCache(codec, bits, 64, window=1, capacity=capacity, native_prefix=prefix,
                             native_capacity=native_capacity, wide_prefix=wide_tokens, wide_bits=wide_bits)


def scales(rows: int, heads: int, device, seed: int = 0) -> list[tuple[torch.Tensor, ...]]:
    """(q, k, v) [rows, heads, pn, 64] bf16 per scale: keys unit-norm (AAR's cosine attention), queries
    scaled as its learned scale does."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out = []
    for pn in RELEASE_PATCH_NUMS:
        q, k, v = (torch.randn(rows, heads, pn, 64, generator=gen, device=device) for _ in range(3))
        k = torch.nn.functional.normalize(k, dim=-1)
        q = torch.nn.functional.normalize(q, dim=-1) * 10.0
        out.append((q.bfloat16(), k.bfloat16(), v.bfloat16()))
    return out


def timer(device, rep_ms: float):
    """(median ms of fn, graph-replay median ms or None): triton's do_bench on CUDA, wall clock elsewhere."""
    if device.type == "cuda":
        import triton

        def bench(fn):
            return float(triton.testing.do_bench(fn, warmup=max(5, rep_ms // 4), rep=rep_ms,
                                                 return_mode="median"))
        return bench

    def wall(fn):
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    return wall


def row(codec: str, bits: int, batch: int, heads: int, config: str, device, rep_ms: float) -> dict:
    data = scales(2 * batch, heads, device)
    sinks, wide, wide_bits = parse_config(config)
    cache = make_cache(codec, bits, sinks, wide, wide_bits)
    scale = 1.0  # cosine attention: the queries carry the scale
    for _, k, v in data:
        cache.append(k, v)
    q = data[-1][0]
    bench = timer(device, rep_ms)
    out = cache.attend(q, scale)
    want = cache.attend_reference(q.float(), scale).double()
    rel = float((out.double() - want).norm() / want.norm())
    last = bench(lambda: cache.attend(q, scale))
    last_graph = bench(_graphed(lambda: cache.attend(q, scale))) if device.type == "cuda" else None

    def sequence():
        cache.reset()
        for q_s, k_s, v_s in data:
            cache.append(k_s, v_s)
            cache.attend(q_s, scale)

    seq = bench(sequence)
    return {"codec": codec, "bits": bits, "batch": batch, "rows": 2 * batch, "heads": heads,
            "config": config, "sink_scales": sinks, "wide_scales": wide, "wide_bits": wide_bits,
            "wide_tokens": cache.wide_tokens, "prefix_tokens": cache.prefix_tokens,
            "native_tokens": cache.native_kv()[0].shape[2], "store_tokens": cache.length,
            "backend": cache.backend, "rel_err_vs_reference": rel, "last_scale_ms": last,
            "last_scale_graph_ms": last_graph, "sequence_ms": seq}


def table(rows: list[dict]) -> str:
    lines = ["| codec | b | 2B | S+N@B | native keys | last scale ms | x first | graph ms | x first "
             "| 16 scales ms | x first | rel err |", "|" + " --- |" * 12]
    first = rows[0]["config"]
    base = {(r["codec"], r["bits"], r["batch"]): r for r in rows if r["config"] == first}

    def ratio(r, key):
        b = base[r["codec"], r["bits"], r["batch"]][key]
        return "-" if r[key] is None or b is None else f"{r[key] / b:.3f}"

    def ms(v):
        return "-" if v is None else f"{v:.4f}"

    for r in rows:
        cells = [r["codec"], r["bits"], r["rows"], r["config"], r["native_tokens"],
                 ms(r["last_scale_ms"]), ratio(r, "last_scale_ms"), ms(r["last_scale_graph_ms"]),
                 ratio(r, "last_scale_graph_ms"), ms(r["sequence_ms"]), ratio(r, "sequence_ms"),
                 f"{r['rel_err_vs_reference']:.1e}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--codecs", default="octopus", help="comma list of kernel codecs (default octopus)")
    p.add_argument("--bits", default="2", help="comma list of widths (default 2)")
    p.add_argument("--batches", default="64,512", help="conditions B; the rows are 2B (default 64,512)")
    p.add_argument("--heads", type=int, default=16, help="KV heads (default 16, AAR d16)")
    p.add_argument("--sink-scales", default="0,3",
                   help="comma list of S or S+N@B (N wide scales at B bits); the first is the baseline "
                        "(default 0,3)")
    p.add_argument("--rep-ms", type=float, default=200.0, help="do_bench's rep (default 200)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, default=None,
                   help="write the rows as JSON (and the table beside it, .md)")
    args = p.parse_args()
    device = torch.device(args.device)
    rows = []
    for codec in args.codecs.split(","):
        for bits in (int(b) for b in args.bits.split(",")):
            for batch in (int(b) for b in args.batches.split(",")):
                for config in args.sink_scales.split(","):
                    r = row(codec, bits, batch, args.heads, config, device, args.rep_ms)
                    print(json.dumps(r), flush=True)
                    rows.append(r)
    text = table(rows)
    print(text)
    if args.out is not None:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name() if device.type == "cuda"
                                        else "cpu", "rows": rows}, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(text)
    assert all(math.isfinite(r["rel_err_vs_reference"]) and r["rel_err_vs_reference"] < 1e-2 for r in rows)


if __name__ == "__main__":
    main()
