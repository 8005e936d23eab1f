"""Teacher-forced fidelity: identical models agree exactly, a codec's error shows and shrinks with bits."""

import copy
import math

import pytest
import torch

from octopus_audio.aar_patch import compressed_kv, generate, load_aar
from octopus_audio.eval.fidelity import fidelity, fidelity_row, teacher_forced_probs


@pytest.fixture(scope="module")
def pipe_cond_ref():
    torch.manual_seed(0)
    pipe = load_aar(None, None)  # the embedded default model
    cond = torch.randn(1, 512, generator=torch.Generator().manual_seed(0))
    cond = torch.nn.functional.normalize(cond, dim=-1)
    ref = generate(pipe, cond, seed=42)
    return pipe, cond, ref


def test_forced_reference_tokens_reproduce_the_reference_distributions(pipe_cond_ref):
    pipe, cond, ref = pipe_cond_ref
    probs = teacher_forced_probs(pipe, cond, ref.tokens)
    assert [p.shape[1] for p in probs] == list(pipe.aar.config.patch_nums)
    assert all(torch.allclose(p.sum(-1), torch.ones(()), atol=1e-5) for p in probs)
    f = fidelity(probs, probs)
    assert f == {"top1_agreement": [1.0], "kl_nats": [0.0]}


def test_codec_error_is_seen_and_shrinks_with_bits(pipe_cond_ref):
    pipe, cond, ref = pipe_cond_ref
    p_ref = teacher_forced_probs(pipe, cond, ref.tokens)
    kl = {}
    for bits in (2, 4):
        with compressed_kv(pipe, codec="octopus", bits=bits):
            f = fidelity(p_ref, teacher_forced_probs(pipe, cond, ref.tokens))
        kl[bits] = f["kl_nats"][0]
        assert 0.5 < f["top1_agreement"][0] < 1.0
    assert 0 < kl[4] < kl[2]


def test_a_model_not_in_float32_is_refused(pipe_cond_ref):
    pipe, cond, ref = pipe_cond_ref
    half = copy.deepcopy(pipe).to(torch.bfloat16)
    with pytest.raises(ValueError, match="runs the model in float32"):
        teacher_forced_probs(half, cond, ref.tokens)


def test_fidelity_row_known_answers():
    # one scale, batch 1, two positions: the same distribution, then p = (1, 0) against q = (1/4, 3/4):
    # top-1 agrees on one position of two, KL = (0 + log 4) / 2
    p = [torch.tensor([[[0.7, 0.3], [1.0, 0.0]]])]
    q = [torch.tensor([[[0.7, 0.3], [0.25, 0.75]]])]
    row = fidelity_row(p, q)
    assert row["tf_top1"] == 0.5
    assert row["tf_kl_nats"] == pytest.approx(math.log(4.0) / 2, rel=1e-6)
    assert fidelity_row(q, q) == {"tf_top1": 1.0, "tf_kl_nats": 0.0}


@pytest.mark.parametrize("probs_ref,probs_hat,match", [
    ([torch.full((1, 2, 2), 0.5)], [torch.full((1, 3, 2), 0.5)], "shapes"),
    ([torch.full((1, 2, 2), 0.5)], [torch.tensor([[[0.7, 0.3], [float("nan"), 0.5]]])], "not finite"),
    ([torch.full((2, 2, 2), 0.5)], [torch.full((2, 2, 2), 0.5)], "batch of 2"),
], ids=["shape-mismatch", "nan", "batch-2"])
def test_fidelity_row_rejects_bad_input(probs_ref, probs_hat, match):
    with pytest.raises(ValueError, match=match):
        fidelity_row(probs_ref, probs_hat)


def test_wrong_token_shapes_are_rejected(pipe_cond_ref):
    pipe, cond, ref = pipe_cond_ref
    with pytest.raises(ValueError, match="tokens must be 16 tensors"):
        teacher_forced_probs(pipe, cond, ref.tokens[:-1])
