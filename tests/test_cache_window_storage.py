"""The native window holds its own bytes: a unit that is a view into a larger tensor (the model's fused q/k/v
projection) is copied when it enters the window, so the cache's accounting is what it keeps alive."""

import pytest
import torch

from octopus_audio.cache import CompressedKVCache


def _qkv_views(B=2, L=5, H=3, d=64, seed=0):
    qkv_BL3HD = torch.randn(B, L, 3, H, d, generator=torch.Generator().manual_seed(seed))
    q, k, v = qkv_BL3HD.permute(2, 0, 3, 1, 4).unbind(0)  # [B, H, L, d] views, as AAR's attention makes them
    return qkv_BL3HD, k, v


def _held_bytes(tensors):
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


@pytest.mark.parametrize("codec", ["octopus", "none"])
def test_window_unit_copied_out_of_a_larger_projection(codec):
    qkv, k, v = _qkv_views()
    cache = CompressedKVCache(codec, 2, 64, window=1)
    cache.append(k, v)
    k_win, v_win = cache.window_kv()
    assert torch.equal(k_win, k) and torch.equal(v_win, v)
    big = qkv.untyped_storage().data_ptr()
    assert k_win.untyped_storage().data_ptr() != big and v_win.untyped_storage().data_ptr() != big
    assert _held_bytes([k_win, v_win]) == 2 * k.numel() * k.element_size()
    assert cache.bytes_breakdown()["window_bytes"] == _held_bytes([k_win, v_win])


def test_window_unit_that_owns_its_storage_is_not_copied():
    k = torch.randn(2, 3, 5, 64)
    v = torch.randn(2, 3, 5, 64).transpose(2, 3).contiguous().transpose(2, 3)  # strided, but its own storage
    cache = CompressedKVCache("octopus", 2, 64, window=1)
    cache.append(k, v)
    k_win, v_win = cache.window_kv()
    assert k_win is k and v_win is v


def test_window_copy_leaves_attention_unchanged():
    """Units given as views or as owned copies attend the same, also after they leave the window."""
    outs = []
    for copy in (False, True):
        cache = CompressedKVCache("octopus", 3, 64, window=1, seed=1)
        for step in range(3):
            _, k, v = _qkv_views(L=4 + step, seed=step)
            if copy:
                k, v = k.contiguous(), v.contiguous()
            cache.append(k, v)
        q = torch.randn(2, 3, 7, 64, generator=torch.Generator().manual_seed(9))
        outs.append(cache.attend(q, 0.125))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
