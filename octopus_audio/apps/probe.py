"""The synthetic probe (`octopus-audio probe`): DESIGN section 7's codec tables on Gaussian and unit keys.

Per codec and nominal bits b (rows), over `seeds` independent draws of n = 1024 Gaussian keys N(0, I_d) and 16
Gaussian queries:
- MSE per coordinate: E[(u_hat - u)^2] of the unit keys u = k / ||k|| (decode(encode(u)); for the QJL codecs
  decode returns the score estimator as a vector, docs/formats.md);
- cosine: mean cos(u, u_hat);
- inner-product error: mean |q.k - scores(q, encode(k))|, the codec's own score estimator, q and k not
  normalised;
- needle mass: one key among 2048 Gaussian distractors N(0, I_d); query q = k_needle + 0.1 z, z ~ N(0, I_d)
  ("10% query noise": ||0.1 z|| is about a tenth of ||k||); attention softmax(q.k / sqrt(d)) over the 2049
  keys (the standard temperature 1/sqrt(d)), the mass on the needle. The needle is a Gaussian direction with
  norm sqrt(d), the distractors' root-mean-square norm (`needle_norm="sqrt_d"`). Why: the paper's fp32 figure
  0.960 is what this gives, e^sqrt(d) / (e^sqrt(d) + 2048 e^(1.01/2)) = 0.960 at d = 128 (needle logit
  sqrt(d) against 2048 logits ~ N(0, 1.01)), with no fitted constant; a needle of random Gaussian norm
  (`needle_norm="gaussian"`) spreads its logit by +-1.4 and gives 0.93 on average, and the report prints that
  fp32 figure too. `needle_seeds` draws (128 by default);
- effective bits per coordinate (the codec's packed format) and bytes per key measured from the state tensors.
Then the octopus bit split sweep (dir_bits, rho_bits) = (b + delta, b - delta), delta in -2..2 (note the
total bits per triplet 3b + delta change along the diagonal), and the rounding ablation scalar / local3x3 /
full. Rate-distortion: the codecs store different amounts at one nominal b, so MSE and inner-product error
are also read against the key bits each codec stores per coordinate (its packed format, norms included): the
"at equal rate" table puts each OCTOPUS codec's figure beside every other codec's curve read at the same
rate (`octopus_audio.rate_distortion.value_at_rate`: log-linear between that codec's two nearest measured
widths, no extrapolation), and states the difference whichever way it falls; with matplotlib installed the
probe also draws the curves (`rd_mse.png`, `rd_ip_error.png`). Every seed chunk uses its own codec seed,
and each seed in a chunk is a different head, so rotations differ across seeds as well as data. Where
section 7 gives a figure, the report prints it beside ours.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch

from octopus_audio.codecs import (
    Octopus,
    OctopusQJL,
    PolarQuant,
    TurboQuantMSE,
    TurboQuantQJL,
    compressed_codecs,
)
from octopus_audio.errors import UsageError

log = logging.getLogger(__name__)

RD_METRICS = (("mse", "MSE/coord", "rd_mse.png"), ("ip_abs_error", "IP abs error", "rd_ip_error.png"))
OCTOPUS, OCTOPUS_QJL, POLAR = Octopus.name, OctopusQJL.name, PolarQuant.name
TQ_MSE, TQ_QJL = TurboQuantMSE.name, TurboQuantQJL.name
ROUNDING_MODES = ("scalar", "local3x3", "full")
DELTAS = (-2, -1, 0, 1, 2)
NEEDLE_NORMS = ("sqrt_d", "gaussian")

# DESIGN section 7. tq_mse_per_vector is E||u - u_hat||^2 at d = 128 (the Lloyd-Max figures); the rest are
# the OCTOPUS paper's (n = 1024 Gaussian keys, 16 queries, d = 128, 64 seeds; needle: 128 seeds). The needle
# figures at b = 2 are "octopus 0.92 versus 0.86 / 0.87 / 0.33 for the others"; we read "the others" in the
# order of DESIGN section 2 (turboquant-mse, turboquant-qjl, polarquant). The paper does not say at which b
# the 3x inner-product figure holds; we print it beside every b.
PAPER = {
    "d": 128,
    "tq_mse_per_vector": {2: 0.1160, 3: 0.03397, 4: 0.00931},
    "mse_ratio_turboquant_over_octopus": {4: 1.3},
    "mse_ratio_polarquant_over_octopus": {2: 2.4},
    "ip_ratio_turboquant_qjl_over_octopus_qjl": 3.0,
    "needle_fp32": 0.960,
    "needle_octopus_qjl_gap": 0.001,
    "needle_b2": {OCTOPUS: 0.92, TQ_MSE: 0.86, TQ_QJL: 0.87, POLAR: 0.33},
    "split_gain_over_bb": (0.31, 0.41),
    "local3x3_gain_over_scalar": (0.06, 0.14),
}


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
    """What the probe measures. needle_seeds=None means 2 * seeds (128 at the default 64, as the paper)."""

    d: int = 128
    seeds: int = 64
    needle_seeds: int | None = None
    bits: tuple[int, ...] = (2, 3, 4)
    codecs: tuple[str, ...] = dataclasses.field(default_factory=compressed_codecs)
    n_keys: int = 1024
    n_queries: int = 16
    n_distractors: int = 2048
    needle_noise: float = 0.1
    needle_norm: str = "sqrt_d"
    sweep: bool = True
    rounding_modes: tuple[str, ...] = ROUNDING_MODES
    seed_chunk: int = 8
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.d not in tuple(2**k for k in range(3, 11)):
            raise ValueError(f"probe d must be a power of two in 8..1024, got {self.d}")
        for name in ("seeds", "n_keys", "n_queries", "n_distractors", "seed_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"probe {name} must be >= 1, got {getattr(self, name)}")
        if self.needle_seeds is None:
            object.__setattr__(self, "needle_seeds", 2 * self.seeds)
        if self.needle_seeds < 1:
            raise ValueError(f"probe needle_seeds must be >= 1, got {self.needle_seeds}")
        if not self.bits or any(b not in range(1, 8) for b in self.bits):
            raise ValueError(f"probe bits must be values in 1..7, got {self.bits}")
        unknown = set(self.codecs) - set(compressed_codecs())
        if unknown:
            raise ValueError(f"probe codecs {sorted(unknown)} unknown; "
                             f"allowed: {', '.join(compressed_codecs())}")
        bad_modes = set(self.rounding_modes) - set(ROUNDING_MODES)
        if bad_modes:
            raise ValueError(f"probe rounding modes {sorted(bad_modes)} unknown; allowed: "
                             f"{', '.join(ROUNDING_MODES)}")
        if self.needle_norm not in NEEDLE_NORMS:
            raise ValueError(f"probe needle_norm {self.needle_norm!r} unknown; allowed: "
                             f"{', '.join(NEEDLE_NORMS)}")
        if self.needle_noise < 0:
            raise ValueError(f"probe needle_noise must be >= 0, got {self.needle_noise}")


def _chunks(total: int, size: int) -> list[range]:
    return [range(s, min(s + size, total)) for s in range(0, total, size)]


def _gaussian(seeds: range, shape: tuple[int, ...], stream: int, device: str) -> torch.Tensor:
    """[len(seeds), *shape] N(0, 1) fp32, one generator per seed (so results do not depend on chunking)."""
    out = []
    for s in seeds:
        g = torch.Generator().manual_seed(s * 7919 + stream)
        out.append(torch.randn(shape, generator=g))
    return torch.stack(out).to(device)


def _mean_sem(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


class _Probe:
    def __init__(self, config: ProbeConfig, progress: Callable[[int], None]) -> None:
        self.c = config
        self.progress = progress
        self.key_chunks = _chunks(config.seeds, config.seed_chunk)
        self.needle_chunks = _chunks(config.needle_seeds, config.seed_chunk)
        self._mse_cache: dict[tuple, dict] = {}

    def _codec(self, name: str, bits: int, chunk: int, **options):
        from octopus_audio.codecs import get_codec

        return get_codec(name, bits, self.c.d, seed=chunk, **options)

    def _keys(self, seeds: range) -> tuple[torch.Tensor, torch.Tensor]:
        k = _gaussian(seeds, (self.c.n_keys, self.c.d), 0, self.c.device)
        q = _gaussian(seeds, (self.c.n_queries, self.c.d), 1, self.c.device)
        return k, q

    def unit_mse(self, name: str, bits: int, **options) -> dict:
        """MSE per coordinate and cosine of unit keys, per seed (memoised: sweep and ablation reuse it)."""
        key = (name, bits, tuple(sorted(options.items())))
        if key in self._mse_cache:
            self.progress(len(self.key_chunks))
            return self._mse_cache[key]
        mse, cos = [], []
        for ci, seeds in enumerate(self.key_chunks):
            codec = self._codec(name, bits, ci, **options)
            k, _ = self._keys(seeds)
            u = k / k.norm(dim=-1, keepdim=True)
            u_hat = codec.decode(codec.encode(u)).float()
            mse += ((u_hat - u) ** 2).mean(dim=(-2, -1)).tolist()
            cos += torch.nn.functional.cosine_similarity(u_hat, u, dim=-1).mean(-1).tolist()
            self.progress(1)
        out = {"mse": _mean_sem(mse), "cosine": _mean_sem(cos),
               "bits_per_coordinate": codec.bits_per_coordinate}
        self._mse_cache[key] = out
        return out

    def inner_products(self, name: str, bits: int) -> dict:
        errors, nbytes, count = [], 0, 0
        for ci, seeds in enumerate(self.key_chunks):
            codec = self._codec(name, bits, ci)
            k, q = self._keys(seeds)
            state = codec.encode(k)
            nbytes += state.nbytes
            count += k.shape[0] * k.shape[1]
            exact = q.double() @ k.double().mT
            errors += (codec.scores(q, state).double() - exact).abs().mean(dim=(-2, -1)).tolist()
            self.progress(1)
        return {"ip_abs_error": _mean_sem(errors), "bytes_per_key": nbytes / count}

    def needle(self, name: str | None, bits: int, needle_norm: str | None = None) -> dict:
        """Softmax mass on the needle; name None is the exact fp32 reference."""
        masses = []
        d = self.c.d
        for ci, seeds in enumerate(self.needle_chunks):
            keys = _gaussian(seeds, (1 + self.c.n_distractors, d), 2, self.c.device)  # key 0 is the needle
            if (needle_norm or self.c.needle_norm) == "sqrt_d":
                keys[:, 0] *= math.sqrt(d) / keys[:, 0].norm(dim=-1, keepdim=True)
            z = _gaussian(seeds, (1, d), 3, self.c.device)
            q = keys[:, :1] + self.c.needle_noise * z
            if name is None:
                scores = q @ keys.mT
            else:
                codec = self._codec(name, bits, 1000 + ci)
                scores = codec.scores(q, codec.encode(keys))
            masses += torch.softmax(scores.float() / math.sqrt(d), dim=-1)[:, 0, 0].tolist()
            self.progress(1)
        return {"needle_mass": _mean_sem(masses)}


def _steps(c: ProbeConfig) -> int:
    nk, nn = len(_chunks(c.seeds, c.seed_chunk)), len(_chunks(c.needle_seeds, c.seed_chunk))
    rows = len(c.codecs) * len(c.bits)
    steps = 2 * nn + rows * (2 * nk + nn)
    if c.sweep:
        steps += len(c.bits) * len(DELTAS) * nk
    steps += len(c.bits) * len(c.rounding_modes) * nk
    return steps


def _rel_diff(ours: float, paper: float) -> float:
    return (ours - paper) / paper


def _range_diff(ours: float, lo: float, hi: float) -> float:
    """0 inside [lo, hi], else the signed distance to the nearest end."""
    return 0.0 if lo <= ours <= hi else (ours - lo if ours < lo else ours - hi)


def run_probe(config: ProbeConfig, progress: bool = False) -> dict:
    """Run the probe; returns the results dictionary that `results.json` holds."""
    from tqdm import tqdm

    start = time.time()
    bar = tqdm(total=_steps(config), desc="probe", disable=not progress)
    p = _Probe(config, bar.update)
    c = config
    paper_d = c.d == PAPER["d"]
    fp32_needle = p.needle(None, 0)["needle_mass"]
    other_norm = next(n for n in NEEDLE_NORMS if n != c.needle_norm)
    fp32_needle_other = p.needle(None, 0, other_norm)["needle_mass"]
    rows = []
    for name in c.codecs:
        for b in c.bits:
            row = {"codec": name, "bits": b, **p.unit_mse(name, b), **p.inner_products(name, b),
                   **p.needle(name, b)}
            if paper_d and name == TQ_MSE and b in PAPER["tq_mse_per_vector"]:
                row["paper_mse"] = PAPER["tq_mse_per_vector"][b] / c.d
            if paper_d and b == 2 and name in PAPER["needle_b2"]:
                row["paper_needle"] = PAPER["needle_b2"][name]
            if paper_d and name == OCTOPUS_QJL:
                row["paper_needle"] = PAPER["needle_fp32"]
            rows.append(row)

    sweep = []
    if c.sweep:
        for b in c.bits:
            for delta in DELTAS:
                entry = {"bits": b, "delta": delta, "dir_bits": b + delta, "rho_bits": b - delta}
                try:
                    entry.update(p.unit_mse(OCTOPUS, b, dir_bits=b + delta, rho_bits=b - delta))
                except ValueError as e:  # a split the codec does not support (dir_bits 0 at b = 2)
                    entry["unsupported"] = str(e)
                    p.progress(len(p.key_chunks))
                sweep.append(entry)

    ablation = []
    for b in c.bits:
        for mode in c.rounding_modes:
            ablation.append({"bits": b, "rounding": mode, **p.unit_mse(OCTOPUS, b, rounding=mode)})
    bar.close()

    results = {
        "config": dataclasses.asdict(c),
        "fp32_needle_mass": fp32_needle,
        "fp32_needle_mass_by_needle_norm": {c.needle_norm: fp32_needle, other_norm: fp32_needle_other},
        "rows": rows,
        "sweep": sweep,
        "ablation": ablation,
        "comparisons": _comparisons(c, rows, sweep, ablation, fp32_needle),
        "equal_rate": equal_rate(rows),
        "paper": {k: (v if not isinstance(v, dict) else {str(kk): vv for kk, vv in v.items()})
                  for k, v in PAPER.items()},
        "environment": {"torch": torch.__version__, "python": platform.python_version(), "device": c.device,
                        "seconds": round(time.time() - start, 1)},
    }
    return results


def equal_rate(rows: list[dict]) -> list[dict]:
    """Per metric (MSE, inner-product error), OCTOPUS codec and b: its rate (key bits per coordinate) and
    value, and every other codec's curve read at that rate (`rate_distortion.equal_rate`)."""
    from octopus_audio.rate_distortion import equal_rate as read_at_rates

    out = []
    for metric, _, _ in RD_METRICS:
        points: dict[str, list] = {}
        for r in rows:
            points.setdefault(r["codec"], []).append((r["bits_per_coordinate"], r[metric][0],
                                                      f"{r['codec']} b={r['bits']}"))
        bits = {(r["codec"], f"{r['codec']} b={r['bits']}"): r["bits"] for r in rows}
        out += [{"metric": metric, "bits": bits[(e["codec"], e["label"])], **e}
                for e in read_at_rates(points)]
    return out


