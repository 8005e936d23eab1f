"""Where a sequence of units lands in a cache with a window of W units, a native prefix of P tokens and a wide
prefix of N tokens: the tokens a generation stores (`stored_span`) and the capacities that hold it with no
growth (`sequence_capacities`). Token arithmetic only; `units` are the tokens of each unit, in order."""

from __future__ import annotations

from collections.abc import Sequence


def stored_span(units: Sequence[int], window: int, native_prefix: int = 0) -> tuple[int, int]:
    """The tokens [start, stop) of a sequence of `units` that a generation encodes into the store: those that
    leave the window (all but the last `window` units'; no later query sees those stored) past the native
    prefix (the first `native_prefix` tokens)."""
    stop = sum(units[:max(len(units) - window, 0)])
    return min(native_prefix, stop), stop


def sequence_capacities(units: Sequence[int], window: int, native_prefix: int = 0,
                        wide_prefix: int = 0) -> tuple[int, int]:
    """(store tokens, native tokens at their peak) of one sequence of `units` (tokens per unit, in order)
    appended to a cache with `window`, `native_prefix` and `wide_prefix` (whose tokens the wide store holds,
    not the store): the `capacity` and `native_capacity` that hold the sequence with no growth and no spare
    room."""
    prefix = wide = store = peak = 0
    held: list[int] = []  # the window's units
    for t in units:
        held.append(t)
        if len(held) > window:  # the oldest leaves: its first tokens to the prefix, the rest stored
            leaving = held.pop(0)
            keep = min(max(native_prefix - prefix, 0), leaving)
            widened = min(max(wide_prefix - wide, 0), leaving - keep)
            prefix += keep
            wide += widened
            store += leaving - keep - widened
        peak = max(peak, prefix + sum(held))
    return store, peak
