"""The end-to-end benchmark's kernel classes: every kernel of ours counts as attention and cache work in its
profiles (a Gluon or table kernel once fell into "rest", which hid the attention's share)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_patch  # noqa: E402  (the benchmark script, from its folder)


@pytest.mark.parametrize("name", ["_gluon_attn_kernel", "_adc_attn_kernel", "_attn_fwd_kernel",
                                  "_merge_splits_kernel", "_merge_kernel", "_encode_unit_kernel",
                                  "_encode_keys_kernel", "_octopus_tables_kernel",
                                  "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob",
                                  "void at::native::(anonymous namespace)::CatArrayBatchedCopy<int>"])
def test_cache_kernels(name):
    assert bench_patch.kernel_kind(name) == "cache"


@pytest.mark.parametrize("name, kind", [
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT", "rest"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>", "rest"),
    ("void at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)", "copy"),
])
def test_other_kernels(name, kind):
    assert bench_patch.kernel_kind(name) == kind


def test_every_package_kernel_is_found():
    """The package's kernels are found by name, so a kernel added later is classed without a list to keep."""
    assert {"_gluon_attn_kernel", "_adc_attn_kernel", "_encode_keys_kernel"} <= bench_patch.package_kernels()


def test_ceilings():
    """256 samples over 0.4 s of the rest and 0.1 s of copies: 640 samples/s without the copies, 512 with."""
    rest, model = bench_patch.ceilings(256, {"cache": 5e4, "copy": 1e5, "rest": 4e5})
    assert rest == pytest.approx(640.0) and model == pytest.approx(512.0)
    assert bench_patch.ceilings(8, {"cache": 1.0}) == (None, None)
