"""Do two checkouts compile the same kernels? Every launch the public launchers make for a corpus of codecs,
bit widths and shapes, captured on the CPU (nothing runs), compiled for sm_90 (no GPU needed: a triton with
ptxas) and hashed by its PTX body (debug lines stripped).

    python benchmarks/lab/ptx_equivalence.py capture OUT.json [--jobs 2] [--kernel NAME]   # in the checkout
    # to hash; --kernel: only that kernel's launches (e.g. _attn_fwd_kernel)
    python benchmarks/lab/ptx_equivalence.py compare BEFORE.json AFTER.json

Run `capture` once per checkout (for an older one: PYTHONPATH at a copy of its checkout; one from before
the layers moved into octopus_audio/ needs kernels/, aar_patch/, eval/ linked inside its octopus_audio/).
Identical hashes for a launch mean the same machine code, hence the same numbers; `compare` lists the
launches whose PTX differs. Launches are recorded by patching `JITFunction.run` (nothing runs), and a
compile-time argument that is a @triton.jit function (a decode kind's helper) travels to the compiling
process by its module and name.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import importlib
import inspect
import json
import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

CAPTURED: list = []
CODECS = ("turboquant-mse", "turboquant-qjl", "polarquant", "octopus", "octopus-qjl")


def _patch_kernels() -> None:
    """Every Triton kernel launch records (kernel, args, kwargs) in CAPTURED instead of running."""
    from triton.runtime.jit import JITFunction

    def record(self, *args, grid, warmup, **kwargs):
        if not warmup:
            CAPTURED.append((self, args, kwargs))

    JITFunction.run = record


def _portable(value):
    """A compile-time argument as it can travel to another process: a @triton.jit function by name."""
    from triton.runtime.jit import JITFunction

    if isinstance(value, JITFunction):
        return ("jit", value.fn.__module__, value.fn.__qualname__)
    return value


def _local(value):
    if isinstance(value, tuple) and len(value) == 3 and value[0] == "jit":
        return getattr(importlib.import_module(value[1]), value[2])
    return value


def _cases() -> list[tuple]:
    """(kind, codec, bits, d, heads, queries, store length, window, dtype, GQA ratio)."""
    out = []
    for name in CODECS:
        for bits in (2, 4):
            out.append(("attn", name, bits, 64, 4, 75, 380, 75, "bf16", 1))
            out.append(("attn", name, bits, 128, 2, 1, 3000, 1, "fp32", 1))
        out.append(("attn", name, 3, 128, 2, 33, 455, 1, "bf16", 2))
        out.append(("attn", name, 3, 128, 2, 1, 600, 70, "bf16", 1))
        for bits in (2, 3):
            out.append(("enc", name, bits, 64, 4, 0, 0, 0, "bf16", 1))
        out.append(("enc", name, 2, 128, 2, 0, 0, 0, "fp32", 1))
        out.append(("unit", name, 2, 64, 4, 0, 0, 0, "bf16", 1))
    out.append(("vals", "", 2, 64, 4, 0, 0, 0, "bf16", 1))
    out.append(("vals", "", 3, 64, 4, 0, 0, 0, "fp32", 1))
    return out


def _run_case(case) -> None:
    import torch

    import octopus_audio.kernels as kernels
    from octopus_audio.cache import kernel_codec
    from octopus_audio.codecs import get_codec

    kind, name, bits, d, h, tq, length, win, dt, grp = case
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dt]
    g = torch.Generator().manual_seed(1)
    if kind == "vals":
        kernels.encode_values(torch.randn(2, h, 100, d, generator=g).to(dtype), bits, check_range=False)
        return
    codec = get_codec(name, bits, d, seed=3)
    kc = kernel_codec(codec, h, "cpu")
    if kind == "enc":
        kernels.encode_keys(torch.randn(2, h, 100, d, generator=g).to(dtype), kc)
        return
    cap = length + 5 if kind == "attn" else 200

    def words(n):
        return torch.randint(-2**31, 2**31, (2, h, cap, n), generator=g, dtype=torch.int64).to(torch.int32)

    keys = kernels.PackedKeys(words(codec.code_words), torch.rand(2, h, cap).bfloat16(),
                              words(-(-d // 32)) if codec.qjl else None,
                              torch.rand(2, h, cap).bfloat16() if codec.qjl else None)
    values = kernels.PackedValues(words(-(-d * bits // 32)), torch.rand(2, h, cap, d // 16).half(),
                                  torch.rand(2, h, cap, d // 16).half(), bits)
    if kind == "unit":
        k = torch.randn(2, h, 75, d, generator=g).to(dtype)
        kernels.encode_unit(k, torch.randn_like(k), kc, keys, values, 64, torch.zeros(2))
        return
    q = torch.randn(2, h * grp, tq, d, generator=g).to(dtype)
    k_win = torch.randn(2, h, win, d, generator=g).to(dtype)
    kernels.attention(q, keys, values, length, k_win, torch.randn_like(k_win), kc, scale=0.1)


def _describe(fn, args, kwargs):
    """(signature, constexprs, attributes, options) of one captured launch, specialised as triton does
    (pointers and ints divisible by 16, ints equal to 1 folded) unless the kernel says otherwise."""
    import torch

    types = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int32: "i32",
             torch.int16: "i16", torch.int64: "i64", torch.uint8: "u8", torch.int8: "i8"}
    params = fn.arg_names
    const_names = {p.name for p in fn.params if p.is_constexpr}
    opts = {k: kwargs[k] for k in ("num_warps", "num_stages", "maxnreg", "enable_fp_fusion") if k in kwargs}
    values = dict(zip(params, args, strict=False))
    values.update({k: v for k, v in kwargs.items() if k not in opts})
    keep = {params[i] if isinstance(i, int) else i for i in (fn.do_not_specialize or ())}
    sig, consts, attrs = {}, {}, {}
    for i, p in enumerate(params):
        if p not in values:
            default = fn.params[i].default
            values[p] = None if default is inspect.Parameter.empty else default
        v = values[p]
        if p in const_names or v is None or not isinstance(v, torch.Tensor | int | float):
            sig[p], consts[(i,)] = "constexpr", _portable(v)
        elif isinstance(v, torch.Tensor):
            sig[p] = "*" + types[v.dtype]
            if v.data_ptr() % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, bool):
            sig[p] = "i1"
        elif isinstance(v, int) and v == 1 and p not in keep:
            sig[p], consts[(i,)] = "constexpr", 1
        elif isinstance(v, int):
            sig[p] = "i64" if abs(v) >= 2**31 else "i32"
            if v % 16 == 0 and p not in keep:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[p] = "fp32"
    return sig, consts, attrs, opts


def _compile(item) -> tuple[str, int]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, name, sig, consts, attrs, opts = item
    fn = getattr(importlib.import_module(module), name)
    consts = {k: _local(v) for k, v in consts.items()}
    options = {"num_stages": 1, "enable_fp_fusion": True, **opts}
    ptx = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                         options=options).asm["ptx"]
    lines = [line for line in ptx.splitlines()
             if not line.strip().startswith((".loc", ".file", "//", "$L__", ".section"))]
    text = re.sub(r"\.debug\w*", "", "\n".join(lines))
    body = text[text.find(".visible .entry"):]
    body = body[:body.find("\n}")]
    return hashlib.sha256(body.encode()).hexdigest()[:16], len(body)


def capture(out: str, jobs: int, kernel: str | None = None) -> None:
    _patch_kernels()
    items = {}
    for case in _cases():
        CAPTURED.clear()
        _run_case(case)
        for n, (fn, args, kwargs) in enumerate(CAPTURED):
            if kernel is not None and fn.__name__ != kernel:
                continue
            sig, consts, attrs, opts = _describe(fn, args, kwargs)
            key = json.dumps([fn.__name__, {fn.arg_names[k[0]]: str(v) for k, v in consts.items()}, sig,
                              sorted(attrs), opts], sort_keys=True)
            label = f"{case}#{n} {fn.__name__}"
            items.setdefault(key, (label, (fn.__module__, fn.__name__, sig, consts, attrs, opts)))
    print(f"{len(items)} distinct launches", flush=True)
    results = {}
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        futures = {pool.submit(_compile, item): label for label, item in items.values()}
        for future in concurrent.futures.as_completed(futures):
            digest, size = future.result()
            results[futures[future]] = {"hash": digest, "len": size}
            print(futures[future], digest, flush=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)


def compare(before: str, after: str) -> int:
    a, b = (json.load(open(path)) for path in (before, after))
    differ = [k for k in sorted(set(a) | set(b)) if a.get(k, {}).get("hash") != b.get(k, {}).get("hash")]
    for k in differ:
        print("differs:", k, a.get(k, {}).get("hash"), b.get(k, {}).get("hash"))
    same = len(set(a) & set(b)) - len([k for k in differ if k in a and k in b])
    print(f"{same} identical, {len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "capture":
        capture(sys.argv[2], int(sys.argv[sys.argv.index("--jobs") + 1]) if "--jobs" in sys.argv else 2,
                sys.argv[sys.argv.index("--kernel") + 1] if "--kernel" in sys.argv else None)
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        raise SystemExit(compare(sys.argv[2], sys.argv[3]))
    else:
        raise SystemExit(__doc__)
