"""The native tokens (prefix and window) live in the cache's own buffer: a unit that is a view into a larger
tensor (the model's fused q/k/v projection) is copied in when it enters, so the cache's accounting is what it
keeps alive, and attention reads the prefix and the window as one view."""

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


@pytest.mark.parametrize("window,prefix", [(1, 0), (2, 0), (1, 4), (2, 4), (0, 4)],
                         ids=["W1", "W2", "W1-P4", "W2-P4", "W0-P4"])
def test_native_tokens_are_one_view_of_one_buffer(window, prefix):
    """The prefix and the window lie back to back in one buffer: `native_kv` is a view of it (nothing
    concatenated, whatever the window and the prefix), and it holds the prefix's tokens then the window's."""
    units = [_qkv_views(L=n, seed=n)[1:] for n in (1, 3, 2, 5)]
    cache = CompressedKVCache("octopus", 2, 64, window=window, native_prefix=prefix)
    for k, v in units:
        cache.append(k, v)
    k_nat, v_nat = cache.native_kv()
    assert k_nat.data_ptr() == cache._native._k.data_ptr() and v_nat.data_ptr() == cache._native._v.data_ptr()
    k_all = torch.cat([k for k, _ in units], 2)
    kept = [k_all[:, :, :prefix]]
    if window:
        kept.append(torch.cat([k for k, _ in units[-window:]], 2))
    assert torch.equal(k_nat, torch.cat(kept, 2))
    assert cache.prefix_tokens == prefix
    assert cache.window_tokens == sum(k.shape[2] for k, _ in units[len(units) - window:])


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


def test_native_views_follow_every_change():
    """`NativeSegment.kv` hands out the same views until the segment changes; each change (a unit entering or
    leaving, the prefix growing, growth of the buffers, crop, select_rows) gives views of what is held now."""
    from octopus_audio.cache.native import NativeSegment

    def units(n, seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(2, 3, n, 8, generator=g), torch.randn(2, 3, n, 8, generator=g)

    seg = NativeSegment(units(1, 0)[0], capacity=2)
    assert seg.kv() is None
    held_k, held_v = [], []

    def check():
        k, v = seg.kv()
        assert seg.kv()[0] is k  # cached until the next change
        torch.testing.assert_close(k, torch.cat(held_k, 2), rtol=0, atol=0)
        torch.testing.assert_close(v, torch.cat(held_v, 2), rtol=0, atol=0)

    k, v = units(2, 1)
    seg.extend_prefix(k, v)
    held_k, held_v = [k], [v]
    check()
    for seed, n in ((2, 3), (3, 1)):  # the first push grows the buffers
        k, v = units(n, seed)
        seg.push(k, v)
        held_k.append(k)
        held_v.append(v)
        check()
    seg.pop(keep=1)  # the 3-token unit: its first token joins the prefix, the others leave
    held_k[1:2], held_v[1:2] = [held_k[1][:, :, :1]], [held_v[1][:, :, :1]]
    check()
    seg.crop(3)
    held_k, held_v = [torch.cat(held_k, 2)[:, :, :3]], [torch.cat(held_v, 2)[:, :, :3]]
    check()
    index = torch.tensor([1, 0, 1])
    seg.select_rows(index)
    held_k, held_v = [held_k[0].index_select(0, index)], [held_v[0].index_select(0, index)]
    check()
    seg.crop(0)
    assert seg.kv() is None
