"""Issue 36's results tables from `octopus-audio eval --sink-scales ...` runs: per codec, bits and count of
sink scales S, the means over clips of teacher-forced KL and top-1, the first parting scale, LSD, stored bits
per coordinate and KV ratio, each beside S=0's at the same widths; the target check (b=2, octopus); and the
rate-distortion view (each S's curve through b=2,3,4 read against S=0's at equal stored bits per coordinate,
the sink scales' bytes included).

Cache bytes against S=0 are read from the rows' KV ratio (fp16 bytes / cache bytes, window and prefix
included): S=0's ratio / S's ratio - 1. A run on the CPU holds its native tokens in fp32 (32 bits a
coordinate), a GPU run in bf16 (16); the column `bf16` gives what the same tokens would take with a bf16
native prefix and window (a CPU run's figure converted with the model's scales: `--patch-nums`, the
release's by default; a GPU run's as measured).

    python benchmarks/lab/sink_scales_table.py RUN_DIR [RUN_DIR ...] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from octopus_audio.aar_patch.sat import RELEASE_PATCH_NUMS
from octopus_audio.rate_distortion import value_at_rate

METRICS = ("tf_kl_nats", "tf_top1", "first_parting_scale", "lsd_db")
TARGET_BYTES, TARGET_KL, TARGET_LSD_DB = 0.05, 0.5, 3.0  # the target at b=2


def read_run(run: Path) -> tuple[dict, list[dict]]:
    settings = json.loads((run / "settings.json").read_text())
    rows = [json.loads(line) for line in (run / "rows.jsonl").read_text().splitlines() if line.strip()]
    return settings, rows


def groups(rows: list[dict]) -> dict[tuple, dict]:
    """(codec, bits, v_bits, S) -> means over the ok rows (metrics, K+V bits/coord, KV ratio), clip count.
    S is the sink count, or (sinks, wide scales, wide bits) for rows with per-scale widths (`--wide-scales`),
    kept apart from the rows without."""
    acc: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r["status"] == "ok" and r["bits"] is not None:
            sinks = r.get("sink_scales") or 0
            cfg = (sinks, r["wide_scales"], r.get("wide_bits")) if r.get("wide_scales") else sinks
            acc[r["codec"], r["bits"], r.get("v_bits", r["bits"]), cfg].append(r)
    out = {}
    for key, rs in acc.items():
        g = {m: float(np.mean([r["metrics"][m] for r in rs])) for m in METRICS
             if all(r["metrics"].get(m) is not None for r in rs)}
        g["kv_bits"] = float(np.mean([(r["kv"]["k_bits"] + r["kv"]["v_bits"]) / 2 for r in rs]))
        g["ratio"] = float(np.mean([r["kv"]["ratio"] for r in rs]))
        g["clips"] = len(rs)
        out[key] = g
    return out


def bf16_bytes_change(g0: dict, sinks: int, native_bits: int, patch_nums) -> float:
    """Cache bytes with S sink scales against S=0's, for a bf16 native prefix and window: S=0's cache
    (compressed store at its measured bits a coordinate, the last scale native) and the S first scales moved
    from the store to the native prefix. `native_bits`: the run's native width (32 on the CPU, 16 on a GPU;
    at 16 this is the measured ratio's figure)."""
    window, prefix = patch_nums[-1], sum(patch_nums[:sinks])
    stored = sum(patch_nums) - window
    # S=0's K+V bits a coordinate in the store, from its ratio: fp16 bits / cache bits, per coordinate
    total_bits = 16 * sum(patch_nums) / g0["ratio"]
    store_bits = (total_bits - native_bits * window) / stored  # what a stored token costs, a coordinate
    base = store_bits * stored + 16 * window
    return (prefix * (16 - store_bits)) / base


def sinks_of(cfg) -> int:
    return cfg[0] if isinstance(cfg, tuple) else cfg


def label(cfg) -> str:
    """S, or S+W@B for S sink scales and W wide scales at B bits."""
    return f"{cfg[0]}+{cfg[1]}@{cfg[2]}" if isinstance(cfg, tuple) else str(cfg)


def bytes_bf16(g0: dict, m: dict, cfg, native_bits: int, patch_nums) -> float | None:
    """Cache bytes against S=0's with bf16 native tokens: `bf16_bytes_change` without wide scales; with
    them the measured change of a GPU run (bf16 already), none for a CPU run."""
    if not isinstance(cfg, tuple):
        return bf16_bytes_change(g0, cfg, native_bits, patch_nums)
    return g0["ratio"] / m["ratio"] - 1 if native_bits == 16 else None


def fmt(v, spec=".4g"):
    return "-" if v is None else format(v, spec)


