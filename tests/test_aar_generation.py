"""Generation against the released code's golden runs, the sampling rules, and the fast path's draw."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import SHARED, assert_rel_close

from octopus_audio.aar_patch import AARPipeline, generate, load_aar
from octopus_audio.aar_patch.generation import (
    SamplingConfig,
    draw_noise,
    exponential_draw,
    multinomial_draw,
    noise_draw,
    run_scales,
    sample_top_k_top_p,
)
from octopus_audio.errors import UsageError

GOLDEN = SHARED / "aar_reference" / "golden"
# the released generation arguments of each golden run (io.pt's kwargs: top_k, top_p, g_seed; cfg 4)
RUNS = {"greedy": dict(top_k=1, top_p=0.0, seed=0), "sampled": dict(top_k=200, top_p=0.95, seed=42)}


@pytest.fixture(scope="module")
def golden() -> tuple[AARPipeline, dict]:
    if not (GOLDEN / "io.pt").is_file():
        reason = f"AAR golden files not found under {GOLDEN} (set OCTOPUS_AUDIO_SHARED to ../shared)"
        print(reason)
        pytest.skip(reason)
    io = torch.load(GOLDEN / "io.pt", weights_only=True)
    for name, kwargs in RUNS.items():
        released = io[name]["kwargs"]
        assert (released["top_k"], released["top_p"], released["g_seed"]) == tuple(kwargs.values())
    return load_aar(GOLDEN / "aar.pth", GOLDEN / "sat_release.pt"), io


def assert_tokens_equal(tokens: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(tokens) == len(expected) == 16
    for si, (ours, ref) in enumerate(zip(tokens, expected, strict=True)):
        assert ours.dtype == torch.int64 and ours.shape == ref.shape, f"scale {si}: {ours.shape} {ours.dtype}"
        differ = int((ours != ref).sum())
        assert differ == 0, f"scale {si}: {differ} of {ref.numel()} tokens differ"


@pytest.mark.parametrize("run", list(RUNS))
def test_reference_path_reproduces_golden_run(golden, run):
    pipe, io = golden
    cache_shapes, key_norms = [], []

    def record(module, args, output):
        cache_shapes.append(tuple(module.cached_k.shape))
        key_norms.append(module.cached_k.norm(dim=-1).mean().item())

    hook = pipe.aar.blocks[0].attn.register_forward_hook(record)
    try:
        result = generate(pipe, io["cond"].numpy(), cfg=4.0, fast=False, **RUNS[run])  # numpy works too
    finally:
        hook.remove()
    ref = io[run]
    assert_tokens_equal(result.tokens, ref["tokens"])
    assert_rel_close(result.fhat, ref["fhat"], 1e-4, "fhat")
    assert_rel_close(result.audio, ref["audio"], 1e-4, "audio")
    assert cache_shapes == [tuple(s) for s in ref["cache_shapes_block0"]]
    assert key_norms == pytest.approx(ref["mean_k_norm"], abs=1e-5)
    assert pipe.aar.blocks[0].attn.cached_k is None  # generation leaves the cache off and empty


@pytest.mark.parametrize("draw", ["inline", "predrawn"])
def test_exponential_draw_reproduces_multinomial_in_the_loop(golden, draw):
    """The fast path's sync-free draw is torch.multinomial's own formula: same tokens from the same seed,
    whether the noise is drawn scale by scale (eager fast path) or before the loop (CUDA graph replay)."""
    pipe, io = golden
    generator = torch.Generator().manual_seed(42)
    if draw == "inline":
        sampler = exponential_draw(generator)
    else:
        sampler = noise_draw(draw_noise(generator, 2, pipe.aar.config.patch_nums, 1024))
    with torch.inference_mode():
        tokens, f_hat = run_scales(pipe, io["cond"], SamplingConfig(), sampler)
    assert_tokens_equal(tokens, io["sampled"]["tokens"])
    assert_rel_close(f_hat, io["sampled"]["fhat"], 1e-4, "fhat")


def test_fast_path_runs_on_cpu_and_is_deterministic(golden):
    pipe, io = golden
    cond = io["cond"][1:]  # B=1 (bf16 matmuls are slow on CPU)
    first = generate(pipe, cond, top_k=5, seed=7, fast=True)
    again = generate(pipe, cond, top_k=5, seed=7, fast=True)
    assert [tuple(t.shape) for t in first.tokens] == [(1, pn) for pn in pipe.aar.config.patch_nums]
    assert first.fhat.shape == (1, 128, 75) and first.fhat.dtype == torch.float32
    assert first.audio.shape == (1, 1, 24000) and torch.isfinite(first.audio).all()
    assert all(torch.equal(a, b) for a, b in zip(first.tokens, again.tokens, strict=True))
    assert all(int(t.min()) >= 0 and int(t.max()) < 1024 for t in first.tokens)


@pytest.mark.parametrize("shape", [(512,), (2, 511), (0, 512), (2, 512, 1)],
                         ids=["1d", "width511", "empty", "3d"])
def test_wrong_condition_shape_names_the_expected_shape(golden, shape):
    pipe, _ = golden
    with pytest.raises(UsageError, match=r"shape \(B, 512\)"):
        generate(pipe, torch.zeros(shape))


@pytest.mark.parametrize("kwargs, message", [
    (dict(top_k=1025), "vocabulary size 1024"), (dict(top_k=-1), "top_k"), (dict(top_p=1.5), "top_p"),
    (dict(cfg=math.nan), "cfg"), (dict(seed=-3), "seed"),
], ids=["top_k-too-big", "top_k-negative", "top_p", "cfg-nan", "seed"])
def test_bad_sampling_arguments_are_usage_errors(golden, kwargs, message):
    pipe, io = golden
    with pytest.raises(UsageError, match=message):
        generate(pipe, io["cond"], **kwargs)


def kept_ids(logits_V: list[float], top_k: int, top_p: float) -> list[int]:
    """The ids that keep a non-zero probability after filtering (read off the distribution handed to draw)."""
    seen = {}

    def draw(probs_NV, si):
        seen["probs"] = probs_NV
        return probs_NV.argmax(-1)

    sample_top_k_top_p(torch.tensor([[logits_V]]), top_k, top_p, draw)
    return torch.nonzero(seen["probs"][0] > 0).flatten().tolist()


@pytest.mark.parametrize("logits, top_k, top_p, kept", [
    ([3.0, 2.0, 2.0, 1.0], 2, 0.0, [0, 1, 2]),  # keep logits >= the k-th largest: ties survive
    ([3.0, 2.0, 2.0, 1.0], 1, 0.0, [0]),
    ([3.0, 2.0, 2.0, 1.0], 0, 0.0, [0, 1, 2, 3]),  # 0 turns top-k off
    ([math.log(p) for p in (0.125, 0.5, 0.125, 0.25)], 0, 0.7, [1, 3]),  # cum mass 0.125, 0.25 <= 0.3 dropped
    ([math.log(p) for p in (0.125, 0.5, 0.125, 0.25)], 0, 1e-12, [1]),  # the largest is never dropped
    ([math.log(p) for p in (0.125, 0.5, 0.125, 0.25)], 3, 0.7, [1, 3]),
], ids=["top_k-ties", "greedy", "top_k-off", "top_p", "top_p-keeps-last", "both"])
def test_top_k_top_p_rules(logits, top_k, top_p, kept):
    assert kept_ids(logits, top_k, top_p) == kept


@pytest.mark.parametrize("rows, vocab", [(1, 7), (33, 1024), (5, 455)], ids=["1x7", "33x1024", "5x455"])
def test_exponential_draw_equals_multinomial(rows, vocab):
    probs_NV = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(rows)).mul(3).softmax(-1)
    probs_NV[:, vocab // 2] = 0  # a zero-probability id is never drawn by either
    for seed in range(5):
        a = multinomial_draw(torch.Generator().manual_seed(seed))(probs_NV, 0)
        b = exponential_draw(torch.Generator().manual_seed(seed))(probs_NV, 0)
        assert torch.equal(a, b)
        assert not (a == vocab // 2).any()


def test_condition_dtype_and_nan_are_rejected(golden):
    pipe, _ = golden
    with pytest.raises(UsageError, match="float"):
        generate(pipe, np.zeros((1, 512), dtype=np.int64))
    with pytest.raises(UsageError, match="NaN"):
        generate(pipe, torch.full((1, 512), math.nan))


@pytest.fixture(scope="module")
def embedded() -> AARPipeline:
    return load_aar().eval()


def per_row_conditions(n: int) -> torch.Tensor:
    cond = torch.randn(n, 512, generator=torch.Generator().manual_seed(n))
    return cond / cond.norm(dim=-1, keepdim=True)


def test_per_row_seeds_equal_batches_of_one(embedded, fast=False):
    """Row i of a batch with seeds [s_0, s_1, ...] draws from its own generator: its tokens are a batch of
    one's with seed s_i (the fp32 reference path; the fast path's bf16 blocks round differently per batch
    size, so there a near-tie can flip: see the README's determinism notes)."""
    cond = per_row_conditions(3)
    seeds = [5, 5, 2**64 - 1]
    batch = generate(embedded, cond, seed=seeds, fast=fast)
    for i, seed in enumerate(seeds):
        one = generate(embedded, cond[i:i + 1], seed=seed, fast=fast)
        for si, (a, b) in enumerate(zip(one.tokens, batch.tokens, strict=True)):
            assert torch.equal(a[0], b[i]), f"row {i} scale {si}: tokens differ from a batch of one"
        assert_rel_close(batch.fhat[i], one.fhat[0], 1e-5, f"row {i} fhat")
    # one seed in a list is the int seed; one int seed for a batch is the released single stream
    single = generate(embedded, cond[:1], seed=[5], fast=fast)
    assert all(torch.equal(a, b) for a, b in zip(single.tokens, generate(embedded, cond[:1], seed=5,
                                                                          fast=fast).tokens, strict=True))


