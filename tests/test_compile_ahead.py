"""Compile ahead: the variants enumerated for a generation equal those a real generation of the default model
launches; the parallel compile runs every variant once, reports progress and failures; a real compile for
sm_90 lands in Triton's cache; on CUDA a generation after compiling ahead compiles nothing."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from octopus_audio.aar_patch import compile_variants as ahead

_GENERATION_VS_ENUMERATION = """
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
from triton.backends.compiler import GPUTarget
from octopus_audio.aar_patch import compile_variants as ahead
from octopus_audio.cache import CompressedKVCache
from octopus_audio.aar_patch import generate, load_aar, patch_aar
from octopus_audio.aar_patch.compile_ahead import generation_shapes

codec, bits, v_bits = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
_, backend = ahead.target_backend(GPUTarget("cuda", 90, 32))
calls = []
append, attend = CompressedKVCache.append, CompressedKVCache.attend

def spy_append(self, k, v):
    calls.append((self, "append", k, v))
    return append(self, k, v)

def spy_attend(self, q, scale):
    calls.append((self, "attend", q, scale))
    return attend(self, q, scale)

# a real generation of the default model (the reference backend: fast on the CPU), its caches' calls kept
CompressedKVCache.append, CompressedKVCache.attend = spy_append, spy_attend
pipe = load_aar()
os.environ["OCTOPUS_AUDIO_KERNELS"] = "reference"
with patch_aar(pipe, codec, bits, v_bits=v_bits):
    generate(pipe, torch.randn(1, 512, generator=torch.Generator().manual_seed(0)) * 0.05, seed=3)
CompressedKVCache.append, CompressedKVCache.attend = append, attend

# the same calls, with the same tensors, into caches that run the kernels: the launches that generation makes
os.environ["OCTOPUS_AUDIO_KERNELS"] = "kernels"
fresh = {}
with ahead.recording() as launched:
    for cache, op, a, b in calls:
        if id(cache) not in fresh:
            fresh[id(cache)] = CompressedKVCache(cache.codec_name, cache.bits, cache.head_dim, cache.window,
                                                 cache.v_group, cache.seed, cache.v_bits, cache.capacity)
        getattr(fresh[id(cache)], op)(a, b)
real = set(ahead.launches_of(launched, backend))
enumerated = {}
for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
    enumerated[name] = set(ahead.cache_launches(codec, bits, generation_shapes(pipe, 1, dtype), "cpu",
                                                v_bits=v_bits, backend=backend))
