"""The single-query table-lookup attention (kernels/impls/score_tables.py) against the float64
decode-then-softmax reference.

Interpreted on the CPU (TRITON_INTERPRET=1 set at import); OCTOPUS_AUDIO_TEST_DEVICE=cuda runs it compiled.
Random packed codes cover every code of the tables (any bit pattern is a valid code).
"""

import math
import os

DEVICE = os.environ.get("OCTOPUS_AUDIO_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import importlib  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import decoded_attention, kernel_ops  # noqa: E402

from octopus_audio.cache import kernel_codec  # noqa: E402
from octopus_audio.codecs import get_codec  # noqa: E402
from octopus_audio.kernels import PackedKeys, PackedValues  # noqa: E402

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-3}


def tables():
    kernel_ops(DEVICE)
    return importlib.import_module("octopus_audio.kernels.impls.score_tables")


def make_store(name, bits, *, batch, heads, length, window, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    lib = get_codec(name, bits, d, seed=seed + 7)
    codec = kernel_codec(lib, heads, "cpu")
    cap = length + 5

    def words(n):
        w = torch.randint(-2**31, 2**31, (batch, heads, cap, n), generator=g, dtype=torch.int64)
        return w.to(torch.int32)

    def positive(scale):
        return (torch.rand(batch, heads, cap, generator=g) * scale + 0.1 * scale).to(torch.bfloat16)

    keys = PackedKeys(words(codec.code_words), positive(math.sqrt(d)),
                      words(d // 32) if codec.has_qjl else None, positive(0.3) if codec.has_qjl else None)
    scale = (torch.rand(batch, heads, cap, d // 16, generator=g) / 2**bits).half()
    minimum = (torch.randn(batch, heads, cap, d // 16, generator=g) - 0.5).half()
    values = PackedValues(words(-(-d * bits // 32)), scale, minimum, bits)
    q = (torch.randn(batch, heads, 1, d, generator=g) * 3 / math.sqrt(d)).to(dtype)
    k_win = torch.randn(batch, heads, window, d, generator=g).to(dtype)
    v_win = torch.randn(batch, heads, window, d, generator=g).to(dtype)
    return lib, codec, q, keys, values, k_win, v_win


def reference(lib, q, keys, values, length, k_win, v_win, scale=None):
    """The library's decode, one float64 softmax over [store; window] (helpers.decoded_attention)."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    return decoded_attention(lib, q, keys, values, length, k_win, v_win, scale)


def to(device, *xs):
    return [None if x is None else x.to(device) for x in xs]


def on_device(dev, q, keys, values, k_win, v_win):
    """Queries, packed store and window moved to `dev`, as the kernels take them."""
    keys_d = PackedKeys(*to(dev, keys.codes, keys.gamma, keys.signs, keys.gamma_r))
    values_d = PackedValues(*to(dev, values.codes, values.scale, values.minimum), values.bits)
    q_d, kw, vw = to(dev, q, k_win, v_win)
    return q_d, keys_d, values_d, kw, vw


def rel(got, want):
    floor = ((want.to(got.dtype).double() - want.double()).norm() / want.double().norm()).item()
    return ((got.double().cpu() - want.double()).norm() / want.double().norm()).item(), floor


CASES = [
    # codec, bits, d, length, window, splits, dtype
    ("octopus", 2, 64, 455, 1, None, torch.float32),
    ("octopus", 2, 128, 300, 0, 3, torch.float32),
    ("octopus", 2, 64, 1, 1, None, torch.bfloat16),
    ("octopus", 2, 64, 0, 3, None, torch.float32),
    ("octopus", 2, 64, 50, 40, 2, torch.float32),  # a window wider than one 16-key tile
    ("octopus", 3, 64, 200, 1, 2, torch.float32),  # C_rho looked up, not folded
    ("octopus", 4, 64, 130, 1, None, torch.bfloat16),
    ("octopus", 1, 128, 97, 2, None, torch.float32),  # one norm: b_rho = 0
    ("octopus-qjl", 2, 64, 257, 1, 2, torch.float32),
    ("octopus-qjl", 3, 128, 140, 1, None, torch.bfloat16),
    # scalar kind: groups of 6 // b coordinates a table code (b=2: 3, the last group of d=64 and 128
    # short), one coordinate a code from b=4 on; turboquant-qjl at b keeps b-1 bits a coordinate (b=2: 6)
    ("turboquant-mse", 2, 64, 455, 1, None, torch.float32),
    ("turboquant-mse", 2, 128, 300, 0, 3, torch.bfloat16),
    ("turboquant-mse", 3, 64, 1, 1, None, torch.float32),
    ("turboquant-mse", 3, 128, 257, 2, 2, torch.float32),
    ("turboquant-mse", 4, 64, 130, 40, None, torch.bfloat16),
    ("turboquant-mse", 4, 128, 97, 1, None, torch.float32),
    ("turboquant-mse", 8, 64, 70, 1, None, torch.float32),
    ("turboquant-qjl", 2, 64, 257, 1, 2, torch.float32),
    ("turboquant-qjl", 2, 128, 140, 1, None, torch.bfloat16),
    ("turboquant-qjl", 3, 128, 33, 3, None, torch.float32),
    ("turboquant-qjl", 4, 64, 0, 2, None, torch.float32),
    # polar kind: tables over the bottom two levels (b <= 2: 3 angles, 6 bits) or one (b >= 3), the levels
    # above folded in the key loop; 127 and 63 codes a key straddle words
    ("polarquant", 2, 64, 455, 1, None, torch.float32),
    ("polarquant", 2, 128, 300, 0, 3, torch.bfloat16),
    ("polarquant", 1, 64, 97, 2, 2, torch.float32),
    ("polarquant", 3, 128, 130, 40, None, torch.float32),
    ("polarquant", 4, 64, 1, 1, None, torch.bfloat16),
    ("polarquant", 8, 64, 70, 1, None, torch.float32),
]


@pytest.mark.parametrize("name,bits,d,length,window,splits,dtype", CASES,
                         ids=[f"{c[0]}-b{c[1]}-d{c[2]}-L{c[3]}-w{c[4]}-s{c[5]}-{str(c[6])[6:]}"
                              for c in CASES])
def test_table_attention_matches_reference(name, bits, d, length, window, splits, dtype):
    lib, codec, q, keys, values, k_win, v_win = make_store(
        name, bits, batch=2, heads=2, length=length, window=window, d=d, dtype=dtype)
    want = reference(lib, q, keys, values, length, k_win, v_win, 0.9 / math.sqrt(d))
    dev = torch.device(DEVICE)
    q_d, keys_d, values_d, kw, vw = on_device(dev, q, keys, values, k_win, v_win)
    got = tables().attention_adc(q_d, keys_d, values_d, length, kw, vw, codec.to(dev),
                                  scale=0.9 / math.sqrt(d), num_splits=splits)
    assert got.dtype == dtype and got.shape == q.shape
    err, floor = rel(got, want)
    assert err <= TOL[dtype] + floor, f"relative RMS error {err:.2e} > {TOL[dtype]:.0e} + floor {floor:.1e}"


GROUP_CASES = [
    # codec, bits, d, coordinates a table code: codes of 2..10 bits, straddling words, short last groups
    ("turboquant-mse", 2, 64, 1),
    ("turboquant-mse", 2, 128, 4),
    ("turboquant-mse", 2, 64, 5),  # 10-bit codes, 13 groups: the last of 4 coordinates
    ("turboquant-mse", 3, 128, 3),  # 9-bit codes, 43 groups
    ("turboquant-qjl", 3, 64, 4),
    ("turboquant-mse", 4, 64, 2),
]


@pytest.mark.parametrize("name,bits,d,group", GROUP_CASES,
                         ids=[f"{c[0]}-b{c[1]}-d{c[2]}-g{c[3]}" for c in GROUP_CASES])
def test_scalar_groups_match_reference(name, bits, d, group):
    """The scalar kind's table codes at group sizes other than the default."""
    lib, codec, q, keys, values, k_win, v_win = make_store(
        name, bits, batch=1, heads=2, length=150, window=1, d=d, dtype=torch.float32, seed=41)
    want = reference(lib, q, keys, values, 150, k_win, v_win)
    dev = torch.device(DEVICE)
    q_d, keys_d, values_d, kw, vw = on_device(dev, q, keys, values, k_win, v_win)
    got = tables().attention_adc(q_d, keys_d, values_d, 150, kw, vw, codec.to(dev), group=group)
    err, floor = rel(got, want)
    assert err <= 1e-4 + floor, f"relative RMS error {err:.2e}"


LAYOUTS = {
    # (codec, bits, d): (table codes a key, bits a code, entries a code, C_rho folded, coordinates a code,
    # angle levels a code)
    ("turboquant-mse", 2, 128): (43, 6, 64, True, 3, 0),
    ("turboquant-qjl", 2, 64): (11, 6, 64, True, 6, 0),
    ("turboquant-mse", 3, 64): (32, 6, 64, True, 2, 0),
    ("turboquant-mse", 4, 128): (128, 4, 16, True, 1, 0),
    ("octopus", 2, 128): (43, 7, 128, True, 0, 0),
    ("polarquant", 1, 64): (16, 3, 8, True, 0, 2),  # 3 levels would take 7 bits
    ("polarquant", 2, 128): (32, 6, 64, True, 0, 2),
    ("polarquant", 3, 64): (32, 3, 8, True, 0, 1),
}


def test_table_layouts():
    """Default table codes: triplets as coded; scalar groups of the most coordinates within 6 bits; polar
    subtrees of the most bottom levels whose angle codes fit in 6 bits."""
    got = {}
    for name, bits, d in LAYOUTS:
        kc = make_store(name, bits, batch=1, heads=1, length=1, window=0, d=d, dtype=torch.float32)[1]
        lay = kc.kind.score_tables.layout(kc)
        got[name, bits, d] = (lay.codes, lay.bits, lay.entries, lay.fold_rho, lay.group, lay.levels)
    assert got == LAYOUTS


CAPS = {
    # (codec, bits, d): whether the H200 launch (d=128: 256 / 64 keys a step, 8 warps) runs under the cap
    ("octopus", 2, 128): True,
    ("octopus-qjl", 2, 128): True,  # C_rho folded into the table
    ("octopus-qjl", 3, 128): False,  # C_rho looked up: spills under the cap
    ("turboquant-mse", 2, 128): True,
    ("turboquant-qjl", 2, 128): True,
    ("turboquant-qjl", 6, 128): True,  # 20 code words + 2 x 4 sign words
    ("turboquant-qjl", 7, 128): False,  # 24 + 2 x 4: spills under the cap
    ("turboquant-mse", 7, 128): True,  # 28 code words
    ("turboquant-mse", 8, 128): False,  # 32 code words
    ("polarquant", 2, 128): False,  # not compiled under it yet
}


def test_register_cap():
    """MAX_REGISTERS where the sm_90 compile of the key loop fits under it (its comment's measurements)."""
    st = tables()
    got = {}
    for name, bits, d in CAPS:
        _, kc, _, _, values, _, _ = make_store(name, bits, batch=1, heads=1, length=1, window=0, d=d,
                                               dtype=torch.float32)
        _, options = st.attention_constants(kc, kc.kind.score_tables.layout(kc), values, 1, 256, 64, 8)
        got[name, bits, d] = options.get("maxnreg") == st.MAX_REGISTERS
    assert got == CAPS


def test_refuses_codes_it_cannot_look_up():
    """turboquant-qjl at b=1 has no codes (the flash kernel serves it); group sizes are the scalar kind's and
    keep a table code's entries within MAX_ENTRIES."""
    st = tables()
    _, qjl1, *_ = make_store("turboquant-qjl", 1, batch=1, heads=1, length=1, window=0, d=64,
                             dtype=torch.float32)
    assert "nothing to look up" in st.adc_limit(qjl1, 1)
    _, mse2, *_ = make_store("turboquant-mse", 2, batch=1, heads=1, length=1, window=0, d=64,
                             dtype=torch.float32)
    assert st.adc_limit(mse2, 1) is None
    assert "at most 4096" in st.adc_limit(mse2, 1, group=7)
    assert "positive" in st.adc_limit(mse2, 1, group=0)
    _, oct2, q, keys, values, k_win, v_win = make_store("octopus", 2, batch=1, heads=1, length=8, window=1,
                                                        d=64, dtype=torch.float32)
    with pytest.raises(ValueError, match="a kind that groups them: scalar"):
        st.attention_adc(q, keys, values, 8, k_win, v_win, oct2, group=2)


def test_large_scores_stay_exact():
    """Scores spread over hundreds of log2 units (many blocks): the two-pass softmax stays exact."""
    lib, codec, q, keys, values, k_win, v_win = make_store(
        "octopus", 2, batch=1, heads=1, length=400, window=1, d=64, dtype=torch.float32, seed=3)
    q = q * 400.0
    want = reference(lib, q, keys, values, 400, k_win, v_win)
    dev = torch.device(DEVICE)
    q_d, keys_d, values_d, kw, vw = on_device(dev, q, keys, values, k_win, v_win)
    got = tables().attention_adc(q_d, keys_d, values_d, 400, kw, vw, codec.to(dev), num_splits=1, block_k=16,
                                  block_v=16)
    err, floor = rel(got, want)
    assert err <= 1e-4 + floor, f"relative RMS error {err:.2e}"


def test_refuses_block_queries():
    lib, codec, q, keys, values, k_win, v_win = make_store(
        "octopus", 2, batch=1, heads=1, length=8, window=1, d=64, dtype=torch.float32)
    with pytest.raises(ValueError, match="query rows"):
        tables().attention_adc(torch.cat([q, q], 2), keys, values, 8, k_win, v_win, codec)


def test_refuses_an_unknown_pipeline_depth():
    lib, codec, q, keys, values, k_win, v_win = make_store(
        "octopus", 2, batch=1, heads=1, length=8, window=1, d=64, dtype=torch.float32)
    with pytest.raises(ValueError, match="value_stages=1: one of 0"):
        tables().attention_adc(q, keys, values, 8, k_win, v_win, codec, value_stages=1)


def test_many_splits_merge_in_steps():
    """107 splits (16 keys each), more than one merge step holds (64): the merge loops over them."""
    lib, codec, q, keys, values, k_win, v_win = make_store(
        "octopus", 2, batch=1, heads=1, length=1700, window=1, d=64, dtype=torch.float32, seed=5)
    want = reference(lib, q, keys, values, 1700, k_win, v_win)
    dev = torch.device(DEVICE)
    q_d, keys_d, values_d, kw, vw = on_device(dev, q, keys, values, k_win, v_win)
    got = tables().attention_adc(q_d, keys_d, values_d, 1700, kw, vw, codec.to(dev), num_splits=200,
                                  block_k=16, block_v=16)
    err, floor = rel(got, want)
    assert err <= 1e-4 + floor, f"relative RMS error {err:.2e}"


VALUE_CASES = [
    # value bits, d, length, splits, extreme fp16 scales/minima, keys per value step (two groups a thread row
    # where a step has a row for every thread: 64 keys at d >= 64; one group at 16 keys)
    (8, 64, 70, None, False, 64),
    (1, 64, 33, 2, False, 16),
    (1, 64, 45, None, False, 64),
    (2, 128, 90, None, True, 64),
    (4, 64, 61, None, True, 16),
    (4, 32, 20, None, False, 64),
    (3, 128, 77, None, True, 64),  # 3 bits: pairs of groups cut as a 3-word stream
    (5, 64, 40, 2, False, 64),
    (7, 32, 30, None, False, 64),
]


@pytest.mark.parametrize("value_stages", [0, 3], ids=["double-buffer", "pipelined3"])
@pytest.mark.parametrize("vbits,d,length,splits,extreme,block_v", VALUE_CASES,
                         ids=[f"v{c[0]}-d{c[1]}-L{c[2]}-s{c[3]}-bv{c[5]}{'-extreme' if c[4] else ''}"
                              for c in VALUE_CASES])
def test_value_widths_match_reference(vbits, d, length, splits, extreme, block_v, value_stages):
    """The group-16 value loop at value widths the codec does not pair with its keys (1, 5, 7, 8 bits), one
    and two groups a thread row, and fp16 scales from the smallest subnormal (2^-24) to 65504 with minima
    near +-65504: the in-place loop's subnormal products and power-of-two column scales stay exact over that
    range."""
    lib, codec, q, keys, values, k_win, v_win = make_store(
        "octopus", 2, batch=1, heads=2, length=length, window=1, d=d, dtype=torch.float32, seed=11)
    g = torch.Generator().manual_seed(12)
    shape = values.scale.shape
    codes = torch.randint(-2**31, 2**31, (*shape[:3], -(-d * vbits // 32)), generator=g, dtype=torch.int64)
    scale, minimum = values.scale, values.minimum
    if extreme:
        pick = torch.randint(0, 4, shape, generator=g)
        scale = torch.tensor([2.0**-24, 6.1e-5, 1.0, 65504.0])[pick].half()
        minimum = (torch.rand(shape, generator=g) * 2 - 1) * torch.tensor([1e-7, 1.0, 300.0, 65000.0])[pick]
        minimum = minimum.half()
    values = PackedValues(codes.to(torch.int32), scale, minimum, vbits)
    want = reference(lib, q, keys, values, length, k_win, v_win, None)
    dev = torch.device(DEVICE)
    q_d, keys_d, values_d, kw, vw = on_device(dev, q, keys, values, k_win, v_win)
    got = tables().attention_adc(q_d, keys_d, values_d, length, kw, vw, codec.to(dev), num_splits=splits,
                                  block_v=block_v, value_stages=value_stages)
    err, floor = rel(got, want)
    assert err <= 1e-4 + floor, f"relative RMS error {err:.2e}"


STAGE_CASES = [
    # length, splits, query scale (400: scores hundreds of log2 units apart)
    (2100, 1, 400.0),
    (1300, None, 1.0),
]


@pytest.mark.parametrize("value_stages", [0, 3], ids=["double-buffer", "pipelined3"])
@pytest.mark.parametrize("length,splits,qscale", STAGE_CASES,
                         ids=[f"L{c[0]}-s{c[1]}-q{c[2]:g}" for c in STAGE_CASES])
def test_stages_carry_the_maximum(length, splits, qscale, value_stages):
    """The value loop scores STAGE_KEYS keys at a time and rescales its accumulators when the maximum grows
    (with spread scores, from one stage to the next)."""
    lib, codec, q, keys, values, k_win, v_win = make_store(
        "octopus", 2, batch=1, heads=2, length=length, window=1, d=64, dtype=torch.float32, seed=21)
    q = q * qscale
    want = reference(lib, q, keys, values, length, k_win, v_win)
    dev = torch.device(DEVICE)
    q_d, keys_d, values_d, kw, vw = on_device(dev, q, keys, values, k_win, v_win)
    got = tables().attention_adc(q_d, keys_d, values_d, length, kw, vw, codec.to(dev), num_splits=splits,
                                  value_stages=value_stages)
    err, floor = rel(got, want)
    assert err <= 1e-4 + floor, f"relative RMS error {err:.2e}"


@pytest.mark.parametrize("d,bits,words", [(64, 2, 5), (128, 2, 10), (128, 3, 14), (64, 3, 7)],
                         ids=["d64-b2-5words-single", "d128-b2-10words-pairs", "d128-b3-14words-pairs",
                              "d64-b3-7words-single"])
def test_code_words_singly_and_in_pairs(d, bits, words):
    """Key code words are loaded two at a time where a key has an even number of them, else one at a time."""
    lib, codec, q, keys, values, k_win, v_win = make_store(
        "octopus", bits, batch=1, heads=2, length=70, window=1, d=d, dtype=torch.float32, seed=31)
    assert codec.code_words == words
    want = reference(lib, q, keys, values, 70, k_win, v_win)
    dev = torch.device(DEVICE)
    q_d, keys_d, values_d, kw, vw = on_device(dev, q, keys, values, k_win, v_win)
    got = tables().attention_adc(q_d, keys_d, values_d, 70, kw, vw, codec.to(dev))
    err, floor = rel(got, want)
    assert err <= 1e-4 + floor, f"relative RMS error {err:.2e}"
