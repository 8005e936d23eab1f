"""The cache's native prefix (the sequence's first tokens kept native, `native_prefix`): the reference path
against SDPA over an independently built K/V, teacher forcing's one pass against the unit-by-unit cache, the
accounting, and every attention implementation the interpreter runs (split-K flash, one-row score tables)
against the cache's reference path on the same compressed state; the fused encode's deferred checks of a
unit split by the prefix.

The Triton kernels run on the CPU under TRITON_INTERPRET=1 (set at import, as the kernel tests do); with
OCTOPUS_AUDIO_TEST_DEVICE=cuda they run compiled on the GPU. The sm_90 Gluon kernel's case is in
tests/test_kernels_gluon.py (compiled only)."""

import os

DEVICE = os.environ.get("OCTOPUS_AUDIO_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from helpers import attend_sequence_of, attend_unit_by_unit, kernel_ops  # noqa: E402

from octopus_audio import CompressedKVCache, get_codec  # noqa: E402
from octopus_audio.cache import stored_span  # noqa: E402
from octopus_audio.values import ValueQuantizer  # noqa: E402

B, H, D = 2, 2, 64
UNITS = (1, 3, 5, 2, 7)  # uneven units (scales); a prefix of 6 tokens ends inside the third


def _units(seed=0, sizes=UNITS, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(B, H, t, D, generator=g).to(dtype).to(device),
             torch.randn(B, H, t, D, generator=g).to(dtype).to(device)) for t in sizes]


def _expected_kv(name, bits, seed, units, window, prefix):
    """K, V as the cache should hold them, built without the cache: every token encoded and decoded by the
    codec library and the value quantizer, then the native ones (the first `prefix` tokens, the last `window`
    units) put back."""
    codec, vq = get_codec(name, bits, D, seed=seed), ValueQuantizer(bits, D)
    k_all = torch.cat([k for k, _ in units], 2)
    v_all = torch.cat([v for _, v in units], 2)
    native_T = torch.arange(k_all.shape[2]) < prefix
    if window:
        native_T[k_all.shape[2] - sum(k.shape[2] for k, _ in units[-window:]):] = True
    k_hat = torch.where(native_T[:, None], k_all, codec.decode(codec.encode(k_all)))
    v_hat = torch.where(native_T[:, None], v_all, vq.decode(vq.encode(v_all)))
    return k_hat, v_hat, int(native_T.sum())


CODEC_CASES = ["octopus", "turboquant-qjl", "polarquant"]
PREFIXES = [(1, 6), (0, 6), (2, 6), (1, 1), (1, 100)]  # (window, prefix tokens); 100: more than the sequence


@pytest.mark.parametrize("window,prefix", PREFIXES, ids=[f"W{w}-P{p}" for w, p in PREFIXES])
@pytest.mark.parametrize("name", CODEC_CASES)
def test_reference_attention_keeps_the_prefix_native(name, window, prefix):
    units = _units(seed=prefix + window)
    cache = CompressedKVCache(name, 2, D, window=window, seed=9, native_prefix=prefix)
    for k, v in units:
        cache.append(k, v)
    k_hat, v_hat, n_native = _expected_kv(name, 2, 9, units, window, prefix)
    q = torch.randn(B, 2 * H, 4, D, generator=torch.Generator().manual_seed(1))  # grouped queries, G = 2
    expect = F.scaled_dot_product_attention(q, k_hat.repeat_interleave(2, 1), v_hat.repeat_interleave(2, 1),
                                            scale=0.125)
    torch.testing.assert_close(cache.attend(q, 0.125), expect, rtol=1e-5, atol=1e-5)
    k_got, v_got = cache.decoded_kv()
    torch.testing.assert_close(k_got, k_hat, rtol=1e-6, atol=1e-6)  # held in sequence order
    assert cache.prefix_tokens == min(prefix, sum(UNITS) - cache.window_tokens)
    assert cache.length == sum(UNITS) - n_native and cache.num_tokens == sum(UNITS)


def test_codec_none_with_a_prefix_equals_plain_sdpa_exactly():
    units = _units(seed=3, dtype=torch.bfloat16)
    cache = CompressedKVCache("none", 16, D, window=1, native_prefix=6)
    for k, v in units:
        cache.append(k, v)
    q = torch.randn(B, H, 3, D, generator=torch.Generator().manual_seed(2)).bfloat16()
    k_all, v_all = (torch.cat([u[i] for u in units], 2) for i in (0, 1))
    assert torch.equal(cache.attend(q, 0.2), F.scaled_dot_product_attention(q, k_all, v_all, scale=0.2))


SEQUENCE_CASES = [(w, p) for w in (0, 1, 2) for p in (4, 6, 100)]


