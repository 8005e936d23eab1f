"""GPU probe for Nsight Compute: runs each target once between cudaProfilerStart and Stop, after warm-ups, so
`ncu --profile-from-start off` profiles exactly those launches (what bounds the key encode and the AAR-shape
attention: stall reasons, L1 wavefronts, occupancy).

Targets (comma list): `enc-<codec>-b<bits>` the key encode at bench's encode shape (64k tokens x 16 heads,
d=64) through `encode_keys`; `aar-<codec>-b<bits>` the attention at AAR B=64 (2B=128 rows x 16 heads, 75 q x
455 keys, d=64) through a `CompressedKVCache`'s `attend`; `aar-sdpa` bf16 SDPA at that shape;
`long-<codec>-b<bits>` the one-row attention at bench's 1 q x 128k keys, 32 heads, d=128 (score tables).

    PYTHONPATH=$PWD ncu --profile-from-start off --clock-control none --set full -o $OUT/enc \
        python3 benchmarks/lab/ncu_targets.py --targets enc-octopus-b2,enc-turboquant-mse-b2
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F


def _target(name: str):
    from octopus_audio.apps.bench import (
        AttnShape,
        Job,
        _attention_inputs,
        _encode_inputs,
        _ours_attention,
        _ours_encode,
    )

    kind, rest = name.split("-", 1)
    aar = AttnShape("AAR B=64", 128, 16, 75, 380, 75, 64)
    if name == "aar-sdpa":
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(128, 16, 75, 64, generator=gen, device="cuda").bfloat16()
        k = torch.randn(128, 16, 455, 64, generator=gen, device="cuda").bfloat16()
        return lambda: F.scaled_dot_product_attention(q, k, k)
    codec, bits = rest.rsplit("-b", 1)
    if kind == "enc":
        job = Job("encode-k", codec, int(bits))
        return _ours_encode(job, _encode_inputs(job, torch.device("cuda")))
    if kind in ("aar", "long"):
        shape = aar if kind == "aar" else AttnShape("1 q x 128k keys, 32 h, d=128", 1, 32, 1, 131071, 1, 128)
        job = Job("attention", codec, int(bits), shape)
        return _ours_attention(job, _attention_inputs(job, torch.device("cuda")))
    raise SystemExit(f"unknown target {name!r}: enc-<codec>-b<bits>, aar-<codec>-b<bits>, "
                     "long-<codec>-b<bits> or aar-sdpa")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="enc-octopus-b2,enc-turboquant-mse-b2,aar-octopus-b2,aar-sdpa")
    args = parser.parse_args()
    fns = [(t, _target(t)) for t in args.targets.split(",")]
    for _, fn in fns:
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for _, fn in fns:
        fn()
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