def plot_rate_distortion(results: dict, out_dir: Path) -> list[str]:
    """rd_mse.png and rd_ip_error.png: each codec's curve through its widths (the means over seeds) against
    the key bits stored per coordinate, log error axis."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from octopus_audio.rate_distortion import draw_curves

    rows, c = results["rows"], results["config"]
    names = []
    for metric, label, name in RD_METRICS:
        fig = Figure(figsize=(6, 4), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        curves = {codec: [(r["bits_per_coordinate"], r[metric][0]) for r in rows if r["codec"] == codec]
                  for codec in dict.fromkeys(r["codec"] for r in rows)}
        draw_curves(ax, curves)
        ax.set_yscale("log")
        ax.set_ylabel(f"{label} (log scale)")
        ax.set_xlabel("key bits stored per coordinate (norms included)")
        ax.set_title(f"{label} vs stored bits, d={c['d']}, {c['seeds']} seeds (lower is better)", fontsize=10)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / name, metadata={"Software": None})
        names.append(name)
    return names


def _row(rows: list[dict], name: str, b: int) -> dict | None:
    return next((r for r in rows if r["codec"] == name and r["bits"] == b), None)


def _comparisons(c: ProbeConfig, rows, sweep, ablation, fp32_needle) -> list[dict]:
    """Our figure beside the paper's for each claim of DESIGN section 7 (paper None where it has none)."""
    paper_d = c.d == PAPER["d"]
    out = []

    def add(claim: str, b: int | None, ours: float, paper: float | None = None,
            paper_range: tuple[float, float] | None = None) -> None:
        entry = {"claim": claim, "bits": b, "ours": ours}
        if paper_d and paper is not None:
            entry.update(paper=paper, difference=ours - paper, relative_difference=_rel_diff(ours, paper))
        if paper_d and paper_range is not None:
            entry.update(paper=list(paper_range), difference=_range_diff(ours, *paper_range))
        out.append(entry)

    add("needle mass, exact fp32 scores", None, fp32_needle[0], PAPER["needle_fp32"])
    for b in c.bits:
        oct_, tq, pq = _row(rows, OCTOPUS, b), _row(rows, TQ_MSE, b), _row(rows, POLAR, b)
        if oct_ and tq:
            add("MSE ratio turboquant-mse / octopus", b, tq["mse"][0] / oct_["mse"][0],
                PAPER["mse_ratio_turboquant_over_octopus"].get(b))
        if oct_ and pq:
            add("MSE ratio polarquant / octopus", b, pq["mse"][0] / oct_["mse"][0],
                PAPER["mse_ratio_polarquant_over_octopus"].get(b))
        oq, tqq = _row(rows, OCTOPUS_QJL, b), _row(rows, TQ_QJL, b)
        if oq and tqq:
            add("inner-product error ratio turboquant-qjl / octopus-qjl", b,
                tqq["ip_abs_error"][0] / oq["ip_abs_error"][0],
                PAPER["ip_ratio_turboquant_qjl_over_octopus_qjl"])
        if oq:
            add("needle mass gap fp32 - octopus-qjl (paper: at most)", b,
                fp32_needle[0] - oq["needle_mass"][0], PAPER["needle_octopus_qjl_gap"])
        split = {e["delta"]: e for e in sweep if e["bits"] == b and "mse" in e}
        if 0 in split and 1 in split:
            add("MSE gain of split (b+1, b-1) over (b, b)", b, 1 - split[1]["mse"][0] / split[0]["mse"][0],
                paper_range=PAPER["split_gain_over_bb"])
        modes = {e["rounding"]: e for e in ablation if e["bits"] == b}
        if "scalar" in modes and "local3x3" in modes:
            add("MSE gain of local3x3 over scalar rounding", b,
                1 - modes["local3x3"]["mse"][0] / modes["scalar"]["mse"][0],
                paper_range=PAPER["local3x3_gain_over_scalar"])
    return out


