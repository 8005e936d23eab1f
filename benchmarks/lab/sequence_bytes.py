"""Cache bytes of one whole AAR sequence (the release's 16 scales, head dim 64, window 1 scale, bf16 native
tokens) per codec, width and configuration `S` or `S+N@B` (S sink scales native; N scales after them at B-bit
keys and values), against S=0: what a GPU generation's cache holds at its last scale, the window included (as
issue 36's byte budget counts). Exact: the caches are fed and `bytes_breakdown` read.

    python benchmarks/lab/sequence_bytes.py --bits 2,3 --configs 0,3,2+4@4
"""

from __future__ import annotations

import argparse

import torch

from octopus_audio import CompressedKVCache
from octopus_audio.aar_patch.aar import RELEASE_PATCH_NUMS
from octopus_audio.codecs import compressed_codecs


def parse_config(text: str) -> tuple[int, int, int]:
    sinks, _, rest = text.partition("+")
    wide, _, wide_bits = rest.partition("@")
    return int(sinks), int(wide or 0), int(wide_bits or 4)


def sequence_bytes(codec: str, bits: int, config: str, head_dim: int = 64) -> int:
    sinks, wide, wide_bits = parse_config(config)
    cache = CompressedKVCache(codec, bits, head_dim, window=1, native_prefix=sum(RELEASE_PATCH_NUMS[:sinks]),
                              wide_prefix=sum(RELEASE_PATCH_NUMS[sinks:sinks + wide]), wide_bits=wide_bits)
    gen = torch.Generator().manual_seed(0)
    for pn in RELEASE_PATCH_NUMS:
        k, v = (torch.randn(1, 1, pn, head_dim, generator=gen).bfloat16() for _ in range(2))
        cache.append(torch.nn.functional.normalize(k.float(), dim=-1).bfloat16(), v)
    b = cache.bytes_breakdown()
    return b["k_bytes"] + b["v_bytes"] + b["native_bytes"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bits", default="2,3,4")
    p.add_argument("--configs", default="0,3,2+4@4", help="comma list of S or S+N@B; the first is the base")
    args = p.parse_args()
    configs = args.configs.split(",")
    print("| codec | b | " + " | ".join(f"{c} bytes" for c in configs) + " | "
          + " | ".join(f"{c} vs {configs[0]}" for c in configs[1:]) + " |")
    print("|" + " --- |" * (2 + 2 * len(configs) - 1))
    for codec in compressed_codecs():
        for bits in (int(b) for b in args.bits.split(",")):
            sizes = [sequence_bytes(codec, bits, c) for c in configs]
            print(f"| {codec} | {bits} | " + " | ".join(str(s) for s in sizes) + " | "
                  + " | ".join(f"{s / sizes[0] - 1:+.1%}" for s in sizes[1:]) + " |")


if __name__ == "__main__":
    main()
