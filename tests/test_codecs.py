"""Tests for the six key codecs: round trip, score path, edge keys, exact formats, byte accounting, errors."""

import dataclasses
import math

import pytest
import torch

from octopus_audio import CODECS, get_codec, rotation
from octopus_audio.codebooks import get_codebook
from octopus_audio.octahedral import direction_table, round_triplets
from octopus_audio.packing import unpack

ROTATED = [c for c in CODECS if c != "none"]
# generous upper bounds on E||u - u_hat||^2 per nominal bits (sanity; the oracles are tested elsewhere)
REL_MSE_BOUND = {1: 0.85, 2: 0.3, 3: 0.08, 4: 0.025}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
BITS_FOR_D = {32: 2, 64: 3, 128: 4, 256: 2}


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _decode_fp32(codec, state):
    return codec.decode(dataclasses.replace(state, dtype=torch.float32)).float()


def _rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: str(t).removeprefix("torch."))
@pytest.mark.parametrize("d", [32, 64, 128, 256], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("name", CODECS)
def test_round_trip_and_score_path(name, d, dtype):
    bits = BITS_FOR_D[d]
    codec = get_codec(name, bits, d, seed=3)
    batch = 2 if d < 128 else 1
    k = _randn(batch, 3, 33, d, seed=d, dtype=dtype) * 2.5
    q = _randn(batch, 3, 5, d, seed=d + 1, dtype=dtype)
    state = codec.encode(k)
    k_hat = codec.decode(state)
    assert k_hat.dtype == dtype and k_hat.shape == k.shape
    k_hat32 = _decode_fp32(codec, state)
    rel_mse = (((k_hat32 - k.float()) ** 2).sum(-1) / (k.float() ** 2).sum(-1)).mean().item()
    assert rel_mse <= (0.0 if name == "none" else REL_MSE_BOUND[bits])
    s = codec.scores(q, state)
    assert s.dtype == torch.float32 and s.shape == (batch, 3, 5, 33)
    ref = q.float() @ k_hat32.mT
    torch.testing.assert_close(s, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


@pytest.mark.parametrize("name", CODECS)
def test_token_counts_and_plain_2d(name):
    codec = get_codec(name, 2, 64, seed=1)
    k = _randn(1, 2, 33, 64, seed=4)
    full = codec.encode(k)
    one = codec.encode(k[:, :, 7:8])
    for field, t in one.tensors().items():
        assert torch.equal(t, full.slice_t(7, 8).tensors()[field]), field
    parts = [codec.encode(k[:, :, a:b]) for a, b in [(0, 1), (1, 20), (20, 33)]]
    assert type(full).cat_t(parts).tensors().keys() == full.tensors().keys()
    for field, t in type(full).cat_t(parts).tensors().items():
        assert torch.equal(t, full.tensors()[field]), field
    two_d = codec.encode(k[0, 0])  # [T, d] is one head: head 0's rotation
    torch.testing.assert_close(codec.decode(two_d), codec.decode(full)[0, 0], rtol=0, atol=0)


@pytest.mark.parametrize("name", ROTATED)
def test_edge_keys(name):
    d = 64
    codec = get_codec(name, 3, d, seed=5)
    base = _randn(1, d, seed=6)
    rows = [torch.zeros(d), torch.eye(d)[0], torch.eye(d)[d - 1], torch.ones(d), -3 * torch.ones(d)]
    rows += [base[0] * 10.0**p for p in range(-20, 21, 5)]
    k = torch.stack(rows)[None]  # one head, 14 keys
    state = codec.encode(k)
    k_hat = codec.decode(state)
    assert torch.isfinite(k_hat).all()
    assert torch.equal(k_hat[0, 0], torch.zeros(d))
    assert torch.isfinite(codec.scores(_randn(1, 2, d, seed=7), state)).all()
    k64, k_hat64 = k[0, 1:].double(), k_hat[0, 1:].double()
    rel = (k_hat64 - k64).norm(dim=-1) / k64.norm(dim=-1)
    assert (rel < math.sqrt(REL_MSE_BOUND[3]) * 1.5).all(), rel
    # scale equivariance from 1e-20 to 1e20: same direction code, gamma rounding (bf16) only
    scaled = rel[4:]
    assert (scaled - scaled[0]).abs().max() < 1e-2 * scaled[0] + 1e-6


@pytest.mark.parametrize("name", CODECS)
def test_non_finite_keys_raise(name):
    codec = get_codec(name, 2, 32)
    for bad in (float("nan"), float("inf"), -float("inf")):
        k = torch.zeros(1, 3, 32)
        k[0, 1, 5] = bad
        with pytest.raises(ValueError, match="finite"):
            codec.encode(k)


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("d", [32, 64, 128, 256], ids=lambda d: f"d{d}")
def test_packed_bytes_equal_accounting(name, d):
    for bits in (1, 2, 3, 4):
        codec = get_codec(name, bits, d)
        state = codec.encode(_randn(1, 2, 3, d, seed=bits, dtype=torch.float16))
        assert state.nbytes * 8 == 1 * 2 * 3 * codec.bits_per_key
        # independent accounting from the format table (codes rounded up to whole 32-bit words)
        words = lambda n_bits: 32 * math.ceil(n_bits / 32)
        expect = {
            "none": 16 * d,
            "turboquant-mse": 16 + words(d * bits),
            "turboquant-qjl": 16 + words(d * (bits - 1)) + words(d) + 16,
            "polarquant": 16 + words((d - 1) * bits),
            "octopus": 16 + words(math.ceil(d / 3) * (3 * bits + 1)),
            "octopus-qjl": 16 + words(math.ceil(d / 3) * (3 * bits + 1)) + words(d) + 16,
        }[name]
        assert codec.bits_per_key == expect


def test_design_table_bits_at_d64():
    # DESIGN section 2 (d=64), where the codes fill whole words
    assert get_codec("turboquant-mse", 2, 64).bits_per_key == 16 + 64 * 2
    assert get_codec("turboquant-qjl", 3, 64).bits_per_key == 32 + 64 * 3
    assert get_codec("octopus-qjl", 2, 64).bits_per_key == get_codec("octopus", 2, 64).bits_per_key + 16 + 64


@pytest.mark.parametrize("name", ROTATED)
def test_seeds_determine_bytes(name):
    k = _randn(1, 4, 9, 64, seed=8)
    a = get_codec(name, 2, 64, seed=11).encode(k)
    b = get_codec(name, 2, 64, seed=11).encode(k)
    c = get_codec(name, 2, 64, seed=12).encode(k)
    for field in a.tensors():
        assert torch.equal(a.tensors()[field], b.tensors()[field])
    assert not torch.equal(a.codes, c.codes)
    signs = get_codec(name, 2, 64, seed=11).signs(4, "cpu")
    assert all(not torch.equal(signs[i], signs[j]) for i in range(4) for j in range(i))
    assert torch.equal(signs[2], rotation.sign_vector(11, 2, 64))


# ---- exact formats (formats.md), re-derived independently per codec ----

def _explicit_u(k_TD, seed, head=0):
    d = k_TD.shape[-1]
    R = rotation.hadamard(d) @ torch.diag(rotation.sign_vector(seed, head, d)) / math.sqrt(d)
    k64 = k_TD.double()
    return (k64 @ R.double().T / k64.norm(dim=-1, keepdim=True)).float(), R


def test_turboquant_format():
    d, b = 64, 3
    k = _randn(6, d, seed=9)
    state = get_codec("turboquant-mse", b, d, seed=2).encode(k)
    u, _ = _explicit_u(k, 2)
    cb = get_codebook("coord", d, b)
    expect_idx = (u[..., None] > cb.boundaries).sum(-1)
    assert (unpack(state.codes, b, d) != expect_idx).sum() <= 1  # fp32 rounding may flip one boundary case
    torch.testing.assert_close(state.gamma, k.norm(dim=-1).to(torch.bfloat16), rtol=0, atol=0)


def test_turboquant_qjl_format():
    d, b = 32, 2
    k = _randn(5, d, seed=10)
    codec = get_codec("turboquant-qjl", b, d, seed=4)
    state = codec.encode(k)
    u, _ = _explicit_u(k, 4)
    u_hat = get_codebook("coord", d, b - 1).centroids[unpack(state.codes, b - 1, d)]
    r = u - u_hat
    R1 = rotation.hadamard(d) @ torch.diag(rotation.sign_vector(4, 0, d, stream=1)) / math.sqrt(d)
    proj = r @ R1.T
    bits = unpack(state.signs, 1, d)
    confident = proj.abs() > 1e-5
    assert torch.equal(bits[confident], (proj[confident] > 0).long())
    torch.testing.assert_close(state.gamma_r.float(), r.norm(dim=-1), rtol=1e-2, atol=1e-6)
    # decode is the QJL estimator vector
    sigma = (bits * 2 - 1).float()
    est = u_hat + math.sqrt(math.pi / (2 * d)) * state.gamma_r.float()[:, None] * (sigma @ R1)
    _, R = _explicit_u(k, 4)
    expect = (est @ R) * state.gamma.float()[:, None]
    torch.testing.assert_close(codec.decode(state), expect, rtol=1e-4, atol=1e-5)


def test_polarquant_format_d8():
    d, b = 8, 3
    k = _randn(4, d, seed=11)
    codec = get_codec("polarquant", b, d, seed=6)
    state = codec.encode(k)
    u, R = _explicit_u(k, 6)
    idx = unpack(state.codes, b, d - 1)
    for row in range(4):
        x = u[row].tolist()
        expect = []
        for level in (1, 2, 3):
            cb = get_codebook(f"polar{level}", None, b)
            pairs = [(x[2 * j], x[2 * j + 1]) for j in range(len(x) // 2)]
            for a, c in pairs:
                psi = math.atan2(c, a)
                if level == 1 and psi < 0:
                    psi += 2 * math.pi
                expect.append(int((psi > cb.boundaries.double()).sum()))
            x = [math.hypot(a, c) for a, c in pairs]
        assert idx[row].tolist() == expect
    # decode top-down from radius 1 with the centroids
    c = [get_codebook(f"polar{lv}", None, b).centroids for lv in (1, 2, 3)]
    i = idx[0]
    r_top = [1.0]
    for level, start, n in ((3, 6, 1), (2, 4, 2), (1, 0, 4)):
        psi = c[level - 1][i[start:start + n]].tolist()
        r_top = [v for rr, p in zip(r_top, psi, strict=True) for v in (rr * math.cos(p), rr * math.sin(p))]
    expect_k = (torch.tensor(r_top) @ R) * state.gamma[0].float()
    torch.testing.assert_close(codec.decode(state)[0], expect_k, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rounding", ["scalar", "local3x3", "full"])
def test_octopus_format(rounding):
    d, b = 32, 2
    k = _randn(7, d, seed=12)
    codec = get_codec("octopus", b, d, seed=1, rounding=rounding)
    state = codec.encode(k)
    u, R = _explicit_u(k, 1)
    t = torch.nn.functional.pad(u, (0, 1)).reshape(7, 11, 3)
    i_xi, i_eta, i_rho = round_triplets(t, b + 1, b - 1, rounding, d=d)
    code = unpack(state.codes, 3 * b + 1, 11)
    assert (code != (i_xi * 8 + i_eta) * 2 + i_rho).sum() <= 1
    t_hat = get_codebook("rho", d, b - 1).centroids[code % 2][..., None] * direction_table(b + 1)[code // 2]
    expect = (t_hat.reshape(7, 33)[:, :d] @ R) * state.gamma.float()[:, None]
    torch.testing.assert_close(codec.decode(state), expect, rtol=1e-5, atol=1e-6)


def test_octopus_split_options():
    codec = get_codec("octopus-qjl", 3, 64, dir_bits=3, rho_bits=3)
    assert (codec.dir_bits, codec.rho_bits, codec.code_bits) == (3, 3, 9)
    k = _randn(2, 5, 64, seed=13)
    assert torch.isfinite(codec.decode(codec.encode(k))).all()


# ---- errors name what is supported ----

@pytest.mark.parametrize("name, bad_bits", [("turboquant-mse", 0), ("turboquant-qjl", 9), ("polarquant", 9),
                                            ("octopus", 0), ("octopus-qjl", 8)])
def test_unsupported_bits_name_the_range(name, bad_bits):
    with pytest.raises(ValueError, match=r"allowed 1\.\.[78]"):
        get_codec(name, bad_bits, 64)


@pytest.mark.parametrize("name", CODECS)
def test_bad_head_dim_and_names(name):
    with pytest.raises(ValueError, match="power of two from 8 to 1024"):
        get_codec(name, 2, 96)
    with pytest.raises(ValueError, match="must have shape"):
        get_codec(name, 2, 64).encode(torch.zeros(3, 32))


def test_unknown_codec_and_option():
    with pytest.raises(ValueError, match="allowed: none, turboquant-mse"):
        get_codec("kivi", 2, 64)
    with pytest.raises(ValueError, match="allowed: dir_bits, rho_bits, rounding"):
        get_codec("octopus", 2, 64, group=3)
    with pytest.raises(ValueError, match="allowed: no options"):
        get_codec("polarquant", 2, 64, rounding="full")
    with pytest.raises(ValueError, match="scalar, local3x3, full"):
        get_codec("octopus", 2, 64, rounding="nearest")


def test_turboquant_mse_matches_codebook_distortion():
    d, b = 128, 2
    codec = get_codec("turboquant-mse", b, d)
    k = _randn(1, 4096, d, seed=14)
    u_hat = _decode_fp32(codec, codec.encode(k)) / k.norm(dim=-1, keepdim=True)
    mse = ((u_hat - k / k.norm(dim=-1, keepdim=True)) ** 2).sum(-1).mean().item()
    expect = d * get_codebook("coord", d, b).distortion
    assert abs(mse / expect - 1) < 0.03
