"""Where a sequence lands in a cache (octopus_audio.cache.layout) against a cache fed it unit by unit: the
tokens it stores and the capacities that hold it; and teacher forcing's pass (`cache.attend_sequence`)
refusing settings a cache would not have."""

import pytest
import torch

from octopus_audio import CompressedKVCache, get_codec
from octopus_audio.cache import attend_sequence, sequence_capacities, stored_span
from octopus_audio.values import ValueQuantizer

B, H, D = 1, 2, 64
CASES = [((1, 3, 5, 2, 7), 1, 0), ((1, 3, 5, 2, 7), 1, 6), ((1, 3, 5, 2, 7), 0, 4), ((1, 3, 5, 2, 7), 2, 100),
         ((4,), 1, 2), ((4,), 0, 0), ((2, 2, 2), 3, 1), ((1, 1, 1, 33), 2, 0)]
IDS = [f"units{'-'.join(map(str, u))}-W{w}-P{p}" for u, w, p in CASES]


def _fed(units, window, prefix):
    """A cache (codec none: nothing rounds) fed `units` one by one; the peak of its native tokens."""
    cache = CompressedKVCache("none", 2, D, window=window, native_prefix=prefix)
    g = torch.Generator().manual_seed(0)
    peak = 0
    for t in units:
        cache.append(torch.randn(B, H, t, D, generator=g), torch.randn(B, H, t, D, generator=g))
        peak = max(peak, cache.prefix_tokens + cache.window_tokens)
    return cache, peak


@pytest.mark.parametrize("units,window,prefix", CASES, ids=IDS)
def test_stored_span_is_what_a_fed_cache_stores(units, window, prefix):
    cache, _ = _fed(units, window, prefix)
    start, stop = stored_span(units, window, prefix)
    assert (cache.prefix_tokens, cache.length) == (start, stop - start)


@pytest.mark.parametrize("units,window,prefix", CASES, ids=IDS)
def test_sequence_capacities_hold_a_fed_cache_at_its_peak(units, window, prefix):
    cache, peak = _fed(units, window, prefix)
    assert sequence_capacities(units, window, prefix) == (cache.length, peak)


def _sequence(window=1, native_prefix=0, codec="octopus", quantizer="default"):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, 6, D, generator=g) for _ in range(3))
    codec = get_codec(codec, 2, D)
    vq = ValueQuantizer(2, D) if quantizer == "default" else quantizer
    return attend_sequence(q, k, v, (1, 2, 3), 0.125, codec=codec, value_quantizer=vq, window=window,
                           native_prefix=native_prefix)


@pytest.mark.parametrize("kwargs,match", [
    ({"window": -1}, "window as an integer >= 0"),
    ({"window": 1.0}, "window as an integer >= 0"),
    ({"window": True}, "window as an integer >= 0"),
    ({"native_prefix": -2}, "native_prefix as an integer >= 0"),
    ({"quantizer": None}, "a value quantizer with a compressing codec"),
    ({"codec": "none"}, "None with codec none"),
], ids=["window-negative", "window-float", "window-bool", "prefix-negative", "codec-without-quantizer",
        "none-with-quantizer"])
def test_attend_sequence_refuses_settings_no_cache_has(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _sequence(**kwargs)

