"""The synthetic probe: the paper's orderings (issue 2) on a small run, the report files and the CLI."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from octopus_audio.apps.probe import ProbeConfig, render_markdown, run_probe
from octopus_audio.cli import main
from octopus_audio.rate_distortion import relative_difference, value_at_rate

BITS = (2, 3, 4)


@pytest.fixture(scope="module")
def small_probe() -> dict:
    # few draws, fewer keys than the paper's 1024, a small needle test and no full search (that is tested in
    # test_octahedral), so it runs in seconds on 2 cores
    config = ProbeConfig(d=128, seeds=2, needle_seeds=1, n_keys=256, n_distractors=255, bits=BITS,
                         rounding_modes=("scalar", "local3x3"))
    return run_probe(config)


def _row(results: dict, codec: str, b: int) -> dict:
    return next(r for r in results["rows"] if r["codec"] == codec and r["bits"] == b)


@pytest.mark.parametrize("b", BITS)
def test_octopus_mse_below_turboquant_mse(small_probe, b):
    ratio = _row(small_probe, "turboquant-mse", b)["mse"][0] / _row(small_probe, "octopus", b)["mse"][0]
    assert ratio > 1.0
    if b == 4:
        assert ratio >= 1.2


def test_octopus_mse_at_least_2x_below_polarquant_at_b2(small_probe):
    assert _row(small_probe, "polarquant", 2)["mse"][0] >= 2 * _row(small_probe, "octopus", 2)["mse"][0]


@pytest.mark.parametrize("b", BITS)
def test_split_b_plus_1_is_the_minimum_of_the_diagonal(small_probe, b):
    entries = [e for e in small_probe["sweep"] if e["bits"] == b and "mse" in e]
    assert {e["delta"] for e in entries} >= {-1, 0, 1, 2}
    best = min(entries, key=lambda e: e["mse"][0])
    assert (best["dir_bits"], best["rho_bits"]) == (b + 1, b - 1)


@pytest.mark.parametrize("b", BITS)
def test_octopus_qjl_inner_product_error_below_turboquant_qjl(small_probe, b):
    assert _row(small_probe, "octopus-qjl", b)["ip_abs_error"][0] < _row(small_probe, "turboquant-qjl", b)[
        "ip_abs_error"][0]


@pytest.mark.parametrize("b", BITS)
def test_local3x3_rounding_beats_scalar(small_probe, b):
    modes = {e["rounding"]: e["mse"][0] for e in small_probe["ablation"] if e["bits"] == b}
    assert modes["local3x3"] < modes["scalar"]


def test_turboquant_mse_matches_its_lloyd_max_figure(small_probe):
    for b, per_vector in {2: 0.1160, 3: 0.03397, 4: 0.00931}.items():
        assert _row(small_probe, "turboquant-mse", b)["mse"][0] * 128 == pytest.approx(per_vector, rel=0.03)


def test_bits_and_bytes_columns(small_probe):
    for r in small_probe["rows"]:
        assert r["bytes_per_key"] == pytest.approx(r["bits_per_coordinate"] * 128 / 8)
    # 43 codes x 7 bits in 10 int32 words, plus the bf16 norm
    assert _row(small_probe, "octopus", 2)["bytes_per_key"] == 4 * 10 + 2
    assert 0.5 < small_probe["fp32_needle_mass"][0] <= 1.0
    assert set(small_probe["fp32_needle_mass_by_needle_norm"]) == {"sqrt_d", "gaussian"}


def test_report_has_paper_columns_and_is_json(small_probe):
    text = render_markdown(small_probe)
    assert "| paper | difference |" in text
    assert "## Octopus bit split" in text and "## Octopus rounding" in text
    json.dumps(small_probe)
    claims = {c["claim"] for c in small_probe["comparisons"] if "paper" in c}
    assert "MSE ratio polarquant / octopus" in claims


def test_probe_command_writes_table_and_json(tmp_path, capsys):
    out = tmp_path / "probe"
    code = main(["probe", "--d", "16", "--seeds", "1", "--needle-seeds", "1", "--bits", "2",
                 "--codecs", "octopus,turboquant-mse", "--out", str(out)])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert {r["codec"] for r in results["rows"]} == {"octopus", "turboquant-mse"}
    assert {e["rounding"] for e in results["ablation"]} == {"scalar", "local3x3", "full"}
    assert "octopus" in (out / "table.md").read_text()
    pytest.importorskip("matplotlib")
    for name in ("rd_mse.png", "rd_ip_error.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_value_at_rate_reads_a_curve_log_linearly():
    # turboquant-mse at d=128 (DESIGN section 7 per vector; 2.125 and 3.125 stored bits per coordinate) read
    # at 2.46 bits: the hand figure, about 0.077
    curve = [(3.125, 0.0340), (2.125, 0.1160)]
    assert value_at_rate(curve, 2.46) == pytest.approx(0.0769, abs=5e-4)
    assert value_at_rate(curve, 2.125) == 0.1160 and value_at_rate(curve, 3.125) == 0.0340
    assert value_at_rate(curve, 2.0) is None and value_at_rate(curve, 3.2) is None  # no extrapolation
    assert value_at_rate(curve, 2.625, log=False) == pytest.approx(0.075)
    assert relative_difference(0.0836, 0.077) == "8.6% higher"
    assert relative_difference(0.05, 0.1) == "50.0% lower" and relative_difference(1.0, 1.0) == "equal"


def test_equal_rate_table_reads_each_peer_at_octopus_rate(small_probe):
    entries = small_probe["equal_rate"]
    assert {e["metric"] for e in entries} == {"mse", "ip_abs_error"}
    assert {e["codec"] for e in entries} == {"octopus", "octopus-qjl"}
    for e in entries:
        curve = sorted((r["bits_per_coordinate"], r[e["metric"]][0]) for r in small_probe["rows"]
                       if r["codec"] == e["peer"])
        xs, ys = np.array(curve).T
        assert e["rate"] == _row(small_probe, e["codec"], e["bits"])["bits_per_coordinate"]
        if xs[0] <= e["rate"] <= xs[-1]:
            assert e["peer_value"] == pytest.approx(np.exp(np.interp(e["rate"], xs, np.log(ys))), rel=1e-12)
            assert e["relative_difference"] == pytest.approx(e["value"] / e["peer_value"] - 1)
        else:
            assert e["peer_value"] is None and e["relative_difference"] is None
    # octopus b=2 (2.625 bits) lies inside every peer's measured range; b=4 (4.625) beyond the peers' b=4
    inside = [e for e in entries if (e["codec"], e["bits"], e["metric"]) == ("octopus", 2, "mse")]
    assert {e["peer"] for e in inside if e["peer_value"] is not None} == {"turboquant-mse", "turboquant-qjl",
                                                                          "polarquant"}
    text = render_markdown(small_probe)
    assert "## At equal rate" in text and "- (measured 2.125..4.125)" in text
    assert re.search(r"\| octopus b=2 \| 2\.625 \| \S+ \| \S+: octopus \d+\.\d% (lower|higher) \|", text)


@pytest.mark.parametrize("argv,needle", [
    (["--bits", "two"], "--bits"),
    (["--d", "100"], "power of two"),
    (["--codecs", "zip"], "allowed"),
    (["--seeds", "0"], "seeds"),
], ids=["bits", "d", "codecs", "seeds"])
def test_probe_bad_arguments_exit_2(tmp_path, capsys, argv, needle):
    assert main(["probe", "--out", str(tmp_path), *argv]) == 2
    assert needle in capsys.readouterr().err
