"""GPU benchmark of the KV-cache patch: end-to-end samples/s and peak memory per codec vs none, and max batch.

For each codec at `--bits` (default 2) on the full-size AAR (d16, width 1024, random weights) with a random
SAT tokenizer: samples/s of `generate` (bf16 fast path, audio decode included; the transformer-only time is
the total minus the decode) and the peak `torch.cuda.max_memory_allocated` (weights included) at each batch
in `--batches`; then the largest batch (multiple of 8) whose peak stays under `--budget-gib`, found from the
linear fit of peak memory over batch and checked by running it, with its samples/s. `none` is the unpatched
model; `none+patch` is codec none through the patch (checked token-identical to `none`). At one batch the
cache memory freed by kv_caching(False) is measured and compared with the patch's accounting.
Rows named `<codec>@graph` run the same generation captured in one CUDA graph (`GraphedGenerator`, capture
time in `setup_s`, not in the timing); `none+patch@graph` is checked token-identical to `none@graph`, and a
patched graph's tokens are compared with its eager rows. Device checks, run once after the first codecs:
host syncs per eager generation (`torch.cuda.set_sync_debug_mode("warn")` around the scale loop; the patch
should add exactly one, its end-of-generation data check) and a NaN put into one layer's input mid-generation
must raise the patch's ValueError, eager and from a graph replay.

    python benchmarks/bench_patch.py --out benchmarks/results            # on a GPU (about 3 minutes)
    python benchmarks/bench_patch.py --small --device cpu --batches 1,2  # smoke test of the script
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
import warnings
from pathlib import Path

import torch
from bench_aar import build_pipeline  # the same random-weight model (run from the repository root)

from octopus_audio.aar_patch import AARPipeline, GraphedGenerator, generate, patch_aar
from octopus_audio.aar_patch.generation import SamplingConfig, check_condition, exponential_draw, run_scales

GIB = 2.0**30


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class DecodeTimer:
    """Wraps `pipe.sat.decode` to time it (synchronised), so the transformer time is total - decode."""

    def __init__(self, pipe: AARPipeline, device: str) -> None:
        self.seconds = 0.0
        inner = pipe.sat.decode

        def timed(f_hat):
            sync(device)
            t0 = time.perf_counter()
            out = inner(f_hat)
            sync(device)
            self.seconds += time.perf_counter() - t0
            return out

        pipe.sat.decode = timed


def eager(pipe):
    return lambda cond_BE: generate(pipe, cond_BE, cfg=4.0, top_k=200, top_p=0.95, seed=42)


def run_once(gen, cond_BE, device: str, timer: DecodeTimer):
    """One generation `gen(cond_BE)`: (seconds, decode seconds, peak bytes, tokens)."""
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    timer.seconds = 0.0
    sync(device)
    t0 = time.perf_counter()
    result = gen(cond_BE)
    sync(device)
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    return seconds, timer.seconds, peak, result.tokens


def condition(batch: int) -> torch.Tensor:
    cond = torch.randn(batch, 512, generator=torch.Generator().manual_seed(1))
    return torch.nn.functional.normalize(cond, dim=1)


def measure(pipe, batch: int, device: str, timer: DecodeTimer, reps: int, graph: bool = False) -> dict:
    """Warm-up run (also the peak memory), then `reps` timed runs; returns the row of the table.
    graph: capture a GraphedGenerator for the batch first (its time is `setup_s`) and time its replays."""
    cond = condition(batch)
    setup = time.perf_counter()
    graphed = GraphedGenerator(pipe, batch, cfg=4.0, top_k=200, top_p=0.95) if graph else None
    gen = graphed if graph else eager(pipe)  # GraphedGenerator(cond) replays with seed 42
    setup_s = time.perf_counter() - setup
    _, _, peak, tokens = run_once(gen, cond, device, timer)
    times, decodes = [], []
    for _ in range(reps):
        seconds, dec, peak_r, _ = run_once(gen, cond, device, timer)
        times.append(seconds)
        decodes.append(dec)
        peak = max(peak, peak_r)
    del graphed, gen
    if device == "cuda":
        torch.cuda.empty_cache()
    best = min(range(reps), key=lambda i: times[i])
    return {"batch": batch, "seconds": times[best], "decode_seconds": decodes[best],
            "samples_per_s": batch / times[best], "peak_gib": peak / GIB, "tokens": tokens,
            "setup_s": setup_s}


def count_syncs(pipe, batch: int) -> int:
    """Host syncs in one eager bf16 scale loop (the fast path of `generate`, without its input check and
    audio decode), counted by torch.cuda.set_sync_debug_mode("warn")."""
    cond = check_condition(pipe, condition(batch))
    generator = torch.Generator(device=pipe.device).manual_seed(42)
    with warnings.catch_warnings(record=True) as caught, torch.inference_mode():
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run_scales(pipe, cond, SamplingConfig(), exponential_draw(generator), torch.bfloat16)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def nan_checks(pipe, codec: str, bits: int) -> dict:
    """A NaN put into one layer's input at a middle scale must raise the patch's ValueError before any
    result: eager (checked at the end of the generation) and from a graph replay (checked after it)."""
    attn = pipe.aar.blocks[len(pipe.aar.blocks) // 2].attn
    scales = len(pipe.aar.config.patch_nums)
    calls = []

    def poison(only_when_capturing: bool):
        def hook(_, args):
            calls.append(1)
            if len(calls) % scales == scales // 2 and (not only_when_capturing
                                                        or torch.cuda.is_current_stream_capturing()):
                x = args[0].clone()
                x[0, 0].fill_(float("nan"))  # one token of one row (a kernel, so a capture records it)
                return (x, *args[1:])
            return None
        return hook

    out = {}
    with patch_aar(pipe, codec, bits) as handle:
        for mode in ("eager", "graph"):
            calls.clear()
            hook = attn.register_forward_pre_hook(poison(only_when_capturing=mode == "graph"))
            try:
                if mode == "eager":
                    generate(pipe, condition(1), seed=42)
                else:
                    GraphedGenerator(pipe, 1)(condition(1), 42)
                out[mode] = "no error (the NaN was not caught)"
            except ValueError as e:
                out[mode] = f"raised: {e}"
            finally:
                hook.remove()
            generate(pipe, condition(1), seed=42)  # the model still generates afterwards
            out[f"{mode}_generating_after"] = handle.generating
    out["ok"] = all(out[m].startswith("raised: append got non-finite keys") for m in ("eager", "graph"))
    return out


def cache_memory_check(pipe, handle, batch: int, device: str) -> dict:
    """GPU bytes freed when the caches are emptied at the end of a generation vs the patch's accounting."""
    attns = [lp.module for lp in handle._layers]
    marks: dict[str, int] = {}
    first, last = attns[0].kv_caching, attns[-1].kv_caching

    def first_off(enable):
        if not enable:
            sync(device)
            marks["before"] = torch.cuda.memory_allocated()
        first(enable)

    def last_off(enable):
        last(enable)
        if not enable:
            sync(device)
            marks["after"] = torch.cuda.memory_allocated()

    attns[0].kv_caching, attns[-1].kv_caching = first_off, last_off
    try:
        cond = torch.randn(batch, 512)
        generate(pipe, cond, cfg=4.0, top_k=200, top_p=0.95, seed=42)
    finally:
        attns[0].kv_caching, attns[-1].kv_caching = first, last
    total = handle.stats().total
    return {"batch": batch, "freed_bytes": marks["before"] - marks["after"],
            "allocated_bytes": total.allocated_bytes, "valid_bytes": total.nbytes,
            "fp16_bytes": total.fp16_bytes, "ratio": total.ratio,
            "store_ratio": total.store_ratio, "k_bits": total.k_bits, "v_bits": total.v_bits}


