"""Packed-state containers: frozen dataclasses of tensors that slice, concatenate and grow along tokens T."""

from __future__ import annotations

import dataclasses

import torch

# Per-field metadata: the token axis counted from the end (-2 for [..., H, T, X] fields, -1 for [..., H, T]).
T_LAST2 = {"t_dim": -2}
T_LAST1 = {"t_dim": -1}


def tensor_field(t_dim_meta: dict):
    """A dataclass field holding an optional tensor whose token axis is given by `t_dim_meta`."""
    return dataclasses.field(default=None, metadata=t_dim_meta)


@dataclasses.dataclass(frozen=True)
class TensorState:
    """Base of the key and value states: tensor fields (None when a codec has no such field) plus `dtype`.

    Every tensor field has the token axis T at the position its metadata says (from the end), all other
    axes equal across fields (leading batch dims, then heads H).
    """

    dtype: torch.dtype = torch.float32

    @classmethod
    def tensor_field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if "t_dim" in f.metadata)

    @classmethod
    def _t_dim(cls, name: str) -> int:
        return next(f.metadata["t_dim"] for f in dataclasses.fields(cls) if f.name == name)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensor fields that are present, by name."""
        return {n: getattr(self, n) for n in self.tensor_field_names() if getattr(self, n) is not None}

    @property
    def nbytes(self) -> int:
        """Bytes of all tensors in the state (the honest storage cost)."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    @property
    def num_tokens(self) -> int:
        name, t = next(iter(self.tensors().items()))
        return t.shape[self._t_dim(name)]

    @property
    def device(self) -> torch.device:
        return next(iter(self.tensors().values())).device

    def _map(self, fn) -> TensorState:
        return dataclasses.replace(self, **{n: fn(n, t) for n, t in self.tensors().items()})

    def slice_t(self, start: int, stop: int) -> TensorState:
        """Tokens [start, stop) of every field (views, no copy)."""
        return self._map(lambda n, t: t.narrow(t.ndim + self._t_dim(n), start, stop - start))

    def to(self, device) -> TensorState:
        return self._map(lambda n, t: t.to(device))

    def contiguous(self) -> TensorState:
        return self._map(lambda n, t: t.contiguous())

    @classmethod
    def cat_t(cls, states: list[TensorState]) -> TensorState:
        """Concatenate states along tokens (all of the same class, fields and dtype)."""
        if not states:
            raise ValueError("cat_t needs at least one state")
        first = states[0]
        if any(type(s) is not type(first) or s.dtype != first.dtype for s in states):
            raise ValueError("cat_t needs states of one type and dtype")
        return first._map(
            lambda n, t: torch.cat([getattr(s, n) for s in states], dim=t.ndim + cls._t_dim(n))
        )

    def with_capacity(self, capacity: int) -> TensorState:
        """A new state of `capacity` tokens whose first `num_tokens` tokens are a copy of this one."""
        n_tok = self.num_tokens
        if capacity < n_tok:
            raise ValueError(f"capacity {capacity} is below the {n_tok} tokens held")

        def grow(n, t):
            axis = t.ndim + self._t_dim(n)
            shape = list(t.shape)
            shape[axis] = capacity
            out = torch.zeros(shape, dtype=t.dtype, device=t.device)
            out.narrow(axis, 0, n_tok).copy_(t)
            return out

        return self._map(grow)

    def write_t(self, start: int, other: TensorState) -> None:
        """Copy `other`'s tokens into this state's buffers at [start, start + other.num_tokens), in place."""
        n_tok = other.num_tokens
        for n, t in self.tensors().items():
            t.narrow(t.ndim + self._t_dim(n), start, n_tok).copy_(getattr(other, n))
