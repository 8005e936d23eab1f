"""Teacher forcing's block-causal pass: a whole sequence of units attends, in one masked attention, as a
compressed cache with these settings serves each unit's queries when the units are appended one by one. It
holds no cache: it takes the codec, the value quantizer, the window and the native prefix."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch

from octopus_audio.cache.checks import check_layout, check_query, check_unit
from octopus_audio.cache.layout import stored_span
from octopus_audio.cache.plan import CachePlan
from octopus_audio.codecs.base import KeyState
from octopus_audio.reference import attend
from octopus_audio.values import ValueState


def encode_sequence(codec, value_quantizer, k: torch.Tensor, v: torch.Tensor) -> tuple[KeyState, ValueState]:
    """(KeyState, ValueState) of tokens k, v [B, H, T, d] encoded as a cache's `append` encodes them: the
    backend's choice for their device (`CachePlan`: the encode kernels for CUDA tensors, the library
    otherwise), the data checks left to the caller."""
    plan = CachePlan(codec, k.shape[1], k.device)
    return plan.encode_keys(codec, k), plan.encode_values(value_quantizer, v)


def stored_parts(start: int, stop: int, codec, value_quantizer,
                 wide=None) -> list[tuple[int, int, object, object]]:
    """The stored tokens [start, stop) of a sequence (`layout.stored_span`) as (from, to, key codec, value
    quantizer) parts, each non-empty, in order: the wide prefix's first (`wide`, a `layer.WidePrefix`: its
    tokens at its widths; None: none), then the rest at the cache's."""
    split = start if wide is None else min(start + wide.tokens, stop)
    parts = [] if wide is None else [(start, split, wide.codec, wide.value_quantizer)]
    return [p for p in parts + [(split, stop, codec, value_quantizer)] if p[1] > p[0]]


def attend_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, units: Sequence[int], scale: float, *,
                    codec, value_quantizer, window: int, native_prefix: int = 0, wide=None) -> torch.Tensor:
    """A whole sequence in one pass: what each unit's queries get from `CompressedKVCache.attend` when the
    units are appended one by one to a cache of `codec` (a key codec, `get_codec`), `value_quantizer` (None
    for a codec that does not compress), `window` and `native_prefix` (`reset`, then per unit `append` and
    `attend` of that unit's queries), computed for all units at once on the reference path. A patched model's
    cache passes its own (`cache.codec`, `cache.value_quantizer`, `cache.window`, `cache.native_prefix`,
    `cache.wide`). `wide`: the cache's wide prefix (`layer.WidePrefix`; None: none), whose tokens, the first
    stored ones, are encoded by its own codec and value quantizer.

    q [B, Hq, T, d], k and v [B, H, T, d], `units` the tokens of each unit in order (summing to T). Returns
    [B, Hq, T, d] in q's dtype. A query of unit i attends, in one softmax, to the native keys and values of
    units i-W+1 .. i (the window W as it stands after unit i's append) and of the native prefix (the
    sequence's first `native_prefix` tokens), and to the other tokens of units 0 .. i-W as the store holds
    them: each token encoded as `append` encodes it (`encode_sequence`; the kernels and the library give the
    same codes but at exact near-ties) and decoded by the codec library and the value quantizer (a token's
    code does not depend on the others, so one encode of the sequence is the per-unit encode; the prefix and
    the last W units, never stored, are not encoded: `layout.stored_span`), in fp32 as the cache's reference
    attention. Codec none: the native keys of units 0 .. i, SDPA in q's dtype. This is teacher forcing's pass
    (`aar_patch.forced_sequence`, `eval.fidelity`): one masked attention a layer instead of one a unit; it
    equals the unit-by-unit reference up to float rounding (tests/test_cache.py). Runs the immediate data
    checks on every token.
    """
    for name, value in (("window", window), ("native_prefix", native_prefix)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"attend_sequence takes {name} as an integer >= 0, got {value!r}")
    if (value_quantizer is None) == codec.compressed:
        raise ValueError(f"attend_sequence takes a value quantizer with a compressing codec and None with "
                         f"codec none; got {value_quantizer!r} with codec {codec.name}")
    check_layout(k, v, codec.head_dim, None)
    check_query(q, scale, k.shape[0], k.shape[1], codec.head_dim, "attend_sequence", data=True)
    if isinstance(units, (str, bytes)) or any(isinstance(n, bool) or not isinstance(n, numbers.Integral)
                                              or n < 1 for n in units) or sum(units) != k.shape[2]:
        raise ValueError(f"attend_sequence takes units, the tokens of each unit (integers >= 1), summing "
                         f"to the T = {k.shape[2]} tokens of k and v; got {list(units)!r}")
    if q.shape[2] != k.shape[2] or q.device != k.device:
        raise ValueError(f"attend_sequence takes q with one query per key (T = {k.shape[2]}) on k's "
                         f"device, got {tuple(q.shape)} on {q.device}")
    codec.check_keys(k)
    check_unit(k, v, value_quantizer is not None)
    unit_T = torch.repeat_interleave(torch.arange(len(units), device=k.device),
                                     torch.tensor(list(units), device=k.device))
    age_TT = unit_T[:, None] - unit_T[None, :]  # query's unit - key's unit: >= 0 where the key is visible
    if value_quantizer is None:
        return attend(q, k.to(q.dtype), v.to(q.dtype), scale, age_TT >= 0)
    start, stop = stored_span(units, window, native_prefix)
    keys, values, visible = [], [], []
    for a, z, c, quant in stored_parts(start, stop, codec, value_quantizer, wide):
        k_state, v_state = encode_sequence(c, quant, k[:, :, a:z], v[:, :, a:z])
        keys.append(c.decode(k_state, torch.float32))
        values.append(quant.decode(v_state, torch.float32))
        visible.append((age_TT >= window)[:, a:z])
    if window or start:  # the native keys (window and prefix) beside the store's decoded ones
        prefix_T = torch.arange(k.shape[2], device=k.device) < start
        keys.append(k.float())
        values.append(v.float())
        visible.append((age_TT >= 0) & ((age_TT < window) | prefix_T[None, :]))
    return attend(q.float(), torch.cat(keys, 2), torch.cat(values, 2), scale,
                  torch.cat(visible, 1)).to(q.dtype)
