"""Tests for CompressedKVCache: reference attention vs SDPA over decoded K/V, windows, accounting, backend."""

import pytest
import torch
import torch.nn.functional as F
from helpers import attend_sequence_of, attend_unit_by_unit

from octopus_audio import CODECS, CompressedKVCache, attention_backend, get_codec
from octopus_audio.cache import backend as backend_mod
from octopus_audio.values import ValueQuantizer

UNIT_TOKENS = (1, 3, 5, 2)  # four units of uneven size (scales)
B, H, D = 2, 2, 64


def _units(seed=0, dtype=torch.float32, sizes=UNIT_TOKENS):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(B, H, t, D, generator=g).to(dtype), torch.randn(B, H, t, D, generator=g).to(dtype))
            for t in sizes]


def _fill(cache, units):
    for k, v in units:
        cache.append(k, v)
    return cache


@pytest.mark.parametrize("window", [0, 1, 2], ids=lambda w: f"W{w}")
@pytest.mark.parametrize("name", [c for c in CODECS if c != "none"])
def test_reference_attention_equals_sdpa_over_decoded(name, window):
    units = _units(seed=window)
    cache = _fill(CompressedKVCache(name, 2, D, window=window, seed=9), units)
    # independent expectation: each unit leaving the window is encoded on its own, then decoded
    codec, vq = get_codec(name, 2, D, seed=9), ValueQuantizer(2, D)
    n_comp = max(0, len(units) - window)
    ks = [codec.decode(codec.encode(k)) for k, _ in units[:n_comp]] + [k for k, _ in units[n_comp:]]
    vs = [vq.decode(vq.encode(v)) for _, v in units[:n_comp]] + [v for _, v in units[n_comp:]]
    k_all, v_all = torch.cat(ks, 2), torch.cat(vs, 2)
    q = torch.randn(B, 2 * H, 4, D, generator=torch.Generator().manual_seed(1))  # grouped queries, G = 2
    out = cache.attend(q, 0.125)
    expect = F.scaled_dot_product_attention(q, k_all.repeat_interleave(2, 1), v_all.repeat_interleave(2, 1),
                                            scale=0.125)
    torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-5)
    assert cache.length == sum(UNIT_TOKENS[:n_comp]) and cache.num_tokens == sum(UNIT_TOKENS)


