"""Encode kernels vs the codec library: packed keys (every codec) and group-quantized values, bit for bit.

Runs the Triton kernels on the CPU under TRITON_INTERPRET=1, which must be set before triton.jit decorates
them: this module sets it at import and re-imports the kernel modules if another test imported them first.
With OCTOPUS_AUDIO_TEST_DEVICE=cuda it runs the compiled kernels on the GPU instead (same assertions).
"""

import dataclasses
import os

DEVICE = os.environ.get("OCTOPUS_AUDIO_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from helpers import kernel_ops  # noqa: E402

from octopus_audio.cache import kernel_codec  # noqa: E402
from octopus_audio.codecs import get_codec  # noqa: E402
from octopus_audio.kernels import bits as kbits  # noqa: E402
from octopus_audio.kernels.kinds.triplet_search import row_words  # noqa: E402
from octopus_audio.kernels.launch import pack_shape  # noqa: E402
from octopus_audio.packing import pack, unpack  # noqa: E402
from octopus_audio.values import ValueQuantizer  # noqa: E402

MAX_MISMATCH = 1e-4  # indices whose input lies within fp32 rounding of a decision boundary may differ


def _keys(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(*shape, generator=g) * torch.exp(torch.randn(*shape[:-1], 1, generator=g))
    return k.to(dtype).to(DEVICE)


def _mismatch(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.cpu() != b.cpu()).float().mean().item() if a.numel() else 0.0


# codec, bits, head dim, input dtype: every codec at b in {1, 2, 3, 4}, both head dims and all dtypes covered
ENCODE_CASES = [
    ("turboquant-mse", 1, 64, torch.float32), ("turboquant-mse", 2, 128, torch.bfloat16),
    ("turboquant-mse", 3, 64, torch.float16), ("turboquant-mse", 4, 128, torch.float32),
    ("turboquant-qjl", 1, 128, torch.float32), ("turboquant-qjl", 2, 64, torch.bfloat16),
    ("turboquant-qjl", 3, 128, torch.float32), ("turboquant-qjl", 4, 64, torch.float16),
    ("polarquant", 1, 64, torch.bfloat16), ("polarquant", 2, 128, torch.float32),
    ("polarquant", 3, 64, torch.float32), ("polarquant", 4, 128, torch.bfloat16),
    ("octopus", 1, 128, torch.float16), ("octopus", 2, 64, torch.float32),
    ("octopus", 3, 128, torch.bfloat16), ("octopus", 4, 64, torch.float32),
    ("octopus-qjl", 1, 64, torch.float32), ("octopus-qjl", 2, 128, torch.float32),
    ("octopus-qjl", 3, 64, torch.bfloat16), ("octopus-qjl", 4, 128, torch.float16),
]


@pytest.mark.parametrize("name,bits,d,dtype", ENCODE_CASES,
                         ids=[f"{n}-b{b}-d{d}-{str(t)[6:]}" for n, b, d, t in ENCODE_CASES])
def test_encode_keys_matches_codec(name, bits, d, dtype):
    heads, tokens = 2, 61
    codec = get_codec(name, bits, d, seed=11)
    k = _keys((1, heads, tokens, d), dtype, seed=bits * 7 + d)
    k[0, 1, 5] = 0.0  # a zero key (gamma 0, u = 0: zero triplets in octopus)
    k[0, 0, 9] *= 1e15 if dtype != torch.float16 else 1e3  # a large norm (gamma is computed scaled)
    got = kernel_ops(DEVICE).encode_keys(k, kernel_codec(codec, heads, k.device))
    want = codec.encode(k.cpu())
    n = codec.code_bits if name.startswith("octopus") else (
        bits if name != "turboquant-qjl" else bits - 1)
    n_codes = codec.num_triplets if name.startswith("octopus") else d - (name == "polarquant")
    if n > 0:
        assert got.codes.shape == want.codes.shape and got.codes.dtype == torch.int32
        frac = _mismatch(unpack(got.codes.cpu(), n, n_codes), unpack(want.codes, n, n_codes))
        assert frac < MAX_MISMATCH, f"{frac:.2e} of the codes differ"
    assert got.gamma.dtype == torch.bfloat16 and _mismatch(got.gamma, want.gamma) < MAX_MISMATCH
    if codec.qjl:
        # the zero key's residual is the placeholder triplet repeated: R' r has exact zeros (on the decision
        # boundary of sign) that any other summation order turns into +-1e-9, so its signs are not compared
        keep = torch.ones(heads, tokens, dtype=torch.bool)
        keep[1, 5] = False
        sg, sw = unpack(got.signs.cpu(), 1, d)[0], unpack(want.signs, 1, d)[0]
        assert _mismatch(sg[keep], sw[keep]) < MAX_MISMATCH
        assert _mismatch(got.gamma_r, want.gamma_r) < MAX_MISMATCH
    else:
        assert got.signs is None and got.gamma_r is None


# every codec at both head dims through the launch a long unit gets (its kind's launch table rows and warps,
# not halved for a small launch): the GPU only, the interpreter always takes 128 rows. A launch table row that
# faults (triplet d=128 at 64 rows x 4 warps did on the H200) or mis-encodes fails here.
FULL_CASES = [(name, bits, d) for name in ("turboquant-mse", "turboquant-qjl", "polarquant", "octopus",
                                            "octopus-qjl") for d in (64, 128) for bits in (2, 3, 4)]


@pytest.mark.skipif(DEVICE == "cpu", reason="compiled launches: set OCTOPUS_AUDIO_TEST_DEVICE=cuda")
@pytest.mark.parametrize("name,bits,d", FULL_CASES, ids=[f"{n}-b{b}-d{d}" for n, b, d in FULL_CASES])
def test_full_size_launches_match_codec(name, bits, d):
    from octopus_audio.kernels.impls.encode import _encode_launch
    from octopus_audio.kernels.launch import _sm_count

    ops = kernel_ops(DEVICE)
    heads = 2
    lib = get_codec(name, bits, d, seed=5)
    kc = kernel_codec(lib, heads, DEVICE)
    rows = _encode_launch(d, None, kc)[0]
    tokens = _sm_count(torch.device(DEVICE)) * rows + 5  # 2 x SMs programs and a partial one: not halved
    assert _encode_launch(d, None, kc, heads * tokens, torch.device(DEVICE))[0] == rows
    k, v = _qkv_views(1, tokens, heads, d, torch.bfloat16, seed=bits + d)
    got = ops.encode_keys(k.contiguous(), kc)
    want = lib.encode(k.cpu())
    n, n_codes = kc.code_bits, kc.num_codes
    if n > 0:
        frac = _mismatch(unpack(got.codes.cpu(), n, n_codes), unpack(want.codes, n, n_codes))
        assert frac < MAX_MISMATCH, f"{frac:.2e} of the codes differ"
    assert _mismatch(got.gamma, want.gamma) < MAX_MISMATCH
    keys, values = _store(kc, 1, heads, tokens, d, bits, 16)
    ops.encode_unit(k, v, kc, keys, values, 0)
    same = ops.encode_keys(k.contiguous(), kc, gluon=False)  # the key kernel the unit encode runs
    for field, t in _fields(keys, values).items():
        if field in ("codes", "gamma", "signs", "gamma_r") and t is not None:
            assert torch.equal(t.cpu(), getattr(same, field).cpu()), f"the unit encode's {field}"


# octopus search paths beyond the default split's b <= 4: whole 3x3 rows (b_dir 6, 7: no half-cell pruning),
# rho indices by lookup (b_rho 4, 5) and by compares where no lookup table exists (b_rho 8 at d=64; 14-bit
# codes packed by period sums); odd token counts
SEARCH_CASES = [("octopus", 5, {}, 64, 37, torch.bfloat16), ("octopus-qjl", 5, {}, 128, 19, torch.float32),
                ("octopus", 5, {"dir_bits": 7, "rho_bits": 2}, 64, 23, torch.float16),
                ("octopus", 3, {"dir_bits": 3, "rho_bits": 8}, 64, 41, torch.float32),
                ("octopus-qjl", 3, {"dir_bits": 3, "rho_bits": 8}, 64, 29, torch.bfloat16)]


@pytest.mark.parametrize("name,bits,opts,d,tokens,dtype", SEARCH_CASES,
                         ids=[f"{n}-b{b}{''.join(f'-{k}{v}' for k, v in o.items())}-d{d}-t{t}-{str(x)[6:]}"
                              for n, b, o, d, t, x in SEARCH_CASES])
def test_octopus_search_paths_match_codec(name, bits, opts, d, tokens, dtype):
    heads = 2
    codec = get_codec(name, bits, d, seed=13, **opts)
    k = _keys((1, heads, tokens, d), dtype, seed=bits * 3 + d + tokens)
    k[0, 0, 2] = 0.0
    got = kernel_ops(DEVICE).encode_keys(k, kernel_codec(codec, heads, k.device))
    want = codec.encode(k.cpu())
    n, n_codes = codec.code_bits, codec.num_triplets
    frac = _mismatch(unpack(got.codes.cpu(), n, n_codes), unpack(want.codes, n, n_codes))
    assert frac < MAX_MISMATCH, f"{frac:.2e} of the codes differ"
    if codec.qjl:
        keep = torch.ones(heads, tokens, dtype=torch.bool)
        keep[0, 2] = False  # the zero key's signs (see test_encode_keys_matches_codec)
        sg, sw = unpack(got.signs.cpu(), 1, d)[0], unpack(want.signs, 1, d)[0]
        assert _mismatch(sg[keep], sw[keep]) < MAX_MISMATCH
        assert _mismatch(got.gamma_r, want.gamma_r) < MAX_MISMATCH


# T a multiple of the rows per program (128 under the interpreter): every block lies in one head, whose
# rotation signs the kernel reads once (encode_keys passes ALIGNED)
ALIGNED_CASES = [("octopus", 2, 64, torch.bfloat16), ("polarquant", 3, 64, torch.float32),
                 ("turboquant-qjl", 3, 64, torch.float16)]


@pytest.mark.parametrize("name,bits,d,dtype", ALIGNED_CASES,
                         ids=[f"{n}-b{b}-d{d}-{str(t)[6:]}" for n, b, d, t in ALIGNED_CASES])
def test_encode_keys_aligned_blocks_match_codec(name, bits, d, dtype):
    heads, tokens = 2, 128
    codec = get_codec(name, bits, d, seed=5)
    k = _keys((1, heads, tokens, d), dtype, seed=bits + 100)
    got = kernel_ops(DEVICE).encode_keys(k, kernel_codec(codec, heads, k.device))
    want = codec.encode(k.cpu())
    for field in ("codes", "gamma", "signs", "gamma_r"):
        a, b = getattr(got, field), getattr(want, field)
        assert (a is None) == (b is None), field
        if a is not None:
            assert _mismatch(a, b) == 0.0, field


def test_padded_tokens():
    from octopus_audio.kernels.impls.encode import PAD_MIN_BLOCKS, padded_tokens

    assert padded_tokens(128, 64) == 128 and padded_tokens(0, 64) == 0
    assert padded_tokens(PAD_MIN_BLOCKS * 64 - 1, 64) is None  # too few blocks: rows without gaps
    assert padded_tokens(PAD_MIN_BLOCKS * 64 + 1, 64) == PAD_MIN_BLOCKS * 64 + 64


@pytest.mark.parametrize("name,bits,d,key_cap,unit_cap", [
    ("turboquant-mse", 4, 64, None, None),  # no cap anywhere
    ("turboquant-qjl", 2, 64, 96, 96),  # the key launch's cap, the unit encode takes it
    ("octopus", 2, 64, None, 112),  # the unit encode's own cap (unit_caps), the key launch runs uncapped
    ("polarquant", 3, 128, 128, 128),  # d=128 takes its own rows
    ("turboquant-qjl", 3, 128, 168, 168),  # ... and its own width entries
    ("turboquant-qjl", 5, 128, None, None),  # a width without one keeps the row's launch
    ("octopus-qjl", 2, 128, None, None),
], ids=["uncapped", "key-cap", "unit-cap", "d128-cap", "d128-width-cap", "d128-row", "d128-uncapped"])
def test_register_caps_per_launch(name, bits, d, key_cap, unit_cap):
    """encode_keys' launch takes its kind's `launch_bits` cap, encode_unit's its `unit_caps` entry where it
    has one (else the key launch's); a caller's EncodeConfig that sets rows or warps drops both (they would
    not fit the cap), one that sets neither keeps them."""
    kernel_ops(DEVICE)
    from octopus_audio.kernels import EncodeConfig
    from octopus_audio.kernels.impls.encode import _encode_launch, _unit_constants

    kc = kernel_codec(get_codec(name, bits, d), 2, "cpu")
    assert _encode_launch(d, None, kc)[1].get("maxnreg") == key_cap
    assert _unit_constants(kc, 2, 16, True, None, 4096, torch.device("cpu"))[2].get("maxnreg") == unit_cap
    cfg = EncodeConfig(block_t=32, num_warps=2)
    assert "maxnreg" not in _encode_launch(d, cfg, kc)[1]
    assert "maxnreg" not in _unit_constants(kc, 2, 16, True, cfg, 4096, torch.device("cpu"))[2]
    staged = EncodeConfig(num_stages=2)  # leaves rows and warps to the table: its caps stay
    assert _encode_launch(d, staged, kc)[1].get("maxnreg") == key_cap
    assert _unit_constants(kc, 2, 16, True, staged, 4096, torch.device("cpu"))[2].get("maxnreg") == unit_cap


# T not a multiple of any block (131): each head's tokens padded to whole blocks (PAD_MIN_BLOCKS lowered so a
# small T takes that path); every codec and kind, both head dims
PADDED_CASES = [("octopus", 2, 64, torch.bfloat16), ("octopus-qjl", 3, 64, torch.float32),
                ("polarquant", 2, 64, torch.float16), ("turboquant-qjl", 2, 64, torch.bfloat16),
                ("turboquant-mse", 3, 128, torch.float32)]


def _pad_every_unit(monkeypatch):
    import sys

    kernel_ops(DEVICE)  # (re)loads the kernel modules first on the CPU
    monkeypatch.setattr(sys.modules["octopus_audio.kernels.impls.encode"], "PAD_MIN_BLOCKS", 1)


@pytest.mark.parametrize("name,bits,d,dtype", PADDED_CASES,
                         ids=[f"{n}-b{b}-d{d}-{str(t)[6:]}" for n, b, d, t in PADDED_CASES])
def test_encode_keys_padded_heads_match_codec(name, bits, d, dtype, monkeypatch):
    _pad_every_unit(monkeypatch)
    heads, tokens = 2, 131
    codec = get_codec(name, bits, d, seed=6)
    k = _keys((2, heads, tokens, d), dtype, seed=bits + 200)
    k[1, 1, 130] = 0.0  # a zero key in the last, padded block
    got = kernel_ops(DEVICE).encode_keys(k, kernel_codec(codec, heads, k.device), gluon=False)
    want = codec.encode(k.cpu())
    for field in ("codes", "gamma", "signs", "gamma_r"):
        a, b = getattr(got, field), getattr(want, field)
        assert (a is None) == (b is None), field
        if a is not None:
            assert a.shape == b.shape and _mismatch(a, b) < MAX_MISMATCH, field


@pytest.mark.parametrize("name,bits,d,dtype", PADDED_CASES[:3],
                         ids=[f"{n}-b{b}-d{d}-{str(t)[6:]}" for n, b, d, t in PADDED_CASES[:3]])
def test_encode_unit_padded_heads_write_what_encode_keys_returns(name, bits, d, dtype, monkeypatch):
    """Strided keys of T = 131 into a store at an offset: padded heads, nothing written outside the unit."""
    _pad_every_unit(monkeypatch)
    ops = kernel_ops(DEVICE)
    b, h, t, cap, offset = 2, 2, 131, 140, 6
    kc = kernel_codec(get_codec(name, bits, d, seed=3), h, DEVICE)
    k, v = _qkv_views(b, t, h, d, dtype, seed=bits + d + 1)
    keys, values = _store(kc, b, h, cap, d, 2, 16)
    ops.encode_unit(k, v, kc, keys, values, offset)
    want = ops.encode_keys(k.contiguous(), kc, gluon=False)
    for field in ("codes", "gamma", "signs", "gamma_r"):
        got = getattr(keys, field)
        if got is None:
            continue
        assert torch.equal(got[:, :, offset:offset + t].cpu(), getattr(want, field).cpu()), field
        rest = torch.cat((got[:, :, :offset], got[:, :, offset + t:]), 2)
        assert bool((rest == _SENTINEL[got.dtype]).all()), f"{field} written outside the unit's tokens"


TIE_CASES = [("polarquant", 2, torch.bfloat16), ("polarquant", 3, torch.float32),
             ("polarquant", 4, torch.bfloat16), ("octopus", 2, torch.bfloat16),
             ("octopus-qjl", 4, torch.float16)]
SPARSE_KEYS = [(0, None, 0), (0, 1, 1), (0, 1, -1), (3, 17, 1), (5, 40, -1), (63, 62, 1)]  # (i, j, sign of j)


@pytest.mark.parametrize("name,bits,dtype", TIE_CASES,
                         ids=[f"{n}-b{b}-{str(t)[6:]}" for n, b, t in TIE_CASES])
def test_encode_keys_exact_ties_match_codec(name, bits, dtype):
    """Keys of one or two equal nonzero channels rotate to coordinates of equal magnitude or zero: polar
    angles exactly on an axis or a diagonal (on a boundary; the reference's atan2 decides), octopus triplets
    with mirror-image candidates of equal score. The kernel must decide them as the reference does."""
    d, heads = 64, 2
    k = torch.zeros(1, heads, 24, d)
    for t, (i, j, sj) in enumerate(SPARSE_KEYS):
        k[0, :, t, i] = 2.0 ** (t - 3)
        if j is not None:
            k[0, :, t, j] = sj * 2.0 ** (t - 3)
    k[0, :, 6:] = torch.randn(heads, 18, d, generator=torch.Generator().manual_seed(bits))
    k = k.to(dtype).to(DEVICE)
    codec = get_codec(name, bits, d, seed=4)
    got = kernel_ops(DEVICE).encode_keys(k, kernel_codec(codec, heads, k.device))
    want = codec.encode(k.cpu())
    _assert_identical(got, want)


def _assert_identical(got, want) -> None:
    """Every packed key field the kernel wrote equals the codec's, bit for bit."""
    for field in ("codes", "gamma", "signs", "gamma_r"):
        a, b = getattr(got, field), getattr(want, field)
        if a is not None:
            assert _mismatch(a, b) == 0.0, field


EXACT_CASES = [("octopus", 3, 64, torch.bfloat16), ("octopus-qjl", 2, 128, torch.float32),
               ("octopus", 5, 64, torch.float16)]


@pytest.mark.parametrize("name,bits,d,dtype", EXACT_CASES,
                         ids=[f"{n}-b{b}-d{d}-{str(t)[6:]}" for n, b, d, t in EXACT_CASES])
def test_octopus_near_tie_redecision_matches_codec(name, bits, d, dtype, monkeypatch):
    """With every score pair counted as a near tie, every row group takes the reference-arithmetic path of
    local3x3 (`_octopus_exact`, otherwise rare): it must give the reference's codes too. The first launch
    searches a corrupted candidate table (every slot of every region direction 0), so a group the second
    launch skips keeps wrong codes; 46 groups of 16 rows: three programs of REDO_GROUPS, the last partly past
    the end."""
    kernel_ops(DEVICE)
    from octopus_audio.kernels.kinds import triplet, triplet_rounding

    monkeypatch.setattr(triplet_rounding, "NEAR", tl.constexpr(1.0))
    search = triplet.triplet_search

    def corrupted(codec):  # every region's candidates: direction 0 (zero words)
        tables = search(codec)
        table = tables.table.clone()
        table[: tables.regions**2 * row_words(tables.k, tables.b_dir)] = 0.0
        return dataclasses.replace(tables, table=table)

    monkeypatch.setattr(triplet, "triplet_search", corrupted)
    heads, tokens = 2, 365
    codec = get_codec(name, bits, d, seed=2)
    k = _keys((1, heads, tokens, d), dtype, seed=bits + 200)
    k[0, 0, 3] = 0.0
    got = kernel_ops(DEVICE).encode_keys(k, kernel_codec(codec, heads, k.device))
    want = codec.encode(k.cpu())
    _assert_identical(got, want)


def test_fused_unit_near_tie_redecision_matches_codec(monkeypatch):
    """The fused unit kernel re-decides near ties inside its one launch (EXACT 0): with every score pair a
    near tie, its keys must still be the reference's."""
    kernel_ops(DEVICE)
    from octopus_audio.kernels.kinds import triplet_rounding

    monkeypatch.setattr(triplet_rounding, "NEAR", tl.constexpr(1.0))
    b, h, t, d = 1, 2, 9, 64
    kc = kernel_codec(get_codec("octopus", 3, d, seed=8), h, DEVICE)
    k, v = _qkv_views(b, t, h, d, torch.bfloat16, seed=9)
    keys, values = _store(kc, b, h, t, d, 2, 16)
    kernel_ops(DEVICE).encode_unit(k, v, kc, keys, values, 0)
    want = get_codec("octopus", 3, d, seed=8).encode(k.cpu())
    assert torch.equal(keys.codes.cpu(), want.codes) and torch.equal(keys.gamma.cpu(), want.gamma)


def test_kernel_codebooks_are_symmetric():
    """The encode kernel counts only the positive half of the coordinate (turboquant) and xi (octopus seeds)
    boundaries (`_index_sym`): that needs beta_{h-1+j} = -beta_{h-1-j} exactly in fp32, for every codebook
    the kernels can be given."""
    from octopus_audio.codebooks import get_codebook

    books = [("coord", d, b) for d in (16, 32, 64, 128, 256) for b in range(1, 9)]
    books += [("xi", None, b) for b in range(1, 9)]
    for kind, d, b in books:
        beta = get_codebook(kind, d, b).boundaries.to(torch.float32)
        assert torch.equal(beta, -beta.flip(0)), (kind, d, b)


VALUE_CASES = [(1, 64, torch.float32), (2, 128, torch.bfloat16), (3, 64, torch.float16),
               (4, 128, torch.float32), (8, 64, torch.float32)]


@pytest.mark.parametrize("bits,d,dtype", VALUE_CASES,
                         ids=[f"b{b}-d{d}-{str(t)[6:]}" for b, d, t in VALUE_CASES])
def test_encode_values_matches_quantizer(bits, d, dtype):
    g = torch.Generator().manual_seed(bits)
    v = (torch.randn(2, 3, 45, d, generator=g) * 4).to(dtype)
    v[0, 0, 0, :16] = 1.5  # constant group: scale 1
    v[0, 0, 1, :16] = 1000.0 + torch.arange(16) * 1e-3  # range below fp16 resolution: scale rounds to 0 -> 1
    v[1, 2, 3, 16:32] = torch.linspace(-65280, 65280, 16)  # about the widest fp16 range (b=1: scale clamps)
    v = v.to(DEVICE)
    got = kernel_ops(DEVICE).encode_values(v, bits)
    want = ValueQuantizer(bits, d).encode(v.cpu())
    for field in ("codes", "scale", "minimum"):
        a, b = getattr(got, field).cpu(), getattr(want, field)
        assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b), field


@pytest.mark.parametrize("bits", [2, 3])
def test_encode_values_exact_ties_round_to_even(bits):
    """(v - mn) / scale exactly on k + 1/2 (and one ulp either side) must round as torch.round does."""
    levels = 2**bits - 1
    v = torch.zeros(1, 1, 4, 16)
    v[..., 1] = float(levels)  # mn = 0, scale = 1
    ties = torch.arange(levels, dtype=torch.float32) + 0.5
    v[0, 0, 0, 2:2 + levels] = ties
    v[0, 0, 1, 2:2 + levels] = torch.nextafter(ties, torch.tensor(0.0))
    v[0, 0, 2, 2:2 + levels] = torch.nextafter(ties, torch.tensor(100.0))
    v[0, 0, 3] = torch.linspace(-3.0, 5.0, 16) * 0.1  # a scale that is not a power of two
    got = kernel_ops(DEVICE).encode_values(v.to(DEVICE), bits)
    want = ValueQuantizer(bits, 16).encode(v)
    assert torch.equal(unpack(got.codes.cpu(), bits, 16), unpack(want.codes, bits, 16))


def test_encode_values_range_flag_without_sync():
    v = torch.zeros(1, 1, 3, 64, device=DEVICE)
    flag = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    kernel_ops(DEVICE).encode_values(v, 2, range_flag=flag)
    assert int(flag.item()) == 0
    v[0, 0, 2, 7] = float("nan")
    kernel_ops(DEVICE).encode_values(v, 2, range_flag=flag)  # no raise: the caller reads the flag
    assert int(flag.item()) == 1


def test_encode_values_rejects_out_of_range():
    v = torch.zeros(1, 1, 2, 64, device=DEVICE)
    v[0, 0, 1, 3] = 70000.0
    with pytest.raises(ValueError, match="fp16 range"):
        kernel_ops(DEVICE).encode_values(v, 2)
    v[0, 0, 1, 3] = float("nan")
    with pytest.raises(ValueError, match="fp16 range"):
        kernel_ops(DEVICE).encode_values(v, 2)


def test_encode_keys_rejects_wrong_heads():
    codec = get_codec("octopus", 2, 64)
    kc = kernel_codec(codec, 2, DEVICE)
    with pytest.raises(ValueError, match="heads"):
        kernel_ops(DEVICE).encode_keys(torch.zeros(1, 3, 4, 64, device=DEVICE), kc)


@triton.jit
def _roundtrip_kernel(codes_ptr, words_ptr, out_ptr, L: tl.constexpr, LP: tl.constexpr, N: tl.constexpr,
                      W: tl.constexpr, WP: tl.constexpr, KP: tl.constexpr):
    rows = tl.arange(0, 4)[:, None]
    j = tl.arange(0, LP)[None, :]
    codes = tl.load(codes_ptr + rows * L + j, mask=j < L, other=0)
    w = tl.arange(0, WP)[None, :]
    tl.store(words_ptr + rows * W + w, kbits.pack_codes(codes, 0, L, N, WP, KP), mask=w < W)
    tl.debug_barrier()
    back = kbits.unpack_codes(words_ptr + rows * W, j, (j < L) & (rows < 4), N)
    tl.store(out_ptr + rows * L + j, back, mask=j < L)


@pytest.mark.parametrize("n,length", [(1, 64), (3, 43), (7, 22), (10, 43), (13, 43), (16, 5), (5, 127)])
def test_bit_helpers_roundtrip(n, length):
    """pack_codes / unpack_codes against octopus_audio.packing for widths that straddle words and odd L."""
    kernel_ops(DEVICE)
    g = torch.Generator().manual_seed(n)
    codes = torch.randint(0, 2**n, (4, length), generator=g, dtype=torch.int32).to(DEVICE)
    words_n, wp, kp = pack_shape(n, length)
    words = torch.zeros(4, words_n, dtype=torch.int32, device=DEVICE)
    out = torch.zeros_like(codes)
    _roundtrip_kernel[(1,)](codes, words, out, L=length, LP=triton.next_power_of_2(length), N=n, W=words_n,
                            WP=wp, KP=kp)
    assert torch.equal(words.cpu(), pack(codes.cpu().long(), n))
    assert torch.equal(out.cpu(), codes.cpu())


@triton.jit
def _pack_tile_kernel(codes_ptr, words_ptr, L: tl.constexpr, LP: tl.constexpr, N: tl.constexpr,
                      W: tl.constexpr, WP: tl.constexpr, KP: tl.constexpr):
    rows = tl.arange(0, 4)[:, None]
    j = tl.arange(0, LP)[None, :]
    codes = tl.load(codes_ptr + rows * L + j, mask=j < L, other=0)
    words, wmap = kbits.pack_tile(codes, L, N, WP, KP)
    tl.store(words_ptr + rows * W + wmap, words, mask=(wmap >= 0) & (wmap < W))


@pytest.mark.parametrize("n,length", [(7, 22), (9, 22), (10, 22), (11, 43), (13, 22), (14, 22), (15, 22),
                                     (10, 16), (13, 32), (6, 43)])
def test_pack_tile_period_sums(n, length):
    """pack_tile (period sums for 3, 5, 6, 7, 9, 10, 11, 13, 14 and 15 bits) against octopus_audio.packing."""
    kernel_ops(DEVICE)
    g = torch.Generator().manual_seed(n + length)
    codes = torch.randint(0, 2**n, (4, length), generator=g, dtype=torch.int32).to(DEVICE)
    words_n, wp, kp = pack_shape(n, length)
    words = torch.zeros(4, words_n, dtype=torch.int32, device=DEVICE)
    _pack_tile_kernel[(1,)](codes, words, L=length, LP=max(32, triton.next_power_of_2(length)), N=n,
                            W=words_n, WP=wp, KP=kp)
    assert torch.equal(words.cpu(), pack(codes.cpu().long(), n))


def test_octopus_encode_under_inference_mode():
    """A patched generation runs under torch.inference_mode: the octopus encode must not key any cache on
    a tensor's version counter (inference tensors have none), and must equal the encode outside it."""
    k = torch.randn(1, 2, 33, 64, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    with torch.inference_mode():  # the codec's tables are made here too, as in a generation
        codec = kernel_codec(get_codec("octopus", 2, 64, seed=11), 2, DEVICE)
        inside = kernel_ops(DEVICE).encode_keys(k.clone(), codec)
    outside = kernel_ops(DEVICE).encode_keys(k, codec)
    assert torch.equal(inside.codes, outside.codes) and torch.equal(inside.gamma, outside.gamma)


# encode_unit: one launch for a unit's keys and values, written into a store at an offset -------------------
# codec, key bits, head dim, dtype, value bits, value group: every codec, value chunks of 1..8 bits (1, 2, 4
# and 8 bits a store each, 3 and 5 byte by byte) and groups of 8..32 channels
UNIT_CASES = [("octopus", 2, 64, torch.bfloat16, 2, 16), ("octopus-qjl", 3, 64, torch.float16, 3, 16),
              ("turboquant-mse", 4, 64, torch.float32, 8, 32),
              ("turboquant-qjl", 1, 64, torch.bfloat16, 1, 8),
              ("polarquant", 2, 128, torch.float32, 5, 16), ("octopus", 4, 128, torch.float16, 4, 16)]
_SENTINEL = {torch.int32: -123456789, torch.bfloat16: -3.0, torch.float16: -5.0}


def _store(codec, b, h, cap, d, bits, group):
    """Store buffers of `cap` tokens filled with a sentinel (what the kernel must not touch stays)."""
    from octopus_audio.kernels.spec import PackedKeys, PackedValues

    def buf(*tail, dtype):
        return torch.full((b, h, cap, *tail), _SENTINEL[dtype], dtype=dtype, device=DEVICE)

    qjl = codec.has_qjl
    keys = PackedKeys(buf(codec.code_words, dtype=torch.int32), buf(dtype=torch.bfloat16),
                      buf(-(-d // 32), dtype=torch.int32) if qjl else None,
                      buf(dtype=torch.bfloat16) if qjl else None)
    values = PackedValues(buf(-(-d * bits // 32), dtype=torch.int32), buf(d // group, dtype=torch.float16),
                          buf(d // group, dtype=torch.float16), bits, group)
    return keys, values


def _fields(keys, values):
    return {"codes": keys.codes, "gamma": keys.gamma, "signs": keys.signs, "gamma_r": keys.gamma_r,
            "v_codes": values.codes, "scale": values.scale, "minimum": values.minimum}


def _qkv_views(b, t, h, d, dtype, seed):
    """k and v as strided [B, H, T, d] views of a fused [B, T, 3, H, d] projection (as the model has them)."""
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(b, t, 3, h, d, generator=g) * 3).to(dtype).to(DEVICE)
    _, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    return k, v


@pytest.mark.parametrize("name,bits,d,dtype,v_bits,group", UNIT_CASES,
                         ids=[f"{n}-b{b}-d{d}-{str(t)[6:]}-v{vb}g{g}" for n, b, d, t, vb, g in UNIT_CASES])
def test_encode_unit_writes_what_the_separate_encodes_return(name, bits, d, dtype, v_bits, group):
    """Bit for bit the tokens encode_keys / encode_values return, at the offset; nothing else touched."""
    ops = kernel_ops(DEVICE)

    b, h, t, cap, offset = 2, 3, 7, 19, 5
    kc = kernel_codec(get_codec(name, bits, d, seed=3), h, DEVICE)
    k, v = _qkv_views(b, t, h, d, dtype, seed=bits + d)
    k[1, 2, 4] = 0.0  # a zero key
    assert not k.is_contiguous() and not v.is_contiguous()
    keys, values = _store(kc, b, h, cap, d, v_bits, group)
    flags = torch.zeros(2, device=DEVICE)
    kernel_ops(DEVICE).encode_unit(k, v, kc, keys, values, offset, flags)
    want = _fields(ops.encode_keys(k.contiguous(), kc, gluon=False),
                   ops.encode_values(v.contiguous(), v_bits, group))
    for field, got in _fields(keys, values).items():
        if got is None:
            assert want[field] is None, field
            continue
        assert torch.equal(got[:, :, offset:offset + t].cpu(), want[field].cpu()), field
        rest = torch.cat((got[:, :, :offset], got[:, :, offset + t:]), 2)
        assert bool((rest == _SENTINEL[got.dtype]).all()), f"{field} written outside the unit's tokens"
    assert flags.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("bad", ["nan_k", "inf_k", "nan_v", "big_v", "clean"])
def test_encode_unit_flags_bad_keys_and_values(bad):
    """flags[0] turns +inf for a non-finite key, flags[1] for a value that is NaN or beyond fp16; rows of the
    record beside the one passed stay untouched."""
    kernel_ops(DEVICE)

    b, h, t, d = 1, 2, 33, 64
    kc = kernel_codec(get_codec("octopus", 2, d, seed=1), h, DEVICE)
    k, v = _qkv_views(b, t, h, d, torch.float32, seed=5)
    spot = (0, 1, 32, 63)  # the last row of the last key block
    if bad == "nan_k":
        k[spot] = float("nan")
    elif bad == "inf_k":
        k[spot] = -float("inf")
    elif bad == "nan_v":
        v[spot] = float("nan")
    elif bad == "big_v":
        v[spot] = -65520.0
    keys, values = _store(kc, b, h, t, d, 2, 16)
    record = torch.zeros(3, 2, device=DEVICE)
    kernel_ops(DEVICE).encode_unit(k, v, kc, keys, values, 0, record[1])
    inf = float("inf")
    want = {"nan_k": [inf, 0.0], "inf_k": [inf, 0.0], "nan_v": [0.0, inf], "big_v": [0.0, inf],
            "clean": [0.0, 0.0]}[bad]
    assert record.tolist() == [[0.0, 0.0], want, [0.0, 0.0]]


def test_encode_unit_rejects_what_it_cannot_write():
    kernel_ops(DEVICE)

    d = 64
    kc = kernel_codec(get_codec("octopus", 2, d), 2, DEVICE)
    k, v = _qkv_views(1, 4, 2, d, torch.float32, seed=0)
    keys, values = _store(kc, 1, 2, 10, d, 2, 16)
    with pytest.raises(ValueError, match="must fit the store's 10 tokens"):
        kernel_ops(DEVICE).encode_unit(k, v, kc, keys, values, 7)
    small = _store(kc, 1, 2, 10, d, 2, 4)[1]
    with pytest.raises(ValueError, match="group >= 8"):
        kernel_ops(DEVICE).encode_unit(k, v, kc, keys, small, 0)
    strided = type(keys)(keys.codes[:, :, ::2], keys.gamma[:, :, ::2])
    with pytest.raises(ValueError, match="keys_out.codes must be a contiguous"):
        kernel_ops(DEVICE).encode_unit(k, v, kc, strided, values, 0)
    with pytest.raises(ValueError, match="k and v must both be"):
        kernel_ops(DEVICE).encode_unit(k, v[:, :, :3], kc, keys, values, 0)
    with pytest.raises(ValueError, match="flags must be a float32"):
        kernel_ops(DEVICE).encode_unit(k, v, kc, keys, values, 0,
                                       torch.zeros(2, dtype=torch.int32, device=DEVICE))
