"""GPU probe: encode_keys' second launch (the near-tie redo, `encode.REDO_GROUPS` groups of NEAR_ROWS rows a
program, `encode.REDO_WARPS` warps) per setting, octopus at b = 2, 3, 4 at bench's encode shape (64k tokens x
16 heads, d=64, bf16): the whole `encode_keys` call, graph-timed (median ms), its codes checked against the
default setting's.

    PYTHONPATH=$PWD python3 benchmarks/lab/sweep_redo_launch.py
"""

from __future__ import annotations

import argparse

import torch
import triton

SETTINGS = [(16, 1), (16, 2), (16, 4), (4, 4), (64, 4), (64, 1)]  # (groups a program, warps)


def main() -> int:
    from octopus_audio.apps.timing import graphed as _graphed
    from octopus_audio.cache import kernel_codec
    from octopus_audio.codecs import get_codec
    from octopus_audio.kernels import encode_keys
    from octopus_audio.kernels.impls import encode

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bits", default="2,3,4")
    parser.add_argument("--codec", default="octopus")
    parser.add_argument("--rep-ms", type=int, default=20)
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(99)
    x = torch.randn(1, 16, 65536, 64, generator=gen, device="cuda").bfloat16()
    for bits in (int(b) for b in args.bits.split(",")):
        kc = kernel_codec(get_codec(args.codec, bits, 64), 16, x.device)
        base = None
        for groups, warps in SETTINGS:
            encode.REDO_GROUPS, encode.REDO_WARPS = groups, warps
            out = encode_keys(x, kc)
            base = out.codes if base is None else base
            same = torch.equal(out.codes, base)
            call = _graphed(lambda kc=kc: encode_keys(x, kc))
            ms = triton.testing.do_bench(call, warmup=10, rep=args.rep_ms, return_mode="median")
            print(f"{args.codec} b={bits} groups={groups} warps={warps} {ms:.4f} ms codes equal: {same}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
