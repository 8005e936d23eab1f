"""An eval run's report: results.json, table.md, table.csv, rate-distortion plots, spectrograms, index.html.

Everything here is a function of the merged rows, the run's settings and the WAV files, so a resumed run
writes the same report as an uninterrupted one (timings stay in rows.jsonl, not in the report).

The sampling-floor row (codec `reference (other seed)`, see eval/runner.py) is listed first: its bits show as
'-', and its teacher-forced and KV cells as '-' (empty in the CSV, null in results.json), because it has no
codec, compresses nothing, and the unpatched model fed the reference's tokens is the reference itself. The
bf16-KV floor row (codec `reference (bf16 KV)`) follows it: bits '-', KV cells '-', every metric filled in
(teacher-forced ones too).

Plots are rate-distortion views: each metric against the bits the cache actually holds per coordinate
outside its native window (the compressed store, side fields included, and the sink scales at their native
width), keys and values together (`K+V bits/coord`, the mean of the K and V figures), one bold line per codec
(per codec and count of sink scales when the run has several) through its bit widths (its means), each
clip's value a faint point; each
floor's mean a horizontal line (dashed: other seed; dotted: bf16 KV) when it lies within the codecs' range,
else named in the legend as off the scale (so a floor far away does not flatten the codecs' curves).
`plots/rate_distortion.json` holds every plotted curve.
"""

from __future__ import annotations

import csv
import html
import io
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from octopus_audio.eval.cells import (
    JOB_COLUMNS,
    bits_cells,
    curve_names,
    curve_of,
    group_job,
    kv_bits,
    wide_label,
)
from octopus_audio.eval.fidelity import FIDELITY_METRICS
from octopus_audio.eval.metrics import METRICS as AUDIO_METRICS
from octopus_audio.eval.parting import PARTING_METRICS
from octopus_audio.eval.records import FLOOR, KV_FLOOR, REFERENCE, Job
from octopus_audio.eval.rows import job_fields, job_of
from octopus_audio.eval.run_files import bits_tag, scales_tag, wav_name
from octopus_audio.eval.spectrograms import spectrograms_drawn

log = logging.getLogger(__name__)

# every number an ok row holds under "metrics": the sampled output's four, the scale where its tokens first
# part ways with the reference's, then the two teacher-forced ones
METRICS = AUDIO_METRICS + PARTING_METRICS + FIDELITY_METRICS
LOG_PLOTS = ("tf_kl_nats",)  # spans decades across bit widths: a log axis when every value is positive
FLOORS = (FLOOR, KV_FLOOR)  # rows with no codec and no bits, listed first
FLOOR_LINES = {FLOOR: "--", KV_FLOOR: ":"}  # their line styles in the plots
# (group key, column label): the KV numbers of a row (its "kv": ratio, k_bits, v_bits, kv_summary) as the
# report aggregates them; `*_per_coord` so they never read as the nominal widths `bits` / `v_bits`
KV_FIELDS = (("kv_bits_per_coord", "K+V bits/coord"), ("ratio", "KV ratio"),
             ("k_bits_per_coord", "K bits/coord"), ("v_bits_per_coord", "V bits/coord"))
_FORMATS = {"lsd_db": "{:.3f}", "logmel_mse": "{:.4f}", "snr_db": "{:.2f}", "latent_cos": "{:.4f}",
            "first_parting_scale": "{:.2f}", "tf_top1": "{:.4f}", "tf_kl_nats": "{:.5f}", "ratio": "{:.2f}",
            "k_bits_per_coord": "{:.2f}", "v_bits_per_coord": "{:.2f}", "kv_bits_per_coord": "{:.3f}"}
CODEC_COLUMNS = 5  # codec columns per table of the listening page (fits 1400 px)

SMALL_KL = 1e-4  # a TF KL below this (and not 0) is printed as 1.23e-06: five decimals would show 0.00000


def _fmt(key: str, value: float | None) -> str:
    if value is None:
        return "-"
    if key == "tf_kl_nats" and value != 0.0 and abs(value) < SMALL_KL:
        return f"{value:.2e}"
    return _FORMATS[key].format(value)


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    a = np.asarray(values, dtype=np.float64)
    return {"min": float(a.min()), "mean": float(a.mean()), "max": float(a.max())}


