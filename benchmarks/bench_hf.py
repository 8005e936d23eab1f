"""OctopusCache in a transformers language model: decode speed and memory at long context, and accuracy.

`speed` (GPU): a Llama-architecture model with random weights at the size of a 1B model (Llama-3.2-1B's shape:
width 2048, 16 layers, MLP 8192, vocabulary 128256; head dim 64 with 32 query and 8 KV heads, or head dim 128
with 16 and 4, the same KV bytes a token), bf16. Per head dim and context, one real prefill at batch 1 (one
forward, SDPA) gives every layer's keys and values; each cache is then filled with them through its own
`update` (rows repeated for batch 8: decode speed does not depend on the values), and a greedy decode loop as
users run it (`model(next_token, cache=cache)`, argmax) is timed. Caches: `dynamic` (DynamicCache + SDPA),
`static` (StaticCache, eager), `hqq@B` (transformers' QuantizedCache, HQQ backend, its defaults: 128 native
tokens, groups of 64), `CODEC@B` (OctopusCache, window 1). Per cell: decode tokens/s (batch x steps / time),
ms a step, the cache's GPU memory once decoding runs (what `memory_allocated` grew by from before the fill
to after the warm-up steps: an OctopusCache holds a prompt's native K/V until the forward that attends over
them, which the fill has none of), the peak during fill and decode (weights and the prefill's source K/V left
out), or OOM. Rows are appended to `rows.jsonl` as they
finish; a rerun into the same folder skips them; `--budget-s` stops starting cells after that many seconds.
`table.md` is written from all rows at the end. Our kernels are compiled ahead, in parallel, before the first
cell (`octopus_audio.aar_patch.compile_variants`).

`accuracy` (CPU or GPU): a small random Llama (width 512, 4 layers, head dim 64 with 4 query heads a KV head,
and head dim 128), a prompt of random tokens, then teacher forcing of the uncompressed model's greedy
continuation one token a forward. Per cache: the per-step KL(uncompressed || cache) of the next-token
distribution (mean and max over steps, nats), top-1 agreement, and the relative RMS error of the attention
output (the input of `o_proj`) against the uncompressed run: layer 0 (what the cache alone does) and the mean
over layers (errors carried from earlier layers included); plus the stored bits per coordinate of K and V.

    python benchmarks/bench_hf.py speed --out $OUT/hf --budget-s 270
    (to go on after the budget: put that run's rows.jsonl in a folder of the tree and pass it as --out)
    python benchmarks/bench_hf.py speed --size tiny --device cpu --contexts 64 --out /tmp/hf   # smoke test
    python benchmarks/bench_hf.py accuracy --out benchmarks/results/raw/DATE/cpu-hf/accuracy.md
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, QuantizedCache, StaticCache

import octopus_audio
from octopus_audio.hf import OctopusCache

SIZES = {  # width, layers, MLP, vocabulary
    "1b": dict(hidden_size=2048, num_hidden_layers=16, intermediate_size=8192, vocab_size=128256),
    "small": dict(hidden_size=512, num_hidden_layers=4, intermediate_size=1024, vocab_size=4096),
    "tiny": dict(hidden_size=128, num_hidden_layers=2, intermediate_size=256, vocab_size=512),
}
HEADS = {"1b": {64: (32, 8), 128: (16, 4)}, "small": {64: (8, 2), 128: (4, 1)},  # head dim: query, KV heads
         "tiny": {64: (8, 2), 128: (4, 1)}}
SPEED_CACHES = ("dynamic", "octopus@2", "octopus@3", "octopus@4", "static", "hqq@2")
# every codec at each width with the default window, octopus also with QuantizedCache's 128 native tokens
ACCURACY_CACHES = (tuple(f"{c}@{b}" for c in octopus_audio.CODECS if c != "none" for b in (2, 3, 4))
                   + ("octopus@2:w128", "octopus@3:w128", "octopus@4:w128", "hqq@2", "hqq@3", "hqq@4"))


def llama(size: str, head_dim: int, device: torch.device, dtype: torch.dtype, max_len: int):
    """A Llama-architecture model with random weights (transformers' init, seed 0)."""
    heads, kv_heads = HEADS[size][head_dim]
    config = LlamaConfig(**SIZES[size], num_attention_heads=heads, num_key_value_heads=kv_heads,
                         head_dim=head_dim, max_position_embeddings=max_len, rope_theta=500000.0,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def make_cache(spec: str, config, max_len: int):
    """`dynamic`, `static`, `hqq@B` / `quanto@B` (QuantizedCache), or `CODEC@B` (OctopusCache; `CODEC@B:wN`
    with a native window of N tokens, default 1)."""
    spec, _, window = spec.partition(":w")
    name, _, bits = spec.partition("@")
    if name == "dynamic":
        return DynamicCache(config=config)
    if name == "static":
        return StaticCache(config=config, max_cache_len=max_len)
    if name in ("hqq", "quanto"):
        return QuantizedCache(name, config, nbits=int(bits))
    if name not in octopus_audio.CODECS:
        raise SystemExit(f"unknown cache {spec!r}: dynamic, static, hqq@B, quanto@B or CODEC@B with CODEC "
                         f"one of {', '.join(octopus_audio.CODECS)}")
    return OctopusCache(config, codec=name, bits=int(bits) if bits else None, window=int(window or 1),
                        max_cache_len=max_len)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


# ---- speed -------------------------------------------------------------------------------------------------
def prefill(model, context: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every layer's K, V [1, H, context, d] from a real prefill of `context` random tokens: one forward, or
    forwards of 8192 tokens where one does not fit."""
    gen = torch.Generator().manual_seed(context)
    ids = torch.randint(0, model.config.vocab_size, (1, context), generator=gen).to(device)
    for chunk in (context, 8192):
        cache = DynamicCache(config=model.config)
        try:
            with torch.inference_mode():
                for start in range(0, context, chunk):
                    model(ids[:, start:start + chunk], cache=cache, logits_to_keep=1)
            return [(layer.keys, layer.values) for layer in cache.layers]
        except torch.OutOfMemoryError:
            cache = None
            gc.collect()
            torch.cuda.empty_cache()
    raise torch.OutOfMemoryError(f"a prefill of {context} tokens does not fit, in one forward or in chunks")


def fill(cache, source, batch: int) -> None:
    """Put the prefill's K/V (rows repeated to `batch`) into `cache` through its own update, layer by
    layer."""
    with torch.inference_mode():
        for i, (k, v) in enumerate(source):
            rows = (batch, -1, -1, -1)
            cache.update(k.expand(*rows).contiguous(), v.expand(*rows).contiguous(), i)


def decode(model, cache, batch: int, steps: int, device: torch.device) -> float:
    """Seconds for `steps` greedy decode steps (one token a row a forward), after the caller's warm-up."""
    token = torch.zeros(batch, 1, dtype=torch.long, device=device)
    sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        for _ in range(steps):
            token = model(token, cache=cache, logits_to_keep=1).logits[:, -1:].argmax(-1)
    sync(device)
    return time.perf_counter() - start


def speed_cell(model, source, spec: str, batch: int, steps: int, warmup: int, device: torch.device) -> dict:
    context = source[0][0].shape[2]
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    base = allocated(device)
    try:
        cache = make_cache(spec, model.config, context + warmup + steps)
        start = time.perf_counter()
        fill(cache, source, batch)
        sync(device)
        fill_s = time.perf_counter() - start
        decode(model, cache, batch, warmup, device)
        kv = allocated(device) - base  # after the first steps: a prompt's native K/V live until its forward
        seconds = decode(model, cache, batch, steps, device)
        peak = (torch.cuda.max_memory_allocated(device) - base) if device.type == "cuda" else 0
        row = {"status": "ok", "tokens_per_s": batch * steps / seconds, "ms_per_step": 1e3 * seconds / steps,
               "kv_gib": kv / 2**30, "peak_gib": peak / 2**30, "fill_s": fill_s}
        if isinstance(cache, OctopusCache):
            row["held_gib"], row["fp16_gib"] = cache.nbytes / 2**30, cache.fp16_nbytes / 2**30
    except torch.OutOfMemoryError as e:
        row = {"status": "OOM", "error": str(e).splitlines()[0][:200]}
    except Exception as e:  # one cache failing leaves the other cells to run; the row says what failed
        row = {"status": "error", "error": f"{type(e).__name__}: {e}"[:300]}
    cache = None
    model.set_attn_implementation("sdpa")  # what an OctopusCache switched to `octopus` goes back
    return row


def compile_ahead(specs, cells, heads: int, head_dim: int, device: torch.device) -> str:
    """Compile, in parallel, the kernel variants OctopusCache's decode launches for these cells."""
    if device.type != "cuda":
        return "no GPU: nothing compiled ahead"
    from octopus_audio.aar_patch.compile_variants import (
        ParallelCompiler,
        UnitShapes,
        cache_launches,
        target_backend,
    )

    target, backend = target_backend()
    launches = {}
    for spec in specs:
        name, _, bits = spec.split(":w")[0].partition("@")
        if name not in octopus_audio.CODECS or name == "none":
            continue
        for context, batch in cells:
            shapes = UnitShapes(heads=heads, head_dim=head_dim, units=(context - 1, 1, 1, 1), rows=batch)
            for launch in cache_launches(name, int(bits), shapes, device, backend=backend):
                launches.setdefault(launch, None)
    start = time.perf_counter()
    with ParallelCompiler(target) as compiler:
        failed = compiler.compile(list(launches))
    seconds = time.perf_counter() - start
    return f"{len(launches)} variants compiled ahead in {seconds:.1f} s ({len(failed)} failed)"


def run_speed(args, device: torch.device) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_file = out / "rows.jsonl"
    done = set()
    if rows_file.exists():
        done = {(r["head_dim"], r["context"], r["batch"], r["cache"])
                for r in map(json.loads, rows_file.open())}
    started = time.perf_counter()
    log = (out / "log.txt").open("a")

    def say(line: str) -> None:
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    say(f"# {datetime.datetime.now().isoformat(timespec='seconds')} {describe(device)}")
    for head_dim in args.head_dims:
        todo = [(c, b, s) for c in args.contexts for b in args.batches for s in args.caches
                if (head_dim, c, b, s) not in done]
        if not todo:
            continue
        longest = max(args.contexts) + args.warmup + args.steps + 1
        model = llama(args.size, head_dim, device, torch.bfloat16, longest)
        try:
            cells = sorted({(c, b) for c, b, _ in todo})
            say(compile_ahead(args.caches, cells, model.config.num_key_value_heads, head_dim, device))
        except Exception as e:  # the kernels then compile at their first launch, in the warm-up steps
            say(f"compiling ahead failed ({type(e).__name__}: {e}); kernels compile at first use")
        for context in args.contexts:
            cells = [(b, s) for c, b, s in todo if c == context]
            if not cells:
                continue
            if time.perf_counter() - started > args.budget_s:
                say(f"budget of {args.budget_s} s spent: stopping before d={head_dim} context {context}")
                return
            try:
                source = prefill(model, context, device)
            except torch.OutOfMemoryError:
                say(f"d={head_dim} context {context}: the prefill does not fit")
                continue
            for batch, spec in cells:
                if time.perf_counter() - started > args.budget_s:
                    say(f"budget of {args.budget_s} s spent: stopping before {spec} B={batch}")
                    return
                row = {"head_dim": head_dim, "context": context, "batch": batch, "cache": spec,
                       **speed_cell(model, source, spec, batch, args.steps, args.warmup, device)}
                with rows_file.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                say(json.dumps(row))
            source = None
        model = None


def speed_table(rows_file: Path) -> str:
    rows = [json.loads(line) for line in rows_file.open()]
    base = {(r["head_dim"], r["context"], r["batch"]): r for r in rows
            if r["cache"] == "dynamic" and r["status"] == "ok"}
    lines = ["| d | context | B | cache | tokens/s | ms/step | x dynamic | KV GiB | x less KV | peak GiB |",
             "| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    def order(r):
        return (r["head_dim"], r["context"], r["batch"],
                SPEED_CACHES.index(r["cache"]) if r["cache"] in SPEED_CACHES else 99)

    for r in sorted(rows, key=order):
        head = f"| {r['head_dim']} | {r['context']} | {r['batch']} | {r['cache']} |"
        if r["status"] != "ok":
            lines.append(f"{head} {r['status']} | | | | | |")
            continue
        ref = base.get((r["head_dim"], r["context"], r["batch"]))
        speedup = f"{r['tokens_per_s'] / ref['tokens_per_s']:.2f}" if ref else ""
        less = f"{ref['kv_gib'] / r['kv_gib']:.2f}" if ref and r["kv_gib"] > 0 else ""
        lines.append(f"{head} {r['tokens_per_s']:.1f} | {r['ms_per_step']:.2f} | {speedup} | "
                     f"{r['kv_gib']:.3f} | {less} | {r['peak_gib']:.3f} |")
    return "\n".join(lines) + "\n"


# ---- accuracy ----------------------------------------------------------------------------------------------
def attention_outputs(model):
    """Forward hooks that collect each layer's attention output (the input of o_proj), per forward."""
    seen: list[list[torch.Tensor]] = [[] for _ in model.model.layers]
    hooks = [layer.self_attn.o_proj.register_forward_pre_hook(
        lambda _m, args, i=i: seen[i].append(args[0][:, -1].float().clone())) for i, layer in
        enumerate(model.model.layers)]
    return seen, hooks


def teacher_forced(model, tokens: torch.Tensor, prompt: int, cache) -> tuple[torch.Tensor, list]:
    """Next-token logits after the prompt and after each later token [steps, V], and each layer's attention
    outputs of the decode steps (the prompt's forward left out)."""
    seen, hooks = attention_outputs(model)
    try:
        with torch.inference_mode():
            logits = [model(tokens[:, :prompt], cache=cache).logits[0, -1].float()]
            for layer in seen:
                layer.clear()
            for t in range(prompt, tokens.shape[1] - 1):
                logits.append(model(tokens[:, t:t + 1], cache=cache).logits[0, -1].float())
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(logits), [torch.stack(layer) for layer in seen]


def stored_bits(cache) -> tuple[float, float]:
    """Bits per stored coordinate of K and V (side fields included), over every layer."""
    if isinstance(cache, OctopusCache):
        parts = [c.bytes_breakdown() for c in cache.caches()]
        coords = sum(p["rows"] * p["store_tokens"] for p in parts) * cache.layers[0].first.head_dim
        return (8 * sum(p["k_bytes"] for p in parts) / coords, 8 * sum(p["v_bytes"] for p in parts) / coords)
    k_bytes = v_bytes = coords = 0
    for layer in cache.layers:  # QuantizedCache: its quantized states, whatever their form
        k_bytes += tensor_bytes(layer._quantized_keys)
        v_bytes += tensor_bytes(layer._quantized_values)
        coords += layer.cumulative_length - (layer.keys.shape[-2] if layer.keys.dim() == 4 else 0)
    coords *= layer.keys.shape[0] * layer.keys.shape[1] * layer.keys.shape[-1] if layer.keys.dim() == 4 else 0
    return (8 * k_bytes / coords, 8 * v_bytes / coords) if coords else (math.nan, math.nan)


def tensor_bytes(obj) -> int:
    """Bytes of the tensors in `obj` (a tensor, or a dict, tuple or list of them); a tensor subclass that
    wraps others (quanto's packed tensors: `_data`, `_scale`, `_shift`) counts what it wraps."""
    if isinstance(obj, torch.Tensor):
        inner = [getattr(obj, n) for n in ("_data", "_scale", "_shift")
                 if isinstance(getattr(obj, n, None), torch.Tensor)]
        return sum(map(tensor_bytes, inner)) if inner else obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def run_accuracy(args, device: torch.device) -> None:
    lines = [f"# {describe(device)}; prompt {args.prompt} random tokens, {args.steps} teacher-forced steps "
             f"(the uncompressed model's greedy continuation), model size {args.size}",
             "", "| d | cache | K bits/coord | V bits/coord | KL mean | KL max | top-1 agree | attn err L0 | "
             "attn err mean |", "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    results = []
    for head_dim in args.head_dims:
        model = llama(args.size, head_dim, device, torch.float32, args.prompt + args.steps + 1)
        gen = torch.Generator().manual_seed(7)
        ids = torch.randint(0, model.config.vocab_size, (1, args.prompt), generator=gen).to(device)
        with torch.inference_mode():
            tokens = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    max_new_tokens=args.steps, min_new_tokens=args.steps, pad_token_id=0,
                                    cache=DynamicCache(config=model.config))
        ref_logits, ref_attn = teacher_forced(model, tokens, args.prompt, DynamicCache(config=model.config))
        ref_logp = ref_logits.log_softmax(-1)
        model.set_attn_implementation("sdpa")
        for spec in args.caches:
            cache = make_cache(spec, model.config, tokens.shape[1])
            logits, attn = teacher_forced(model, tokens, args.prompt, cache)
            logp = logits.log_softmax(-1)
            kl = (ref_logp.exp() * (ref_logp - logp)).sum(-1)
            agree = (logits.argmax(-1) == ref_logits.argmax(-1)).float().mean().item()
            errs = [((a - r).norm() / r.norm()).item() for a, r in zip(attn, ref_attn, strict=True)]
            k_bits, v_bits = stored_bits(cache)
            row = {"head_dim": head_dim, "cache": spec, "k_bits": k_bits, "v_bits": v_bits,
                   "kl_mean": kl.mean().item(), "kl_max": kl.max().item(), "top1": agree, "attn_l0": errs[0],
                   "attn_mean": sum(errs) / len(errs)}
            results.append(row)
            lines.append(f"| {head_dim} | {spec} | {k_bits:.2f} | {v_bits:.2f} | {row['kl_mean']:.2e} | "
                         f"{row['kl_max']:.2e} | {agree:.3f} | {errs[0]:.4f} | {row['attn_mean']:.4f} |")
            print(lines[-1], flush=True)
            model.set_attn_implementation("sdpa")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))


def describe(device: torch.device) -> str:
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    import transformers

    return (f"{gpu}, torch {torch.__version__}, transformers {transformers.__version__}, python "
            f"{sys.version.split()[0]}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("speed", "accuracy"))
    parser.add_argument("--out", required=True,
                        help="speed: a folder; accuracy: a Markdown file (JSON beside)")
    parser.add_argument("--size", choices=tuple(SIZES), default=None,
                        help="default: 1b (speed), small (accuracy)")
    parser.add_argument("--device", default=None, help="default: cuda (speed), cpu (accuracy)")
    ints = lambda s: [int(x) for x in s.split(",")]
    parser.add_argument("--head-dims", type=ints, default=[64, 128])
    parser.add_argument("--contexts", type=ints, default=[4096, 32768, 131072])
    parser.add_argument("--batches", type=ints, default=[1, 8])
    parser.add_argument("--caches", type=lambda s: s.split(","), default=None)
    parser.add_argument("--steps", type=int, default=None, help="timed decode steps (speed, default 16); "
                        "teacher-forced steps (accuracy, default 32)")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=512, help="accuracy: prompt tokens")
    parser.add_argument("--budget-s", type=float, default=math.inf, help="speed: start no cell after this")
    args = parser.parse_args(argv)
    speed = args.mode == "speed"
    args.size = args.size or ("1b" if speed else "small")
    args.caches = args.caches or list(SPEED_CACHES if speed else ACCURACY_CACHES)
    args.steps = args.steps or (16 if speed else 32)
    device = torch.device(args.device or ("cuda" if speed else "cpu"))
    if speed:
        run_speed(args, device)
        rows_file = Path(args.out) / "rows.jsonl"
        if rows_file.exists():
            (Path(args.out) / "table.md").write_text(f"{describe(device)}\n\n{speed_table(rows_file)}")
            print(speed_table(rows_file))
    else:
        run_accuracy(args, device)


if __name__ == "__main__":
    main()
