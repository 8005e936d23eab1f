"""The cache's wide prefix (the tokens after the native prefix stored at other widths, `wide_prefix`,
`wide_bits`, `wide_v_bits`): the reference path against SDPA over an independently built K/V, teacher
forcing's one pass against the unit-by-unit cache, the accounting, crop and row selection, the fused encode's
deferred checks, bad arguments, and the split-K kernel (the one implementation that reads a second width;
interpreted on the CPU) against the cache's reference path on the same compressed state.

The Triton kernels run on the CPU under TRITON_INTERPRET=1 (set at import, as the kernel tests do); with
OCTOPUS_AUDIO_TEST_DEVICE=cuda they run compiled on the GPU."""

import os

DEVICE = os.environ.get("OCTOPUS_AUDIO_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from helpers import attend_sequence_of, attend_unit_by_unit, kernel_ops  # noqa: E402

from octopus_audio import CompressedKVCache, get_codec  # noqa: E402
from octopus_audio.cache import sequence_capacities  # noqa: E402
from octopus_audio.values import ValueQuantizer  # noqa: E402

B, H, D = 2, 2, 64
UNITS = (1, 3, 5, 2, 7)  # uneven units (scales): a prefix of 3 tokens and a wide prefix of 6 end inside units


def _units(seed=0, sizes=UNITS, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(B, H, t, D, generator=g).to(dtype).to(device),
             torch.randn(B, H, t, D, generator=g).to(dtype).to(device)) for t in sizes]


def _expected_kv(name, bits, wide_bits, wide_v_bits, seed, units, window, prefix, wide):
    """K, V as the cache should hold them, built without the cache: tokens [prefix, prefix + wide) through
    the codec library at `wide_bits` and the value quantizer at `wide_v_bits`, the other stored ones at
    `bits`, the native ones (the first `prefix` tokens, the last `window` units) as given."""
    k_all = torch.cat([k for k, _ in units], 2)
    v_all = torch.cat([v for _, v in units], 2)
    t = torch.arange(k_all.shape[2])
    native_T = t < prefix
    if window:
        native_T[k_all.shape[2] - sum(k.shape[2] for k, _ in units[-window:]):] = True
    wide_T = ~native_T & (t >= prefix) & (t < prefix + wide)
    narrow, wide_codec = get_codec(name, bits, D, seed=seed), get_codec(name, wide_bits, D, seed=seed)
    vq, wide_vq = ValueQuantizer(bits, D), ValueQuantizer(wide_v_bits, D)
    k_hat = torch.where(wide_T[:, None], wide_codec.decode(wide_codec.encode(k_all)),
                        narrow.decode(narrow.encode(k_all)))
    v_hat = torch.where(wide_T[:, None], wide_vq.decode(wide_vq.encode(v_all)), vq.decode(vq.encode(v_all)))
    k_hat = torch.where(native_T[:, None], k_all, k_hat)
    v_hat = torch.where(native_T[:, None], v_all, v_hat)
    return k_hat, v_hat, int(wide_T.sum())


# (window, native prefix, wide prefix) tokens; 100: more than the sequence holds
LAYOUTS = [(1, 3, 6), (0, 3, 6), (2, 0, 4), (1, 1, 100), (1, 100, 5)]
LAYOUT_IDS = [f"W{w}-P{p}-N{n}" for w, p, n in LAYOUTS]


