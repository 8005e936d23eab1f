"""The checks of what a KV cache is given: a unit's layout and data (immediate, one host sync a unit, or
deferred to a device-side record read once per sequence) and a query's shape, scale and data."""

from __future__ import annotations

import math
import numbers

import torch

from octopus_audio.codecs.base import require_tensor
from octopus_audio.values import FP16_MAX


class DeferredFlags:
    """The device-side record of one sequence's deferred data checks, written without a host sync: row u of
    `peaks` [rows, 2] (float32) says whether unit u's keys and values were fine, either as max |k| and
    max |v| (`record`: torch reductions, NaN and Inf propagate) or as 0 for fine and +inf for bad (the fused
    encode kernel writes row(u) while it encodes the unit); `units` rows are valid. `quantized`: values must
    also fit the fp16 range. Rows start at zero (grown by doubling) and 16 bytes apart (a view of [rows, 4]),
    so every row a kernel writes has the same pointer alignment (one compiled variant). A CUDA graph that
    captured the sequence zeroes and rewrites the same rows on each replay."""

    def __init__(self, device: torch.device, quantized: bool, rows: int = 16) -> None:
        self.quantized = quantized
        self.units = 0
        self.measured: set[int] = set()  # rows `record` wrote (peaks); the others are the kernel's 0 / +inf
        self.peaks = torch.zeros(rows, 4, dtype=torch.float32, device=device)[:, :2]
        self._split()

    def _split(self) -> None:
        self._rows = [(r, r[0], r[1]) for r in self.peaks.unbind(0)]

    def row(self, unit: int) -> torch.Tensor:
        """Row `unit` ([2] float32, a view starting 16-byte aligned), counted valid from now on."""
        if unit >= len(self._rows):
            rows = max(2 * len(self._rows), unit + 1)
            grown = torch.zeros(rows, 4, dtype=torch.float32, device=self.peaks.device)[:, :2]
            grown[:self.units].copy_(self.peaks[:self.units])
            self.peaks = grown
            self._split()
        self.units = max(self.units, unit + 1)
        return self._rows[unit][0]

    def record(self, unit: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """max |k| and max |v| of unit `unit` into its row: two reductions."""
        self.row(unit)
        self.measured.add(unit)
        _, peak_k, peak_v = self._rows[unit]
        torch.linalg.vector_norm(k, ord=math.inf, dtype=torch.float32, out=peak_k)
        torch.linalg.vector_norm(v, ord=math.inf, dtype=torch.float32, out=peak_v)

    def error(self, rows: list[list[float]]) -> ValueError | None:
        """The append error these rows (`peaks[:units]` read back) mean, the same sentence as the immediate
        check where the record tells as much, or None when every unit was fine."""
        if any(not math.isfinite(pk) for pk, _ in rows):
            return append_error("keys", self.quantized)
        bad = [(u, pv) for u, (_, pv) in enumerate(rows)
               if not (pv <= FP16_MAX if self.quantized else math.isfinite(pv))]
        if not bad:
            return None
        unit, peak = bad[0]
        # the fused encode kernel marks a bad unit +inf, whether its values were non-finite or beyond fp16
        return append_error("values", self.quantized, peak if math.isfinite(peak) else None,
                            unsure=unit not in self.measured and self.quantized)


def append_error(what: str, quantized: bool, peak: float | None = None, unsure: bool = False) -> ValueError:
    """The sentence of a unit `append` refuses: non-finite keys or values, or (`quantized`) values beyond the
    fp16 range their group scale and minimum are stored in (`peak`: the largest finite |v| seen), or
    (`unsure`) either of the two."""
    accepted = ("keys must be finite; values finite and within the fp16 range, |v| <= 65504 (the quantizer "
                "stores each group's scale and minimum in fp16)" if quantized
                else "keys and values must be finite")
    if peak is not None:
        return ValueError(f"append got values beyond the fp16 range (max |v| = {peak:.4g}): {accepted}")
    if unsure:
        return ValueError(f"append got {what} that are non-finite or beyond the fp16 range: {accepted}")
    return ValueError(f"append got non-finite {what} (NaN or Inf): {accepted}")


def capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def check_flags(flags: list[DeferredFlags]) -> None:
    """Read several caches' deferred records with one host sync per device; the first bad one raises its
    ValueError. Does nothing while a CUDA graph is being captured (reading would break the capture)."""
    flags = [f for f in flags if f.units]
    if not flags or capturing():
        return
    by_device: dict[torch.device, list[DeferredFlags]] = {}
    for f in flags:
        by_device.setdefault(f.peaks.device, []).append(f)
    rows: dict[int, list[list[float]]] = {}
    for group in by_device.values():
        values = torch.cat([f.peaks[:f.units] for f in group]).tolist()  # the one sync per device
        start = 0
        for f in group:
            rows[id(f)] = values[start:start + f.units]
            start += f.units
    for f in flags:
        err = f.error(rows[id(f)])
        if err is not None:
            raise err


def check_caches(caches, force: bool = False) -> None:
    """Run the deferred data checks of `caches` (CompressedKVCache; those with unchecked units, every one
    with a record when `force`) with one host sync; raises the append ValueError of the first bad cache."""
    todo = [c for c in caches if c.deferred_flags() is not None and (force or c.checks_pending)]
    for c in todo:
        c.flush_checks()  # device work only: a graph capture records it
    if not todo or capturing():
        return
    for c in todo:
        c.checks_pending = False
    check_flags([c.deferred_flags() for c in todo])


def check_unit(k: torch.Tensor, v: torch.Tensor, quantized: bool) -> None:
    """The immediate data check of one unit (one host sync): finite keys; values finite, and within the fp16
    range when `quantized`. Raises the append ValueError."""
    if quantized:
        ok = torch.isfinite(k).all() & (v.abs().amax().float() <= FP16_MAX)
    else:
        ok = torch.isfinite(k).all() & torch.isfinite(v).all()
    if bool(ok.item()):
        return
    if not bool(torch.isfinite(k).all()):
        raise append_error("keys", quantized)
    if not bool(torch.isfinite(v).all()):
        raise append_error("values", quantized)
    raise append_error("values", quantized, float(v.abs().amax()))


def check_layout(k: torch.Tensor, v: torch.Tensor, head_dim: int, layout: tuple | None) -> None:
    """A unit's types, shapes, dtype and device: torch tensors k and v [B, H, T_unit, head_dim], one shape,
    dtype and device, at least one token, and (B, H, dtype, device) equal to `layout` when the cache already
    holds units."""
    require_tensor(k, "append's k")
    require_tensor(v, "append's v")
    if k.ndim != 4 or k.shape != v.shape or k.shape[-1] != head_dim:
        raise ValueError(f"append takes k and v of one shape [B, H, T_unit, {head_dim}], "
                         f"got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.numel() == 0:
        raise ValueError(f"append takes one unit of at least one token: k and v [B, H, T_unit, "
                         f"{head_dim}] with B, H, T_unit >= 1, got {tuple(k.shape)}")
    if k.dtype != v.dtype or k.device != v.device:
        raise ValueError(f"k and v must share dtype and device, got {k.dtype}/{v.dtype}, "
                         f"{k.device}/{v.device}")
    got = (k.shape[0], k.shape[1], k.dtype, k.device)
    if layout is not None and got != layout:
        raise ValueError(f"this cache holds units of (batch, heads, dtype, device) = {layout}; "
                         f"got {got}; reset() first to change them")


def check_query(q: torch.Tensor, scale: float, batch: int, heads: int, head_dim: int, what: str = "attend",
                data: bool = False) -> int:
    """q's type and shape [B=batch, Hq, Tq, head_dim] with Hq a multiple of `heads` (the KV heads), and the
    scale (finite, > 0); `data` (the checked path: one host sync) also refuses NaN or Inf in q. Returns the
    query heads per KV head, Hq // heads. `what` names the call in the sentence."""
    # a finite positive Python float (the usual scale) passes the first test alone: this runs every attend
    usual = type(scale) is float and 0.0 < scale < math.inf
    if not usual and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)
                      or not 0 < float(scale) < math.inf):
        raise ValueError(f"{what} takes a finite positive scale (the softmax temperature, usually "
                         f"1/sqrt(head_dim)), got {scale!r}")
    if not isinstance(q, torch.Tensor):
        require_tensor(q, f"{what}'s q")
    expected = f"q [B={batch}, Hq, Tq, {head_dim}] with Hq a multiple of H={heads}"
    if q.ndim != 4:
        problem = f"q has {q.ndim} dims"
    elif q.shape[0] != batch:
        problem = f"q's batch is {q.shape[0]}, the cache's {batch}"
    elif q.shape[-1] != head_dim:
        problem = f"q's head_dim is {q.shape[-1]}, the cache's {head_dim}"
    elif q.shape[1] % heads:
        problem = f"q's {q.shape[1]} heads are not a multiple of the cache's H={heads} KV heads"
    else:
        problem = None
    if problem:
        raise ValueError(f"{what} takes {expected}; {problem} (got {tuple(q.shape)})")
    if data and not bool(torch.isfinite(q).all()):
        raise ValueError(f"{what} got non-finite queries (NaN or Inf): q must be finite")
    return q.shape[1] // heads
