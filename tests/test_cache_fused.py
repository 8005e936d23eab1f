"""The cache's fused encode path (one launch per unit, written into the store, checks recorded by the kernel)
against the separate encode launches and the immediate data checks.

Runs the Triton kernels on the CPU under TRITON_INTERPRET=1 (set at import, as the kernel tests do) with the
triton backend forced; with OCTOPUS_AUDIO_TEST_DEVICE=cuda it runs the compiled kernels on the GPU.
"""

import os

DEVICE = os.environ.get("OCTOPUS_AUDIO_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import attend_sequence_of, kernel_ops  # noqa: E402

from octopus_audio import CompressedKVCache  # noqa: E402
from octopus_audio.cache import backend as backend_module  # noqa: E402
from octopus_audio.cache import checks as cache_checks  # noqa: E402
from octopus_audio.cache.plan import CachePlan  # noqa: E402

B, H, D = 2, 2, 64
SIZES = (1, 3, 5, 2, 4)  # five units of uneven size (scales)


@pytest.fixture(autouse=True)
def _triton(monkeypatch):
    kernel_ops(DEVICE)
    monkeypatch.setenv("OCTOPUS_AUDIO_KERNELS", "kernels")


def _units(seed=0, dtype=torch.bfloat16, sizes=SIZES):
    """(k, v) per unit as strided [B, H, T, D] views of a fused projection, as the model hands them over."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for t in sizes:
        qkv = (torch.randn(B, t, 3, H, D, generator=g) * 2).to(dtype).to(DEVICE)
        _, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        out.append((k, v))
    return out


def _fill(cache, units):
    for k, v in units:
        cache.append(k, v)
    return cache


def _unfused(monkeypatch):
    monkeypatch.setattr(CachePlan, "fused_encoder", lambda self, quantizer: None)


# every kernel codec with a store grown from its first unit; octopus also grown once (9) and reserved (64)
KERNEL_CODECS = ("octopus", "octopus-qjl", "turboquant-mse", "turboquant-qjl", "polarquant")
FUSED_CASES = [(n, None) for n in KERNEL_CODECS]
FUSED_CASES += [("octopus", 9), ("octopus", 64)]


@pytest.mark.parametrize("name,capacity", FUSED_CASES, ids=[f"{n}-cap{c}" for n, c in FUSED_CASES])
def test_fused_store_equals_the_separate_encodes(name, capacity, monkeypatch):
    """Same valid tokens bit for bit and the same attention, whether the store grows (capacity None, 9) or
    was reserved (64); the fused path runs one encode launch per unit."""
    units = _units(seed=len(name))
    q = torch.randn(B, 2 * H, 3, D, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).to(DEVICE)
    options = dict(window=1, seed=4, capacity=capacity, defer_checks=True)
    fused = _fill(CompressedKVCache(name, 2, D, **options), units)
    assert fused._fused is not None and fused.backend == "triton"
    _unfused(monkeypatch)
    plain = _fill(CompressedKVCache(name, 2, D, **options), units)
    assert plain._fused is None
    for got, want in zip(fused.store.valid(), plain.store.valid(), strict=True):
        for field, t in want.tensors().items():
            assert torch.equal(getattr(got, field).cpu(), t.cpu()), field
    assert fused.store.capacity == plain.store.capacity
    assert torch.equal(fused.attend(q, 0.125).cpu(), plain.attend(q, 0.125).cpu())
    fused.check()
    plain.check()


@pytest.mark.parametrize("where", ["stored", "window"])
@pytest.mark.parametrize("bad", ["nan_k", "inf_v", "big_v"])
def test_fused_deferred_checks_raise_what_append_raises(bad, where):
    """A bad unit that was encoded (flagged by the kernel) or is still in the native window (recorded at the
    check) raises at check() the error an immediate check raises at append; the kernel's flag of a value
    unit (+inf) does not say whether a value was NaN or beyond fp16, so that sentence names both."""
    units = _units(seed=3, sizes=(1, 2, 3))
    index = 1 if where == "stored" else len(units) - 1
    k, v = units[index]
    k, v = k.clone(), v.clone()
    if bad == "nan_k":
        k[1, 0, 0, 5] = float("nan")
    elif bad == "inf_v":
        v[0, 1, -1, 9] = float("inf")
    else:
        v[0, 0, 0, 0] = 7e4
    units[index] = (k, v)
    with pytest.raises(ValueError) as now:
        _fill(CompressedKVCache("octopus", 2, D, window=1, defer_checks=False), units)
    deferred = _fill(CompressedKVCache("octopus", 2, D, window=1, defer_checks=True), units)
    assert deferred._fused is not None
    with pytest.raises(ValueError) as later:
        deferred.check()
    if where == "stored" and bad != "nan_k":
        reason, _, accepted = str(now.value).partition(": ")
        either = "append got values that are non-finite or beyond the fp16 range"
        assert str(later.value) == f"{either}: {accepted}"
        assert ("beyond the fp16 range (max |v| = 7" if bad == "big_v" else "non-finite values") \
            in reason
    else:
        assert str(later.value) == str(now.value)
    clean = _fill(CompressedKVCache("octopus", 2, D, window=1, defer_checks=True), _units(3, sizes=(1, 2, 3)))
    clean.check()


def test_fused_checks_are_recorded_while_capturing_and_read_after(monkeypatch):
    """During a (emulated) CUDA graph capture the check only records (the window units too); reading the
    record afterwards, as replay_check does, raises for a bad window unit."""
    units = _units(seed=8, sizes=(1, 2, 3))
    k, v = units[-1]
    units[-1] = (k.clone().fill_(float("nan")), v)
    cache = _fill(CompressedKVCache("turboquant-mse", 2, D, window=1, defer_checks=True), units)
    monkeypatch.setattr(cache_checks, "capturing", lambda: True)
    cache.check()  # no read while capturing; the window unit is recorded
    monkeypatch.setattr(cache_checks, "capturing", lambda: False)
    with pytest.raises(ValueError, match="non-finite keys"):
        cache_checks.check_flags([cache.deferred_flags()])


@pytest.mark.parametrize("name", ["octopus", "turboquant-qjl"])
def test_prepare_builds_every_table_from_the_host_before_the_first_unit(name, monkeypatch):
    """After prepare() (what patch_aar calls for a CUDA model) a sequence reads no codebook and makes no
    rotation signs: on CUDA those host-to-device copies were the first generation's host syncs."""
    import octopus_audio.codebooks
    import octopus_audio.rotation

    cache = CompressedKVCache(name, 2, D, window=1, defer_checks=True, seed=6)
    cache.prepare(H, DEVICE)

    def no_host_tables(*args, **kwargs):
        raise AssertionError("a table was built from the host during the sequence")

    monkeypatch.setattr(octopus_audio.codebooks, "get_codebook", no_host_tables)
    monkeypatch.setattr(octopus_audio.rotation, "head_signs", no_host_tables)
    q = torch.randn(B, H, 2, D).to(torch.bfloat16).to(DEVICE)
    _fill(cache, _units(seed=2, sizes=(1, 2))).attend(q, 0.125)
    cache.check()


@pytest.mark.parametrize("name", ["octopus", "turboquant-mse"])
@pytest.mark.parametrize("bits,v_bits", [(2, 4), (4, 3)], ids=["k2v4", "k4v3"])
def test_fused_store_with_value_bits_of_their_own(name, bits, v_bits, monkeypatch):
    """Keys at `bits`, values at `v_bits`: the fused store equals the separate encodes bit for bit, its value
    codes are the reference quantizer's at `v_bits`, and its attention is the reference's."""
    from octopus_audio.values import ValueQuantizer

    units = _units(seed=7)
    q = torch.randn(B, 2 * H, 3, D, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16).to(DEVICE)
    options = dict(window=1, seed=4, v_bits=v_bits, defer_checks=True)
    fused = _fill(CompressedKVCache(name, bits, D, **options), units)
    assert fused._fused is not None and fused.value_quantizer.bits == v_bits
    _unfused(monkeypatch)
    plain = _fill(CompressedKVCache(name, bits, D, **options), units)
    for got, want in zip(fused.store.valid(), plain.store.valid(), strict=True):
        for field, t in want.tensors().items():
            assert torch.equal(getattr(got, field).cpu(), t.cpu()), field
    stored_v = torch.cat([v for _, v in units[:-1]], dim=2).cpu()
    expected = ValueQuantizer(v_bits, D).encode(stored_v)
    values = fused.store.valid()[1]
    for field in ("codes", "scale", "minimum"):
        assert torch.equal(getattr(values, field).cpu(), getattr(expected, field)), field
    torch.testing.assert_close(fused.attend(q, 0.125).float().cpu(),
                               fused.attend_reference(q, 0.125).float().cpu(), rtol=2e-2, atol=2e-2)


def test_codes_wider_than_the_kernels_take_run_on_the_reference():
    """octopus b=6 stores 19-bit codes: the plan says why and runs the library's encode and the reference
    attention (before, building the kernels' codec view raised)."""
    from octopus_audio.cache import kernel_limit

    cache = CompressedKVCache("octopus", 6, D, window=1, defer_checks=True)
    assert "19-bit codes" in kernel_limit(cache.codec)
    _fill(cache, _units(seed=3, sizes=(2, 3)))
    assert not cache._plan.kernel_encode and not cache._plan.kernel_attention
    q = torch.randn(B, H, 2, D, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).to(DEVICE)
    assert torch.equal(cache.attend(q, 0.125), cache.attend_reference(q, 0.125))


@pytest.mark.parametrize("name", KERNEL_CODECS)
def test_attend_sequence_encodes_with_the_kernels_as_append_does(name, monkeypatch):
    """With the kernels chosen, teacher forcing's one pass encodes its stored tokens with the encode kernels
    (as `append` does) and equals the pass through the library's encode: the same codes but at exact
    near-ties, none in these fp32 keys."""
    sizes = (1, 3, 4, 2)  # window 1: the first 8 tokens are stored
    units = _units(seed=31, dtype=torch.float32, sizes=sizes)
    k, v = (torch.cat([u[i] for u in units], 2) for i in (0, 1))
    q = torch.randn(B, 2 * H, sum(sizes), D, generator=torch.Generator().manual_seed(32)).to(DEVICE)
    seen = []
    plain = CachePlan.encode_keys

    def recorded(self, codec, keys):
        seen.append((self.kernel_encode, tuple(keys.shape)))
        return plain(self, codec, keys)

    monkeypatch.setattr(CachePlan, "encode_keys", recorded)
    got = attend_sequence_of(CompressedKVCache(name, 2, D, seed=5), q, k, v, sizes, 0.25)
    with backend_module.reference_backend("test: the library's encode"):
        expect = attend_sequence_of(CompressedKVCache(name, 2, D, seed=5), q, k, v, sizes, 0.25)
    assert seen == [(True, (B, H, 8, D)), (False, (B, H, 8, D))]
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-5)