def _kv_value(row: dict, key: str) -> float | None:
    """A row's value of the KV field `key` (KV_FIELDS)."""
    if key == "kv_bits_per_coord":
        return kv_bits(row["kv"])
    return (row["kv"] or {}).get(key.removesuffix("_per_coord"))


def aggregate(rows: Sequence[dict], jobs: Sequence[Job]) -> list[dict]:
    """Per job, in job order: clip counts, min/mean/max of each metric and of the KV numbers."""
    groups = []
    for job in jobs:
        mine = [r for r in rows if job_of(r) == job]
        ok = [r for r in mine if r["status"] == "ok"]
        group = {**job._asdict(), "clips_ok": len(ok), "clips_failed": len(mine) - len(ok),
                 "metrics": {m.key: _stats([r["metrics"][m.key] for r in ok
                                            if r["metrics"].get(m.key) is not None]) for m in METRICS}}
        for key, _ in KV_FIELDS:
            group[key] = _stats([v for r in ok if (v := _kv_value(r, key)) is not None])
        groups.append(group)
    return groups


def _bits_label(job: Job) -> str:
    """`b2` or `K2 V4`, ` S3` after it with sink scales and ` W4@4` after that with 4 wide scales at 4 bits
    (page column heads), `native` for codec none."""
    if job.bits is None:
        return "native"
    bits = f"b{job.bits}" if job.v_bits in (None, job.bits) else f"K{job.bits} V{job.v_bits}"
    return bits + (f" S{job.sink_scales}" if job.sink_scales else "") + wide_label(job)


def _job_label(job: Job) -> str:
    if job.codec in FLOORS:
        return job.codec
    return f"{job.codec} {_bits_label(job)}"


def _floor_text(meta: dict) -> str:
    return (f"`{FLOOR}` is the sampling floor: the uncompressed model sampled with seed "
            f"{meta.get('floor_seed')} against the uncompressed reference (seed {meta.get('seed')}), "
            "with the same sampled-output metrics: how far two independent samples of the same model lie "
            "apart. The codec rows use the reference's seed, so their draws agree with it until the first "
            "flipped token and usually lie nearer than this row; a codec row at or beyond it is as far "
            "from the reference as an unrelated sample. Its teacher-forced and KV cells are '-': the "
            "unpatched model fed the reference's tokens is the reference itself, and nothing is compressed.")


def _kv_floor_text(meta: dict) -> str:
    return (f"`{KV_FLOOR}` is the uncompressed model with the reference's condition and seed "
            f"({meta.get('seed')}), every key and value rounded to bfloat16 as it enters the KV cache: the "
            "smallest perturbation of the cache that 16-bit storage (what the KV ratio compares with) makes, "
            "so its sampled-output metrics show how near any perturbation of the cache keeps the sampled "
            "outputs, and its teacher-forced ones the error of 16-bit storage itself. Its KV cells are '-' "
            "(nothing is compressed).")


def _floor_texts(groups: list[dict], meta: dict) -> list[str]:
    present = {g["codec"] for g in groups}
    return ([_floor_text(meta)] if FLOOR in present else []) + (
        [_kv_floor_text(meta)] if KV_FLOOR in present else [])


KV_TEXT = ("KV ratio: fp16 cache bytes / compressed cache bytes; K bits and V bits: the nominal widths of "
           "keys and values; sink scales: the first scales kept native; bits/coord: stored bits per K or V "
           "coordinate outside the native window (the compressed store, side fields included, and the sink "
           "scales at their native width), K+V their mean, the rate the plots put on their x axis. First "
           "parting scale: the first scale (1 = the coarsest) whose sampled tokens differ from the "
           "reference's, the number of scales + 1 when none does; higher is better.")


def _kv_text(groups: list[dict]) -> str:
    """KV_TEXT, and what the wide scales label means when a row has them (told with the run's first)."""
    n, b = next(((g["wide_scales"], g["wide_bits"]) for g in groups if g["wide_scales"]), (0, None))
    return KV_TEXT + (f" Wide scales (W{n}@{b} after the sink scales): the {n} scales after the sink scales "
                      f"stored at {b}-bit keys and values, the rest at the row's K and V bits." if n else "")


