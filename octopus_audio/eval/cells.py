"""How both tables of an eval's report (the paired one, eval/report.py, and the distribution one,
eval/dist_report.py) show a row's job: its bits cells (CSV: its JOB_COLUMNS), its stored bits per
coordinate, its curve's name."""

from __future__ import annotations

from collections.abc import Sequence

from octopus_audio.eval.records import FLOOR, KV_FLOOR, REFERENCE, Job

UNCOMPRESSED_ROWS = (REFERENCE, FLOOR, KV_FLOOR)  # rows with no codec and no bits
JOB_COLUMNS = ("bits", "v_bits", "sink_scales", "wide_scales", "wide_bits")  # the CSV tables' cells of a job


def kv_bits(kv: dict | None) -> float | None:
    """Bits the compressed store holds per coordinate, keys and values together (K and V have as many
    coordinates each, so the mean of the two), from a row's `kv`; None when either is missing."""
    if not kv or kv.get("k_bits") is None or kv.get("v_bits") is None:
        return None
    return (kv["k_bits"] + kv["v_bits"]) / 2.0


def group_job(g: dict) -> Job:
    """The job a report group (`report.aggregate`, `dist_report.distribution`) holds the rows of."""
    return Job(*(g[name] for name in Job._fields))


def curve_of(job: Job) -> tuple[str, int | None, int | None]:
    """(codec, sink scales, wide scales): the rate-distortion curve a job lies on (its widths run along
    it)."""
    return job.codec, job.sink_scales, job.wide_scales


def bits_cells(job: Job) -> list[str]:
    """The K bits, V bits and sink scales cells of a row (`3 W4@4` with 4 wide scales at 4 bits)."""
    if job.codec in UNCOMPRESSED_ROWS:
        return ["-", "-", "-"]
    if job.bits is None:
        return ["native", "native", "-"]
    return [str(job.bits), str(job.bits if job.v_bits is None else job.v_bits),
            f"{job.sink_scales or 0}{wide_label(job)}"]


def wide_label(job: Job) -> str:
    """` W4@4` for a job with 4 wide scales at 4 bits (after its sink scales in a label), else ''."""
    return f" W{job.wide_scales}@{job.wide_bits}" if job.wide_scales else ""


def curve_names(groups: Sequence[dict]) -> dict[tuple[str, int | None, int | None], str]:
    """The curve of each (codec, sink scales, wide scales) (`curve_of`) of the rate-distortion views, the
    distribution plots and the equal-rate tables, by name: the codec alone when the run has one count of sink
    scales and one of wide scales, else `octopus S=3` (one curve per count of sink scales, through the bit
    widths), `octopus W=4@4` (per count of wide scales, `W=0` without) or both."""
    jobs = [group_job(g) for g in groups if g["codec"] not in UNCOMPRESSED_ROWS and g["bits"] is not None]
    wide_bits = {curve_of(j): j.wide_bits for j in jobs}  # per curve: its wide scales' bits
    several_sinks = len({s for _, s, _ in wide_bits}) > 1
    several_wides = len({w for _, _, w in wide_bits}) > 1

    def name(codec: str, sinks: int | None, wide: int | None) -> str:
        wide_name = f" W={wide}@{wide_bits[codec, sinks, wide]}" if wide else " W=0"
        return codec + (f" S={sinks}" if several_sinks else "") + (wide_name if several_wides else "")

    return {k: name(*k) for k in wide_bits}