def row_lines(g: dict, native_bits: int, patch_nums) -> list[str]:
    head = ["codec", "b", "S", "clips", "TF KL", "x S=0", "TF top-1", "first parting scale", "LSD dB",
            "- S=0 dB", "K+V bits/coord", "KV ratio", "cache bytes vs S=0", "bf16: vs S=0"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for key in sorted(g, key=lambda k: (k[0], k[1], k[2], sinks_of(k[3]), label(k[3]))):
        codec, bits, v_bits, cfg = key
        m, base = g[key], g.get((codec, bits, v_bits, 0))
        kl_x = m["tf_kl_nats"] / base["tf_kl_nats"] if base and "tf_kl_nats" in m else None
        lsd_d = m["lsd_db"] - base["lsd_db"] if base else None
        bytes_x = base["ratio"] / m["ratio"] - 1 if base else None
        bf16_x = bytes_bf16(base, m, cfg, native_bits, patch_nums) if base else None
        cells = [codec, f"{bits}" if v_bits == bits else f"K{bits} V{v_bits}", label(cfg), str(m["clips"]),
                 fmt(m.get("tf_kl_nats")), fmt(kl_x, ".3f"), fmt(m.get("tf_top1"), ".4f"),
                 fmt(m.get("first_parting_scale"), ".2f"), fmt(m["lsd_db"], ".3f"), fmt(lsd_d, "+.2f"),
                 fmt(m["kv_bits"], ".3f"), fmt(m["ratio"], ".2f"), fmt(bytes_x, "+.1%"), fmt(bf16_x, "+.1%")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def target_lines(g: dict, native_bits: int, patch_nums) -> list[str]:
    lines = ["Target (issue 36, octopus b=2): cache bytes at most +5% (bf16 native tokens), TF KL at most "
             "half of S=0's, sampled LSD at least 3 dB lower.", ""]
    for key in sorted((k for k in g if k[0] == "octopus" and k[1] == k[2] == 2 and k[3]),
                      key=lambda k: (sinks_of(k[3]), label(k[3]))):
        base = g.get(key[:3] + (0,))
        if base is None:
            continue
        m = g[key]
        change = bytes_bf16(base, m, key[3], native_bits, patch_nums)
        checks = {"bytes": change is not None and change <= TARGET_BYTES,
                  "KL": m["tf_kl_nats"] <= TARGET_KL * base["tf_kl_nats"],
                  "LSD": m["lsd_db"] <= base["lsd_db"] - TARGET_LSD_DB}
        said = ", ".join(f"{k} {'met' if ok else 'missed'}" for k, ok in checks.items())
        lines.append(f"- S={label(key[3])}: {said}")
    return lines


def bf16_rate(kv_bits: float, sinks: int, native_bits: int, patch_nums) -> float:
    """K+V bits a coordinate outside the window with the sink scales' tokens at 16 bits instead of the run's
    `native_bits` (the rows' rate counts them as held: 32 on the CPU)."""
    outside = sum(patch_nums) - patch_nums[-1]
    return kv_bits - sum(patch_nums[:sinks]) * (native_bits - 16) / outside


def rate_lines(g: dict, native_bits: int, patch_nums) -> list[str]:
    lines = ["Rate-distortion view: each (codec, S) curve through its widths, read against S=0's curve at "
             "the same K+V bits/coord outside the window, the sink scales counted at bf16 (a CPU run's rates "
             "converted: `bf16_rate`), log-linear between S=0's two nearest widths ('-' outside its range). "
             "Below: the S curve's mean is lower (KL, LSD) there.", ""]
    head = ["codec", "S", "metric", "points below S=0 / read", "each point: S value vs S=0 at its rate"]
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for codec in sorted({k[0] for k in g}):
        for metric in ("tf_kl_nats", "lsd_db"):
            base = [(g[k]["kv_bits"], g[k][metric]) for k in g
                    if k[0] == codec and k[3] == 0 and k[1] == k[2] and metric in g[k]]
            cfgs = sorted({k[3] for k in g if k[0] == codec and k[3]}, key=lambda c: (sinks_of(c), label(c)))
            for cfg in cfgs:
                keys = [k for k in g if k[0] == codec and k[3] == cfg and k[1] == k[2] and metric in g[k]]
                pts = sorted((bf16_rate(g[k]["kv_bits"], sinks_of(cfg), native_bits, patch_nums),
                              g[k][metric]) for k in keys)
                log = all(v > 0 for _, v in base)
                read = [(x, y, value_at_rate(base, x, log=log)) for x, y in pts]
                inside = [(y, b) for _, y, b in read if b is not None]
                below = sum(y < b for y, b in inside)
                each = "; ".join(f"{x:.3f}: {y:.4g} vs {fmt(b)}" for x, y, b in read)
                lines.append(f"| {codec} | {label(cfg)} | {metric} | {below} / {len(inside)} | {each} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="eval output folders (settings.json, rows.jsonl)")
    p.add_argument("--patch-nums", default=",".join(map(str, RELEASE_PATCH_NUMS)),
                   help="the model's tokens per scale (default: the release's 16 scales)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    patch_nums = tuple(int(x) for x in args.patch_nums.split(","))
    lines = []
    for run in args.runs:
        settings, rows = read_run(run)
        native_bits = 16 if settings.get("generation_precision") == "bf16-autocast" else 32
        g = groups(rows)
        clips = len({r["clip"] for r in rows})
        lines += [f"## {run}", "",
                  f"model {settings.get('model')}, {clips} clips, seed {settings.get('seed')}, generation "
                  f"{settings.get('generation_precision')}, teacher forcing "
                  f"{settings.get('teacher_forced_precision')}, version {settings.get('version')}", ""]
        lines += row_lines(g, native_bits, patch_nums) + [""]
        lines += target_lines(g, native_bits, patch_nums) + [""]
        lines += rate_lines(g, native_bits, patch_nums) + [""]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