def _summary_cells(g: dict) -> list[str]:
    cells = [g["codec"], *bits_cells(group_job(g)),
             f"{g['clips_ok']}" + (f" ({g['clips_failed']} failed)" if g["clips_failed"] else "")]
    for m in METRICS:
        s = g["metrics"][m.key]
        cells.append("-" if s is None else
                     f"{_fmt(m.key, s['mean'])} [{_fmt(m.key, s['min'])}, {_fmt(m.key, s['max'])}]")
    return cells + [_fmt(k, g[k]["mean"] if g[k] else None) for k, _ in KV_FIELDS]


SUMMARY_HEAD = (["codec", "K bits", "V bits", "sink scales", "clips"]
                + [f"{m.label} mean [min, max]" for m in METRICS] + [label for _, label in KV_FIELDS])


EQUAL_RATE_METRICS = ("tf_kl_nats",)  # the codec's own error (teacher-forced), free of sampling divergence


def equal_rate_entries(groups: list[dict]) -> list[dict]:
    """Per metric of EQUAL_RATE_METRICS and count of sink and of wide scales: each OCTOPUS curve's mean at its
    K+V bits per coordinate beside every other codec's curve at the same counts (`curve_names`) read at that
    rate (`octopus_audio.rate_distortion.equal_rate`); each entry carries its `sink_scales` and
    `wide_scales`."""
    from octopus_audio.rate_distortion import SUBJECTS, equal_rate

    names = curve_names(groups)
    out = []
    for key in EQUAL_RATE_METRICS:
        by_scales: dict[tuple, dict[str, list]] = {}  # (sink scales, wide scales) -> curve -> points
        for g in groups:
            job = group_job(g)
            if curve_of(job) in names and g["kv_bits_per_coord"] and g["metrics"][key]:
                curves = by_scales.setdefault(curve_of(job)[1:], {})
                curves.setdefault(names[curve_of(job)], []).append(
                    (g["kv_bits_per_coord"]["mean"], g["metrics"][key]["mean"], _job_label(job)))
        for scales, points in by_scales.items():
            subjects = [name for k, name in names.items() if k[0] in SUBJECTS and k[1:] == scales]
            out += [{"metric": key, "sink_scales": scales[0], "wide_scales": scales[1], **e}
                    for e in equal_rate(points, subjects)]
    return out


def _equal_rate_lines(groups: list[dict]) -> list[str]:
    from octopus_audio.rate_distortion import equal_rate_table

    entries = equal_rate_entries(groups)
    names = curve_names(groups)
    several = {what: len({k[i] for k in names}) > 1 for i, what in ((1, "sink"), (2, "wide"))}
    compared = " and of ".join(f"{what} scales" for what, s in several.items() if s)
    lines = []
    for m in METRICS:
        for scales in dict.fromkeys(_entry_scales(e) for e in entries if e["metric"] == m.key):
            mine = [e for e in entries if e["metric"] == m.key and _entry_scales(e) == scales]
            title = f"{m.label} at equal rate" + "".join(
                f", {n} {what} scale{'' if n == 1 else 's'}"
                for n, (what, s) in zip(scales, several.items(), strict=True) if s)
            lines += ["", f"## {title}", "",
                      "Each OCTOPUS row's mean at its K+V bits per coordinate beside every other codec's "
                      "curve of means read at that rate (log-linear between its two nearest measured rates; "
                      "'-' outside them, never extrapolated); the difference is ours against theirs."
                      + (f" Codecs are compared at the same count of {compared}." if compared else ""), ""]
            peers = [name for k, name in names.items() if k[1:] == scales]
            lines += equal_rate_table(mine, f"{m.label} mean", peers)
    return lines


def _entry_scales(entry: dict) -> tuple[int | None, int | None]:
    """An equal-rate entry's (sink scales, wide scales): the rows it is compared among."""
    return entry["sink_scales"], entry["wide_scales"]