print(json.dumps({"layers": len(fresh), "real": sorted(x.label() for x in real),
                  "equal": real == enumerated["fp32"], "bf16_equal": real == enumerated["bf16"],
                  "missed": sorted(x.label() for x in real - enumerated["fp32"]),
                  "extra": sorted(x.label() for x in enumerated["fp32"] - real)}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("codec, bits, v_bits", [("octopus", 2, 2), ("turboquant-mse", 3, 3),
                                                  ("octopus-qjl", 2, 4), ("polarquant", 4, 2)],
                         ids=["octopus-b2", "turboquant-mse-b3", "octopus-qjl-k2v4", "polarquant-k4v2"])
def test_enumerated_variants_equal_a_real_generation_of_the_default_model(codec, bits, v_bits):
    """Every variant the default model's generation launches (fp32 on the CPU: the interpreter's launch
    choices) is enumerated, and nothing else; the bf16 enumeration differs (the comparison can fail)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", _GENERATION_VS_ENUMERATION, codec, str(bits), str(v_bits)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["layers"] == 4
    names = {label.split("(")[0] for label in found["real"]}
    assert {"_attn_fwd_kernel", "_encode_unit_kernel"} <= names, found["real"]
    assert found["equal"], f"missed {found['missed']}, extra {found['extra']}"
    assert not found["bf16_equal"]


def _launch(i: int) -> ahead.Launch:
    return ahead.Launch(f"tests.fake:kernel{i}", f"kernel{i}", {"x_ptr": "*fp32", "N": "constexpr"},
                        {(1,): i}, {(0,): [["tt.divisibility", 16]]}, {"num_warps": 4})


def _fake_compile(item) -> str | None:
    """A stand-in compile (a worker's job): marks the launch in the folder passed as the target."""
    launch, folder = item
    n = launch.constexprs[(1,)]
    Path(folder, f"{n}.{os.getpid()}.{uuid.uuid4().hex}").write_text("compiled")
    return "boom: no such kernel" if n == 3 else None


@pytest.mark.parametrize("workers", [1, 3], ids=["in-process", "3-workers"])
def test_parallel_compile_runs_each_variant_once_with_progress_and_failures(tmp_path, workers):
    launches = [_launch(i) for i in range(7)]
    seen = []
    with ahead.ParallelCompiler(str(tmp_path), workers, compile_fn=_fake_compile) as compiler:
        failed = compiler.compile(launches, lambda done, total, launch: seen.append((done, total, launch)))
        again = compiler.compile(launches[:2])  # the pool serves a second batch
    marks = sorted(p.name.split(".")[0] for p in tmp_path.iterdir())
    assert marks == sorted([str(i) for i in range(7)] + ["0", "1"])
    assert [d for d, _, _ in seen] == list(range(8)) and {t for _, t, _ in seen} == {7}
    assert seen[0][2] is None and {launch for _, _, launch in seen[1:]} == set(launches)
    assert failed == {launches[3]: "boom: no such kernel"} and again == {}
    if workers == 1:
        assert {p.name.split(".")[1] for p in tmp_path.iterdir()} == {str(os.getpid())}


def test_parallel_compile_refuses_bad_worker_counts():
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="workers must be an int >= 1"):
            ahead.ParallelCompiler(None, bad)


def test_unit_shapes_are_validated():
    with pytest.raises(ValueError, match="units must be"):
        ahead.UnitShapes(4, 64, (), 2)
    with pytest.raises(ValueError, match="rows must be"):
        ahead.UnitShapes(4, 64, (1, 2), 0)
    with pytest.raises(ValueError, match="dtype must be"):
        ahead.UnitShapes(4, 64, (1, 2), 2, torch.int32)


def _compiled_kernels_run(script: str, cache: Path) -> dict:
    """Run `script` in a fresh Python with compiled (not interpreted) kernels and Triton's cache at `cache`;
    its last stdout line, as JSON."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(cache)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


_REAL_COMPILE = """
import json, pickle, torch
from triton import knobs
from triton.compiler import ASTSource
from triton.runtime.jit import create_function_from_signature
from triton.backends.compiler import GPUTarget
from octopus_audio.aar_patch import compile_variants as ahead
from octopus_audio.kernels.impls import flash
target, backend = ahead.target_backend(GPUTarget("cuda", 90, 32))
opart, lse, out = torch.zeros(3, 40, 64), torch.zeros(3, 40), torch.zeros(40, 64)
with ahead.recording() as calls:
    flash._merge_kernel[(2,)](opart, lse, out, 40, 3, D=64, BLOCK_R=32, num_warps=4)
(launch,) = ahead.launches_of(calls, backend)
# the source a worker rebuilds from the pickled variant has the key of the one JITFunction.run builds
fn, args, kwargs = calls[0]
kwargs = {**kwargs, "debug": False, "instrumentation_mode": knobs.compilation.instrumentation_mode}
if hasattr(knobs.compilation, "fpsan_homomorphic_casts"):  # Triton >= 3.7
    kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
bound, spec, options = create_function_from_signature(fn.signature, fn.params, backend)(*args, **kwargs)
options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, options)
same_source = ahead._source(pickle.loads(pickle.dumps(launch))).hash() == ASTSource(
    fn, signature, constexprs, attrs).hash()
before = ahead.is_cached(launch, target)
error = ahead.compile_launch((launch, target))
# an attention launch: its decode kind's helpers are compile-time arguments, carried by name (JitRef)
from octopus_audio import get_codec
from octopus_audio.cache import kernel_codec
from octopus_audio.kernels import PackedKeys, PackedValues, attention
kc = kernel_codec(get_codec("octopus", 2, 64), 2, "cpu")
keys = PackedKeys(torch.zeros(1, 2, 9, kc.code_words, dtype=torch.int32), torch.ones(1, 2, 9).bfloat16())
values = PackedValues(torch.zeros(1, 2, 9, 4, dtype=torch.int32), torch.ones(1, 2, 9, 4).half(),
                      torch.zeros(1, 2, 9, 4).half(), 2)
with ahead.recording() as calls:
    attention(torch.randn(1, 2, 5, 64).bfloat16(), keys, values, 9, None, None, kc)
(kind_launch,) = ahead.launches_of(calls, backend)
fn, args, kwargs = calls[0]
kwargs = {**kwargs, "debug": False, "instrumentation_mode": knobs.compilation.instrumentation_mode}
if hasattr(knobs.compilation, "fpsan_homomorphic_casts"):
    kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
bound, spec, options = create_function_from_signature(fn.signature, fn.params, backend)(*args, **kwargs)
options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, options)
refs = sorted(str(v) for v in kind_launch.constexprs.values() if isinstance(v, ahead.JitRef))
kind_source = ahead._source(pickle.loads(pickle.dumps(kind_launch))).hash() == ASTSource(
    fn, signature, constexprs, attrs).hash()
