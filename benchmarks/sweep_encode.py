"""GPU sweep of the encode kernels: exactness against the library's encode on the same GPU, then timings per
EncodeConfig, GB/s on bytes read + written and the fraction of measured device-to-device copy bandwidth.

Run from the repository root on the device (no editable install there):
    for p in kernels aar_patch eval; do ln -sfn $PWD/$p octopus_audio/$p; done
    PYTHONPATH=$PWD python3 benchmarks/sweep_encode.py --out $OUT
Writes sweep_encode.json and sweep_encode.md to --out; prints progress; about a minute on an H200.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from octopus_audio.bench import _bench, copy_bandwidth

TOKENS, HEADS, DIM = 64 * 1024, 16, 64
BIG = (TOKENS, 32, 128)  # one codec also at d=128 x 32 heads
KEY_JOBS = [("turboquant-mse", 2), ("turboquant-qjl", 2), ("polarquant", 2), ("octopus", 2), ("octopus", 3),
            ("octopus", 4), ("octopus-qjl", 2)]
VALUE_BITS = (2, 3, 4)


def _configs(full: bool):
    """Launch configurations to time: the default (None) and alternatives; `full` for the swept rows (values
    b=2, turboquant-mse b=2, octopus b=2), two otherwise (each one is a compilation)."""
    from octopus_audio.kernels import EncodeConfig

    if full:
        return ([None, EncodeConfig(32, 4, 1), EncodeConfig(64, 4, 1), EncodeConfig(32, 8, 1)],
                [None, EncodeConfig(32, 4, 1), EncodeConfig(128, 4, 1), EncodeConfig(128, 8, 1)])
    return [None, EncodeConfig(32, 4, 1)], [None, EncodeConfig(128, 4, 1)]




def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _inputs(tokens: int, heads: int, d: int):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(99)
    x = torch.randn(1, heads, tokens, d, generator=gen, device="cuda")
    return (x * torch.exp(torch.randn(1, heads, tokens, 1, generator=gen, device="cuda"))).to(torch.bfloat16)


def _mismatch(got, ref, fields) -> dict[str, float]:
    return {f: (getattr(got, f) != getattr(ref, f)).float().mean().item() for f in fields
            if getattr(got, f) is not None}


def key_rows(name: str, bits: int, shape, configs, rep_ms: float, copy_gbps: float) -> list[dict]:
    from octopus_audio import backend
    from octopus_audio.codecs import get_codec
    from octopus_audio.kernels import ops

    tokens, heads, d = shape
    x = _inputs(tokens, heads, d)
    codec = get_codec(name, bits, d)
    kc = backend.kernel_codec(codec, heads, x.device)
    ref = codec.encode_unchecked(x)
    rows = []
    for cfg in configs:
        row = {"kind": "encode-k", "codec": name, "bits": bits, "config": repr(cfg),
               "shape": f"{tokens // 1024}k x {heads} h, d={d}"}
        try:
            out = ops.encode_keys(x, kc, config=cfg)
            row["mismatch"] = _mismatch(out, ref, ("codes", "gamma", "signs", "gamma_r"))
            row["ms"] = _bench(lambda cfg=cfg: ops.encode_keys(x, kc, config=cfg), rep_ms)
            moved = _nbytes(x, out.codes, out.gamma, out.signs, out.gamma_r)
            row.update(bytes=moved, gbps=moved / (row["ms"] * 1e-3) / 1e9)
            row["of_copy"] = row["gbps"] / copy_gbps
        except Exception as e:  # a config that does not compile or run is reported, not fatal
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def value_rows(bits: int, configs, rep_ms: float, copy_gbps: float) -> list[dict]:
    import torch

    from octopus_audio.kernels import ops
    from octopus_audio.values import ValueQuantizer

    x = _inputs(TOKENS, HEADS, DIM)
    x[0, 0, 0, :16] = 1.5  # a constant group
    ref = ValueQuantizer(bits, DIM).encode_unchecked(x)
    rows = []
    for cfg in configs:
        row = {"kind": "encode-v", "codec": "values", "bits": bits, "config": repr(cfg),
               "shape": f"{TOKENS // 1024}k x {HEADS} h, d={DIM}"}
        try:
            out = ops.encode_values(x, bits, check_range=False, config=cfg)
            row["mismatch"] = _mismatch(out, ref, ("codes", "scale", "minimum"))
            row["ms"] = _bench(lambda c=cfg: ops.encode_values(x, bits, check_range=False, config=c), rep_ms)
            flag = torch.zeros(1, dtype=torch.int32, device="cuda")
            row["ms_range_flag"] = _bench(
                lambda c=cfg, f=flag: ops.encode_values(x, bits, config=c, range_flag=f), rep_ms)
            row["range_flag_clear"] = int(flag.item()) == 0
            moved = _nbytes(x, out.codes, out.scale, out.minimum)
            row.update(bytes=moved, gbps=moved / (row["ms"] * 1e-3) / 1e9)
            row["of_copy"] = row["gbps"] / copy_gbps
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _line(row: dict) -> str:
    if "error" in row:
        return f"{row['kind']} {row['codec']} b={row['bits']} {row['shape']} {row['config']}: {row['error']}"
    worst = max(row["mismatch"].values()) if row["mismatch"] else 0.0
    return (f"{row['kind']} {row['codec']} b={row['bits']} {row['shape']} {row['config']}: "
            f"{row['ms']:.4f} ms {row['gbps']:.0f} GB/s {100 * row['of_copy']:.1f}% of copy, "
            f"worst field mismatch {worst:.1e}")


def table(rows: list[dict], copy_gbps: float) -> str:
    out = [f"copy bandwidth (read + write): {copy_gbps:.0f} GB/s", "",
           "| kind | shape | codec | b | config | ms | GB/s | of copy BW | mismatch per field |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['kind']} | {r['shape']} | {r['codec']} | {r['bits']} | {r['config']} | error "
                       f"| | | {r['error']} |")
            continue
        mm = ", ".join(f"{k} {v:.1e}" for k, v in r["mismatch"].items())
        out.append(f"| {r['kind']} | {r['shape']} | {r['codec']} | {r['bits']} | {r['config']} "
                   f"| {r['ms']:.4f} | {r['gbps']:.0f} | {100 * r['of_copy']:.1f}% | {mm} |")
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for sweep_encode.json / .md")
    parser.add_argument("--rep-ms", type=float, default=20.0, help="do_bench time per measurement (ms)")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("sweep_encode needs a CUDA GPU")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    copy_gbps = copy_bandwidth(args.rep_ms)
    print(f"copy bandwidth {copy_gbps:.0f} GB/s", flush=True)
    rows = []
    for bits in VALUE_BITS:
        rows += value_rows(bits, _configs(bits == 2)[1], args.rep_ms, copy_gbps)
    for name, bits in KEY_JOBS:
        full = bits == 2 and name in ("octopus", "turboquant-mse")
        rows += key_rows(name, bits, (TOKENS, HEADS, DIM), _configs(full)[0], args.rep_ms, copy_gbps)
    rows += key_rows("octopus", 2, BIG, _configs(False)[0], args.rep_ms, copy_gbps)
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "copy_gbps": copy_gbps,
            "seconds": time.time() - start, "rows": rows}
    (args.out / "sweep_encode.json").write_text(json.dumps(info, indent=1))
    md = f"# encode sweep on {info['device']}\n\n" + table(rows, copy_gbps)
    (args.out / "sweep_encode.md").write_text(md)
    print(f"done in {info['seconds']:.0f} s -> {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
