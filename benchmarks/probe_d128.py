"""GPU probe of the d=128 query-block defect (issue 3): the failing test cases under launch variants, and
small kernels that isolate the tensor-core patterns the d=128 path uses. Writes probe_d128.{json,md} to --out.

Run from the repository root on the device (no editable install there):
    for p in kernels aar_patch eval; do ln -sfn $PWD/$p octopus_audio/$p; done
    PYTHONPATH=$PWD python3 benchmarks/probe_d128.py --out $OUT
The cases are tests/test_kernels_attention.py's `*-b3-q128-L455-w1-d128-g1-bf16` (same generator, seed and
tolerance, rebuilt here): turboquant-mse, polarquant, turboquant-qjl and octopus-qjl fail compiled on the H200
(relative RMS error 1.6e-2..2.3e-2 against 2e-3) while octopus passes; turboquant-mse b=2 (2-bit codes cut by
shifts, no gather) is added. Each variant changes one thing (AttnConfig field, split count or query dtype)
from the launch the failing tests got (score_halves=False unless the variant says otherwise);
the pattern kernels check one tl.dot shape each against torch (exact products, fp32 sums: 1e-4).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing
import os
import time
from pathlib import Path

CASES = [("turboquant-mse", 3), ("polarquant", 3), ("turboquant-qjl", 3), ("octopus-qjl", 3), ("octopus", 3),
         ("turboquant-mse", 2)]
TQ, LENGTH, WINDOW, D = 128, 455, 1, 128
# (label, AttnConfig kwargs, forced num_splits, query dtype)
VARIANTS = [
    ("default (m64 n32 w4, bf16 operands)", {}, None, "bfloat16"),
    ("operands=ieee (fp32 FMA scores and P.V)", dict(operands="ieee"), None, "bfloat16"),
    ("operands=tf32", dict(operands="tf32"), None, "bfloat16"),
    ("projection=ieee (fp32 query projection)", dict(projection="ieee"), None, "bfloat16"),
    ("projection=ieee + operands=ieee", dict(projection="ieee", operands="ieee"), None, "bfloat16"),
    ("score_halves (64-deep score dots)", dict(score_halves=True), None, "bfloat16"),
    ("score_halves + projection=ieee", dict(score_halves=True, projection="ieee"), None, "bfloat16"),
    ("host_projection (projected q read from memory)", dict(host_projection=True), None, "bfloat16"),
    ("host_projection + score_halves", dict(host_projection=True, score_halves=True), None, "bfloat16"),
    ("block_m=16 (mma.sync, no wgmma)", dict(block_m=16), None, "bfloat16"),
    ("block_m=32 (mma.sync, no wgmma)", dict(block_m=32), None, "bfloat16"),
    ("block_m=128 w4", dict(block_m=128, num_warps=4), None, "bfloat16"),
    ("block_m=128 w8", dict(block_m=128, num_warps=8), None, "bfloat16"),
    ("block_n=16", dict(block_n=16), None, "bfloat16"),
    ("block_n=64", dict(block_n=64), None, "bfloat16"),
    ("block_n=128", dict(block_n=128), None, "bfloat16"),
    ("num_warps=8", dict(num_warps=8), None, "bfloat16"),
    ("gathered codes (tile_words=False)", dict(tile_words=False), None, "bfloat16"),
    ("num_stages=2", dict(num_stages=2), None, "bfloat16"),
    ("one split (num_splits=1, no merge)", {}, 1, "bfloat16"),
    ("window rides the last split", dict(window_split=False), None, "bfloat16"),
    ("fp16 queries", {}, None, "float16"),
    ("fp32 queries (ieee)", {}, None, "float32"),
]
TOL = {"float32": 1e-4, "bfloat16": 2e-3, "float16": 5e-4}
DEVICE = "cuda"  # --cpu-check: "cpu" with the Triton interpreter


@functools.cache
def _make_case(name: str, bits: int, dtype_name: str, seed: int = 3):
    """tests/test_kernels_attention.make_case + reference for the q128-L455-w1-d128-g1 shape: random packed
    codes, a one-token window; the float64 decode-then-softmax reference (CPU)."""
    import torch

    from octopus_audio.codecs import get_codec
    from octopus_audio.codecs.base import KeyState
    from octopus_audio.values import ValueQuantizer, ValueState

    dtype = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(seed)
    codec = get_codec(name, bits, D, seed=seed + 1)
    quant = ValueQuantizer(bits, D)
    cap = LENGTH + 3

    def words(n):
        return torch.randint(-2**31, 2**31, (1, 1, cap, n), generator=g, dtype=torch.int64).to(torch.int32)

    def positive(scale, dtype_):
        return (torch.rand(1, 1, cap, generator=g) * scale + 0.1 * scale).to(dtype_)

    ks = KeyState(dtype=dtype, codes=words(codec.code_words), gamma=positive(math.sqrt(D), torch.bfloat16),
                  signs=words(-(-D // 32)) if codec.qjl else None,
                  gamma_r=positive(0.3, torch.bfloat16) if codec.qjl else None)
    vs = ValueState(dtype=dtype, codes=words(-(-D * bits // 32)),
                    scale=(torch.rand(1, 1, cap, D // 16, generator=g) / 2**bits).half(),
                    minimum=(torch.randn(1, 1, cap, D // 16, generator=g) - 0.5).half())
    q = (torch.randn(1, 1, TQ, D, generator=g) * 2 / math.sqrt(D)).to(dtype)
    k_win = torch.randn(1, 1, WINDOW, D, generator=g).to(dtype)
    v_win = torch.randn(1, 1, WINDOW, D, generator=g).to(dtype)
    scale = 0.7 / math.sqrt(D)
    k_all = torch.cat([codec.decode(ks.slice_t(0, LENGTH), torch.float32).double(), k_win.double()], 2)
    v_all = torch.cat([quant.decode(vs.slice_t(0, LENGTH), torch.float32).double(), v_win.double()], 2)
    want = torch.softmax(q.double() @ k_all.mT * scale, -1) @ v_all
    return codec, quant, q, ks, vs, k_win, v_win, scale, want


def _run_case(case: int, variant: int):
    """(output on the GPU, float64 reference on the CPU) of one case under one variant."""
    import torch

    from octopus_audio import backend
    from octopus_audio.kernels import AttnConfig, PackedKeys, PackedValues, ops

    name, bits = CASES[case]
    _, kwargs, splits, dtype_name = VARIANTS[variant]
    codec, quant, q, ks, vs, k_win, v_win, scale, want = _make_case(name, bits, dtype_name)
    dev = torch.device(DEVICE)
    kc = backend.kernel_codec(codec, 1, dev)
    keys = PackedKeys(*[None if t is None else t.to(dev) for t in (ks.codes, ks.gamma, ks.signs, ks.gamma_r)])
    values = PackedValues(vs.codes.to(dev), vs.scale.to(dev), vs.minimum.to(dev), bits)
    got = ops.attention(q.to(dev), keys, values, LENGTH, k_win.to(dev), v_win.to(dev), kc, scale=scale,
                        num_splits=splits,
                        config=AttnConfig(**{"score_tables": False, "score_halves": False, **kwargs}))
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return got, want


def _rel(got, want) -> tuple[float, float]:
    """(relative RMS error, the error that rounding the reference to got's dtype makes by itself)."""
    floor = ((want.to(got.dtype).double() - want).norm() / want.norm()).item()
    return ((got.double().cpu() - want).norm() / want.norm()).item(), floor


def _warm(job) -> str:
    try:
        _run_case(*job)
        return ""
    except Exception as e:  # reported; the main process repeats the job and records it
        return f"{type(e).__name__}: {e}"


# ---- pattern kernels: one tl.dot shape each, M = 64 rows, 4 warps (one warpgroup), bf16 operands ----

def _pattern_kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def proj_kernel(q_ptr, m_ptr, o_ptr, K: tl.constexpr, N: tl.constexpr):
        """o = q [64, K] @ M [K, N], both loaded bf16 (the prologue's query projection)."""
        r = tl.arange(0, 64)[:, None]
        k = tl.arange(0, K)
        n = tl.arange(0, N)[None, :]
        q = tl.load(q_ptr + r * K + k[None, :])
        m = tl.load(m_ptr + k[:, None] * N + n)
        tl.store(o_ptr + r * N + n, tl.dot(q, m))

    @triton.jit
    def chain_kernel(q_ptr, m_ptr, x_ptr, g_ptr, o_ptr, c, K: tl.constexpr, N: tl.constexpr, BN: tl.constexpr,
                     CHAIN: tl.constexpr, TWICE: tl.constexpr, RNE_BY_HAND: tl.constexpr):
        """A [64, N] bf16 = (q @ M * c) (CHAIN: a dot's result in registers) or (x0 * c) loaded; B [BN, N]
        bf16 = x * g decoded in registers; o = A @ B^T (the score dot of the compressed loop), TWICE: twice,
        chained through one accumulator (as the score terms are)."""
        r = tl.arange(0, 64)[:, None]
        k = tl.arange(0, K)
        n = tl.arange(0, N)
        if CHAIN:
            q = tl.load(q_ptr + r * K + k[None, :])
            m = tl.load(m_ptr + k[:, None] * N + n[None, :])
            a = tl.dot(q, m) * c
        else:
            a = tl.load(q_ptr + r * N + n[None, :]).to(tl.float32) * c
        j = tl.arange(0, BN)[:, None]
        b = tl.load(x_ptr + j * N + n[None, :]) * tl.load(g_ptr + j)
        if RNE_BY_HAND:  # the interpreter's fp32 -> bf16 cast truncates: round to nearest even on the bits
            ab = a.to(tl.int32, bitcast=True)
            a = ((ab + 0x7FFF + ((ab >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
            bb = b.to(tl.int32, bitcast=True)
            b = ((bb + 0x7FFF + ((bb >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
        a = a.to(tl.bfloat16)
        b = b.to(tl.bfloat16)
        o = tl.dot(a, tl.trans(b))
        if TWICE:
            o = tl.dot(a, tl.trans(b), o)
        tl.store(o_ptr + r * BN + tl.arange(0, BN)[None, :], o)

    return proj_kernel, chain_kernel


def _patterns() -> list[dict]:
    import torch

    proj_kernel, chain_kernel = _pattern_kernels()
    dev = torch.device(DEVICE)
    if DEVICE == "cpu":
        from octopus_audio.kernels.launch import _interpreter_16bit_dot

        _interpreter_16bit_dot()
    g = torch.Generator(device=dev).manual_seed(5)
    rows = []

    def check(label, got, want):
        rel = ((got.double() - want.double()).norm() / want.double().norm()).item()
        rows.append({"pattern": label, "rel_rms": rel, "ok": rel <= 1e-4})
        print(f"pattern {label}: rel {rel:.2e} {'ok' if rel <= 1e-4 else 'WRONG'}", flush=True)

    for n in (64, 128):
        try:
            q = torch.randn(64, 128, generator=g, device=dev).bfloat16()
            m = torch.randint(-3, 4, (128, n), generator=g, device=dev).bfloat16()
            o = torch.empty(64, n, device=dev)
            proj_kernel[(1,)](q, m, o, K=128, N=n, num_warps=4)
            check(f"projection q[64,128] @ M[128,{n}] (SS wgmma)", o, q.float() @ m.float())
        except Exception as e:
            rows.append({"pattern": f"projection N={n}", "error": f"{type(e).__name__}: {e}", "ok": False})
    shapes = [(c, n, bn, False) for c in (True, False) for n in (64, 128) for bn in (32, 64)]
    for chain, n, bn, twice in shapes + [(True, 64, 32, True), (True, 128, 32, True)]:
        label = (f"{'dot->bf16' if chain else 'loaded*c->bf16'} A[64,{n}] @ decoded B[{bn},{n}]^T (RS wgmma)"
                 f"{', twice into one accumulator' if twice else ''}")
        try:
            q = torch.randn(64, 128, generator=g, device=dev).bfloat16()
            m = torch.randint(-3, 4, (128, n), generator=g, device=dev).bfloat16()
            x0 = torch.randn(64, n, generator=g, device=dev).bfloat16()
            x = torch.randn(bn, n, generator=g, device=dev)
            gam = torch.rand(bn, generator=g, device=dev) + 0.5
            o = torch.empty(64, bn, device=dev)
            c = 0.37
            chain_kernel[(1,)](q if chain else x0, m, x, gam, o, c, K=128, N=n, BN=bn, CHAIN=chain,
                               TWICE=twice, RNE_BY_HAND=DEVICE == "cpu", num_warps=4)
            a = ((q.float() @ m.float()) * c) if chain else x0.float() * c
            want = a.bfloat16().float() @ (x * gam[:, None]).bfloat16().float().T
            check(label, o, want * (2 if twice else 1))
        except Exception as e:
            rows.append({"pattern": label, "error": f"{type(e).__name__}: {e}", "ok": False})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for probe_d128.json and .md")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1),
                    help="processes compiling in parallel first (0: compile in the main process)")
    ap.add_argument("--cpu-check", action="store_true",
                    help="check this script on the CPU: Triton interpreter, the first two variants and cases")
    args = ap.parse_args()
    global DEVICE, VARIANTS, CASES
    if args.cpu_check:
        os.environ["TRITON_INTERPRET"] = "1"
        DEVICE, VARIANTS, CASES, args.workers = "cpu", VARIANTS[:2], CASES[:2], 0
    import torch
    import triton

    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise SystemExit("this probe needs a CUDA GPU (or --cpu-check)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    patterns = _patterns()
    jobs = [(c, v) for v in range(len(VARIANTS)) for c in range(len(CASES))]
    warm_errors = {}
    if args.workers > 0:
        print(f"compiling {len(jobs)} jobs in {args.workers} processes ...", flush=True)
        with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
            warm_errors = {j: e for j, e in zip(jobs, pool.map(_warm, jobs, chunksize=1), strict=True) if e}
        for j, e in warm_errors.items():
            print(f"  warm-up error {j}: {e[:300]}", flush=True)
    print(f"compiled in {time.time() - t0:.0f} s", flush=True)

    rows = []
    for v, (label, _, _, dtype_name) in enumerate(VARIANTS):
        for c, (name, bits) in enumerate(CASES):
            row = {"variant": label, "codec": name, "bits": bits, "dtype": dtype_name}
            try:
                got, want = _run_case(c, v)
                row["rel_rms"], row["floor"] = _rel(got, want)
                row["ok"] = row["rel_rms"] <= TOL[dtype_name] + row["floor"]
            except Exception as e:
                row["error"], row["ok"] = f"{type(e).__name__}: {e}", False
            rows.append(row)
            print(f"{label} | {name} b={bits}: " + (row.get("error", "")[:200] or
                  f"rel {row['rel_rms']:.2e} {'ok' if row['ok'] else 'FAIL'}"), flush=True)

    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (interpreter)"
    meta = {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__,
            "commit": os.environ.get("OCTOPUS_AUDIO_COMMIT", ""), "total_s": round(time.time() - t0, 1),
            "warm_up_errors": {repr(k): v for k, v in warm_errors.items()}}
    (out / "probe_d128.json").write_text(json.dumps({"meta": meta, "patterns": patterns, "rows": rows},
                                                    indent=1, default=str))
    names = [f"{n} b={b}" for n, b in CASES]
    md = [f"GPU {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, {meta['total_s']} s",
          "", "relative RMS error against the float64 reference (FAIL: above tol + bf16 rounding floor)", "",
          "| variant | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for label, *_ in VARIANTS:
        cells = []
        for r in (r for r in rows if r["variant"] == label):
            cells.append(f"error {r['error'][:40]}" if "error" in r else
                         f"{r['rel_rms']:.1e}{'' if r['ok'] else ' FAIL'}")
        md.append(f"| {label} | " + " | ".join(cells) + " |")
    md += ["", "| pattern kernel | rel RMS | ok |", "| --- | --- | --- |"]
    md += [f"| {p['pattern']} | {p.get('rel_rms', float('nan')):.1e} | {p['ok']}"
           f"{' ' + p['error'][:80] if 'error' in p else ''} |" for p in patterns]
    (out / "probe_d128.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    print(f"total {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