@pytest.mark.parametrize("window,prefix", SEQUENCE_CASES, ids=[f"W{w}-P{p}" for w, p in SEQUENCE_CASES])
@pytest.mark.parametrize("name", ["none", "octopus", "turboquant-qjl"])
def test_attend_sequence_keeps_the_prefix_native_as_appending_does(name, window, prefix):
    """Teacher forcing's one pass sees the prefix native, as the cache fed unit by unit serves it."""
    units = _units(seed=11 + window)
    g = torch.Generator().manual_seed(12)
    queries = [torch.randn(B, 2 * H, t, D, generator=g) for t in UNITS]
    options = dict(window=window, seed=4, native_prefix=prefix)
    expect = attend_unit_by_unit(CompressedKVCache(name, 3, D, **options), units, queries, 0.3)
    cache = CompressedKVCache(name, 3, D, **options)
    got = attend_sequence_of(cache, torch.cat(queries, 2), torch.cat([k for k, _ in units], 2),
                             torch.cat([v for _, v in units], 2), UNITS, 0.3)
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-5)
    stop = sum(UNITS[:len(UNITS) - window])
    assert stored_span(UNITS, window, prefix) == (min(prefix, stop), stop)


def test_prefix_bytes_are_counted_native():
    units = _units(seed=6, dtype=torch.float16)
    cache = CompressedKVCache("octopus", 2, D, window=1, native_prefix=6)
    for k, v in units:
        cache.append(k, v)
    codec, vq = get_codec("octopus", 2, D), ValueQuantizer(2, D)
    b = cache.bytes_breakdown()
    stored = sum(UNITS) - 6 - UNITS[-1]
    fp16_token = 2 * B * H * D * 2  # K and V of one token, fp16 as the units
    assert (b["prefix_tokens"], b["window_tokens"], b["store_tokens"]) == (6, UNITS[-1], stored)
    assert b["prefix_bytes"] == 6 * fp16_token and b["window_bytes"] == UNITS[-1] * fp16_token
    assert b["native_bytes"] == b["prefix_bytes"] + b["window_bytes"]
    assert b["k_bytes"] * 8 == B * H * stored * codec.bits_per_key
    assert b["v_bytes"] * 8 == B * H * stored * vq.bits_per_token
    assert cache.nbytes == b["k_bytes"] + b["v_bytes"] + b["native_bytes"] <= b["allocated_bytes"]
    assert cache.native_nbytes == sum(UNITS) * fp16_token


def test_native_capacity_reserves_the_buffer():
    """A reserved native buffer holds the same tokens and never grows; an unreserved one grows by doubling."""
    units = _units(seed=2)
    plain = CompressedKVCache("octopus", 2, D, window=1, seed=3, native_prefix=6)
    reserved = CompressedKVCache("octopus", 2, D, window=1, seed=3, native_prefix=6, native_capacity=13)
    q = torch.randn(B, H, 5, D, generator=torch.Generator().manual_seed(9))
    for k, v in units:
        plain.append(k, v)
        reserved.append(k, v)
        assert torch.equal(plain.attend(q, 0.125), reserved.attend(q, 0.125))
        assert reserved._native.capacity == 13
    assert plain._native.capacity >= 13


def test_a_reserved_native_buffer_goes_back_after_a_larger_unit():
    """A unit larger than the reservation (a language model's prompt) grows the native buffer while it is in
    the window; once it has left, the buffer is back at the reservation and attention is unchanged."""
    g = torch.Generator().manual_seed(4)
    units = [torch.randn(B, H, n, D, generator=g) for n in (40, 1, 1, 1)]
    plain = CompressedKVCache("octopus", 2, D, window=2, seed=3)
    reserved = CompressedKVCache("octopus", 2, D, window=2, seed=3, native_capacity=2)
    q = torch.randn(B, H, 1, D, generator=g)
    capacities = []
    for u in units:
        plain.append(u, -u)
        reserved.append(u, -u)
        capacities.append(reserved._native.capacity)
        assert torch.equal(plain.attend(q, 0.125), reserved.attend(q, 0.125))
    assert capacities == [40, 80, 2, 2]  # the second unit doubles it; the first one's leaving frees it
    assert reserved._native.allocated_bytes == reserved.bytes_breakdown()["native_bytes"]
    assert plain._native.capacity == 80


@pytest.mark.parametrize("bad", [-1, 2.5, True, "4"], ids=["negative", "float", "bool", "str"])
def test_bad_native_prefix_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="native_prefix must be an integer >= 0"):
        CompressedKVCache("octopus", 2, D, native_prefix=bad)
    with pytest.raises(ValueError, match="native_capacity must be None or an integer >= 0"):
        CompressedKVCache("octopus", 2, D, native_capacity=-1)


