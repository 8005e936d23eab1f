"""Triton kernels shared by every codec: encode, and fused attention over the compressed K/V cache.

One file per op, kernels beside their launcher: `flash.py` (attention by split-K flash decoding; on sm_90 it
hands the calls `gluon_scope.py` finds in scope to the warp-specialised Gluon kernel of `gluon_flash.py`,
whose per-codec decode sections are `gluon_decode.py`),
`score_tables.py` (one query row per KV head by per-query score tables, built by `query_tables.py`),
`encode.py` (keys, and the fused unit encode of keys and values into a store; on sm_90 `encode_keys` hands
the polarquant widths `gluon_scope.py` finds in scope to the Gluon kernel of `gluon_encode.py`),
`value_encode.py` (values).
The per-codec @triton.jit sections: `codec_decode.py` (keys, one section per kind of decode),
`value_decode.py`, `codec_encode.py`; shared bit helpers in `bits.py`, launch helpers in `launch.py`, what
the kernels take in `spec.py`.
"""

from .encode import encode_keys, encode_unit
from .flash import AttnConfig, attention
from .launch import EncodeConfig
from .spec import KernelCodec, PackedKeys, PackedValues
from .value_encode import encode_values

__all__ = ["AttnConfig", "EncodeConfig", "KernelCodec", "PackedKeys", "PackedValues", "attention",
           "encode_keys", "encode_unit", "encode_values"]
