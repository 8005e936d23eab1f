"""GPU sweep of the encode kernels: exactness against the library's encode on the same GPU, then timings per
EncodeConfig (the previous default, the current default, a few alternatives), GB/s on bytes read + written and
the fraction of measured device-to-device copy bandwidth; the fused unit encode checked against the separate
encodes. Keys: every codec at b = 2, 3, 4 (64k tokens x 16 heads, d=64) and octopus b=2 at d=128 x 32 heads.

Run from the repository root on the device (no editable install there):
    for p in kernels aar_patch eval; do ln -sfn $PWD/$p octopus_audio/$p; done
    PYTHONPATH=$PWD python3 benchmarks/lab/sweep_encode.py --out $OUT
Compiles every kernel first in --jobs worker processes (Triton's disk cache), then times in this process.
Writes sweep_encode.json and sweep_encode.md to --out; prints progress; exit 1 if a row fails or mismatches
beyond 1e-4 in some field. --dry-run runs every row on the CPU under TRITON_INTERPRET=1 at 256 tokens x 2
heads (the script's own check; its times mean nothing).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from pathlib import Path

DEVICE = "cuda"
TOKENS, HEADS, DIM = 64 * 1024, 16, 64
BIG = (TOKENS, 32, 128)  # octopus b=2 also at d=128 x 32 heads
SMALL = (TOKENS, HEADS, DIM)
CODECS = ("turboquant-mse", "turboquant-qjl", "polarquant", "octopus", "octopus-qjl")
VALUE_BITS = (2, 3, 4)
MAX_MISMATCH = 1e-4
PREVIOUS = Path(__file__).resolve().parents[1] / "results/raw/2026-11-30/h200-a/sweep_encode.json"
UNIT = (4, 16, 75)  # the fused unit check: B, H, T (an AAR scale of 75 tokens, 4 sequences)


def _cfg(block_t=None, num_warps=None, max_registers=None, dir_table=None):
    from octopus_audio.kernels import EncodeConfig

    return EncodeConfig(block_t=block_t, num_warps=num_warps, num_stages=1 if block_t else None,
                        dir_table=dir_table, max_registers=max_registers)


# alternatives to the default launch (rows, warps, register cap) per codec, those equal to the default left
# out: at b=2 all, at b=3 and 4 the first. Register caps trade a few spills for more programs per SM.
ALTERNATIVES = {"turboquant-mse": [(128, 4, None), (128, 8, None), (64, 4, 128)],
                "turboquant-qjl": [(64, 4, None), (128, 4, None)],
                "polarquant": [(128, 4, None), (64, 4, 128)],
                "octopus": [(64, 4, 128), (64, 4, None), (128, 8, None)],
                "octopus-qjl": [(64, 4, None), (128, 8, 128)]}
ALTERNATIVES_D128 = {"octopus": [(32, 4, None), (64, 8, 128)]}


def key_jobs(quick: bool) -> list[tuple[str, int, tuple, str, object]]:
    """(codec, bits, shape, label, EncodeConfig or None) of every timed key row: at b=2 the 2026-11-30
    default launch (16 rows, 4 warps; 64 rows for turboquant-mse), the default, ALTERNATIVES, and for octopus
    at b=2 the rho index from the search's own score. (The 2026-11-30 kernel's own time is a column.)"""
    from octopus_audio.kernels.encode_ops import KEY_LAUNCH, KEY_LAUNCH_BITS

    jobs = []
    for shape, names, bits_list in ((SMALL, CODECS, (2,) if quick else (2, 3, 4)), (BIG, ("octopus",), (2,))):
        d = shape[2]
        for name in names:
            for bits in bits_list:
                old = (64, 4, None) if name == "turboquant-mse" else (16, 4, None)
                dk = 64 if d <= 64 else 128
                new = KEY_LAUNCH_BITS.get((dk, name, bits), KEY_LAUNCH[dk][name])
                alts = [a for a in (ALTERNATIVES if shape == SMALL else ALTERNATIVES_D128)[name]
                        if a not in (old, new)]
                rows = [("previous default", _cfg(*old))] if bits == 2 else []
                rows.append(("default", None))
                for t, w, cap in alts[:None if bits == 2 else 1]:
                    rows.append((f"{t} rows {w} warps" + (f", max {cap} registers" if cap else ""),
                                 _cfg(t, w, cap)))
                if name == "octopus" and bits == 2:
                    rows.append(("rho index from the search score", _cfg(dir_table=False)))
                jobs += [(name, bits, shape, label, cfg) for label, cfg in rows]
    return jobs


def _resolved(name: str, bits: int, shape, cfg):
    """The config a launch on `shape` runs (None resolved to the default's rows and warps)."""
    import torch

    from octopus_audio.kernels import encode_ops

    tokens, heads, d = shape
    block_t, launch = encode_ops._encode_launch(d, cfg, True, name, tokens * heads, torch.device(DEVICE),
                                                bits)
    return _cfg(block_t, launch["num_warps"], launch.get("maxnreg"), None if cfg is None else cfg.dir_table)


def _compile_one(job) -> str:
    """Worker: compile one key row's kernel (or a unit kernel) into Triton's disk cache with a small input of
    the same compile-time arguments (T = 256 keeps the launch aligned like 64k tokens)."""
    import torch

    from octopus_audio import backend
    from octopus_audio.codecs import get_codec
    from octopus_audio.kernels import encode_ops, ops

    kind, name, bits, shape, cfg = job
    _, heads, d = shape
    start = time.time()
    try:
        kc = backend.kernel_codec(get_codec(name, bits, d), heads, DEVICE)
        if kind == "keys":
            ops.encode_keys(torch.randn(1, heads, 256, d, device=DEVICE).to(torch.bfloat16), kc, config=cfg)
        else:
            k, v = _unit_inputs(heads, d)
            keys, values = _store(kc, k, v)
            encode_ops.encode_unit(k, v, kc, keys, values, 0, torch.zeros(2, device=DEVICE))
        torch.cuda.synchronize()
        return f"compiled {kind} {name} b={bits} d={d} {cfg} in {time.time() - start:.1f} s"
    except Exception as e:  # reported again (and counted) when the main process runs the row
        return f"compile failed {kind} {name} b={bits} d={d} {cfg}: {type(e).__name__}: {str(e)[:200]}"


def _bench(fn, rep_ms: float) -> float:
    if DEVICE != "cuda":
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    from octopus_audio.bench import _bench as bench

    return bench(fn, rep_ms)


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _inputs(tokens: int, heads: int, d: int):
    import torch

    gen = torch.Generator(device=DEVICE).manual_seed(99)
    x = torch.randn(1, heads, tokens, d, generator=gen, device=DEVICE)
    return (x * torch.exp(torch.randn(1, heads, tokens, 1, generator=gen, device=DEVICE))).to(torch.bfloat16)


def _mismatch(got, ref, fields) -> dict[str, float]:
    return {f: (getattr(got, f) != getattr(ref, f)).float().mean().item() for f in fields
            if getattr(got, f) is not None}


def _line(row: dict) -> str:
    head = f"{row['kind']} {row['codec']} b={row['bits']} {row['shape']} {row['label']}"
    if "error" in row:
        return f"{head}: {row['error']}"
    worst = max(row["mismatch"].values()) if row["mismatch"] else 0.0
    return (f"{head}: {row['ms']:.4f} ms {row['gbps']:.0f} GB/s {100 * row['of_copy']:.1f}% of copy, "
            f"worst field mismatch {worst:.1e}")


def key_rows(jobs, rep_ms: float, copy_gbps: float, previous: dict) -> list[dict]:
    """Time every key job; the reference encode (the codec library on the GPU) once per codec and shape."""
    import torch

    from octopus_audio import backend
    from octopus_audio.codecs import get_codec
    from octopus_audio.kernels import ops

    rows, cache = [], {}
    for name, bits, shape, label, cfg in jobs:
        tokens, heads, d = shape
        if (name, bits, shape) not in cache:
            cache.clear()
            torch.cuda.empty_cache()
            x = _inputs(tokens, heads, d)
            codec = get_codec(name, bits, d)
            cache[(name, bits, shape)] = (x, backend.kernel_codec(codec, heads, x.device),
                                          codec.encode_unchecked(x))
        x, kc, ref = cache[(name, bits, shape)]
        shape_s = f"{tokens // 1024}k x {heads} h, d={d}"
        row = {"kind": "encode-k", "codec": name, "bits": bits, "label": label, "config": repr(cfg),
               "resolved": repr(_resolved(name, bits, shape, cfg)), "shape": shape_s,
               "previous_default_ms": previous.get((name, bits, shape_s))}
        try:
            out = ops.encode_keys(x, kc, config=cfg)
            row["mismatch"] = _mismatch(out, ref, ("codes", "gamma", "signs", "gamma_r"))
            row["ms"] = _bench(lambda x=x, kc=kc, cfg=cfg: ops.encode_keys(x, kc, config=cfg), rep_ms)
            moved = _nbytes(x, out.codes, out.gamma, out.signs, out.gamma_r)
            row.update(bytes=moved, gbps=moved / (row["ms"] * 1e-3) / 1e9)
            row["of_copy"] = row["gbps"] / copy_gbps
        except Exception as e:  # a config that does not compile or run is reported, not fatal
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def value_rows(rep_ms: float, copy_gbps: float) -> list[dict]:
    from octopus_audio.kernels import ops
    from octopus_audio.values import ValueQuantizer

    x = _inputs(TOKENS, HEADS, DIM)
    x[0, 0, 0, :16] = 1.5  # a constant group
    rows = []
    for bits in VALUE_BITS:
        ref = ValueQuantizer(bits, DIM).encode_unchecked(x)
        row = {"kind": "encode-v", "codec": "values", "bits": bits, "label": "default", "config": "None",
               "shape": f"{TOKENS // 1024}k x {HEADS} h, d={DIM}"}
        try:
            out = ops.encode_values(x, bits, check_range=False)
            row["mismatch"] = _mismatch(out, ref, ("codes", "scale", "minimum"))
            row["ms"] = _bench(lambda b=bits: ops.encode_values(x, b, check_range=False), rep_ms)
            moved = _nbytes(x, out.codes, out.scale, out.minimum)
            row.update(bytes=moved, gbps=moved / (row["ms"] * 1e-3) / 1e9)
            row["of_copy"] = row["gbps"] / copy_gbps
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _unit_inputs(heads: int, d: int):
    """k, v: strided [B, H, T, d] views of a fused [B, T, 3, H, d] bf16 projection, as the model has them."""
    import torch

    b, _, t = UNIT
    gen = torch.Generator(device=DEVICE).manual_seed(5)
    qkv = (torch.randn(b, t, 3, heads, d, generator=gen, device=DEVICE) * 3).to(torch.bfloat16)
    _, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    return k, v


def _store(kc, k, v, offset: int = 5):
    """Store buffers of T + 2 * offset tokens for k, v (values: 2 bits, groups of 16)."""
    import torch

    from octopus_audio.kernels.spec import PackedKeys, PackedValues

    b, h, t, d = k.shape
    cap = t + 2 * offset

    def buf(*tail, dtype):
        return torch.zeros(b, h, cap, *tail, dtype=dtype, device=DEVICE)

    qjl = kc.has_qjl
    keys = PackedKeys(buf(kc.key_words, dtype=torch.int32), buf(dtype=torch.bfloat16),
                      buf(-(-d // 32), dtype=torch.int32) if qjl else None,
                      buf(dtype=torch.bfloat16) if qjl else None)
    values = PackedValues(buf(-(-d * 2 // 32), dtype=torch.int32), buf(d // 16, dtype=torch.float16),
                          buf(d // 16, dtype=torch.float16), 2, 16)
    return keys, values


def unit_rows() -> list[dict]:
    """The fused unit encode (octopus_audio/cache.py's path) against encode_keys / encode_values of the same
    unit: equal bit for bit, written at the offset only."""
    import torch

    from octopus_audio import backend
    from octopus_audio.codecs import get_codec
    from octopus_audio.kernels import encode_ops, ops

    rows = []
    for name in CODECS:
        row = {"kind": "encode-unit", "codec": name, "bits": 2, "label": "default", "config": "None",
               "shape": f"{UNIT[0]} x {HEADS} h x {UNIT[2]} tokens, d={DIM}"}
        try:
            kc = backend.kernel_codec(get_codec(name, 2, DIM), HEADS, DEVICE)
            k, v = _unit_inputs(HEADS, DIM)
            keys, values = _store(kc, k, v)
            flags = torch.zeros(2, device=DEVICE)
            encode_ops.encode_unit(k, v, kc, keys, values, 5, flags)
            wk, wv = ops.encode_keys(k.contiguous(), kc), ops.encode_values(v.contiguous(), 2, 16)
            t = UNIT[2]
            got = {"codes": keys.codes, "gamma": keys.gamma, "signs": keys.signs, "gamma_r": keys.gamma_r,
                   "v_codes": values.codes, "scale": values.scale, "minimum": values.minimum}
            want = {"codes": wk.codes, "gamma": wk.gamma, "signs": wk.signs, "gamma_r": wk.gamma_r,
                    "v_codes": wv.codes, "scale": wv.scale, "minimum": wv.minimum}
            row["mismatch"] = {f: (g[:, :, 5:5 + t] != want[f]).float().mean().item() for f, g in got.items()
                               if g is not None}
            outside = [bool((g[:, :, :5] != 0).any() | (g[:, :, 5 + t:] != 0).any()) for g in got.values()
                       if g is not None]
            row["mismatch"]["outside"] = float(any(outside))
            row["mismatch"]["flags"] = float(flags.abs().sum().item())
            row.update(ms=0.0, gbps=0.0, of_copy=0.0)
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def table(rows: list[dict], copy_gbps: float) -> str:
    out = [f"copy bandwidth (read + write): {copy_gbps:.0f} GB/s; 40% of it is the issue 3 target", "",
           "| kind | shape | codec | b | config | runs as | ms | GB/s | of copy BW | 2026-11-30 default ms "
           "| mismatch per field |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        cfg = r["label"] if r["label"] else r["config"]
        prev = f"{r['previous_default_ms']:.4f}" if r.get("previous_default_ms") else ""
        if "error" in r:
            out.append(f"| {r['kind']} | {r['shape']} | {r['codec']} | {r['bits']} | {cfg} | | error | | | "
                       f"{prev} | {r['error']} |")
            continue
        mm = ", ".join(f"{k} {v:.1e}" for k, v in r["mismatch"].items())
        res = r.get("resolved", "").replace("EncodeConfig", "").replace("num_stages=1, ", "")
        out.append(f"| {r['kind']} | {r['shape']} | {r['codec']} | {r['bits']} | {cfg} | {res} "
                   f"| {r['ms']:.4f} | {r['gbps']:.0f} | {100 * r['of_copy']:.1f}% | {prev} | {mm} |")
    return "\n".join(out) + "\n"


def best(rows: list[dict]) -> str:
    """The fastest key row per (codec, b, shape) that matches the reference, against the default."""
    out = ["", "## fastest launch per codec", "",
           "| shape | codec | b | fastest | ms | of copy BW | default ms | default of copy BW |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    groups: dict = {}
    for r in rows:
        if r["kind"] == "encode-k" and "error" not in r and max(r["mismatch"].values()) <= MAX_MISMATCH:
            groups.setdefault((r["shape"], r["codec"], r["bits"]), []).append(r)
    for (shape, codec, bits), rs in groups.items():
        fast = min(rs, key=lambda r: r["ms"])
        dflt = next((r for r in rs if r["label"] == "default"), None)
        d_ms = f"{dflt['ms']:.4f} | {100 * dflt['of_copy']:.1f}%" if dflt else " | "
        out.append(f"| {shape} | {codec} | {bits} | {fast['label']} | {fast['ms']:.4f} "
                   f"| {100 * fast['of_copy']:.1f}% | {d_ms} |")
    return "\n".join(out) + "\n"


def _previous() -> dict:
    """(codec, bits, shape) -> the 2026-11-30 default's ms (that session's kernel), where recorded."""
    if not PREVIOUS.exists():
        return {}
    rows = json.loads(PREVIOUS.read_text())["rows"]
    return {(r["codec"], r["bits"], r["shape"]): r["ms"] for r in rows
            if r.get("config") == "None" and r["kind"] == "encode-k" and "ms" in r}


def _dry_run() -> None:
    """Switch to the CPU interpreter at 256 tokens x 2 heads (before any kernel module is imported)."""
    global DEVICE, TOKENS, HEADS, SMALL, BIG, UNIT
    os.environ["TRITON_INTERPRET"] = "1"
    DEVICE, TOKENS, HEADS = "cpu", 256, 2
    SMALL, BIG, UNIT = (TOKENS, HEADS, DIM), (TOKENS, HEADS, 128), (2, HEADS, 7)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for sweep_encode.json / .md")
    parser.add_argument("--rep-ms", type=float, default=10.0, help="do_bench time per measurement (ms)")
    parser.add_argument("--jobs", type=int, default=12, help="compile worker processes")
    parser.add_argument("--quick", action="store_true", help="b=2 only")
    parser.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes")
    args = parser.parse_args()
    if args.dry_run:
        _dry_run()
    import torch

    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise SystemExit("sweep_encode needs a CUDA GPU")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    jobs = key_jobs(args.quick)
    compile_jobs = [("keys", n, b, s, _resolved(n, b, s, c)) for n, b, s, _, c in jobs]
    compile_jobs = list(dict.fromkeys(compile_jobs))  # one per distinct kernel
    compile_jobs += [("unit", n, 2, (UNIT[2], HEADS, DIM), None) for n in CODECS]
    if DEVICE == "cuda":
        print(f"compiling {len(compile_jobs)} kernels in {args.jobs} processes", flush=True)
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            for msg in pool.imap_unordered(_compile_one, compile_jobs):
                print(msg, flush=True)
        print(f"compiled in {time.time() - start:.0f} s", flush=True)
        from octopus_audio.bench import copy_bandwidth

        copy_gbps = copy_bandwidth(args.rep_ms)
    else:
        copy_gbps = 1.0
    print(f"copy bandwidth {copy_gbps:.0f} GB/s", flush=True)
    rows = unit_rows() + value_rows(args.rep_ms, copy_gbps)
    rows += key_rows(jobs, args.rep_ms, copy_gbps, _previous())
    info = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (dry run)",
            "torch": torch.__version__,
            "triton": __import__("triton").__version__, "copy_gbps": copy_gbps,
            "seconds": time.time() - start, "rows": rows}
    (args.out / "sweep_encode.json").write_text(json.dumps(info, indent=1))
    md = f"# encode sweep on {info['device']}\n\n" + table(rows, copy_gbps) + best(rows)
    (args.out / "sweep_encode.md").write_text(md)
    bad = [r for r in rows if "error" in r or max(r["mismatch"].values(), default=0.0) > MAX_MISMATCH]
    for r in bad:
        print("FAILED:", _line(r), flush=True)
    print(f"done in {info['seconds']:.0f} s -> {args.out}; {len(bad)} failed rows", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
