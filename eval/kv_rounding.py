"""`rounded_kv_cache`: every key and value rounded to bfloat16 as it enters an AAR model's KV cache.

The eval's `reference (bf16 KV)` row: the uncompressed model with the smallest perturbation of its cache that
a 16-bit store makes (the codecs' byte accounting compares against 16-bit storage). Nothing else changes: the
queries, the residual stream and the model's weights keep their precision, and outside caching mode
(training) the model is untouched.

How: each attention module's `_qkv(x) -> (q, k, v)` (our `aar_patch.attention.SelfAttention`, whose caching
forward appends exactly the k and v it returns, then attends over the cache) is wrapped by an instance
attribute that, while `caching` is on, returns `k.to(bf16).to(k.dtype)` and the same for v. Since the
current scale's k and v are attended through the cache too, every key and value the model attends over is
rounded; the result is deterministic on the CPU in fp32. Under a model already in bf16 (autocast on CUDA)
the rounding changes nothing. Leaving the `with` block restores the modules.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from octopus_audio.aar_patch.patch import find_attention

_WRAPPED = "_qkv"  # the instance attribute installed on each attention module
KVTransform = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`x` rounded to `dtype` (round to nearest even) and returned in its own dtype."""
    return x.to(dtype).to(x.dtype)


def _install(m: nn.Module, index: int, transform: KVTransform) -> None:
    original = m._qkv

    def _qkv(x_BLC: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q_BHLD, k_BHLD, v_BHLD = original(x_BLC)
        if not m.caching:
            return q_BHLD, k_BHLD, v_BHLD
        return (q_BHLD, *transform(index, k_BHLD, v_BHLD))

    m._qkv = _qkv


@contextlib.contextmanager
def transformed_kv_cache(model: object, transform: KVTransform) -> Iterator[list[nn.Module]]:
    """Inside the block, every key and value entering a KV cache of `model` is replaced by
    `transform(layer_index, k_BHLD, v_BHLD) -> (k, v)` (layer_index: the module's place in
    `find_attention`'s order). The modules' requirements and errors are those of `rounded_kv_cache`."""
    modules = find_attention(model)
    if not modules:
        raise ValueError(f"no attention modules found in {type(model).__name__}: nothing to round")
    for i, m in enumerate(modules):
        if not callable(getattr(m, "_qkv", None)):
            raise ValueError(f"attention layer {i} ({type(m).__name__}) has no `_qkv`; rounding its cache "
                             f"needs octopus_audio.aar_patch's SelfAttention")
        if _WRAPPED in m.__dict__:
            raise RuntimeError(f"attention layer {i} already has its own `_qkv` (a rounding block inside "
                               f"another?); leave the first block before entering a second")
    try:
        for i, m in enumerate(modules):
            _install(m, i, transform)
        yield modules
    finally:
        for m in modules:
            m.__dict__.pop(_WRAPPED, None)


@contextlib.contextmanager
def rounded_kv_cache(model: object, dtype: torch.dtype = torch.bfloat16) -> Iterator[list[nn.Module]]:
    """Inside the block, every key and value entering a KV cache of `model` is rounded to `dtype`.

    model: an `AARPipeline`, an `AAR` or anything `aar_patch.patch.find_attention` finds attention modules
    in; each must have `_qkv` (our SelfAttention). Yields the wrapped modules. A model without attention
    modules, a module without `_qkv`, or one already wrapped is a ValueError / RuntimeError before any
    module is touched.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype such as torch.bfloat16, got {dtype!r}")
    with transformed_kv_cache(model, lambda _, k, v: (round_to(k, dtype), round_to(v, dtype))) as modules:
        yield modules


__all__ = ["round_to", "rounded_kv_cache", "transformed_kv_cache"]
