"""Triton kernels shared by every codec: encode, and fused attention over the compressed K/V cache."""

from .ops import AttnConfig, EncodeConfig, attention, encode_keys, encode_values
from .spec import KernelCodec, PackedKeys, PackedValues

__all__ = ["AttnConfig", "EncodeConfig", "KernelCodec", "PackedKeys", "PackedValues", "attention",
           "encode_keys", "encode_values"]
