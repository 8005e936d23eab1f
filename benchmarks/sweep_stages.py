"""GPU sweep: software pipelining of the attention kernel's two loops at AAR shapes.

The kernel's default launch pipelines neither loop (num_stages 1; the 2026-11-30 sweep found num_stages=2 for
the whole kernel 4x slower at B=64). This sweep sets the depth of each loop alone (`AttnConfig.window_stages`
for the native window's loop, `store_stages` for the compressed store's), at the probe's shape
(probe_aar_bound.py: 75 or 64 queries against 380 compressed + 75 native keys, d=64, 2B rows x 16 heads),
for octopus b=2, turboquant-mse b=2 and the window-only case (all 455 keys native, no decode). Each row is
checked against the default launch's output on the same data (relative error; the same math, so it must be
at bf16 rounding level) and timed with triton.testing.do_bench (median).
Each config runs in its own process (a launch that faults kills only its row: an illegal address leaves the
CUDA context unusable), rows are appended to sweep_stages.jsonl as they finish.

    for p in kernels aar_patch eval; do ln -sfn $PWD/$p octopus_audio/$p; done
    PYTHONPATH=$PWD python3 benchmarks/sweep_stages.py --out $OUT/stages
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_aar_bound import HEADS, ROWS_PER_B, T_COMP, T_WIN, TQ, D, _inputs, compiled_variants  # noqa: E402

CONFIGS = {  # names without commas (--configs is a comma list)
    "default": {},
    "window 2": {"window_stages": 2},
    "window 3": {"window_stages": 3},
    "store 2": {"store_stages": 2},
    "store 3": {"store_stages": 3},
    "window 2 store 2": {"window_stages": 2, "store_stages": 2},
    "window 3 store 2 n32": {"window_stages": 3, "store_stages": 2, "block_n": 32},
    "store 2 n128 w8": {"store_stages": 2, "block_n": 128, "num_warps": 8},
}


def run_config(name: str, batches: list[int], rep_ms: int, log: Path) -> None:
    """Time one config on every batch, query count and case; append each row to `log`."""
    from octopus_audio.kernels import ops

    config = ops.AttnConfig(**CONFIGS[name])
    gen = torch.Generator(device="cuda").manual_seed(7)
    for batch in batches:
        r = ROWS_PER_B * batch
        q75 = torch.randn(r, HEADS, TQ, D, generator=gen, device="cuda").bfloat16()
        k_all = torch.randn(r, HEADS, T_COMP + T_WIN, D, generator=gen, device="cuda").bfloat16()
        v_all = torch.randn(r, HEADS, T_COMP + T_WIN, D, generator=gen, device="cuda").bfloat16()
        k_win, v_win = k_all[:, :, T_COMP:].contiguous(), v_all[:, :, T_COMP:].contiguous()
        stores = {c: _inputs(c, 2, batch, gen) for c in ("octopus", "turboquant-mse")}
        for tq in (TQ, 64):
            q = q75[:, :, :tq].contiguous()
            sdpa = lambda q=q, k=k_all, v=v_all: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
            sdpa_ms = triton.testing.do_bench(sdpa, warmup=5, rep=rep_ms, return_mode="median")
            for case in ("octopus b=2", "turboquant-mse b=2", "window only"):
                keys, values, kc = stores["turboquant-mse" if case == "window only" else case.split()[0]]
                length, kw, vw = (0, k_all, v_all) if case == "window only" else (T_COMP, k_win, v_win)

                def fn(q=q, keys=keys, values=values, length=length, kw=kw, vw=vw, kc=kc):
                    return ops.attention(q, keys, values, length, kw, vw, kc, config=config)
                want = ops.attention(q, keys, values, length, kw, vw, kc).float()
                out = fn().float()
                err = ((out - want).norm() / want.norm()).item()
                ms = triton.testing.do_bench(fn, warmup=5, rep=rep_ms, return_mode="median")
                row = {"B": batch, "tq": tq, "case": case, "config": name, "ms": ms, "x_sdpa": ms / sdpa_ms,
                       "rel_err": err}
                with log.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"B={batch} tq={tq} {case} {name}: {ms:.4f} ms = {ms / sdpa_ms:.2f}x SDPA "
                      f"(rel err {err:.1e})", flush=True)
    with log.open("a") as f:
        for variant in compiled_variants():
            f.write(json.dumps({"config": name, **variant}) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--batches", default="64,512")
    p.add_argument("--rep-ms", type=int, default=25)
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma list of: " + ", ".join(CONFIGS))
    p.add_argument("--one", help=argparse.SUPPRESS)  # the child process: run this config only
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "sweep_stages.jsonl"
    batches = [int(b) for b in args.batches.split(",")]
    if args.one:
        run_config(args.one, batches, args.rep_ms, log)
        return 0
    t0 = time.perf_counter()
    for name in args.configs.split(","):
        child = subprocess.run([sys.executable, __file__, "--out", str(args.out), "--batches", args.batches,
                                "--rep-ms", str(args.rep_ms), "--one", name], check=False)
        if child.returncode:
            with log.open("a") as f:
                f.write(json.dumps({"config": name, "error": f"exit {child.returncode}"}) + "\n")
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d"), "seconds": time.perf_counter() - t0}
    lines = [f"# Loop pipelining sweep on {meta['gpu']} (torch {meta['torch']}, triton {meta['triton']}, "
             f"{meta['date']}, {meta['seconds']:.0f} s)", "",
             "| B | queries | case | config | ms | x SDPA | rel err vs default |",
             "| ---: | ---: | --- | --- | ---: | ---: | ---: |"]
    lines += [f"| {r['B']} | {r['tq']} | {r['case']} | {r['config']} | {r['ms']:.4f} | {r['x_sdpa']:.2f} | "
              f"{r['rel_err']:.1e} |" for r in rows if "ms" in r]
    lines += ["", "failed configs and compiled variants:", ""]
    lines += [f"- {r}" for r in rows if "ms" not in r]
    (args.out / "sweep_stages.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
