"""Compile ahead: the Triton kernel variants a compressed cache launches for one sequence, found by driving a
cache with the sequence's shapes while the launches are recorded instead of run, then compiled in parallel
worker processes into Triton's on-disk cache, so the first real generation only loads them.

A variant is what Triton compiles once: the kernel, its compile-time (constexpr) arguments, the
specialisation of its other arguments (pointer dtypes and 16-byte alignment; integers equal to 1 or
divisible by 16 unless the kernel lists them in `do_not_specialize`) and the launch options (warps,
stages). `cache_launches` returns the distinct variants of one sequence; a `ParallelCompiler` compiles them.

Triton keeps what it compiles under `TRITON_CACHE_DIR` (default `~/.triton/cache`) across runs; a variant
found there compiles in milliseconds. Workers are spawned processes (Triton's compiler holds the GIL), each
compiling whole variants with `triton.compile` for the parent's GPU target; they need no GPU context.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch

log = logging.getLogger(__name__)

# progress(done, total, launch or None): called once before the first compile (done 0) and after each
Progress = Callable[[int, int, "Launch | None"], None]


@dataclasses.dataclass(frozen=True)
class UnitShapes:
    """The attention shapes a cache sees in one sequence: `rows` batch rows (AAR with guidance: twice the
    conditions) x `heads` KV heads of `head_dim`, one unit of `units[i]` tokens at a time (AAR: the scales'
    token counts, `patch_nums`), K/V/q in `dtype` (the dtype the attention runs in: bf16 under autocast)."""

    heads: int
    head_dim: int
    units: tuple[int, ...]
    rows: int
    dtype: torch.dtype = torch.bfloat16

    def __post_init__(self) -> None:
        for name in ("heads", "head_dim", "rows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        units = tuple(self.units)
        if not units or any(isinstance(u, bool) or not isinstance(u, int) or u < 1 for u in units):
            raise ValueError(f"units must be a non-empty sequence of token counts >= 1, got {self.units!r}")
        object.__setattr__(self, "units", units)
        allowed = (torch.float32, torch.float16, torch.bfloat16)
        if self.dtype not in allowed:
            raise ValueError(f"dtype must be one of {', '.join(map(str, allowed))}, got {self.dtype}")


@dataclasses.dataclass(frozen=True)
class Launch:
    """One compiled variant: the kernel (`module:name`) and what `JITFunction.run` hands Triton's compiler for
    it, as it hands them (the order and types of `attrs` and `options` enter the cache key): the signature
    (argument name -> type), constexprs (a @triton.jit function as its JitRef) and attributes (alignment)
    keyed by argument path, and the compile options. Equal variants compare and hash equal through `key`."""

    kernel: str
    key: str
    signature: dict = dataclasses.field(compare=False)
    constexprs: dict = dataclasses.field(compare=False)
    attrs: dict = dataclasses.field(compare=False)
    options: dict = dataclasses.field(compare=False)

    @property
    def name(self) -> str:
        return self.kernel.rsplit(":", 1)[-1]

    def label(self) -> str:
        names = list(self.signature)
        shown = {names[i[0]]: v for i, v in self.constexprs.items()
                 if names[i[0]] in ("SCORES", "ENCODE", "SCORE_STEP", "K_BITS", "V_BITS", "BLOCK_M",
                                    "BLOCK_N", "BLOCK_T", "DIRECT", "EXACT", "CHECK", "ALIGNED", "OPD")}
        return f"{self.name}({', '.join(f'{k}={v}' for k, v in shown.items())})"


# ---- recording launches ----------------------------------------------------------------------------------

def _kernel_classes() -> tuple[type, ...]:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    return JITFunction, InterpretedFunction


@contextlib.contextmanager
def recording(run: bool = False) -> Iterator[list[tuple[object, tuple, dict]]]:
    """Record every `kernel[grid](*args, **kwargs)` launch in this process as (kernel, args, kwargs); with
    `run` False (default) nothing is launched or compiled. Patches the Triton kernel classes' `run` for the
    duration: no other thread may launch Triton kernels meanwhile."""
    calls: list[tuple[object, tuple, dict]] = []
    saved = {cls: cls.run for cls in _kernel_classes()}

    def wrap(inner):
        def record(self, *args, grid, warmup, **kwargs):
            if not warmup:
                calls.append((self, args, dict(kwargs)))
            return inner(self, *args, grid=grid, warmup=warmup, **kwargs) if run else None
        return record

    try:
        for cls, inner in saved.items():
            cls.run = wrap(inner)
        yield calls
    finally:
        for cls, inner in saved.items():
            cls.run = inner


_JIT_VIEWS: dict[int, object] = {}


def _as_jit(kernel):
    """The JITFunction of `kernel` (an interpreted kernel under TRITON_INTERPRET=1 gets a compiled twin built
    from the same function and decorator arguments)."""
    from triton.runtime.jit import JITFunction

    if isinstance(kernel, JITFunction):
        return kernel
    twin = _JIT_VIEWS.get(id(kernel))
    if twin is None:
        twin = _JIT_VIEWS[id(kernel)] = JITFunction(kernel.fn, **kernel.kwargs)
    return twin


def describe(kernel, args: tuple, kwargs: dict, backend) -> Launch:
    """The variant a launch `kernel[grid](*args, **kwargs)` compiles for `backend` (a Triton compiler
    backend for the target GPU), derived as `JITFunction.run` derives it (binder, then `_pack_args`)."""
    from triton import knobs
    from triton.runtime.jit import create_function_from_signature

    fn = _as_jit(kernel)
    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    if hasattr(knobs.compilation, "fpsan_homomorphic_casts"):  # Triton >= 3.7 passes it too (3.6 does not)
        kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
    binders = fn.__dict__.setdefault("_ahead_binders", {})
    binder = binders.get(id(backend))
    if binder is None:
        binder = binders[id(backend)] = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    constexprs = {path: _as_ref(value) for path, value in constexprs.items()}
    kernel = f"{fn.fn.__module__}:{fn.fn.__qualname__}"
    key = repr((kernel, sorted(signature.items()), sorted(constexprs.items(), key=repr), attrs,
                sorted(options.__dict__.items())))
    return Launch(kernel, key, signature, constexprs, attrs, dict(options.__dict__))


@dataclasses.dataclass(frozen=True)
class JitRef:
    """A compile-time argument that is a @triton.jit function (a decode kind's helper, kernels/kinds/kind.py),
    by its module and name: what a `Launch` holds for it, so it travels to the compiling processes."""

    module: str
    name: str

    def __str__(self) -> str:
        return f"{self.module.rsplit('.', 1)[-1]}.{self.name}"

    def resolve(self):
        return _as_jit(getattr(importlib.import_module(self.module), self.name))


def _as_ref(value):
    """`value`, or its JitRef where it is a @triton.jit function (compiled or interpreted)."""
    if isinstance(value, _kernel_classes()):
        return JitRef(value.fn.__module__, value.fn.__qualname__)
    return value


def target_backend(target=None):
    """(target, compiler backend): `target` (a triton GPUTarget) or the current GPU's."""
    from triton.compiler.compiler import make_backend
    from triton.runtime import driver

    target = target or driver.active.get_current_target()
    return target, make_backend(target)


# ---- what one sequence launches --------------------------------------------------------------------------

def _unit(shapes: UnitShapes, tokens: int, device: torch.device, gen: torch.Generator):
    """q, k, v [rows, heads, tokens, head_dim] laid out as an attention layer makes them: views of one
    fused projection [rows, tokens, 3, heads, head_dim], q and k rescaled into new tensors of that memory
    order (the cosine attention's normalisation), v a view."""
    qkv = torch.randn(shapes.rows, tokens, 3, shapes.heads, shapes.head_dim, generator=gen, device=device,
                      dtype=torch.float32).to(shapes.dtype)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    return q * 1, k * 1, v


def cache_launches(codec: str, bits: int, shapes: UnitShapes, device: torch.device | str,
                   v_bits: int | None = None, window: int = 1, v_group: int = 16, backend=None,
                   defer_checks: bool | None = None, native_prefix: int = 0, wide_prefix: int = 0,
                   wide_bits: int = 4, wide_v_bits: int | None = None) -> list[Launch]:
    """The distinct variants a CompressedKVCache (`codec`, key `bits`, value `v_bits`, `window`,
    `v_group`, `native_prefix` tokens, `wide_prefix` tokens at `wide_bits` / `wide_v_bits`) launches over
    one sequence of `shapes` on `device`: a cache is driven unit by unit (append, then attend, as a patched
    attention layer does) with every launch recorded, not run; `backend` as `target_backend` gives it
    (default: the current GPU's). A codec that runs no kernel gives []."""
    from octopus_audio.cache import CompressedKVCache, sequence_capacities

    device = torch.device(device)
    if backend is None:
        backend = target_backend()[1]
    capacity, native_capacity = sequence_capacities(shapes.units, window, native_prefix, wide_prefix)
    cache = CompressedKVCache(codec, bits, shapes.head_dim, window=window, v_group=v_group, v_bits=v_bits,
                              capacity=capacity, defer_checks=defer_checks, native_prefix=native_prefix,
                              native_capacity=native_capacity, wide_prefix=wide_prefix, wide_bits=wide_bits,
                              wide_v_bits=wide_v_bits)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.inference_mode(), recording() as calls:
        if device.type == "cuda":
            cache.prepare(shapes.heads, device)
        for tokens in shapes.units:
            q, k, v = _unit(shapes, tokens, device, gen)
            cache.append(k, v)
            cache.attend(q, 1.0 / shapes.head_dim ** 0.5)
        cache.reset()
    return launches_of(calls, backend)


def sequence_launches(codec: str, bits: int, shapes: UnitShapes, device: torch.device | str,
                      v_bits: int | None = None, window: int = 1, v_group: int = 16,
                      backend=None, native_prefix: int = 0, wide_prefix: int = 0, wide_bits: int = 4,
                      wide_v_bits: int | None = None) -> list[Launch]:
    """The distinct variants one `cache.block_causal.attend_sequence` over a whole sequence of `shapes`
    launches (teacher forcing's one pass: the encode of the tokens a generation stores, the wide prefix's at
    its widths, on k and v laid out as an attention layer makes them; its attention is PyTorch's), recorded,
    not run. `backend` and the cache's arguments as in `cache_launches`. A codec that runs no kernel, or a
    sequence that stores nothing, gives []."""
    from octopus_audio.cache import CompressedKVCache, encode_sequence, stored_parts, stored_span

    device = torch.device(device)
    if backend is None:
        backend = target_backend()[1]
    cache = CompressedKVCache(codec, bits, shapes.head_dim, window=window, v_group=v_group, v_bits=v_bits,
                              native_prefix=native_prefix, wide_prefix=wide_prefix, wide_bits=wide_bits,
                              wide_v_bits=wide_v_bits)
    start, stop = stored_span(shapes.units, window, native_prefix)
    if stop == start or cache.value_quantizer is None:
        return []
    _, k, v = _unit(shapes, sum(shapes.units), device, torch.Generator(device=device).manual_seed(0))
    with torch.inference_mode(), recording() as calls:
        for a, z, codec_, quant in stored_parts(start, stop, cache.codec, cache.value_quantizer, cache.wide):
            encode_sequence(codec_, quant, k[:, :, a:z], v[:, :, a:z])
    return launches_of(calls, backend)


def launches_of(calls: Iterable[tuple[object, tuple, dict]], backend) -> list[Launch]:
    """The distinct variants of recorded launches (`recording`), in first-launch order."""
    found: dict[Launch, None] = {}
    for kernel, args, kwargs in calls:
        found.setdefault(describe(kernel, args, kwargs, backend), None)
    return list(found)


# ---- compiling them --------------------------------------------------------------------------------------

def default_workers() -> int:
    """One worker a core, at most 16 (each worker holds a Python with torch and triton, ~0.5 GB)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(16, cores))


def _source(launch: Launch):
    from triton.compiler import ASTSource

    module, name = launch.kernel.split(":")
    fn = _as_jit(getattr(importlib.import_module(module), name))
    if getattr(fn, "is_gluon", lambda: False)():  # the Gluon attention kernel (kernels/impls/gluon/flash.py)
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    constexprs = {path: v.resolve() if isinstance(v, JitRef) else v for path, v in launch.constexprs.items()}
    return ASTSource(fn, launch.signature, constexprs=constexprs, attrs=launch.attrs)


def is_cached(launch: Launch, target) -> bool:
    """Whether Triton's on-disk cache holds `launch` compiled for `target` (what `triton.compile` looks up
    first: the same key, from the source, the backend, the options and the cache-invalidating
    environment)."""
    import hashlib

    from triton.compiler.compiler import get_cache_invalidating_env_vars, get_cache_key, make_backend
    from triton.runtime.cache import get_cache_manager

    src = _source(launch)
    backend = make_backend(target)
    options = backend.parse_options(dict(launch.options, **src.parse_options()))
    key = get_cache_key(src, backend, options, env_vars=get_cache_invalidating_env_vars())
    manager = get_cache_manager(hashlib.sha256(key.encode("utf-8")).hexdigest())
    return manager.get_group(f"{src.name[:150]}.json") is not None


def compile_launch(item: tuple[Launch, object]) -> str | None:
    """Compile one variant for a target into Triton's cache (a worker's job; `item` is (launch, target)):
    None, or the error's text."""
    launch, target = item
    try:
        import triton

        triton.compile(_source(launch), target=target, options=launch.options)
    except Exception as e:  # reported to the caller, which names the variant
        return f"{type(e).__name__}: {e}"
    return None