def max_batch(pipe, rows: list[dict], budget: float, device: str, timer: DecodeTimer,
              reps: int) -> dict | None:
    """The largest multiple of 8 whose peak stays under `budget` bytes (fit on two batches, then checked)."""
    fit = sorted((r for r in rows if r["batch"] > 1), key=lambda r: r["batch"])[-2:]
    if len(fit) < 2:
        return None
    (b0, p0), (b1, p1) = ((r["batch"], r["peak_gib"] * GIB) for r in fit)
    slope = (p1 - p0) / (b1 - b0)
    batch = int((budget - (p0 - slope * b0)) / slope) // 8 * 8
    for _ in range(4):
        if batch < 8:
            return None
        row = measure(pipe, batch, device, timer, reps)
        row.pop("tokens")
        if row["peak_gib"] * GIB <= budget:
            row["fit_gib_per_sample"] = slope / GIB
            return row
        batch = int(batch * 0.95) // 8 * 8
    return None


def device_checks(pipe, bits: int) -> dict:
    """Host syncs per eager generation (unpatched, codec none through the patch, octopus) at batch 1, and
    the NaN checks (octopus)."""
    syncs = {}
    for name in ("none", "none+patch", "octopus"):
        handle = None if name == "none" else patch_aar(pipe, "none" if name == "none+patch" else name, bits)
        try:
            syncs[name] = count_syncs(pipe, 1)
        finally:
            if handle is not None:
                handle.unpatch(abandon=True)
    return {"syncs_per_generation": syncs, "nan": nan_checks(pipe, "octopus", bits)}


