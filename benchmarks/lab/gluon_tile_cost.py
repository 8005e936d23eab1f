"""GPU probe: the AAR-shape attention's time against the number of key tiles, to split a program's fixed
cost (query load and rotation, ring set-up, epilogue) from its cost a 64-key tile.

2B rows x 16 heads, d=64, `--tq` queries (75: one AAR scale) against L compressed keys (random packed codes,
as `octopus-audio bench` builds its stores) plus a 75-key native window, through `kernels.attention`
with its defaults (the Gluon kernel on sm_90 where in scope), for L in `--lengths`; bf16 SDPA (cuDNN) over
L + 75 native keys beside it. Times: medians of `triton.testing.do_bench` replaying a CUDA graph of the call
(GPU time, no host launch work). A line through (tiles, ms) gives the fixed cost (intercept) and the cost a
tile (slope) of each.

    PYTHONPATH=$PWD python3 benchmarks/lab/gluon_tile_cost.py --out $OUT/tile_cost.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

HEADS, WIN, D = 16, 75, 64


def _time(fn, rep_ms: int) -> float:
    from octopus_audio.apps.timing import graphed as _graphed

    return triton.testing.do_bench(_graphed(fn), warmup=10, rep=rep_ms, return_mode="median")


def main() -> int:
    from octopus_audio.apps.bench import AttnShape, _random_store
    from octopus_audio.cache import kernel_codec
    from octopus_audio.codecs import get_codec
    from octopus_audio.kernels import PackedKeys, PackedValues, attention

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=1024, help="2B: batch rows (default 1024)")
    parser.add_argument("--tq", type=int, default=75)
    parser.add_argument("--codecs", default="octopus,turboquant-mse")
    parser.add_argument("--lengths", default="0,64,192,380,764,1532")
    parser.add_argument("--rep-ms", type=int, default=30)
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    lengths = [int(x) for x in args.lengths.split(",")]
    rows = []
    q = torch.randn(args.rows, HEADS, args.tq, D, generator=gen, device="cuda").bfloat16()
    for n in lengths:
        k = torch.randn(args.rows, HEADS, n + WIN, D, generator=gen, device="cuda").bfloat16()
        v = torch.randn_like(k)
        out = {}
        out["sdpa"] = _time(lambda k=k, v=v: F.scaled_dot_product_attention(q, k, v), args.rep_ms)
        for name in args.codecs.split(","):
            codec = get_codec(name, 2, D)
            shape = AttnShape("probe", args.rows, HEADS, args.tq, max(n, 1), WIN, D)
            ks, vs = _random_store(shape, codec, 2, gen, torch.device("cuda"))
            keys = PackedKeys(ks.codes, ks.gamma, ks.signs, ks.gamma_r)
            values = PackedValues(vs.codes, vs.scale, vs.minimum, 2)
            kc = kernel_codec(codec, HEADS, torch.device("cuda"))
            k_win, v_win = k[:, :, n:].contiguous(), v[:, :, n:].contiguous()
            call = (q, keys, values, n, k_win, v_win, kc)
            out[name] = _time(lambda call=call: attention(*call, scale=0.125), args.rep_ms)
        tiles = math.ceil(n / 64) + math.ceil(WIN / 64)
        rows.append({"length": n, "tiles": tiles, **out})
        print(json.dumps(rows[-1]), flush=True)
    fits = {}
    for name in ["sdpa", *args.codecs.split(",")]:
        xs = [r["tiles"] for r in rows]
        ys = [r[name] for r in rows]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
        fits[name] = {"ms_per_tile": slope, "ms_fixed": my - slope * mx}
        print(f"{name}: {slope:.4f} ms a tile, {my - slope * mx:.4f} ms fixed", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"rows_2B": args.rows, "tq": args.tq, "rows": rows, "fits": fits}
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
