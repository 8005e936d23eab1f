"""The native tokens of a KV cache: the prefix (a sequence's first tokens, kept native) then the window (the
newest units), back to back in one preallocated buffer, so attention reads them as one segment."""

from __future__ import annotations

import torch


class NativeSegment:
    """K and V [B, H, capacity, d] buffers holding, from position 0: the prefix (`prefix_tokens` tokens, the
    sequence's first, written once and never moved) and the window (`units`, the token counts of the newest
    units, oldest first). `kv()` is one view of both: the attention kernels and the reference read it with no
    concatenation. A unit that enters is copied in: a unit that is a view into the model's fused q/k/v
    projection would otherwise keep the whole projection alive (at AAR B=64, 0.63 GB more than the window's
    own bytes, measured on an H200 when the window kept the units it was given). The buffers grow (doubling,
    at least to what is needed) when a unit does not fit. `capacity` (tokens) sizes them at the first unit; a
    caller that knows the sequence (the AAR patch) reserves the peak and nothing grows. `reserved` (tokens, or
    None): what the caller reserved; buffers grown past it go back to it once what they hold fits again, so a
    large unit passing through the window (a language model's prompt) does not pin its size for the rest of
    the sequence. None: buffers never shrink."""

    def __init__(self, like: torch.Tensor, capacity: int, reserved: int | None = None) -> None:
        B, H, _, d = like.shape
        self._k = torch.empty(B, H, capacity, d, dtype=like.dtype, device=like.device)
        self._v = torch.empty_like(self._k)
        self.prefix_tokens = 0
        self.units: list[int] = []
        self.reserved = reserved
        self._views = None  # kv()'s views, made once per change (attend reads them each call)

    @property
    def capacity(self) -> int:
        return self._k.shape[2]

    @property
    def window_tokens(self) -> int:
        return sum(self.units)

    @property
    def tokens(self) -> int:
        return self.prefix_tokens + self.window_tokens

    def _reserve(self, n: int) -> None:
        """Room for n more tokens: the buffers grow (to twice their capacity at least), the valid tokens
        copied."""
        need = self.tokens + n
        if need <= self.capacity:
            return
        self._resize(max(need, 2 * self.capacity))

    def _resize(self, cap: int) -> None:
        """Buffers of `cap` tokens (at least those held), the valid tokens copied."""
        self._views = None
        for name in ("_k", "_v"):
            old = getattr(self, name)
            new = old.new_empty(*old.shape[:2], cap, old.shape[3])
            new.narrow(2, 0, self.tokens).copy_(old.narrow(2, 0, self.tokens))
            setattr(self, name, new)

    def _write(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self._views = None
        n = k.shape[2]
        self._reserve(n)
        self._k.narrow(2, self.tokens, n).copy_(k)
        self._v.narrow(2, self.tokens, n).copy_(v)

    def push(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """A unit k, v [B, H, T, d] enters the window (copied in after the tokens held)."""
        self._write(k, v)
        self.units.append(k.shape[2])

    def extend_prefix(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Tokens k, v [B, H, T, d] join the prefix directly (a cache without a window: it is empty)."""
        if self.units:
            raise RuntimeError("extend_prefix needs an empty window: the prefix lies before it")
        self._write(k, v)
        self.prefix_tokens += k.shape[2]

    def oldest(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of the oldest window unit's K, V [B, H, T_unit, d]."""
        return (self._k.narrow(2, self.prefix_tokens, self.units[0]),
                self._v.narrow(2, self.prefix_tokens, self.units[0]))

    def pop(self, keep: int) -> None:
        """The oldest window unit leaves the window: its first `keep` tokens join the prefix (they are already
        in place), the others leave the buffers (the caller has stored them) and the younger window units
        move up to close the gap (nothing moves with a window of one unit)."""
        self._views = None
        t = self.units.pop(0)
        if not 0 <= keep <= t:
            raise ValueError(f"keep must be within 0..{t} (the unit's tokens), got {keep}")
        self.prefix_tokens += keep
        gap, rest = t - keep, self.window_tokens
        if gap and rest:
            for buf in (self._k, self._v):
                src = buf.narrow(2, self.prefix_tokens + gap, rest).clone()  # the ranges overlap
                buf.narrow(2, self.prefix_tokens, rest).copy_(src)
        if self.reserved is not None and self.capacity > self.reserved >= self.tokens:
            self._resize(self.reserved)

    def crop(self, tokens: int) -> None:
        """Keep the first `tokens` native tokens as the buffer holds them (the prefix, then the window):
        within the prefix the window is dropped; past it the window keeps its oldest units, the last one cut
        short where `tokens` ends. Nothing moves."""
        if not 0 <= tokens <= self.tokens:
            raise ValueError(f"crop keeps 0..{self.tokens} native tokens, got {tokens}")
        self._views = None
        if tokens <= self.prefix_tokens:
            self.prefix_tokens, self.units = tokens, []
            return
        keep, units = tokens - self.prefix_tokens, []
        for n in self.units:
            if keep <= 0:
                break
            units.append(min(n, keep))
            keep -= n
        self.units = units

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep batch rows `index` (1-D integer tensor, entries in 0..B-1) of both buffers, in that order (new
        buffers of the same capacity)."""
        self._k, self._v = self._k.index_select(0, index), self._v.index_select(0, index)
        self._views = None

    def kv(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The prefix then the window, K and V [B, H, tokens, d] (views), or None when nothing is held. The
        views are made once per change of the segment (every method that changes it drops them): attend reads
        them at every call, where two narrows were 2-3 us of host time."""
        views = self._views
        if views is None:
            n = self.tokens
            views = self._views = (self._k.narrow(2, 0, n), self._v.narrow(2, 0, n)) if n else ()
        return views or None

    def prefix_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The prefix's K, V [B, H, prefix_tokens, d] (views)."""
        return self._k.narrow(2, 0, self.prefix_tokens), self._v.narrow(2, 0, self.prefix_tokens)

    def window_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The window's K, V [B, H, window_tokens, d] (views)."""
        start, n = self.prefix_tokens, self.window_tokens
        return self._k.narrow(2, start, n), self._v.narrow(2, start, n)

    def window_units(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each window unit's K, V (views), oldest first."""
        out, start = [], self.prefix_tokens
        for n in self.units:
            out.append((self._k.narrow(2, start, n), self._v.narrow(2, start, n)))
            start += n
        return out

    @property
    def nbytes(self) -> tuple[int, int]:
        """(prefix bytes, window bytes), K and V together."""
        B, H, _, d = self._k.shape
        per_token = 2 * B * H * d * self._k.element_size()
        return per_token * self.prefix_tokens, per_token * self.window_tokens

    @property
    def allocated_bytes(self) -> int:
        return 2 * self._k.numel() * self._k.element_size()
