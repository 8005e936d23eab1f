"""What `octopus-audio bench` times: the public `CompressedKVCache.attend` of a cache it filled, or with a
tuning configuration the launcher over a random store; both against the row's decode-then-SDPA reference.

Runs the Triton kernels on the CPU under TRITON_INTERPRET=1 (small shapes); with
OCTOPUS_AUDIO_TEST_DEVICE=cuda on the GPU. Times nothing.
"""

import math
import os

DEVICE = os.environ.get("OCTOPUS_AUDIO_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from helpers import kernel_ops  # noqa: E402

from octopus_audio import CompressedKVCache  # noqa: E402
from octopus_audio.apps.bench import AttnShape, Job, _attention_inputs, _ours_attention, plan  # noqa: E402

# 2 rows x 2 heads, 5 queries against 37 compressed + 4 window keys (odd sizes), and one query
SHAPES = [AttnShape("small", 2, 2, 5, 37, 4, 64), AttnShape("one query", 1, 2, 1, 29, 1, 64)]


@pytest.fixture(autouse=True)
def _triton(monkeypatch):
    kernel_ops(DEVICE)
    monkeypatch.setenv("OCTOPUS_AUDIO_KERNELS", "kernels")


def _decode_sdpa(inputs, d):
    ks, vs, q = inputs["ks"], inputs["vs"], inputs["q"]
    k_all = torch.cat([inputs["codec"].decode(ks, torch.float32), inputs["k_win"].float()], 2)
    v_all = torch.cat([inputs["quant"].decode(vs, torch.float32), inputs["v_win"].float()], 2)
    return F.scaled_dot_product_attention(q.float(), k_all, v_all, scale=1 / math.sqrt(d))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.label.replace(" ", "-"))
@pytest.mark.parametrize("codec", ["octopus", "turboquant-qjl"])
def test_default_rows_time_the_public_cache_attend(codec, shape):
    inputs = _attention_inputs(Job("attention", codec, 2, shape), torch.device(DEVICE))
    cache = inputs["cache"]
    assert isinstance(cache, CompressedKVCache) and cache.length == shape.length
    assert cache.window_tokens == shape.window and cache.backend == "triton"
    got = _ours_attention(Job("attention", codec, 2, shape), inputs)()
    assert torch.equal(got, cache.attend(inputs["q"], 1 / math.sqrt(shape.d)))
    torch.testing.assert_close(got.float(), _decode_sdpa(inputs, shape.d), rtol=2e-2, atol=2e-2)


def test_tuned_rows_run_the_launcher_with_their_configuration():
    from octopus_audio.kernels import AttnConfig

    shape, config = SHAPES[0], AttnConfig(64, 64, 4, 1)
    job = Job("attention", "octopus", 2, shape, config=config)
    inputs = _attention_inputs(job, torch.device(DEVICE))
    assert "cache" not in inputs
    got = _ours_attention(job, inputs)()
    torch.testing.assert_close(got.float(), _decode_sdpa(inputs, shape.d), rtol=2e-2, atol=2e-2)


def test_the_plan_times_every_attention_row_publicly_and_adds_tuned_rows():
    from octopus_audio.kernels import AttnConfig

    untuned = plan("full", ["octopus"], [2], {})
    assert all(j.config is None for j in untuned if j.kind == "attention")
    tuned = plan("full", ["octopus"], [2], {"aar": AttnConfig(64, 64, 4, 1)})
    aar = [j for j in tuned if j.kind == "attention" and j.shape.tq > 1]
    assert [j.config is None for j in aar] == [True, False] * (len(aar) // 2)


def test_a_row_that_breaks_the_gpu_is_recorded_and_named(tmp_path, monkeypatch):
    """A row whose error leaves the GPU unusable (empty_cache raising afterwards) is written to the partial
    file with its error before the run stops, and the stop names it."""
    from octopus_audio.apps import bench

    def broken(job, rep_ms, sdpa_ms):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def lost():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(bench, "_attention_row", broken)
    monkeypatch.setattr(torch.cuda, "empty_cache", lost)
    job = Job("attention", "octopus", 2, SHAPES[0])
    partial = tmp_path / "rows_partial.json"
    with pytest.raises(RuntimeError, match="unusable after the row.*'codec': 'octopus'"):
        bench.run_rows([job, job], 10, 1.0, partial=partial)
    import json

    rows = json.loads(partial.read_text())
    assert len(rows) == 1 and "illegal memory access" in rows[0]["error"]


def test_sdpa_backends_each_compute_sdpa():
    """Every SDPA backend the bench offers as a baseline computes SDPA of the same inputs (those that do not
    take them here are left out; the math backend always does)."""
    from octopus_audio.apps.timing import sdpa_backends

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 64, generator=g).to(DEVICE).bfloat16() for n in (5, 41, 41))
    calls = sdpa_backends(q, k, v)
    assert "math" in calls
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    for name, call in calls.items():
        got = call().float()
        assert ((got - want).norm() / want.norm()).item() < 1e-2, name


def test_the_table_has_a_cell_for_every_column_and_names_the_fastest_backend():
    """Attention rows (with and without a graph time), encode rows and error rows fill every column; the
    fastest-backend cell says which backend and its time."""
    from octopus_audio.apps.bench import table

    attention = {"kind": "attention", "shape": "AAR", "codec": "octopus", "bits": 2, "ms": 0.1,
                 "sdpa_bf16_ms": 0.2, "speedup_vs_sdpa": 2.0, "bytes": 1e6, "gbps": 10.0, "frac_copy_bw": 0.1,
                 "rel_err_vs_decode_sdpa": 1e-3}
    graphed = {**attention, "graph_ms": 0.09, "sdpa_graph_ms": 0.1, "speedup_vs_sdpa_graph": 1.1,
               "sdpa_best_backend": "cudnn", "sdpa_best_graph_ms": 0.08,
               "speedup_vs_best_graph": 0.89}
    encode = {"kind": "encode-k", "shape": "64k", "codec": "octopus", "bits": 2, "ms": 0.1,
              "reference_ms": 1.0, "speedup_vs_reference": 10.0, "bytes": 1e6, "gbps": 1.0,
              "frac_copy_bw": 0.1, "matches_reference": True}
    error = {"kind": "attention", "shape": "AAR", "codec": "octopus", "bits": 2, "error": "boom"}
    lines = table([attention, graphed, encode, error]).splitlines()
    assert len({line.count("|") for line in lines}) == 1, lines
    assert "| cudnn 0.0800 | 0.89 |" in lines[3]