def _fmt(x: float | None, spec: str = ".4g") -> str:
    return "-" if x is None else format(x, spec)


def _pm(pair: tuple[float, float], spec: str = ".4g") -> str:
    mean, sem = pair
    return f"{mean:{spec}}" if math.isnan(sem) else f"{mean:{spec}} ± {sem:.2g}"


def render_markdown(results: dict) -> str:
    c = results["config"]
    lines = [
        f"# OCTOPUS synthetic probe (d={c['d']}, {c['seeds']} seeds of {c['n_keys']} Gaussian keys and "
        f"{c['n_queries']} queries; needle: {c['needle_seeds']} seeds, {c['n_distractors']} distractors, "
        f"query noise {c['needle_noise']:g})",
        "",
        "MSE per coordinate of unit keys (± standard error over seeds); inner-product error: mean |q.k - "
        "estimate| with the codec's own score estimator on N(0, I) keys and queries; needle: softmax(q.k / "
        "sqrt(d)) mass on the needle. `paper`: the DESIGN section 7 figure where there is one "
        "(turboquant-mse MSE: the Lloyd-Max E||u-u_hat||^2 / d; needle at b=2; octopus-qjl: within 0.001 of "
        "fp32). The QJL codecs' decode is their score estimator as a vector, hence their MSE.",
        "",
        "Exact fp32 needle mass: " + ", ".join(
            f"{_pm(v, '.4f')} (needle norm {k}{', used below' if k == c['needle_norm'] else ''})"
            for k, v in results["fp32_needle_mass_by_needle_norm"].items()),
        "",
        "| codec | b | MSE/coord | paper | difference | cosine | IP abs error | needle mass | paper "
        "| difference | bits/coord | bytes/key |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results["rows"]:
        pm, pn = r.get("paper_mse"), r.get("paper_needle")
        dm = None if pm is None else f"{_rel_diff(r['mse'][0], pm):+.1%}"
        dn = None if pn is None else f"{r['needle_mass'][0] - pn:+.3f}"
        lines.append(
            f"| {r['codec']} | {r['bits']} | {_pm(r['mse'])} | {_fmt(pm)} | {dm or '-'} "
            f"| {_pm(r['cosine'], '.5f')} | {_pm(r['ip_abs_error'])} | {_pm(r['needle_mass'], '.4f')} "
            f"| {_fmt(pn, '.3f')} | {dn or '-'} "
            f"| {r['bits_per_coordinate']:.3f} | {r['bytes_per_key']:g} |")
    lines += ["", "## Paper claims", "", "| claim | b | ours | paper | difference |",
              "| --- | --- | --- | --- | --- |"]
    for e in results["comparisons"]:
        paper = e.get("paper")
        paper_txt = "-" if paper is None else (f"{paper[0]:g}..{paper[1]:g}" if isinstance(paper, list)
                                               else f"{paper:g}")
        diff = e.get("difference")
        lines.append(f"| {e['claim']} | {e['bits'] if e['bits'] is not None else '-'} | {e['ours']:.4g} "
                     f"| {paper_txt} | {_fmt(diff, '+.3g')} |")
    if results["sweep"]:
        lines += ["", "## Octopus bit split (dir_bits, rho_bits) = (b + delta, b - delta)", "",
                  "Bits per triplet are 3b + delta, so the diagonal is not iso-bit. Gain: MSE reduction "
                  "versus (b, b).", "",
                  "| b | delta | split | bits/coord | MSE/coord | gain vs (b, b) | minimum |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for b in c["bits"]:
            entries = [e for e in results["sweep"] if e["bits"] == b]
            valid = [e for e in entries if "mse" in e]
            base = next((e for e in valid if e["delta"] == 0), None)
            best = min(valid, key=lambda e: e["mse"][0]) if valid else None
            for e in entries:
                split = f"({e['dir_bits']}, {e['rho_bits']})"
                if "mse" not in e:
                    lines.append(f"| {b} | {e['delta']:+d} | {split} | - | unsupported by the codec "
                                 "| - | - |")
                    continue
                gain = "-" if base is None else f"{1 - e['mse'][0] / base['mse'][0]:+.1%}"
                lines.append(f"| {b} | {e['delta']:+d} | {split} | {e['bits_per_coordinate']:.3f} "
                             f"| {_pm(e['mse'])} | {gain} | {'yes' if e is best else ''} |")
    if results["ablation"]:
        lines += ["", "## Octopus rounding ablation (MSE per coordinate)", "",
                  "| b | rounding | MSE/coord | gain vs scalar |", "| --- | --- | --- | --- |"]
        for b in c["bits"]:
            entries = [e for e in results["ablation"] if e["bits"] == b]
            scalar = next((e for e in entries if e["rounding"] == "scalar"), None)
            for e in entries:
                gain = "-" if scalar is None else f"{1 - e['mse'][0] / scalar['mse'][0]:+.1%}"
                lines.append(f"| {b} | {e['rounding']} | {_pm(e['mse'])} | {gain} |")
    lines += render_equal_rate(results)
    env = results["environment"]
    lines += ["", f"torch {env['torch']}, python {env['python']}, device {env['device']}, "
              f"{env['seconds']} s", ""]
    return "\n".join(lines)


def render_equal_rate(results: dict) -> list[str]:
    """The "at equal rate" section: per metric, a row per OCTOPUS codec and b, a column per other codec."""
    from octopus_audio.rate_distortion import equal_rate_table

    entries = results.get("equal_rate") or []
    if not entries:
        return []
    lines = ["", "## At equal rate", "",
             "Each OCTOPUS codec at its measured rate (key bits stored per coordinate, norms and packing "
             "included), beside every other codec's curve read at that rate: log-linear between that codec's "
             "two nearest measured widths, '-' where the rate lies outside them (no extrapolation). The "
             "difference is ours against theirs, lower error being better."]
    codecs = list(dict.fromkeys(r["codec"] for r in results["rows"]))
    for metric, label, _ in RD_METRICS:
        lines += ["", f"### {label}", ""]
        lines += equal_rate_table([e for e in entries if e["metric"] == metric], label, codecs)
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--d", type=int, default=128, help="head dimension (a power of two in 8..1024)")
    parser.add_argument("--seeds", type=int, default=64, help="independent draws of keys and queries")
    parser.add_argument("--needle-seeds", type=int, default=None, help="needle draws (default: 2 x seeds)")
    parser.add_argument("--needle-norm", default="sqrt_d", choices=NEEDLE_NORMS,
                        help="needle key norm: sqrt(d) (default, the paper's fp32 0.960) or Gaussian")
    parser.add_argument("--bits", default="2,3,4", help="comma-separated nominal bits (1..7)")
    parser.add_argument("--codecs", default="all", help=f"'all' or a comma-separated subset of "
                                                        f"{', '.join(compressed_codecs())}")
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    parser.add_argument("--out", required=True, type=Path, help="folder for table.md and results.json")


def run(args: argparse.Namespace) -> int:
    try:
        bits = tuple(int(b) for b in args.bits.split(","))
    except ValueError:
        raise UsageError(f"--bits must be comma-separated integers such as 2,3,4, "
                         f"got {args.bits!r}") from None
    codecs = compressed_codecs() if args.codecs == "all" else tuple(s.strip() for s in args.codecs.split(","))
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {args.device} was asked for but no CUDA device is available; use cpu")
    try:
        config = ProbeConfig(d=args.d, seeds=args.seeds, needle_seeds=args.needle_seeds, bits=bits,
                             needle_norm=args.needle_norm,
                             codecs=codecs, device=args.device)
    except ValueError as e:
        raise UsageError(str(e)) from None
    results = run_probe(config, progress=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "table.md").write_text(render_markdown(results))
    print(f"wrote {args.out / 'table.md'} and {args.out / 'results.json'}")
    try:
        plots = plot_rate_distortion(results, args.out)
    except ModuleNotFoundError as e:
        print(f"rate-distortion plots skipped: they need {e.name} (pip install 'octopus-audio[eval]')")
    else:
        print(f"wrote {', '.join(str(args.out / p) for p in plots)}")
    return 0
