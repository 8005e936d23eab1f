"""Compile ahead, on CUDA, the Triton kernels that generations of a patched AAR model launch (for one or
several patch configurations at once, in parallel worker processes: `compile_variants.py`, which finds and
compiles what one cache launches), and the CLIs' progress line."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Iterable
from typing import TextIO

import torch

from . import compile_variants as ahead
from .attention_modules import find_attention, model_patch_nums, sink_tokens, wide_tokens

# progress(label, done, total): `total` variants of `label` (say "octopus b=2") are not in Triton's cache yet
# and `done` of them are compiled; called with done 0 before the first
AheadProgress = Callable[[str, int, int], None]


@dataclasses.dataclass(frozen=True)
class AheadResult:
    """What compiling one configuration ahead did: `variants` the generation launches, `compiled` of them
    were not in Triton's cache, `failed` (variant label -> error) did not compile; `seconds` is the time of
    the whole call (every configuration compiles in one pool run)."""

    label: str
    variants: int
    compiled: int
    failed: dict[str, str]
    seconds: float


def _model_device(model: object) -> torch.device:
    modules = find_attention(model)
    if not modules:
        raise ValueError(f"no attention modules found in {type(model).__name__}: compile_ahead looks for the "
                         f"modules patch_aar patches")
    return modules[0].mat_qkv.weight.device


def generation_shapes(model: object, batch: int, dtype: torch.dtype) -> ahead.UnitShapes:
    """The attention shapes a generation of `batch` conditions runs on `model` (guidance doubles the rows),
    its attention computing in `dtype`."""
    modules = find_attention(model)
    patch_nums = model_patch_nums(model)
    if not modules or patch_nums is None:
        raise ValueError(f"{type(model).__name__} has no attention modules or does not say its scales "
                         f"(patch_nums); compile_ahead needs both")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an int >= 1 (conditions per generation), got {batch!r}")
    m = modules[0]
    return ahead.UnitShapes(int(m.num_heads), int(m.head_dim), patch_nums, 2 * batch, dtype)


def compile_ahead(model: object, configs: Iterable, batch: int | Iterable[int],
                  dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,), workers: int | None = None,
                  progress: AheadProgress | None = None, teacher_forced: bool = False) -> list[AheadResult]:
    """Compile the kernel variants that generations of `batch` conditions (an int, or every batch size a run
    generates) on `model` (on CUDA) launch under
    each patch configuration in `configs`, their attention in each of `dtypes` (bf16: `generate`'s default
    on CUDA; float32: its reference path), and with `teacher_forced` the fp32 encode variants of teacher
    forcing's one pass over each batch (`eval.fidelity`), into Triton's on-disk cache, in `workers`
    processes (None: one a core, at most 16), started once for all configurations. Variants already cached
    are skipped. A model that is not on CUDA compiles nothing (the CPU runs the PyTorch reference) and gives
    []. Call it before the first generation, with nothing else launching Triton kernels meanwhile.
    """
    configs = list(configs)
    device = _model_device(model)
    if device.type != "cuda":
        return []
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    batches = [batch] if isinstance(batch, int) else list(dict.fromkeys(batch))
    shapes = [generation_shapes(model, b, dtype) for b in batches for dtype in dtypes]
    target, backend = ahead.target_backend()
    start = time.perf_counter()
    found: list[tuple[str, dict[ahead.Launch, None]]] = []  # per configuration: its label and variants
    for config in configs:
        variants: dict[ahead.Launch, None] = {}
        options = dict(v_bits=config.v_bits, window=config.window, v_group=config.v_group, backend=backend,
                       native_prefix=sink_tokens(model, config.sink_scales),
                       wide_prefix=wide_tokens(model, config.sink_scales, config.wide_scales),
                       wide_bits=config.wide_bits, wide_v_bits=config.wide_v_bits)
        for shape in shapes:
            with torch.cuda.device(device):
                variants.update(dict.fromkeys(ahead.cache_launches(config.codec, config.bits, shape, device,
                                                                   **options)))
        for b in batches if teacher_forced else ():
            with torch.cuda.device(device):
                forced = generation_shapes(model, b, torch.float32)
                variants.update(dict.fromkeys(ahead.sequence_launches(config.codec, config.bits, forced,
                                                                      device, **options)))
        found.append((config.label, variants))
    # every configuration's variants in one pool run: the workers stay busy across configurations, and a
    # variant two configurations share (merge, value encode) compiles once
    todo = list(dict.fromkeys(v for _, variants in found for v in variants if not ahead.is_cached(v, target)))
    label = found[0][0] if len(found) == 1 else f"{len(found)} configurations ({found[0][0]}, ...)"
    report = (None if progress is None or not todo
              else lambda done, total, _launch: progress(label, done, total))
    with ahead.ParallelCompiler(target, workers) as compiler:
        failed = compiler.compile(todo, report)
    seconds, pending = time.perf_counter() - start, set(todo)
    return [AheadResult(name, len(variants), sum(v in pending for v in variants),
                        {v.label(): failed[v] for v in variants if v in failed}, seconds)
            for name, variants in found]


def stderr_progress(stream: TextIO | None = None) -> AheadProgress:
    """The CLIs' progress line on `stream` (default stderr), rewritten in place on a terminal:
    `compiling kernels for octopus b=2: 3/9`, ending `... 9/9, cached for next time in DIR`."""

    def show(label: str, done: int, total: int) -> None:
        out = stream or sys.stderr
        tty = out.isatty()
        line = ("\r" if tty else "") + f"compiling kernels for {label}: {done}/{total}"
        if done == total:
            out.write(f"{line}, cached for next time in {ahead.cache_dir()}\n")
        elif tty or done == 0:
            out.write(f"{line} ..." + ("" if tty else "\n"))
        out.flush()

    return show