@pytest.mark.parametrize("window,prefix,wide", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("name", ["octopus", "turboquant-qjl", "polarquant"])
def test_reference_attention_reads_the_wide_tokens_at_their_widths(name, window, prefix, wide):
    units = _units(seed=prefix + window + wide)
    cache = CompressedKVCache(name, 2, D, window=window, seed=9, native_prefix=prefix, wide_prefix=wide,
                              wide_bits=4, wide_v_bits=3)
    for k, v in units:
        cache.append(k, v)
    k_hat, v_hat, n_wide = _expected_kv(name, 2, 4, 3, 9, units, window, prefix, wide)
    q = torch.randn(B, 2 * H, 4, D, generator=torch.Generator().manual_seed(1))  # grouped queries, G = 2
    expect = F.scaled_dot_product_attention(q, k_hat.repeat_interleave(2, 1), v_hat.repeat_interleave(2, 1),
                                            scale=0.125)
    torch.testing.assert_close(cache.attend(q, 0.125), expect, rtol=1e-5, atol=1e-5)
    k_got, v_got = cache.decoded_kv()
    torch.testing.assert_close(k_got, k_hat, rtol=1e-6, atol=1e-6)  # held in sequence order
    torch.testing.assert_close(v_got, v_hat, rtol=1e-6, atol=1e-6)
    assert cache.wide_tokens == n_wide and cache.num_tokens == sum(UNITS)
    assert cache.wide is not None and cache.wide.tokens == wide and cache.wide.codec.bits == 4


SEQUENCE_CASES = [(w, p, n) for w in (0, 1, 2) for p, n in ((0, 5), (3, 6), (4, 100))]


@pytest.mark.parametrize("window,prefix,wide", SEQUENCE_CASES,
                         ids=[f"W{w}-P{p}-N{n}" for w, p, n in SEQUENCE_CASES])
@pytest.mark.parametrize("name", ["octopus", "turboquant-qjl"])
def test_attend_sequence_reads_the_wide_prefix_as_appending_does(name, window, prefix, wide):
    """Teacher forcing's one pass encodes the wide prefix's tokens at their widths, as the cache fed unit by
    unit stores them."""
    units = _units(seed=21 + window)
    g = torch.Generator().manual_seed(22)
    queries = [torch.randn(B, 2 * H, t, D, generator=g) for t in UNITS]
    options = dict(window=window, seed=4, native_prefix=prefix, wide_prefix=wide, wide_bits=4)
    expect = attend_unit_by_unit(CompressedKVCache(name, 2, D, **options), units, queries, 0.3)
    got = attend_sequence_of(CompressedKVCache(name, 2, D, **options), torch.cat(queries, 2),
                             torch.cat([k for k, _ in units], 2), torch.cat([v for _, v in units], 2), UNITS,
                             0.3)
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-5)


def test_wide_bytes_are_counted_at_their_widths():
    units = _units(seed=6, dtype=torch.float16)
    cache = CompressedKVCache("octopus", 2, D, window=1, native_prefix=3, wide_prefix=6, wide_bits=4)
    for k, v in units:
        cache.append(k, v)
    b = cache.bytes_breakdown()
    stored = sum(UNITS) - 3 - UNITS[-1]
    narrow, wide = get_codec("octopus", 2, D), get_codec("octopus", 4, D)
    vq, wide_vq = ValueQuantizer(2, D), ValueQuantizer(4, D)
    assert (b["prefix_tokens"], b["wide_tokens"], b["store_tokens"]) == (3, 6, stored)
    assert b["k_bytes"] * 8 == B * H * (6 * wide.bits_per_key + (stored - 6) * narrow.bits_per_key)
    assert b["v_bytes"] * 8 == B * H * (6 * wide_vq.bits_per_token + (stored - 6) * vq.bits_per_token)
    assert cache.nbytes == b["k_bytes"] + b["v_bytes"] + b["native_bytes"] <= b["allocated_bytes"]
    assert cache.length == stored - 6  # the main store's tokens
    assert "wide_prefix=6, wide_bits=4, wide_v_bits=4" in repr(cache)


def test_sequence_capacities_leave_the_wide_tokens_out_of_the_store():
    units = _units(seed=2)
    store, peak = sequence_capacities(UNITS, 1, 3, 6)
    cache = CompressedKVCache("octopus", 2, D, window=1, native_prefix=3, wide_prefix=6, wide_bits=4,
                              capacity=store, native_capacity=peak)
    for k, v in units:
        cache.append(k, v)
    assert cache.store.capacity == cache.length == store and cache._native.capacity == peak


