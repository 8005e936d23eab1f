"""Fused attention over the compressed store + native window vs decode-then-softmax with the codec library.

Runs the Triton kernels on the CPU under TRITON_INTERPRET=1 (set at import, before triton.jit decorates the
kernels; `kernel_ops` re-imports them if another test imported them first). With
OCTOPUS_AUDIO_TEST_DEVICE=cuda it runs the compiled kernels on the GPU instead (same assertions).
"""

import math
import os

DEVICE = os.environ.get("OCTOPUS_AUDIO_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import decoded_attention, kernel_ops  # noqa: E402

from octopus_audio.cache import CompressedKVCache, kernel_codec, kernel_limit  # noqa: E402
from octopus_audio.codecs import get_codec  # noqa: E402
from octopus_audio.codecs.base import KeyState  # noqa: E402
from octopus_audio.kernels import AttnConfig, PackedKeys, PackedValues  # noqa: E402
from octopus_audio.values import ValueQuantizer, ValueState  # noqa: E402

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-3, torch.float16: 5e-4}


def assert_close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    """Relative RMS error of `got` against the float64 reference `want` within tol, beyond the error that
    rounding `want` to got's dtype makes by itself (bf16 outputs alone sit near 2e-3 of the exact result)."""
    floor = ((want.to(got.dtype).double() - want.double()).norm() / want.double().norm()).item()
    got, want = got.double().cpu(), want.double().cpu()
    rel = ((got - want).norm() / want.norm()).item()
    assert rel <= tol + floor, (f"relative RMS error {rel:.2e} > {tol:.0e} + rounding floor {floor:.1e} "
                                f"(max abs {(got - want).abs().max().item():.2e})")