def test_per_row_noise_drawn_beforehand_equals_the_inline_draw(embedded):
    """What GraphedGenerator replays: per-row noise drawn before the loop gives the inline draw's tokens,
    and each row those of a batch of one drawing from its own generator (the exponential race in fp32)."""
    from octopus_audio.aar_patch.generation import per_row_draw

    cond = per_row_conditions(2)
    c = embedded.aar.config

    def gens():
        return [torch.Generator().manual_seed(s) for s in (9, 4)]

    with torch.inference_mode():
        inline, _ = run_scales(embedded, cond, SamplingConfig(), per_row_draw(exponential_draw, gens()))
        noise = draw_noise(gens(), 2, c.patch_nums, c.vocab_size)
        predrawn, _ = run_scales(embedded, cond, SamplingConfig(), noise_draw(noise))
        ones = [run_scales(embedded, cond[i:i + 1], SamplingConfig(), exponential_draw(g))[0]
                for i, g in enumerate(gens())]
    assert all(torch.equal(a, b) for a, b in zip(inline, predrawn, strict=True))
    for i, one in enumerate(ones):
        assert all(torch.equal(a[0], b[i]) for a, b in zip(one, inline, strict=True)), f"row {i}"


@pytest.mark.parametrize("seed, message", [([1, 2], "one per condition row, 3 here; got 2"),
                                           ([1, 2, -1], "seed must be an integer from 0"),
                                           ([1, True, 3], "seed must be an integer from 0")],
                         ids=["too-few", "negative", "bool"])
def test_bad_per_row_seeds_are_usage_errors(embedded, seed, message):
    with pytest.raises(UsageError, match=message):
        generate(embedded, per_row_conditions(3), seed=seed)
