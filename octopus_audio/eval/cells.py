"""How both tables of an eval's report (the paired one, eval/report.py, and the distribution one,
eval/dist_report.py) show a row's job: its bits cells, its stored bits per coordinate, its curve's name."""

from __future__ import annotations

from collections.abc import Sequence

from octopus_audio.eval.records import FLOOR, KV_FLOOR, REFERENCE

UNCOMPRESSED_ROWS = (REFERENCE, FLOOR, KV_FLOOR)  # rows with no codec and no bits


def kv_bits(kv: dict | None) -> float | None:
    """Bits the compressed store holds per coordinate, keys and values together (K and V have as many
    coordinates each, so the mean of the two), from a row's `kv`; None when either is missing."""
    if not kv or kv.get("k_bits") is None or kv.get("v_bits") is None:
        return None
    return (kv["k_bits"] + kv["v_bits"]) / 2.0


def bits_cells(codec: str, bits: int | None, v_bits: int | None, sink_scales: int | None) -> list[str]:
    """The K bits, V bits and sink scales cells of a row."""
    if codec in UNCOMPRESSED_ROWS:
        return ["-", "-", "-"]
    if bits is None:
        return ["native", "native", "-"]
    return [str(bits), str(bits if v_bits is None else v_bits), str(sink_scales or 0)]


def curve_names(groups: Sequence[dict]) -> dict[tuple[str, int | None], str]:
    """The curve of each (codec, sink scales) of the rate-distortion views, the distribution plots and the
    equal-rate tables, by name: the codec alone when the run has one count of sink scales, else `octopus
    S=3` (one curve per count, through the bit widths)."""
    keys = dict.fromkeys((g["codec"], g["sink_scales"]) for g in groups
                         if g["codec"] not in UNCOMPRESSED_ROWS and g["bits"] is not None)
    several = len({s for _, s in keys}) > 1
    return {k: f"{k[0]} S={k[1]}" if several else k[0] for k in keys}