@pytest.mark.parametrize("bits", [2, 3], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("name", [c for c in CODECS if c != "none"])
def test_reference_decodes_each_token_once_and_equals_a_whole_store_decode(name, bits):
    """The reference path keeps what it decoded (an attend after every append, as a model runs): the K/V it
    attends over equal one decode of the whole store, bit for bit, and a later sequence starts afresh."""
    units = _units(seed=bits, sizes=(1, 2, 4, 6, 9, 12, 3))
    cache = CompressedKVCache(name, bits, D, window=1, seed=5)
    q = torch.randn(B, H, 2, D, generator=torch.Generator().manual_seed(6))
    for _ in range(2):  # the second sequence (after reset) must not reuse the first's decode
        for k, v in units:
            cache.append(k, v)
            cache.attend(q, 0.125)
        k_state, v_state = cache.store.valid()
        whole_k = cache.codec.decode(k_state, torch.float32)
        whole_v = cache.value_quantizer.decode(v_state, torch.float32)
        k_all, v_all = cache.decoded_kv()
        n = cache.length
        assert torch.equal(k_all[:, :, :n], whole_k) and torch.equal(v_all[:, :, :n], whole_v)
        cache.reset()
        units = _units(seed=bits + 10, sizes=(1, 2, 4, 6, 9, 12, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("window", [0, 1, 2], ids=lambda w: f"W{w}")
def test_codec_none_equals_plain_sdpa_exactly(window, dtype):
    units = _units(seed=3, dtype=dtype)
    cache = _fill(CompressedKVCache("none", 2, D, window=window), units)
    q = torch.randn(B, H, 3, D, generator=torch.Generator().manual_seed(2)).to(dtype)
    k_all = torch.cat([k for k, _ in units], 2)
    v_all = torch.cat([v for _, v in units], 2)
    assert torch.equal(cache.attend(q, 0.2), F.scaled_dot_product_attention(q, k_all, v_all, scale=0.2))
    qg = torch.randn(B, 3 * H, 1, D, generator=torch.Generator().manual_seed(4)).to(dtype)
    expect = F.scaled_dot_product_attention(qg, k_all.repeat_interleave(3, 1), v_all.repeat_interleave(3, 1),
                                            scale=0.2)
    assert torch.equal(cache.attend(qg, 0.2), expect)


SEQUENCE_UNITS = (1, 3, 5, 2, 7)


@pytest.mark.parametrize("window", [0, 1, 2, 7], ids=lambda w: f"W{w}")  # 7: no unit is ever stored
@pytest.mark.parametrize("name", CODECS)
def test_attend_sequence_equals_appending_and_attending_unit_by_unit(name, window):
    """One masked pass over a whole sequence gives each unit's queries what they get from the cache when the
    units are appended one at a time (grouped queries, uneven units), and leaves the cache empty."""
    units = _units(seed=11 + window, sizes=SEQUENCE_UNITS)
    g = torch.Generator().manual_seed(12)
    queries = [torch.randn(B, 2 * H, t, D, generator=g) for t in SEQUENCE_UNITS]
    expect = attend_unit_by_unit(CompressedKVCache(name, 3, D, window=window, seed=4), units, queries, 0.3)
    cache = CompressedKVCache(name, 3, D, window=window, seed=4)
    got = attend_sequence_of(cache, torch.cat(queries, 2), torch.cat([k for k, _ in units], 2),
                             torch.cat([v for _, v in units], 2), SEQUENCE_UNITS, 0.3)
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-5)  # fp32 rounding; a codec's error is ~1e-1
    assert cache.num_tokens == 0 and got.dtype == torch.float32


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 1e-2), (torch.float16, 2e-3)], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", ["none", "octopus"])
def test_attend_sequence_in_half_precision_returns_the_queries_dtype(name, dtype, tol):
    units = _units(seed=21, dtype=dtype, sizes=SEQUENCE_UNITS)
    g = torch.Generator().manual_seed(22)
    queries = [torch.randn(B, H, t, D, generator=g).to(dtype) for t in SEQUENCE_UNITS]
    expect = attend_unit_by_unit(CompressedKVCache(name, 2, D, seed=1), units, queries, 0.125)
    got = attend_sequence_of(CompressedKVCache(name, 2, D, seed=1), torch.cat(queries, 2),
                             torch.cat([k for k, _ in units], 2), torch.cat([v for _, v in units], 2),
                             SEQUENCE_UNITS, 0.125)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), expect.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("units,match", [
    ((1, 3, 5, 2), "summing to the T = 18"), ((1, 3, 0, 14), "integers >= 1"), ((1.5, 16.5), "integers"),
], ids=["short", "empty-unit", "float"])
def test_attend_sequence_rejects_units_that_do_not_cover_the_sequence(units, match):
    k, v = torch.randn(B, H, 18, D), torch.randn(B, H, 18, D)
    with pytest.raises(ValueError, match=match):
        attend_sequence_of(CompressedKVCache("octopus", 2, D), torch.randn(B, H, 18, D), k, v, units, 0.125)
    with pytest.raises(ValueError, match="one query per key"):
        attend_sequence_of(CompressedKVCache("octopus", 2, D), torch.randn(B, H, 17, D), k, v, (18,), 0.125)
    k[0, 0, 3, 0] = float("nan")
    with pytest.raises(ValueError, match="keys"):
        attend_sequence_of(CompressedKVCache("octopus", 2, D), torch.randn(B, H, 18, D), k, v, (18,), 0.125)


