"""Attention with no compressed key (impls/native.py): the selector gives a call whose store and wide prefix
are empty to torch's SDPA over the native keys, unless the Gluon kernel takes it or a launch is forced; its
output equals the cache's reference path.

On the CPU the kernels run under TRITON_INTERPRET=1 (tests/conftest.py); with OCTOPUS_AUDIO_TEST_DEVICE=cuda
on the GPU, where the Gluon kernel takes the calls in its scope first.
"""

import os

import pytest
import torch

from octopus_audio import CompressedKVCache
from octopus_audio.kernels import select
from octopus_audio.kernels.impls import native

DEVICE = os.environ.get("OCTOPUS_AUDIO_TEST_DEVICE", "cpu")
B, H, D = 2, 2, 64


@pytest.fixture
def kernels(monkeypatch):
    monkeypatch.setenv("OCTOPUS_AUDIO_KERNELS", "kernels")


@pytest.mark.parametrize(("length", "wide", "window", "why"), [
    (0, 0, 1, None), (0, 0, 455, None), (3, 0, 1, "3 compressed keys to decode"),
    (0, 5, 1, "5 compressed keys to decode"), (0, 0, 0, "no native key")],
    ids=["one-native-key", "long-window", "stored", "wide", "empty"])
def test_native_limit(length, wide, window, why):
    assert native.native_limit(length, wide, window) == why


# case -> (units appended, native prefix tokens, window units, query rows Tq, query heads a KV head G)
CASES = {
    "first-unit-one-row": ((1,), 0, 1, 1, 1),  # AAR's first scale: one query row, one key
    "prefix-holds-all-gqa": ((1, 3, 2), 6, 1, 3, 2),  # every token native (the prefix, then the window)
    "odd-window": ((5, 7), 0, 2, 7, 1),  # two window units, nothing has left the window
}
DTYPES = [("bf16", torch.bfloat16, 2e-3), ("fp32", torch.float32, 1e-5)]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(("dtype_id", "dtype", "tol"), DTYPES, ids=[d[0] for d in DTYPES])
@pytest.mark.parametrize("name", ["octopus", "turboquant-qjl"])
def test_empty_store_attends_through_sdpa(name, case, dtype_id, dtype, tol, kernels):
    """With nothing stored the call runs SDPA over the native keys (on the CPU, where the Gluon kernel is out
    of scope), in q's dtype, equal to the reference path."""
    units, prefix, window, tq, groups = CASES[case]
    cache = CompressedKVCache(name, 2, D, window=window, seed=3, native_prefix=prefix)
    g = torch.Generator().manual_seed(len(case))
    for t in units:
        k, v = (torch.randn(B, H, t, D, generator=g).bfloat16().to(DEVICE) for _ in range(2))
        cache.append(k, v)
    assert cache.length == 0 and cache.wide_tokens == 0
    q = (torch.randn(B, H * groups, tq, D, generator=g) / 4).to(dtype).to(DEVICE)
    got = cache.attend(q, 0.125)
    want = cache.attend_reference(q.float(), 0.125).double()
    assert got.dtype == dtype and got.shape == q.shape
    floor = ((want.to(dtype).double() - want).norm() / want.norm()).item()
    rel = ((got.double() - want).norm() / want.norm()).item()
    assert rel <= tol + floor, f"relative RMS error {rel:.2e}"
    used = cache._seq.plan.used["attention"]
    if DEVICE == "cpu":
        assert list(used) == [native.NAME] and used[native.NAME].startswith("no compressed key"), used
    else:
        assert list(used) in ([native.NAME], [select.GLUON]), used


def test_a_stored_key_leaves_sdpa(kernels):
    """Once a unit is encoded into the store the call goes to the kernels again."""
    cache = CompressedKVCache("octopus", 2, D, window=1, seed=3)
    g = torch.Generator().manual_seed(1)
    for t in (1, 2):
        k, v = (torch.randn(B, H, t, D, generator=g).bfloat16().to(DEVICE) for _ in range(2))
        cache.append(k, v)
    q = (torch.randn(B, H, 1, D, generator=g) / 4).bfloat16().to(DEVICE)
    cache.attend(q, 0.125)
    assert cache.length == 1 and native.NAME not in cache._seq.plan.used["attention"]


def test_a_forced_launch_keeps_the_triton_kernels(kernels):
    """A split count given keeps an empty-store call on the Triton kernels (as it keeps it off Gluon)."""
    cache = CompressedKVCache("octopus", 2, D, window=1, seed=3)
    g = torch.Generator().manual_seed(2)
    k, v = (torch.randn(B, H, 4, D, generator=g).bfloat16().to(DEVICE) for _ in range(2))
    cache.append(k, v)
    plan = cache._seq.plan
    q = (torch.randn(B, H, 3, D, generator=g) / 4).bfloat16().to(DEVICE)
    keys, values = plan._empty_store(q, cache.value_quantizer)
    record = {}
    got = select.attention(q, keys, values, 0, k, v, plan.kernel, scale=0.125, num_splits=1, record=record)
    assert list(record["attention"]) == ["split-k"], record
    assert "sdpa: a launch configuration or split count given" in record["attention"]["split-k"]
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=0.125)
    assert ((got.double() - want).norm() / want.norm()).item() < 1e-2
