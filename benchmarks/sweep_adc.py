"""GPU sweep of the single-query score-table attention (kernels/adc_*.py) at 128k keys: value-loop variants x
launch configurations against bf16 SDPA, each variant checked against a float64 reference on the GPU.

Run from the repository root on a CUDA machine (package folders linked as the device notes say):
    python3 benchmarks/sweep_adc.py --out OUT [--rep-ms 20] [--budget-s 90]
Per head dim (d=128 x 32 heads, d=64 x 16 heads; 1 query, 131071 compressed keys + 1 window key, octopus b=2):
1. correctness against float64 attention over the library's fp32 decode (relative RMS error; a row says FAIL
   and the script exits 1 past the tolerance): the default variant with fp32 query and window (< 1e-4),
   every variant with the timed bf16 inputs (< 2e-3 + the reference's own bf16 rounding);
2. timing (bf16 queries, as `octopus-audio bench`): variants x (block_k, block_v, warps, split count),
   and the ops.attention default path; the best row again with the value phase off (probe 1) and with no
   table reads (probe 2), and per-kernel GPU times of the best row from torch.profiler;
3. octopus b=3, b=4 and octopus-qjl b=2 at d=128 (old and new value loop) with the best d=128 launch, checked
   too.
Variants: `shift` = the first kernel (value loop of 5 instructions a channel, all scores of a split first,
one code word a load, loads sunk to their uses); `new default` = attention_adc's defaults (codes masked in
place as subnormals, 2 a channel; 2 groups of a key per thread row; stages of 1024 keys; code words in
pairs; table reads gated on all of a step's loads; 80 registers where a thread holds one value row); the
others change one of those. Every variant runs at the default launch; the two fastest then at the other
launches.
Writes OUT/sweep_adc.json and OUT/sweep_adc.md; stops timing new configurations past --budget-s.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from octopus_audio.bench import AttnShape, Job, _attention_inputs, _bench, _sdpa_inputs
from octopus_audio.kernels import adc_ops, ops

LENGTH = 131071  # + 1 window key = 128k keys
SHAPES = [(128, 32), (64, 16)]
VARIANTS = {"shift": dict(value_loop="shift", value_groups=1, stage_keys=0, word_pairs=False,
                          gate_loads=False),
            "new default": dict(),
            "new, no register cap": dict(max_registers=0),
            "new, ungated loads": dict(gate_loads=False),
            "new, one stage": dict(stage_keys=0),
            "new, stages of 4096": dict(stage_keys=4096)}
D64_VARIANTS = ("shift", "new default", "new, ungated loads")  # fewer compiles at d=64 (the target is d=128)
# (block_k, block_v, warps, splits): the first is ops.attention's default at 128k keys (4 programs per SM at
# d=128: 17 splits x 32 rows; 8 at d=64: 66 x 16); the others fill 2 or 3 programs of 8 warps per SM in one
# wave (the gated kernel takes 80 registers at d=128 under the default cap: 3 programs of 8 warps an SM; 99
# uncapped: 2)
LAUNCHES = {128: [(256, 64, 8, 17), (256, 64, 8, 8), (256, 64, 8, 12), (256, 64, 8, 16), (512, 64, 8, 8),
                  (128, 64, 4, 16)],
            64: [(128, 64, 4, 66), (128, 64, 4, 33), (128, 64, 4, 25), (256, 64, 8, 16)]}
TOL, TOL_BF16 = 1e-4, 2e-3


def reference64(inputs, length):
    """float64 softmax(q.K/sqrt(d)) V over the library's fp32 decode of the store plus the window."""
    lib, quant, ks, vs, q, k_win, v_win, keys, values, kc = inputs
    d = q.shape[-1]
    k = torch.cat([lib.decode(ks, torch.float32).double(), k_win.double()], 2)
    s = torch.einsum("bhqd,bhnd->bhqn", q.double(), k) / math.sqrt(d)
    del k
    p = torch.softmax(s, -1)
    v = torch.cat([quant.decode(vs, torch.float32).double(), v_win.double()], 2)
    out = torch.einsum("bhqn,bhnd->bhqd", p, v)
    assert out.shape == q.shape and ks.codes.shape[2] == length
    return out