@pytest.mark.parametrize("name", ["octopus-qjl", "polarquant"])
def test_step_by_step_equals_encoding_all_at_once(name):
    units = _units(seed=5, sizes=(1, 2, 4, 6, 9, 12))
    cache = _fill(CompressedKVCache(name, 3, D, window=1, seed=2), units)
    codec, vq = get_codec(name, 3, D, seed=2), ValueQuantizer(3, D)
    k_old = torch.cat([k for k, _ in units[:-1]], 2)
    v_old = torch.cat([v for _, v in units[:-1]], 2)
    k_state, v_state = cache.store.valid()
    for field, t in codec.encode(k_old).tensors().items():
        assert torch.equal(getattr(k_state, field), t), field
    for field, t in vq.encode(v_old).tensors().items():
        assert torch.equal(getattr(v_state, field), t), field
    assert cache.store.capacity >= cache.length == 22 and cache.store.capacity <= 2 * 22  # grown by doubling


def test_accounting_and_reset():
    units = _units(seed=6, dtype=torch.float16)
    cache = _fill(CompressedKVCache("octopus", 2, D, window=1), units)
    codec, vq = get_codec("octopus", 2, D), ValueQuantizer(2, D)
    n_store = sum(UNIT_TOKENS[:-1])
    b = cache.bytes_breakdown()
    assert b["k_bytes"] * 8 == B * H * n_store * codec.bits_per_key
    assert b["v_bytes"] * 8 == B * H * n_store * vq.bits_per_token
    assert b["window_bytes"] == 2 * B * H * UNIT_TOKENS[-1] * D * 2
    assert cache.nbytes == b["k_bytes"] + b["v_bytes"] + b["window_bytes"] <= b["allocated_bytes"]
    assert cache.native_nbytes == 2 * B * H * sum(UNIT_TOKENS) * D * 2
    assert cache.nbytes < cache.native_nbytes / 2
    assert len(cache) == sum(UNIT_TOKENS) and cache.num_units == 4
    cache.reset()
    assert cache.num_tokens == 0 and cache.nbytes == 0 and cache.store is None
    cache.append(*_units(seed=7, sizes=(3,))[0])  # a new layout is accepted after reset
    assert cache.num_tokens == 3


@pytest.mark.parametrize("name", ["none", "turboquant-mse"])
@pytest.mark.parametrize("bad", ["nan_k", "inf_v", "big_v"])
def test_bad_units_raise_and_leave_cache_unchanged(name, bad):
    cache = _fill(CompressedKVCache(name, 2, D, window=0), _units(seed=8, sizes=(2,)))
    k, v = _units(seed=9, sizes=(3,))[0]
    if bad == "nan_k":
        k[1, 0, 2, 5] = float("nan")
    elif bad == "inf_v":
        v[0, 1, 0, 0] = float("inf")
    else:
        v[0, 0, 1, 1] = 1e6
    if name == "none" and bad == "big_v":
        cache.append(k, v)  # native values need only be finite
        return
    with pytest.raises(ValueError, match="finite"):
        cache.append(k, v)
    assert cache.num_tokens == 2


def test_bad_shapes_and_arguments():
    cache = CompressedKVCache("octopus", 2, D)
    with pytest.raises(ValueError, match="empty cache"):
        cache.attend(torch.zeros(B, H, 1, D), 1.0)
    cache.append(torch.zeros(B, H, 1, D), torch.zeros(B, H, 1, D))
    with pytest.raises(ValueError, match="multiple of H=2"):
        cache.attend(torch.zeros(B, 3, 1, D), 1.0)
    with pytest.raises(ValueError, match="reset"):
        cache.append(torch.zeros(B, 4, 1, D), torch.zeros(B, 4, 1, D))
    with pytest.raises(ValueError, match="one shape"):
        cache.append(torch.zeros(B, H, 1, D), torch.zeros(B, H, 2, D))
    with pytest.raises(ValueError, match="window must be an integer >= 0"):
        CompressedKVCache("octopus", 2, D, window=-1)
    with pytest.raises(ValueError, match="power of two"):
        CompressedKVCache("octopus", 2, 48)


