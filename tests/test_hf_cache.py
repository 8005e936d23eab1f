"""Tests for octopus_audio.hf.OctopusCache: a small random-weight Llama generating through it (no hub)."""

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5")

from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM  # noqa: E402

from octopus_audio.hf import ATTENTION, OctopusCache  # noqa: E402
from octopus_audio.hf.attention import left_padding  # noqa: E402
from octopus_audio.hf.layer import OctopusLayer  # noqa: E402

VOCAB, PROMPT, NEW = 256, 24, 10


def tiny_llama(head_dim=64, heads=8, kv_heads=2, layers=2, seed=0):
    """A Llama-architecture model with random weights: 4 query heads per KV head by default (GQA)."""
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                         max_position_embeddings=512)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def prompt(batch=1, length=PROMPT, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def generate(model, ids, cache, mask=None, **kwargs):
    kwargs.setdefault("max_new_tokens", NEW)
    return model.generate(ids, attention_mask=torch.ones_like(ids) if mask is None else mask, do_sample=False,
                          cache=cache, return_dict_in_generate=True, output_logits=True, pad_token_id=0,
                          **kwargs)


def stepwise_logits(model, tokens, cache, prompt_length=PROMPT):
    """Teacher forcing as generation runs it: the prompt in one forward, then one token a forward; the logits
    after the prompt and after each later token [B, steps, V]."""
    with torch.no_grad():
        out = [model(tokens[:, :prompt_length], cache=cache).logits[:, -1]]
        for t in range(prompt_length, tokens.shape[1]):
            out.append(model(tokens[:, t:t + 1], cache=cache).logits[:, -1])
    return torch.stack(out, 1)


def rel_rms(a, b, dim=None):
    return (a - b).norm(dim=dim) / b.norm(dim=dim)


# ---- generation ------------------------------------------------------------------------------------------
def test_codec_none_generates_the_dynamic_caches_tokens(model):
    ids = prompt(batch=2)
    ref = generate(model, ids, DynamicCache(config=model.config))
    out = generate(model, ids, OctopusCache(model.config, codec="none"))
    assert torch.equal(out.sequences, ref.sequences)
    for step, (a, b) in enumerate(zip(out.logits, ref.logits, strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"step {step}")


def octopus_errors(model, tokens, bits, prompt_length=PROMPT):
    """Teacher-forced logits of octopus at `bits` against the uncompressed cache's on the same tokens: the
    relative RMS error of each step's logits, and the cache's own error (the larger relative RMS error of its
    decoded stored keys or values against the native ones, over every layer)."""
    dynamic = DynamicCache(config=model.config)
    ref = stepwise_logits(model, tokens, dynamic, prompt_length)
    cache = OctopusCache(model.config, codec="octopus", bits=bits)
    logits = stepwise_logits(model, tokens, cache, prompt_length)
    held = []
    for layer, native in zip(cache.layers, dynamic.layers, strict=True):
        k_hat, v_hat = layer.first.decoded_kv(torch.float32)
        n = layer.first.length  # the stored tokens (the window's are native)
        held += [rel_rms(k_hat[:, :, :n], native.keys[:, :, :n]),
                 rel_rms(v_hat[:, :, :n], native.values[:, :, :n])]
    return rel_rms(logits, ref, dim=-1)[0], max(held)


def test_octopus_b4_logits_lie_within_the_caches_own_error(model):
    """Per-step logits with octopus b=4 against the uncompressed cache, on the same tokens. The bound is the
    relative RMS error of what the cache holds (its decoded keys and values against the native ones, the
    larger of the two): each layer's attention output is a softmax-weighted average of the values, so value
    errors reach it at most at their own relative size (independent per-token errors partly cancel), key
    errors move the weights by about the same relative amount, and the residual stream carries everything
    else unchanged; a random Llama's layers (init std 0.02) are near-identity maps that amplify nothing.
    Measured here: logits 0.029 against a cache error of 0.094 (b=3: 0.075 against 0.18; b=2: 0.16 against
    0.34). b=2 must lie further off than b=4."""
    tokens = generate(model, prompt(), DynamicCache(config=model.config)).sequences
    mean = {}
    for bits in (4, 2):
        steps, bound = octopus_errors(model, tokens, bits)
        assert steps[0] == 0, "the prompt attends over native keys: its logits are exact"
        assert (steps <= bound).all(), f"b={bits}: logits {steps.tolist()} vs the cache's {bound}"
        mean[bits] = steps[1:].mean()
    assert mean[2] > mean[4]


def test_left_padded_rows_equal_the_rows_alone(model):
    """Batch 2 with prompts of 24 and 17 tokens (the shorter left-padded): each row's logits and tokens equal
    the row generated alone. Padding never enters a store, so the codes and the attention are the row's
    own."""
    ids = prompt(batch=2)
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    for codec, bits in (("none", None), ("octopus", 2)):
        batch = generate(model, ids, OctopusCache(model.config, codec=codec, bits=bits), mask=mask)
        for row in (0, 1):
            alone = ids[row:row + 1, 7 * row:]
            one = generate(model, alone, OctopusCache(model.config, codec=codec, bits=bits))
            assert torch.equal(batch.sequences[row, 7 * row:], one.sequences[0]), (codec, row)
            for a, b in zip(batch.logits, one.logits, strict=True):
                torch.testing.assert_close(a[row], b[0], rtol=1e-4, atol=1e-4)


def test_left_padding_takes_the_uncompressed_caches_tokens_too(model):
    ids = prompt(batch=3)
    mask = torch.ones_like(ids)
    mask[0, :5], mask[2, :11] = 0, 0
    ref = generate(model, ids, DynamicCache(config=model.config), mask=mask)
    cache = OctopusCache(model.config, codec="none")
    out = generate(model, ids, cache, mask=mask)
    assert torch.equal(out.sequences, ref.sequences)
    assert [g.pad for g in cache.layers[0].groups] == [5, 0, 11]


@pytest.mark.parametrize("head_dim,heads,kv_heads", [(64, 8, 2), (32, 4, 4), (128, 4, 1)],
                         ids=["d64-G4", "d32-G1", "d128-G4"])
def test_grouped_query_heads_and_head_dims(head_dim, heads, kv_heads):
    m = tiny_llama(head_dim=head_dim, heads=heads, kv_heads=kv_heads, seed=3)
    ids = prompt(length=9)
    ref = generate(m, ids, DynamicCache(config=m.config), max_new_tokens=5)
    out = generate(m, ids, OctopusCache(m.config, codec="none"), max_new_tokens=5)
    assert torch.equal(out.sequences, ref.sequences)
    steps, bound = octopus_errors(m, ref.sequences, 4, prompt_length=9)
    assert (steps <= bound).all(), f"logits {steps.tolist()} vs the cache's {bound}"


def test_decode_steps_run_the_kernels_and_match_the_reference(model, monkeypatch):
    """Under the Triton interpreter (OCTOPUS_AUDIO_KERNELS=kernels) decode steps run the fused attention and
    encode kernels through CompressedKVCache.attend; their logits equal the reference path's."""
    ids = prompt(length=7)
    ref = generate(model, ids, OctopusCache(model.config, codec="octopus", bits=2), max_new_tokens=3)
    monkeypatch.setenv("OCTOPUS_AUDIO_KERNELS", "kernels")
    cache = OctopusCache(model.config, codec="octopus", bits=2)
    out = generate(model, ids, cache, max_new_tokens=3)
    assert cache.layers[0].first.backend == "triton"
    for a, b in zip(out.logits, ref.logits, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_window_keeps_the_newest_tokens_native_and_accounts_bytes(model):
    cache = OctopusCache(model.config, codec="octopus", bits=2, window=4)
    generate(model, prompt(), cache, max_new_tokens=3)
    first = cache.layers[0].first
    assert first.window_tokens == 4 and first.length == PROMPT + 2 - 4
    assert cache.get_seq_length() == PROMPT + 2
    assert 0 < cache.nbytes < cache.fp16_nbytes


def test_after_the_prompt_the_layers_hold_no_native_copy_of_it(model):
    """Once decoding runs, each layer's buffers hold what its bytes say (the store and a window-sized native
    buffer), not the prompt's native K/V: the prompt passed through the window as one unit."""
    cache = OctopusCache(model.config, codec="octopus", bits=2, max_cache_len=PROMPT + 3)
    generate(model, prompt(), cache, max_new_tokens=3)
    for layer in cache.layers:
        native = layer.first._native
        assert native.capacity == 1
        assert native.allocated_bytes == layer.first.bytes_breakdown()["native_bytes"]


# ---- operations generation uses --------------------------------------------------------------------------
def test_beam_search_reorders_like_the_dynamic_cache(model):
    ids = prompt(batch=2, length=8)
    ref = generate(model, ids, DynamicCache(config=model.config), num_beams=3, max_new_tokens=6)
    out = generate(model, ids, OctopusCache(model.config, codec="none"), num_beams=3, max_new_tokens=6)
    assert torch.equal(out.sequences, ref.sequences)


def test_prompt_lookup_decoding_crops_and_keeps_greedy_tokens(model, monkeypatch):
    """Prompt-lookup decoding verifies several draft tokens a forward (the decoded-history path) and crops the
    rejected ones: the output equals plain greedy decoding (codec none and octopus b=4, each against its own
    greedy run), and some forwards did crop."""
    ids = prompt(length=12).repeat(1, 2)  # a repeated prompt gives the lookup drafts to verify
    removed = []
    crop = OctopusLayer.crop
    monkeypatch.setattr(OctopusLayer, "crop", lambda self, n: (removed.append(-n), crop(self, n))[1])
    for codec, bits in (("none", None), ("octopus", 4)):
        ref = generate(model, ids, OctopusCache(model.config, codec=codec, bits=bits))
        out = generate(model, ids, OctopusCache(model.config, codec=codec, bits=bits),
                       prompt_lookup_num_tokens=3)
        assert torch.equal(out.sequences, ref.sequences), codec
    assert any(removed), "no forward cropped a rejected draft"


def test_crop_drops_the_newest_tokens(model):
    tokens = prompt(length=PROMPT + 6)
    whole = OctopusCache(model.config, codec="octopus", bits=3)
    ref = stepwise_logits(model, tokens, whole)
    cache = OctopusCache(model.config, codec="octopus", bits=3)
    stepwise_logits(model, tokens, cache)
    cache.crop(-3)
    assert cache.get_seq_length() == PROMPT + 3
    with torch.no_grad():
        again = model(tokens[:, PROMPT + 3:PROMPT + 4], cache=cache).logits[:, -1]
    # the kept tokens are held as before the crop (encoded ones stay encoded): the uncropped cache's logits
    torch.testing.assert_close(again, ref[:, 4], rtol=1e-4, atol=1e-4)


def test_reset_empties_every_layer_for_a_new_prompt(model):
    cache = OctopusCache(model.config, codec="octopus", bits=2)
    ids = prompt()
    first = generate(model, ids, cache)
    cache.reset()
    assert cache.get_seq_length() == 0
    again = generate(model, ids, cache)
    assert torch.equal(first.sequences, again.sequences)


# ---- refusals, each one sentence -------------------------------------------------------------------------
def test_refused_operations_say_why(model):
    cache = OctopusCache(model.config, codec="octopus", bits=2)
    generate(model, prompt(), cache, max_new_tokens=2)
    layer = cache.layers[0]
    with pytest.raises(NotImplementedError, match="does not offload"):
        layer.offload()
    with pytest.raises(NotImplementedError, match="nothing to prefetch"):
        layer.prefetch()
    with pytest.raises(NotImplementedError, match="cannot repeat a filled batch"):
        cache.batch_repeat_interleave(2)
    with pytest.raises(NotImplementedError, match="cannot select rows"):
        cache.batch_select_indices(torch.tensor([0]))
    with pytest.raises(ValueError, match="minus the number of tokens"):
        cache.crop(3)
    with pytest.raises(ValueError, match="batch of 1 rows, got 2"):
        model(prompt(batch=2, length=1), cache=cache)
    attention = model.model.layers[0].self_attn
    model.train()
    attention.attention_dropout = 0.1
    try:
        with pytest.raises(ValueError, match="dropout must be 0"):
            model(prompt(length=1), cache=cache)
    finally:
        attention.attention_dropout = 0.0
        model.eval()


def test_refused_padding_says_why(model):
    ids = prompt(batch=2, length=6)
    right = torch.ones_like(ids)
    right[1, 4:] = 0
    with pytest.raises(ValueError, match="padding at the left of a prompt only"):
        generate(model, ids, OctopusCache(model.config, codec="none"), mask=right)
    empty = torch.ones_like(ids)
    empty[1] = 0
    with pytest.raises(ValueError, match="all padding"):
        model(ids, attention_mask=empty, cache=OctopusCache(model.config, codec="none"))


def test_refused_reorder_across_paddings_and_crop_into_padding(model):
    ids = prompt(batch=2, length=6)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    cache = OctopusCache(model.config, codec="none")
    generate(model, ids, cache, mask=mask, max_new_tokens=2)
    with pytest.raises(ValueError, match="only among rows of the same padding"):
        cache.reorder_cache(torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="every token of a left-padded row"):
        cache.crop(-3)


@pytest.mark.parametrize("kwargs,match", [
    ({"codec": "zip", "bits": 2}, "unknown codec 'zip'; allowed: "),
    ({"codec": "none", "bits": 2}, "takes no bit widths"),
    ({"codec": "octopus"}, "needs bits"),
    ({"codec": "octopus", "bits": 9}, "bits"),
    ({"codec": "octopus", "bits": 2, "window": -1}, "window must be an integer >= 0"),
    ({"codec": "octopus", "bits": 2, "max_cache_len": 0}, "max_cache_len must be None or an integer >= 1"),
], ids=["unknown-codec", "none-with-bits", "no-bits", "bits-out-of-range", "negative-window", "zero-length"])
def test_refused_settings_say_why(model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        OctopusCache(model.config, **kwargs)


def test_refused_models_say_why():
    sliding = LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                          layer_types=["full_attention", "sliding_attention"], sliding_window=4)
    with pytest.raises(ValueError, match="full-attention layers only"):
        OctopusCache(sliding, codec="none")
    eager = tiny_llama(layers=1)
    eager.set_attn_implementation("eager")
    with pytest.raises(ValueError, match="runs with the model's sdpa attention"):
        OctopusCache(eager.config, codec="none")


def test_the_model_switches_to_the_octopus_attention_and_refuses_a_switch_back():
    m = tiny_llama(layers=1)
    cache = OctopusCache(m.config, codec="none")
    assert m.config._attn_implementation == ATTENTION
    plain = generate(m, prompt(), DynamicCache(config=m.config), max_new_tokens=2)  # other caches: SDPA
    m.set_attn_implementation("sdpa")
    assert torch.equal(plain.sequences, generate(m, prompt(), None, max_new_tokens=2).sequences)
    with pytest.raises(ValueError, match="attends through the 'octopus_audio' attention implementation"):
        generate(m, prompt(), cache, max_new_tokens=2)


def test_left_padding_reads_the_sdpa_mask():
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]], dtype=torch.bool)
    causal = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    full = causal[None, None] & mask[:, None, None, :]
    assert left_padding(full, 4) == [0, 2]
    assert left_padding(None, 4) is None
    assert left_padding(causal[None, None].expand(2, 1, 4, 4), 4) is None
    with pytest.raises(ValueError, match="boolean attention mask"):
        left_padding(full.float(), 4)