print(json.dumps({"before": before, "error": error, "after": ahead.is_cached(launch, target),
                  "dir": ahead.cache_dir(), "same_source": same_source, "kind_refs": refs,
                  "kind_source": kind_source, "kind_label": kind_launch.label()}))
"""


@pytest.mark.slow
def test_a_recorded_launch_compiles_for_sm90_into_the_triton_cache(tmp_path):
    """The worker's real job (no GPU needed): the variant is not cached, compiles, then is. An attention
    launch's decode-kind helpers (compile-time @triton.jit functions) travel pickled by name and rebuild the
    source Triton's own launch would hash."""
    found = _compiled_kernels_run(_REAL_COMPILE, tmp_path / "cache")
    label = found.pop("kind_label")
    assert found == {"before": False, "error": None, "after": True, "dir": str(tmp_path / "cache"),
                     "same_source": True, "kind_refs": ["triplet.queries", "triplet.scores"],
                     "kind_source": True}
    assert label.startswith("_attn_fwd_kernel(SCORES=triplet.scores, K_BITS=7"), label


def test_progress_line_names_the_configuration_and_the_cache():
    from octopus_audio.aar_patch.compile_ahead import stderr_progress

    out = io.StringIO()
    show = stderr_progress(out)
    for done in range(4):
        show("octopus b=2", done, 3)
    lines = out.getvalue().splitlines()
    assert lines == ["compiling kernels for octopus b=2: 0/3 ...",
                     f"compiling kernels for octopus b=2: 3/3, cached for next time in {ahead.cache_dir()}"]


def test_compile_ahead_on_the_cpu_compiles_nothing():
    from octopus_audio.aar_patch import load_aar, patch_aar

    pipe = load_aar()
    with patch_aar(pipe, "octopus", 2) as handle:
        assert handle.compile_ahead(1) == []


