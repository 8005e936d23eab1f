"""Tests for the AAR tokenizer (SAT): release key lists, golden parity, encoder, padding, configs, errors."""


import pytest
import torch
from helpers import SHARED, assert_rel_close

from octopus_audio.aar_patch.multiscale_vq import phi_indices
from octopus_audio.aar_patch.sat import RELEASE_PATCH_NUMS, SAT, SATConfig
from octopus_audio.aar_patch.seanet import SConv1d
from octopus_audio.errors import UsageError

REFERENCE = SHARED / "aar_reference"
LAT64 = SATConfig(dimension=1024, latent_dim=64)


def _need_reference() -> None:
    if not (REFERENCE / "golden" / "io.pt").is_file():
        pytest.skip(f"AAR reference files not found under {REFERENCE} (set OCTOPUS_AUDIO_SHARED to the "
                    f"shared folder that holds aar_reference/)")


@pytest.fixture(scope="module")
def golden_io():
    _need_reference()
    return torch.load(REFERENCE / "golden" / "io.pt", weights_only=True)


@pytest.fixture(scope="module")
def golden_sd():
    _need_reference()
    return torch.load(REFERENCE / "golden" / "sat_release.pt", weights_only=True)


@pytest.fixture(scope="module")
def golden_sat(golden_sd):
    return SAT.from_state_dict(golden_sd).eval()


# ---- release architecture ----------------------------------------------------------------------------------

@pytest.mark.parametrize("config, key_file", [(SATConfig(), "sat_d128_lat128_keys.txt"),
                                              (LAT64, "sat_d1024_lat64_keys.txt")],
                         ids=["d128_lat128", "d1024_lat64"])
def test_state_dict_keys_shapes_dtypes_match_release(config, key_file):
    _need_reference()
    expected = (REFERENCE / key_file).read_text().splitlines()
    got = [f"{k}\t{tuple(v.shape)}\t{v.dtype}" for k, v in SAT(config).state_dict().items()]
    assert got == expected


def test_phi_index_mapping_is_the_release_one():
    assert phi_indices(16, 6) == (0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 3, 4, 4, 5, 5, 5)


def test_golden_tokenizer_loads_strictly_as_float32(golden_sd, golden_sat):
    assert golden_sat.config == SATConfig()
    params = dict(golden_sat.state_dict())
    assert all(v.dtype == torch.float32 for v in params.values())
    key = "decoder.model.3.convtr.convtr.weight_v"
    assert torch.equal(params[key], golden_sd[key].float())


@pytest.mark.parametrize("config", [SATConfig(), LAT64], ids=["d128_lat128", "d1024_lat64"])
def test_config_is_inferred_from_shapes(config):
    assert SAT.config_from_state_dict(SAT(config).state_dict()) == config


# ---- golden parity (released code's outputs, fp32) --------------------------------------------------------

@pytest.mark.parametrize("mode, rel_tol", [("fp32", 1e-4), ("bf16-autocast", 3e-2)],
                         ids=["fp32", "bf16_autocast"])
def test_decode_matches_golden(golden_io, golden_sat, mode, rel_tol):
    fhat = golden_io["sat_decode"]["fhat"]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16-autocast"):
        audio = golden_sat.decode(fhat)
    assert audio.dtype == torch.float32
    assert_rel_close(audio, golden_io["sat_decode"]["audio"], rel_tol, f"decoded audio ({mode})")


@pytest.mark.parametrize("run", ["greedy", "sampled"])
def test_tokens_to_fhat_matches_golden(golden_io, golden_sat, run):
    with torch.no_grad():
        fhat = golden_sat.tokens_to_fhat(golden_io[run]["tokens"])
    assert_rel_close(fhat, golden_io[run]["fhat"], 1e-4, f"{run} f_hat")


def test_teacher_forcing_input_matches_golden(golden_io, golden_sat):
    with torch.no_grad():
        x_BLC = golden_sat.quantizer.teacher_forcing_input(golden_io["greedy"]["tokens"])
    assert_rel_close(x_BLC, golden_io["teacher_forcing"]["x_BLCv_wo_first_l"], 1e-4, "teacher-forcing input")


