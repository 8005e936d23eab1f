"""How many Triton kernel variants does one generation compile? Counted on the CPU with the launchers'
CUDA decisions (an H200's 132 SMs, CUDA device checks, deferred data checks, 16-bit operands): a cache is
driven over one sequence by `octopus_audio.aar_patch.compile_variants.cache_launches` with every launch
recorded, and each launch's variant derived for sm_90 as Triton derives it.

    python benchmarks/lab/count_variants.py [--codecs all] [--bits 2,3,4] [--by-kernel]

Rows: the embedded default model (4 heads, d=64, B=1: 2 rows with guidance; bf16 as generation runs on
CUDA, and fp32 as eval's teacher forcing runs) and the released AAR size (16 heads, d=64) at B=1 and B=64.
The CUDA decisions are imitated (no GPU here), so a count on the GPU (`compile_ahead` there) is the one to
trust; this script is for comparing kernel changes.
"""

from __future__ import annotations

import argparse
import collections
import os

os.environ.pop("TRITON_INTERPRET", None)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import torch  # noqa: E402

H200_SMS = 132
RELEASE_UNITS = (1, 2, 4, 6, 9, 12, 16, 20, 25, 31, 37, 43, 50, 58, 66, 75)


def _imitate_cuda() -> None:
    """The launchers' CUDA-only decisions on CPU tensors: the kernels as the backend (never run here), the
    SM count and the encode's device check."""
    from octopus_audio.cache import plan
    from octopus_audio.kernels import launch, select
    from octopus_audio.kernels.impls import encode, flash, score_tables

    plan.attention_backend = lambda device=None, codec=None: (
        "triton" if codec is None or (codec.compressed and codec.kernel_decode is not None) else "reference")

    for module in (launch, flash, encode, score_tables, select):
        module._sm_count = lambda device: H200_SMS
    inner = encode._encode_launch

    def encode_launch(d, config, codec, n_rows=None, device=None):
        return inner(d, config, codec, n_rows, torch.device("cuda") if device is not None else None)

    encode._encode_launch = encode_launch


def main() -> None:
    from triton.backends.compiler import GPUTarget

    from octopus_audio.aar_patch import compile_variants as compile_ahead
    from octopus_audio.codecs import kernel_codecs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--codecs", default="all")
    parser.add_argument("--bits", default="2,3,4")
    parser.add_argument("--by-kernel", action="store_true", help="also list the variants per kernel")
    args = parser.parse_args()
    _imitate_cuda()
    _, backend = compile_ahead.target_backend(GPUTarget("cuda", 90, 32))
    codecs = list(kernel_codecs()) if args.codecs == "all" else args.codecs.split(",")
    bits = [int(b) for b in args.bits.split(",")]
    models = {"default model (4 h, d=64, B=1)": compile_ahead.UnitShapes(4, 64, RELEASE_UNITS, 2),
              "default model, fp32 (teacher forcing)": compile_ahead.UnitShapes(4, 64, RELEASE_UNITS, 2,
                                                                                torch.float32),
              "AAR d16 (16 h, d=64, B=1)": compile_ahead.UnitShapes(16, 64, RELEASE_UNITS, 2),
              "AAR d16 (16 h, d=64, B=64)": compile_ahead.UnitShapes(16, 64, RELEASE_UNITS, 128)}
    print("| shapes | codec | b | variants | per kernel |")
    print("| --- | --- | --- | ---: | --- |")
    everything: dict[str, set] = collections.defaultdict(set)
    for label, shapes in models.items():
        for name in codecs:
            for b in bits:
                found = compile_ahead.cache_launches(name, b, shapes, "cpu", backend=backend,
                                                     defer_checks=True)
                everything[label].update(found)
                per = collections.Counter(launch.name for launch in found)
                print(f"| {label} | {name} | {b} | {len(found)} | "
                      + ", ".join(f"{k} {v}" for k, v in sorted(per.items())) + " |")
                if args.by_kernel:
                    for launch in found:
                        print(f"|  |  |  |  | {launch.label()} |")
    for label, found in everything.items():
        print(f"{label}: {len(found)} distinct variants over every codec and width")


if __name__ == "__main__":
    main()