def test_backend_selection(monkeypatch):
    monkeypatch.setenv("OCTOPUS_AUDIO_KERNELS", "reference")
    assert attention_backend("cpu") == "reference"
    cache = CompressedKVCache("turboquant-mse", 2, D)
    assert "backend='reference'" in repr(cache) and "kernels=None" in repr(cache)
    monkeypatch.setenv("OCTOPUS_AUDIO_KERNELS", "fastest")
    with pytest.raises(ValueError, match="auto, reference, kernels, triton"):
        attention_backend("cpu")
    monkeypatch.setenv("OCTOPUS_AUDIO_KERNELS", "auto")
    assert attention_backend("cpu") == "reference"  # auto never picks triton for CPU tensors
    assert attention_backend("cpu", get_codec("none", 2, D)) == "reference"
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for forced in ("kernels", "triton"):
        monkeypatch.setenv("OCTOPUS_AUDIO_KERNELS", forced)
        with pytest.raises(RuntimeError, match=f"OCTOPUS_AUDIO_KERNELS={forced} but the tensors are on cpu"):
            attention_backend("cpu")
    monkeypatch.setattr(backend_mod, "_kernel_ops", lambda: (None, "kernels not built"))
    with pytest.raises(RuntimeError, match="kernels not built"):
        attention_backend("cuda")


@pytest.mark.parametrize("old,value,now", [
    ("OCTOPUS_AUDIO_BACKEND", "triton", "OCTOPUS_AUDIO_KERNELS=kernels"),
    ("OCTOPUS_AUDIO_BACKEND", "Reference", "OCTOPUS_AUDIO_KERNELS=reference"),
    ("OCTOPUS_AUDIO_ATTENTION_KERNEL", "triton", "OCTOPUS_AUDIO_KERNELS=triton"),
    ("OCTOPUS_AUDIO_ATTENTION_KERNEL", "gluon", "OCTOPUS_AUDIO_KERNELS \\(one of auto, reference, kernels"),
], ids=["backend-triton", "backend-reference", "attention-kernel-triton", "attention-kernel-unknown"])
def test_a_replaced_variable_is_an_error_naming_the_new_setting(monkeypatch, old, value, now):
    monkeypatch.delenv("OCTOPUS_AUDIO_KERNELS", raising=False)
    monkeypatch.setenv(old, value)
    with pytest.raises(ValueError, match=f"{old} is replaced by OCTOPUS_AUDIO_KERNELS: unset it and set "
                       f"{now}"):
        attention_backend("cpu", get_codec("octopus", 2, D))


def test_reference_backend_overrides_a_forced_triton_for_sequences_started_inside(monkeypatch):
    """reference_backend (the eval's teacher forcing): a sequence that starts inside runs the reference even
    where the environment forces triton (the interpreter here); one started outside runs triton."""
    monkeypatch.setenv("OCTOPUS_AUDIO_KERNELS", "kernels")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    codec = get_codec("octopus", 2, D)
    assert attention_backend("cpu", codec) == "triton"
    with backend_mod.reference_backend("teacher forcing"):
        assert attention_backend("cpu", codec) == "reference"
        with backend_mod.reference_backend("nested"):
            assert attention_backend("cpu", codec) == "reference"
        assert attention_backend("cpu", codec) == "reference"
    assert attention_backend("cpu", codec) == "triton"
    k, v = _units()[0]
    inside, outside = CompressedKVCache("octopus", 2, D), CompressedKVCache("octopus", 2, D)
    with backend_mod.reference_backend("teacher forcing"):
        inside.append(k, v)
    outside.append(k, v)
    assert (inside._plan.backend, outside._plan.backend) == ("reference", "triton")