def make_case(name, bits, *, tq, length, window, d, groups, dtype, heads=1, seed=0):
    """Random q, a store of random packed codes (capacity length + 3; any bit pattern is a valid code) and a
    native window; returns the library codec and quantizer that decode the store."""
    g = torch.Generator().manual_seed(seed)
    codec = get_codec(name, bits, d, seed=seed + 1)
    quant = ValueQuantizer(bits, d)
    cap = length + 3

    def words(n):
        words = torch.randint(-2**31, 2**31, (1, heads, cap, n), generator=g, dtype=torch.int64)
        return words.to(torch.int32)

    def positive(scale, dtype_):
        return (torch.rand(1, heads, cap, generator=g) * scale + 0.1 * scale).to(dtype_)

    ks = KeyState(dtype=dtype, codes=words(codec.code_words), gamma=positive(math.sqrt(d), torch.bfloat16),
                  signs=words(-(-d // 32)) if codec.qjl else None,
                  gamma_r=positive(0.3, torch.bfloat16) if codec.qjl else None)
    vs = ValueState(dtype=dtype, codes=words(-(-d * bits // 32)),
                    scale=(torch.rand(1, heads, cap, d // 16, generator=g) / 2**bits).half(),
                    minimum=(torch.randn(1, heads, cap, d // 16, generator=g) - 0.5).half())
    q = (torch.randn(1, heads * groups, tq, d, generator=g) * 2 / math.sqrt(d)).to(dtype)
    k_win = torch.randn(1, heads, window, d, generator=g).to(dtype)
    v_win = torch.randn(1, heads, window, d, generator=g).to(dtype)
    keys = PackedKeys(ks.codes, ks.gamma, ks.signs, ks.gamma_r)
    values = PackedValues(vs.codes, vs.scale, vs.minimum, bits)
    return codec, quant, q, keys, values, ks, vs, k_win, v_win


def _to(device, *tensors):
    return [None if t is None else t.to(device) for t in tensors]


# query block, store length, window tokens, head dim, GQA ratio, dtype, forced split count
SHAPES = {
    "q1-L2000-w1-d64-g1-fp32": (1, 2000, 1, 64, 1, torch.float32, None),
    "q33-L0-w1-d128-g4-bf16": (33, 0, 1, 128, 4, torch.bfloat16, None),
    "q75-L1-w0-d64-g4-fp32": (75, 1, 0, 64, 4, torch.float32, None),
    "q128-L455-w1-d128-g1-bf16": (128, 455, 1, 128, 1, torch.bfloat16, None),
    "q1-L2000-w0-d128-g4-fp32-split3": (1, 2000, 0, 128, 4, torch.float32, 3),
    "q75-L455-w7-d64-g1-bf16-split2": (75, 455, 7, 64, 1, torch.bfloat16, 2),
}
CODEC_BITS = [(n, b) for n in ("turboquant-mse", "turboquant-qjl", "polarquant", "octopus", "octopus-qjl")
              for b in (2, 3, 4)]
# each codec x bits gets two shapes, rotating so every codec meets every shape
CASES = [(n, b, shape) for i, (n, b) in enumerate(CODEC_BITS)
         for shape in (list(SHAPES)[(2 * i) % 6], list(SHAPES)[(2 * i + 1) % 6])]


@pytest.mark.parametrize("name,bits,shape", CASES, ids=[f"{n}-b{b}-{s}" for n, b, s in CASES])
def test_attention_matches_decoded_reference(name, bits, shape):
    tq, length, window, d, groups, dtype, splits = SHAPES[shape]
    codec, quant, q, keys, values, ks, vs, k_win, v_win = make_case(
        name, bits, tq=tq, length=length, window=window, d=d, groups=groups, dtype=dtype, seed=bits,
        heads=2 if length <= 1 else 1)
    scale = 0.7 / math.sqrt(d)
    want = decoded_attention(codec, q, keys, values, length, k_win, v_win, scale)
    kc = kernel_codec(codec, keys.codes.shape[1], DEVICE)
    keys = PackedKeys(*_to(DEVICE, keys.codes, keys.gamma, keys.signs, keys.gamma_r))
    values = PackedValues(*_to(DEVICE, values.codes, values.scale, values.minimum), bits)
    q_d, kw, vw = _to(DEVICE, q, k_win, v_win)
    got = kernel_ops(DEVICE).attention(q_d, keys, values, length, kw, vw, kc, scale=scale, num_splits=splits)
    assert got.dtype == dtype and got.shape == q.shape
    assert_close(got, want, TOL[dtype])


# octopus bits, queries, window: the direction decode follows the code width (folded rows at b=3, unfolded in
# registers at b=4), one query row with a window too wide for score tables runs without tensor cores, a block
# of rows with them, and one row with a short window through the score tables
LAUNCHES = {"folded-single-row": (3, 1, 70), "folded-tensor-cores": (3, 16, 1), "score-tables-b3": (3, 1, 1),
            "unfold-single-row": (4, 1, 70), "unfold-tensor-cores": (4, 16, 1), "score-tables-b4": (4, 1, 1)}


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_octopus_direction_decodes_agree(launch):
    """The octopus direction decodes (in-register unfold, folded C_rho * D rows, score tables) and both
    flash launch paths (one row without tensor cores; a tensor-core block) match the library."""
    bits, tq, window = LAUNCHES[launch]
    codec, quant, q, keys, values, ks, vs, k_win, v_win = make_case(
        "octopus", bits, tq=tq, length=200, window=window, d=64, groups=1, dtype=torch.float32, heads=2)
    want = decoded_attention(codec, q, keys, values, 200, k_win, v_win, 1 / 8)
    kc = kernel_codec(codec, 2, DEVICE)
    keys = PackedKeys(*_to(DEVICE, keys.codes, keys.gamma, None, None))
    values = PackedValues(*_to(DEVICE, values.codes, values.scale, values.minimum), bits)
    got = kernel_ops(DEVICE).attention(*_to(DEVICE, q), keys, values, 200, *_to(DEVICE, k_win, v_win), kc,
                                       config=AttnConfig(block_n=32))
    assert_close(got, want, TOL[torch.float32])


# one query row of a scalar or polar codec (turboquant-*, polarquant): score tables under a short window, the
# flash kernel's single-row path past the table path's 64 window tokens (the AAR window: 75)
SINGLE_ROWS = {"mse-score-tables": ("turboquant-mse", 3, 1), "mse-flash-row": ("turboquant-mse", 3, 75),
               "qjl-score-tables": ("turboquant-qjl", 2, 1), "qjl-flash-row": ("turboquant-qjl", 2, 75),
               "polar-score-tables": ("polarquant", 2, 1), "polar-flash-row": ("polarquant", 2, 75)}


@pytest.mark.parametrize("case", list(SINGLE_ROWS))
def test_single_row_paths_agree(case):
    """attention routes one query row of turboquant-* and polarquant to the score tables or the flash kernel
    by the window, and both match the library."""
    name, bits, window = SINGLE_ROWS[case]
    codec, quant, q, keys, values, ks, vs, k_win, v_win = make_case(
        name, bits, tq=1, length=300, window=window, d=64, groups=1, dtype=torch.float32, heads=2, seed=5)
    want = decoded_attention(codec, q, keys, values, 300, k_win, v_win, 1 / 8)
    kc = kernel_codec(codec, 2, DEVICE)
    ops = kernel_ops(DEVICE)
    from octopus_audio.kernels.impls import score_tables

    assert (score_tables.adc_limit(kc, 1, window) is None) == case.endswith("score-tables")
    keys = PackedKeys(*_to(DEVICE, keys.codes, keys.gamma, keys.signs, keys.gamma_r))
    values = PackedValues(*_to(DEVICE, values.codes, values.scale, values.minimum), bits)
    got = ops.attention(*_to(DEVICE, q), keys, values, 300, *_to(DEVICE, k_win, v_win), kc, scale=1 / 8)
    assert_close(got, want, TOL[torch.float32])


# codec, bits, query dtype, config, strided q: launch configurations a user may choose
VARIANTS = {
    "octopus-bf16-m64-n32": ("octopus", 2, torch.bfloat16, AttnConfig(block_m=64, block_n=32), False),
    "octopus-fp16-m128": ("octopus", 3, torch.float16, AttnConfig(block_m=128, block_n=64), False),
    "octopus-qjl-bf16-m32-strided-q": ("octopus-qjl", 2, torch.bfloat16, AttnConfig(block_m=32, block_n=64),
                                       True),
    "turboquant-qjl-bf16-m16": ("turboquant-qjl", 3, torch.bfloat16, AttnConfig(block_m=16, block_n=64),
                                False),
    "octopus-bf16-m128-window16": ("octopus", 2, torch.bfloat16,
                                   AttnConfig(block_m=128, block_n=64, block_w=16), False),
    "octopus-qjl-fp16-m64-window32": ("octopus-qjl", 3, torch.float16,
                                      AttnConfig(block_m=64, block_n=32, block_w=32), False),
    "octopus-b4-bf16-m128-strided-q": ("octopus", 4, torch.bfloat16, AttnConfig(block_m=128, block_n=32),
                                       True),
    "octopus-bf16-two-stages": ("octopus", 2, torch.bfloat16,
                                AttnConfig(block_m=128, block_n=64, num_stages=2), False),
    "polarquant-fp32-many-splits": ("polarquant", 2, torch.float32,
                                    AttnConfig(block_m=64, block_n=32, split_min_keys=32,
                                               programs_per_sm=64), False),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_launch_variants_match_decoded_reference(variant):
    """Block sizes, pipelining stages, split counts, window steps and a strided query view (q as
    [B, T, H, d].transpose(1, 2), two query heads per KV head) all match the library at the dtype's
    tolerance, at an AAR-like block of 75 queries."""
    name, bits, dtype, config, strided = VARIANTS[variant]
    codec, quant, q, keys, values, ks, vs, k_win, v_win = make_case(
        name, bits, tq=75, length=100, window=5, d=64, groups=2, dtype=dtype, seed=7)
    want = decoded_attention(codec, q, keys, values, 100, k_win, v_win, 0.125)
    kc = kernel_codec(codec, 1, DEVICE)
    keys = PackedKeys(*_to(DEVICE, keys.codes, keys.gamma, keys.signs, keys.gamma_r))
    values = PackedValues(*_to(DEVICE, values.codes, values.scale, values.minimum), bits)
    q_d = q.to(DEVICE)
    if strided:
        q_d = q_d.transpose(1, 2).contiguous().transpose(1, 2)
        assert not q_d.is_contiguous()
    got = kernel_ops(DEVICE).attention(q_d, keys, values, 100, *_to(DEVICE, k_win, v_win), kc, scale=0.125,
                                       config=config)
    assert got.dtype == dtype
    assert_close(got, want, TOL[dtype])


# codec, bits, query dtype, rows per program: at d = 128 the d-wide score dots run as two of d/2 (the H200
# gets 128-deep bf16 dots wrong), 16-bit and fp32 queries
HALVES = {
    "turboquant-qjl-b3-bf16": ("turboquant-qjl", 3, torch.bfloat16, 32),
    "polarquant-b3-bf16": ("polarquant", 3, torch.bfloat16, 32),
    "octopus-qjl-b2-bf16": ("octopus-qjl", 2, torch.bfloat16, 16),
    "turboquant-mse-b3-fp32": ("turboquant-mse", 3, torch.float32, 32),
}


@pytest.mark.parametrize("case", list(HALVES))
def test_score_halves_match_decoded_reference(case):
    """At d = 128 the score dots run as two d/2-deep dots (polarquant's even | odd coordinates, the others'
    first | second half of the codes and QJL signs) and give the library's attention; 70 keys in 32-key
    steps leave a masked tail tile."""
    name, bits, dtype, block_m = HALVES[case]
    codec, quant, q, keys, values, ks, vs, k_win, v_win = make_case(
        name, bits, tq=20, length=70, window=2, d=128, groups=1, dtype=dtype, seed=11)
    want = decoded_attention(codec, q, keys, values, 70, k_win, v_win, 0.06)
    kc = kernel_codec(codec, 1, DEVICE)
    keys = PackedKeys(*_to(DEVICE, keys.codes, keys.gamma, keys.signs, keys.gamma_r))
    values = PackedValues(*_to(DEVICE, values.codes, values.scale, values.minimum), bits)
    got = kernel_ops(DEVICE).attention(*_to(DEVICE, q), keys, values, 70, *_to(DEVICE, k_win, v_win), kc,
                                       scale=0.06, config=AttnConfig(block_m=block_m, block_n=32))
    assert_close(got, want, TOL[dtype])


@pytest.mark.parametrize("name", ["octopus-qjl", "turboquant-qjl"])
def test_query_map_is_the_rotation_layout(name):
    """KernelCodec.query_map: q @ M_h is sqrt(d) R q (octopus: its triplet components x | y | z, zero past d)
    followed by d R' R q, computed here with the library's rotation."""
    from octopus_audio.rotation import rotate

    d, heads = 64, 2
    codec = get_codec(name, 2, d, seed=3)
    kc = kernel_codec(codec, heads, "cpu")
    q = torch.randn(1, heads, 5, d, dtype=torch.float64)
    m = kc.query_map(torch.float32).double()
    got = torch.einsum("bhtd,hdn->bhtn", q, m)
    q_rot = rotate(q.float(), codec.signs(heads, "cpu")).double()
    q_j = rotate(q_rot.float(), codec.signs(heads, "cpu", stream=1)).double()
    if name.startswith("octopus"):
        lp = kc.triplet_lanes
        trip = torch.nn.functional.pad(q_rot, (0, 3 * lp - d)).reshape(1, heads, 5, lp, 3)
        want_rot = trip.transpose(-1, -2).reshape(1, heads, 5, 3 * lp)
    else:
        want_rot = q_rot
    want = torch.cat([want_rot * d**0.5, q_j * d], -1)
    assert got.shape == want.shape
    assert_close(got, want, 1e-6)
    assert kc.query_map(torch.bfloat16).equal(m.to(torch.bfloat16))  # small integers: exact in 16 bits
    assert kc.query_map(torch.float32) is kc.query_map(torch.float32)  # cached


def test_cache_attend_runs_the_kernels(monkeypatch):
    """CompressedKVCache with the triton backend (encode + attention kernels) equals its reference path."""
    kernel_ops(DEVICE)
    torch.manual_seed(0)
    cache = CompressedKVCache("octopus", 2, 64, window=1, seed=4)
    ref = CompressedKVCache("octopus", 2, 64, window=1, seed=4)
    units = [(torch.randn(1, 2, n, 64), torch.randn(1, 2, n, 64), torch.randn(1, 4, 3, 64))
             for n in (1, 2, 4)]
    monkeypatch.setenv("OCTOPUS_AUDIO_KERNELS", "kernels")
    outs = []
    for k, v, q in units:
        cache.append(*_to(DEVICE, k, v))
        outs.append(cache.attend(q.to(DEVICE), 0.125))  # the first attends to the window only
    assert cache.backend == "triton"
    monkeypatch.setenv("OCTOPUS_AUDIO_KERNELS", "reference")
    for (k, v, q), out in zip(units, outs, strict=True):
        ref.append(k, v)
        assert_close(out, ref.attend(q, 0.125), 1e-5)
    assert torch.equal(cache.store.keys.codes.cpu(), ref.store.keys.codes)


def test_attention_rejects_bad_inputs():
    codec, quant, q, keys, values, *_ = make_case("octopus", 2, tq=2, length=0, window=0, d=64, groups=1,
                                                  dtype=torch.float32, heads=2)
    kc = kernel_codec(codec, 2, DEVICE)
    keys = PackedKeys(*_to(DEVICE, keys.codes, keys.gamma, None, None))
    values = PackedValues(*_to(DEVICE, values.codes, values.scale, values.minimum), 2)
    ops = kernel_ops(DEVICE)
    with pytest.raises(ValueError, match="at least one key"):
        ops.attention(q.to(DEVICE), keys, values, 0, None, None, kc)
    with pytest.raises(ValueError, match="KV heads"):
        ops.attention(torch.zeros(1, 3, 2, 64, device=DEVICE), keys, values, 1, None, None, kc)
    with pytest.raises(ValueError, match="capacity"):
        ops.attention(q.to(DEVICE), keys, values, 4, None, None, kc)
    bad = PackedKeys(keys.codes, keys.gamma.float())
    with pytest.raises(ValueError, match="keys.gamma"):
        ops.attention(q.to(DEVICE), bad, values, 1, None, None, kc)
    with pytest.raises(ValueError, match="block_w must be a power of two in"):
        AttnConfig(block_w=8)
    with pytest.raises(ValueError, match="num_stages must be in 1..4"):
        AttnConfig(num_stages=0)


def test_cache_attend_under_autocast_with_bf16_queries(monkeypatch):
    """The AAR fast path calls attention inside bf16 autocast: the launchers' torch math must stay fp32."""
    kernel_ops(DEVICE)
    torch.manual_seed(1)
    cache = CompressedKVCache("octopus", 2, 64, window=1, seed=5)
    monkeypatch.setenv("OCTOPUS_AUDIO_KERNELS", "kernels")
    for n in (2, 3):
        k, v = _to(DEVICE, torch.randn(1, 2, n, 64), torch.randn(1, 2, n, 64))
        cache.append(k.bfloat16(), v.bfloat16())
    q = torch.randn(1, 2, 17, 64).to(DEVICE).bfloat16()
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        out = cache.attend(q, 0.125)
    monkeypatch.setenv("OCTOPUS_AUDIO_KERNELS", "reference")
    assert out.dtype == torch.bfloat16
    assert_close(out, cache.attend(q, 0.125), TOL[torch.bfloat16])


def test_fused_attention_runs_at_every_head_dim():
    """kernel_limit lets every codec's query-block attention run fused at d = 64 and at d = 128 (the
    H200 d=128 defect is gone with 64-deep score dots); encode is unaffected."""
    for name in ("turboquant-mse", "turboquant-qjl", "polarquant", "octopus", "octopus-qjl"):
        for d in (64, 128):
            for bits in (2, 3, 4):
                codec = get_codec(name, bits, d)
                assert kernel_limit(codec, for_encode=False) is None, (name, bits, d)
    assert kernel_limit(get_codec("turboquant-mse", 2, 128)) is None


@pytest.mark.parametrize("name,bits,d,folded", [
    ("octopus", 2, 64, True), ("octopus", 3, 128, True), ("octopus-qjl", 3, 64, True),
    ("octopus", 4, 64, False), ("octopus", 4, 128, False)])
def test_directions_fold_codes_of_at_most_10_bits(name, bits, d, folded):
    """The triplet kind folds the direction rows where a key code has at most 10 bits (octopus b <= 3:
    2**10 rows of 16 bytes) and unfolds in registers at b = 4 (13-bit codes)."""
    kernel_ops(DEVICE)
    from octopus_audio.kernels.kinds import triplet

    kc = kernel_codec(get_codec(name, bits, d), 1, DEVICE)
    assert triplet.dir_table(kc) == (triplet.DIR_FOLDED if folded else triplet.DIR_UNFOLD)
    assert kc.kind is triplet.KIND and kc.kind.gathers(kc) is folded


@pytest.mark.parametrize("folded,n_rows,want_tiles", [(True, 75, False), (False, 75, True), (True, 1, True)],
                         ids=["folded-block-gathers", "unfold-block-tiles", "folded-one-row-tiles"])
def test_default_code_loads(folded, n_rows, want_tiles):
    """Query blocks over folded octopus rows gather one load per code (fastest on the H200 sweep: 0.278 vs
    0.288 ms from word tiles at B=64); everything else cuts codes from word tiles."""
    kernel_ops(DEVICE)
    from octopus_audio.kernels.impls import flash

    shape = flash._launch_shape(AttnConfig(), n_rows, 64, 380, 75, 32, torch.device(DEVICE), folded)
    assert shape[3] is want_tiles


@pytest.mark.parametrize("fp32,n_rows,want", [(False, 75, 128), (True, 75, 32), (True, 20, 32),
                                              (False, 9, 16), (True, 9, 16)],
                         ids=["bf16-75-rows", "fp32-75-rows-capped", "fp32-20-rows", "bf16-9-rows",
                              "fp32-9-rows"])
def test_block_rows(fp32, n_rows, want):
    """fp32 queries (IEEE dots, unrolled on the CUDA cores) take at most 32 rows a block: larger tiles took
    minutes to compile for sm_90; 16-bit queries take up to 128 rows at d = 64."""
    kernel_ops(DEVICE)
    from octopus_audio.kernels.impls import flash

    shape = flash._launch_shape(AttnConfig(), n_rows, 64, 380, 75, 32, torch.device(DEVICE), fp32=fp32)
    assert shape[0] == want