def rel_err(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


def sdpa_time(shape, dev, rep_ms):
    q0, k0, v0 = _sdpa_inputs(shape, dev)
    return _bench(lambda: F.scaled_dot_product_attention(q0, k0, v0), rep_ms)


def kernel_times(fn, reps=20):
    """Mean GPU microseconds per call of each kernel fn launches (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        return {}
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    times = {}
    for e in prof.key_averages():
        total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if total and e.count:
            times[e.key[:60]] = round(total / reps, 2)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rep-ms", type=float, default=20.0)
    ap.add_argument("--budget-s", type=float, default=90.0)
    ap.add_argument("--length", type=int, default=LENGTH, help="compressed keys (smoke runs only)")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1 (no timing)")
    args = ap.parse_args()
    length = args.length
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    dev = torch.device(args.device)
    rows, checks, profiles = [], [], {}
    best_d128 = None

    def log(msg):
        print(f"[{time.time() - t0:6.1f} s] {msg}", flush=True)

    def check(label, codec, bits, d, inputs, want, variant, launch, fp32=False):
        """fp32: fp32 query and window (another compile), within TOL; else the timed bf16 call, within
        TOL_BF16 plus the bf16 rounding of the reference itself (as tests/test_kernels_adc.py)."""
        lib, quant, ks, vs, q, k_win, v_win, keys, values, kc = inputs
        bk, bv, nw, splits = launch
        if fp32:
            q, k_win, v_win = q.float(), k_win.float(), v_win.float()
        got = adc_ops.attention_adc(q, keys, values, length, k_win, v_win, kc, block_k=bk, block_v=bv,
                                    num_warps=nw, num_splits=splits, **VARIANTS[variant])
        err = rel_err(got, want)
        tol = TOL if fp32 else TOL_BF16 + rel_err(want.to(torch.bfloat16), want)
        checks.append(dict(label=label + (" fp32" if fp32 else " bf16"), codec=codec, bits=bits, d=d,
                           variant=variant, rel_err=err, tol=tol, ok=err < tol))
        verdict = "ok" if err < tol else "FAIL"
        log(f"check {label} {'fp32' if fp32 else 'bf16'} {codec} b={bits} d={d} {variant}: rel err {err:.2e} "
            f"(tolerance {tol:.1e}) {verdict}")

    def time_row(codec, bits, d, heads, inputs, sdpa_ms, variant, launch, probe=0):
        lib, quant, ks, vs, q, k_win, v_win, keys, values, kc = inputs
        bk, bv, nw, splits = launch
        cfg = dict(block_k=bk, block_v=bv, num_warps=nw, num_splits=splits, _probe=probe)
        if variant == "ops.attention default":
            fn = lambda: ops.attention(q, keys, values, length, k_win, v_win, kc)  # noqa: E731
        else:
            cfg.update(VARIANTS[variant])
            fn = lambda: adc_ops.attention_adc(q, keys, values, length, k_win, v_win, kc, **cfg)  # noqa: E731
        try:
            fn()
            ms = _bench(fn, args.rep_ms)
        except Exception as e:  # a launch that does not compile or fit is reported, the sweep goes on
            log(f"{codec} b={bits} d={d} {variant} {launch} failed: {type(e).__name__}: {e}")
            return None
        row = dict(codec=codec, bits=bits, d=d, heads=heads, keys=length + 1, variant=variant, block_k=bk,
                   block_v=bv, warps=nw, splits=splits, probe=probe, ms=ms, sdpa_ms=sdpa_ms,
                   x_sdpa=sdpa_ms / ms)
        rows.append(row)
        log(f"{codec} b={bits} d={d} {variant:22s} {launch} probe={probe}: {ms:.4f} ms "
            f"({sdpa_ms / ms:.2f}x SDPA)")
        return row, fn

    for d, heads in SHAPES:
        shape = AttnShape(f"1 q x 128k, d={d}", 1, heads, 1, length, 1, d)
        inputs = _attention_inputs(Job("attention", "octopus", 2, shape), dev)
        sdpa_ms = sdpa_time(shape, dev, args.rep_ms)
        log(f"d={d} x {heads} heads: bf16 SDPA {sdpa_ms:.4f} ms")
        want = reference64((*inputs[:4], inputs[4].float(), *inputs[5:]), length)
        check(f"{length + 1} keys", "octopus", 2, d, inputs, want, "new default", LAUNCHES[d][0], fp32=True)
        for variant in VARIANTS if d == 128 else D64_VARIANTS:
            check(f"{length + 1} keys", "octopus", 2, d, inputs, want, variant, LAUNCHES[d][0])
        del want
        torch.cuda.empty_cache()
        timed = [time_row("octopus", 2, d, heads, inputs, sdpa_ms, "ops.attention default", (0, 0, 0, 0))]
        for variant in VARIANTS if d == 128 else D64_VARIANTS:
            timed.append(time_row("octopus", 2, d, heads, inputs, sdpa_ms, variant, LAUNCHES[d][0]))
        ranked = sorted((t[0] for t in timed if t is not None and t[0]["variant"] in VARIANTS),
                        key=lambda r: r["ms"])
        for launch in LAUNCHES[d][1:]:
            if time.time() - t0 > args.budget_s * (0.45 if d == 128 else 0.8):
                log(f"budget: skipping launch {launch} and later ones at d={d}")
                break
            for row in ranked[:2]:
                timed.append(time_row("octopus", 2, d, heads, inputs, sdpa_ms, row["variant"], launch))
        timed = [t for t in timed if t is not None]
        best_row, best_fn = min(timed, key=lambda t: t[0]["ms"])
        log(f"best d={d}: {best_row}")
        variant, launch = best_row["variant"], (best_row["block_k"], best_row["block_v"], best_row["warps"],
                                                best_row["splits"])
        if variant == "ops.attention default":  # the same kernel as the default variant at the first launch
            variant, launch = "new default", LAUNCHES[d][0]
        for probe in (1, 2):
            time_row("octopus", 2, d, heads, inputs, sdpa_ms, variant, launch, probe)
        if d == 128:
            best_d128 = (variant, launch)
        profiles[f"d={d} {best_row['variant']}"] = kernel_times(best_fn)
        log(f"kernel GPU us per call: {profiles[f'd={d} ' + best_row['variant']]}")
        del inputs
        torch.cuda.empty_cache()

    if best_d128 is not None:
        variant, launch = best_d128
        shape = AttnShape("1 q x 128k, d=128", 1, 32, 1, length, 1, 128)
        sdpa_ms = sdpa_time(shape, dev, args.rep_ms)
        for codec, bits in (("octopus", 3), ("octopus", 4), ("octopus-qjl", 2)):
            if time.time() - t0 > args.budget_s:
                log(f"budget: skipping {codec} b={bits}")
                continue
            inputs = _attention_inputs(Job("attention", codec, bits, shape), dev)
            want = reference64((*inputs[:4], inputs[4].float(), *inputs[5:]), length)
            check(f"{length + 1} keys", codec, bits, 128, inputs, want, "new default", launch, fp32=True)
            for v in dict.fromkeys(("shift", variant)):
                check(f"{length + 1} keys", codec, bits, 128, inputs, want, v, launch)
            del want
            torch.cuda.empty_cache()
            for v in dict.fromkeys(("shift", variant)):
                time_row(codec, bits, 128, 32, inputs, sdpa_ms, v, launch)
            del inputs
            torch.cuda.empty_cache()

    failed = [c for c in checks if not c["ok"]]
    (args.out / "sweep_adc.json").write_text(json.dumps(
        {"rows": rows, "checks": checks, "kernel_us": profiles, "seconds": time.time() - t0}, indent=1))
    lines = ["| codec | b | d | heads | variant | block_k | block_v | warps | splits | probe | ms | SDPA ms "
             "| x SDPA |", "|" + " --- |" * 13]
    for r in rows:
        probe = {0: "", 1: "no values", 2: "no table reads"}[r["probe"]]
        lines.append(f"| {r['codec']} | {r['bits']} | {r['d']} | {r['heads']} | {r['variant']} | "
                     f"{r['block_k']} | {r['block_v']} | {r['warps']} | {r['splits']} | {probe} | "
                     f"{r['ms']:.4f} | {r['sdpa_ms']:.4f} | {r['x_sdpa']:.2f} |")
    lines += ["", "| check | codec | b | d | variant | rel err (float64 ref) | tolerance | ok |",
              "|" + " --- |" * 8]
    for c in checks:
        lines.append(f"| {c['label']} | {c['codec']} | {c['bits']} | {c['d']} | {c['variant']} | "
                     f"{c['rel_err']:.2e} | {c['tol']:.1e} | {'ok' if c['ok'] else 'FAIL'} |")
    lines += ["", "kernel GPU us per call (torch.profiler):"]
    lines += [f"- {k}: {v}" for k, v in profiles.items()]
    (args.out / "sweep_adc.md").write_text("\n".join(lines) + "\n")
    log(f"done; {len(failed)} failed checks" + (f": {failed}" if failed else ""))
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
