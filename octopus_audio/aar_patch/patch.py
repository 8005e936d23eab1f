"""`patch_aar`: a compressed KV cache (one per attention layer) under AAR's attention; `unpatch` undoes it.

The patch finds attention modules by duck typing (the released code's attribute names, see
`ATTENTION_ATTRIBUTES`), so it works on our `AARPipeline`, a bare transformer, or the released model objects.
Per patched module it replaces two instance attributes and nothing else:

- `kv_caching(enable)`: calls the original (which sets `caching` and clears `cached_k/v`), then empties this
  layer's compressed cache. Turning caching on while the cache still holds part of a generation is a
  RuntimeError (never a silent mix). Turning it off first snapshots the layer's byte accounting, so
  `handle.stats()` describes the generation that just ended.
- `forward(x, attn_bias)`: outside caching mode (training) it is the original forward, except inside
  `forced_sequence(model, units)` (teacher forcing), where a whole sequence attends as the compressed cache
  would serve each scale (`cache.block_causal.attend_sequence`), in one pass.
  In caching mode one call is one unit (one scale): q, k, v are computed as the original does, k and v
  ([B, H, L, d], k unit-norm under cosine attention) are appended to the cache, and q attends over the
  compressed scales and the native window in one softmax with the module's softmax scale; then `proj`
  (and `proj_drop` when the module has one).

Numerics: a module that exposes `_qkv(x) -> (q, k, v)` and `_project(o)` (our `SelfAttention`) is used through
those, so its own dtype handling is kept; otherwise the released math is applied (fused linear with bias
`cat(q_bias, zero_k_bias, v_bias)`, cosine attention when `attn_l2_norm` is true or absent with a
`scale_mul_1H11` present). With codec `none` the cache concatenates native K/V and calls the same SDPA as the
original, so the output is bit-identical to the unpatched model.

On a CUDA model every layer's cache builds its codec tables at patch time (`CompressedKVCache.prepare`), so a
generation copies nothing from the host and syncs with it once, at its end (the data checks).

`kv_dtype` (with the uncompressed codec only): every key and value is rounded to that dtype as it enters the
cache, and nothing else changes (queries, residual stream and weights keep their precision; outside caching
mode the model is untouched). With bfloat16 this is the eval's `reference (bf16 KV)` floor: the smallest
perturbation of the cache that a 16-bit store makes. It is a patch option, not a codec: the codec lists do not
name it. Under a model already in bf16 (autocast on CUDA) the rounding changes nothing.

Choices where the design is silent: patching a patched model is a RuntimeError; `unpatch(model)` on a model
without a patch is a RuntimeError; `handle.unpatch()` a second time is a no-op; unpatching while a
generation holds a cache is a RuntimeError (leaving `with compressed_kv(...)` through an exception abandons
the generation and unpatches anyway).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

import octopus_audio
from octopus_audio.cache import attend_sequence, check_caches, check_flags, sequence_capacities
from octopus_audio.codecs import DEFAULT_CODEC, codec_class
from octopus_audio.rotation import layer_seed

from .attention_modules import (
    ATTENTION_ATTRIBUTES,
    find_attention,
    model_patch_nums,
    sink_tokens,
    wide_tokens,
)
from .config import DEFAULT_SINK_SCALES, PatchConfig
from .stats import CacheStats, LayerStats

log = logging.getLogger(__name__)

_MARK = "_octopus_kv_patch"  # instance attribute on a patched attention module -> its _LayerPatch
_LN_100_F32 = float(torch.log(torch.tensor(100.0)))  # the release's max_scale_mul (a float32 ln 100)


# 1. reading the module (configuration: config.py; accounting: stats.py) -----------------------------------
def _softmax_scale(m: nn.Module) -> float:
    if hasattr(m, "scale"):
        return float(m.scale)
    if hasattr(m, "scale_mul_1H11"):
        return 1.0  # cosine attention: q already carries its learned scale
    raise TypeError(f"{type(m).__name__} has neither `scale` nor `scale_mul_1H11`; the patch cannot tell its "
                    f"softmax scale")


def _is_cosine(m: nn.Module) -> bool:
    return bool(getattr(m, "attn_l2_norm", hasattr(m, "scale_mul_1H11")))


# 2. the per-layer patch (the modules: attention_modules.py) -------------------------------------------------
class _LayerPatch:
    """One patched attention module: its compressed cache, its original methods, its last accounting."""

    def __init__(self, module: nn.Module, index: int, config: PatchConfig, sink_tokens: int,
                 capacities: tuple[int, int] | None, wide_tokens: int = 0) -> None:
        self.module = module
        self.index = index
        self.head_dim = int(module.head_dim)
        self.num_heads = int(module.num_heads)
        self.scale = _softmax_scale(module)
        self.cosine = _is_cosine(module)
        self.own_qkv = callable(getattr(module, "_qkv", None)) and callable(getattr(module, "_project", None))
        capacity, native_capacity = capacities or (None, None)
        self.cache = octopus_audio.CompressedKVCache(config.codec, config.bits, self.head_dim,
                                                     window=config.window, v_group=config.v_group,
                                                     seed=layer_seed(config.seed, index),
                                                     v_bits=config.v_bits, capacity=capacity,
                                                     native_prefix=sink_tokens,
                                                     native_capacity=native_capacity,
                                                     wide_prefix=wide_tokens, wide_bits=config.wide_bits,
                                                     wide_v_bits=config.wide_v_bits)
        weight = getattr(getattr(module, "mat_qkv", None), "weight", None)
        if isinstance(weight, torch.Tensor) and weight.device.type == "cuda":
            # the codec tables' host-to-device copies (host syncs) now, not in the first generation
            self.cache.prepare(self.num_heads, weight.device)
        self.config = config
        self.units = 0
        self.forced_units: tuple[int, ...] | None = None  # set inside `forced_sequence`
        self.last: LayerStats | None = None
        self.saved: dict[str, object] = {}

    # install / remove
    def install(self) -> None:
        m = self.module
        for name in ("forward", "kv_caching"):
            self.saved[name] = m.__dict__.get(name, _ABSENT)
        self.orig_forward = m.forward
        self.orig_kv_caching = m.kv_caching
        m.forward = self.forward
        m.kv_caching = self.kv_caching
        setattr(m, _MARK, self)

    def remove(self) -> None:
        m = self.module
        for name, value in self.saved.items():
            if value is _ABSENT:
                m.__dict__.pop(name, None)
            else:
                m.__dict__[name] = value
        m.__dict__.pop(_MARK, None)
        self.cache.reset()
        self.units = 0

    # the replaced methods
    def kv_caching(self, enable: bool) -> None:
        if enable and self.units:
            raise RuntimeError(
                f"attention layer {self.index} already holds {self.units} scale(s) of a generation in its "
                f"compressed KV cache; a second generation cannot start until the first ends "
                f"(kv_caching(False)); generations on one patched model must run one at a time")
        if not enable and self.units:
            self.last = self.layer_stats()
            self.handle.check_generation()  # the deferred data checks of every layer, one host sync
        self.orig_kv_caching(enable)
        self.cache.reset()
        self.units = 0

    def forward(self, x_BLC: torch.Tensor, attn_bias: torch.Tensor | None = None) -> torch.Tensor:
        m = self.module
        if not m.caching and self.forced_units is None:
            return self.orig_forward(x_BLC, attn_bias)
        if m.caching and attn_bias is not None:
            raise ValueError(f"attention layer {self.index} was called in caching mode with an attention "
                             f"mask; the compressed cache attends over whole scales and takes attn_bias=None")
        q_BHLD, k_BHLD, v_BHLD = m._qkv(x_BLC) if self.own_qkv else self._qkv(x_BLC)
        kv_dtype = self.config.kv_dtype
        if kv_dtype is not None:  # rounded to kv_dtype (nearest even), kept in the model's dtype
            k_BHLD, v_BHLD = k_BHLD.to(kv_dtype).to(k_BHLD.dtype), v_BHLD.to(kv_dtype).to(v_BHLD.dtype)
        cache = self.cache
        if m.caching:
            cache.append(k_BHLD, v_BHLD)
            self.units += 1
            o_BHLD = cache.attend(q_BHLD, self.scale)
        else:  # a whole sequence (`forced_sequence`): what the cache gives each scale, in one pass
            o_BHLD = attend_sequence(q_BHLD, k_BHLD, v_BHLD, self.forced_units, self.scale, codec=cache.codec,
                                     value_quantizer=cache.value_quantizer, window=cache.window,
                                     native_prefix=cache.native_prefix, wide=cache.wide)
        return m._project(o_BHLD) if self.own_qkv else self._project(o_BHLD)

    # the released math, for modules without their own _qkv / _project
    def _qkv(self, x_BLC: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m = self.module
        if self.own_qkv:
            return m._qkv(x_BLC)
        B, L, _ = x_BLC.shape
        bias = torch.cat((m.q_bias, m.zero_k_bias, m.v_bias))
        qkv_BL3HD = F.linear(x_BLC, m.mat_qkv.weight, bias=bias).view(B, L, 3, self.num_heads, self.head_dim)
        q_BHLD, k_BHLD, v_BHLD = qkv_BL3HD.permute(2, 0, 3, 1, 4).unbind(0)
        if self.cosine:
            scale_mul_1H11 = m.scale_mul_1H11.clamp_max(getattr(m, "max_scale_mul", _LN_100_F32)).exp()
            q_BHLD = F.normalize(q_BHLD, dim=-1).mul(scale_mul_1H11)
            k_BHLD = F.normalize(k_BHLD, dim=-1)
        return q_BHLD, k_BHLD, v_BHLD

    def _project(self, o_BHLD: torch.Tensor) -> torch.Tensor:
        m = self.module
        if self.own_qkv:
            return m._project(o_BHLD)
        B, H, L, D = o_BHLD.shape
        out_BLC = m.proj(o_BHLD.transpose(1, 2).reshape(B, L, H * D))
        proj_drop = getattr(m, "proj_drop", None)
        return proj_drop(out_BLC) if isinstance(proj_drop, nn.Module) else out_BLC

    # accounting
    def layer_stats(self) -> LayerStats:
        b = self.cache.bytes_breakdown()
        tokens, window_tokens = b["tokens"], b["window_tokens"]
        rows = b["rows"]  # batch * heads
        return LayerStats(layer=self.index, tokens=tokens, window_tokens=window_tokens, k_bytes=b["k_bytes"],
                          v_bytes=b["v_bytes"], native_bytes=b["native_bytes"],
                          fp16_bytes=b["fp16_bytes"],
                          compressed_coords=rows * b["store_tokens"] * self.head_dim,
                          allocated_bytes=b["allocated_bytes"], prefix_tokens=b["prefix_tokens"],
                          prefix_bytes=b["prefix_bytes"],
                          stored_coords=rows * (tokens - window_tokens) * self.head_dim)


class _Absent:
    def __repr__(self) -> str:
        return "<absent>"


_ABSENT = _Absent()


# 3. the handle and the entry points -----------------------------------------------------------------------
class PatchHandle:
    """A model with a compressed KV cache under its attention. `unpatch()` or leaving `with` takes it off.

    `stats()`: the cache accounting (per layer and total) of the generation in progress, or of the last one
    that ended; `last_stats`: the last ended generation's (None before the first).
    """

    def __init__(self, model: object, config: PatchConfig, layers: list[_LayerPatch]) -> None:
        self.model = model
        self.config = config
        self._layers = layers
        self.active = True

    @property
    def num_layers(self) -> int:
        return len(self._layers)

    @property
    def caches(self) -> list:
        """The per-layer CompressedKVCache objects, in layer order."""
        return [lp.cache for lp in self._layers]

    @property
    def generating(self) -> bool:
        return any(lp.units for lp in self._layers)

    @property
    def backend(self) -> str:
        backends = {str(getattr(lp.cache, "backend", "?")) for lp in self._layers}
        return "/".join(sorted(backends))

    @property
    def last_stats(self) -> CacheStats | None:
        if not self._layers or any(lp.last is None for lp in self._layers):
            return None
        return CacheStats(self.config, tuple(lp.last for lp in self._layers))

    def stats(self) -> CacheStats:
        if self.generating:
            return CacheStats(self.config, tuple(lp.layer_stats() for lp in self._layers))
        last = self.last_stats
        if last is None:
            raise RuntimeError("no generation has run through this patch yet: no cache to account for")
        return last

    def check_generation(self, force: bool = False) -> None:
        """Run the caches' deferred data checks (CUDA: finite keys and values were only recorded on the
        device during the generation) with one host sync; nothing to do on the CPU, where each append
        checked its unit. A bad unit abandons the whole generation (every layer's cache emptied, caching
        off) and raises the append's ValueError, so no result of it is returned. `force`: check the flags
        of the last generation even if already checked (after a CUDA graph replay rewrote them)."""
        try:
            check_caches(self.caches, force=force)
        except ValueError:
            self._drop_generation()
            raise

    def _drop_generation(self) -> None:
        for lp in self._layers:
            if lp.units:
                lp.orig_kv_caching(False)
            lp.cache.reset()
            lp.units = 0

    def unpatch(self, *, abandon: bool = False) -> None:
        """Restore the original methods. A second call does nothing.

        While a generation holds a cache this is a RuntimeError, unless `abandon=True` (the generation's cache
        is dropped and its modules are left with caching off).
        """
        if not self.active:
            return
        if self.generating and not abandon:
            raise RuntimeError("a generation is in progress on the patched model; let it finish "
                               "(kv_caching(False)) before unpatching, or unpatch(abandon=True) to drop it")
        for lp in self._layers:
            busy = lp.units > 0
            lp.remove()
            if busy:
                lp.orig_kv_caching(False)
        self.active = False

    def compile_ahead(self, batch: int = 1, dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,),
                      workers: int | None = None, progress=None) -> list:
        """On CUDA, compile the Triton kernels that generations of `batch` conditions launch under this patch
        (attention in each of `dtypes`) in parallel processes before the first generation; nothing on the
        CPU. `aar_patch.compile_ahead.compile_ahead` says more."""
        from .compile_ahead import compile_ahead

        return compile_ahead(self.model, [self.config], batch, dtypes, workers, progress)

    def __enter__(self) -> PatchHandle:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.unpatch(abandon=exc_type is not None)

    def __repr__(self) -> str:
        c = self.config
        state = "active" if self.active else "removed"
        return (f"PatchHandle(codec={c.codec!r}, bits={c.bits}, v_bits={c.v_bits}, window={c.window}, "
                f"sink_scales={c.sink_scales}, "
                + (f"wide_scales={c.wide_scales}, wide_bits={c.wide_bits}, wide_v_bits={c.wide_v_bits}, "
                   if c.wide_scales else "")
                + f"v_group={c.v_group}, seed={c.seed}, "
                + (f"kv_dtype={c.kv_dtype}, " if c.kv_dtype is not None else "")
                + f"layers={self.num_layers}, backend={self.backend}, {state})")


def patch_aar(model: object, codec: str = DEFAULT_CODEC, bits: int = 2, window: int = 1, v_group: int = 16,
              seed: int = 0, v_bits: int | None = None, kv_dtype: torch.dtype | None = None,
              sink_scales: int | None = None, wide_scales: int = 0, wide_bits: int = 4,
              wide_v_bits: int | None = None) -> PatchHandle:
    """Give every attention layer of `model` its own compressed KV cache; returns the handle that undoes it.

    model: an `AARPipeline`, an `AAR`, or any nn.Module (or object holding nn.Modules) whose attention modules
    have the released attribute names. Layer l's cache uses the codec seed `layer_seed(seed, l)`. `bits` is
    the key codec's width and `v_bits` the values' (None: `bits` for both), as KIVI's `k_bits` / `v_bits`.
    `kv_dtype` (codec none only): keys and values rounded to it as they enter the cache (the bf16-KV floor:
    `patch_aar(pipe, "none", 16, kv_dtype=torch.bfloat16)`).
    `sink_scales` S: the first S scales stay native for the whole generation (every later scale attends to
    them; the cache's `native_prefix` holds their tokens, counted as native bytes), the model's scales read
    from its `patch_nums` (0 .. the number of scales). None (default): `DEFAULT_SINK_SCALES` for a model that
    says its scales, 0 (logged once) for one that does not; a count > 0 for such a model is a ValueError.
    Codec none stores every token native: its default is 0, and a count given keeps its tokens in the store
    with the rest (one preallocated buffer for attention to read, no native prefix to join to it).
    `wide_scales` N: the N scales after the sink scales are stored at `wide_bits` key bits and `wide_v_bits`
    value bits (None: `wide_bits`), the rest at `bits` / `v_bits` (the cache's `wide_prefix` holds their
    tokens, counted at their own widths); 0 (default): none.
    Example: `with patch_aar(pipe, "octopus", 2) as h: gen = generate(pipe, cond); print(h.stats().line())`.
    """
    compresses = codec_class(codec).compressed  # an unknown codec: its ValueError lists the codecs
    if sink_scales is None:
        sink_scales = DEFAULT_SINK_SCALES if model_patch_nums(model) is not None and compresses else 0
        if DEFAULT_SINK_SCALES and not sink_scales and compresses:
            log.info("%s does not say its scales (patch_nums): no sink scales (the default keeps the first "
                     "%d native where a model says them)", type(model).__name__, DEFAULT_SINK_SCALES)
    config = PatchConfig(codec=codec, bits=bits, window=window, v_group=v_group, seed=seed, v_bits=v_bits,
                         kv_dtype=kv_dtype, sink_scales=sink_scales, wide_scales=wide_scales,
                         wide_bits=wide_bits, wide_v_bits=wide_v_bits)
    sinks = sink_tokens(model, sink_scales)  # the count checked against the model for every codec
    if not compresses:
        # a codec that stores every token native holds the sink scales in its store like the others: a native
        # prefix would change no value, only make each attention call concatenate it with the store
        sinks = 0
    wide = wide_tokens(model, sink_scales, wide_scales)
    modules = find_attention(model)
    if not modules:
        raise ValueError(f"no attention modules found in {type(model).__name__}: patch_aar looks for modules "
                         f"with the attributes {', '.join(ATTENTION_ATTRIBUTES)}")
    for i, m in enumerate(modules):
        if hasattr(m, _MARK):
            raise RuntimeError(f"attention layer {i} is already patched ({getattr(m, _MARK).handle_repr}); "
                               f"unpatch it before patching again")
        if m.caching and m.cached_k is not None:
            raise RuntimeError(f"attention layer {i} is in the middle of a generation (its KV cache is not "
                               f"empty); patch the model before or after a generation, not during one")
    # every cache is built (and the arguments validated) before any module is touched
    patch_nums = model_patch_nums(model)
    capacities = None if patch_nums is None else sequence_capacities(patch_nums, window, sinks, wide)
    layers = [_LayerPatch(m, i, config, sinks, capacities, wide) for i, m in enumerate(modules)]
    handle = PatchHandle(model, config, layers)
    for lp in layers:
        lp.install()
        lp.handle_repr = (f"codec={codec!r}, {config.bits_label}, sink_scales={config.sink_scales}"
                          + (f", wide_scales={wide_scales}" if wide_scales else ""))
        lp.handle = handle
    log.info("patched %d attention layers: %r", len(layers), handle)
    return handle


def replay_check(model: object) -> Callable[[], None]:
    """Call right after capturing a generation of `model` in a CUDA graph. Returns the function to call
    after each replay, before its results are used: the patch's data checks (finite keys and values), which
    the capture could not run (reading device values breaks a capture), on the records the replay rewrote;
    it raises the append ValueError of a bad unit. For a model without the patch it does nothing."""
    flags = [f for m in find_attention(model) if (lp := getattr(m, _MARK, None)) is not None
             if (f := lp.cache.deferred_flags()) is not None]
    return functools.partial(check_flags, flags)


def unpatch(model: object) -> None:
    """Take the patch off `model` (RuntimeError if it has none, or if a generation holds its cache)."""
    modules = [m for m in find_attention(model) if hasattr(m, _MARK)]
    if not modules:
        raise RuntimeError(f"{type(model).__name__} has no KV-cache patch to remove")
    handles = {id(getattr(m, _MARK).handle): getattr(m, _MARK).handle for m in modules}
    for handle in handles.values():
        handle.unpatch()


@contextlib.contextmanager
def forced_sequence(model: object, units: tuple[int, ...]) -> Iterator[None]:
    """Inside, each patched attention layer of `model` called outside caching mode takes its input as one
    whole sequence of `units` (tokens per scale, in order) and attends as its compressed cache would have
    served each scale's queries in a generation with those inputs (`cache.block_causal.attend_sequence`: the
    window's scales native, older ones through the codec), in one pass; the mask it is called with is not
    used. Teacher forcing runs a patched model this way (`eval.fidelity.teacher_forced_probs`). Layers without
    the patch are untouched: their own masked forward already is the uncompressed answer."""
    layers = [lp for m in find_attention(model) if (lp := getattr(m, _MARK, None)) is not None]
    busy = [lp.index for lp in layers if lp.units or lp.module.caching]
    if busy:
        raise RuntimeError(f"attention layers {busy} are in the middle of a generation; a forced sequence "
                           f"runs outside caching mode, after the generation ends")
    for lp in layers:
        lp.forced_units = tuple(int(n) for n in units)
    try:
        yield
    finally:
        for lp in layers:
            lp.forced_units = None


@contextlib.contextmanager
def compressed_kv(model: object, codec: str = DEFAULT_CODEC, bits: int = 2, window: int = 1,
                  v_group: int = 16, seed: int = 0, v_bits: int | None = None,
                  kv_dtype: torch.dtype | None = None,
                  sink_scales: int | None = None) -> Iterator[PatchHandle]:
    """Context manager: `with compressed_kv(pipe, "octopus", 2) as handle:` patches, and unpatches on exit
    (`v_bits`: the values' width, None for `bits`; `kv_dtype` and `sink_scales`: see `patch_aar`)."""
    with patch_aar(model, codec, bits, window=window, v_group=v_group, seed=seed, v_bits=v_bits,
                   kv_dtype=kv_dtype, sink_scales=sink_scales) as handle:
        yield handle


__all__ = ["ATTENTION_ATTRIBUTES", "DEFAULT_SINK_SCALES", "CacheStats", "LayerStats", "PatchConfig",
           "PatchHandle", "compressed_kv", "find_attention", "forced_sequence", "patch_aar", "replay_check",
           "unpatch"]