@pytest.mark.parametrize("capacity", [None, 2, 7, 40], ids=lambda c: f"capacity-{c}")
def test_capacity_reserves_the_store_and_changes_no_result(capacity):
    """A reserved store holds the same tokens and attends the same; it grows past the reservation."""
    units = _units()
    plain = CompressedKVCache("octopus", 2, D, window=1, seed=3)
    reserved = CompressedKVCache("octopus", 2, D, window=1, seed=3, capacity=capacity)
    q = torch.randn(B, H, 5, D, generator=torch.Generator().manual_seed(9))
    for k, v in units:
        plain.append(k, v)
        reserved.append(k, v)
        assert torch.equal(plain.attend(q, 0.125), reserved.attend(q, 0.125))
    store_tokens = reserved.length
    assert reserved.store.capacity >= max(store_tokens, capacity or 0)
    if capacity is not None and capacity >= store_tokens:
        assert reserved.store.capacity == capacity


@pytest.mark.parametrize("bad", [-1, 2.5, True], ids=["negative", "float", "bool"])
def test_bad_capacity_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="capacity must be None or an integer >= 0"):
        CompressedKVCache("octopus", 2, 64, capacity=bad)


@pytest.mark.parametrize("name", ["none", "octopus"])
@pytest.mark.parametrize("bad", ["nan_k", "inf_v", "big_v"])
def test_deferred_checks_raise_the_same_error_later(name, bad):
    """defer_checks=True (the CUDA default) records each unit on the device; check() raises what append
    would have raised at once, and a clean sequence of more units than the record's first rows passes."""
    units = _units(seed=10, sizes=(1,) * 20)  # 20 units: the record (16 rows at first) grows once
    k, v = units[17]
    k, v = k.clone(), v.clone()
    if bad == "nan_k":
        k[0, 1, 0, 3] = float("nan")
    elif bad == "inf_v":
        v[1, 0, 0, 7] = float("-inf")
    else:
        v[0, 0, 0, 0] = -7e4
    units[17] = (k, v)
    immediate = CompressedKVCache(name, 2, D, window=1)
    deferred = CompressedKVCache(name, 2, D, window=1, defer_checks=True)
    if name == "none" and bad == "big_v":
        _fill(deferred, units).check()  # native values need only be finite
        return
    with pytest.raises(ValueError, match="finite") as now:
        _fill(immediate, units)
    _fill(deferred, units)  # no error at append
    assert deferred.checks_deferred and deferred.num_units == 20
    with pytest.raises(ValueError) as later:
        deferred.check()
    assert str(later.value) == str(now.value)
    deferred.check()  # reported once
    deferred.reset()
    _fill(deferred, _units(seed=11, sizes=(1,) * 20)).check()  # a clean sequence after reset passes
    with pytest.raises(ValueError) as read_back:
        _fill(CompressedKVCache(name, 2, D, defer_checks=True), units).decoded_kv()  # reading back checks
    assert str(read_back.value) == str(now.value)
    # a finite value beyond fp16 is named as such, NaN and Inf as non-finite
    assert ("beyond the fp16 range (max |v| = 7e+04)" if bad == "big_v" else "non-finite") in str(now.value)


def test_defer_checks_argument_is_validated():
    with pytest.raises(ValueError, match="defer_checks must be None"):
        CompressedKVCache("octopus", 2, D, defer_checks="yes")
    cache = _fill(CompressedKVCache("octopus", 2, D), _units())
    assert not cache.checks_deferred and cache.deferred_flags() is None  # the CPU default checks at append
    cache.check()  # nothing deferred: a no-op


