"""Where a sampled generation first parts ways with the reference: the first scale whose tokens differ."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from octopus_audio.eval.metrics import MetricInfo

PARTING_METRICS: tuple[MetricInfo, ...] = (MetricInfo("first_parting_scale", "first parting scale", True),)


def first_parting_scale(ref_tokens: Sequence, tokens: Sequence) -> int:
    """The first scale whose tokens differ from the reference's, counted from 1 (the coarsest scale, as
    benchmarks/lab/first_flip.py and the results count them); the number of scales + 1 when every scale is
    equal (the two generations never part). Every token after it was drawn from other
    inputs, so how far a codec keeps the reference's sample is read here, free of how much the audio then
    moves. Higher is better; scale counts of different lengths are a ValueError."""
    if len(ref_tokens) != len(tokens):
        raise ValueError(f"the generations have {len(ref_tokens)} and {len(tokens)} scales; compare "
                         f"generations of one model")
    for s, (a, b) in enumerate(zip(ref_tokens, tokens, strict=True)):
        if not np.array_equal(np.asarray(a).reshape(-1), np.asarray(b).reshape(-1)):
            return s + 1
    return len(tokens) + 1


def parting_metrics(ref_tokens: Sequence, tokens: Sequence) -> dict[str, int]:
    """The PARTING_METRICS of one row."""
    return {"first_parting_scale": first_parting_scale(ref_tokens, tokens)}
