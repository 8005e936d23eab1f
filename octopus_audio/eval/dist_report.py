"""The distribution part of an eval's report: per row (the reference's draws, the floors, every codec at its
widths and count of sink scales: a row's `records.Job`, so rows of two sink-scale counts never pool) the FAD
on each embedding against the uncompressed model's other-seed draws, the condition adherence, their 95%
bootstrap intervals over clips, and the verdict; as results, a Markdown table, a CSV, plots against stored
bits per coordinate, and the page's table.

What each number is over (`TEXT` says it to readers):
- A row's outputs are every draw of every clip where the row, the reference's draws and the other-seed
  draws are all ok (`outputs` = clips x draws); a clip with a failed draw in any of the three is left out of
  that row, so every distance compares sets of equal size.
- FAD(row) = Frechet distance between the Gaussian fit of the row's output embeddings and that of the
  other-seed draws (FLOOR) of the same clips. The codec rows share their seeds with the reference, so their
  outputs agree with the reference's until a flipped token; measured against the reference's own draws a
  codec would look nearer than an independent sample of its model is. Against the other-seed draws every
  row's outputs are independent of the set they are compared with, and the reference row's FAD (its draws
  against the other-seed draws: two sample sets of the uncompressed model) is the floor.
- Adherence(row) = mean cosine of each output's conditioner embedding with its clip's condition.
- Verdict: eval/distribution.py's `verdict` on the differences row - reference (FAD and adherence), every
  set resampled with the same clip weights.
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from octopus_audio.eval import distribution as stats
from octopus_audio.eval.cells import (
    JOB_COLUMNS,
    UNCOMPRESSED_ROWS,
    bits_cells,
    curve_names,
    curve_of,
    group_job,
    kv_bits,
)
from octopus_audio.eval.distribution import (
    MIN_VERDICT_CLIPS,
    ClipFrames,
    bootstrap_weights,
    estimate,
    frechet_replicates,
    mean_replicates,
    verdict,
    verdict_level,
)
from octopus_audio.eval.embeddings import CLAP, LATENT, SPECTRAL, load_embeddings
from octopus_audio.eval.records import FLOOR, REFERENCE, Job
from octopus_audio.eval.rows import job_of

log = logging.getLogger(__name__)

FAD_LABELS = {LATENT: "latent FAD", SPECTRAL: "spectral FAD", CLAP: "CLAP FAD"}
ADHERENCE = "adherence"
_FORMATS = {ADHERENCE: "{:.4f}"}
FAD_FORMAT = "{:.4g}"
DIFF_FORMATS = {**{label: "{:+.3g}" for label in FAD_LABELS.values()}, "adherence": "{:+.4f}"}


def _collect(out_dir: Path, rows: Sequence[dict], draws: int, embeddings: Sequence[str]) -> dict:
    """{Job (codec, widths, sink and wide scales): {clip: {"frames": {embedding: (n, C) all draws},
    "adherence": (draws,)}}} for every (row, clip) whose `draws` rows are all ok and whose embedding files
    read back for their identity (an unreadable file leaves its clip out of that row, logged)."""
    by_set: dict[tuple, dict[str, dict[int, dict]]] = {}
    for r in rows:
        if r["status"] != "ok" or r.get("embeddings") is None:
            continue
        by_set.setdefault(job_of(r), {}).setdefault(r["clip"], {})[r.get("draw", 0)] = r
    out: dict[tuple, dict] = {}
    for key, clips in by_set.items():
        for clip, found in clips.items():
            if sorted(found) != list(range(draws)):
                continue
            try:
                loaded = []
                for d in range(draws):
                    identity = json.dumps({"run": found[d]["run"], "clip_sha256": found[d]["clip_sha256"]},
                                          sort_keys=True)
                    loaded.append(load_embeddings(out_dir, found[d]["embeddings"], identity))
            except ValueError as e:
                log.warning("clip %s, %s: %s; left out of the distribution metrics", clip, key.codec, e)
                continue
            frames = {emb: np.concatenate([np.atleast_2d(x[emb]) for x in loaded]) for emb in embeddings}
            out.setdefault(key, {})[clip] = {
                "frames": frames, "adherence": np.array([found[d]["adherence"] for d in range(draws)])}
    return out


def _kv_bits(rows: Sequence[dict], key: Job) -> float | None:
    """The mean K+V bits per coordinate of a row's ok outputs (their patch stats), None without any."""
    values = [v for r in rows
              if r["status"] == "ok" and job_of(r) == key and (v := kv_bits(r["kv"])) is not None]
    return float(np.mean(values)) if values else None


