"""What `patch_aar` installs (`PatchConfig`, validated on construction) and the sink scales it keeps native by
default."""

from __future__ import annotations

import dataclasses

import torch

import octopus_audio
from octopus_audio.codecs import DEFAULT_CODEC, UNCOMPRESSED, codec_class

# The coarse scales every later token attends to, kept native by default (`sink_scales`): chosen from the
# measurements in benchmarks/results/sink_scales.md (the README's table)
DEFAULT_SINK_SCALES = 3


@dataclasses.dataclass(frozen=True)
class PatchConfig:
    """What `patch_aar` installs: codec name, nominal key bits, value bits (None on construction: the key
    bits), native window (units), value group, base seed, the dtype keys and values are rounded to as they
    enter an uncompressed cache (None: kept as the model makes them), and the scales kept native from the
    first (`sink_scales`: the cache's native prefix holds their tokens); the scales after them stored at
    other widths (`wide_scales` of them, keys at `wide_bits`, values at `wide_v_bits`, None on construction:
    `wide_bits`; the cache's wide prefix holds their tokens)."""

    codec: str = DEFAULT_CODEC
    bits: int = 2
    window: int = 1
    v_group: int = 16
    seed: int = 0
    v_bits: int | None = None
    kv_dtype: torch.dtype | None = None
    sink_scales: int = DEFAULT_SINK_SCALES
    wide_scales: int = 0
    wide_bits: int = 4
    wide_v_bits: int | None = None

    def __post_init__(self) -> None:
        if self.codec not in octopus_audio.CODECS:
            raise ValueError(f"unknown codec {self.codec!r}; allowed: {', '.join(octopus_audio.CODECS)}")
        if self.v_bits is None:
            object.__setattr__(self, "v_bits", self.bits)
        if self.wide_v_bits is None:
            object.__setattr__(self, "wide_v_bits", self.wide_bits)
        for name, low in (("bits", 1), ("v_bits", 1), ("window", 0), ("v_group", 1), ("seed", 0),
                          ("sink_scales", 0), ("wide_scales", 0), ("wide_bits", 1), ("wide_v_bits", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if self.kv_dtype is not None:
            if not isinstance(self.kv_dtype, torch.dtype) or not self.kv_dtype.is_floating_point:
                raise ValueError(f"kv_dtype must be a floating torch dtype such as torch.bfloat16, got "
                                 f"{self.kv_dtype!r}")
            if codec_class(self.codec).compressed:
                raise ValueError(f"kv_dtype rounds the keys and values of the uncompressed cache (codec "
                                 f"{UNCOMPRESSED}); codec {self.codec!r} encodes them itself: pass codec "
                                 f"{UNCOMPRESSED!r} or leave kv_dtype None")
        if self.wide_scales and not codec_class(self.codec).compressed:
            raise ValueError(f"wide_scales stores scales at other widths, but codec {self.codec!r} stores "
                             f"every token native: pass a codec that compresses, or wide_scales=0")

    @property
    def label(self) -> str:
        """`octopus b=2 S=3`: the codec, its widths (`bits_label`) and, when any, the sink scales and the
        wide scales (`octopus b=2 S=2 wide=4@4/4`: the next 4 scales' keys at 4 bits, values at 4; `W=` is the
        window's in the patch's stats line)."""
        return f"{self.codec} {self.bits_label}" + (f" S={self.sink_scales}" if self.sink_scales else "") + (
            f" wide={self.wide_scales}@{self.wide_bits}/{self.wide_v_bits}" if self.wide_scales else "")

    @property
    def bits_label(self) -> str:
        """`b=2` when keys and values share the width, else `K b=2 V b=4`; `kv_dtype` is named after it."""
        label = f"b={self.bits}" if self.v_bits == self.bits else f"K b={self.bits} V b={self.v_bits}"
        return label if self.kv_dtype is None else f"{label} K/V rounded to {str(self.kv_dtype)[6:]}"
