"""Host time of `CompressedKVCache.attend` on the CPU with every Triton launch stubbed out: what our Python
costs a call before the launch itself (the interpreter's `run` replaced by a no-op, so nothing executes).
Minimum over 30 repeats of 300 calls, in microseconds, for octopus and turboquant-mse b=2 at two shapes:
`q1` (1 query x 8k keys, 16 heads, d=64: the score-table path) and `aar1` (AAR B=1: 2 rows x 16 heads, 75
queries x 455 keys: the split-K path). Runs in any checkout: for an older tree put it first on PYTHONPATH
(and select the kernels as that tree does, e.g. OCTOPUS_AUDIO_BACKEND=triton before the selector existed).

    OCTOPUS_AUDIO_KERNELS=kernels python benchmarks/lab/host_time_stubbed.py
"""

import inspect
import os
import time

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton.runtime.interpreter as interpreter  # noqa: E402

interpreter.InterpretedFunction.run = lambda self, *a, **k: None  # every launch a no-op

from octopus_audio import CompressedKVCache  # noqa: E402

AAR_UNITS = [1, 2, 4, 6, 9, 12, 16, 20, 25, 30, 36, 42, 49, 56, 64, 75]
SHAPES = {"q1": ([8192, 1], 1, 16, 1), "aar1": (AAR_UNITS, 2, 16, 75)}  # units, rows, heads, queries


def best_us(codec: str, shape: str, repeats: int = 30, calls: int = 300) -> float:
    units, rows, heads, tq = SHAPES[shape]
    deferred = "defer_checks" in inspect.signature(CompressedKVCache).parameters  # as on CUDA: no data checks
    cache = CompressedKVCache(codec, 2, 64, window=1, **({"defer_checks": True} if deferred else {}))
    g = torch.Generator().manual_seed(0)
    for n in units:
        k = torch.nn.functional.normalize(torch.randn(rows, heads, n, 64, generator=g), dim=-1)
        cache.append(k.bfloat16(), torch.randn(rows, heads, n, 64, generator=g).bfloat16())
    q = torch.randn(rows, heads, tq, 64, generator=g).bfloat16()
    for _ in range(calls):
        cache.attend(q, 1.0)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            cache.attend(q, 1.0)
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


if __name__ == "__main__":
    print(" | ".join(f"{c} {s} {best_us(c, s):.1f}" for c in ("octopus", "turboquant-mse") for s in SHAPES))
