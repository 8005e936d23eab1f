"""Rate-distortion views: a codec's error against the bits it actually stores per coordinate.

Codecs store different amounts at the same nominal width (d=64, b=2: octopus keys 2.75 bits per coordinate,
turboquant-mse 2.25), so they are compared on curves through their measured (bits per coordinate, error)
points. `value_at_rate` reads a curve at another codec's rate by interpolating log(error) linearly in bits
between the two nearest measured points (errors fall about geometrically with bits); it never extrapolates.
`draw_curves` is the one plotting routine of the probe's and the eval's rate-distortion figures (matplotlib,
imported when called).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from octopus_audio.codecs import Octopus, OctopusQJL


def value_at_rate(points: Sequence[tuple[float, float]], rate: float, log: bool = True) -> float | None:
    """The curve through `points` (bits per coordinate, value) at `rate`: linear interpolation of log(value)
    (`log`, every value > 0) or of the value between the two measured points around `rate`; None when `rate`
    lies outside the measured range (no extrapolation)."""
    pts = sorted(points)
    if not pts or not pts[0][0] <= rate <= pts[-1][0]:
        return None
    exact = [y for x, y in pts if x == rate]
    if exact:
        return exact[0]  # a measured point
    (x0, y0), (x1, y1) = next((a, b) for a, b in zip(pts, pts[1:], strict=False) if a[0] < rate < b[0])
    w = (rate - x0) / (x1 - x0)
    if not log:
        return (1 - w) * y0 + w * y1
    if y0 <= 0 or y1 <= 0:
        raise ValueError(f"log interpolation needs positive values, got {y0} and {y1}")
    return math.exp((1 - w) * math.log(y0) + w * math.log(y1))


def relative_difference(ours: float, theirs: float) -> str:
    """`12.3% lower` / `4.0% higher` / `equal`: ours against theirs, in words (whichever way it falls)."""
    if theirs == 0:
        return "equal" if ours == 0 else "-"
    rel = (ours - theirs) / abs(theirs)
    if abs(rel) < 5e-4:
        return "equal"
    return f"{abs(rel):.1%} {'lower' if rel < 0 else 'higher'}"


def draw_curves(ax, curves: Mapping[str, Sequence[tuple[float, float]]],
                points: Mapping[str, Sequence[tuple[float, float]]] | None = None) -> None:
    """One bold line with markers per codec through its (bits per coordinate, mean) points, sorted by bits;
    `points`: per codec, individual measurements (one per clip or seed) drawn faint in the line's colour."""
    for i, (codec, pts) in enumerate(curves.items()):
        if not pts:
            continue
        colour = f"C{i % 10}"
        pts = sorted(pts)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", linewidth=2.2, markersize=5,
                color=colour, label=codec, zorder=3)
        faint = (points or {}).get(codec, ())
        if faint:
            ax.scatter([p[0] for p in faint], [p[1] for p in faint], s=9, alpha=0.25, color=colour,
                       linewidths=0, zorder=2)
    ax.set_xlabel("bits stored per coordinate (side fields included)")
    ax.grid(alpha=0.3)


# the codecs an equal-rate table reads every other codec's curve for
SUBJECTS = (Octopus.name, OctopusQJL.name)


def equal_rate(points: Mapping[str, Sequence[tuple[float, float, str]]],
               subjects: Sequence[str] = SUBJECTS) -> list[dict]:
    """points: per codec, its measurements (rate, value, row label). For each measurement of a `subjects`
    codec, every other codec's curve read at its rate (`peer_value` None outside that codec's measured
    rates, `peer_rates`; interpolated in log(value) unless the curve holds a value <= 0), and the relative
    difference ours / theirs - 1."""
    out = []
    for subject in (c for c in points if c in subjects):
        for rate, value, label in sorted(points[subject]):
            for peer, theirs in points.items():
                if peer == subject or not theirs:
                    continue
                curve = [(x, y) for x, y, _ in theirs]
                peer_value = value_at_rate(curve, rate, log=all(y > 0 for _, y in curve))
                out.append({"codec": subject, "label": label, "rate": rate, "value": value, "peer": peer,
                            "peer_value": peer_value,
                            "peer_rates": [min(x for x, _ in curve), max(x for x, _ in curve)],
                            "relative_difference": None if peer_value is None else value / peer_value - 1})
    return out


def equal_rate_table(entries: Sequence[dict], value_label: str, peers: Sequence[str]) -> list[str]:
    """Markdown lines: a row per subject measurement, a column per peer (in `peers` order) holding its value
    at that rate and the difference in words, '-' with the peer's measured range outside it."""
    shown = [p for p in peers if any(e["peer"] == p for e in entries)]
    head = ["codec", "bits/coord", value_label] + [f"{p} at this rate" for p in shown]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for codec, label in dict.fromkeys((e["codec"], e["label"]) for e in entries):
        cells = {e["peer"]: e for e in entries if (e["codec"], e["label"]) == (codec, label)}
        first = next(iter(cells.values()))
        row = [label, f"{first['rate']:.3f}", f"{first['value']:.4g}"]
        for p in shown:
            e = cells.get(p)
            if e is None:
                row.append("(itself)")
            elif e["peer_value"] is None:
                row.append(f"- (measured {e['peer_rates'][0]:.3f}..{e['peer_rates'][1]:.3f})")
            else:
                diff = relative_difference(e["value"], e["peer_value"])
                row.append(f"{e['peer_value']:.4g}: {codec} {diff}")
        lines.append("| " + " | ".join(row) + " |")
    return lines
