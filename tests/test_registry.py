"""The codec registry: a toy codec declared and registered from this file alone runs through get_codec, the
cache (reference and, reusing a kernel decode kind, the Triton kernels), the patched model and an eval row;
codec names live in their codec files; product files stay short."""

from __future__ import annotations

import ast
import dataclasses
import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import SHARED, kernel_ops

import octopus_audio
from octopus_audio.cache import backend as backend_mod
from octopus_audio.codecs import CODECS, RotationCodec, codec_class, get_codec, register, unregister
from octopus_audio.codecs.turboquant import quantize_scalar
from octopus_audio.packing import pack, unpack
from octopus_audio.reference import attend

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ("octopus_audio",)
GOLDEN = SHARED / "aar_reference" / "golden"


def _uniform_levels(bits: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """2^b levels evenly spaced over [-3/sqrt(d), 3/sqrt(d)] (a rotated unit key's coordinates are about
    N(0, 1/d)) and the midpoints between them, both exactly symmetric about 0."""
    n = 2**bits
    step = 6.0 / math.sqrt(head_dim) / (n - 1)
    upper = (torch.arange(n // 2, dtype=torch.float64) + (0.5 if n % 2 == 0 else 0.0)) * step
    levels = torch.cat([-upper.flip(0), upper]) if n > 1 else upper
    return levels.float(), ((levels[1:] + levels[:-1]) / 2).float()


@dataclasses.dataclass(frozen=True, repr=False)
class UniformScalar(RotationCodec):
    """Toy codec: one b-bit index per rotated coordinate into uniform levels (no Lloyd-Max)."""

    name = "toy-uniform"
    supported_bits = (2, 3, 4)

    @property
    def num_codes(self) -> int:
        return self.head_dim

    @property
    def code_bits(self) -> int:
        return self.bits

    def _quantize(self, u):
        return pack(quantize_scalar(u, _uniform_levels(self.bits, self.head_dim)[1].to(u.device)), self.bits)

    def _dequantize(self, codes):
        levels = _uniform_levels(self.bits, self.head_dim)[0].to(codes.device)
        return levels[unpack(codes, self.bits, self.head_dim)]


@dataclasses.dataclass(frozen=True, repr=False)
class UniformScalarKernel(UniformScalar):
    """The toy codec with the fused kernels: it reuses the scalar decode kind (a centroid per coordinate)
    by declaring it and handing over its levels and midpoints as that kind's tables."""

    name = "toy-uniform-kernel"
    kernel_decode = "scalar"

    def kernel_tables(self, device):
        levels, mids = _uniform_levels(self.bits, self.head_dim)
        return {"centroids": levels.to(device), "boundaries": mids.to(device)}


@pytest.fixture
def toy():
    """Both toy codecs registered for the test, removed after it."""
    for cls in (UniformScalar, UniformScalarKernel):
        register(cls)
    yield UniformScalar.name
    for cls in (UniformScalar, UniformScalarKernel):
        unregister(cls.name)


def test_a_registered_codec_is_listed_and_built(toy):
    assert toy in CODECS and toy in octopus_audio.CODECS and tuple(CODECS)[-2:] == (toy, "toy-uniform-kernel")
    codec = get_codec(toy, 3, 64, seed=2)
    assert codec_class(toy) is UniformScalar and codec.bits_per_key == 32 * 6 + 16
    k = torch.randn(2, 3, 17, 64, generator=torch.Generator().manual_seed(0))
    state = codec.encode(k)
    assert state.codes.shape == (2, 3, 17, 6) and state.nbytes == 2 * 3 * 17 * (6 * 4 + 2)
    k_hat = codec.decode(state)
    rel = ((k_hat - k).norm() / k.norm()).item()
    assert 0 < rel < 0.25, rel
    q = torch.randn(2, 3, 5, 64)
    torch.testing.assert_close(codec.scores(q, state), q @ k_hat.mT, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match=r"does not support bits=5: allowed 2\.\.4"):
        get_codec(toy, 5, 64)
    with pytest.raises(ValueError, match="is taken by"):
        register(dataclasses.make_dataclass("Other", [], bases=(UniformScalar,), frozen=True,
                                            namespace={"name": toy}))


def test_a_codec_outside_the_registry_is_unknown():
    assert UniformScalar.name not in CODECS
    with pytest.raises(ValueError, match="unknown codec 'toy-uniform'; allowed: none, "):
        get_codec(UniformScalar.name, 3, 64)


def _decoded_attention(cache, q, scale):
    k_all, v_all = cache.decoded_kv(torch.float32)
    return attend(q.float(), k_all, v_all, scale)


def test_the_cache_runs_it_on_the_reference_path_and_says_so(toy, monkeypatch, caplog):
    monkeypatch.setenv("OCTOPUS_AUDIO_KERNELS", "kernels")  # asked for, but the codec has no kernel decode
    monkeypatch.setattr(backend_mod, "_announced", set())
    cache = octopus_audio.CompressedKVCache(toy, 3, 64, window=1)
    g = torch.Generator().manual_seed(1)
    with caplog.at_level(logging.INFO, logger="octopus_audio.cache.backend"):
        for t in (5, 7, 3):
            cache.append(torch.randn(1, 2, t, 64, generator=g), torch.randn(1, 2, t, 64, generator=g))
    assert cache.backend == "reference" and cache.length == 12 and cache.window_tokens == 3
    said = [r.getMessage() for r in caplog.records
            if "toy-uniform has no kernel decode kind" in r.getMessage()]
    assert len(said) == 1, said
    q = torch.randn(1, 4, 6, 64, generator=g)
    torch.testing.assert_close(cache.attend(q, 0.125), _decoded_attention(cache, q, 0.125))
    assert cache.nbytes < cache.native_nbytes


def test_a_codec_reusing_a_kernel_decode_kind_runs_the_kernels(toy, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("OCTOPUS_AUDIO_KERNELS", "kernels")
    kernel_ops("cpu")
    name = UniformScalarKernel.name
    g = torch.Generator().manual_seed(2)
    units = [(torch.randn(1, 2, t, 64, generator=g), torch.randn(1, 2, t, 64, generator=g))
             for t in (9, 4, 6)]
    cache = octopus_audio.CompressedKVCache(name, 3, 64, window=1, defer_checks=False)
    for k, v in units:
        cache.append(k, v)
    assert cache.backend == "triton" and cache._plan.kernel_encode and cache._plan.kernel_attention
    # the kernels' encode writes what the library's encode gives (up to keys on a level midpoint)
    lib = get_codec(name, 3, 64).encode(torch.cat([k for k, _ in units[:2]], 2))
    assert (cache.store.valid()[0].codes != lib.codes).float().mean() < 0.01
    q = torch.randn(1, 2, 5, 64, generator=g)
    got = cache.attend(q, 0.125)
    want = _decoded_attention(cache, q, 0.125)
    assert ((got - want).norm() / want.norm()).item() < 1e-5


def test_the_patched_model_and_an_eval_row_run_it(toy, tmp_path):
    if not (GOLDEN / "aar.pth").is_file():
        pytest.skip(f"the golden AAR checkpoint is not at {GOLDEN}")
    sf = pytest.importorskip("soundfile")
    from octopus_audio.aar_patch import compressed_kv, generate, load_aar
    from octopus_audio.eval.backends import AARBackend, LazyBackend
    from octopus_audio.eval.records import EvalConfig
    from octopus_audio.eval.runner import evaluate
    from octopus_audio.eval.sources import list_folder

    pipe = load_aar(GOLDEN / "aar.pth", GOLDEN / "sat_release.pt")
    cond = F.normalize(torch.randn(1, 512, generator=torch.Generator().manual_seed(3)), dim=1)
    ref = generate(pipe, cond, fast=False, seed=0)
    with compressed_kv(pipe, toy, 4) as handle:
        out = generate(pipe, cond, fast=False, seed=0)
        stats = handle.stats()
    assert out.audio.shape == ref.audio.shape and torch.isfinite(out.audio).all()
    assert stats.total.ratio > 1.0 and stats.total.tokens == sum(t.shape[1] for t in ref.tokens)

    clips = tmp_path / "clips"
    clips.mkdir()
    sf.write(clips / "tone.wav", 0.3 * np.sin(2 * np.pi * 330 * np.arange(12000) / 24000), 24000)
    config = EvalConfig(codecs=(toy,), bits=(4,), seed=1, floor=False)

    class Conditioner:
        name = "fixed"
        fingerprint = "one fixed condition"
        clap = False  # not a CLAP model: no CLAP FAD

        def embed(self, audio_T):
            return cond[0].numpy()

    backend = LazyBackend(lambda: AARBackend(pipe, config, "golden", "cpu"), "golden")
    results = evaluate(list_folder(clips, n=1, seed=0), tmp_path / "out", config, lambda device: backend,
                       Conditioner(), meta={"clips": "test"}, progress=False)
    assert results["failures"] == []
    group = next(g for g in results["groups"] if g["codec"] == toy)
    assert group["bits"] == 4 and group["clips_ok"] == 1 and group["ratio"]["mean"] > 1.0
    assert math.isfinite(group["metrics"]["lsd_db"]["mean"])
    assert json.loads((tmp_path / "out" / "results.json").read_text())["groups"]


def _product_files():
    for folder in PRODUCT:
        yield from sorted((REPO / folder).rglob("*.py"))


def test_each_codec_name_is_written_in_its_codec_file_only():
    """A codec name as a string literal appears in one product file: the module of the codec's class (torch's
    `reduction="none"` is not the codec)."""
    where: dict[str, set[str]] = {}
    for path in _product_files():
        tree = ast.parse(path.read_text())
        skip = {id(k.value) for k in ast.walk(tree) if isinstance(k, ast.keyword) and k.arg == "reduction"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in CODECS and id(node) not in skip:
                where.setdefault(node.value, set()).add(str(path.relative_to(REPO)))
    for name in CODECS:
        home = codec_class(name).__module__.replace("octopus_audio.", "octopus_audio/").replace(".", "/")
        assert where.get(name) == {f"{home}.py"}, (name, where.get(name))


def test_no_product_file_is_over_600_lines():
    lines = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in _product_files()}
    assert not {name: n for name, n in lines.items() if n > 600}
