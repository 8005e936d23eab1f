"""The Gluon kernels (sm_90) and the selector that picks them: the attention kernel against
decode-then-softmax with the codec library, the polarquant key encode against the library's encode and
the Triton key encode. The decisions (pure functions) run on the CPU; the kernels only with
OCTOPUS_AUDIO_TEST_DEVICE=cuda on a compute capability 9.0 GPU (Gluon has no CPU interpreter)."""

import logging
import math
import os
import re
import sys
import types

import pytest
import torch
from helpers import decoded_attention

from octopus_audio.cache import CompressedKVCache, kernel_codec
from octopus_audio.codecs import get_codec
from octopus_audio.codecs.base import KeyState
from octopus_audio.kernels import DecodeKind, EncodeConfig, PackedKeys, PackedValues, select
from octopus_audio.kernels.impls import encode as triton_encode
from octopus_audio.kernels.impls import score_tables
from octopus_audio.kernels.impls.gluon import scope as gluon_scope
from octopus_audio.kernels.kinds import kind_named
from octopus_audio.packing import unpack
from octopus_audio.values import ValueState

DEVICE = os.environ.get("OCTOPUS_AUDIO_TEST_DEVICE", "cpu")
ON_SM90 = (DEVICE == "cuda" and torch.cuda.is_available()
           and torch.cuda.get_device_capability() == gluon_scope.CAPABILITY)
needs_sm90 = pytest.mark.skipif(not ON_SM90, reason="the Gluon kernel runs only on a compute capability 9.0 "
                                "GPU (set OCTOPUS_AUDIO_TEST_DEVICE=cuda on an H100/H200)")
TOL = 2e-3  # bf16 output, beyond the rounding floor (as test_kernels_attention.py)

# the key bits each codec's Gluon decode takes at d=64, written out (not read from gluon/scope.py)
IN_SCOPE = {"turboquant-mse": (1, 2, 3, 4), "turboquant-qjl": (2, 3, 4, 5), "polarquant": (1, 2, 3, 4),
            "octopus": (1, 2, 3, 4), "octopus-qjl": (1, 2, 3, 4)}
OUT_OF_SCOPE = {"turboquant-mse": (5, 8), "turboquant-qjl": (1, 6), "polarquant": (5,), "octopus": (5,),
                "octopus-qjl": (5,)}
V_BITS = {1: 2, 2: 2, 3: 8, 4: 4, 5: 2}  # value bits tried with each key bit width: 2, 4 and 8 all run
# the key encode's scope, written out: polarquant at these widths, every other codec and width on Triton
ENCODE_IN_SCOPE = {"polarquant": (1, 2)}
ENCODE_OUT_OF_SCOPE = {"polarquant": (3, 4, 5, 8), "turboquant-mse": (2,), "turboquant-qjl": (2,),
                       "octopus": (2,), "octopus-qjl": (2,)}
SCALAR, POLAR, TRIPLET = (kind_named(n) for n in ("scalar", "polar", "triplet"))
# a kind the Gluon kernels have no decode for (never registered: its helpers are never called here)
OTHER = DecodeKind("made-up", lambda kc: {}, lambda kc: (None, None), None, None)


def _limit(**change):
    """gluon_limit for an in-scope call (octopus b=2 at AAR shapes on an H200), with `change` applied."""
    args = dict(capability=(9, 0), api_error=None, interpreting=False, q_dtype=torch.bfloat16,
                window_dtype=torch.bfloat16, kind=TRIPLET, has_qjl=False, head_dim=64, code_bits=7,
                v_bits=2, v_group=16, rows=75, programs=2048, sm_count=132)
    args.update(change)
    return gluon_scope.gluon_limit(**args)


# ---- the decision, on the CPU ----

def test_in_scope_at_aar_shapes():
    assert _limit() is None
    assert _limit(rows=80, programs=264, window_dtype=None) is None