def test_next_scale_step_loop_reproduces_generation(golden_io, golden_sat):
    tokens = golden_io["greedy"]["tokens"]
    expected_x = golden_io["teacher_forcing"]["x_BLCv_wo_first_l"].split(list(RELEASE_PATCH_NUMS[1:]), dim=1)
    fhat = torch.zeros(2, 128, 75)
    with torch.no_grad():
        for si, idx_Bl in enumerate(tokens):
            fhat, next_BlC = golden_sat.quantizer.next_scale_step(si, fhat, idx_Bl)
            if si == len(tokens) - 1:
                assert next_BlC is None
            else:
                assert_rel_close(next_BlC, expected_x[si], 1e-4, f"next-scale input after scale {si}")
    assert_rel_close(fhat, golden_io["greedy"]["fhat"], 1e-4, "f_hat after the loop")


def test_full_decode_path_matches_golden_audio(golden_io, golden_sat):
    with torch.no_grad():
        audio = golden_sat.decode(golden_sat.tokens_to_fhat(golden_io["greedy"]["tokens"]))
    assert_rel_close(audio, golden_io["greedy"]["audio"], 1e-4, "greedy audio")


# ---- encoder -----------------------------------------------------------------------------------------------

def test_encode_audio_round_trip(golden_io, golden_sat):
    audio = golden_io["greedy"]["audio"]
    with torch.no_grad():
        tokens = golden_sat.encode_audio(audio)
        z_BCT = golden_sat.encode_latent(audio)
        tokens_again, fhat = golden_sat.quantizer.quantize(z_BCT)
        fhat_from_tokens = golden_sat.tokens_to_fhat(tokens)
    assert [tuple(t.shape) for t in tokens] == [(2, pn) for pn in RELEASE_PATCH_NUMS]
    assert all(t.dtype == torch.int64 and 0 <= t.min() and t.max() < 1024 for t in tokens)
    assert all(torch.equal(a, b) for a, b in zip(tokens, tokens_again, strict=True))
    assert_rel_close(fhat_from_tokens, fhat, 1e-6, "f_hat from tokens vs the quantizer's accumulation")
    # scale 0 holds one token: the nearest codeword (brute force) to the time-mean of the latent
    codebook = golden_sat.state_dict()["quantizer.vq.layers.0._codebook.embed"]
    brute = torch.cdist(z_BCT.mean(dim=2, keepdim=False).double(), codebook.double()).argmin(dim=1)
    assert torch.equal(tokens[0][:, 0], brute)


def test_encode_audio_rejects_wrong_length():
    with pytest.raises(ValueError, match=r"\(B, 1, 24000\)"):
        SAT().encode_audio(torch.zeros(1, 1, 23999))


# ---- SEANet padding (EnCodec rule) -------------------------------------------------------------------------

def _tap0_conv(kernel_size: int, stride: int) -> SConv1d:
    conv = SConv1d(1, 1, kernel_size, stride=stride)
    inner = conv.conv.conv
    with torch.no_grad():
        inner.weight_v.zero_()
        inner.weight_v[0, 0, 0] = 1.0
        inner.weight_g.fill_(1.0)
        inner.bias.zero_()
    return conv


def test_strided_conv_pads_reflect_left_half_and_extra_right():
    # k=4, s=2, T=33: total 2 -> left 1; 17 frames need 34+... so the right gets 1 + 1 extra. Tap 0 reads
    # padded[0::2] = [x[1], x[1], x[3], ..., x[31]] for x[t] = t.
    x = torch.arange(33.0).view(1, 1, 33)
    y = _tap0_conv(4, 2)(x)
    assert y.flatten().tolist() == [1.0] + [float(t) for t in range(1, 32, 2)]


@pytest.mark.parametrize("length", [4, 5, 33], ids=lambda n: f"T{n}")
def test_same_conv_keeps_length_and_reflects(length):
    x = torch.full((2, 1, length), 3.0)
    y = _tap0_conv(7, 1)(x)
    assert y.shape == (2, 1, length) and torch.equal(y, x)  # reflect padding of a constant stays constant


@pytest.mark.parametrize("length", [1, 2, 3], ids=lambda n: f"T{n}")
def test_conv_accepts_inputs_shorter_than_its_padding(length):
    assert _tap0_conv(7, 1)(torch.ones(1, 1, length)).shape == (1, 1, length)


# ---- configs of other sizes --------------------------------------------------------------------------------

