"""GPU probe: what bounds the query-block attention at AAR shapes.

Shape: 75 queries against 380 compressed + 75 native keys, d=64, 2B rows x 16 heads.

Times (medians of triton.testing.do_bench, L2 flushed), each against the same bf16 inputs:
- `sdpa default`: torch SDPA as the patch's `none` path calls it (on an H200: cuDNN's wgmma flash kernel);
  `sdpa flash` / `sdpa efficient`: the FlashAttention-2 and memory-efficient backends forced;
- `ours octopus b=2`: the library's attention over the compressed store plus the window (what the patch runs);
- `ours turboquant-mse b=2`: the same with the cheapest key decode (a centroid lookup);
- `ours window only`: the same kernel with an empty store and all 455 keys in the native bf16 window - its
  flash loop with no decode at all, i.e. what the Triton kernel structure costs before any codec work.
If `ours window only` is already far from `sdpa default`, the gap is the kernel structure (Triton's mma on
register operands vs cuDNN's warp-specialised wgmma pipeline), not the decode.
The `... 64 q` cases take the first 64 of the 75 queries: the query block then fits 64 rows instead of 75
padded to 128, which prices the padding (the share of the time that scales with the rows, not the keys).

    PYTHONPATH=$PWD python3 benchmarks/lab/probe_aar_bound.py --out $OUT/bound
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

ROWS_PER_B, HEADS, TQ, T_COMP, T_WIN, D = 2, 16, 75, 380, 75, 64


def _inputs(codec_name: str, bits: int, batch: int, gen: torch.Generator):
    from octopus_audio.apps.bench import AttnShape, _random_store
    from octopus_audio.cache import kernel_codec
    from octopus_audio.codecs import get_codec
    from octopus_audio.kernels import PackedKeys, PackedValues

    shape = AttnShape(f"AAR B={batch}", ROWS_PER_B * batch, HEADS, TQ, T_COMP, T_WIN, D)
    codec = get_codec(codec_name, bits, D)
    ks, vs = _random_store(shape, codec, bits, gen, torch.device("cuda"))
    keys = PackedKeys(ks.codes, ks.gamma, ks.signs, ks.gamma_r)
    values = PackedValues(vs.codes, vs.scale, vs.minimum, bits)
    return keys, values, kernel_codec(codec, HEADS, torch.device("cuda"))


def _cases(batch: int, gen: torch.Generator):
    """The timed calls at one batch, and the bf16 q, K, V they share."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from octopus_audio.kernels import ops

    r = ROWS_PER_B * batch
    q = torch.randn(r, HEADS, TQ, D, generator=gen, device="cuda").bfloat16()
    k_all = torch.randn(r, HEADS, T_COMP + T_WIN, D, generator=gen, device="cuda").bfloat16()
    v_all = torch.randn(r, HEADS, T_COMP + T_WIN, D, generator=gen, device="cuda").bfloat16()
    k_win, v_win = k_all[:, :, T_COMP:].contiguous(), v_all[:, :, T_COMP:].contiguous()
    oct_keys, oct_values, oct_kc = _inputs("octopus", 2, batch, gen)
    tq_keys, tq_values, tq_kc = _inputs("turboquant-mse", 2, batch, gen)
    empty_keys, empty_values, _ = _inputs("turboquant-mse", 2, batch, gen)
    q64 = q[:, :, :64].contiguous()

    def sdpa(backend=None):
        if backend is None:
            return lambda: F.scaled_dot_product_attention(q, k_all, v_all)

        def run():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k_all, v_all)
        return run

    cases = {
        "sdpa default": sdpa(),
        "sdpa flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION),
        "ours octopus b=2": lambda: ops.attention(q, oct_keys, oct_values, T_COMP, k_win, v_win, oct_kc),
        "ours turboquant-mse b=2": lambda: ops.attention(q, tq_keys, tq_values, T_COMP, k_win, v_win, tq_kc),
        "ours window only": lambda: ops.attention(q, empty_keys, empty_values, 0, k_all, v_all, tq_kc),
        "sdpa default 64 q": lambda: F.scaled_dot_product_attention(q64, k_all, v_all),
        "ours octopus b=2 64 q": lambda: ops.attention(q64, oct_keys, oct_values, T_COMP, k_win, v_win,
                                                       oct_kc),
        "ours window only 64 q": lambda: ops.attention(q64, empty_keys, empty_values, 0, k_all, v_all, tq_kc),
    }
    return cases, (q, k_all, v_all)


def compiled_variants() -> list[dict]:
    """Registers, spills, warps and shared bytes of every variant of the attention kernel compiled so far."""
    from octopus_audio.kernels.flash_decode import _attn_fwd_kernel

    return [{"registers": ck.n_regs, "spills": ck.n_spills, "warps": ck.metadata.num_warps,
             "shared": ck.metadata.shared}
            for cache in _attn_fwd_kernel.device_caches.values() for ck in cache[0].values()]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--batches", default="1,64,512")
    p.add_argument("--rep-ms", type=int, default=50)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device="cuda").manual_seed(7)
    rows, t0 = [], time.perf_counter()
    for batch in (int(b) for b in args.batches.split(",")):
        cases, (q, k_all, v_all) = _cases(batch, gen)
        want = F.scaled_dot_product_attention(q.float(), k_all.float(), v_all.float())
        got = cases["ours window only"]().float()
        err = ((got - want).norm() / want.norm()).item()
        base = None
        for name, fn in cases.items():
            try:
                ms = triton.testing.do_bench(fn, warmup=5, rep=args.rep_ms, return_mode="median")
            except RuntimeError as e:  # a forced SDPA backend that does not take this shape
                rows.append({"B": batch, "case": name, "error": str(e)[:200]})
                print(f"B={batch} {name}: {str(e)[:120]}", flush=True)
                continue
            base = ms if name == "sdpa default" else base
            row = {"B": batch, "case": name, "ms": ms, "x_sdpa": ms / base}
            if name == "ours window only":
                row["rel_err"] = err
            rows.append(row)
            print(f"[{time.perf_counter() - t0:5.1f}s] B={batch} {name}: {ms:.4f} ms = {ms / base:.2f}x SDPA"
                  + (f" (rel err {err:.1e})" if "rel_err" in row else ""), flush=True)
    compiled = compiled_variants()
    for c in compiled:
        print(f"compiled variant: {c}", flush=True)
    meta = {"gpu": torch.cuda.get_device_name(), "compiled": compiled, "torch": torch.__version__,
            "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d"), "seconds": time.perf_counter() - t0}
    (args.out / "probe_aar_bound.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# AAR-shape attention bound probe on {meta['gpu']} (torch {meta['torch']}, "
             f"triton {meta['triton']})",
             "", "| B | case | ms | x SDPA default |", "| ---: | --- | ---: | ---: |"]
    lines += [f"| {r['B']} | {r['case']} | {r['ms']:.4f} | {r['x_sdpa']:.2f} |" if "ms" in r
              else f"| {r['B']} | {r['case']} | - | {r['error'][:60]} |" for r in rows]
    (args.out / "probe_aar_bound.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