def distribution(out_dir: Path, rows: Sequence[dict], jobs: Sequence, meta: dict) -> dict:
    """The distribution results of a run (module docstring): {"embeddings", "draws", "resamples", "groups":
    one per row in report order (REFERENCE first, then `jobs`)}; each group holds its clips and outputs, per
    embedding the FAD (value, low, high) with the floor on the same clips and the difference, the adherence
    likewise, the verdict (text, distinguishable: bool or None) and its mean K+V bits per coordinate. Rows
    measured on the same clips share one bootstrap (and one fit of the floor's sets per resample)."""
    draws = int(meta.get("draws", 1))
    embeddings = list(meta.get("fad_embeddings", [LATENT, SPECTRAL]))
    data = _collect(out_dir, rows, draws, embeddings)
    ref_key, floor_key = Job(REFERENCE), Job(FLOOR)
    keys = [ref_key] + [Job(*job) for job in jobs]
    has_floor = floor_key in keys
    refs, floors = data.get(ref_key, {}), data.get(floor_key, {})
    clips_of = {key: tuple(sorted(c for c in data.get(key, {})
                                  if c in refs and (not has_floor or c in floors))) for key in keys}
    fads: dict[tuple, dict[str, np.ndarray]] = {}  # key -> embedding -> FAD replicates against the floor
    for clips in dict.fromkeys(c for c in clips_of.values() if c):
        if not has_floor:
            break
        weights = bootstrap_weights(len(clips))
        measured = [k for k in keys if clips_of[k] == clips and k != floor_key]
        for emb in embeddings:
            shift = floors[clips[0]]["frames"][emb].astype(np.float64).mean(0)
            sets = {k: ClipFrames([data[k][c]["frames"][emb] for c in clips], shift)
                    for k in dict.fromkeys([ref_key, *measured])}
            against = ClipFrames([floors[c]["frames"][emb] for c in clips], shift)
            for k, reps in frechet_replicates(sets, against, weights).items():
                fads.setdefault(k, {}).setdefault(clips, {})[emb] = reps
    groups = []
    for key in keys:
        clips = clips_of[key]
        group = {**key._asdict(), "clips": len(clips), "draws": draws,
                 "outputs": len(clips) * draws, "kv_bits_per_coord": _kv_bits(rows, key), "fad": {},
                 "adherence": None, "verdict": None, "distinguishable": None}
        groups.append(group)
        if not clips:
            group["verdict"] = "no verdict: no clip has every draw of this row, the reference and the floor"
            continue
        weights = bootstrap_weights(len(clips))
        adh = mean_replicates([data[key][c]["adherence"] for c in clips], weights)
        adh_ref = mean_replicates([refs[c]["adherence"] for c in clips], weights)
        group["adherence"] = {**estimate(adh).as_dict(), "reference": estimate(adh_ref).as_dict(),
                              "difference": estimate(adh - adh_ref).as_dict()}
        differences = {}
        for emb in embeddings if key in fads else ():
            row, floor = fads[key][clips][emb], fads[ref_key][clips][emb]
            group["fad"][emb] = {**estimate(row).as_dict(), "floor": estimate(floor).as_dict(),
                                 "difference": estimate(row - floor).as_dict()}
            differences[FAD_LABELS[emb]] = row - floor
        differences[ADHERENCE] = adh - adh_ref
        _judge(group, key, differences, has_floor, len(clips))
    return {"embeddings": embeddings, "draws": draws, "resamples": stats.RESAMPLES, "groups": groups}


def _judge(group: dict, key: Job, differences: dict[str, np.ndarray], has_floor: bool, clips: int) -> None:
    """The group's verdict: `verdict` on its measures' difference replicates, or why there is none."""
    if key.codec == REFERENCE:
        group["verdict"] = "the floor: the uncompressed model's draws against its other-seed draws"
    elif key.codec == FLOOR:
        group["verdict"] = "the other-seed draws every FAD is measured against"
    elif not has_floor:
        group["verdict"] = "no verdict: the other-seed draws are off (--no-floor)"
    elif clips < MIN_VERDICT_CLIPS:
        group["verdict"] = (f"no verdict: {clips} clips with every draw, fewer than {MIN_VERDICT_CLIPS} (a "
                            "bootstrap over so few clips understates its spread)")
    else:
        group["distinguishable"], group["verdict"], used = verdict(differences, DIFF_FORMATS)
        group["verdict_level"] = verdict_level(len(differences))
        group["verdict_differences"] = {label: e.as_dict() for label, e in used.items()}