def table_markdown(groups: list[dict], meta: dict, dist: dict | None = None) -> str:
    """The report's table.md: the paired table (draw 0 of each clip against the reference), the distribution
    table (`dist`, eval/dist_report.py) and the equal-rate sections."""
    draws = meta.get("draws", 1)
    lines = [f"# octopus-audio eval: {meta.get('clip_count', '?')} clips, model {meta.get('model')}, "
             f"conditioner {meta.get('conditioner')}, seed {meta.get('seed')}"
             + (f", {draws} draws a clip" if draws > 1 else ""), "",
             "Each metric compares the output under the codec with the uncompressed output for the same "
             "clip, condition and seed"
             + (f" (draw 0 of each clip, seed {meta.get('seed')})" if draws > 1 else "")
             + ". LSD and log-mel MSE: lower is better; SNR and latent cosine: higher "
             "is better. " + _kv_text(groups), "",
             "TF top-1 agreement and TF KL are teacher-forced: the model under the codec is fed the "
             "reference's own tokens at every scale (the same inputs as the reference) and its guided "
             "next-token distributions are compared with the reference's (top-1: fraction of positions "
             "whose most likely token is the same, higher is better; KL(reference || codec) in nats per "
             "token, lower is better), which isolates the codec's error from the divergence of sampling "
             "after one flipped token.", ""]
    for text in _floor_texts(groups, meta):
        lines += [text, ""]
    lines += ["| " + " | ".join(SUMMARY_HEAD) + " |", "|" + " --- |" * len(SUMMARY_HEAD)]
    lines += ["| " + " | ".join(_summary_cells(g)) + " |" for g in groups]
    if dist is not None:
        from octopus_audio.eval import dist_report

        lines += ["", *dist_report.table_lines(meta, dist)]
    lines += _equal_rate_lines(groups)
    return "\n".join(lines) + "\n"


def table_csv(groups: list[dict]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["codec", *JOB_COLUMNS, "clips_ok", "clips_failed"]
               + [f"{m.key}_{s}" for m in METRICS for s in ("min", "mean", "max")]
               + [f"{k}_mean" for k, _ in KV_FIELDS])
    for g in groups:
        row = [g["codec"], *("" if g[k] is None else g[k] for k in JOB_COLUMNS), g["clips_ok"],
               g["clips_failed"]]
        for m in METRICS:
            s = g["metrics"][m.key]
            row += ["" if s is None else repr(s[k]) for k in ("min", "mean", "max")]
        row += ["" if g[k] is None else repr(g[k]["mean"]) for k, _ in KV_FIELDS]
        w.writerow(row)
    return out.getvalue()


def rate_distortion_curves(groups: list[dict], rows: Sequence[dict]) -> dict:
    """Per metric and curve (`curve_names`: each codec, at each count of sink and of wide scales): `curve`,
    the (K+V bits/coord, mean) of each bit pair, sorted by bits, and `points`, each ok row's (K+V bits/coord,
    value); per metric the floors' means (`floors`)."""
    names = curve_names(groups)
    out = {}
    for m in METRICS:
        per_codec = {}
        for key, name in names.items():
            curve = sorted((g["kv_bits_per_coord"]["mean"], g["metrics"][m.key]["mean"]) for g in groups
                           if curve_of(group_job(g)) == key and g["kv_bits_per_coord"]
                           and g["metrics"][m.key])
            points = sorted((kv_bits(r["kv"]), r["metrics"][m.key]) for r in rows
                            if curve_of(job_of(r)) == key and r["status"] == "ok"
                            and r["bits"] is not None and kv_bits(r["kv"]) is not None
                            and r["metrics"].get(m.key) is not None)
            if curve:
                per_codec[name] = {"curve": curve, "points": points}
        floors = {g["codec"]: g["metrics"][m.key]["mean"] for g in groups
                  if g["codec"] in FLOORS and g["metrics"][m.key]}
        out[m.key] = {"label": m.label, "higher_is_better": m.higher_is_better, "codecs": per_codec,
                      "floors": floors}
    return out


