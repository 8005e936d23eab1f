"""GPU probe: the patch's attention scale by scale (issue 39), against bf16 SDPA at the same shapes.

Per scale s of the release's 16, a cache as `patch_aar` builds it (window 1, the sink scales' tokens in the
native prefix, buffers reserved for the whole sequence) holds scales 0..s; its `attend` of scale s's queries
(pn_s queries over all tokens so far, 2B rows x 16 heads, d=64) is replayed from a CUDA graph and timed with
triton's do_bench, beside torch SDPA over the same tokens in bf16 (the default backend, and each backend
forced). `--triton` also times the cache with the Gluon kernels disallowed (the Triton kernels). The sums
over the scales are one layer's attention in a generation; x16 layers is the profile's attention total.

    PYTHONPATH=$PWD python3 benchmarks/lab/time_scale_attention.py --batch 256 --out $OUT/scales.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from time_sink_attention import make_cache  # the cache as the patch builds it (this script's folder)

from octopus_audio.aar_patch.sat import RELEASE_PATCH_NUMS
from octopus_audio.apps.timing import backend_graph_ms, bench_ms, graphed, sdpa_backends

BACKENDS = ("cudnn", "flash", "efficient")  # the columns (the math backend is left out: not a contender)


def bench(fn, rep_ms: float) -> float:
    return bench_ms(graphed(fn), rep_ms)


def scale_row(s: int, data: list, args: argparse.Namespace) -> dict:
    """Scale s's attend from the cache (and the Triton kernels' with --triton) beside SDPA's."""
    cache = make_cache(args.codec, args.bits, args.sink_scales)
    for _, k, v in data[:s + 1]:
        cache.append(k, v)
    q = data[s][0]
    r = {"scale": s, "queries": q.shape[2], "keys": sum(RELEASE_PATCH_NUMS[:s + 1]), "store": cache.length,
         "ours": bench(lambda: cache.attend(q, 1.0), args.rep_ms),
         "backend": {op: sorted(impl) for op, impl in cache._seq.plan.used.items()}}
    if args.triton:
        cache._seq.plan.gluon = False
        r["triton"] = bench(lambda: cache.attend(q, 1.0), args.rep_ms)
    k_all = torch.cat([d[1] for d in data[:s + 1]], 2)
    v_all = torch.cat([d[2] for d in data[:s + 1]], 2)

    def sdpa():
        return F.scaled_dot_product_attention(q, k_all, v_all, scale=1.0)

    r["sdpa"] = bench(sdpa, args.rep_ms)
    calls = {n: c for n, c in sdpa_backends(q, k_all, v_all).items() if n in BACKENDS}
    return r | {n: None for n in BACKENDS} | backend_graph_ms(calls, args.rep_ms)  # None: refused here


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--codec", default="octopus")
    p.add_argument("--bits", type=int, default=2)
    p.add_argument("--batch", type=int, default=256, help="samples B; the rows are 2B (cfg)")
    p.add_argument("--sink-scales", type=int, default=3)
    p.add_argument("--rep-ms", type=float, default=50.0)
    p.add_argument("--triton", action="store_true", help="also time the cache with Gluon disallowed")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    dev = torch.device("cuda")
    rows, heads = 2 * args.batch, 16
    gen = torch.Generator(device=dev).manual_seed(0)
    data = []
    for pn in RELEASE_PATCH_NUMS:
        # views of one [2B, pn, 3, H, 64] projection, as the patch's q, k, v are
        q, k, v = torch.randn(rows, pn, 3, heads, 64, generator=gen, device=dev).permute(2, 0, 3, 1, 4)
        q = (F.normalize(q, dim=-1) * 10).bfloat16()
        data.append((q, F.normalize(k, dim=-1).bfloat16(), v.bfloat16()))
    out = []
    for s in range(len(RELEASE_PATCH_NUMS)):
        r = scale_row(s, data, args)
        print(json.dumps(r), flush=True)
        out.append(r)
    cols = ["ours"] + (["triton"] if args.triton else []) + ["sdpa", *BACKENDS]
    lines = ["| scale | q | keys | store | " + " | ".join(f"{c} ms" for c in cols) + " | ours / sdpa |",
             "|" + " ---: |" * (5 + len(cols))]
    for r in out:
        cells = [r["scale"], r["queries"], r["keys"], r["store"]]
        cells += ["-" if r[c] is None else f"{r[c]:.4f}" for c in cols] + [f"{r['ours'] / r['sdpa']:.2f}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    tot = {c: sum(r[c] or 0.0 for r in out) for c in cols}
    lines.append("| sum | | | | " + " | ".join(f"{tot[c]:.4f}" for c in cols)
                 + f" | {tot['ours'] / tot['sdpa']:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "args": vars(args) | {
        "out": str(args.out)}, "rows": out}, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
