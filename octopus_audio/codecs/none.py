"""Codec `none`: keys stay native (the uncompressed baseline); scores are plain q.k in fp32."""

from __future__ import annotations

import dataclasses

import torch

from octopus_audio import rotation
from octopus_audio.codecs.base import KeyCodec, KeyState, check_finite_keys
from octopus_audio.codecs.registry import register


@register
@dataclasses.dataclass(frozen=True, repr=False)
class NoneCodec(KeyCodec):
    """Stores k as is. `bits` is accepted and ignored (nominally 16); bits_per_key counts a 16-bit key."""

    bits: int = dataclasses.field(default=16, metadata={"format": False})
    head_dim: int = 64
    seed: int = dataclasses.field(default=0, metadata={"format": False})
    name = "none"
    compressed = False

    def __post_init__(self):
        rotation.check_head_dim(self.head_dim)

    @property
    def bits_per_key(self) -> int:
        return 16 * self.head_dim

    def encode(self, k: torch.Tensor) -> KeyState:
        self.check_keys(k)
        check_finite_keys(k)
        return self.encode_unchecked(k)

    def encode_unchecked(self, k: torch.Tensor) -> KeyState:
        return KeyState(dtype=k.dtype, native=k.contiguous().clone(), written_by=self.state_tag)

    def decode(self, state: KeyState, dtype: torch.dtype | None = None) -> torch.Tensor:
        self.check_state(state)
        return state.native if dtype is None else state.native.to(dtype)

    def scores(self, q: torch.Tensor, state: KeyState) -> torch.Tensor:
        self.check_keys(q, "queries")
        self.check_state(state)
        self.check_heads(q, state)
        return q.to(torch.float32) @ state.native.to(torch.float32).mT

    def __repr__(self) -> str:
        return f"NoneCodec(head_dim={self.head_dim})"