def plan(codecs: list[str], batches: list[int], full: int, graphs: list[str]) -> list[tuple[str, str, int]]:
    """Tasks (codec, what, batch) in priority order: the first `full` codecs completely (batches, cache
    memory check, max batch), then `none+patch` at one batch, the device checks, the CUDA-graph rows
    (`graphs`: all batches, `none+patch` at the middle one), then the other codecs' batches, checks and max
    batches, so a deadline cuts the least important work."""
    plain = [c for c in codecs if c != "none+patch"]
    first, rest = plain[:full], plain[full:]
    middle = sorted(batches)[len(batches) // 2]

    def tasks(names: list[str], what: str) -> list[tuple[str, str, int]]:
        if what == "batches":
            return [(n, what, b) for n in names for b in batches]
        return [(n, what, 0) for n in names if what != "memcheck" or n != "none"]

    out = [t for n in first for what in ("batches", "memcheck", "max") for t in tasks([n], what)]
    if "none+patch" in codecs:
        out.append(("none+patch", "batches", middle))
    out.append(("device checks", "checks", 0))
    for n in graphs:
        out += [(f"{n}@graph", "batches", b) for b in (batches if n != "none+patch" else [middle])]
    return out + tasks(rest, "batches") + tasks(rest, "memcheck") + tasks(rest, "max")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--codecs",
                   default="none,octopus,none+patch,turboquant-mse,polarquant,octopus-qjl,turboquant-qjl")
    p.add_argument("--full", type=int, default=2, help="codecs (from the start of --codecs) measured first")
    p.add_argument("--graphs", default="none,octopus,none+patch",
                   help="codecs also measured captured in a CUDA graph (rows <codec>@graph); '' for none")
    p.add_argument("--bits", type=int, default=2)
    p.add_argument("--batches", default="1,64,256")
    p.add_argument("--budget-gib", type=float, default=16.0)
    p.add_argument("--reps", type=int, default=1, help="timed runs after the warm-up run (the best counts)")
    p.add_argument("--deadline-s", type=float, default=1e9,
                   help="skip what would start after this many seconds")
    p.add_argument("--memcheck-batch", type=int, default=64)
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true", help="depth-2 width-128 model (smoke test)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    pipe = build_pipeline("small" if args.small else "full", torch.device(args.device))
    timer = DecodeTimer(pipe, args.device)
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    report: dict = {"gpu": gpu, "torch": torch.__version__, "bits": args.bits, "budget_gib": args.budget_gib,
                    "codecs": {}, "skipped": [], "setup_s": time.perf_counter() - start}
    out_json = args.out / "patch_bench.json"
    seen_tokens: dict[tuple[str, int], list] = {}
    codecs = args.codecs.split(",")
    graphs = [g for g in args.graphs.split(",") if g]
    for name, what, batch in plan(codecs, [int(b) for b in args.batches.split(",")], args.full, graphs):
        if what == "checks":
            if args.device == "cuda" and time.perf_counter() - start <= args.deadline_s:
                t0 = time.perf_counter()
                try:
                    report["checks"] = device_checks(pipe, args.bits)
                except Exception as e:  # recorded; the timings still run
                    report["checks_error"] = f"{type(e).__name__}: {e}"[:500]
                    traceback.print_exc()
                outcome = report.get("checks", report.get("checks_error"))
                print(name, f"{time.perf_counter() - t0:.1f}s", outcome, flush=True)
            continue
        entry = report["codecs"].setdefault(name, {"rows": []})
        if time.perf_counter() - start > args.deadline_s or entry.get("error"):
            report["skipped"].append(f"{name} {what} {batch or ''}".strip())
            continue
        graph = name.endswith("@graph")
        if (what != "batches" or graph) and args.device != "cuda":
            continue
        base = name.removesuffix("@graph")
        codec = "none" if base == "none+patch" else base
        handle = None if base == "none" else patch_aar(pipe, codec, args.bits)
        entry["repr"] = repr(handle)
        t0 = time.perf_counter()
        try:
            if what == "batches":
                row = measure(pipe, batch, args.device, timer, args.reps if batch > 1 else max(args.reps, 3),
                              graph=graph)
                tokens = seen_tokens[name, batch] = row.pop("tokens")
                same_as = {"tokens_equal_none": ("none@graph" if graph else "none") if base == "none+patch"
                           else None, "tokens_equal_eager": base if graph else None}
                for key, other in same_as.items():
                    if other is not None and (other, batch) in seen_tokens:
                        pairs = zip(tokens, seen_tokens[other, batch], strict=True)
                        row[key] = all(torch.equal(a, b) for a, b in pairs)
                entry["rows"].append(row)
            elif what == "memcheck":
                entry["memcheck"] = cache_memory_check(pipe, handle, args.memcheck_batch, args.device)
            else:
                entry["max_batch"] = max_batch(pipe, entry["rows"], args.budget_gib * GIB, args.device, timer,
                                               args.reps)
        except torch.cuda.OutOfMemoryError as e:
            entry["error"] = f"{what} {batch}: out of memory: {e}"[:300]
            torch.cuda.empty_cache()
        except Exception as e:  # a graph that fails to capture is a result to record, not the end of the run
            if not graph:
                raise
            entry["error"] = f"{what} {batch}: {type(e).__name__}: {e}"[:500]
            traceback.print_exc()
        finally:
            if handle is not None:
                handle.unpatch(abandon=True)
        entry.setdefault("task_seconds", {})[f"{what} {batch}"] = time.perf_counter() - t0
        last = {"batches": (entry["rows"] or [None])[-1], "memcheck": entry.get("memcheck"),
                "max": entry.get("max_batch")}[what]
        print(name, what, batch, f"{time.perf_counter() - t0:.1f}s", last, entry.get("error", ""), flush=True)
        out_json.write_text(json.dumps(report, indent=1))
    report["wall_s"] = time.perf_counter() - start
    out_json.write_text(json.dumps(report, indent=1))
    print(markdown(report))
    (args.out / "patch_bench.md").write_text(markdown(report))


