"""Adding a decode kind is one module plus one registration: a made-up kind declared in this file alone
(uniform levels computed from the code, no table lookup) and a codec that names it run through every
implementation the interpreter can run (split-K attention, one-row score tables, the Triton key encode, the
fused unit encode, and the cache on top of them), against the PyTorch reference (the codec library's decode
of the same packed state, then one softmax).

Runs the Triton kernels on the CPU under TRITON_INTERPRET=1 (set at import); OCTOPUS_AUDIO_TEST_DEVICE=cuda
runs them compiled. The kernels' helpers are reached as module attributes (`bits.row_codes`), so the
interpreted versions are the ones called after `kernel_ops` re-imports the kernel modules.
"""

import os

DEVICE = os.environ.get("OCTOPUS_AUDIO_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import dataclasses  # noqa: E402
import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from helpers import decoded_attention, kernel_ops  # noqa: E402
from test_registry import UniformScalar  # noqa: E402  (the toy codec's layout)

from octopus_audio.cache import CompressedKVCache, kernel_codec, kernel_limit  # noqa: E402
from octopus_audio.codecs import get_codec, register, unregister  # noqa: E402
from octopus_audio.kernels import bits, encode_math, operands, tables  # noqa: E402
from octopus_audio.packing import pack, unpack  # noqa: E402

KIND_NAME = "test-uniform"
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-3}


def affine(bits_: int, d: int) -> torch.Tensor:
    """fp32 [3]: (step, lowest level, lower edge) of 2^bits uniform levels over [-3/sqrt(d), 3/sqrt(d)] (a
    rotated unit key's coordinates are about N(0, 1/d)): level c = c * step + lowest."""
    span = 3.0 / math.sqrt(d)
    step = 2 * span / 2**bits_
    return torch.tensor([step, -span + step / 2, -span], dtype=torch.float32)


@dataclasses.dataclass(frozen=True, repr=False)
class Uniform(UniformScalar):
    """The made-up codec: test_registry's toy layout (one b-bit code per rotated coordinate), its codes
    decoded as c * step + lowest by the made-up kind."""

    name = "test-uniform-codec"
    kernel_decode = KIND_NAME

    def _quantize(self, u):
        step, _, edge = affine(self.bits, self.head_dim).to(u.device)
        c = torch.floor((u - edge) / step).clamp(0, 2**self.bits - 1)
        return pack(c.to(torch.int32), self.bits)

    def _dequantize(self, codes):
        step, lowest, _ = affine(self.bits, self.head_dim).to(codes.device)
        return unpack(codes, self.bits, self.head_dim).to(torch.float32) * step + lowest

    def kernel_tables(self, device):
        return {"affine": affine(self.bits, self.head_dim).to(device)}


# ---- the kind: its @triton.jit helpers, with the signatures kernels/kinds/kind.py gives ----

@triton.jit
def uniform_scores(s, qa, qb, qc, k_rows, n_ok, gamma, aff_ptr, tab_b_ptr, K):
    """s + q_rot . (gamma u_hat), u_hat_j = code_j * step + lowest."""
    codes = bits.row_codes(k_rows, n_ok[:, None], tl.arange(0, K.D)[None, :], K.K_BITS, K.K_WORDS, K.K_WP,
                           K.TILE)
    u = codes.to(tl.float32) * tl.load(aff_ptr) + tl.load(aff_ptr + 1)
    return operands.mm_nt(qa, operands.operand(u * gamma, K.OPD, K.RNE_BY_HAND), s, K.USE_DOT, K.PREC)


@triton.jit
def uniform_encode(xsg, rscale, gmax, inv_g, inv_sqrt_d, hoff, pid, near_ptr, had_ptr, hadt_ptr, qs_ptr,
                   cent_ptr, bnd_ptr, xib_ptr, aux_ptr, dir_ptr, K):
    """The rows rotated, their unit coordinates, a code each: floor((u - edge) / step), clamped (K: the
    kernel's `EncodeConstants`)."""
    y = encode_math.rotated_rows(xsg, had_ptr, K.D, K.DOT_NATIVE, K.SPLIT)
    u = encode_math.unit_coords(y, gmax, inv_g, inv_sqrt_d, K.LOG2D)
    c = tl.floor(tl.math.div_rn(u - tl.load(aux_ptr + 2), tl.zeros_like(u) + tl.load(aux_ptr)))
    c = tl.minimum(tl.maximum(c, 0.0), (1 << K.K_BITS) - 1.0).to(tl.int32)
    words, wmap = bits.pack_tile(c, K.K_CODES, K.K_BITS, K.WP, K.KP)
    return words, wmap, y, gmax  # no QJL term: placeholders, never read