SMALL = SATConfig(n_filters=4, ratios=(2, 3), dimension=8, latent_dim=6, lstm_layers=1, codebook_size=16,
                  patch_nums=(1, 2, 5), num_phi=2, phi_kernel=3)


def test_small_config_round_trips_and_trains():
    torch.manual_seed(0)
    sat = SAT(SMALL)
    audio = torch.randn(3, 1, SMALL.audio_length)
    tokens, fhat = sat.quantize_audio(audio)
    assert [tuple(t.shape) for t in tokens] == [(3, 1), (3, 2), (3, 5)] and fhat.shape == (3, 6, 5)
    loaded = SAT.from_state_dict(sat.state_dict(), patch_nums=SMALL.patch_nums)
    assert loaded.config == SMALL
    out = loaded.decode(loaded.tokens_to_fhat(tokens))
    torch.testing.assert_close(out, sat.decode(fhat), rtol=1e-5, atol=1e-6)
    sat.decode(sat.encode_latent(audio)).square().mean().backward()
    assert sat.decoder.model[0].conv.conv.weight_g.grad.abs().sum() > 0
    assert sat.encoder.model[0].conv.conv.weight_v.grad.abs().sum() > 0


def test_lat64_config_round_trips_through_projections():
    config = SATConfig(dimension=1024, latent_dim=64, patch_nums=(1, 3, 5))  # release widths, 5 frames
    sat = SAT(config)
    with torch.no_grad():
        tokens, fhat = sat.quantize_audio(torch.randn(1, 1, config.audio_length))
        audio = sat.decode(sat.tokens_to_fhat(tokens))
    assert fhat.shape == (1, 64, 5) and audio.shape == (1, 1, 1600) and torch.isfinite(audio).all()


@pytest.mark.parametrize("bad, field", [
    (dict(n_filters=0), "n_filters"), (dict(ratios=()), "ratios"), (dict(patch_nums=(1, 3, 2)), "patch_nums"),
    (dict(phi_kernel=8), "phi_kernel"), (dict(lstm_layers=-1), "lstm_layers"),
    (dict(phi_ratio=1.5), "phi_ratio"),
], ids=["n_filters", "ratios", "patch_nums", "phi_kernel", "lstm_layers", "phi_ratio"])
def test_config_validation_names_the_field(bad, field):
    with pytest.raises(ValueError, match=f"SATConfig.{field}"):
        SATConfig(**bad)


# ---- load errors -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def release_like_sd():
    return dict(SAT().state_dict())


def _missing(sd):
    del sd["decoder.model.1.lstm.weight_hh_l1"]
    return ["1 missing key", "decoder.model.1.lstm.weight_hh_l1"]


def _unexpected(sd):
    for i in range(7):
        sd[f"quantizer.vq.extra_{i}"] = torch.zeros(1)
    return ["7 unexpected keys", "quantizer.vq.extra_0", "quantizer.vq.extra_4", "and 2 more"]


def _wrong_shape(sd):
    sd["quantizer.vq.layers.3._codebook.cluster_size"] = torch.zeros(1000)
    return ["1 wrong shape", "quantizer.vq.layers.3._codebook.cluster_size (1000,) instead of (1024,)"]


def _not_a_tensor(sd):
    sd["decoder.model.15.conv.conv.bias"] = "garbage"
    return ["decoder.model.15.conv.conv.bias <str>"]


def _transformer(sd):
    sd.clear()
    sd["blocks.0.attn.mat_qkv.weight"] = torch.zeros(3, 1)
    return ["not an SAT tokenizer", "encoder.model.0.conv.conv.weight_v", "blocks.0.attn.mat_qkv.weight"]


def _fewer_scales(sd):
    for key in [k for k in sd if k.startswith("quantizer.vq.layers.15.")]:
        del sd[key]
    return ["15 codebooks", "pass patch_nums"]


@pytest.mark.parametrize("corrupt", [_missing, _unexpected, _wrong_shape, _not_a_tensor, _transformer,
                                     _fewer_scales], ids=lambda f: f.__name__.strip("_"))
def test_bad_state_dict_gives_one_clear_sentence(release_like_sd, corrupt):
    sd = dict(release_like_sd)
    fragments = corrupt(sd)
    with pytest.raises(UsageError) as info:
        SAT.from_state_dict(sd)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
