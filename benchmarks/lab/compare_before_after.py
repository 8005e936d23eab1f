"""Before against after, row by row: two `octopus-audio bench` outputs (bench.json) or two
`benchmarks/bench_patch.py` outputs (patch_bench.json) of the same command, as a Markdown table of the times
and their ratio, and how many rows lie within a tolerance (default 3%).

    python benchmarks/lab/compare_before_after.py BEFORE.json AFTER.json [--tol 0.03] [--out FILE.md]

bench rows: attention by its CUDA-graph replay time (`graph_ms`, GPU time without the host's launch work),
encode rows (no graph column) by their call time (`ms`). bench_patch rows: seconds a generation, per codec
path and batch. A row present on one side only is listed as such.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def rows_of(path: Path) -> dict[str, float]:
    """label -> time (ms, or seconds a generation for bench_patch) of every row of one output."""
    data = json.loads(path.read_text())
    out = {}
    if "rows" in data:  # octopus-audio bench
        for r in data["rows"]:
            shape, launch = r.get("shape") or "", r.get("launch", "")
            label = f"{r['kind']} | {r['codec']} b={r['bits']} | {shape} | {launch}"
            value = r.get("graph_ms") if r["kind"] == "attention" else r.get("ms")
            if value is not None:
                out[label] = float(value)
    else:  # bench_patch
        for codec, result in data.get("codecs", {}).items():
            for r in result.get("rows", []):
                out[f"generation | {codec} | B={r['batch']} | seconds"] = float(r["seconds"])
    return out


def compare(before: dict[str, float], after: dict[str, float], tol: float) -> tuple[str, int, int]:
    lines = ["| row | before | after | after / before |", "| --- | ---: | ---: | ---: |"]
    within = total = 0
    for label in sorted(set(before) | set(after)):
        a, b = before.get(label), after.get(label)
        if a is None or b is None or a <= 0:
            shown = ["-" if v is None else f"{v:.4f}" for v in (a, b)]
            lines.append(f"| {label} | {shown[0]} | {shown[1]} | one side |")
            continue
        ratio = b / a
        total += 1
        within += abs(ratio - 1) <= tol
        lines.append(f"| {label} | {a:.4f} | {b:.4f} | {ratio:.3f}{'' if abs(ratio - 1) <= tol else ' *'} |")
    return "\n".join(lines), within, total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--tol", type=float, default=0.03, help="relative tolerance (default 0.03)")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args()
    table, within, total = compare(rows_of(args.before), rows_of(args.after), args.tol)
    text = f"{table}\n\n{within} of {total} rows within {args.tol:.0%} (* outside)\n"
    sys.stdout.write(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
