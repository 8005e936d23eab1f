"""Teacher-forced fidelity: identical models agree exactly, a codec's error shows and shrinks with bits."""

import pytest
import torch

from octopus_audio.aar_patch import compressed_kv, generate, load_aar
from octopus_audio.eval.fidelity import fidelity, teacher_forced_probs


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


def test_wrong_token_shapes_are_rejected(pipe_cond_ref):
    pipe, cond, ref = pipe_cond_ref
    with pytest.raises(ValueError, match="tokens must be 16 tensors"):
        teacher_forced_probs(pipe, cond, ref.tokens[:-1])
