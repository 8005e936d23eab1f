"""Triton kernels shared by every codec: encode, and fused attention over the compressed K/V cache."""

from .ops import AttnConfig, EncodeConfig, attention, encode_keys, encode_values
from .spec import KERNEL_CODECS, KernelCodec, PackedKeys, PackedValues

__all__ = ["KERNEL_CODECS", "AttnConfig", "EncodeConfig", "KernelCodec", "PackedKeys", "PackedValues",
           "attention", "encode_keys", "encode_values"]
