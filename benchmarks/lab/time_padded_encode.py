"""Lab (GPU): `encode_keys` at a T that fills whole blocks and at one that does not, with each head's tokens
padded to whole blocks (the default from encode.PAD_MIN_BLOCKS blocks a head) and without (rows numbered
without gaps: per-row head divisions and rotation-sign gathers), every codec at b=2, d=64, bf16 keys; codes
compared between the two numberings.

    PYTHONPATH=$PWD python3 benchmarks/lab/time_padded_encode.py --out $OUT/padded.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton

from octopus_audio import get_codec
from octopus_audio.cache import kernel_codec
from octopus_audio.kernels import encode_keys
from octopus_audio.kernels.impls import encode

CODECS = ("turboquant-mse", "turboquant-qjl", "polarquant", "octopus", "octopus-qjl")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--tokens", default="65536,65499,4133")
    args = parser.parse_args()
    dev = torch.device("cuda")
    rows = []
    default = encode.PAD_MIN_BLOCKS
    for name in CODECS:
        kc = kernel_codec(get_codec(name, 2, 64), args.heads, dev)
        for t in (int(x) for x in args.tokens.split(",")):
            g = torch.Generator(device=dev).manual_seed(t)
            k = torch.randn(1, args.heads, t, 64, generator=g, device=dev).bfloat16()
            row = {"codec": name, "bits": 2, "tokens": t, "heads": args.heads}
            out = {}
            for label, pad in (("padded", default), ("gapless", 1 << 30)):
                encode.PAD_MIN_BLOCKS = pad
                out[label] = encode_keys(k, kc, gluon=False)
                row[f"{label}_ms"] = triton.testing.do_bench(
                    lambda k=k, kc=kc: encode_keys(k, kc, gluon=False), warmup=10, rep=40,
                    return_mode="median")
            encode.PAD_MIN_BLOCKS = default
            row["fields_differing"] = {f: (getattr(out["padded"], f) != getattr(out["gapless"], f)).float()
                                       .mean().item() for f in ("codes", "gamma", "signs", "gamma_r")
                                       if getattr(out["padded"], f) is not None}
            print(json.dumps(row), flush=True)
            rows.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
