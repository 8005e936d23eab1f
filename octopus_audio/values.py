"""Group-wise asymmetric b-bit value quantizer (fp16 scale and minimum per group of channels, formats.md)."""

from __future__ import annotations

import dataclasses

import torch

from octopus_audio.codecs.state import T_LAST2, TensorState, tensor_field
from octopus_audio.packing import num_words, pack, unpack

FP16_MAX = 65504.0
VALUE_BITS = tuple(range(1, 9))


@dataclasses.dataclass(frozen=True)
class ValueState(TensorState):
    """Compressed values: `codes` int32 [..., H, T, ceil(d*b/32)]; `scale`, `minimum` fp16 [..., H, T, d/g].

    For the `none` codec only `native` [..., H, T, d] is set (input dtype).
    """

    codes: torch.Tensor | None = tensor_field(T_LAST2)
    scale: torch.Tensor | None = tensor_field(T_LAST2)
    minimum: torch.Tensor | None = tensor_field(T_LAST2)
    native: torch.Tensor | None = tensor_field(T_LAST2)


def _to_dtype(x_fp32: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast to `dtype`, saturating at its finite range (so rounding at the edge never gives Inf)."""
    if dtype != torch.float32 and dtype.is_floating_point:
        fmax = torch.finfo(dtype).max
        x_fp32 = x_fp32.clamp(-fmax, fmax)
    return x_fp32.to(dtype)


@dataclasses.dataclass(frozen=True)
class ValueQuantizer:
    """b-bit asymmetric quantizer of values v [..., H, T, d] in groups of `group` consecutive channels.

    Per group: mn = fp16(min), scale = fp16(min((max - min) / (2^b - 1), 65504)), replaced by 1 where it is 0
    (a constant group, or a range below fp16 resolution); code = clamp(round((v - mn) / scale), 0, 2^b - 1)
    in fp32 from the fp16-rounded mn and scale (round half to even); v_hat = code * scale + mn.
    """

    bits: int
    head_dim: int
    group: int = 16

    def __post_init__(self):
        if self.bits not in VALUE_BITS:
            raise ValueError(
                f"value bits {self.bits} not supported: allowed {VALUE_BITS[0]}..{VALUE_BITS[-1]}"
            )
        if self.group < 1 or self.head_dim % self.group:
            raise ValueError(
                f"value group {self.group} must divide the head dim {self.head_dim} "
                f"(e.g. 16, {self.head_dim})"
            )

    @property
    def bits_per_token(self) -> int:
        """Stored bits per token and head: packed codes (whole words), fp16 scale and minimum per group."""
        return 32 * num_words(self.head_dim, self.bits) + 2 * 16 * (self.head_dim // self.group)

    def encode(self, v: torch.Tensor) -> ValueState:
        """v [..., H, T, d] (any float dtype) -> ValueState. Non-finite or |v| > 65504 is a ValueError."""
        if v.shape[-1] != self.head_dim:
            raise ValueError(
                f"values have last dim {v.shape[-1]}, the quantizer was built for {self.head_dim}"
            )
        if v.numel() and not bool((v.abs().amax().float() <= FP16_MAX).item()):
            raise ValueError("values must be finite and within the fp16 range (|v| <= 65504) to be quantized")
        return self.encode_unchecked(v)

    def encode_unchecked(self, v: torch.Tensor) -> ValueState:
        """encode without the data-dependent range check (the cache checks each unit once)."""
        v32 = v.to(torch.float32)
        levels = 2**self.bits - 1
        v_G = v32.reshape(*v32.shape[:-1], self.head_dim // self.group, self.group)
        mn = v_G.amin(-1)
        mx = v_G.amax(-1)
        mn16 = mn.to(torch.float16)
        scale16 = ((mx - mn) / levels).clamp(max=FP16_MAX).to(torch.float16)
        scale16 = torch.where(scale16 == 0, torch.ones_like(scale16), scale16)
        codes_G = torch.round((v_G - mn16.float()[..., None]) / scale16.float()[..., None]).clamp(0, levels)
        codes = pack(codes_G.to(torch.int64).reshape(v32.shape), self.bits)
        return ValueState(dtype=v.dtype, codes=codes, scale=scale16, minimum=mn16)

    def decode(self, state: ValueState, dtype: torch.dtype | None = None) -> torch.Tensor:
        """ValueState -> v_hat [..., H, T, d] in `dtype` (default: the encoded input's dtype)."""
        codes = unpack(state.codes, self.bits, self.head_dim).to(torch.float32)
        codes_G = codes.reshape(*codes.shape[:-1], self.head_dim // self.group, self.group)
        v_G = codes_G * state.scale.float()[..., None] + state.minimum.float()[..., None]
        return _to_dtype(v_G.reshape(codes.shape), dtype or state.dtype)