@pytest.mark.parametrize("change", [
    dict(capability=None), dict(capability=(8, 0)), dict(capability=(10, 0)), dict(capability=(9, 0),
                                                                                  interpreting=True),
    dict(api_error="the installed Triton lacks the Gluon API"), dict(q_dtype=torch.float16),
    dict(q_dtype=torch.float32), dict(window_dtype=torch.float16), dict(head_dim=128), dict(head_dim=32),
    dict(rows=1), dict(rows=81), dict(programs=263), dict(v_bits=3), dict(v_bits=1), dict(v_group=32),
    dict(code_bits=16), dict(kind=POLAR, has_qjl=True), dict(kind=OTHER),
], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_out_of_scope_says_why(change):
    why = _limit(**change)
    assert isinstance(why, str) and why


@pytest.mark.parametrize("name", sorted(IN_SCOPE))
def test_codec_scope_per_bits(name):
    for bits, want in [(b, True) for b in IN_SCOPE[name]] + [(b, False) for b in OUT_OF_SCOPE[name]]:
        kc = kernel_codec(get_codec(name, bits, 64), 2, "cpu")
        why = gluon_scope.codec_limit(kc.kind, kc.has_qjl, kc.head_dim, kc.code_bits, 2, 16)
        assert (why is None) == want, f"{name} b={bits}: {why}"


def test_codec_ids_derive_from_the_kinds_registry():
    """The attention kernel's CODEC constexpr: 2 x the kind's registry id, plus 1 with QJL; none for a kind
    or side-car it has no decode for."""
    ids = {(kind.name, qjl): gluon_scope.codec_id(kind, qjl) for kind in (SCALAR, POLAR, TRIPLET)
           for qjl in (False, True)}
    assert ids == {("scalar", False): 2 * SCALAR.id, ("scalar", True): 2 * SCALAR.id + 1,
                   ("polar", False): 2 * POLAR.id, ("polar", True): None,
                   ("triplet", False): 2 * TRIPLET.id, ("triplet", True): 2 * TRIPLET.id + 1}
    assert len({v for v in ids.values() if v is not None}) == 5
    assert gluon_scope.codec_id(OTHER, False) is None


def test_announce_logs_once_per_reason(caplog):
    select._announced.clear()
    record = {}
    with caplog.at_level(logging.INFO, logger=select.__name__):
        for _ in range(2):
            select.announce("key encode", "gluon", "in scope", record)
            select.announce("attention", "split-k", "gluon: 75 query rows a KV head", record)
        select.announce("attention", "split-k", "gluon: 81 query rows a KV head", record)  # other numbers
    said = [r.getMessage() for r in caplog.records]
    assert said == ["octopus-audio key encode: gluon (in scope)",
                    "octopus-audio attention: split-k (gluon: 75 query rows a KV head)"], said
    assert record == {"key encode": {"gluon": "in scope"},
                      "attention": {"split-k": "gluon: 75 query rows a KV head"}}


def _tiny_call(bits=2, rows=2, heads=2):
    codec = kernel_codec(get_codec("octopus", bits, 64), heads, "cpu")
    keys = PackedKeys(torch.zeros(1, heads, 4, codec.code_words, dtype=torch.int32),
                      torch.ones(1, heads, 4, dtype=torch.bfloat16))
    values = PackedValues(torch.zeros(1, heads, 4, 4, dtype=torch.int32),
                          torch.ones(1, heads, 4, 4, dtype=torch.float16),
                          torch.zeros(1, heads, 4, 4, dtype=torch.float16), 2)
    q = torch.randn(1, heads, rows, 64).bfloat16()
    return q, keys, values, codec


class _ReachedTriton(Exception):
    pass


def _fake_gluon_module(monkeypatch, name: str, function: str, calls: list) -> None:
    """The Gluon module `name` replaced by one whose `function` records its calls (no sm_90 here): the
    selector imports it only where the call is in scope."""
    fake = types.ModuleType(name)
    setattr(fake, function, lambda *a: calls.append(a) or "gluon")
    monkeypatch.setitem(sys.modules, name, fake)


def test_attention_runs_gluon_where_in_scope(monkeypatch):
    """select.attention hands an in-scope call to the Gluon launcher, and keeps the Triton kernels with
    gluon=False, an explicit config or split count (both launchers replaced: no sm_90 here)."""
    calls = []
    monkeypatch.setattr(select, "attention_gluon_limit", lambda *a: None)
    _fake_gluon_module(monkeypatch, "octopus_audio.kernels.impls.gluon.flash", "attention_gluon", calls)

    def triton_path(*args):
        raise _ReachedTriton

    monkeypatch.setattr(score_tables, "adc_limit", triton_path)  # the Triton implementations' first step
    q, keys, values, codec = _tiny_call()
    record = {}
    assert select.attention(q, keys, values, 4, None, None, codec, record=record) == "gluon"
    assert len(calls) == 1
    assert record == {"attention": {"gluon": "in scope"}}
    for kwargs in (dict(gluon=False), dict(config=select.AttnConfig()), dict(num_splits=1)):
        with pytest.raises(_ReachedTriton):
            select.attention(q, keys, values, 4, None, None, codec, **kwargs)
    assert len(calls) == 1


def test_cpu_tensors_run_triton():
    q, keys, values, codec = _tiny_call()
    assert select.attention_gluon_limit(q, values, None, codec, 2, 2) == "not a CUDA device"


def _encode_limit(**change):
    """encode_limit for an in-scope key encode (polarquant b=2, bf16, on an H200), with `change` applied."""
    args = dict(capability=(9, 0), api_error=None, interpreting=False, k_dtype=torch.bfloat16,
                kind=POLAR, has_qjl=False, head_dim=64, code_bits=2)
    args.update(change)
    return gluon_scope.encode_limit(**args)


def test_encode_in_scope():
    assert _encode_limit() is None
    assert _encode_limit(k_dtype=torch.float16, code_bits=1) is None


@pytest.mark.parametrize("change", [
    dict(capability=None), dict(capability=(8, 0)), dict(capability=(10, 0)), dict(interpreting=True),
    dict(api_error="the installed Triton lacks the Gluon API"), dict(k_dtype=torch.float32),
    dict(head_dim=128), dict(head_dim=32), dict(code_bits=4), dict(kind=POLAR, has_qjl=True),
    dict(kind=SCALAR), dict(kind=TRIPLET, code_bits=7), dict(kind=OTHER),
], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_encode_out_of_scope_says_why(change):
    why = _encode_limit(**change)
    assert isinstance(why, str) and why


@pytest.mark.parametrize("name", sorted(ENCODE_OUT_OF_SCOPE))
def test_encode_scope_per_bits(name):
    cases = [(b, True) for b in ENCODE_IN_SCOPE.get(name, ())]
    cases += [(b, False) for b in ENCODE_OUT_OF_SCOPE[name]]
    for bits, want in cases:
        kc = kernel_codec(get_codec(name, bits, 64), 2, "cpu")
        why = _encode_limit(kind=kc.kind, has_qjl=kc.has_qjl, code_bits=kc.code_bits)
        assert (why is None) == want, f"{name} b={bits}: {why}"


def test_encode_keys_runs_gluon_where_in_scope(monkeypatch):
    """select.encode_keys hands an in-scope call to the Gluon launcher and keeps the Triton kernel with
    gluon=False or an explicit config (both replaced: no sm_90 here)."""
    calls = []
    monkeypatch.setattr(select, "encode_gluon_limit", lambda k, codec: None)
    _fake_gluon_module(monkeypatch, "octopus_audio.kernels.impls.gluon.encode", "encode_keys_gluon", calls)

    def triton_path(*args, **kwargs):
        raise _ReachedTriton

    monkeypatch.setattr(triton_encode, "encode_keys_triton", triton_path)
    kc = kernel_codec(get_codec("polarquant", 2, 64), 2, "cpu")
    k = torch.randn(1, 2, 5, 64).bfloat16()
    assert select.encode_keys(k, kc) == "gluon" and len(calls) == 1
    for kwargs in (dict(gluon=False), dict(config=EncodeConfig())):
        with pytest.raises(_ReachedTriton):
            select.encode_keys(k, kc, **kwargs)
    assert len(calls) == 1


def test_cpu_keys_encode_on_triton():
    kc = kernel_codec(get_codec("polarquant", 2, 64), 2, "cpu")
    assert select.encode_gluon_limit(torch.zeros(1, 2, 3, 64).bfloat16(), kc) == "not a CUDA device"


# ---- the kernels, on an sm_90 GPU ----

def make_case(name, bits, v_bits, *, batch, heads, groups, tq, length, window, seed=0, codec_seed=None):
    """Random bf16 q and window, a store of random packed codes (capacity length + 5: any bit pattern is a
    valid code); the library codec (seeded `codec_seed`, default seed + 1) decodes it."""
    g = torch.Generator().manual_seed(seed)
    d = 64
    codec = get_codec(name, bits, d, seed=seed + 1 if codec_seed is None else codec_seed)
    cap = length + 5

    def words(n):
        w = torch.randint(-2**31, 2**31, (batch, heads, cap, n), generator=g, dtype=torch.int64)
        return w.to(torch.int32)

    def positive(scale):
        return (torch.rand(batch, heads, cap, generator=g) * scale + 0.1 * scale).bfloat16()

    ks = KeyState(dtype=torch.bfloat16, codes=words(codec.code_words), gamma=positive(math.sqrt(d)),
                  signs=words(2) if codec.qjl else None, gamma_r=positive(0.3) if codec.qjl else None)
    vs = ValueState(dtype=torch.bfloat16, codes=words(d * v_bits // 32),
                    scale=(torch.rand(batch, heads, cap, d // 16, generator=g) / 2**v_bits).half(),
                    minimum=(torch.randn(batch, heads, cap, d // 16, generator=g) - 0.5).half())
    q = (torch.randn(batch, heads * groups, tq, d, generator=g) * 2 / math.sqrt(d)).bfloat16()
    k_win = torch.randn(batch, heads, window, d, generator=g).bfloat16()
    v_win = torch.randn(batch, heads, window, d, generator=g).bfloat16()
    keys = PackedKeys(ks.codes, ks.gamma, ks.signs, ks.gamma_r)
    values = PackedValues(vs.codes, vs.scale, vs.minimum, v_bits)
    return codec, q, keys, values, k_win, v_win


# query rows, compressed length, window, batch rows, KV heads, GQA ratio
SHAPES = {"q1-L100-w1-b1": (1, 100, 1, 1, 2, 1), "q5-L63-w0-b3": (5, 63, 0, 3, 2, 1),
          "q75-L380-w75-b3": (75, 380, 75, 3, 2, 1), "q80-L455-w1-b1": (80, 455, 1, 1, 3, 1),
          "q75-L0-w75-b1": (75, 0, 75, 1, 2, 1), "q75-L1-w0-b1": (75, 1, 0, 1, 2, 1),
          "q40-L200-w1-b1-g2": (40, 200, 1, 1, 2, 2), "q5-L65-w1-b3-g4": (5, 65, 1, 3, 2, 4),
          # a last window tile of exactly the narrow step's 16 keys, and one of 36 (the full step)
          "q75-L130-w80-b1": (75, 130, 80, 1, 2, 1), "q64-L40-w100-b2": (64, 40, 100, 2, 2, 1)}
CASES = [(name, bits) for name, bit_list in IN_SCOPE.items() for bits in bit_list]


def _to_cuda(keys, values):
    return (PackedKeys(*[t.cuda() if t is not None else None for t in (keys.codes, keys.gamma, keys.signs,
                                                                       keys.gamma_r)]),
            PackedValues(values.codes.cuda(), values.scale.cuda(), values.minimum.cuda(), values.bits))


@needs_sm90
@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
@pytest.mark.parametrize("case", CASES, ids=[f"{n}-b{b}" for n, b in CASES])
def test_gluon_matches_library_decode(case, shape):
    from octopus_audio.kernels.impls.gluon.flash import attention_gluon

    name, bits = case
    tq, length, window, batch, heads, groups = SHAPES[shape]
    codec, q, keys, values, k_win, v_win = make_case(name, bits, V_BITS[bits], batch=batch, heads=heads,
                                                     groups=groups, tq=tq, length=length, window=window)
    kc = kernel_codec(codec, heads, "cuda")
    dev = [t.cuda() for t in (q, k_win, v_win)]
    scale = 1 / math.sqrt(64)
    got = attention_gluon(dev[0], *_to_cuda(keys, values), length, dev[1] if window else None,
                          dev[2] if window else None, kc, scale)
    want = decoded_attention(codec, q, keys, values, length, k_win, v_win, scale)
    floor = ((want.bfloat16().double() - want).norm() / want.norm()).item()
    rel = ((got.double().cpu() - want).norm() / want.norm()).item()
    assert rel <= TOL + floor, f"relative RMS error {rel:.2e} > {TOL:.0e} + floor {floor:.1e}"
    assert got.shape == (batch, heads * groups, tq, 64)
    # one query head a KV head: rows in [B, T, H, D] memory order (merging the heads is a view), as cuDNN's
    assert got.transpose(1, 2).is_contiguous() == (groups == 1)


# query rows, compressed length, wide length, window, batch rows, KV heads, GQA ratio: AAR's last scale with 2
# sink scales and 4 wide ones (31 wide keys, 78 native), no store, two wide tiles, one wide key, GQA
WIDE_SHAPES = {"q75-L346-W31-w78-b3": (75, 346, 31, 78, 3, 2, 1),
               "q75-L0-W31-w78-b1": (75, 0, 31, 78, 1, 2, 1), "q5-L63-W65-w0-b3": (5, 63, 65, 0, 3, 2, 1),
               "q80-L455-W1-w1-b1": (80, 455, 1, 1, 1, 3, 1),
               "q40-L200-W40-w1-b1-g2": (40, 200, 40, 1, 1, 2, 2)}
# (codec, key bits, value bits, wide key bits, wide value bits): every codec at b=2 with 4@4 (the option's
# default) and 3@8; turboquant's pair-ordered 1-2 bit keys beside wide keys of another order
WIDE_CASES = ([(n, 2, 2, 4, 4) for n in IN_SCOPE] + [(n, 2, 4, 3, 8) for n in IN_SCOPE]
              + [("turboquant-mse", 1, 2, 2, 2), ("turboquant-qjl", 3, 2, 2, 4), ("octopus", 3, 8, 4, 2)])


def test_wide_scope_says_why():
    """A wide store beside the store: in scope at widths the kernel decodes with the store's rotation; else
    one sentence why."""
    args = dict(kind=TRIPLET, has_qjl=False, head_dim=64, code_bits=13, v_bits=4, v_group=16,
                same_rotation=True)
    assert gluon_scope.wide_limit(**args) is None
    for change in (dict(code_bits=16), dict(v_bits=3), dict(same_rotation=False), dict(kind=POLAR,
                                                                                        has_qjl=True)):
        why = gluon_scope.wide_limit(**{**args, **change})
        assert isinstance(why, str) and why.startswith("a wide prefix"), (change, why)


def test_wide_rotation_is_compared_once_per_codec_pair():
    """The selector's rotation check: equal for a wide codec of the store's seed, unequal for another seed;
    the answer kept on the wide codec."""
    main = kernel_codec(get_codec("octopus", 2, 64, seed=3), 2, "cpu")
    same = kernel_codec(get_codec("octopus", 4, 64, seed=3), 2, "cpu")
    other = kernel_codec(get_codec("octopus", 4, 64, seed=4), 2, "cpu")
    assert select._same_rotation(main, same) and not select._same_rotation(main, other)
    assert same.__dict__["_same_rotation"][id(main)] == (main, True)


@needs_sm90
@pytest.mark.parametrize("shape", list(WIDE_SHAPES), ids=list(WIDE_SHAPES))
@pytest.mark.parametrize("case", WIDE_CASES,
                         ids=[f"{n}-b{b}v{v}-wide{w}@{wv}" for n, b, v, w, wv in WIDE_CASES])
def test_gluon_wide_matches_library_decode(case, shape):
    """The wide-store entry point: the store, a wide store at its own widths (decoded into the store's
    column orders) and the window in one softmax, against the library's decode of both stores."""
    from octopus_audio.kernels.impls.gluon.flash import attention_gluon
    from octopus_audio.kernels.spec import WideSegment

    name, bits, v_bits, w_bits, wv_bits = case
    tq, length, w_len, window, batch, heads, groups = WIDE_SHAPES[shape]
    codec, q, keys, values, k_win, v_win = make_case(name, bits, v_bits, batch=batch, heads=heads,
                                                     groups=groups, tq=tq, length=length, window=window)
    wcodec, _, wkeys, wvalues, _, _ = make_case(name, w_bits, wv_bits, batch=batch, heads=heads,
                                                groups=groups, tq=tq, length=w_len, window=0, seed=5,
                                                codec_seed=1)
    kc, wkc = kernel_codec(codec, heads, "cuda"), kernel_codec(wcodec, heads, "cuda")
    assert select.wide_gluon_limit(kc, WideSegment(wkeys, wvalues, w_len, wkc)) is None
    dev = [t.cuda() for t in (q, k_win, v_win)]
    scale = 1 / math.sqrt(64)
    wide = WideSegment(*_to_cuda(wkeys, wvalues), w_len, wkc)
    got = attention_gluon(dev[0], *_to_cuda(keys, values), length, dev[1] if window else None,
                          dev[2] if window else None, kc, scale, wide)
    want = decoded_attention(codec, q, keys, values, length, k_win, v_win, scale,
                             wide=(wcodec, wkeys, wvalues, w_len))
    floor = ((want.bfloat16().double() - want).norm() / want.norm()).item()
    rel = ((got.double().cpu() - want).norm() / want.norm()).item()
    assert rel <= TOL + floor, f"relative RMS error {rel:.2e} > {TOL:.0e} + floor {floor:.1e}"


def _attend_aar_scales(cache, seed):
    """AAR's 16 scales (18 rows x 16 heads, d=64) appended to `cache` one by one, each scale's queries
    attended through the public CompressedKVCache.attend and checked against the cache's reference; returns
    the last scale's queries."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    for n in (1, 2, 4, 6, 9, 12, 16, 20, 25, 31, 37, 43, 50, 58, 66, 75):
        cache.append(torch.randn(18, 16, n, 64, generator=g, device="cuda").bfloat16(),
                     torch.randn(18, 16, n, 64, generator=g, device="cuda").bfloat16())
        q = (torch.randn(18, 16, n, 64, generator=g, device="cuda") / 4).bfloat16()
        got = cache.attend(q, 0.125)
        want = cache.attend_reference(q.float(), 0.125).double()
        floor = ((want.bfloat16().double() - want).norm() / want.norm()).item()
        rel = ((got.double() - want).norm() / want.norm()).item()
        assert rel <= TOL + floor, f"{n} queries: relative RMS error {rel:.2e} > {TOL:.0e} + {floor:.1e}"
    return q


@needs_sm90
@pytest.mark.parametrize("name", sorted(IN_SCOPE))
def test_cache_attend_with_a_wide_prefix_runs_gluon(name, caplog):
    """AAR's scales with 2 sink scales and 4 wide ones at 4 bits (`patch_aar(sink_scales=2, wide_scales=4)`)
    through the public CompressedKVCache.attend (18 rows x 16 heads): equal to the cache's reference at every
    scale, and the last scale runs the Gluon kernel with the wide prefix."""
    select._announced.clear()
    cache = CompressedKVCache(name, 2, 64, window=1, native_prefix=3, wide_prefix=31, wide_bits=4)
    q = _attend_aar_scales(cache, seed=2)
    assert cache.wide_tokens == 31
    select._announced.clear()
    with caplog.at_level(logging.INFO, logger=select.__name__):
        cache.attend(q, 0.125)
    assert any("attention: gluon (in scope, with a wide prefix)" in r.getMessage() for r in caplog.records), \
        caplog.text


@needs_sm90
@pytest.mark.parametrize("name", sorted(IN_SCOPE))
def test_cache_attend_runs_gluon(name, caplog):
    """The public CompressedKVCache.attend at an AAR-like shape in scope (18 rows x 16 heads: 288 programs
    on 132 SMs) runs the Gluon kernel and equals the cache's reference path (decode, then SDPA)."""
    select._announced.clear()
    g = torch.Generator(device="cuda").manual_seed(0)
    cache = CompressedKVCache(name, 2, 64, window=1)
    for n in (100, 155, 75):
        cache.append(torch.randn(18, 16, n, 64, generator=g, device="cuda").bfloat16(),
                     torch.randn(18, 16, n, 64, generator=g, device="cuda").bfloat16())
    q = (torch.randn(18, 16, 75, 64, generator=g, device="cuda") / 4).bfloat16()
    with caplog.at_level(logging.INFO, logger=select.__name__):
        got = cache.attend(q, 0.125)
    assert any("attention: gluon" in r.getMessage() for r in caplog.records), caplog.text
    assert "attention: gluon'" in repr(cache), repr(cache)
    want = cache.attend_reference(q.float(), 0.125).double()
    floor = ((want.bfloat16().double() - want).norm() / want.norm()).item()
    rel = ((got.double() - want).norm() / want.norm()).item()
    assert rel <= TOL + floor, f"relative RMS error {rel:.2e} > {TOL:.0e} + floor {floor:.1e}"


@needs_sm90
@pytest.mark.parametrize("prefix", [7, 22, 34], ids=lambda p: f"P{p}")
@pytest.mark.parametrize("name", ["octopus", "turboquant-mse"])
def test_cache_attend_with_a_native_prefix_runs_gluon(name, prefix, caplog):
    """A native prefix (AAR's first 3, 5 or 6 scales) joins the window in the native segment the Gluon kernel
    takes: at every scale of an AAR-like sequence (18 rows x 16 heads) the cache equals the reference, and the
    last scale runs the Gluon kernel (the 1-query first scale is out of its scope and holds no compressed
    key: SDPA runs it, and the cache's repr lists both)."""
    select._announced.clear()
    cache = CompressedKVCache(name, 2, 64, window=1, native_prefix=prefix)
    q = _attend_aar_scales(cache, seed=prefix)
    assert cache.prefix_tokens == prefix
    select._announced.clear()
    with caplog.at_level(logging.INFO, logger=select.__name__):
        cache.attend(q, 0.125)
    assert any("attention: gluon" in r.getMessage() for r in caplog.records), caplog.text
    assert re.search(r"attention: [a-z-, ]*gluon'", repr(cache)), repr(cache)


# key shapes [..., H, T, 64]: aligned (T % 128 == 0), blocks across heads, a decode step (T = 1), lead dims
ENCODE_SHAPES = {"b1-h16-t1024": (1, 16, 1024), "b2-h3-t455": (2, 3, 455), "b1-h16-t1": (1, 16, 1),
                 "b3-h2-t129": (3, 2, 129), "b2x2-h2-t75": (2, 2, 2, 75)}
ENCODE_CASES = [(bits, dtype) for bits in ENCODE_IN_SCOPE["polarquant"]
                for dtype in (torch.bfloat16, torch.float16)]
MAX_MISMATCH = 1e-4  # as test_kernels_encode: inputs within fp32 rounding of a decision boundary


@needs_sm90
@pytest.mark.parametrize("shape", list(ENCODE_SHAPES), ids=list(ENCODE_SHAPES))
@pytest.mark.parametrize("bits,dtype", ENCODE_CASES, ids=[f"b{b}-{str(t)[6:]}" for b, t in ENCODE_CASES])
def test_gluon_encode_matches_library_and_triton(bits, dtype, shape, caplog):
    """encode_keys on the Gluon kernel: codes equal to the Triton kernel's (the same arithmetic),
    gamma (summed in another order) and codes within MAX_MISMATCH of the library's encode."""
    dims = ENCODE_SHAPES[shape]
    heads = dims[-2]
    g = torch.Generator().manual_seed(bits * 31 + len(dims))
    k = torch.randn(*dims, 64, generator=g) * torch.exp(torch.randn(*dims, 1, generator=g))
    k.view(-1, 64)[min(5, k.numel() // 64 - 1)] = 0.0  # a zero key
    k.view(-1, 64)[0] *= 1e15 if dtype == torch.bfloat16 else 1e3  # a large norm (gamma is computed scaled)
    k = k.to(dtype)
    codec = get_codec("polarquant", bits, 64, seed=3)
    kc = kernel_codec(codec, heads, "cuda")
    select._announced.clear()
    with caplog.at_level(logging.INFO, logger=select.__name__):
        got = select.encode_keys(k.cuda(), kc)
    assert any("key encode: gluon" in r.getMessage() for r in caplog.records), caplog.text
    tri = select.encode_keys(k.cuda(), kc, gluon=False)
    want = codec.encode(k)
    assert got.codes.shape == want.codes.shape and got.codes.dtype == torch.int32
    assert got.signs is None and got.gamma_r is None
    n = 63
    codes, tri_codes = unpack(got.codes.cpu(), bits, n), unpack(tri.codes.cpu(), bits, n)
    differ = (codes != tri_codes).nonzero().tolist()
    assert not differ, f"codes differ from the Triton kernel's at (..., token, code) {differ[:8]}"
    frac = (codes != unpack(want.codes, bits, n)).float().mean().item()
    assert frac < MAX_MISMATCH, f"{frac:.2e} of the codes differ from the library's"
    # gamma: the same fp32 norm summed in another order, rounded to bf16: a rare row one unit apart
    rows = got.gamma.numel()
    for what, other in (("Triton kernel", tri.gamma.cpu()), ("library", want.gamma)):
        assert got.gamma.dtype == torch.bfloat16
        apart = int((got.gamma.cpu() != other).sum())
        assert apart <= max(1, MAX_MISMATCH * rows), f"{apart} of {rows} gamma differ from the {what}'s"
        assert torch.allclose(got.gamma.cpu().float(), other.float(), rtol=2**-7, atol=0), what