def _y_range(values: list[float], log: bool) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if log:
        pad = (hi / lo) ** 0.08 if hi > lo else 2.0
        return lo / pad, hi * pad
    pad = 0.08 * (hi - lo) if hi > lo else max(abs(hi) * 0.05, 1e-3)
    return lo - pad, hi + pad


def _plot_name(metric: str) -> str:
    return f"{metric}.png"


def plot_metrics(groups: list[dict], rows: Sequence[dict], plots_dir: Path) -> list[str]:
    """One PNG per metric (its rate-distortion view, module docstring) and `rate_distortion.json`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from octopus_audio.rate_distortion import draw_curves

    plots_dir.mkdir(parents=True, exist_ok=True)
    curves = rate_distortion_curves(groups, rows)
    names = []
    for m in METRICS:
        view = curves[m.key]
        fig = Figure(figsize=(6, 4), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        draw_curves(ax, {c: v["curve"] for c, v in view["codecs"].items()},
                    {c: v["points"] for c, v in view["codecs"].items()})
        values = [y for v in view["codecs"].values() for _, y in v["curve"] + v["points"]]
        log = m.key in LOG_PLOTS and bool(values) and min(values) > 0
        if log:
            ax.set_yscale("log")
        if values:
            lo, hi = _y_range(values, log)
            ax.set_ylim(lo, hi)
        for floor, mean in view["floors"].items():
            label = f"{floor} (mean {_fmt(m.key, mean)})"
            if not values or lo <= mean <= hi:
                ax.axhline(mean, color="0.3", linewidth=1, linestyle=FLOOR_LINES[floor], label=label)
            else:  # drawn, it would squash the codecs' curves into a line
                ax.plot([], [], color="0.3", linewidth=1, linestyle=FLOOR_LINES[floor],
                        label=f"{label}, off the scale")
        ax.set_ylabel(m.label)
        ax.set_title(f"{m.label} vs stored bits ({'higher' if m.higher_is_better else 'lower'} is better)",
                     fontsize=10)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        fig.tight_layout()
        name = _plot_name(m.key)
        fig.savefig(plots_dir / name, metadata={"Software": None})
        names.append(name)
    (plots_dir / "rate_distortion.json").write_text(json.dumps(curves, indent=1) + "\n")
    return names


# the listening page ------------------------------------------------------------------------------------

_CSS = """body{font-family:sans-serif;margin:1em auto;max-width:1360px;color:#222;font-size:14px}
table{border-collapse:collapse;max-width:100%}td,th{border:1px solid #ccc;padding:4px;vertical-align:top;
font-size:12px;overflow-wrap:break-word}.summary small{color:#555;white-space:nowrap}ul.meta{columns:3}
.cell{width:200px}.cell img{width:200px;height:100px;display:block}.cell audio{width:200px;display:block}
.cell .note{color:#333}.err{color:#b00;white-space:pre-wrap;width:200px;overflow-wrap:anywhere}
.plots{display:flex;flex-wrap:wrap;gap:6px}.plots img{width:440px;max-width:100%}
.clip{border-top:2px solid #888;margin-top:1.2em}.clip h2{font-size:16px;margin:.5em 0 .2em}
.refs{display:flex;flex-wrap:wrap;gap:8px;margin:.4em 0}.origin{color:#555;overflow-wrap:anywhere}
button.ab{margin:3px 0;font-size:12px;padding:2px 8px}button.ab[aria-pressed=true]{background:#ffd27a}
button:focus-visible,audio:focus-visible,a:focus-visible{outline:3px solid #1a6de0;outline-offset:1px}
.playing{box-shadow:0 0 0 3px #1a6de0}"""

# A/B: each codec cell's button switches between the clip's reference (A) and that codec (B) at the playback
# position of whichever is heard (any player of the page that is playing, else the side the button is on),
# playing on if it was playing. `x` repeats the last switch; one player plays at a time.
_SCRIPT = """<script>
let lastAB = null;
function abSwitch(btn) {
  const a = document.getElementById(btn.dataset.a), b = document.getElementById(btn.dataset.b);
  const heard = [...document.querySelectorAll('audio')].find(m => !m.paused);
  const from = heard || (btn.getAttribute('aria-pressed') === 'true' ? b : a);
  const to = from === b ? a : b;
  const playing = !from.paused;
  to.currentTime = from.currentTime;
  from.pause();
  if (playing) { to.play().catch(() => {}); }
  btn.setAttribute('aria-pressed', String(to === b));
  btn.textContent = to === b ? 'A/B: hearing B (codec)' : 'A/B: hearing A (reference)';
  lastAB = btn;
}
document.addEventListener('click', e => {
  const btn = e.target.closest('button.ab');
  if (btn) { abSwitch(btn); }
});
document.addEventListener('keydown', e => {
  if (e.key === 'x' && lastAB && !e.ctrlKey && !e.metaKey && !e.altKey) { abSwitch(lastAB); }
});
document.addEventListener('play', e => {
  for (const m of document.querySelectorAll('audio')) {
    if (m !== e.target) { m.pause(); }
    m.closest('.cell').classList.toggle('playing', m === e.target);
  }
}, true);
document.addEventListener('pause', e => { e.target.closest('.cell').classList.remove('playing'); }, true);
</script>"""


def _shown_path(text: str, out_dir: Path) -> str:
    """A local absolute path as the report folder sees it (relative), anything else as it is."""
    if os.path.isabs(text):
        return os.path.relpath(text, out_dir)
    return text


def _cell(label: str, wav: str, out_dir: Path, audio_id: str, note: str = "",
          ab_with: str | None = None) -> str:
    """A player with its spectrogram; `ab_with`: the id of the player the A/B button switches with."""
    png = wav[:-4] + ".png"
    parts = [f"<div class='cell'><b>{html.escape(label)}</b>"]
    if (out_dir / "spec" / png).is_file():
        parts.append(f"<img src='spec/{html.escape(png)}' alt='spectrogram of {html.escape(label)}'>")
    parts.append(f"<audio id='{audio_id}' controls preload='none' src='wav/{html.escape(wav)}' "
                 f"aria-label='{html.escape(label)}'></audio>")
    if ab_with is not None:
        parts.append(f"<button type='button' class='ab' data-a='{ab_with}' data-b='{audio_id}' "
                     f"aria-pressed='false' title='switch between the reference (A) and {html.escape(label)} "
                     f"(B) at the same position; x repeats the last switch'>A/B with reference</button>")
    if note:
        parts.append(f"<div class='note'>{html.escape(note)}</div>")
    return "".join(parts) + "</div>"


def _note(row: dict, codec: str, meta: dict) -> str:
    mt = row["metrics"]
    note = (f"LSD {_fmt('lsd_db', mt['lsd_db'])} dB, SNR {_fmt('snr_db', mt['snr_db'])} dB, "
            f"cos {_fmt('latent_cos', mt['latent_cos'])}")
    if mt.get("tf_top1") is not None:
        note += f"; TF top-1 {_fmt('tf_top1', mt['tf_top1'])}, KL {_fmt('tf_kl_nats', mt['tf_kl_nats'])}"
    elif codec == FLOOR:
        note += f" (seed {row.get('seed', meta.get('floor_seed'))})"
    return note


def _job_cell(out_dir: Path, cid: str, job: Job, row: dict | None, meta: dict, ref_id: str | None,
              audio_id: str) -> str:
    label = _job_label(job)
    if row is None:
        return f"<div class='err'>{html.escape(label)}: not run</div>"
    if row["status"] != "ok":
        error = row["error"].replace(row["origin"], _shown_path(row["origin"], out_dir))
        why = f"failed ({row['stage']}): {error}"
        return f"<div class='err'>{html.escape(label)}: {html.escape(why)}</div>"
    return _cell(label, wav_name(cid, *job), out_dir, audio_id, _note(row, job.codec, meta),
                 ab_with=ref_id)


def _clip_section(out_dir: Path, n: int, clip: dict, jobs: Sequence[Job], by_key: dict, meta: dict) -> str:
    """One clip: its input, reference and floor rows side by side, then a table per group of codecs with a
    row per bit width (so the page stays within 1400 px whatever the run's size)."""
    cid = clip["clip"]
    ref_id = f"c{n}-reference"
    parts = [f"<section class='clip' aria-label='clip {html.escape(cid)}'><h2>{html.escape(cid)}</h2>"
             f"<div class='origin'>{html.escape(_shown_path(clip['origin'], out_dir))}</div>"
             "<div class='refs'>"]
    has_ref = (out_dir / "wav" / wav_name(cid, "reference", None)).is_file()
    for kind, label in (("input", "input (24 kHz, its own length)"),
                        ("reference", "reference (uncompressed)")):
        name = wav_name(cid, kind, None)
        if (out_dir / "wav" / name).is_file():
            parts.append(_cell(label, name, out_dir, f"c{n}-{kind}"))
    for i, job in enumerate(j for j in jobs if j.codec in FLOORS):
        parts.append(_job_cell(out_dir, cid, job, by_key.get((cid, *job)), meta,
                               ref_id if has_ref else None, f"c{n}-floor{i}"))
    parts.append("</div>")
    codecs = list(dict.fromkeys(j.codec for j in jobs if j.codec not in FLOORS))
    widths = list(dict.fromkeys(j[1:] for j in jobs if j.codec not in FLOORS))  # all of a job but its codec
    for start in range(0, len(codecs), CODEC_COLUMNS):
        chunk = codecs[start:start + CODEC_COLUMNS]
        head = "<tr><th>bits</th>" + "".join(f"<th>{html.escape(c)}</th>" for c in chunk) + "</tr>"
        body = []
        for width in widths:
            cells = []
            for codec in chunk:
                job = Job(codec, *width)
                if job not in jobs:
                    cells.append("<td></td>")
                    continue
                tag = ("native" if job.bits is None else bits_tag(job.bits, job.v_bits)
                       + scales_tag(job.sink_scales, job.wide_scales, job.wide_bits, sep="-"))
                audio_id = f"c{n}-{codec}-{tag}"
                cells.append("<td>" + _job_cell(out_dir, cid, job, by_key.get((cid, *job)), meta,
                                                ref_id if has_ref else None, audio_id) + "</td>")
            if any(c != "<td></td>" for c in cells):
                label = _bits_label(Job("", *width))
                body.append(f"<tr><th>{html.escape(label)}</th>" + "".join(cells) + "</tr>")
        parts.append("<table>" + head + "".join(body) + "</table>")
    return "".join(parts) + "</section>"


def index_html(out_dir: Path, rows: Sequence[dict], clips: Sequence[dict], jobs: Sequence[Job],
               groups: list[dict], meta: dict, plots: list[str], dist: dict | None = None) -> str:
    by_key = {(r["clip"], *job_of(r)): r for r in rows}
    meta_items = "".join(f"<li>{html.escape(str(k))}: {html.escape(_shown_path(str(v), out_dir))}</li>"
                         for k, v in sorted(meta.items()))
    summary = ["<table class='summary'><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in SUMMARY_HEAD)
               + "</tr>"]
    for g in groups:
        cells = _summary_cells(g)
        shown = []
        for c in cells:  # "mean [min, max]": the mean, the range below it in small type
            mean, _, spread = c.partition(" [")
            shown.append(html.escape(mean) + (f"<br><small>[{html.escape(spread)}</small>" if spread else ""))
        summary.append("<tr>" + "".join(f"<td>{c}</td>" for c in shown) + "</tr>")
    summary.append("</table>")
    if dist is not None:
        from octopus_audio.eval import dist_report

        words = html.escape(dist_report.text(meta, dist).replace("`", ""))
        summary.append(f"<h2>Distribution over draws</h2><p>{words}</p>" + dist_report.page_table(dist))
    plot_imgs = "".join(f"<img src='plots/{html.escape(p)}' alt='{html.escape(p[:-4])} against stored bits'>"
                        for p in plots)
    sections = [_clip_section(out_dir, n, clip, jobs, by_key, meta) for n, clip in enumerate(clips)]
    kv_text = html.escape(_kv_text(groups))
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width'><title>octopus-audio eval</title>"
            f"<style>{_CSS}</style></head><body>\n<h1>octopus-audio eval</h1>\n"
            f"<ul class='meta'>{meta_items}</ul>\n"
            "<p>Files: <a href='results.json'>results.json</a>, <a href='table.csv'>table.csv</a>, "
            "<a href='table.md'>table.md</a>, <a href='distribution.csv'>distribution.csv</a>, "
            "<a href='rows.jsonl'>rows.jsonl</a>. Spectrograms: 80 dB "
            "range, a clip's codec images on its reference's scale. TF: teacher-forced (the codec's "
            "model fed the reference's tokens): top-1 agreement and KL in nats per token. "
            f"{kv_text}</p>\n<p>Listening: each codec's <b>A/B</b> button switches between "
            "the clip's reference (A) and that codec (B) at the same playback position (playing on if it "
            "was playing); <kbd>x</kbd> repeats the last switch; Tab reaches every player and button.</p>\n"
            + "".join(f"<p>{html.escape(text.replace('`', ''))}</p>\n" for text in _floor_texts(groups, meta))
            + "\n".join(summary) + f"\n<div class='plots'>{plot_imgs}</div>\n"
            + "\n".join(sections) + f"\n{_SCRIPT}\n</body></html>\n")


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


PAGES = ("results.json", "table.md", "table.csv", "index.html")


def report_files(embeddings: Sequence[str]) -> list[str]:
    """Every file `write_report` writes for a run whose FAD embeddings are `embeddings` (meta's
    `fad_embeddings`), relative to the run folder, but the spectrograms (listed with their WAVs,
    run_files.wav_files): what the run's manifest lists before the report is written."""
    from octopus_audio.eval import dist_report

    return [*PAGES, *(f"plots/{_plot_name(m.key)}" for m in METRICS), "plots/rate_distortion.json",
            *dist_report.report_files(embeddings)]


def write_report(out_dir: str | Path, rows: Sequence[dict], clips: Sequence[dict], jobs: Sequence[Job],
                 meta: dict) -> dict:
    """Write every report file under out_dir from the merged rows; returns what results.json holds.

    rows: one per (clip, job, draw) of this run, the reference's own rows (REFERENCE) included (see runner);
    clips: [{clip, origin}] in run order; jobs: in report order (without REFERENCE); meta: settings to print
    (model, conditioner, seed, draws, ...). The paired table, its plots and the page's clips are draw 0's
    rows of `jobs`; the distribution part (eval/dist_report.py) reads every row and its embeddings. The
    spectrograms are drawn on worker threads while this thread draws the plots (`spectrograms_drawn`);
    index.html is written after both.
    """
    from octopus_audio.eval import dist_report

    out_dir = Path(out_dir)
    jobs = [Job(*j) for j in jobs]
    meta = {**meta, "clip_count": len(clips)}
    paired = [r for r in rows if r.get("draw", 0) == 0 and r["codec"] != REFERENCE]
    groups = aggregate(paired, jobs)
    dist = dist_report.distribution(out_dir, rows, jobs, meta)
    failures = [{"clip": r["clip"], **job_fields(job_of(r)), "draw": r.get("draw", 0), "stage": r["stage"],
                 "error": r["error"]}
                for r in rows if r["status"] != "ok"]
    results = {"meta": dict(sorted(meta.items())), "groups": groups, "failures": failures,
               "rows": {"ok": len(rows) - len(failures), "failed": len(failures)},
               "equal_rate": equal_rate_entries(groups), "distribution": dist}
    _write_text(out_dir / "results.json", json.dumps(results, indent=1) + "\n")
    _write_text(out_dir / "table.md", table_markdown(groups, meta, dist))
    _write_text(out_dir / "table.csv", table_csv(groups))
    _write_text(out_dir / dist_report.CSV, dist_report.table_csv(dist))
    with spectrograms_drawn(out_dir, clips, jobs):  # on worker threads, while this one draws the plots
        plots = plot_metrics(groups, paired, out_dir / "plots")
        plots += dist_report.plot(dist, out_dir / "plots")
    _write_text(out_dir / "index.html", index_html(out_dir, paired, clips, jobs, groups, meta, plots, dist))
    log.info("report written to %s (%d rows, %d failed)", out_dir, len(rows), len(failures))
    return results
