"""The AAR transformer: released key/shape list, golden teacher-forced logits, KV cache == masked forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import SHARED, assert_rel_close

from octopus_audio.aar_patch.aar import AAR, AARConfig
from octopus_audio.aar_patch.loading import load_aar_transformer, transformer_from_state_dict

REFERENCE = SHARED / "aar_reference"


@pytest.fixture(scope="module")
def reference() -> Path:
    if not (REFERENCE / "golden" / "io.pt").is_file():
        reason = f"AAR reference files not found under {REFERENCE} (set OCTOPUS_AUDIO_SHARED to ../shared)"
        print(reason)
        pytest.skip(reason)
    return REFERENCE


def test_d16_keys_shapes_dtypes_match_release_list(reference):
    lines = (reference / "aar_d16_keys.txt").read_text().strip().splitlines()
    expected = [tuple(line.split("\t")) for line in lines]
    with torch.device("meta"):
        model = AAR(AARConfig())
    ours = [(k, str(tuple(v.shape)), str(v.dtype)) for k, v in model.state_dict().items()]
    assert sorted(ours) == sorted(expected)
    assert len(ours) == 222
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(307.6e6, rel=1e-3)


def test_config_inferred_from_golden_checkpoint(reference):
    model = load_aar_transformer(reference / "golden" / "aar.pth")
    assert model.config == AARConfig(depth=2, embed_dim=128, num_heads=2)
    assert (model.blocks[0].attn.num_heads, model.blocks[0].attn.head_dim) == (2, 64)
    assert not model.training


def test_teacher_forced_logits_match_golden(reference):
    io = torch.load(reference / "golden" / "io.pt", weights_only=True)
    model = load_aar_transformer(reference / "golden" / "aar.pth")
    with torch.no_grad():
        logits = model(io["cond"], io["teacher_forcing"]["x_BLCv_wo_first_l"])
    assert_rel_close(logits, io["teacher_forcing"]["logits"], 1e-4, "teacher-forced logits")


SMALL = AARConfig(depth=2, embed_dim=48, num_heads=3, cond_dim=20, vocab_size=33, latent_dim=7,
                  patch_nums=(1, 3, 5, 8), mlp_ratio=2.0)


@pytest.mark.parametrize("config", [SMALL, AARConfig(depth=1, embed_dim=32, num_heads=2, cond_dim=8,
                                                     vocab_size=16, latent_dim=4, patch_nums=(2, 3))],
                         ids=["heads3x16-scales1358", "first_l2-scales23"])
def test_kv_cached_scales_equal_block_causal_forward(config):
    """Running the scales one by one with the cache gives the one-shot masked (training) forward's logits."""
    torch.manual_seed(0)
    model = AAR(config).eval()
    B, first_l = 3, config.patch_nums[0]
    cond_BE = torch.randn(B, config.cond_dim)
    x_BLCv = torch.randn(B, config.seq_len - first_l, config.latent_dim)
    with torch.no_grad():
        full_BLV = model(cond_BE, x_BLCv)
        cond_BD = model.class_emb(cond_BE)
        lvl_pos_1LC = model.lvl_embed(model.lvl_1L) + model.pos_1LC
        tokens_BLC = torch.cat((cond_BD.unsqueeze(1).expand(B, first_l, -1) + model.pos_start,
                                model.word_embed(x_BLCv)), dim=1) + lvl_pos_1LC
        for block in model.blocks:
            block.attn.kv_caching(True)
        begin, pieces = 0, []
        for pn in config.patch_nums:
            x_BlC = tokens_BLC[:, begin:begin + pn]
            for block in model.blocks:
                x_BlC = block(x_BlC, cond_BD, None)
            pieces.append(model.get_logits(x_BlC, cond_BD))
            begin += pn
            cache_k = model.blocks[0].attn.cached_k
            assert cache_k.shape == (B, config.num_heads, begin, config.head_dim)
            torch.testing.assert_close(cache_k.norm(dim=-1), torch.ones(B, config.num_heads, begin))
        for block in model.blocks:
            block.attn.kv_caching(False)
    assert model.blocks[0].attn.cached_k is None and model.blocks[0].attn.cached_v is None
    assert_rel_close(torch.cat(pieces, dim=1), full_BLV, 1e-5, "cached vs masked logits")


def test_small_config_round_trips_through_state_dict():
    torch.manual_seed(1)
    model = AAR(SMALL).eval()
    clone = transformer_from_state_dict(model.state_dict())
    assert clone.config == SMALL
    cond_BE, x_BLCv = torch.randn(2, 20), torch.randn(2, SMALL.seq_len - 1, 7)
    with torch.no_grad():
        torch.testing.assert_close(clone(cond_BE, x_BLCv), model(cond_BE, x_BLCv), rtol=0, atol=0)


def test_block_causal_mask_and_levels():
    model = AAR(AARConfig(depth=1, embed_dim=16, num_heads=1, cond_dim=4, vocab_size=8, latent_dim=2,
                          patch_nums=(1, 2, 3)))
    assert model.lvl_1L.tolist() == [[0, 1, 1, 2, 2, 2]]
    visible = (model.attn_bias_for_masking[0, 0] == 0).int().tolist()
    assert visible == [[1, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                       [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]
    assert torch.isneginf(model.attn_bias_for_masking[0, 0, 0, 1])


@pytest.mark.parametrize("kwargs, message", [
    (dict(embed_dim=100, num_heads=3), "multiple of num_heads"),
    (dict(patch_nums=(1, 4, 2)), "strictly increasing"),
    (dict(patch_nums=(5,)), "at least two"),
    (dict(depth=0), "depth must be a positive int"),
    (dict(mlp_ratio=0.25, embed_dim=10, num_heads=1), "mlp_ratio"),
], ids=["heads", "patch-order", "one-scale", "depth", "mlp-ratio"])
def test_config_rejects_impossible_sizes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AARConfig(**kwargs)


def test_training_forward_has_gradients_and_condition_dropout():
    torch.manual_seed(2)
    model = AAR(SMALL).train()
    cond_BE, x_BLCv = torch.randn(4, 20), torch.randn(4, SMALL.seq_len - 1, 7)
    logits = model(cond_BE, x_BLCv, cond_drop_prob=1.0)
    logits.logsumexp(-1).mean().backward()
    assert model.pos_1LC.grad is not None and model.blocks[1].attn.scale_mul_1H11.grad is not None
    with torch.no_grad():  # every row dropped: equal to feeding the unconditional embedding
        uncond = model(model.uncond_embedding.expand(4, -1), x_BLCv)
    torch.testing.assert_close(logits.detach(), uncond)
