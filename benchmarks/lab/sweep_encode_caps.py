"""GPU probe: the key encode's register cap (resident blocks an SM) at the bench's encode shape.

Keys as `octopus-audio bench` builds them (64k tokens x 16 heads, d=64 or --dim 128, bf16, seed 99), encoded
through the public `encode_keys` (Triton kernel) with the launch table entry of each (codec, bits) set to
(rows, warps, cap) in turn; every launch's fields compared with the default launch's. Times: `do_bench`
medians of the call (as the bench's encode rows) and of a CUDA-graph replay of it (GPU time only), ms. The
fused unit encode (`encode_unit`: the same keys and as many values, 2 bits in groups of 16, into a store; the
cache's default path), whose launch takes the key kernel's cap, is graph-timed beside it.

    PYTHONPATH=$PWD python3 benchmarks/lab/sweep_encode_caps.py --out $OUT/caps.json \
        --jobs turboquant-qjl:2:64:4:0,turboquant-qjl:2:64:4:112 ...

A job is codec:bits:rows:warps:cap[:unit_cap] (cap 0: none; unit_cap, the kind's unit_caps entry: the key
launch's cap when left out); a codec's first job runs its default launches (the numbers given are only labels)
and gives the fields the others must match.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton


def main() -> int:
    from octopus_audio.apps.timing import graphed as _graphed
    from octopus_audio.cache import kernel_codec
    from octopus_audio.cache.store import empty_store
    from octopus_audio.codecs import get_codec
    from octopus_audio.kernels import PackedKeys, PackedValues, encode_keys, encode_unit, kinds
    from octopus_audio.kernels.impls import encode
    from octopus_audio.values import ValueQuantizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--jobs", required=True)
    parser.add_argument("--rep-ms", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=64 * 1024)
    parser.add_argument("--dim", type=int, default=64, help="head dim (64 or 128)")
    args = parser.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: the fields only (interpreter)
    gen = torch.Generator(device=dev).manual_seed(99)
    x = torch.randn(1, 16, args.tokens, args.dim, generator=gen, device=dev).to(torch.bfloat16)
    v = torch.randn(1, 16, args.tokens, args.dim, generator=gen, device=dev).to(torch.bfloat16)

    def timed(f, graph=True):
        if dev.type != "cuda":
            return float("nan")
        return triton.testing.do_bench(_graphed(f) if graph else f, warmup=10, rep=args.rep_ms,
                                       return_mode="median")

    quant = ValueQuantizer(2, args.dim)

    def store(codec):
        """The cache's own buffers (`empty_store`) for the codec's keys and 2-bit values, as the kernels'."""
        return empty_store(codec, quant, x, args.tokens).packed(PackedKeys, PackedValues, quant)

    defaults = [(kind.encode.launch_bits, dict(kind.encode.launch_bits)) for kind in kinds() if kind.encode]
    defaults += [(kind.encode.unit_caps, dict(kind.encode.unit_caps)) for kind in kinds() if kind.encode]

    def restore_tables():
        """The kinds' launch tables as the package has them."""
        for table, default in defaults:
            table.clear()
            table.update(default)

    rows, want = [], {}
    for job in args.jobs.split(","):
        name, bits, block, warps, cap, *unit_cap = job.split(":")
        bits, block, warps, cap = int(bits), int(block), int(warps), int(cap) or None
        unit_cap = int(unit_cap[0]) if unit_cap else None
        codec = get_codec(name, bits, args.dim)
        kc = kernel_codec(codec, 16, x.device)
        key = encode.launch_key(kc)
        launch_bits, unit_caps = kc.kind.encode.launch_bits, kc.kind.encode.unit_caps
        restore_tables()
        first = (name, bits) not in want  # a codec's first job runs its default launch: the fields to match
        if not first:
            launch_bits[key] = (block, warps, cap)
            if unit_cap is not None:
                unit_caps[key] = unit_cap
            else:
                unit_caps.pop(key, None)
        kc.__dict__.pop("_key_constants", None)
        kc.__dict__.pop("_unit_constants", None)
        fn = lambda kc=kc: encode_keys(x, kc, gluon=False)  # noqa: E731
        keys_out, values_out = store(codec)
        unit = lambda kc=kc, ko=keys_out, vo=values_out: encode_unit(x, v, kc, ko, vo, 0)  # noqa: E731
        try:
            out = fn()
            fields = {f: getattr(out, f) for f in ("codes", "gamma", "signs", "gamma_r")
                      if getattr(out, f) is not None}
            unit()
            fields.update({f"unit_{f}": getattr(keys_out, f) for f in ("codes", "gamma", "signs", "gamma_r")
                           if getattr(keys_out, f) is not None})
            fields.update({f"unit_v_{f}": getattr(values_out, f) for f in ("codes", "scale", "minimum")})
            if first:
                want[(name, bits)] = {f: t.clone() for f, t in fields.items()}
            differ = {f: (t != want[(name, bits)][f]).float().mean().item() for f, t in fields.items()}
            ms, graph_ms, unit_ms = timed(fn, graph=False), timed(fn), timed(unit)
            err = ""
        except Exception as e:  # one failing launch still lets the others report
            ms = graph_ms = unit_ms = float("nan")
            differ, err = {}, f"{type(e).__name__}: {str(e)[:200]}"
        rows.append({"codec": name, "bits": bits, "rows": block, "warps": warps, "cap": cap,
                     "unit_cap": unit_caps.get(key, "key's"), "ms": ms,
                     "graph_ms": graph_ms, "unit_graph_ms": unit_ms, "differ": differ, "error": err,
                     "launch": "default" if first else "set"})
        print(json.dumps(rows[-1]), flush=True)
    restore_tables()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
