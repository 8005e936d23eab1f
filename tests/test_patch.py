"""patch_aar on a stand-in for the released attention (written here from the interface facts, not our own)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

import octopus_audio
from octopus_audio.aar_patch.patch import compressed_kv, find_attention, patch_aar, replay_check, unpatch
from octopus_audio.cache import checks as cache_checks
from octopus_audio.rotation import layer_seed

PATCH_NUMS = (1, 2, 3, 5, 8)  # a short next-scale schedule: cache lengths 0, 1, 3, 6, 11 before each scale


class ReleasedStyleAttention(nn.Module):
    """Stand-in with the released attention's attribute names and `forward(x, attn_bias)` (cosine or not)."""

    def __init__(self, embed_dim: int, num_heads: int, cosine: bool = True) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.attn_l2_norm = cosine
        if cosine:
            self.scale = 1
            self.scale_mul_1H11 = nn.Parameter(torch.full((1, num_heads, 1, 1), 4.0).log())
            self.max_scale_mul = torch.log(torch.tensor(100)).item()
        else:
            self.scale = 0.25 / math.sqrt(self.head_dim)
        self.mat_qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=False)
        self.q_bias = nn.Parameter(torch.randn(embed_dim) * 0.1)
        self.v_bias = nn.Parameter(torch.randn(embed_dim) * 0.1)
        self.register_buffer("zero_k_bias", torch.zeros(embed_dim))
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.proj_drop = nn.Identity()
        self.attn_drop = 0.0
        self.caching, self.cached_k, self.cached_v = False, None, None

    def kv_caching(self, enable: bool) -> None:
        self.caching, self.cached_k, self.cached_v = enable, None, None

    def forward(self, x, attn_bias):
        B, L, C = x.shape
        bias = torch.cat((self.q_bias, self.zero_k_bias, self.v_bias))
        qkv = F.linear(input=x, weight=self.mat_qkv.weight, bias=bias)
        qkv = qkv.view(B, L, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(dim=0)
        if self.attn_l2_norm:
            q = F.normalize(q, dim=-1).mul(self.scale_mul_1H11.clamp_max(self.max_scale_mul).exp())
            k = F.normalize(k, dim=-1)
        if self.caching:
            if self.cached_k is None:
                self.cached_k, self.cached_v = k, v
            else:
                self.cached_k = torch.cat((self.cached_k, k), dim=2)
                self.cached_v = torch.cat((self.cached_v, v), dim=2)
            k, v = self.cached_k, self.cached_v
        oup = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, scale=self.scale, dropout_p=0.0)
        return self.proj_drop(self.proj(oup.transpose(1, 2).reshape(B, L, C)))


class Block(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int, cosine: bool) -> None:
        super().__init__()
        self.attn = ReleasedStyleAttention(embed_dim, num_heads, cosine)
        self.ln = nn.LayerNorm(embed_dim)

    def forward(self, x, attn_bias):
        return x + self.attn(self.ln(x), attn_bias)


class TinyModel(nn.Module):
    """Blocks of the stand-in attention, run scale by scale like AAR's generation loop."""

    def __init__(self, depth: int = 3, embed_dim: int = 128, num_heads: int = 2, cosine: bool = True,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Block(embed_dim, num_heads, cosine) for _ in range(depth))
        self.embed_dim = embed_dim
        self.to(dtype)
        self.dtype = dtype

    @torch.no_grad()
    def generate(self, batch: int = 3, seed: int = 1) -> list[torch.Tensor]:
        """Outputs of every scale; each scale's input depends on the previous output (as AAR's does)."""
        gen = torch.Generator().manual_seed(seed)
        for b in self.blocks:
            b.attn.kv_caching(True)
        outs, prev = [], torch.zeros(batch, 1, self.embed_dim, dtype=self.dtype)
        try:
            for pn in PATCH_NUMS:
                x = torch.randn(batch, pn, self.embed_dim, generator=gen).to(self.dtype)
                x = x + F.interpolate(prev.float().transpose(1, 2), size=pn).transpose(1, 2).to(self.dtype)
                for b in self.blocks:
                    x = b(x, None)
                outs.append(x)
                prev = x
        finally:
            for b in self.blocks:
                b.attn.kv_caching(False)
        return outs

    def teacher_forcing(self, x_BLC: torch.Tensor) -> torch.Tensor:
        lvl = torch.cat([torch.full((pn,), i) for i, pn in enumerate(PATCH_NUMS)])
        L = lvl.numel()
        bias = torch.zeros(L, L, dtype=x_BLC.dtype).masked_fill(lvl[:, None] < lvl[None, :], -math.inf)
        for b in self.blocks:
            x_BLC = b(x_BLC, bias.view(1, 1, L, L))
        return x_BLC