def markdown(report: dict) -> str:
    """The results as Markdown tables (per codec and batch; max batch under the budget)."""
    def rows_of(name: str) -> dict:
        return {r["batch"]: r for r in report["codecs"].get(name, {}).get("rows", [])}

    base, base_graph = rows_of("none"), rows_of("none@graph")
    lines = ["| codec | batch | s / generation | decode s | samples/s | time vs none | time vs none@graph | "
             "peak GiB | capture s | tokens equal |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, entry in report["codecs"].items():
        for r in entry["rows"]:
            rel = [f"{r['seconds'] / ref[r['batch']]['seconds']:.2f}x" if r["batch"] in ref else "-"
                   for ref in (base, base_graph)]
            capture = f"{r['setup_s']:.1f}" if name.endswith("@graph") else "-"
            same = ", ".join(f"{k.removeprefix('tokens_equal_')}: {r[k]}" for k in
                             ("tokens_equal_none", "tokens_equal_eager") if k in r) or "-"
            lines.append(f"| {name} | {r['batch']} | {r['seconds']:.3f} | {r['decode_seconds']:.3f} | "
                         f"{r['samples_per_s']:.1f} | {rel[0]} | {rel[1]} | {r['peak_gib']:.2f} | "
                         f"{capture} | {same} |")
    lines += ["", f"| codec | largest batch under {report['budget_gib']:g} GiB | samples/s | peak GiB | "
              "GiB per sample (fit) | samples/s vs none |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    none_max = (report["codecs"].get("none", {}).get("max_batch") or {}).get("samples_per_s")
    for name, entry in report["codecs"].items():
        m = entry.get("max_batch")
        if m:
            rel = f"{m['samples_per_s'] / none_max:.2f}x" if none_max else "-"
            lines.append(f"| {name} | {m['batch']} | {m['samples_per_s']:.1f} | {m['peak_gib']:.2f} | "
                         f"{m['fit_gib_per_sample']:.4f} | {rel} |")
    checks = [(n, e["memcheck"]) for n, e in report["codecs"].items() if e.get("memcheck")]
    if checks:
        lines += ["", "| codec | batch | GPU bytes freed at kv_caching(False) | accounted (allocated) | "
                  "accounted (held) | ratio vs fp16 | store ratio | K bits | V bits |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for n, c in checks:
            lines.append(f"| {n} | {c['batch']} | {c['freed_bytes']} | {c['allocated_bytes']} | "
                         f"{c['valid_bytes']} | {c['ratio']:.2f}x | {c['store_ratio']:.2f}x | "
                         f"{c['k_bits']:.2f} | {c['v_bits']:.2f} |")
    checks = report.get("checks")
    if report.get("checks_error"):
        lines += ["", f"- device checks failed: {report['checks_error']}"]
    if checks:
        syncs = ", ".join(f"{k} {v}" for k, v in checks["syncs_per_generation"].items())
        nan = checks["nan"]
        lines += ["", f"- host syncs per eager generation (B=1, scale loop only): {syncs}",
                  f"- NaN mid-generation (octopus): eager {nan['eager']}; graph replay {nan['graph']}; "
                  f"all caught: {nan['ok']}"]
    errors = [f"{n}: {e['error']}" for n, e in report["codecs"].items() if e.get("error")]
    if errors:
        lines += ["", *(f"- error {x}" for x in errors)]
    if report.get("skipped"):
        lines.append(f"\nskipped (deadline): {', '.join(report['skipped'])}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