@pytest.mark.parametrize("window", [0, 1], ids=["W0-view", "W1-concatenated"])
def test_codec_none_attends_a_view_of_its_store_at_window_zero(window, monkeypatch):
    """Codec none at window 0 is a preallocated native cache: each unit is written in place into the store's
    buffer and attention reads a view of it, nothing concatenated; either way SDPA over every key."""
    from octopus_audio.cache import layer as cache_module

    units = _units(seed=5)
    cache = _fill(CompressedKVCache("none", 16, D, window=window, capacity=sum(UNIT_TOKENS)), units)
    seen = []
    inner = cache_module.attend
    monkeypatch.setattr(cache_module, "attend", lambda q, k, v, *a: seen.append(k) or inner(q, k, v, *a))
    q = torch.randn(B, H, 3, D, generator=torch.Generator().manual_seed(6))
    out = cache.attend(q, 0.2)
    k_all, v_all = (torch.cat([u[i] for u in units], 2) for i in (0, 1))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k_all, v_all, scale=0.2))
    assert (seen[0].data_ptr() == cache.store.keys.native.data_ptr()) == (window == 0)


# ---- select_rows and crop (what a language model's generation asks: beam search, speculative rollback) ----
@pytest.mark.parametrize("name", ["none", "octopus", "turboquant-qjl"])
def test_select_rows_reorders_every_held_token(name):
    units = _units(seed=4, sizes=(3, 1, 1))
    cache = _fill(CompressedKVCache(name, 2, D, window=1, seed=2), units)
    k_before, v_before = cache.decoded_kv()
    index = torch.tensor([1, 1, 0])  # three rows from two: repeats allowed, as beams are
    cache.select_rows(index)
    k_after, v_after = cache.decoded_kv()
    torch.testing.assert_close(k_after, k_before[index], rtol=0, atol=0)
    torch.testing.assert_close(v_after, v_before[index], rtol=0, atol=0)
    q = torch.randn(3, H, 1, D, generator=torch.Generator().manual_seed(3))
    expect = F.scaled_dot_product_attention(q, k_after, v_after, scale=0.125)
    torch.testing.assert_close(cache.attend(q, 0.125), expect, rtol=1e-5, atol=1e-5)
    k, v = _units(seed=5, sizes=(1,))[0]
    cache.append(k[index], v[index])  # the cache now takes units of three rows
    assert cache.num_tokens == 6 and cache.bytes_breakdown()["rows"] == 3 * H
    with pytest.raises(ValueError, match="1-D integer tensor"):
        cache.select_rows(torch.tensor([[0]]))


@pytest.mark.parametrize("keep", [0, 2, 4, 5, 6, 7], ids=lambda n: f"keep{n}")
def test_crop_keeps_the_first_tokens_as_held(keep):
    """Units of 4, 1, 1, 1 tokens with a window of 2: 5 tokens stored, 2 native. A crop keeps a prefix of what
    is held (store then window) and the cache goes on appending after it."""
    units = _units(seed=6, sizes=(4, 1, 1, 1))
    cache = _fill(CompressedKVCache("octopus", 3, D, window=2, seed=1), units)
    k_all, v_all = cache.decoded_kv()
    cache.crop(keep)
    assert cache.num_tokens == keep
    if keep:
        k_kept, v_kept = cache.decoded_kv()
        torch.testing.assert_close(k_kept, k_all[:, :, :keep], rtol=0, atol=0)
        torch.testing.assert_close(v_kept, v_all[:, :, :keep], rtol=0, atol=0)
    k, v = _units(seed=7, sizes=(1,))[0]
    cache.append(k, v)  # (at keep 7 the oldest window token leaves it and is encoded, as any append does)
    k_now, v_now = cache.decoded_kv()
    stored = min(keep, 5)
    torch.testing.assert_close(k_now[:, :, :stored], k_all[:, :, :stored], rtol=0, atol=0)
    torch.testing.assert_close(k_now[:, :, -1:], k, rtol=0, atol=0)
    q = torch.randn(B, H, 1, D, generator=torch.Generator().manual_seed(8))
    expect = F.scaled_dot_product_attention(q, k_now, v_now, scale=0.125)
    torch.testing.assert_close(cache.attend(q, 0.125), expect, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="crop keeps a number of tokens from 0 to the"):
        cache.crop(cache.num_tokens + 1)
