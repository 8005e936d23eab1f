"""Tests for the group-16 value quantizer: oracle relative MSE, exact format, edge groups, bad input."""

import pytest
import torch

from octopus_audio.packing import unpack
from octopus_audio.values import ValueQuantizer


@pytest.mark.parametrize("bits, oracle", [(2, 0.1069), (3, 0.0194), (4, 0.00423)], ids=["b2", "b3", "b4"])
def test_relative_mse_matches_oracle(bits, oracle):
    g = torch.Generator().manual_seed(bits)
    v = torch.randn(4, 4, 512, 128, generator=g)
    q = ValueQuantizer(bits, 128)
    rel = ((v - q.decode(q.encode(v))) ** 2).sum() / (v**2).sum()
    assert abs(rel.item() / oracle - 1) < 0.03


def test_format_fields_and_bytes():
    v = torch.randn(2, 3, 5, 64)
    q = ValueQuantizer(3, 64)
    s = q.encode(v)
    assert s.codes.dtype == torch.int32 and s.codes.shape == (2, 3, 5, 6)
    assert s.scale.dtype == s.minimum.dtype == torch.float16 and s.scale.shape == (2, 3, 5, 4)
    assert s.nbytes * 8 == 2 * 3 * 5 * q.bits_per_token == 2 * 3 * 5 * (6 * 32 + 2 * 16 * 4)
    # codes follow the formula from the fp16 scale and minimum (independent re-derivation)
    v_G = v.reshape(2, 3, 5, 4, 16)
    mn = v_G.amin(-1).half()
    scale = ((v_G.amax(-1) - v_G.amin(-1)) / 7).half()
    assert torch.equal(s.minimum, mn) and torch.equal(s.scale, scale)
    expect = torch.round((v_G - mn.float()[..., None]) / scale.float()[..., None]).clamp(0, 7)
    assert torch.equal(unpack(s.codes, 3, 64).reshape(2, 3, 5, 4, 16), expect.long())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_constant_groups_and_dtypes(dtype):
    v = torch.zeros(1, 2, 3, 32, dtype=dtype)
    v[0, 1] = 2.5
    v[0, 0, 1, :16] = -7.0
    q = ValueQuantizer(2, 32)
    s = q.encode(v)
    v_hat = q.decode(s)
    assert v_hat.dtype == dtype
    assert torch.equal(v_hat, v)  # constant groups are exact (scale 1, code 0)
    assert (s.scale == 1).all()


def test_extreme_range_stays_finite():
    v = torch.tensor([[[[-65504.0] * 8 + [65504.0] * 8]]], dtype=torch.float16)
    q = ValueQuantizer(1, 16)
    v_hat = q.decode(q.encode(v))
    assert torch.isfinite(v_hat).all()
    assert (v_hat[..., :8] == -65504).all() and (v_hat[..., 8:] == 0).all()  # saturated scale 65504


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e5], ids=["nan", "inf", "beyond_fp16"])
def test_bad_values_raise(bad):
    v = torch.zeros(1, 1, 2, 16)
    v[0, 0, 1, 3] = bad
    with pytest.raises(ValueError, match="finite and within the fp16 range"):
        ValueQuantizer(2, 16).encode(v)


def test_bad_configuration_names_allowed():
    with pytest.raises(ValueError, match="allowed 1..8"):
        ValueQuantizer(9, 64)
    with pytest.raises(ValueError, match="must divide the head dim"):
        ValueQuantizer(2, 64, group=24)
