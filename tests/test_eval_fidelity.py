"""Teacher-forced fidelity: identical models agree exactly, a codec's error shows and shrinks with bits."""

import contextlib
import copy
import math

import pytest
import torch

from octopus_audio import CODECS
from octopus_audio.aar_patch import compressed_kv, generate, load_aar
from octopus_audio.eval.fidelity import fidelity, fidelity_rows, teacher_forced_probs


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
    f = fidelity(torch.cat(probs, 1), torch.cat(probs, 1))
    assert f == {"top1_agreement": [1.0], "kl_nats": [0.0]}


def test_codec_error_is_seen_and_shrinks_with_bits(pipe_cond_ref):
    pipe, cond, ref = pipe_cond_ref
    p_ref = teacher_forced_probs(pipe, cond, ref.tokens)
    kl = {}
    for bits in (2, 4):
        with compressed_kv(pipe, codec="octopus", bits=bits):
            f = fidelity(torch.cat(p_ref, 1), torch.cat(teacher_forced_probs(pipe, cond, ref.tokens), 1))
        kl[bits] = f["kl_nats"][0]
        assert 0.5 < f["top1_agreement"][0] < 1.0
    assert 0 < kl[4] < kl[2]


def test_a_model_not_in_float32_is_refused(pipe_cond_ref):
    pipe, cond, ref = pipe_cond_ref
    half = copy.deepcopy(pipe).to(torch.bfloat16)
    with pytest.raises(ValueError, match="runs the model in float32"):
        teacher_forced_probs(half, cond, ref.tokens)


def test_fidelity_rows_known_answers():
    # two positions: the same distribution, then p = (1, 0) against q = (1/4, 3/4): top-1 agrees on one
    # position of two, KL = (0 + log 4) / 2; the second row compares q with itself
    p = torch.tensor([[0.7, 0.3], [1.0, 0.0]])
    q = torch.tensor([[0.7, 0.3], [0.25, 0.75]])
    first, second = fidelity_rows([p, q], [q, q])
    assert first["tf_top1"] == 0.5
    assert first["tf_kl_nats"] == pytest.approx(math.log(4.0) / 2, rel=1e-6)
    assert second == {"tf_top1": 1.0, "tf_kl_nats": 0.0}
    assert fidelity_rows([], []) == []


def test_fidelity_rows_beyond_one_chunk_equal_row_by_row():
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(37, 9, 11, generator=g), -1)
    q = torch.softmax(torch.randn(37, 9, 11, generator=g), -1)
    together = fidelity_rows(list(p), list(q))
    assert together == [fidelity_rows([a], [b])[0] for a, b in zip(p, q, strict=True)]


def test_fidelity_rows_a_non_finite_row_gets_its_error_the_others_their_numbers():
    p = torch.full((3, 2, 2), 0.5)
    q = p.clone()
    q[1, 1, 0] = float("nan")
    rows = fidelity_rows(list(p), list(q))
    assert rows[0] == rows[2] == {"tf_top1": 1.0, "tf_kl_nats": 0.0}
    assert isinstance(rows[1], ValueError) and "not finite" in str(rows[1])


def test_fidelity_rows_of_different_shapes_are_refused():
    with pytest.raises(ValueError, match="shapes"):
        fidelity_rows([torch.full((2, 2), 0.5)], [torch.full((3, 2), 0.5)])


@pytest.mark.parametrize("codec", ["unpatched", "bf16-kv", *CODECS, "octopus-sink3"])
def test_one_pass_equals_the_scale_loop(pipe_cond_ref, codec):
    """The default one block-causal pass against the model's own scale loop through the cache (the
    reference). Uncompressed, they differ by float rounding only. Under a codec a rounding-level difference
    in a key can move it across a quantizer's decision boundary (another code for that token), so the
    distributions may differ by more, but the row's numbers must agree: top-1 within 2 positions of the
    455, KL within 3 percent. A wrong window or a codec left out moves KL by far more (checked below: the
    codec's distance from the reference is many times that tolerance). `octopus-sink3`: the first three
    scales kept native (`sink_scales`), in both ways."""
    pipe, cond, ref = pipe_cond_ref
    p_ref = torch.cat(teacher_forced_probs(pipe, cond, ref.tokens, scale_loop=True), 1)
    patch = (contextlib.nullcontext() if codec == "unpatched"
             else compressed_kv(pipe, "none", 16, kv_dtype=torch.bfloat16) if codec == "bf16-kv"
             else compressed_kv(pipe, codec="octopus", bits=2, sink_scales=3) if codec == "octopus-sink3"
             else compressed_kv(pipe, codec=codec, bits=2))
    with patch:
        one = torch.cat(teacher_forced_probs(pipe, cond, ref.tokens, scale_loop=False), 1)
        loop = torch.cat(teacher_forced_probs(pipe, cond, ref.tokens, scale_loop=True), 1)
    if codec in ("unpatched", "none", "bf16-kv"):
        torch.testing.assert_close(one, loop, rtol=0, atol=5e-5 if codec == "bf16-kv" else 2e-5)
        return
    f_one, f_loop = fidelity(p_ref, one), fidelity(p_ref, loop)
    L = one.shape[1]
    assert abs(f_one["top1_agreement"][0] - f_loop["top1_agreement"][0]) <= 2 / L
    assert f_one["kl_nats"][0] == pytest.approx(f_loop["kl_nats"][0], rel=0.03)
    assert f_loop["kl_nats"][0] > 0.003 and f_loop["top1_agreement"][0] < 0.97  # the codec is felt


def test_wrong_token_shapes_are_rejected(pipe_cond_ref):
    pipe, cond, ref = pipe_cond_ref
    with pytest.raises(ValueError, match="tokens must be 16 tensors"):
        teacher_forced_probs(pipe, cond, ref.tokens[:-1])


class _Stop(Exception):
    pass


@pytest.mark.parametrize("scale_loop,expect", [(True, "reference"), (False, "triton")],
                         ids=["scale-loop", "one-pass"])
def test_which_backend_teacher_forcing_runs(pipe_cond_ref, monkeypatch, scale_loop, expect):
    """With the kernels asked for (triton; the interpreter here), the scale loop still runs every cache on the
    PyTorch reference (fp32 attention through the codec library), while the one pass leaves the choice to its
    caches: they encode the stored tokens as `append` would, with the kernels (its attention is PyTorch's)."""
    from octopus_audio import get_codec
    from octopus_audio.cache.backend import attention_backend
    from octopus_audio.eval import fidelity as fidelity_module

    pipe, cond, ref = pipe_cond_ref
    monkeypatch.setenv("OCTOPUS_AUDIO_KERNELS", "kernels")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    seen = []

    def record(*args, **kwargs):
        seen.append(attention_backend("cpu", get_codec("octopus", 2, 64)))
        raise _Stop

    monkeypatch.setattr(fidelity_module, "run_scales" if scale_loop else "forced_sequence", record)
    with pytest.raises(_Stop):
        teacher_forced_probs(pipe, cond, ref.tokens, scale_loop=scale_loop)
    assert seen == [expect]
