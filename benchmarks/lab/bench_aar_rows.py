"""GPU probe: `octopus-audio bench`'s attention rows at AAR B=64 and B=512 only (the public `cache.attend`,
graph-timed, SDPA beside it), optionally once per Gluon producer register count of one codec.

    PYTHONPATH=$PWD python3 benchmarks/lab/bench_aar_rows.py --out $OUT/aar
    PYTHONPATH=$PWD python3 benchmarks/lab/bench_aar_rows.py --out $OUT/ocj --codecs octopus-qjl \
        --producer-regs 80,88,96

Each run writes bench.md and bench.json under --out (under --out/p<regs> with --producer-regs).
"""

from __future__ import annotations

import argparse
import sys

AAR_ROWS = ("AAR B=64 ", "AAR B=512 ")


def main() -> int:
    from octopus_audio.apps import bench
    from octopus_audio.cli import main as cli
    from octopus_audio.kernels.impls.gluon import flash as gluon_flash
    from octopus_audio.kernels.impls.gluon.scope import codec_id

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--codecs", default="all")
    parser.add_argument("--bits", default="2")
    parser.add_argument("--producer-regs", default="",
                        help="comma list: the Gluon producer's registers for the single codec of --codecs")
    args = parser.parse_args()
    every = bench.attention_shapes
    bench.attention_shapes = lambda suite: [s for s in every(suite) if s.label.startswith(AAR_ROWS)]
    command = ["bench", "--suite", "quick", "--codecs", args.codecs, "--bits", args.bits, "--rep-ms", "20",
               "--no-encode"]
    if not args.producer_regs:
        return cli(command + ["--out", args.out])
    from octopus_audio import get_codec
    from octopus_audio.cache import kernel_codec

    kc = kernel_codec(get_codec(args.codecs, int(args.bits), 64), 16, "cpu")
    cid = codec_id(kc.kind, kc.has_qjl)
    for regs in (int(r) for r in args.producer_regs.split(",")):
        gluon_flash.PRODUCER_REGS[cid] = regs  # the warm-up workers would not see it: compile in process
        cli(command + ["--workers", "0", "--out", f"{args.out}/p{regs}"])
    return 0


if __name__ == "__main__":  # the bench's spawned warm-up workers import this file
    sys.exit(main())