# window 1, prefix 3, wide 6: prefix [0, 3), wide [3, 9), store [9, 11), window [11, 18)
CROPS = [2, 3, 5, 9, 10, 14]


@pytest.mark.parametrize("keep", CROPS, ids=[f"keep{k}" for k in CROPS])
def test_crop_keeps_the_first_tokens_and_the_wide_prefix_fills_again(keep):
    units = _units(seed=13 + keep)
    cache = CompressedKVCache("octopus", 2, D, window=1, seed=9, native_prefix=3, wide_prefix=6, wide_bits=4)
    for k, v in units:
        cache.append(k, v)
    k_all, v_all = cache.decoded_kv()
    cache.crop(keep)
    assert cache.num_tokens == keep and cache.wide_tokens == min(max(keep - 3, 0), 6)
    k_kept, v_kept = cache.decoded_kv()
    assert torch.equal(k_kept, k_all[:, :, :keep]) and torch.equal(v_kept, v_all[:, :, :keep])
    more = _units(seed=14, sizes=(2, 1))
    for k, v in more:
        cache.append(k, v)
    kept = tuple(torch.cat([u[i] for u in units], 2)[:, :, :keep] for i in (0, 1))
    k_hat, v_hat, _ = _expected_kv("octopus", 2, 4, 4, 9, [kept, *more], 1, 3, 6)
    k_got, v_got = cache.decoded_kv()
    torch.testing.assert_close(k_got, k_hat, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(v_got, v_hat, rtol=1e-6, atol=1e-6)


def test_select_rows_reorders_the_wide_prefix_with_the_rest():
    units = _units(seed=15)
    cache = CompressedKVCache("octopus", 2, D, window=1, seed=3, native_prefix=3, wide_prefix=6, wide_bits=4)
    for k, v in units:
        cache.append(k, v)
    k_before, v_before = cache.decoded_kv()
    index = torch.tensor([1, 0, 1])
    cache.select_rows(index)
    k_after, v_after = cache.decoded_kv()
    assert torch.equal(k_after, k_before[index]) and torch.equal(v_after, v_before[index])
    q = torch.randn(3, H, 1, D, generator=torch.Generator().manual_seed(16))
    expect = F.scaled_dot_product_attention(q, k_after, v_after, scale=0.125)
    torch.testing.assert_close(cache.attend(q, 0.125), expect, rtol=1e-5, atol=1e-5)


BAD = [
    (dict(wide_prefix=-1, wide_bits=4), "wide_prefix must be an integer >= 0"),
    (dict(wide_prefix=2.5, wide_bits=4), "wide_prefix must be an integer >= 0"),
    (dict(wide_prefix=4), "needs wide_bits"),
    (dict(wide_prefix=4, wide_bits=99), "bits"),
]


@pytest.mark.parametrize("options,said", BAD, ids=["negative", "float", "no-bits", "bad-bits"])
def test_bad_wide_prefix_is_a_clear_error(options, said):
    with pytest.raises(ValueError, match=said):
        CompressedKVCache("octopus", 2, D, **options)


def test_codec_none_takes_no_wide_prefix():
    with pytest.raises(ValueError, match="stores every token native"):
        CompressedKVCache("none", 16, D, wide_prefix=4, wide_bits=4)


# ---- the kernels (interpreted on the CPU), on the same compressed state as the reference ----

@pytest.fixture
def triton_backend(monkeypatch):
    ops = kernel_ops(DEVICE)
    monkeypatch.setenv("OCTOPUS_AUDIO_KERNELS", "kernels")
    return ops


KERNEL_CODECS = ["octopus", "turboquant-mse", "turboquant-qjl", "polarquant", "octopus-qjl"]
# (query rows per KV head (Tq, G), wide bits, wide value bits): a block of rows, and one row (which the score
# tables would take without the wide prefix)
ROWS = {"block": ((3, 2), 4, 4), "one-row": ((1, 1), 3, 4)}


@pytest.mark.parametrize("rows", list(ROWS))
@pytest.mark.parametrize("name", KERNEL_CODECS)
def test_split_k_attends_the_wide_prefix_as_the_reference_does(name, rows, triton_backend):
    """The split-K kernel reads the wide store as a second segment at its own widths: equal to the cache's
    reference path (decode both stores, then SDPA over prefix, wide prefix, store and window) at every
    unit; the Gluon kernel and the score tables say why they decline."""
    (tq, groups), wide_bits, wide_v_bits = ROWS[rows]
    cache = CompressedKVCache(name, 2, D, window=1, seed=4, native_prefix=3, wide_prefix=6,
                              wide_bits=wide_bits, wide_v_bits=wide_v_bits)
    g = torch.Generator().manual_seed(len(name))
    for k, v in _units(seed=7, dtype=torch.bfloat16, device=DEVICE):
        cache.append(k, v)
        q = (torch.randn(B, H * groups, tq, D, generator=g) / 4).bfloat16().to(DEVICE)
        cache._plan.used.clear()  # the implementation this call takes, and why
        got = cache.attend(q, 0.125)
        want = cache.attend_reference(q.float(), 0.125).double()
        floor = ((want.bfloat16().double() - want).norm() / want.norm()).item()
        rel = ((got.double() - want).norm() / want.norm()).item()
        assert rel <= 2e-3 + floor, f"relative RMS error {rel:.2e} at {cache.num_tokens} tokens"
    assert cache.backend == "triton" and cache.wide_tokens == 6
    used = cache._plan.used["attention"]
    # the score tables decline the wide prefix; the Gluon kernel reads one, but not here (the device, or
    # fewer programs than it takes)
    assert list(used) == ["split-k"] and "score-tables: a wide prefix" in used["split-k"], used


def test_the_wide_segment_changes_the_kernel_output(triton_backend):
    """The kernel reads the wide store: the same cache without it (its tokens stored at 2 bits) gives an
    output further from the wide cache's reference than the kernel's own."""
    units = _units(seed=8, dtype=torch.bfloat16, device=DEVICE)
    q = (torch.randn(B, H, 3, D, generator=torch.Generator().manual_seed(3)) / 4).bfloat16().to(DEVICE)
    caches = [CompressedKVCache("octopus", 2, D, window=1, seed=4, native_prefix=3, **extra)
              for extra in (dict(wide_prefix=6, wide_bits=4), {})]
    for cache in caches:
        for k, v in units:
            cache.append(k, v)
    want = caches[0].attend_reference(q.float(), 0.125).double()
    rel = [((c.attend(q, 0.125).double() - want).norm() / want.norm()).item() for c in caches]
    assert rel[0] < 2.5e-3 < rel[1], rel


@pytest.mark.parametrize("where", ["wide-part", "stored-part"])
def test_fused_encode_checks_the_wide_tokens(where, triton_backend):
    """Deferred checks on the fused encode path see a bad value among the wide prefix's tokens and among the
    tokens of a unit the wide prefix splits (the whole unit measured)."""
    units = _units(seed=8, dtype=torch.bfloat16, device=DEVICE)
    bad_unit, token = {"wide-part": (2, 0), "stored-part": (2, 4)}[where]
    k, v = units[bad_unit]
    v = v.clone()
    v[0, 1, token, 3] = float("inf")
    units[bad_unit] = (k, v)
    cache = CompressedKVCache("octopus", 2, D, window=1, native_prefix=3, wide_prefix=4, wide_bits=4,
                              defer_checks=True)
    for k, v in units:
        cache.append(k, v)
    assert cache._fused is not None and cache.wide_tokens == 4
    with pytest.raises(ValueError, match=r"append got non-finite values \(NaN or Inf\)"):
        cache.check()