# ---- crop and select_rows (what octopus_audio.hf asks of a cache) with a prefix ----

# (window, tokens kept): with UNITS and a prefix of 6, window 1 holds prefix [0, 6), store [6, 11), window
# [11, 18); window 2 holds prefix [0, 6), store [6, 9), window [9, 11) and [11, 18)
CROPS = [(1, 3), (1, 6), (1, 8), (1, 11), (1, 14), (2, 10), (2, 13)]


@pytest.mark.parametrize("window,keep", CROPS, ids=[f"W{w}-keep{k}" for w, k in CROPS])
@pytest.mark.parametrize("name", ["octopus", "turboquant-qjl"])
def test_crop_keeps_the_first_tokens_and_the_prefix_fills_again(name, window, keep):
    """A crop keeps the first `keep` tokens in sequence order (prefix, store, window), each as it was held;
    two more units then leave the cache as a cache fed the kept tokens as one unit would hold them: the
    prefix cut short fills again with the next tokens that leave the window, the rest are encoded."""
    units = _units(seed=13 + keep)
    cache = CompressedKVCache(name, 2, D, window=window, seed=9, native_prefix=6)
    for k, v in units:
        cache.append(k, v)
    k_all, v_all = cache.decoded_kv()
    cache.crop(keep)
    assert cache.num_tokens == keep and cache.prefix_tokens == min(keep, 6)
    k_kept, v_kept = cache.decoded_kv()
    assert torch.equal(k_kept, k_all[:, :, :keep]) and torch.equal(v_kept, v_all[:, :, :keep])
    more = _units(seed=14, sizes=(2, 1))
    for k, v in more:
        cache.append(k, v)
    kept = tuple(torch.cat([u[i] for u in units], 2)[:, :, :keep] for i in (0, 1))
    k_hat, v_hat, _ = _expected_kv(name, 2, 9, [kept, *more], window, 6)
    k_got, v_got = cache.decoded_kv()
    torch.testing.assert_close(k_got, k_hat, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(v_got, v_hat, rtol=1e-6, atol=1e-6)
    assert cache.prefix_tokens == min(keep + 2, 6)
    q = torch.randn(B, H, 3, D, generator=torch.Generator().manual_seed(5))
    expect = F.scaled_dot_product_attention(q, k_hat, v_hat, scale=0.125)
    torch.testing.assert_close(cache.attend(q, 0.125), expect, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["none", "octopus"])
def test_select_rows_reorders_the_prefix_with_the_rest(name):
    """A beam reorder takes the prefix's rows with the store's and the window's; the cache then goes on with
    units of the new batch (the next leaving unit's tokens stored after the prefix)."""
    units = _units(seed=15)
    cache = CompressedKVCache(name, 2, D, window=1, seed=3, native_prefix=6)
    for k, v in units:
        cache.append(k, v)
    k_before, v_before = cache.decoded_kv()
    index = torch.tensor([1, 0, 1])  # three rows from two, one repeated
    cache.select_rows(index)
    k_after, v_after = cache.decoded_kv()
    assert torch.equal(k_after, k_before[index]) and torch.equal(v_after, v_before[index])
    assert cache.prefix_tokens == 6 and cache.bytes_breakdown()["rows"] == 3 * H
    g = torch.Generator().manual_seed(16)
    k, v = torch.randn(3, H, 2, D, generator=g), torch.randn(3, H, 2, D, generator=g)
    cache.append(k, v)
    q = torch.randn(3, H, 1, D, generator=g)
    k_now, v_now = cache.decoded_kv()
    assert torch.equal(k_now[:, :, :6], k_before[index][:, :, :6]) and torch.equal(k_now[:, :, -2:], k)
    expect = F.scaled_dot_product_attention(q, k_now, v_now, scale=0.125)
    torch.testing.assert_close(cache.attend(q, 0.125), expect, rtol=1e-5, atol=1e-5)


# ---- the kernels (interpreted on the CPU), on the same compressed state as the reference ----

@pytest.fixture
def triton_backend(monkeypatch):
    ops = kernel_ops(DEVICE)
    monkeypatch.setenv("OCTOPUS_AUDIO_KERNELS", "kernels")
    return ops


# implementation the call takes -> (query rows per KV head (Tq, G), units, prefix tokens)
KERNEL_CASES = {
    "split-k": ((3, 2), UNITS, 6),  # a block of rows
    "score-tables": ((1, 1), UNITS, 6),  # one row, a native segment of at most 64 tokens
    "split-k-one-row": ((1, 1), (1, 2, 4, 6, 9, 12, 45), 22),  # one row, 67 native tokens at the last
}
KERNEL_CODECS = ["octopus", "turboquant-mse", "turboquant-qjl", "polarquant", "octopus-qjl"]


@pytest.mark.parametrize("path", list(KERNEL_CASES))
@pytest.mark.parametrize("name", KERNEL_CODECS)
def test_kernels_attend_the_prefix_as_the_reference_does(name, path, triton_backend, monkeypatch):
    """The fused attention takes the prefix in its native segment (prefix then window): each implementation
    equals the cache's reference path (decode, then SDPA over prefix, store and window) at every unit."""
    from octopus_audio.kernels.impls import score_tables

    (tq, groups), sizes, prefix = KERNEL_CASES[path]
    tables = []
    inner = score_tables.table_attention
    monkeypatch.setattr(score_tables, "table_attention", lambda *a, **kw: tables.append(1) or inner(*a, **kw))
    cache = CompressedKVCache(name, 2, D, window=1, seed=4, native_prefix=prefix)
    g = torch.Generator().manual_seed(len(name))
    for k, v in _units(seed=7, sizes=sizes, dtype=torch.bfloat16, device=DEVICE):
        cache.append(k, v)
        q = (torch.randn(B, H * groups, tq, D, generator=g) / 4).bfloat16().to(DEVICE)
        tables.clear()
        got = cache.attend(q, 0.125)
        want = cache.attend_reference(q.float(), 0.125).double()
        floor = ((want.bfloat16().double() - want).norm() / want.norm()).item()
        rel = ((got.double() - want).norm() / want.norm()).item()
        assert rel <= 2e-3 + floor, f"relative RMS error {rel:.2e} at {cache.num_tokens} tokens"
    assert cache.backend == "triton" and cache.prefix_tokens == prefix
    native = cache.native_kv()[0].shape[2]
    assert bool(tables) == (path == "score-tables"), (path, native)  # the last unit's attend
    if path == "score-tables":
        assert native <= 64
    if path == "split-k-one-row":
        assert score_tables.adc_limit(cache._plan.kernel, 1, native) is not None


@pytest.mark.parametrize("where", ["whole-unit", "split-unit", "stored"])
def test_fused_encode_checks_the_prefix_tokens(where, triton_backend):
    """Deferred checks on the fused encode path see a bad value in a unit the prefix keeps whole, in the
    prefix part of a unit it splits (both measured as the immediate check measures, so named as it names
    them), and in a stored unit (flagged by the encode kernel, whose flag does not tell a non-finite value
    from one beyond fp16)."""
    units = _units(seed=8, sizes=UNITS, dtype=torch.bfloat16, device=DEVICE)
    bad_unit, token = {"whole-unit": (1, 0), "split-unit": (2, 1), "stored": (3, 1)}[where]
    k, v = units[bad_unit]
    v = v.clone()
    v[0, 1, token, 3] = float("inf")
    units[bad_unit] = (k, v)
    cache = CompressedKVCache("octopus", 2, D, window=1, native_prefix=6, defer_checks=True)
    assert cache._fused is None  # decided at the first unit
    for k, v in units:
        cache.append(k, v)
    assert cache._fused is not None and cache.prefix_tokens == 6
    said = ("values that are non-finite or beyond the fp16 range" if where == "stored"
            else r"non-finite values \(NaN or Inf\)")
    with pytest.raises(ValueError, match=f"append got {said}"):
        cache.check()


def test_fused_store_with_a_prefix_equals_the_separate_encodes(triton_backend, monkeypatch):
    """The fused encode of a unit the prefix splits (a view of its stored part) writes the codes the separate
    encodes write, and both attend alike."""
    from octopus_audio.cache import plan as plan_module

    units = _units(seed=9, sizes=UNITS, dtype=torch.bfloat16, device=DEVICE)
    q = (torch.randn(B, 2 * H, 3, D, generator=torch.Generator().manual_seed(1)) / 4).bfloat16().to(DEVICE)
    caches = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(plan_module.CachePlan, "fused_encoder", lambda self, quantizer: None)
        cache = CompressedKVCache("octopus", 2, D, window=1, seed=5, native_prefix=6, defer_checks=True)
        for k, v in units:
            cache.append(k, v)
        assert (cache._fused is not None) == fused
        caches.append(cache)
    for got, want in zip(caches[0].store.valid(), caches[1].store.valid(), strict=True):
        for field, t in want.tensors().items():
            assert torch.equal(getattr(got, field).cpu(), t.cpu()), field
    assert torch.equal(caches[0].attend(q, 0.125).cpu(), caches[1].attend(q, 0.125).cpu())
