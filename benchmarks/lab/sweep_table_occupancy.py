"""GPU probe: the one-row score-table attention's launch (keys a score step, warps, programs an SM, keys a
value step) at long context, to see whether the split count's programs fill whole waves.

1 query row per KV head against `--keys` compressed keys (random packed codes, as `octopus-audio bench`
builds its stores) and a 1-key native window, through `kernels.attention` with each AttnConfig, per codec and
head dim (d=64 x 16 heads, d=128 x 32 heads); bf16 SDPA over as many native keys beside it. Times: medians of
`triton.testing.do_bench` replaying a CUDA graph of the call (GPU time, no host launch work), ms.

    PYTHONPATH=$PWD python3 benchmarks/lab/sweep_table_occupancy.py --out $OUT/occupancy.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

# (keys a score step, warps, programs an SM, keys a value step) per head dim; the launcher's default first
CONFIGS = {
    64: [(128, 4, 4, 64), (128, 4, 8, 64), (128, 4, 6, 64), (128, 4, 5, 64), (128, 4, 3, 64),
         (256, 8, 3, 128), (256, 8, 2, 128), (64, 2, 12, 32), (64, 2, 8, 32)],
    128: [(256, 8, 3, 64), (256, 8, 2, 64), (128, 4, 6, 32), (128, 4, 5, 32), (128, 4, 4, 32),
          (256, 8, 3, 32), (256, 8, 3, 128), (128, 4, 6, 64), (256, 8, 4, 64)],
}
SHAPES = {64: 16, 128: 32}  # head dim: heads


def _time(fn, rep_ms: int) -> float:
    from octopus_audio.apps.timing import graphed as _graphed

    return triton.testing.do_bench(_graphed(fn), warmup=10, rep=rep_ms, return_mode="median")


def main() -> int:
    from octopus_audio.apps.bench import AttnShape, _random_store
    from octopus_audio.cache import kernel_codec
    from octopus_audio.codecs import get_codec
    from octopus_audio.kernels import AttnConfig, PackedKeys, PackedValues, attention

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--keys", type=int, default=131072)
    parser.add_argument("--codecs", default="octopus,turboquant-mse")
    parser.add_argument("--dims", default="64,128")
    parser.add_argument("--rep-ms", type=int, default=30)
    parser.add_argument("--configs", help="launches to time instead of CONFIGS: comma list of "
                        "block_n:num_warps:programs_per_sm:block_v[:cap], cap the register cap of capped "
                        "kernels (score_tables.MAX_REGISTERS; default the launcher's)")
    parser.add_argument("--variants", default="",
                        help="kernel settings to time each launch with: comma list of "
                        "value_stages:stage_keys (the value loop's pipeline depth in "
                        "score_tables.TABLE_LAUNCH, "
                        "score_tables.STAGE_KEYS; default the modules')")
    args = parser.parse_args()
    from octopus_audio.kernels.impls import score_tables

    launches = dict(score_tables.TABLE_LAUNCH)
    variants = [tuple(int(x) for x in v.split(":")) for v in args.variants.split(",") if v] or [None]
    default_cap = score_tables.MAX_REGISTERS
    if args.configs:
        parsed = [tuple(int(x) for x in c.split(":")) for c in args.configs.split(",")]
        configs = {d: parsed for d in CONFIGS}
    else:
        configs = CONFIGS
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for d in (int(x) for x in args.dims.split(",")):
        h = SHAPES[d]
        q = torch.randn(1, h, 1, d, generator=gen, device="cuda").bfloat16()
        k = torch.randn(1, h, args.keys, d, generator=gen, device="cuda").bfloat16()
        sdpa = _time(lambda k=k, q=q: F.scaled_dot_product_attention(q, k, k), args.rep_ms)
        del k
        for name in args.codecs.split(","):
            codec = get_codec(name, 2, d)
            shape = AttnShape("probe", 1, h, 1, args.keys - 1, 1, d)
            ks, vs = _random_store(shape, codec, 2, gen, torch.device("cuda"))
            keys = PackedKeys(ks.codes, ks.gamma, ks.signs, ks.gamma_r)
            values = PackedValues(vs.codes, vs.scale, vs.minimum, 2)
            kc = kernel_codec(codec, h, torch.device("cuda"))
            win = torch.randn(1, h, 1, d, generator=gen, device="cuda").bfloat16()
            call = (q, keys, values, args.keys - 1, win, win, kc)
            for var, (bn, nw, pps, bv, *cap) in ((v, c) for v in variants for c in configs[d]):
                if var is not None:
                    score_tables.TABLE_LAUNCH = {k: (*v[:4], var[0]) for k, v in launches.items()}
                    score_tables.STAGE_KEYS = var[1]
                score_tables.MAX_REGISTERS = cap[0] if cap else default_cap
                cfg = AttnConfig(block_n=bn, num_warps=nw, programs_per_sm=pps, block_v=bv)
                try:
                    ms = _time(lambda cfg=cfg, call=call, d=d: attention(*call, scale=d ** -0.5, config=cfg),
                               args.rep_ms)
                    err = ""
                except Exception as e:  # a launch that cannot compile or run still lets the others report
                    ms, err = float("nan"), f"{type(e).__name__}: {str(e)[:200]}"
                rows.append({"codec": name, "d": d, "heads": h, "block_n": bn, "num_warps": nw,
                             "programs_per_sm": pps, "block_v": bv, "cap": score_tables.MAX_REGISTERS,
                             "variant": "default" if var is None else ":".join(map(str, var)), "ms": ms,
                             "sdpa_ms": sdpa,
                             "x_sdpa": sdpa / ms, "error": err})
                print(json.dumps(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