def _indexed(job: tuple) -> tuple[int, str | None]:
    compile_fn, i, item = job
    return i, compile_fn(item)


class ParallelCompiler:
    """Compiles variants for one GPU `target` in `workers` spawned processes (None: `default_workers`),
    started at the first batch with more than one variant to compile and kept until `close()` (or the end of
    `with`), so several batches pay the workers' start once. `compile_fn(( launch, target))` returns None or
    an error text (tests pass a stand-in)."""

    def __init__(self, target, workers: int | None = None,
                 compile_fn: Callable[[tuple[Launch, object]], str | None] = compile_launch) -> None:
        workers = default_workers() if workers is None else workers
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        self.target = target
        self.workers = workers
        self.compile_fn = compile_fn
        self._pool = None

    def compile(self, launches: Sequence[Launch], progress: Progress | None = None) -> dict[Launch, str]:
        """Compile `launches`; returns those that failed, with their error (they compile again, and fail
        visibly, at their first launch). `progress` is called as `Progress` says."""
        total = len(launches)
        if progress is not None:
            progress(0, total, None)
        jobs = [(self.compile_fn, i, (launch, self.target)) for i, launch in enumerate(launches)]
        if self._pool is None and self.workers > 1 and total > 1:
            self._pool = multiprocessing.get_context("spawn").Pool(self.workers)
        results = (self._pool.imap_unordered(_indexed, jobs) if self._pool is not None and total > 1
                   else map(_indexed, jobs))
        failed: dict[Launch, str] = {}
        for done, (i, error) in enumerate(results, 1):
            if error is not None:
                failed[launches[i]] = error
                log.warning("compiling %s ahead failed: %s", launches[i].label(), error)
            if progress is not None:
                progress(done, total, launches[i])
        return failed

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool.join()
            self._pool = None

    def __enter__(self) -> ParallelCompiler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def cache_dir() -> str:
    """Where Triton keeps compiled kernels across runs (TRITON_CACHE_DIR, default ~/.triton/cache)."""
    from triton import knobs

    return knobs.cache.dir
