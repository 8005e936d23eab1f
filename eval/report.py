"""An eval run's report: results.json, table.md, table.csv, metric-vs-bits plots, spectrograms, index.html.

Everything here is a function of the merged rows, the run's settings and the WAV files, so a resumed run
writes the same report as an uninterrupted one (timings stay in rows.jsonl, not in the report).

The sampling-floor row (codec `reference (other seed)`, see eval/runner.py) is listed first: its bits show as
'-', and its teacher-forced and KV cells as '-' (empty in the CSV, null in results.json), because it has no
codec, compresses nothing, and the unpatched model fed the reference's tokens is the reference itself. The
bf16-KV floor row (codec `reference (bf16 KV)`) follows it: bits '-', KV cells '-', every metric filled in
(teacher-forced ones too). The metric plots draw each floor's mean as a horizontal line (dashed: other seed;
dotted: bf16 KV).
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

from octopus_audio.eval.fidelity import FIDELITY_METRICS
from octopus_audio.eval.metrics import METRICS as AUDIO_METRICS
from octopus_audio.eval.runner import FLOOR, KV_FLOOR, wav_name

log = logging.getLogger(__name__)

# every number an ok row holds under "metrics": the sampled output's four, then the two teacher-forced ones
METRICS = AUDIO_METRICS + FIDELITY_METRICS
LOG_PLOTS = ("tf_kl_nats",)  # spans decades across bit widths: a log axis when every value is positive
FLOORS = (FLOOR, KV_FLOOR)  # rows with no codec and no bits, listed first
FLOOR_LINES = {FLOOR: "--", KV_FLOOR: ":"}  # their line styles in the plots
KV_FIELDS = (("ratio", "KV ratio"), ("k_bits", "K bits/coord"), ("v_bits", "V bits/coord"))
_FORMATS = {"lsd_db": "{:.3f}", "logmel_mse": "{:.4f}", "snr_db": "{:.2f}", "latent_cos": "{:.4f}",
            "tf_top1": "{:.4f}", "tf_kl_nats": "{:.5f}", "ratio": "{:.2f}", "k_bits": "{:.2f}",
            "v_bits": "{:.2f}"}


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


def aggregate(rows: Sequence[dict], jobs: Sequence[tuple[str, int | None]]) -> list[dict]:
    """Per (codec, bits), in job order: clip counts, min/mean/max of each metric and of the KV numbers."""
    groups = []
    for codec, bits in jobs:
        mine = [r for r in rows if r["codec"] == codec and r["bits"] == bits]
        ok = [r for r in mine if r["status"] == "ok"]
        group = {"codec": codec, "bits": bits, "clips_ok": len(ok), "clips_failed": len(mine) - len(ok),
                 "metrics": {m.key: _stats([r["metrics"][m.key] for r in ok
                                            if r["metrics"].get(m.key) is not None]) for m in METRICS}}
        for key, _ in KV_FIELDS:
            group[key] = _stats([r["kv"][key] for r in ok if r["kv"] and r["kv"].get(key) is not None])
        groups.append(group)
    return groups


def _bits_label(codec: str, bits: int | None) -> str:
    if codec in FLOORS:
        return "-"
    return "native" if bits is None else str(bits)


def _job_label(codec: str, bits: int | None) -> str:
    if codec in FLOORS:
        return codec
    return f"{codec} (native)" if bits is None else f"{codec} b{bits}"


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


def table_markdown(groups: list[dict], meta: dict) -> str:
    head = (["codec", "bits", "clips"] + [f"{m.label} mean [min, max]" for m in METRICS]
            + [k[1] for k in KV_FIELDS])
    lines = [f"# octopus-audio eval: {meta.get('clip_count', '?')} clips, model {meta.get('model')}, "
             f"conditioner {meta.get('conditioner')}, seed {meta.get('seed')}", "",
             "Each metric compares the output under the codec with the uncompressed output for the same "
             "clip, condition and seed. LSD and log-mel MSE: lower is better; SNR and latent cosine: higher "
             "is better. KV ratio: fp16 cache bytes / compressed cache bytes; bits/coord: stored bits per K "
             "or V coordinate (side fields included).", "",
             "TF top-1 agreement and TF KL are teacher-forced: the model under the codec is fed the "
             "reference's own tokens at every scale (the same inputs as the reference) and its guided "
             "next-token distributions are compared with the reference's (top-1: fraction of positions "
             "whose most likely token is the same, higher is better; KL(reference || codec) in nats per "
             "token, lower is better), which isolates the codec's error from the divergence of sampling "
             "after one flipped token.", ""]
    for text in _floor_texts(groups, meta):
        lines += [text, ""]
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for g in groups:
        cells = [g["codec"], _bits_label(g["codec"], g["bits"]),
                 f"{g['clips_ok']}" + (f" ({g['clips_failed']} failed)" if g["clips_failed"] else "")]
        for m in METRICS:
            s = g["metrics"][m.key]
            cells.append("-" if s is None else
                         f"{_fmt(m.key, s['mean'])} [{_fmt(m.key, s['min'])}, {_fmt(m.key, s['max'])}]")
        cells += [_fmt(k, g[k]["mean"] if g[k] else None) for k, _ in KV_FIELDS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def table_csv(groups: list[dict]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["codec", "bits", "clips_ok", "clips_failed"]
               + [f"{m.key}_{s}" for m in METRICS for s in ("min", "mean", "max")]
               + [f"{k}_mean" for k, _ in KV_FIELDS])
    for g in groups:
        row = [g["codec"], "" if g["bits"] is None else g["bits"], g["clips_ok"], g["clips_failed"]]
        for m in METRICS:
            s = g["metrics"][m.key]
            row += ["" if s is None else repr(s[k]) for k in ("min", "mean", "max")]
        row += ["" if g[k] is None else repr(g[k]["mean"]) for k, _ in KV_FIELDS]
        w.writerow(row)
    return out.getvalue()


def plot_metrics(groups: list[dict], plots_dir: Path) -> list[str]:
    """One PNG per metric: mean against bits per codec, bars from min to max (`none`: tables only); each
    floor row's mean, where it has the metric, as a horizontal line (FLOOR_LINES)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    plots_dir.mkdir(parents=True, exist_ok=True)
    names = []
    codecs = list(dict.fromkeys(g["codec"] for g in groups if g["bits"] is not None))
    floors = [g for g in groups if g["codec"] in FLOORS]
    for m in METRICS:
        fig = Figure(figsize=(6, 4), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        drawn = False
        for codec in codecs:
            pts = [(g["bits"], g["metrics"][m.key]) for g in groups
                   if g["codec"] == codec and g["bits"] is not None and g["metrics"][m.key] is not None]
            if not pts:
                continue
            x = np.array([p[0] for p in pts], dtype=float)
            mean = np.array([p[1]["mean"] for p in pts])
            err = np.array([[p[1]["mean"] - p[1]["min"] for p in pts],
                            [p[1]["max"] - p[1]["mean"] for p in pts]])
            ax.errorbar(x, mean, yerr=err, marker="o", capsize=3, label=codec)
            drawn = True
        for floor in floors:
            if floor["metrics"][m.key] is not None:
                ax.axhline(floor["metrics"][m.key]["mean"], color="0.3", linewidth=1,
                           linestyle=FLOOR_LINES[floor["codec"]], label=f"{floor['codec']} (mean)")
                drawn = True
        ax.set_xlabel("bits per coordinate (nominal)")
        ax.set_ylabel(m.label)
        lows = [g["metrics"][m.key]["min"] for g in groups if g["bits"] is not None and g["metrics"][m.key]]
        if m.key in LOG_PLOTS and lows and min(lows) > 0:
            ax.set_yscale("log")
        ax.set_title(f"{m.label} vs bits ({'higher' if m.higher_is_better else 'lower'} is better)")
        bits = sorted({g["bits"] for g in groups if g["bits"] is not None})
        if bits:
            ax.set_xticks(bits)
        if drawn:
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        name = f"{m.key}.png"
        fig.savefig(plots_dir / name, metadata={"Software": None})
        names.append(name)
    return names


def spectrogram_png(wav_path: Path, png_path: Path, ref_db: float | None = None, frames: int = 200) -> float:
    """Log-power spectrogram thumbnail: 129 frequency rows (n_fft 256, low at the bottom), about `frames`
    columns, 80 dB range, magma colours, stored as an 8-bit palette PNG (a few kB to tens of kB).

    Returns the image's 0 dB level, so a clip's codec images can share the reference's scale (`ref_db`).
    """
    import soundfile
    from matplotlib import colormaps
    from PIL import Image

    from octopus_audio.eval.audio_pair import stft_frames

    audio, _ = soundfile.read(str(wav_path), dtype="float64", always_2d=True)
    x = audio.mean(axis=1)
    hop = max(64, x.size // frames)
    power_db = 10.0 * np.log10(np.abs(stft_frames(x, 256, hop)) ** 2 + 1e-10)
    top = float(power_db.max()) if ref_db is None else ref_db
    index = np.clip(np.round((power_db.T[::-1] - (top - 80.0)) * (255.0 / 80.0)), 0, 255).astype(np.uint8)
    image = Image.fromarray(np.ascontiguousarray(index), mode="P")
    lut = (colormaps["magma"](np.arange(256) / 255.0)[:, :3] * 255.0 + 0.5).astype(np.uint8)
    image.putpalette(lut.reshape(-1).tolist())
    image.save(png_path, optimize=True)
    return top


_CSS = """body{font-family:sans-serif;margin:1em;color:#222}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:4px;vertical-align:top;font-size:12px}
.cell{width:210px}.cell img{width:200px;height:100px;display:block}.cell audio{width:200px}
.err{color:#b00;white-space:pre-wrap;max-width:200px}.plots img{width:420px;margin:4px}
.clips{overflow-x:auto}"""


def _cell(label: str, wav: str, png: str, out_dir: Path, note: str = "") -> str:
    parts = [f"<div class='cell'><b>{html.escape(label)}</b>"]
    if (out_dir / "spec" / png).is_file():
        parts.append(f"<img src='spec/{html.escape(png)}' alt='spectrogram of {html.escape(label)}'>")
    parts.append(f"<audio controls preload='none' src='wav/{html.escape(wav)}'></audio>")
    if note:
        parts.append(f"<div>{html.escape(note)}</div>")
    return "".join(parts) + "</div>"


def index_html(out_dir: Path, rows: Sequence[dict], clips: Sequence[dict], jobs, groups: list[dict],
               meta: dict, plots: list[str]) -> str:
    by_key = {(r["clip"], r["codec"], r["bits"]): r for r in rows}
    meta_items = "".join(f"<li>{html.escape(str(k))}: {html.escape(str(v))}</li>"
                         for k, v in sorted(meta.items()))
    summary = ["<table><tr><th>codec</th><th>bits</th><th>clips</th>"
               + "".join(f"<th>{html.escape(m.label)} mean [min, max]</th>" for m in METRICS)
               + "".join(f"<th>{html.escape(lbl)}</th>" for _, lbl in KV_FIELDS) + "</tr>"]
    for g in groups:
        cells = [g["codec"], _bits_label(g["codec"], g["bits"]),
                 f"{g['clips_ok']} ok, {g['clips_failed']} failed"]
        for m in METRICS:
            s = g["metrics"][m.key]
            cells.append("-" if s is None else
                         f"{_fmt(m.key, s['mean'])} [{_fmt(m.key, s['min'])}, {_fmt(m.key, s['max'])}]")
        cells += [_fmt(k, g[k]["mean"] if g[k] else None) for k, _ in KV_FIELDS]
        summary.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    summary.append("</table>")
    head = ("<tr><th>clip</th><th>input (24 kHz, 10 s)</th><th>reference (uncompressed)</th>"
            + "".join(f"<th>{html.escape(_job_label(c, b))}</th>" for c, b in jobs) + "</tr>")
    body = []
    for clip in clips:
        cid = clip["clip"]
        cells = [f"<td><b>{html.escape(cid)}</b><br><small>{html.escape(clip['origin'])}</small></td>"]
        for kind in ("input", "reference"):
            name = wav_name(cid, kind, None)
            cells.append("<td>" + (_cell(kind, name, name[:-4] + ".png", out_dir)
                                   if (out_dir / "wav" / name).is_file() else "-") + "</td>")
        for codec, bits in jobs:
            row = by_key.get((cid, codec, bits))
            name = wav_name(cid, codec, bits)
            label = _job_label(codec, bits)
            if row is None or row["status"] != "ok":
                why = "not run" if row is None else f"failed ({row['stage']}): {row['error']}"
                cells.append(f"<td><div class='err'>{html.escape(label)}: {html.escape(why)}</div></td>")
                continue
            mt = row["metrics"]
            note = (f"LSD {_fmt('lsd_db', mt['lsd_db'])} dB, SNR {_fmt('snr_db', mt['snr_db'])} dB, "
                    f"cos {_fmt('latent_cos', mt['latent_cos'])}")
            if mt.get("tf_top1") is not None:
                note += (f"; TF top-1 {_fmt('tf_top1', mt['tf_top1'])}, "
                         f"KL {_fmt('tf_kl_nats', mt['tf_kl_nats'])}")
            elif codec == FLOOR:
                note += f" (seed {row.get('seed', meta.get('floor_seed'))})"
            cells.append("<td>" + _cell(label, name, name[:-4] + ".png", out_dir, note) + "</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    plot_imgs = "".join(f"<img src='plots/{html.escape(p)}' alt='{html.escape(p)}'>" for p in plots)
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>octopus-audio eval</title>"
            f"<style>{_CSS}</style></head><body>\n<h1>octopus-audio eval</h1>\n<ul>{meta_items}</ul>\n"
            "<p>Files: <a href='results.json'>results.json</a>, <a href='table.csv'>table.csv</a>, "
            "<a href='table.md'>table.md</a>, <a href='rows.jsonl'>rows.jsonl</a>. Spectrograms: 80 dB "
            "range, a clip's codec images on its reference's scale. TF: teacher-forced (the codec's "
            "model fed the reference's tokens): top-1 agreement and KL in nats per token.</p>\n"
            + "".join(f"<p>{html.escape(text.replace('`', ''))}</p>\n" for text in _floor_texts(groups, meta))
            + "\n".join(summary) + f"\n<div class='plots'>{plot_imgs}</div>\n"
            "<div class='clips'><table>" + head + "\n" + "\n".join(body) + "</table></div>\n</body></html>\n")


def write_spectrograms(out_dir: Path, clips: Sequence[dict], jobs) -> None:
    spec = out_dir / "spec"
    spec.mkdir(parents=True, exist_ok=True)
    for clip in clips:
        cid = clip["clip"]
        name = wav_name(cid, "input", None)
        if (out_dir / "wav" / name).is_file():
            spectrogram_png(out_dir / "wav" / name, spec / (name[:-4] + ".png"))
        name = wav_name(cid, "reference", None)
        if not (out_dir / "wav" / name).is_file():
            continue
        top = spectrogram_png(out_dir / "wav" / name, spec / (name[:-4] + ".png"))
        for codec, bits in jobs:
            name = wav_name(cid, codec, bits)
            if (out_dir / "wav" / name).is_file():
                spectrogram_png(out_dir / "wav" / name, spec / (name[:-4] + ".png"), ref_db=top)


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_report(out_dir: str | Path, rows: Sequence[dict], clips: Sequence[dict],
                 jobs: Sequence[tuple[str, int | None]], meta: dict) -> dict:
    """Write every report file under out_dir from the merged rows; returns what results.json holds.

    rows: one per (clip, codec, bits) of this run (see runner); clips: [{clip, origin}] in run order;
    jobs: (codec, bits) in report order; meta: settings to print (model, conditioner, seed, ...).
    """
    out_dir = Path(out_dir)
    jobs = [tuple(j) for j in jobs]
    meta = {**meta, "clip_count": len(clips)}
    groups = aggregate(rows, jobs)
    failures = [{"clip": r["clip"], "codec": r["codec"], "bits": r["bits"], "stage": r["stage"],
                 "error": r["error"]} for r in rows if r["status"] != "ok"]
    results = {"meta": dict(sorted(meta.items())), "groups": groups, "failures": failures}
    _write_text(out_dir / "results.json", json.dumps(results, indent=1) + "\n")
    _write_text(out_dir / "table.md", table_markdown(groups, meta))
    _write_text(out_dir / "table.csv", table_csv(groups))
    plots = plot_metrics(groups, out_dir / "plots")
    write_spectrograms(out_dir, clips, jobs)
    _write_text(out_dir / "index.html", index_html(out_dir, rows, clips, jobs, groups, meta, plots))
    log.info("report written to %s (%d rows, %d failed)", out_dir, len(rows), len(failures))
    return results