@triton.jit
def _uniform_tables_kernel(q_ptr, rs_ptr, had_ptr, aff_ptr, lut_ptr, H, inv_sqrt_d, qk_scale,
                           D: tl.constexpr, L: tl.constexpr, N_ENTRIES: tl.constexpr, CHUNK: tl.constexpr,
                           HAS_QJL: tl.constexpr, TP: tl.constexpr):
    """T[r, i, e] = qk_scale * q_rot[i] * (e * step + lowest): a table code a coordinate."""
    r, h, k, qs, i, live = tables.table_program(q_ptr, rs_ptr, H, inv_sqrt_d, D, L, TP)
    q_i = tables.rotated_query(qs, had_ptr, k, i, D) * qk_scale
    row_lut = lut_ptr + r * (L * N_ENTRIES)
    for e0 in tl.static_range(0, N_ENTRIES, CHUNK):
        e = e0 + tl.arange(0, CHUNK)
        level = e.to(tl.float32) * tl.load(aff_ptr) + tl.load(aff_ptr + 1)
        tl.store(row_lut + i[:, None] * N_ENTRIES + e[None, :], q_i[:, None] * level[None, :],
                 mask=live[:, None])


def _build_tables(q, kc, lay, h, qk_scale, lut, qlut):
    _uniform_tables_kernel[tables.table_grid(q, lay)](
        q, kc.rotation_signs, kc.hadamard, kc.table("affine"), lut, h, 1.0 / math.sqrt(kc.head_dim), qk_scale,
        **tables.table_options(kc, lay))


def make_kind():
    """The kind's record (built after `kernel_ops`, so it holds the kernel modules' current helpers)."""
    from octopus_audio.kernels import DecodeKind, KindEncode, KindTables

    def affine_table(kc):
        return kc.table("affine")

    return DecodeKind(
        KIND_NAME, lambda kc: {"affine": (3,)}, lambda kc: (affine_table(kc), affine_table(kc)),
        operands.rotated_queries, uniform_scores, halves=False,
        encode=KindEncode(uniform_encode, {(64, False): (64, 4, None), (128, False): (64, 4, None)},
                          tables=lambda kc, dtype: (None, None, affine_table(kc), None)),
        score_tables=KindTables(lambda kc, group=None: tables.TableLayout(kc.head_dim, kc.code_bits,
                                                                          1 << kc.code_bits, True),
                                _build_tables, tables.sum_step, affine_table))


@pytest.fixture
def ops():
    """The kernels (interpreted on the CPU), with the made-up kind and its codec registered for the test."""
    ops = kernel_ops(DEVICE)
    kind = ops.register_kind(make_kind())
    register(Uniform)
    yield ops
    unregister(Uniform.name)
    ops.unregister_kind(kind.name)


def _store(codec, kc, heads, length, bits_, d, seed):
    """A store of `length` encoded keys and values (the library's encode) and its capacity + 3 rows."""
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(1, heads, length, d, generator=g), torch.randn(1, heads, length, d, generator=g)
    ks = codec.encode(k)
    from octopus_audio.values import ValueQuantizer

    vs = ValueQuantizer(bits_, d).encode(v)

    def pad(t):
        return torch.cat([t, torch.zeros(*t.shape[:2], 3, *t.shape[3:], dtype=t.dtype)], 2).to(DEVICE)

    from octopus_audio.kernels import PackedKeys, PackedValues

    return (PackedKeys(pad(ks.codes), pad(ks.gamma)),
            PackedValues(pad(vs.codes), pad(vs.scale), pad(vs.minimum), bits_))


def _close(got, want, tol):
    floor = ((want.to(got.dtype).double() - want.double()).norm() / want.double().norm()).item()
    rel = ((got.double().cpu() - want.double().cpu()).norm() / want.double().norm()).item()
    assert rel <= tol + floor, f"relative RMS error {rel:.2e} > {tol:.0e} + floor {floor:.1e}"


def test_the_kind_is_one_registration(ops):
    """Registered from this file: the kernels resolve the codec's kind by name, give it the next id, and the
    sm_90 kernels (no decode for it) say so; the cache's kernel check passes."""
    from octopus_audio.kernels.impls.gluon import scope

    codec = get_codec(Uniform.name, 3, 64)
    kc = kernel_codec(codec, 2, DEVICE)
    assert kc.kind.name == KIND_NAME and kc.kind.id == max(k.id for k in ops.kinds())
    assert kernel_limit(codec) is None and kernel_limit(codec, for_encode=False) is None
    assert scope.codec_limit(kc.kind, False, 64, 3, 2, 16) == f"no Gluon decode for the {KIND_NAME} kind"
    with pytest.raises(ValueError, match="registered already"):
        ops.register_kind(_foreign_kind())


def _foreign_kind():
    """A kind of the same name whose helpers come from another module (kernels/kinds/scalar.py's)."""
    from octopus_audio.kernels.kinds import scalar

    return dataclasses.replace(scalar.KIND, name=KIND_NAME, id=-1)


