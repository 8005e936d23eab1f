"""GPU benchmark of the KV-cache patch: end-to-end samples/s and peak memory per codec vs none, and max batch.

For each codec at `--bits` (default 2) on the full-size AAR (d16, width 1024, random weights) with a random
SAT tokenizer: samples/s of `generate` (bf16 fast path, audio decode included; the transformer-only time is
the total minus the decode) at each batch in `--batches`, in the CUDA-graph path (rows `<codec>@graph`: the
scale loop captured in one graph by `GraphedGenerator`, capture time in `setup_s`, not in the timing; codecs
`--graphs`) and the eager path (codecs `--eager`, with the peak `torch.cuda.max_memory_allocated`, weights
included). `none` is the unpatched model (its cache grows by concatenation); `none+patch` is codec none
through the patch with window 0, a preallocated native cache (K and V written in place, attended as a view;
checked token-identical to `none`); graph and eager rows of one codec and batch are checked
token-identical. For the `--budget` codecs: the largest batch (multiple of 8) whose eager peak stays under
`--budget-gib`, found from the linear fit of peak memory over the batches above 1 and checked by running it,
with its samples/s.
Device checks (`--checks`): host syncs per eager `generate` call at B=1 (the input check included), the
first after patching and the second, each with the Python stack that made it (the patch should add exactly
one, its end-of-generation data check); a NaN put into one layer's input mid-generation must raise the
patch's ValueError, eager and from a graph replay; kernel profiles at B=1 (`--profile`: kernels per layer and
scale, their summed GPU time against the wall time, the top kernels). At `--memcheck-batch` the cache memory
freed by kv_caching(False) is compared with the patch's accounting. Whether the compiled kernels compute what
the library does is the compiled test suite's job (`OCTOPUS_AUDIO_TEST_DEVICE=cuda python -m pytest
tests/test_kernels_encode.py tests/test_cache_fused.py ...`), not this script's. Tasks run in priority order
(none and octopus in the graph path, the checks, the budget, the other codecs) and `--deadline-s` skips what
would start after it; progress is printed as it goes and the JSON rewritten after every task. Uses the
package's public names only (`octopus_audio.CODECS`, `octopus_audio.aar_patch`).

    python benchmarks/bench_patch.py --out $OUT/patch --deadline-s 540  # on a GPU
    python benchmarks/bench_patch.py --graphs none,octopus --eager '' --budget '' --checks syncs --out /tmp/p
    python benchmarks/bench_patch.py --small --device cpu --batches 1,2 --out /tmp/p  # CPU smoke test
    python benchmarks/bench_patch.py --count-launches none,octopus --out /tmp/p  # launches per scale, CPU
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import time
import traceback
import warnings
from pathlib import Path

import torch
from bench_aar import build_pipeline  # the same random-weight model (run from the repository root)

from octopus_audio import CODECS
from octopus_audio.aar_patch import AAR, AARConfig, AARPipeline, GraphedGenerator, generate, patch_aar

GIB = 2.0**30
CHECKS = ("syncs", "nan", "profile")


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


def run_once(gen, cond_BE, device: str, timer: DecodeTimer, reset_peak: bool = True):
    """One generation `gen(cond_BE)`: (seconds, decode seconds, peak bytes, tokens); reset_peak=False keeps
    the peak of what ran before (a graph's capture, whose memory pool the replays reuse)."""
    if device == "cuda" and reset_peak:
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
    if device == "cuda":  # a graph's peak is at its capture: its pool holds every intermediate of the loop
        torch.cuda.reset_peak_memory_stats()
    setup = time.perf_counter()
    graphed = GraphedGenerator(pipe, batch, cfg=4.0, top_k=200, top_p=0.95) if graph else None
    gen = graphed if graph else eager(pipe)  # GraphedGenerator(cond) replays with seed 42
    setup_s = time.perf_counter() - setup
    _, _, peak, tokens = run_once(gen, cond, device, timer, reset_peak=not graph)
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


def patch_for(pipe, name: str, bits: int):
    """The patch a codec name asks for: None for `none` (unpatched), codec none for `none+patch` with window
    0: every scale's K and V written in place into the store's preallocated buffer and attended as a view of
    it (a preallocated native cache, no concatenation)."""
    if name == "none":
        return None
    if name == "none+patch":
        return patch_aar(pipe, "none", bits, window=0)
    return patch_aar(pipe, name, bits)


def _sync_site(limit: int = 7) -> str:
    """The Python stack at a host sync, innermost first, as 'file:line function' of the frames outside torch
    and the warnings module."""
    frames = [f for f in traceback.extract_stack()[:-2]
              if "/torch/" not in f.filename and not f.filename.endswith("warnings.py")]
    return " < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames[-limit:]))


def count_syncs(pipe, batch: int) -> dict:
    """Host syncs in one eager `generate` call on the bf16 fast path (its input check and the audio decode
    included), counted by torch.cuda.set_sync_debug_mode("warn"), each attributed to the Python stack that
    made it: {"count": n, "sites": [{"count": c, "stack": "file:line fn < ..."}]}."""
    cond = condition(batch).to(pipe.device)
    sites: collections.Counter = collections.Counter()

    def show(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            sites[_sync_site()] += 1

    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            generate(pipe, cond, cfg=4.0, top_k=200, top_p=0.95, seed=42, fast=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return {"count": sum(sites.values()),
            "sites": [{"count": c, "stack": where} for where, c in sites.most_common()]}


def sync_checks(pipe, bits: int, codecs: list[str]) -> dict:
    """Host syncs per eager generation at B=1: unpatched `none`, then each codec through the patch, its first
    generation after patching ("cold": tables built, kernels already compiled by the rows before) and its
    second ("warm"). The patch should add exactly one, its end-of-generation data check."""
    out = {}
    for name in codecs:
        handle = patch_for(pipe, name, bits)
        try:
            out[name] = {"cold": count_syncs(pipe, 1), "warm": count_syncs(pipe, 1)}
        finally:
            if handle is not None:
                handle.unpatch(abandon=True)
        print("syncs", name, {k: v["count"] for k, v in out[name].items()}, flush=True)
        for when, result in out[name].items():
            for site in result["sites"]:
                print(f"  {when} x{site['count']}: {site['stack']}", flush=True)
    return out


def kernel_profile(pipe, codec: str, bits: int, batch: int, graph: bool) -> dict:
    """The GPU kernels of one generation at `batch` (after a warm-up), from torch.profiler: how many, their
    summed GPU time against the wall time of the call, and the kernels that take the most GPU time. Eager:
    `generate` (tokenizer decode included); graph: one GraphedGenerator replay (decode included)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    handle = patch_for(pipe, codec, bits)
    try:
        gen = GraphedGenerator(pipe, batch, cfg=4.0, top_k=200, top_p=0.95) if graph else eager(pipe)
        cond = condition(batch)
        gen(cond)
        sync("cuda")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            gen(cond)
            sync("cuda")
            wall = time.perf_counter() - t0
        del gen
    finally:
        if handle is not None:
            handle.unpatch(abandon=True)
    per_name: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            per_name.setdefault(e.name, []).append(e.time_range.elapsed_us())
    total = sum(sum(v) for v in per_name.values())
    top = sorted(per_name.items(), key=lambda kv: -sum(kv[1]))[:14]
    c = pipe.aar.config
    n = sum(len(v) for v in per_name.values())
    by_kind = collections.Counter()
    for name, times in per_name.items():
        by_kind[kernel_kind(name)] += sum(times)
    rest_ceiling, model_ceiling = ceilings(batch, by_kind)
    return {"codec": codec, "batch": batch, "graph": graph, "kernels": n, "gpu_us": total,
            "wall_us": wall * 1e6, "kernels_per_layer_scale": n / (c.depth * len(c.patch_nums)),
            "kind_us": dict(by_kind), "ceiling_samples_per_s": rest_ceiling,
            "model_ceiling_samples_per_s": model_ceiling,
            "top": [{"name": k[:90], "count": len(v), "us": sum(v)} for k, v in top]}


def ceilings(batch: int, kind_us: dict[str, float]) -> tuple[float | None, float | None]:
    """Samples/s that no cache could exceed at this batch, from a profile's GPU microseconds per kernel class
    (`kernel_kind`): batch / rest (as if every copy went with the cache too) and batch / (copies + rest) (the
    copies the model's own: a cache that cost nothing leaves them); None where the time is 0."""
    rest_s = kind_us.get("rest", 0.0) * 1e-6
    model_s = rest_s + kind_us.get("copy", 0.0) * 1e-6
    return (batch / rest_s if rest_s > 0 else None), (batch / model_s if model_s > 0 else None)


# kernels that a KV cache could make cheaper or remove: attention itself (ours, SDPA's), our encode and merge,
# the uncompressed path's concatenation, and every copy (counted generously: most copies are weight casts
# and layout changes outside the cache, so "rest" is a lower bound on what any cache leaves); ours are every
# Triton or Gluon kernel of the kernels package, by name (`package_kernels`)
CACHE_KERNELS = ("sdpa", "fmha", "flash", "attention", "CatArrayBatchedCopy")
COPY_KERNELS = ("copy_kernel", "direct_copy")


@functools.cache
def package_kernels() -> frozenset[str]:
    """The names of every kernel octopus_audio.kernels launches (the module-level Triton and Gluon JIT
    functions named *_kernel of its modules and subpackages, compiled or interpreted: each wraps its Python
    function as `fn`): the names a profiler shows for them."""
    import importlib
    import pkgutil

    from octopus_audio import kernels

    names = set()
    for info in pkgutil.walk_packages(kernels.__path__, f"{kernels.__name__}."):  # kinds/, impls/ included
        module = importlib.import_module(info.name)
        names.update(v.fn.__name__ for k, v in vars(module).items()
                     if k.endswith("_kernel") and callable(getattr(v, "fn", None)))
    return frozenset(names)


def kernel_kind(name: str) -> str:
    """'cache' (attention and cache work), 'copy' (dtype and layout copies) or 'rest' (the model's other
    kernels: linear layers, norms, sampling, the tokenizer decode)."""
    if name.split("(")[0].strip() in package_kernels() or any(p in name for p in CACHE_KERNELS):
        return "cache"
    return "copy" if any(p in name for p in COPY_KERNELS) else "rest"


def count_launches(codec: str, bits: int) -> dict:
    """Kernel launches per scale of one patched attention layer, counted on the CPU (CUDA not needed): the
    Triton kernels run interpreted and are counted per launch, every torch op that would launch a kernel on
    CUDA is counted per op (views and empty allocations are not), the caches defer their checks as on CUDA.
    One layer of a depth-2 width-128 AAR (2 heads of 64) is driven scale by scale in bf16, as generation
    does, twice; the second generation is counted. `codec` "none" is the unpatched layer; "none+patch" codec
    none through the patch. Returns the counts per scale (model ops included: compare with "none") and at
    the end of the generation. Must run before anything imports the kernels (it sets TRITON_INTERPRET)."""
    import os

    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["OCTOPUS_AUDIO_KERNELS"] = "kernels"
    from torch.utils._python_dispatch import TorchDispatchMode
    from triton.runtime.interpreter import InterpretedFunction

    free = ("aten.empty", "aten.view", "aten.permute", "aten.unbind", "aten.slice", "aten.select",
            "aten.narrow", "aten._unsafe_view", "aten.t.", "aten.expand", "aten.transpose", "aten.unsqueeze",
            "aten.alias",
            "aten.detach", "aten.as_strided", "aten.split", "aten.squeeze", "aten.reshape", "aten.lift_fresh",
            "aten._reshape_alias", "aten.resolve_", "aten.new_empty")
    counts: collections.Counter = collections.Counter()
    active = [False]

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if active[0] and not str(func).startswith(free):
                counts[str(func)] += 1
            return func(*args, **(kwargs or {}))

    run = InterpretedFunction.run

    def counted_run(self, *args, **kwargs):
        if not active[0]:
            return run(self, *args, **kwargs)
        counts["triton " + self.fn.__name__] += 1
        active[0] = False  # the interpreter's own torch ops are not launches
        try:
            return run(self, *args, **kwargs)
        finally:
            active[0] = True

    InterpretedFunction.run = counted_run
    cfg = AARConfig(depth=2, embed_dim=128, num_heads=2)
    torch.manual_seed(0)
    aar = AAR(cfg).eval()
    attn = aar.blocks[0].attn
    handle = patch_for(aar, codec, bits)
    if handle is not None:
        for cache in handle.caches:
            cache.defer_checks = True

    def generation(count: bool) -> tuple[list[collections.Counter], collections.Counter]:
        g = torch.Generator().manual_seed(0)
        per_scale = []
        with torch.inference_mode(), Count():
            attn.kv_caching(True)
            for pn in cfg.patch_nums:
                x = torch.randn(2, pn, cfg.embed_dim, generator=g).to(torch.bfloat16)
                before = collections.Counter(counts)
                active[0] = count
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    attn(x, None)
                active[0] = False
                per_scale.append(counts - before)
            before = collections.Counter(counts)
            active[0] = count
            attn.kv_caching(False)
            active[0] = False
        return per_scale, counts - before

    try:
        generation(False)
        per_scale, end = generation(True)
    finally:
        InterpretedFunction.run = run
        if handle is not None:
            handle.unpatch(abandon=True)
    return {"codec": codec, "per_scale": [sum(c.values()) for c in per_scale],
            "scale_1": dict(per_scale[1]), "scale_last": dict(per_scale[-1]), "end": dict(end)}


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
    attns = [block.attn for block in pipe.aar.blocks]  # the modules the patch found, in order
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
              reps: int, graph: bool = False) -> dict | None:
    """The largest multiple of 8 whose peak stays under `budget` bytes (fit on two batches, then checked;
    graph: the rows and the check in the CUDA-graph path, whose peak includes the graph's memory pool)."""
    fit = sorted((r for r in rows if r["batch"] > 1), key=lambda r: r["batch"])[-2:]
    if len(fit) < 2:
        return None
    (b0, p0), (b1, p1) = ((r["batch"], r["peak_gib"] * GIB) for r in fit)
    slope = (p1 - p0) / (b1 - b0)
    batch = int((budget - (p0 - slope * b0)) / slope) // 8 * 8
    for _ in range(4):
        if batch < 8:
            return None
        row = measure(pipe, batch, device, timer, reps, graph=graph)
        row.pop("tokens")
        if row["peak_gib"] * GIB <= budget:
            row["fit_gib_per_sample"] = slope / GIB
            return row
        batch = int(batch * 0.95) // 8 * 8
    return None


def _names(text: str, allowed: tuple[str, ...], what: str, batched: bool = False) -> list[str]:
    """Comma-separated names, each in `allowed` (batched: optionally followed by ':BATCH', a positive
    integer)."""
    names = [n for n in text.split(",") if n]

    def ok(n: str) -> bool:
        name, colon, batch = n.partition(":") if batched else (n, "", "")
        return name in allowed and (not colon or (batch.isdigit() and int(batch) > 0))

    bad = [n for n in names if not ok(n)]
    if bad:
        raise SystemExit(f"{what}: unknown {', '.join(bad)}; allowed: {', '.join(allowed)}")
    return names


def plan(graphs: list[str], eagers: list[str], budget: list[str], batches: list[int], checks: list[str],
         memcheck: list[str], profile: list[str]) -> list[tuple[str, str, int]]:
    """Tasks (name, what, batch) in priority order, so a deadline cuts the least important work:
    `none` and `octopus` in the CUDA-graph path at every batch, the device checks (host syncs with their
    stacks, NaN caught, kernel profiles at B=1), the budget codecs' eager rows at the batches above 1 and
    their largest batch under the budget, the other codecs in the graph path, the remaining eager rows, the
    cache memory checks."""
    first = [c for c in ("none", "octopus") if c in graphs]
    out: list[tuple[str, str, int]] = []

    def graph_rows(names: list[str]) -> None:
        for n in names:
            out.extend((f"{n}@graph", "batches", b) for b in batches)

    graph_rows(first)
    if "syncs" in checks:
        out.append(("device", "syncs", 1))
    if "nan" in checks:
        out.append(("octopus", "nan", 1))
    if "profile" in checks:
        for n in profile:
            name, _, batch = n.partition(":")
            out.append((name, "profile", int(batch or 1)))
    eager_done: set[tuple[str, int]] = set()
    graph_done = {f"{n}@graph" for n in first}
    for n in budget:  # eager rows, or graph rows (n ends with @graph) unless measured above
        for b in batches:
            if (b > 1 or n.endswith("@graph")) and n not in graph_done:
                out.append((n, "batches", b))
                eager_done.add((n, b))
        out.append((n, "max", 0))
    graph_done |= {n for n in budget if n.endswith("@graph")}
    graph_rows([n for n in graphs if n not in first and f"{n}@graph" not in graph_done])
    out.extend((n, "batches", b) for n in eagers for b in batches if (n, b) not in eager_done)
    return out + [(n, "memcheck", 0) for n in memcheck if n not in ("none", "none+patch")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    allowed = (*CODECS, "none+patch")
    p.add_argument("--graphs", default=",".join(CODECS),
                   help="codecs measured in the CUDA-graph path (rows <codec>@graph), every batch; 'none' is "
                        "the unpatched model, 'none+patch' codec none through the patch; '' for none")
    p.add_argument("--eager", default="none,octopus", help="codecs measured in the eager path, every batch")
    p.add_argument("--budget", default="none,octopus",
                   help="codecs whose largest batch under --budget-gib is found (their rows at the batches "
                        "above 1 are measured for the fit); codec@graph: in the CUDA-graph path")
    p.add_argument("--checks", default=",".join(CHECKS),
                   help=f"device checks to run, from {','.join(CHECKS)}: host syncs per generation with "
                        f"their stacks, a NaN caught eager and after a graph replay, kernel profiles at B=1; "
                        f"'' for none")
    p.add_argument("--profile", default="none,octopus,none@graph,octopus@graph",
                   help="kernel profiles (codec or codec@graph, at B=1 or codec[@graph]:BATCH) when --checks "
                        "has profile; each gives the GPU time of attention and cache kernels, copies and the "
                        "rest, and the samples/s no cache could exceed at that batch (batch / rest time, and "
                        "batch / (copies + rest))")
    p.add_argument("--sync-codecs", default="none,none+patch,octopus",
                   help="codecs whose host syncs per generation are counted when --checks has syncs")
    p.add_argument("--memcheck", default="octopus", help="codecs whose freed cache bytes are measured")
    p.add_argument("--bits", type=int, default=2)
    p.add_argument("--batches", default="1,64,256")
    p.add_argument("--budget-gib", type=float, default=16.0)
    p.add_argument("--reps", type=int, default=1, help="timed runs after the warm-up run (the best counts; "
                                                       "at least 3 at batch 1)")
    p.add_argument("--deadline-s", type=float, default=1e9,
                   help="skip what would start after this many seconds")
    p.add_argument("--memcheck-batch", type=int, default=64)
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true", help="depth-2 width-128 model (smoke test)")
    p.add_argument("--count-launches", default="",
                   help="only count the kernel launches per scale of one patched layer for these codecs, on "
                        "the CPU with interpreted kernels (count_launches), and print them")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if args.count_launches:
        args.out.mkdir(parents=True, exist_ok=True)
        names = _names(args.count_launches, allowed, "--count-launches")
        found = [count_launches(c, args.bits) for c in names]
        for f in found:
            print(f"{f['codec']}: launches per scale {f['per_scale']}; scale 1: {f['scale_1']}; "
                  f"end of generation: {f['end']}", flush=True)
        (args.out / "launch_counts.json").write_text(json.dumps(found, indent=1))
        return
    graphs = _names(args.graphs, allowed, "--graphs")
    eagers = _names(args.eager, allowed, "--eager")
    budget = _names(args.budget, (*allowed, *(f"{c}@graph" for c in allowed)), "--budget")
    checks = _names(args.checks, CHECKS, "--checks")
    memcheck = _names(args.memcheck, allowed, "--memcheck")
    profile = _names(args.profile, (*allowed, *(f"{c}@graph" for c in allowed)), "--profile", batched=True)
    sync_codecs = _names(args.sync_codecs, allowed, "--sync-codecs")
    batches = [int(b) for b in args.batches.split(",")]
    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    pipe = build_pipeline("small" if args.small else "full", torch.device(args.device))
    timer = DecodeTimer(pipe, args.device)
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    report: dict = {"gpu": gpu, "torch": torch.__version__, "bits": args.bits, "budget_gib": args.budget_gib,
                    "codecs": {}, "checks": {}, "skipped": [], "setup_s": time.perf_counter() - start}
    out_json = args.out / "patch_bench.json"
    seen_tokens: dict[tuple[str, int], list] = {}
    tasks = plan(graphs, eagers, budget, batches, checks, memcheck, profile)
    print(f"{len(tasks)} tasks: " + ", ".join(f"{n} {w} {b or ''}".strip() for n, w, b in tasks), flush=True)
    for name, what, batch in tasks:
        elapsed = time.perf_counter() - start
        label = f"{name} {what} {batch or ''}".strip()
        if elapsed > args.deadline_s:
            report["skipped"].append(label)
            continue
        if args.device != "cuda" and (what != "batches" or name.endswith("@graph")):
            continue
        print(f"[{elapsed:6.1f}s] {label} ...", flush=True)
        t0 = time.perf_counter()
        if what in CHECKS:
            checks_out = report["checks"].setdefault(what, {})
            key = name  # a profile at a batch above 1 is keyed name:batch (below)
            try:
                if what == "syncs":
                    checks_out.update(sync_checks(pipe, args.bits, sync_codecs))
                elif what == "nan":
                    checks_out.update(nan_checks(pipe, "octopus", args.bits))
                else:
                    codec = name.removesuffix("@graph")
                    key = name if batch == 1 else f"{name}:{batch}"
                    checks_out[key] = kernel_profile(pipe, codec, args.bits, batch, name.endswith("@graph"))
                    prof = checks_out[key]
                    kinds = ", ".join(f"{k} {v / 1e3:.2f} ms" for k, v in sorted(prof["kind_us"].items()))
                    ceiling = prof["ceiling_samples_per_s"] or 0.0
                    print(f"  {prof['kernels']} kernels ({prof['kernels_per_layer_scale']:.1f} per layer and "
                          f"scale), GPU {prof['gpu_us'] / 1e3:.2f} ms of {prof['wall_us'] / 1e3:.2f} ms wall "
                          f"({kinds}; ceiling {ceiling:.1f} samples/s)", flush=True)
                    for row in prof["top"]:
                        print(f"    {row['us']:9.0f} us  x{row['count']:5d}  {row['name']}", flush=True)
            except Exception as e:  # recorded; the timings still run
                checks_out[f"{key} error"] = f"{type(e).__name__}: {e}"[:500]
                traceback.print_exc()
            print(f"  {label}: {time.perf_counter() - t0:.1f}s", flush=True)
            out_json.write_text(json.dumps(report, indent=1))
            continue
        entry = report["codecs"].setdefault(name, {"rows": []})
        if entry.get("error"):
            report["skipped"].append(label)
            continue
        graph = name.endswith("@graph")
        base = name.removesuffix("@graph")
        handle = patch_for(pipe, base, args.bits)
        entry["repr"] = repr(handle)
        try:
            if what == "batches":
                row = measure(pipe, batch, args.device, timer, args.reps if batch > 1 else max(args.reps, 3),
                              graph=graph)
                tokens = seen_tokens[name, batch] = row.pop("tokens")
                counterpart = base if graph else f"{base}@graph"
                same_as = {"tokens_equal_none": ("none@graph" if graph else "none") if base == "none+patch"
                           else None, "tokens_equal_eager" if graph else "tokens_equal_graph": counterpart}
                for key, other in same_as.items():
                    if other is not None and (other, batch) in seen_tokens:
                        pairs = zip(tokens, seen_tokens[other, batch], strict=True)
                        row[key] = all(torch.equal(a, b) for a, b in pairs)
                entry["rows"].append(row)
            elif what == "memcheck":
                entry["memcheck"] = cache_memory_check(pipe, handle, args.memcheck_batch, args.device)
            else:
                entry["max_batch"] = max_batch(pipe, entry["rows"], args.budget_gib * GIB, args.device, timer,
                                               args.reps, graph=graph)
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
        print(f"  {label}: {time.perf_counter() - t0:.1f}s", _brief(last, name, report),
              entry.get("error", ""), flush=True)
        out_json.write_text(json.dumps(report, indent=1))
    report["wall_s"] = time.perf_counter() - start
    out_json.write_text(json.dumps(report, indent=1))
    print(markdown(report))
    (args.out / "patch_bench.md").write_text(markdown(report))


def _brief(row: dict | None, name: str, report: dict) -> str:
    """One progress line for a measured row: seconds, samples/s and the time against none's same row."""
    if not row or "seconds" not in row:
        return str(row)
    ref_name = "none@graph" if name.endswith("@graph") else "none"
    ref = {r["batch"]: r for r in report["codecs"].get(ref_name, {}).get("rows", [])}.get(row["batch"])
    rel = f", {row['seconds'] / ref['seconds']:.2f}x {ref_name}" if ref else ""
    same = {k: v for k, v in row.items() if k.startswith("tokens_equal")}
    return (f"B={row['batch']}: {row['seconds']:.4f} s, {row['samples_per_s']:.1f} samples/s, peak "
            f"{row['peak_gib']:.2f} GiB{rel} {same or ''}")


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
                             ("tokens_equal_none", "tokens_equal_eager", "tokens_equal_graph") if k in r)
            lines.append(f"| {name} | {r['batch']} | {r['seconds']:.3f} | {r['decode_seconds']:.3f} | "
                         f"{r['samples_per_s']:.1f} | {rel[0]} | {rel[1]} | {r['peak_gib']:.2f} | "
                         f"{capture} | {same or '-'} |")
    lines += ["", f"| codec | largest batch under {report['budget_gib']:g} GiB | samples/s | peak GiB | "
              "GiB per sample (fit) | samples/s vs none |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, entry in report["codecs"].items():
        m = entry.get("max_batch")
        ref = "none@graph" if name.endswith("@graph") else "none"
        none_max = (report["codecs"].get(ref, {}).get("max_batch") or {}).get("samples_per_s")
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
    checks = report.get("checks", {})
    lines.append("")
    for name, c in checks.get("syncs", {}).items():
        if isinstance(c, dict):
            lines.append(f"- host syncs per eager generate call (B=1), {name}: first after patching "
                         f"{c['cold']['count']}, second {c['warm']['count']}")
            for when in ("cold", "warm"):
                lines += [f"  - {when} x{site['count']}: `{site['stack']}`" for site in c[when]["sites"]]
        else:
            lines.append(f"- host syncs {name}: {c}")
    nan = checks.get("nan", {})
    if "eager" in nan:
        lines.append(f"- NaN mid-generation (octopus): eager {nan['eager']}; graph replay {nan['graph']}; "
                     f"all caught: {nan['ok']}")
    profiles = {n: p for n, p in checks.get("profile", {}).items() if isinstance(p, dict)}
    if profiles:
        lines += ["", "| profile (codec:batch) | kernels | per layer and scale | GPU ms (kernel sum) | "
                  "wall ms | attention+cache ms | copies ms | rest ms | ceiling samples/s (batch / rest) | "
                  "ceiling samples/s (batch / (copies + rest)) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for n, p in profiles.items():
            k = p.get("kind_us", {})
            caps = [p.get("ceiling_samples_per_s"), p.get("model_ceiling_samples_per_s")]
            ms = [f"{x / 1e3:.2f}" for x in (p["gpu_us"], p["wall_us"], *(k.get(kind, 0) for kind in
                                                                          ("cache", "copy", "rest")))]
            lines.append(f"| {n} | {p['kernels']} | {p['kernels_per_layer_scale']:.1f} | {' | '.join(ms)} | "
                         + " | ".join(f"{c:.1f}" if c else "-" for c in caps) + " |")
        for n, p in profiles.items():
            lines.append(f"\n{n}: " + "; ".join(f"{r['name'][:60]} x{r['count']} {r['us']:.0f} us"
                                                for r in p["top"][:8]))
    errors = [f"{n}: {v}" for group in checks.values() for n, v in group.items() if n.endswith(" error")]
    lines += [f"- check error {x}" for x in errors]
    errors = [f"{n}: {e['error']}" for n, e in report["codecs"].items() if e.get("error")]
    if errors:
        lines += ["", *(f"- error {x}" for x in errors)]
    if report.get("skipped"):
        lines.append(f"\nskipped (deadline): {', '.join(report['skipped'])}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