_CUDA_NOTHING_LEFT = """
import json, torch
from triton import knobs
from octopus_audio.aar_patch import generate, load_aar, patch_aar
misses = []
pipe = load_aar(device="cuda")
with patch_aar(pipe, "octopus", 2) as handle:
    results = handle.compile_ahead(1)
    knobs.compilation.listener = lambda **kw: misses.append(kw["src"].name) if not kw["cache_hit"] else None
    generate(pipe, torch.randn(1, 512, device="cuda") * 0.05, seed=1)
r = results[0]
print(json.dumps({"variants": r.variants, "compiled": r.compiled, "failed": r.failed, "misses": misses}))
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_generation_after_compile_ahead_compiles_nothing(tmp_path):
    """With an empty Triton cache, compile ahead, then generate: every kernel comes from the cache."""
    found = _compiled_kernels_run(_CUDA_NOTHING_LEFT, tmp_path / "cache")
    assert found["variants"] > 0 and found["compiled"] == found["variants"] and not found["failed"]
    assert found["misses"] == []


def test_every_configuration_compiles_in_one_pool_run_and_shared_variants_once(monkeypatch):
    """compile_ahead with two configurations (the device and the compiler faked): one compile call holding
    each uncached variant once, one progress label, and per configuration its own counts and failures."""
    from octopus_audio.aar_patch import compile_ahead as aar_ahead
    from octopus_audio.aar_patch.patch import PatchConfig

    variants = {"octopus": ["merge", "oct-attn", "oct-enc"], "turboquant-mse": ["merge", "tq-attn", "cached"]}
    calls, shown = [], []

    class FakeLaunch(str):
        def label(self):
            return str(self)

    class FakeCompiler:
        def __init__(self, target, workers):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def compile(self, launches, progress):
            calls.append(list(launches))
            progress(0, len(launches), None)
            progress(len(launches), len(launches), None)
            return {FakeLaunch("tq-attn"): "boom"}

    monkeypatch.setattr(aar_ahead, "_model_device", lambda model: torch.device("cuda", 0))
    monkeypatch.setattr(aar_ahead, "generation_shapes", lambda model, batch, dtype: dtype)
    monkeypatch.setattr(aar_ahead.torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(ahead, "target_backend", lambda: ("target", "backend"))
    monkeypatch.setattr(ahead, "cache_launches", lambda codec, bits, shape, device, **kw: [
        FakeLaunch(v) for v in variants[codec]])
    monkeypatch.setattr(ahead, "is_cached", lambda launch, target: launch == "cached")
    monkeypatch.setattr(ahead, "ParallelCompiler", FakeCompiler)
    configs = [PatchConfig("octopus", 2, sink_scales=0), PatchConfig("turboquant-mse", 3, sink_scales=0)]
    results = aar_ahead.compile_ahead(object(), configs, 1, (torch.bfloat16, torch.float32),
                                      progress=lambda label, done, total: shown.append((label, done, total)))
    assert calls == [["merge", "oct-attn", "oct-enc", "tq-attn"]]
    label = "2 configurations (octopus b=2, ...)"
    assert shown == [(label, 0, 4), (label, 4, 4)]
    assert [(r.label, r.variants, r.compiled, r.failed) for r in results] == [
        ("octopus b=2", 3, 3, {}), ("turboquant-mse b=3", 3, 2, {"tq-attn": "boom"})]


@pytest.mark.parametrize("codec, bits, v_bits, wide_scales",
                         [("octopus", 2, 3, 0), ("turboquant-qjl", 4, 2, 0), ("octopus", 2, 2, 3)],
                         ids=["octopus-k2v3", "turboquant-qjl-k4v2", "octopus-b2-wide3"])
def test_enumerated_teacher_forcing_variants_equal_a_real_one_pass(codec, bits, v_bits, wide_scales,
                                                                    monkeypatch):
    """The fp32 encodes teacher forcing's one pass of the default model launches (its caches' encode calls
    replayed with the kernels chosen, recorded) are the variants `sequence_launches` enumerates."""
    from octopus_audio.aar_patch import generate, load_aar, patch_aar
    from octopus_audio.aar_patch.compile_ahead import generation_shapes
    from octopus_audio.cache import block_causal
    from octopus_audio.eval.fidelity import teacher_forced_probs

    pipe = load_aar()
    cond = torch.randn(1, 512, generator=torch.Generator().manual_seed(0)) * 0.05
    tokens = generate(pipe, cond, seed=3).tokens
    calls, encode = [], block_causal.encode_sequence
    monkeypatch.setattr(block_causal, "encode_sequence",
                        lambda *args: calls.append(args) or encode(*args))
    monkeypatch.setenv("OCTOPUS_AUDIO_KERNELS", "reference")
    with patch_aar(pipe, codec, bits, v_bits=v_bits, wide_scales=wide_scales) as handle:  # default sinks
        teacher_forced_probs(pipe, cond, tokens, scale_loop=False)
        prefix, wide = handle.caches[0].native_prefix, handle.caches[0].wide_prefix
    monkeypatch.setattr(block_causal, "encode_sequence", encode)
    monkeypatch.setenv("OCTOPUS_AUDIO_KERNELS", "kernels")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the kernels may be chosen for CPU tensors (none runs)
    with ahead.recording() as launched:
        for args in calls:  # (codec, value quantizer, k, v) as the one pass encoded them
            encode(*args)
    from triton.backends.compiler import GPUTarget

    _, backend = ahead.target_backend(GPUTarget("cuda", 90, 32))
    real = set(ahead.launches_of(launched, backend))
    enumerated = set(ahead.sequence_launches(codec, bits, generation_shapes(pipe, 1, torch.float32), "cpu",
                                             v_bits=v_bits, backend=backend, native_prefix=prefix,
                                             wide_prefix=wide))
    assert len(calls) == (8 if wide_scales else 4)
    assert {x.name for x in real} == {"_encode_keys_kernel", "_encode_values_kernel"}
    assert enumerated == real
