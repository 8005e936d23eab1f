"""Fused attention over the compressed store + native window vs decode-then-softmax with the codec library.

Runs the Triton kernels on the CPU under TRITON_INTERPRET=1 (set at import, before triton.jit decorates the
kernels; `kernel_ops` re-imports them if another test imported them first). With
OCTOPUS_AUDIO_TEST_DEVICE=cuda it runs the compiled kernels on the GPU instead (same assertions).
"""

import dataclasses
import math
import os

DEVICE = os.environ.get("OCTOPUS_AUDIO_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import kernel_ops  # noqa: E402

from octopus_audio import backend  # noqa: E402
from octopus_audio.cache import CompressedKVCache  # noqa: E402
from octopus_audio.codecs import get_codec  # noqa: E402
from octopus_audio.codecs.base import KeyState  # noqa: E402
from octopus_audio.kernels import AttnConfig, PackedKeys, PackedValues, naive  # noqa: E402
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


def reference(codec, quant, q, ks, vs, length, k_win, v_win, scale):
    """Decode with the library, one float64 softmax over [store; window]."""
    heads = ks.codes.shape[1]
    k_all = [codec.decode(ks.slice_t(0, length), torch.float32).double(), k_win.double()]
    v_all = [quant.decode(vs.slice_t(0, length), torch.float32).double(), v_win.double()]
    k_all, v_all = torch.cat(k_all, 2), torch.cat(v_all, 2)
    grp = q.shape[1] // heads
    k_all, v_all = k_all.repeat_interleave(grp, 1), v_all.repeat_interleave(grp, 1)
    p = torch.softmax(q.double() @ k_all.mT * scale, -1)
    return p @ v_all


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
    want = reference(codec, quant, q, ks, vs, length, k_win, v_win, scale)
    kc = backend.kernel_codec(codec, keys.codes.shape[1], DEVICE)
    keys = PackedKeys(*_to(DEVICE, keys.codes, keys.gamma, keys.signs, keys.gamma_r))
    values = PackedValues(*_to(DEVICE, values.codes, values.scale, values.minimum), bits)
    q_d, kw, vw = _to(DEVICE, q, k_win, v_win)
    got = kernel_ops(DEVICE).attention(q_d, keys, values, length, kw, vw, kc, scale=scale, num_splits=splits)
    assert got.dtype == dtype and got.shape == q.shape
    assert_close(got, want, TOL[dtype])


LAUNCHES = {"table-single-row-gathers": ("table", AttnConfig(block_m=1, block_n=32, tile_words=False,
                                                             score_tables=False)),
            "unfold-tensor-cores-word-tiles": ("unfold", AttnConfig(block_m=16, block_n=32, tile_words=True,
                                                                   score_tables=False)),
            "score-tables": ("unfold", AttnConfig(block_n=64, block_v=16)),
            "folded-tensor-cores-word-tiles": ("folded", AttnConfig(block_m=16, block_n=32, tile_words=True,
                                                                    score_tables=False)),
            "folded-single-row-gathers": ("folded", AttnConfig(block_m=1, block_n=32, tile_words=False,
                                                               score_tables=False)),
            "auto-tensor-cores": ("auto", AttnConfig(block_m=32, score_tables=False))}


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_octopus_direction_decodes_agree(launch):
    """The octopus direction decodes (table lookup, in-register unfold, folded C_rho * D rows) and both
    launch paths (one row without tensor cores, gathered codes; a tensor-core block, word tiles cut in
    registers) match the library."""
    directions, config = LAUNCHES[launch]
    codec, quant, q, keys, values, ks, vs, k_win, v_win = make_case(
        "octopus", 3, tq=1, length=200, window=1, d=64, groups=1, dtype=torch.float32, heads=2)
    want = reference(codec, quant, q, ks, vs, 200, k_win, v_win, 1 / 8)
    kc = backend.kernel_codec(codec, 2, DEVICE)
    keys = PackedKeys(*_to(DEVICE, keys.codes, keys.gamma, None, None))
    values = PackedValues(*_to(DEVICE, values.codes, values.scale, values.minimum), 3)
    got = kernel_ops(DEVICE).attention(*_to(DEVICE, q), keys, values, 200, *_to(DEVICE, k_win, v_win), kc,
                                 octopus_directions=directions, config=config)
    assert_close(got, want, TOL[torch.float32])


# codec, bits, query dtype, octopus directions, config, strided q: the launch variants the GPU sweep times
VARIANTS = {
    "octopus-bf16-native-m64-n32": ("octopus", 2, torch.bfloat16, "unfold",
                                    AttnConfig(block_m=64, block_n=32, operands="native"), False),
    "octopus-fp16-native-m128-gathers": ("octopus", 3, torch.float16, "unfold",
                                         AttnConfig(block_m=128, block_n=64, tile_words=False), False),
    "octopus-qjl-bf16-table-m32-strided-q": ("octopus-qjl", 2, torch.bfloat16, "table",
                                             AttnConfig(block_m=32, block_n=64), True),
    "turboquant-qjl-bf16-tf32-m16": ("turboquant-qjl", 3, torch.bfloat16, "unfold",
                                     AttnConfig(block_m=16, block_n=64, operands="tf32"), False),
    "octopus-bf16-folded-m128-window16": ("octopus", 2, torch.bfloat16, "folded",
                                          AttnConfig(block_m=128, block_n=64, block_w=16), False),
    "octopus-qjl-fp16-folded-m64-window32": ("octopus-qjl", 3, torch.float16, "folded",
                                             AttnConfig(block_m=64, block_n=32, block_w=32), False),
    "octopus-bf16-folded-tiles-m128-strided-q": ("octopus", 2, torch.bfloat16, "folded",
                                                 AttnConfig(block_m=128, block_n=32, tile_words=True), True),
    "octopus-bf16-folded-pipelined-loops": ("octopus", 2, torch.bfloat16, "folded",
                                            AttnConfig(block_m=128, block_n=64, window_stages=3,
                                                       store_stages=2), False),
    "polarquant-fp32-ieee-many-splits": ("polarquant", 2, torch.float32, "unfold",
                                         AttnConfig(block_m=64, block_n=32, split_min_keys=32,
                                                    programs_per_sm=64), False),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_launch_variants_match_decoded_reference(variant):
    """Operand dtypes (16-bit tensor-core operands, tf32, ieee), block sizes, split counts, direction
    decodes and a strided query view (q as
    [B, T, H, d].transpose(1, 2), two query heads per KV head) all match the library at the dtype's
    tolerance, at an AAR-like block of 75 queries."""
    name, bits, dtype, directions, config, strided = VARIANTS[variant]
    codec, quant, q, keys, values, ks, vs, k_win, v_win = make_case(
        name, bits, tq=75, length=100, window=5, d=64, groups=2, dtype=dtype, seed=7)
    want = reference(codec, quant, q, ks, vs, 100, k_win, v_win, 0.125)
    kc = backend.kernel_codec(codec, 1, DEVICE)
    keys = PackedKeys(*_to(DEVICE, keys.codes, keys.gamma, keys.signs, keys.gamma_r))
    values = PackedValues(*_to(DEVICE, values.codes, values.scale, values.minimum), bits)
    q_d = q.to(DEVICE)
    if strided:
        q_d = q_d.transpose(1, 2).contiguous().transpose(1, 2)
        assert not q_d.is_contiguous()
    got = kernel_ops(DEVICE).attention(q_d, keys, values, 100, *_to(DEVICE, k_win, v_win), kc, scale=0.125,
                                       octopus_directions=directions, config=config)
    assert got.dtype == dtype
    assert_close(got, want, TOL[dtype])


# codec, bits, query dtype, config: the d = 128 score dots split in halves (the default, ops.SCORE_HALVES:
# the H200 defect's workaround) with word tiles and gathered codes, 16-bit and fp32 projections; and the
# d-wide dots (score_halves=False), which the H200 (probe_d128.py, 2026-11-30) gets wrong with bf16 operands
HALVES = {
    "turboquant-qjl-b3-bf16": ("turboquant-qjl", 3, torch.bfloat16,
                               AttnConfig(block_m=32, score_halves=True)),
    "polarquant-b3-bf16-gathers": ("polarquant", 3, torch.bfloat16,
                                   AttnConfig(block_m=32, score_halves=True, tile_words=False)),
    "octopus-qjl-b2-bf16-ieee-projection": ("octopus-qjl", 2, torch.bfloat16,
                                            AttnConfig(block_m=16, score_halves=True, projection="ieee")),
    "turboquant-mse-b3-fp32": ("turboquant-mse", 3, torch.float32, AttnConfig(block_m=32, score_halves=True)),
    "turboquant-qjl-b2-fp32-d-wide": ("turboquant-qjl", 2, torch.float32,
                                      AttnConfig(block_m=32, score_halves=False)),
    "polarquant-b3-bf16-d-wide": ("polarquant", 3, torch.bfloat16,
                                  AttnConfig(block_m=64, score_halves=False)),
}
_D_WIDE_BF16_ON_GPU = pytest.mark.xfail(
    DEVICE == "cuda", strict=False,
    reason="128-deep bf16 score dots: relative error 1.6e-2..2.5e-2 on the H200 (issue 3, probe_d128.py)")


@pytest.mark.parametrize("case", [pytest.param(c, marks=[_D_WIDE_BF16_ON_GPU] * c.endswith("bf16-d-wide"))
                                  for c in HALVES], ids=list(HALVES))
def test_score_halves_match_decoded_reference(case):
    """AttnConfig(score_halves=True) at d = 128: two d/2-deep score dots (polarquant's even | odd coordinates,
    the others' first | second half of the codes and QJL signs) give the library's attention, as do the
    d-wide dots (score_halves=False) on the CPU; 70 keys in 32-key steps leave a masked tail tile."""
    name, bits, dtype, config = HALVES[case]
    codec, quant, q, keys, values, ks, vs, k_win, v_win = make_case(
        name, bits, tq=20, length=70, window=2, d=128, groups=1, dtype=dtype, seed=11)
    want = reference(codec, quant, q, ks, vs, 70, k_win, v_win, 0.06)
    kc = backend.kernel_codec(codec, 1, DEVICE)
    keys = PackedKeys(*_to(DEVICE, keys.codes, keys.gamma, keys.signs, keys.gamma_r))
    values = PackedValues(*_to(DEVICE, values.codes, values.scale, values.minimum), bits)
    got = kernel_ops(DEVICE).attention(*_to(DEVICE, q), keys, values, 70, *_to(DEVICE, k_win, v_win), kc,
                                       scale=0.06, config=dataclasses.replace(config, block_n=32))
    assert_close(got, want, TOL[dtype])


@pytest.mark.parametrize("name", ["octopus-qjl", "turboquant-qjl"])
def test_query_map_is_the_rotation_layout(name):
    """KernelCodec.query_map: q @ M_h is sqrt(d) R q (octopus: its triplet components x | y | z, zero past d)
    followed by d R' R q, computed here with the library's rotation."""
    from octopus_audio.rotation import rotate

    d, heads = 64, 2
    codec = get_codec(name, 2, d, seed=3)
    kc = backend.kernel_codec(codec, heads, "cpu")
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


def test_naive_reference_matches_library():
    """kernels.naive (the launchers' plain-PyTorch twin) agrees with the library's decode-then-softmax."""
    codec, quant, q, keys, values, ks, vs, k_win, v_win = make_case(
        "octopus-qjl", 2, tq=3, length=50, window=2, d=64, groups=2, dtype=torch.float32, heads=2)
    kc = backend.kernel_codec(codec, 2, "cpu")
    want = reference(codec, quant, q, ks, vs, 50, k_win, v_win, 0.125)
    assert_close(naive.attention(q, keys, values, 50, k_win, v_win, kc, scale=0.125), want, 1e-5)
    enc = naive.encode_keys(torch.randn(1, 2, 9, 64), kc)
    assert enc.codes.shape == (1, 2, 9, codec.code_words) and enc.signs.shape == (1, 2, 9, 2)


def test_cache_attend_runs_the_kernels(monkeypatch):
    """CompressedKVCache with the triton backend (encode + attention kernels) equals its reference path."""
    kernel_ops(DEVICE)
    torch.manual_seed(0)
    cache = CompressedKVCache("octopus", 2, 64, window=1, seed=4)
    ref = CompressedKVCache("octopus", 2, 64, window=1, seed=4)
    units = [(torch.randn(1, 2, n, 64), torch.randn(1, 2, n, 64), torch.randn(1, 4, 3, 64))
             for n in (1, 2, 4)]
    monkeypatch.setenv("OCTOPUS_AUDIO_BACKEND", "triton")
    outs = []
    for k, v, q in units:
        cache.append(*_to(DEVICE, k, v))
        outs.append(cache.attend(q.to(DEVICE), 0.125))  # the first attends to the window only
    assert cache.backend == "triton"
    monkeypatch.setenv("OCTOPUS_AUDIO_BACKEND", "reference")
    for (k, v, q), out in zip(units, outs, strict=True):
        ref.append(k, v)
        assert_close(out, ref.attend(q, 0.125), 1e-5)
    assert torch.equal(cache.store.keys.codes.cpu(), ref.store.keys.codes)


def test_attention_rejects_bad_inputs():
    codec, quant, q, keys, values, *_ = make_case("octopus", 2, tq=2, length=0, window=0, d=64, groups=1,
                                                  dtype=torch.float32, heads=2)
    kc = backend.kernel_codec(codec, 2, DEVICE)
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
    with pytest.raises(ValueError, match="operands must be one of native, tf32, ieee"):
        AttnConfig(operands="bf16")
    with pytest.raises(ValueError, match="must be one of unfold, table, folded or auto"):
        ops.attention(q.to(DEVICE), keys, values, 1, None, None, kc, octopus_directions="rows")
    wide = backend.kernel_codec(get_codec("octopus", 4, 64, seed=1), 2, DEVICE)
    with pytest.raises(ValueError, match="at most 10 bits"):
        ops.attention(q.to(DEVICE), keys, values, 1, None, None, wide, octopus_directions="folded")
    with pytest.raises(ValueError, match="block_w must be a power of two in"):
        AttnConfig(block_w=8)
    with pytest.raises(ValueError, match="store_stages must be in 1..4"):
        AttnConfig(store_stages=0)
    with pytest.raises(ValueError, match="projection must be one of native, ieee"):
        AttnConfig(projection="tf32")
    with pytest.raises(ValueError, match="score_halves must be True, False or None"):
        AttnConfig(score_halves=2)


def test_cache_attend_under_autocast_with_bf16_queries(monkeypatch):
    """The AAR fast path calls attention inside bf16 autocast: the launchers' torch math must stay fp32."""
    kernel_ops(DEVICE)
    torch.manual_seed(1)
    cache = CompressedKVCache("octopus", 2, 64, window=1, seed=5)
    monkeypatch.setenv("OCTOPUS_AUDIO_BACKEND", "triton")
    for n in (2, 3):
        k, v = _to(DEVICE, torch.randn(1, 2, n, 64), torch.randn(1, 2, n, 64))
        cache.append(k.bfloat16(), v.bfloat16())
    q = torch.randn(1, 2, 17, 64).to(DEVICE).bfloat16()
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        out = cache.attend(q, 0.125)
    monkeypatch.setenv("OCTOPUS_AUDIO_BACKEND", "reference")
    assert out.dtype == torch.bfloat16
    assert_close(out, cache.attend(q, 0.125), TOL[torch.bfloat16])


def test_fused_attention_runs_at_every_head_dim():
    """backend.kernel_limit lets every codec's query-block attention run fused at d = 64 and at d = 128 (the
    H200 d=128 defect is gone with 64-deep score dots, ops.SCORE_HALVES); encode is unaffected."""
    for name in ("turboquant-mse", "turboquant-qjl", "polarquant", "octopus", "octopus-qjl"):
        for d in (64, 128):
            for bits in (2, 3, 4):
                codec = get_codec(name, bits, d)
                assert backend.kernel_limit(codec, for_encode=False) is None, (name, bits, d)
    assert backend.kernel_limit(get_codec("turboquant-mse", 2, 128)) is None


@pytest.mark.parametrize("name,bits,d,want", [
    ("octopus", 2, 64, "folded"), ("octopus", 3, 128, "folded"), ("octopus-qjl", 3, 64, "folded"),
    ("octopus", 4, 64, "unfold"), ("octopus", 4, 128, "unfold")])
def test_auto_directions_fold_codes_of_at_most_10_bits(name, bits, d, want):
    """The default octopus_directions ("auto") folds the direction rows where a key code has at most 10 bits
    (octopus b <= 3: 2**10 rows of 16 bytes) and unfolds in registers at b = 4 (13-bit codes)."""
    ops = kernel_ops(DEVICE)
    assert ops.OCTOPUS_DIRECTIONS == "auto"
    kc = backend.kernel_codec(get_codec(name, bits, d), 1, DEVICE)
    assert ops._directions(kc, "auto") == want


@pytest.mark.parametrize("folded,n_rows,config,want_tiles", [
    (True, 75, AttnConfig(), False), (False, 75, AttnConfig(), True), (True, 1, AttnConfig(), True),
    (True, 75, AttnConfig(tile_words=True), True), (False, 33, AttnConfig(tile_words=False), False)],
    ids=["folded-block-gathers", "unfold-block-tiles", "folded-one-row-tiles", "forced-tiles",
         "forced-gathers"])
def test_default_code_loads(folded, n_rows, config, want_tiles):
    """Query blocks over folded octopus rows gather one load per code by default (fastest on the H200 sweep
    2026-11-30); everything else cuts codes from word tiles; AttnConfig.tile_words overrides both."""
    shape = kernel_ops(DEVICE)._launch_shape(config, n_rows, 64, 380, 75, 32, torch.device(DEVICE), folded)
    assert shape[3] is want_tiles