# the table, the CSV, the plots, the page ------------------------------------------------------------------

def text(meta: dict, dist: dict) -> str:
    """What the distribution table's numbers are, for the Markdown table and the page."""
    draws, seed = dist["draws"], meta.get("seed")
    labels = ", ".join(FAD_LABELS[e] for e in dist["embeddings"])
    measures = len(dist["embeddings"]) + 1
    seeds = (f"seeds {seed}..{seed + draws - 1}" if isinstance(seed, int) and draws > 1 else f"seed {seed}")
    floor = meta.get("floor_seed")
    other = ("" if not isinstance(floor, int) else f"; the other-seed draws (`{FLOOR}`) use seed {floor}"
             if draws == 1 else f"; the other-seed draws (`{FLOOR}`) use seeds {floor}..{floor + draws - 1}")
    return (f"Distribution over {draws} draw{'s' if draws > 1 else ''} a clip: the reference and every row "
            f"sample each clip with {seeds}{other}. {labels}: the Frechet distance between Gaussian fits of "
            "the row's output embeddings and those of the other-seed draws of the same clips (latent: the "
            "model's own tokenizer's encoder frames; spectral: log-mel frames, 80 bands; CLAP: the "
            "conditioner's embedding, when it is a CLAP model); lower is nearer. The reference row's FAD is "
            "the floor: two sample sets of the uncompressed model. Adherence: the mean cosine of each "
            "output's conditioner embedding with its clip's condition. [low, high]: 95% bootstrap interval "
            f"over clips ({dist['resamples']} seeded resamples, each clip's draws kept together). Outputs: "
            "clips x draws the row is measured on (a clip with a failed draw in the row, the reference or the"
            " other-seed draws is left out), every FAD comparing sets of that size, so rows with equal "
            f"outputs compare fairly (small sets raise FAD). Verdict (from {MIN_VERDICT_CLIPS} clips): not "
            "distinguishable from uncompressed at this sample size when, for every FAD and for the adherence,"
            " the bootstrap interval of the row's difference from the reference row (same resamples) contains"
            " 0; otherwise the measures that differ, with that interval. With m measures each interval is at "
            f"1 - 5%/m ({100 * verdict_level(measures):.3g}% here), so the verdict of a row as a whole holds "
            "at 95%.")


def _cell(e: dict | None, fmt: str) -> str:
    if e is None:
        return "-"
    if e["low"] is None:
        return fmt.format(e["value"])
    return f"{fmt.format(e['value'])} [{fmt.format(e['low'])}, {fmt.format(e['high'])}]"


def head(dist: dict) -> list[str]:
    return (["row", "K bits", "V bits", "sink scales", "outputs", "K+V bits/coord"]
            + [f"{FAD_LABELS[e]} [95%]" for e in dist["embeddings"]] + ["adherence [95%]", "verdict"])


def cells(dist: dict, g: dict) -> list[str]:
    bits = bits_cells(group_job(g))
    kv = "-" if g["kv_bits_per_coord"] is None else f"{g['kv_bits_per_coord']:.3f}"
    fads = [_cell(g["fad"].get(e), FAD_FORMAT) for e in dist["embeddings"]]
    return ([g["codec"], *bits, f"{g['outputs']} ({g['clips']} x {g['draws']})", kv, *fads,
             _cell(g["adherence"], _FORMATS[ADHERENCE]), g["verdict"] or "-"])


def table_lines(meta: dict, dist: dict) -> list[str]:
    """The Markdown table with its heading and text."""
    h = head(dist)
    return (["## Distribution over draws: FAD, adherence, verdict", "", text(meta, dist), "",
             "| " + " | ".join(h) + " |", "|" + " --- |" * len(h)]
            + ["| " + " | ".join(cells(dist, g)) + " |" for g in dist["groups"]])


def table_csv(dist: dict) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    stats = ("value", "low", "high")
    w.writerow(["codec", *JOB_COLUMNS, "clips", "draws", "outputs", "kv_bits_per_coord"]
               + [f"fad_{e}_{s}" for e in dist["embeddings"] for s in (*stats, "floor", "difference_low",
                                                                       "difference_high")]
               + [f"adherence_{s}" for s in stats] + ["distinguishable", "verdict"])
    for g in dist["groups"]:
        row = [g["codec"], *(g[k] for k in JOB_COLUMNS), g["clips"], g["draws"], g["outputs"],
               g["kv_bits_per_coord"]]
        for e in dist["embeddings"]:
            f = g["fad"].get(e)
            row += ([f[s] for s in stats] + [f["floor"]["value"], f["difference"]["low"],
                                             f["difference"]["high"]] if f else [None] * 6)
        a = g["adherence"]
        row += [a[s] for s in stats] if a else [None] * 3
        row += [g["distinguishable"], g["verdict"]]
        w.writerow(["" if v is None else repr(v) if isinstance(v, float) else v for v in row])
    return out.getvalue()


