"""How often a clip's tokens differ between batch size 1 and a larger batch (per-row seeds), and how long each
takes: the embedded default model on the shipped clips' `spectral` conditions, the eval's seed, uncompressed
and under each codec given.

    python benchmarks/lab/batch_tokens.py --batch 16 --codecs none,octopus@2 [--device cuda] [--graphs]

Prints per setting: clips whose tokens differ anywhere, tokens that differ of all, the largest audio
difference, and seconds for the B=1 generations and for the batched ones. On CUDA `--graphs` runs both
through `GraphedGenerator`, else the eager fast path (bf16 blocks) that the eval runs."""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from octopus_audio.aar_patch import GraphedGenerator, compressed_kv, generate, load_aar
from octopus_audio.eval.cli import default_clips_dir
from octopus_audio.eval.conditioning import make_conditioner
from octopus_audio.eval.sources import CLAP_RATE, decode, list_folder, prepare


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--codecs", default="none,octopus@2")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--graphs", action="store_true")
    args = p.parse_args()
    refs = list_folder(default_clips_dir(), n=args.batch, seed=args.seed)
    embed = make_conditioner("spectral", args.device).embed
    cond = torch.from_numpy(np.stack([embed(prepare(decode(r), CLAP_RATE)) for r in refs])).float()
    cond = cond.to(args.device)
    pipe = load_aar().to(args.device).eval()
    B = cond.shape[0]

    def run(rows: torch.Tensor):
        if args.graphs:
            return GraphedGenerator(pipe, rows.shape[0])(rows, seed=[args.seed] * rows.shape[0])
        return generate(pipe, rows, seed=[args.seed] * rows.shape[0])

    for spec in args.codecs.split(","):
        codec, _, bits = spec.partition("@")
        with compressed_kv(pipe, codec, int(bits or 16)) if codec != "none" else _nothing():
            start = time.perf_counter()
            ones = [run(cond[i:i + 1]) for i in range(B)]
            t1 = time.perf_counter() - start
            start = time.perf_counter()
            many = run(cond)
            tb = time.perf_counter() - start
        differ = [sum(int((o.tokens[si][0] != many.tokens[si][i]).sum()) for si in range(len(o.tokens)))
                  for i, o in enumerate(ones)]
        total = sum(t.shape[1] for t in many.tokens)
        audio = max(float((o.audio[0] - many.audio[i]).abs().max()) for i, o in enumerate(ones))
        where = f"{args.device}{' graphs' if args.graphs else ''}"
        print(f"{spec}: B={B} on {where}: clips with a differing token {sum(d > 0 for d in differ)}/{B}, "
              f"tokens differing {sum(differ)}/{B * total}, max |audio diff| {audio:.3g}; "
              f"{B} x B=1 {t1:.2f} s, one B={B} {tb:.2f} s")


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
