"""OctopusCache: a transformers Cache whose layers hold their keys and values compressed."""

from __future__ import annotations

import dataclasses
import logging

from transformers.cache_utils import Cache, get_layer_types_and_kwargs

import octopus_audio
from octopus_audio.cache import CompressedKVCache, check_caches
from octopus_audio.codecs import DEFAULT_CODEC, codec_class
from octopus_audio.hf.attention import ATTENTION
from octopus_audio.hf.layer import OctopusLayer
from octopus_audio.rotation import layer_seed

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CacheSettings:
    """What every layer's CompressedKVCache is built with: codec, key and value widths (None for the
    uncompressed codec `none`), native window in tokens (transformers' `residual_length`), value group, base
    seed (layer i uses `rotation.layer_seed(seed, i)`) and the tokens each store is first allocated for
    (None: what the prompt needs, then doubling)."""

    codec: str
    k_bits: int | None
    v_bits: int | None
    window: int = 1
    v_group: int = 16
    seed: int = 0
    max_cache_len: int | None = None

    def __post_init__(self) -> None:
        if self.codec not in octopus_audio.CODECS:
            raise ValueError(f"unknown codec {self.codec!r}; allowed: {', '.join(octopus_audio.CODECS)}")
        compressed = codec_class(self.codec).compressed
        for name in ("k_bits", "v_bits"):
            value = getattr(self, name)
            if not compressed and value is not None:
                raise ValueError(f"codec {self.codec!r} keeps keys and values native and takes no bit "
                                 f"widths; got {name}={value!r}")
            if compressed and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"codec {self.codec!r} needs bits (or k_bits and v_bits) as integers >= 1, "
                                 f"got {name}={value!r}")
        for name, low in (("window", 0), ("v_group", 1), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.max_cache_len is not None and (isinstance(self.max_cache_len, bool)
                                               or not isinstance(self.max_cache_len, int)
                                               or self.max_cache_len < 1):
            raise ValueError(f"max_cache_len must be None or an integer >= 1 (tokens), got "
                             f"{self.max_cache_len!r}")

    def make_cache(self, head_dim: int, layer: int) -> CompressedKVCache:
        """A new, empty CompressedKVCache of these settings for layer `layer`."""
        bits = 16 if self.k_bits is None else self.k_bits  # codec none: its nominal width, ignored
        return CompressedKVCache(self.codec, bits, head_dim, window=self.window, v_group=self.v_group,
                                 seed=layer_seed(self.seed, layer), v_bits=self.v_bits,
                                 capacity=self.max_cache_len, native_capacity=max(self.window, 1))


def _head_dim(config) -> int:
    head_dim = getattr(config, "head_dim", None)
    return int(head_dim) if head_dim else config.hidden_size // config.num_attention_heads


class OctopusCache(Cache):
    """A transformers cache that holds each layer's keys and values in a CompressedKVCache: the newest
    `window` tokens native, older ones encoded once by `codec` at `bits` (keys at `k_bits`, values at `v_bits`
    when given apart). Decode steps attend from the compressed store (the fused kernels on CUDA); a prompt
    attends over its native keys. Use it as any cache:

    >>> cache = OctopusCache(model.config, codec="octopus", bits=2)  # doctest: +SKIP
    >>> out = model.generate(**inputs, cache=cache)  # doctest: +SKIP

    (`past_key_values=` on transformers versions before the `cache` keyword). `config` is the model's config
    (decoder-only, every layer full attention, the cache's head dim one the codec takes); the model must run
    the `octopus_audio` attention implementation, which a model on `sdpa` is switched to here (logged; it runs
    SDPA for every call but an OctopusCache's decode step, so other caches are served as before).
    `max_cache_len`: tokens each layer's store is allocated for at the prompt (the prompt plus the tokens to
    generate avoids the store's doubling growth and its spare capacity). Data checks (finite keys and
    values, values within fp16) run at each append on the CPU; on CUDA they are deferred and run (one host
    sync) at the forward after a prompt, whenever the held length reaches a power of two, and at `check()`.
    Operations: `reset`, `crop` (speculative decoding), `reorder_cache` (beam search); offloading and
    `batch_repeat_interleave` / `batch_select_indices` are refused.
    """

    def __init__(self, config, codec: str = DEFAULT_CODEC, bits: int | None = None, *,
                 k_bits: int | None = None, v_bits: int | None = None, window: int = 1, v_group: int = 16,
                 seed: int = 0, max_cache_len: int | None = None) -> None:
        text = config.get_text_config(decoder=True)
        layer_types, _ = get_layer_types_and_kwargs(text)
        other = sorted(set(layer_types) - {"full_attention"})
        if other:
            raise ValueError(f"OctopusCache holds full-attention layers only; this model also has {other} "
                             f"layers")
        if getattr(text, "is_encoder_decoder", False):
            raise ValueError("OctopusCache is for decoder-only models; this config is an encoder-decoder's")
        k_bits, v_bits = (bits if k_bits is None else k_bits), (bits if v_bits is None else v_bits)
        self.settings = CacheSettings(codec, k_bits, v_bits, window, v_group, seed, max_cache_len)
        head_dim = _head_dim(text)
        layers = [OctopusLayer(lambda i=i: self.settings.make_cache(head_dim, i), text)
                  for i in range(len(layer_types))]
        implementation = text._attn_implementation
        if implementation == "sdpa":
            text._attn_implementation = ATTENTION
            log.info("OctopusCache: the model's attention implementation goes from sdpa to %s (SDPA for "
                     "every call but an OctopusCache's decode step)", ATTENTION)
        elif implementation != ATTENTION:
            raise ValueError(f"OctopusCache runs with the model's sdpa attention (which it turns into "
                             f"{ATTENTION!r}); this model runs {implementation!r}: call "
                             f"model.set_attn_implementation('sdpa') first")
        super().__init__(layers=layers)
        self._check_next = False  # the forward after a prompt checks it

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        if layer_idx == 0:  # a forward begins: the deferred checks of what came before, now and then
            held = self.layers[0].get_seq_length()
            if self._check_next or (held and held & (held - 1) == 0):
                self.check()
            self._check_next = key_states.shape[2] > 1
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def caches(self) -> list[CompressedKVCache]:
        """Every CompressedKVCache held (each layer's, one per group of rows that share their padding)."""
        return [g.cache for layer in self.layers for g in layer.groups]

    def check(self) -> None:
        """Run the deferred data checks of every layer (one host sync; nothing to do on the CPU, where each
        append checks). Raises the ValueError of the first bad layer."""
        check_caches(self.caches())

    @property
    def nbytes(self) -> int:
        """Bytes held: every layer's compressed store and native window."""
        return sum(c.nbytes for c in self.caches())

    @property
    def fp16_nbytes(self) -> int:
        """Bytes the same tokens' keys and values take in fp16 (what DynamicCache holds in a 16-bit model)."""
        return sum(c.native_nbytes for c in self.caches())

    def __repr__(self) -> str:
        s = self.settings
        return (f"OctopusCache(codec={s.codec!r}, k_bits={s.k_bits}, v_bits={s.v_bits}, window={s.window}, "
                f"layers={len(self.layers)}, tokens={self.get_seq_length()}, nbytes={self.nbytes})")
