"""The eval's row identities: a job (the reference's own rows, a floor, or a codec at its key and value
widths) and a unit (a job at one draw), as rows, reports and the runner name them."""

from __future__ import annotations

from typing import NamedTuple


class Job(NamedTuple):
    """One row per clip: a codec (or a floor row) at key bits `bits` and value bits `v_bits` (both None for
    the floors and `none`)."""

    codec: str
    bits: int | None = None
    v_bits: int | None = None


class Unit(NamedTuple):
    """One row of a clip: a job (REFERENCE, a floor or a codec at its widths) at one draw."""

    job: Job
    draw: int