# (query rows a KV head, window, dtype, the implementation the selector picks)
ATTENTION_CASES = {"block-bf16": (6, 5, torch.bfloat16, "split-k"),
                   "block-fp32": (5, 1, torch.float32, "split-k"),
                   "one-row-window-70": (1, 70, torch.float32, "split-k"),
                   "one-row": (1, 3, torch.float32, "score-tables"),
                   "one-row-bf16": (1, 1, torch.bfloat16, "score-tables")}


@pytest.mark.parametrize("case", list(ATTENTION_CASES), ids=list(ATTENTION_CASES))
def test_attention_through_each_implementation(ops, case):
    tq, window, dtype, impl = ATTENTION_CASES[case]
    d, heads, bits_, length = 64, 2, 3, 77
    codec = get_codec(Uniform.name, bits_, d, seed=4)
    kc = kernel_codec(codec, heads, DEVICE)
    keys, values = _store(codec, kc, heads, length, bits_, d, seed=tq + window)
    g = torch.Generator().manual_seed(9)
    q = (torch.randn(1, heads, tq, d, generator=g) * 2 / math.sqrt(d)).to(dtype)  # as test_kernels_attention
    k_win, v_win = (torch.randn(1, heads, window, d, generator=g).to(dtype) for _ in range(2))
    record = {}
    got = ops.attention(q.to(DEVICE), keys, values, length, k_win.to(DEVICE), v_win.to(DEVICE), kc,
                        scale=0.125, record=record)
    assert list(record["attention"]) == [impl], record
    want = decoded_attention(codec, q, keys, values, length, k_win, v_win, 0.125)
    _close(got, want, TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_key_encode_and_unit_encode(ops, dtype):
    """The Triton key encode gives the library's codes (up to keys within fp32 rounding of a level edge) and
    gamma; the fused unit encode writes what encode_keys gives, at the store's offset."""
    d, heads, bits_, t = 64, 2, 2, 131
    codec = get_codec(Uniform.name, bits_, d, seed=6)
    kc = kernel_codec(codec, heads, DEVICE)
    g = torch.Generator().manual_seed(1)
    k = torch.randn(2, heads, t, d, generator=g).to(dtype)
    v = torch.randn(2, heads, t, d, generator=g).to(dtype)
    record = {}
    got = ops.encode_keys(k.to(DEVICE), kc, record=record)
    assert list(record["key encode"]) == ["triton"], record
    want = codec.encode(k)
    assert torch.equal(got.gamma.cpu(), want.gamma)
    mismatch = (unpack(got.codes.cpu(), bits_, d) != unpack(want.codes, bits_, d)).float().mean().item()
    assert mismatch < 1e-3, mismatch
    from octopus_audio.kernels import PackedKeys, PackedValues

    cap, offset = t + 9, 4
    keys = PackedKeys(torch.zeros(2, heads, cap, kc.code_words, dtype=torch.int32, device=DEVICE),
                      torch.zeros(2, heads, cap, dtype=torch.bfloat16, device=DEVICE))
    values = PackedValues(torch.zeros(2, heads, cap, d * 2 // 32, dtype=torch.int32, device=DEVICE),
                          torch.zeros(2, heads, cap, d // 16, dtype=torch.float16, device=DEVICE),
                          torch.zeros(2, heads, cap, d // 16, dtype=torch.float16, device=DEVICE), 2)
    ops.encode_unit(k.to(DEVICE), v.to(DEVICE), kc, keys, values, offset)
    assert torch.equal(keys.codes[:, :, offset:offset + t], got.codes)
    assert torch.equal(keys.gamma[:, :, offset:offset + t], got.gamma)
    assert not keys.codes[:, :, :offset].any() and not keys.codes[:, :, offset + t:].any()


def test_the_cache_runs_it_on_the_kernels(ops, monkeypatch):
    """CompressedKVCache with the made-up codec under OCTOPUS_AUDIO_KERNELS=kernels: every unit encoded by
    the fused unit encode, attention by the selector's picks (its repr says which), equal to its reference
    path."""
    monkeypatch.setenv("OCTOPUS_AUDIO_KERNELS", "kernels")
    g = torch.Generator().manual_seed(3)
    cache = CompressedKVCache(Uniform.name, 3, 64, window=1, seed=2)
    outs = []
    for n, tq in ((4, 1), (9, 1), (7, 3)):
        k, v = (torch.randn(1, 2, n, 64, generator=g).to(DEVICE) for _ in range(2))
        cache.append(k, v)
        q = torch.randn(1, 2, tq, 64, generator=g).to(DEVICE)
        outs.append((q, cache.attend(q, 0.125)))
    assert cache.backend == "triton"
    # the first attend has no stored key (SDPA), the second one query row (score tables), the third three
    assert "kernels='unit encode: triton; attention: sdpa, score-tables, split-k'" in repr(cache), repr(cache)
    for q, out in outs[-1:]:  # the last: the reference path over the same store and window
        _close(out, cache.attend_reference(q.float(), 0.125), 1e-5)
