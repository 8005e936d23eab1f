"""The compressed store of a KV cache: preallocated packed buffers along T, written unit by unit, grown by
doubling."""

from __future__ import annotations

import dataclasses

import torch

from octopus_audio.codecs.base import KeyState
from octopus_audio.packing import num_words
from octopus_audio.values import ValueState

# (field name, token axis from the end) of each state class, read once (TensorState derives them per call)
_FIELDS = {cls: tuple((n, cls._t_dim(n)) for n in cls.tensor_field_names()) for cls in (KeyState, ValueState)}


def _present(state) -> list[tuple[str, int, torch.Tensor]]:
    """(name, token axis, tensor) of the fields `state` holds, in the class's field order."""
    out = []
    for name, t_dim in _FIELDS[type(state)]:
        t = getattr(state, name)
        if t is not None:
            out.append((name, t.ndim + t_dim, t))
    return out


def _narrow(state, length: int):
    """Tokens [0, length) of every field of `state` (views)."""
    fields = {name: t.narrow(axis, 0, length) for name, axis, t in _present(state)}
    return dataclasses.replace(state, **fields)


@dataclasses.dataclass
class CacheStore:
    """The compressed store: per-field buffers preallocated along T (grown by doubling); tokens [0, length)
    are valid. `keys` is a KeyState and `values` a ValueState whose tensors are [B, H, capacity, ...]
    (formats.md); for a codec that does not compress they hold `native` K and V. `grow` doubles the capacity;
    `rebind` takes new buffers."""

    keys: KeyState
    values: ValueState
    length: int = 0

    def __post_init__(self) -> None:
        self.rebind(self.keys, self.values)

    def rebind(self, keys: KeyState, values: ValueState) -> None:
        """Take new buffers (same fields, more capacity); the per-write field list is derived here once."""
        self.keys, self.values = keys, values
        self._slots = ([(name, axis, t, True) for name, axis, t in _present(keys)]
                       + [(name, axis, t, False) for name, axis, t in _present(values)])
        name, axis, t, _ = self._slots[0]
        self._capacity = t.shape[axis]
        self._packed = None

    @property
    def capacity(self) -> int:
        return self._capacity

    def write(self, keys: KeyState, values: ValueState, n: int) -> None:
        """Copy n tokens (`keys`, `values` hold exactly them) into the buffers at `length`; length += n."""
        start = self.length
        for name, axis, buf, is_key in self._slots:
            buf.narrow(axis, start, n).copy_(getattr(keys if is_key else values, name))
        self.length = start + n

    def packed(self, packed_keys, packed_values, quantizer):
        """The whole buffers as the kernels' (PackedKeys, PackedValues), built once per binding."""
        if self._packed is None:
            k, v = self.keys, self.values
            self._packed = (packed_keys(k.codes, k.gamma, k.signs, k.gamma_r),
                            packed_values(v.codes, v.scale, v.minimum, quantizer.bits, quantizer.group))
        return self._packed

    def valid(self) -> tuple[KeyState, ValueState]:
        """Views of the valid tokens [0, length)."""
        return _narrow(self.keys, self.length), _narrow(self.values, self.length)

    def grow(self, n: int) -> None:
        """Room for n more tokens: the capacity doubles (at least), the valid tokens copied."""
        cap = max(self.length + n, 2 * self.capacity)
        keys, values = self.valid()
        self.rebind(keys.with_capacity(cap), values.with_capacity(cap))

    def reserve(self, n: int) -> None:
        """Make room for n more tokens when the buffers are full (`grow`)."""
        if self.length + n > self.capacity:
            self.grow(n)

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep batch rows `index` (1-D integer tensor) of every buffer, in that order (new buffers)."""
        def pick(state):
            fields = {name: t.index_select(0, index) for name, _, t in _present(state)}
            return dataclasses.replace(state, **fields)

        self.rebind(pick(self.keys), pick(self.values))

    @property
    def nbytes(self) -> tuple[int, int]:
        """(key bytes, value bytes) of the valid tokens."""
        k, v = self.valid()
        return k.nbytes, v.nbytes


def empty_store(codec, quantizer, k: torch.Tensor, capacity: int) -> CacheStore:
    """Empty buffers (formats.md) for `capacity` tokens of a sequence whose units look like k [B, H, T, d]:
    the codec's declared key fields and `quantizer`'s value fields, for an encode that writes in place."""
    B, H, _, d = k.shape

    def buf(*tail, dtype, fill=False):
        return (torch.zeros if fill else torch.empty)(B, H, capacity, *tail, dtype=dtype, device=k.device)

    fields = {name: buf(*tail, dtype=dtype) for name, (tail, dtype) in codec.layout.fields().items()}
    keys = KeyState(dtype=k.dtype, written_by=codec.state_tag, **fields)
    # the padding bits of a value row's last word are never written by the kernel: zero them once
    padded = (d * quantizer.bits) % 32 != 0
    codes = buf(num_words(d, quantizer.bits), dtype=torch.int32, fill=padded)
    values = ValueState(dtype=k.dtype, codes=codes,
                        scale=buf(d // quantizer.group, dtype=torch.float16),
                        minimum=buf(d // quantizer.group, dtype=torch.float16))
    return CacheStore(keys, values, 0)