def plot(dist: dict, plots_dir: Path) -> list[str]:
    """One PNG per FAD embedding and one for the adherence (`plot_names`): each curve's value (`curve_names`:
    each codec, at each count of sink and of wide scales) against its stored K+V bits per coordinate (a line
    through its widths, its interval as error bars), the reference row's value and interval as a dashed line
    in a band (the floor); `distribution.json` the plotted values."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    plots_dir.mkdir(parents=True, exist_ok=True)
    measures = [(e, FAD_LABELS[e], lambda g, e=e: g["fad"].get(e)) for e in dist["embeddings"]]
    measures.append((ADHERENCE, "condition adherence", lambda g: g["adherence"]))
    names, curves = [], {}
    curve_name = curve_names(dist["groups"])
    for (key, label, value_of), name in zip(measures, plot_names(dist["embeddings"]), strict=True):
        per_codec: dict[str, list] = {}
        for g in dist["groups"]:
            v = value_of(g)
            if g["codec"] in UNCOMPRESSED_ROWS or g["kv_bits_per_coord"] is None or v is None:
                continue
            point = (g["kv_bits_per_coord"], v["value"], v["low"], v["high"])
            curve = curve_name.get(curve_of(group_job(g)), g["codec"])  # `none`: its own point
            per_codec.setdefault(curve, []).append(point)
        ref = next((value_of(g) for g in dist["groups"] if g["codec"] == REFERENCE), None)
        curves[key] = {"label": label, "codecs": {c: sorted(p) for c, p in per_codec.items()},
                       "reference": ref}
        fig = Figure(figsize=(6, 4), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for i, (codec, pts) in enumerate(per_codec.items()):
            pts = sorted(pts)
            x = [p[0] for p in pts]
            y = [p[1] for p in pts]
            err = None
            if all(p[2] is not None for p in pts):
                err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
                err = [[max(v, 0.0) for v in side] for side in err]  # a FAD interval may sit above its value
            ax.errorbar(x, y, yerr=err, marker="o", linewidth=2.0, markersize=5, capsize=3,
                        color=f"C{i % 10}", label=codec, zorder=3)
        if ref is not None:
            ax.axhline(ref["value"], color="0.3", linewidth=1, linestyle="--",
                       label=f"uncompressed ({'floor' if key != ADHERENCE else 'reference'})")
            if ref["low"] is not None:
                ax.axhspan(ref["low"], ref["high"], color="0.5", alpha=0.15, linewidth=0)
        ax.set_xlabel("bits stored per coordinate (side fields included)")
        ax.set_ylabel(label)
        better = "higher" if key == ADHERENCE else "lower"
        ax.set_title(f"{label} vs stored bits ({better} is better; 95% intervals)", fontsize=10)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(plots_dir / name, metadata={"Software": None})
        names.append(name)
    (plots_dir / PLOT_DATA).write_text(json.dumps(curves, indent=1) + "\n")
    return names


CSV = "distribution.csv"
PLOT_DATA = "distribution.json"  # under plots/


def plot_names(embeddings: Sequence[str]) -> list[str]:
    """The PNG names of `plot`: one per FAD embedding, then the adherence's."""
    return [f"dist_{key}.png" for key in (*embeddings, ADHERENCE)]


def report_files(embeddings: Sequence[str]) -> list[str]:
    """Every file the distribution part of a report writes for a run of FAD embeddings `embeddings`, relative
    to the run folder (for its manifest)."""
    return [CSV, *(f"plots/{name}" for name in plot_names(embeddings)), f"plots/{PLOT_DATA}"]


def page_table(dist: dict) -> str:
    """The distribution table for index.html: each value over its interval in small type."""
    import html

    out = ["<table class='summary dist'><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head(dist))
           + "</tr>"]
    for g in dist["groups"]:
        *numbers, words = cells(dist, g)
        shown = []
        for c in numbers:
            value, _, spread = c.partition(" [")
            small = f"<br><small>[{html.escape(spread)}</small>" if spread else ""
            shown.append(html.escape(value) + small)
        shown.append(html.escape(words))
        out.append("<tr>" + "".join(f"<td>{c}</td>" for c in shown) + "</tr>")
    return "".join(out) + "</table>"