def _equal_lists(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("cosine", [True, False], ids=["cosine", "dot-product"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_none_is_bit_identical_and_unpatch_restores(cosine, dtype):
    model = TinyModel(cosine=cosine, dtype=dtype)
    ref = model.generate()
    with patch_aar(model, codec="none") as handle:
        assert all("forward" in m.__dict__ for m in find_attention(model))
        out = model.generate()
        assert handle.last_stats is not None
    assert _equal_lists(out, ref)
    assert all("forward" not in m.__dict__ and "kv_caching" not in m.__dict__ for m in find_attention(model))
    assert _equal_lists(model.generate(), ref)


def test_import_changes_nothing_and_finds_every_layer():
    model = TinyModel(depth=4)
    import octopus_audio.aar_patch  # noqa: F401

    attns = find_attention(model)
    assert [id(a) for a in attns] == [id(b.attn) for b in model.blocks]
    assert all("forward" not in a.__dict__ for a in attns)


def test_training_forward_goes_to_the_original():
    model = TinyModel()
    x = torch.randn(2, sum(PATCH_NUMS), model.embed_dim)
    with torch.no_grad():
        ref = model.teacher_forcing(x)
        with compressed_kv(model, "octopus", 2):
            out = model.teacher_forcing(x)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("codec", [c for c in octopus_audio.CODECS if c != "none"])
def test_compressed_codecs_run_close_and_deterministic(codec):
    model = TinyModel(embed_dim=64, num_heads=2, depth=2)  # head dim 32
    ref = model.generate()
    with patch_aar(model, codec=codec, bits=4, seed=3):
        a = model.generate()
        b = model.generate()
    assert _equal_lists(a, b)
    assert not _equal_lists(a, ref)  # the cache really is compressed
    assert all(_rel_err(x, y) < 0.2 for x, y in zip(a, ref, strict=True))


def test_each_layer_gets_its_own_seed():
    model = TinyModel(depth=3)
    with patch_aar(model, "octopus", 2, seed=7) as handle:
        seeds = [c.seed for c in handle.caches]
    assert seeds == [layer_seed(7, i) for i in range(3)]
    assert len(set(seeds)) == 3


def test_double_patch_and_unpatch_unpatched_are_errors():
    model = TinyModel()
    handle = patch_aar(model, "octopus", 2)
    with pytest.raises(RuntimeError, match="already patched"):
        patch_aar(model, "none")
    unpatch(model)
    assert not handle.active
    handle.unpatch()  # a second unpatch through the handle is a no-op
    with pytest.raises(RuntimeError, match="no KV-cache patch"):
        unpatch(model)


def test_second_generation_while_one_holds_the_cache_is_an_error():
    model = TinyModel()
    with patch_aar(model, "octopus", 2) as handle:
        for b in model.blocks:
            b.attn.kv_caching(True)
        x = torch.randn(1, 1, model.embed_dim)
        with torch.no_grad():
            for b in model.blocks:
                x = b(x, None)
        with pytest.raises(RuntimeError, match="already holds 1 scale"):
            model.blocks[0].attn.kv_caching(True)
        with pytest.raises(RuntimeError, match="generation is in progress"):
            handle.unpatch()
        for b in model.blocks:
            b.attn.kv_caching(False)
        assert not handle.generating
    assert not handle.active


def test_leaving_with_through_an_exception_abandons_the_generation():
    model = TinyModel()
    with pytest.raises(KeyError), compressed_kv(model, "octopus", 2):
        for b in model.blocks:
            b.attn.kv_caching(True)
        with torch.no_grad():
            model.blocks[0](torch.randn(1, 1, model.embed_dim), None)
        raise KeyError("boom")
    attn = model.blocks[0].attn
    assert "forward" not in attn.__dict__ and not attn.caching and attn.cached_k is None


def test_mask_in_caching_mode_is_an_error():
    model = TinyModel()
    with patch_aar(model, "octopus", 2):
        attn = model.blocks[0].attn
        attn.kv_caching(True)
        with pytest.raises(ValueError, match="attn_bias=None"):
            attn(torch.randn(1, 2, model.embed_dim), torch.zeros(1, 1, 2, 2))
        attn.kv_caching(False)


def test_bad_arguments_are_clear_errors():
    model = TinyModel()
    with pytest.raises(ValueError, match="allowed: none, "):
        patch_aar(model, codec="zip")
    with pytest.raises(ValueError, match="window must be an int >= 0"):
        patch_aar(model, window=-1)
    with pytest.raises(ValueError, match="no attention modules"):
        patch_aar(nn.Linear(3, 3))
    assert all("forward" not in m.__dict__ for m in find_attention(model))


def test_accounting_is_the_packed_format_and_captured_at_the_end():
    # octopus b=2, d=64: key = 22 triplets x 7 bits -> 5 int32 words + bf16 gamma = 22 bytes;
    # value = 64 x 2 bits -> 4 words + 4 groups x (fp16 scale + fp16 min) = 32 bytes;
    # window: fp32 K+V = 512 bytes per token and head
    model = TinyModel(depth=2, embed_dim=128, num_heads=2)
    batch, rows = 3, 3 * 2
    with patch_aar(model, "octopus", 2) as handle:
        with pytest.raises(RuntimeError, match="no generation"):
            handle.stats()
        model.generate(batch=batch)
        stats = handle.stats()
    tokens, window = sum(PATCH_NUMS), PATCH_NUMS[-1]
    for s in stats.layers:
        assert (s.tokens, s.window_tokens) == (tokens, window)
        assert s.k_bytes == rows * (tokens - window) * 22
        assert s.v_bytes == rows * (tokens - window) * 32
        assert s.native_bytes == rows * window * 2 * 64 * 4
        assert s.fp16_bytes == rows * tokens * 2 * 64 * 2
        assert s.k_bits == pytest.approx(22 * 8 / 64)
        assert s.v_bits == pytest.approx(32 * 8 / 64)
        # the store grows by doubling: lengths 1, 3, 6, 11 -> capacities 1, 3, 6, 12
        assert s.allocated_bytes == rows * 12 * (22 + 32) + s.native_bytes
    assert stats.total.nbytes == 2 * stats.layers[0].nbytes
    assert f"octopus b=2 W=1, 2 layers, {tokens} tokens ({window} native)" in stats.line()
    assert f"{stats.total.ratio:.2f}x" in stats.line()
    assert "codec='octopus'" in repr(handle) and "backend=" in repr(handle)


_INTERPRETED_RUN = """
import os, sys
sys.path.insert(0, {tests!r})
from test_patch import TinyModel
from octopus_audio.aar_patch.patch import patch_aar
model = TinyModel(depth=1, embed_dim=128, num_heads=2)
outs = {{}}
for backend, setting in (("triton", "kernels"), ("reference", "reference")):
    os.environ["OCTOPUS_AUDIO_KERNELS"] = setting
    with patch_aar(model, "octopus", 2) as handle:
        outs[backend] = model.generate(batch=2)
        assert "backend=" + backend in repr(handle), repr(handle)
print(max(float((a - b).abs().max()) for a, b in zip(outs["triton"], outs["reference"])))
"""


def test_fused_kernel_path_through_the_patch_matches_the_reference():
    """The Triton path (interpreted on the CPU, in a subprocess so the flag cannot leak) vs the reference."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    script = _INTERPRETED_RUN.format(tests=str(Path(__file__).parent))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) < 1e-4


class _HostReads(TorchFunctionMode):
    """Counts reads of tensor values on the host (each one a device sync on CUDA)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("item", "tolist", "__bool__", "__float__", "__int__"):
            self.count += 1
        return func(*args, **(kwargs or {}))


def _nan_at_call(module: nn.Module, call: int):
    """A pre-hook that puts a NaN into the module's input on its `call`-th forward (0-based)."""
    seen = []

    def hook(_, args):
        seen.append(1)
        if len(seen) - 1 == call:
            x = args[0].clone()
            x[0, 0, 0] = float("nan")
            return (x, *args[1:])
        return None

    return module.register_forward_pre_hook(hook)


def _defer(handle, defer: bool = True) -> None:
    for cache in handle.caches:
        cache.defer_checks = defer  # what a CUDA model gets by default (None = defer on CUDA)


def test_deferred_checks_read_the_device_once_per_generation():
    model = TinyModel(depth=2)
    ref = model.generate()
    with patch_aar(model, "none") as handle:
        with _HostReads() as reads:
            immediate = model.generate()
        assert reads.count == 2 * 2 * len(PATCH_NUMS)  # one per appended unit, one per query (NaN check)
        _defer(handle)
        with _HostReads() as reads:
            deferred = model.generate()
        assert reads.count == 1  # every layer's record read back together at the end
    assert _equal_lists(immediate, ref) and _equal_lists(deferred, ref)


@pytest.mark.parametrize("defer", [False, True], ids=["immediate", "deferred"])
def test_nan_key_mid_generation_raises_before_any_result(defer):
    model = TinyModel(depth=3)
    with patch_aar(model, "octopus", 2) as handle:
        _defer(handle, defer)
        clean = model.generate()
        hook = _nan_at_call(model.blocks[1].attn, call=2)  # layer 1, scale 2 of 5
        with pytest.raises(ValueError) as err:
            model.generate()
        hook.remove()
        assert str(err.value) == ("append got non-finite keys (NaN or Inf): keys must be finite; values "
                                  "finite and within the fp16 range, |v| <= 65504 (the quantizer stores "
                                  "each group's scale and minimum in fp16)")
        # the failed generation is gone from every layer; the next one runs and is unchanged
        assert not handle.generating and not any(b.attn.caching for b in model.blocks)
        assert _equal_lists(model.generate(), clean)


def test_replay_check_runs_the_checks_a_graph_capture_skipped(monkeypatch):
    """A CUDA graph capture cannot read the device: the end-of-generation check is skipped while capturing
    (emulated here) and `replay_check` runs it on the record the replay wrote."""
    model = TinyModel(depth=2)
    assert replay_check(model)() is None  # unpatched: nothing to check
    with patch_aar(model, "turboquant-mse", 2) as handle:
        _defer(handle)
        monkeypatch.setattr(cache_checks, "capturing", lambda: True)
        hook = _nan_at_call(model.blocks[0].attn, call=4)
        model.generate()  # "captured": no error yet
        hook.remove()
        check = replay_check(model)
        monkeypatch.setattr(cache_checks, "capturing", lambda: False)
        with pytest.raises(ValueError, match="non-finite keys"):
            check()
        model.generate()
        replay_check(model)()  # a clean record passes


def test_sink_scales_keep_the_first_scales_native_and_are_counted_native():
    """sink_scales=S: each layer's cache keeps the first S scales' tokens native (its native prefix), the
    accounting counts them at their native width in the rates, and the buffers are reserved exactly."""
    model = TinyModel(depth=2, embed_dim=128, num_heads=2)
    model.patch_nums = PATCH_NUMS  # the scales, as AAR says them
    rows, S = 3 * 2, 2
    prefix, window = sum(PATCH_NUMS[:S]), PATCH_NUMS[-1]
    with patch_aar(model, "octopus", 2, sink_scales=S) as handle:
        assert all(c.native_prefix == prefix for c in handle.caches)
        model.generate(batch=3)
        stats = handle.stats()
    tokens = sum(PATCH_NUMS)
    stored = tokens - window - prefix
    for s in stats.layers:
        assert (s.tokens, s.window_tokens, s.prefix_tokens) == (tokens, window, prefix)
        assert s.k_bytes == rows * stored * 22 and s.v_bytes == rows * stored * 32
        assert s.prefix_bytes == rows * prefix * 2 * 64 * 4  # fp32 K and V
        assert s.native_bytes == s.prefix_bytes + rows * window * 2 * 64 * 4
        # per stored coordinate (everything outside the window): the codes, and the prefix at 32 bits
        assert s.k_bits == pytest.approx((stored * 22 * 8 + prefix * 64 * 32) / ((stored + prefix) * 64))
        assert s.v_bits == pytest.approx((stored * 32 * 8 + prefix * 64 * 32) / ((stored + prefix) * 64))
        assert s.allocated_bytes == rows * stored * (22 + 32) + s.native_bytes  # nothing spare
    assert f"octopus b=2 S=2 W=1, 2 layers, {tokens} tokens ({prefix} in the sink scales" in stats.line()


def test_all_scales_sunk_is_the_uncompressed_model():
    """With every scale a sink nothing is encoded: the output is the unpatched model's (fp32 rounding)."""
    model = TinyModel(depth=2, embed_dim=128, num_heads=2)
    model.patch_nums = PATCH_NUMS
    ref = model.generate()
    with patch_aar(model, "octopus", 2, sink_scales=len(PATCH_NUMS)) as handle:
        out = model.generate()
        assert handle.stats().total.k_bytes == 0
    assert all(_rel_err(x, y) < 1e-5 for x, y in zip(out, ref, strict=True))


@pytest.mark.parametrize("sink_scales", [None, 2], ids=["default", "S2"])
def test_codec_none_keeps_no_native_prefix(monkeypatch, sink_scales):
    """Codec none stores every token native: its sink scales (none by default; 2 given) stay in its store, so
    at window 0 attention reads the store's preallocated buffer as a view, never a concatenation with a
    native prefix (which the sink-scale default once cost it), and the output is the unpatched model's."""
    from octopus_audio.cache import layer as cache_layer

    model = TinyModel(depth=2, embed_dim=128, num_heads=2)
    model.patch_nums = PATCH_NUMS
    ref = model.generate()
    views = []
    plain = cache_layer.plain_kv

    def spy(native, store, dtype):
        k, v = plain(native, store, dtype)
        views.append(k._base is not None and v._base is not None)
        return k, v

    monkeypatch.setattr(cache_layer, "plain_kv", spy)
    with patch_aar(model, "none", 16, window=0, sink_scales=sink_scales) as handle:
        assert handle.config.sink_scales == (0 if sink_scales is None else sink_scales)
        assert all(c.native_prefix == 0 for c in handle.caches)
        out = model.generate()
        assert all(c.prefix_tokens == 0 for c in handle.caches)
    assert views and all(views)
    assert all(torch.equal(x, y) for x, y in zip(out, ref, strict=True))


class _NoScales(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = ReleasedStyleAttention(64, 2)


def test_bad_sink_scales_are_clear_errors():
    model = TinyModel()
    model.patch_nums = PATCH_NUMS
    with pytest.raises(ValueError, match="sink_scales must be an int >= 0"):
        patch_aar(model, sink_scales=-1)
    with pytest.raises(ValueError, match=r"sink_scales must be 0 \.\. 5 \(the model's scales\), got 6"):
        patch_aar(model, sink_scales=6)
    with pytest.raises(ValueError, match=r"sink_scales must be 0 \.\. 5 \(the model's scales\), got 6"):
        patch_aar(model, "none", 16, sink_scales=6)  # checked for codec none too, which keeps no prefix
    with pytest.raises(ValueError, match="does not say its scales"):
        patch_aar(_NoScales(), sink_scales=1)
    assert all("forward" not in m.__dict__ for m in find_attention(model))
    patch_aar(_NoScales(), sink_scales=0).unpatch()
