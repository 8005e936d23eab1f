"""Lab (GPU): the score-table attention of the scalar section (turboquant-mse, turboquant-qjl) at one query
row per KV head, per group size (coordinates a table code), against the flash kernel's single-row path the
section ran before it had score tables and against bf16 SDPA over as many native keys; every row checked
against decode-then-SDPA (relative RMS error).

    python benchmarks/lab/sweep_scalar_groups.py [--keys 131072] [--bits 2,3,4] [--groups 1,2,3,4,6] [--d 128]

Prints a markdown row per (codec, bits, d, launch): CUDA-graph replay median ms (triton do_bench), SDPA's,
the speedup over SDPA, the table size a row and the error.
"""

from __future__ import annotations

import argparse
import functools
import math

import torch
import torch.nn.functional as F

from octopus_audio.apps import bench, timing
from octopus_audio.cache import kernel_codec
from octopus_audio.codecs import get_codec
from octopus_audio.kernels import PackedKeys, PackedValues, attention
from octopus_audio.kernels.impls import score_tables
from octopus_audio.values import ValueQuantizer


def flash_row(*call, scale):
    """attention with the score tables refused: the split-K kernel's single-row path."""
    real = score_tables.adc_limit
    score_tables.adc_limit = lambda *a, **k: "the sweep times the split-K kernel"
    try:
        return attention(*call, scale=scale)
    finally:
        score_tables.adc_limit = real


def uncapped(*call, **kw):
    """score_tables.attention_adc without the register cap (MAX_REGISTERS) its launcher may set."""
    real = score_tables.attention_constants

    def no_cap(*a, **k):
        consts, options = real(*a, **k)
        return consts, {"num_warps": options["num_warps"]}

    score_tables.attention_constants = no_cap
    try:
        return score_tables.attention_adc(*call, **kw)
    finally:
        score_tables.attention_constants = real


def sweep(name: str, bits: int, d: int, heads: int, keys_n: int, groups: list[int], sdpa_ms: float,
          rep_ms: float) -> None:
    dev = torch.device("cuda")
    shape = bench.AttnShape("sweep", 1, heads, 1, keys_n - 1, 1, d)
    codec = get_codec(name, bits, d)
    gen = torch.Generator(device=dev).manual_seed(5)
    ks, vs = bench._random_store(shape, codec, bits, gen, dev)
    kc = kernel_codec(codec, heads, dev)
    q, kw, vw = (torch.randn(1, heads, 1, d, device=dev, dtype=torch.bfloat16, generator=gen)
                 for _ in range(3))
    call = (q, PackedKeys(ks.codes, ks.gamma, ks.signs, ks.gamma_r),
            PackedValues(vs.codes, vs.scale, vs.minimum, bits), shape.length, kw, vw, kc)
    scale = 1 / math.sqrt(d)
    k_all = torch.cat([codec.decode(ks, torch.bfloat16), kw], 2)
    v_all = torch.cat([ValueQuantizer(bits, d).decode(vs, torch.bfloat16), vw], 2)
    ref = F.scaled_dot_product_attention(q, k_all, v_all, scale=scale).float()
    del k_all, v_all
    wide = d >= 128
    launches = {f"tables g={g}": (g, functools.partial(
        score_tables.attention_adc, *call, scale=scale, block_k=256 if wide else 128, block_v=64,
        num_warps=8 if wide else 4, programs_per_sm=3 if wide else 4, group=g))
        for g in groups if kc.kind.name == "scalar" and score_tables.adc_limit(kc, 1, 1, g) is None}
    launches["tables default, no register cap"] = (kc.kind.score_tables.layout(kc).group, functools.partial(
        uncapped, *call, scale=scale, block_k=256 if wide else 128, block_v=64, num_warps=8 if wide else 4,
        programs_per_sm=3 if wide else 4))
    launches["default (attention)"] = (None, functools.partial(attention, *call, scale=scale))
    launches["flash single row"] = (None, functools.partial(flash_row, *call, scale=scale))
    for label, (g, fn) in launches.items():
        err = ((fn().float() - ref).norm() / ref.norm()).item()
        ms = timing.bench_ms(timing.graphed(fn), rep_ms)
        lay = kc.kind.score_tables.layout(kc, g)
        kib = f"{lay.codes * lay.entries * 4 / 1024:.1f}" if "tables" in label else ""
        print(f"| {name} | {bits} | {d} x {heads} | {label} | {kib} | {ms:.3f} | {sdpa_ms:.3f} | "
              f"{sdpa_ms / ms:.2f} | {err:.1e} |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=131072)
    parser.add_argument("--bits", default="2,3,4")
    parser.add_argument("--groups", default="1,2,3,4,6,8")
    parser.add_argument("--codecs", default="turboquant-mse,turboquant-qjl",
                        help="comma list (a triplet codec gets its default table launch, capped and not)")
    parser.add_argument("--rep-ms", type=float, default=50)
    parser.add_argument("--d", type=int, choices=[d for d, _ in bench.LONG_DIMS], help="one head dim only")
    args = parser.parse_args()
    dev = torch.device("cuda")
    groups = [int(g) for g in args.groups.split(",")]
    print("| codec | b | d x heads | launch | table KiB/row | graph ms | SDPA ms | x SDPA | rel err |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for d, heads in bench.LONG_DIMS:
        if args.d not in (None, d):
            continue
        sdpa_in = bench._sdpa_inputs(bench.AttnShape("sdpa", 1, heads, 1, args.keys - 1, 1, d), dev)
        sdpa_ms = timing.bench_ms(timing.graphed(functools.partial(F.scaled_dot_product_attention, *sdpa_in)),
                               args.rep_ms)
        del sdpa_in
        for name in args.codecs.split(","):
            for bits in map(int, args.bits.split(",")):
                sweep(name, bits, d, heads, args.keys, groups, sdpa_ms, args.rep_ms)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
