"""Triton kernels shared by every codec: encode, and fused attention over the compressed K/V cache.

Organised by what varies (DESIGN.md section 4):
- decode kinds (`kinds/`): one module each, `scalar` (turboquant-*), `polar` (polarquant), `triplet`
  (octopus*; its joint rounding `triplet_rounding.py`, its search tables `triplet_search.py`), holding the
  kind's record, its @triton.jit encode / decode / score-table helpers and its launch table; `kinds/kind.py`
  says what a kind declares and holds the registry (`register_kind`). The QJL side-car, common to the kinds:
  `qjl.py`.
- implementations (`impls/`): split-K flash decoding (`flash.py`), one-row score tables (`score_tables.py`),
  the Triton key encode and fused unit encode (`encode.py`), the sm_90 Gluon kernels (`gluon/`: attention,
  polarquant key encode; `gluon/scope.py` says which calls they take), each taking a kind as a compile-time
  parameter and declaring which calls it supports and, when not, why.
- the selector (`select.py`): the public `attention` and `encode_keys`, which pick the implementation.
- shared building blocks: bit helpers (`bits.py`), launch helpers and configurations (`launch.py`), what the
  kernels take (`spec.py`), matmul operands (`operands.py`), encode arithmetic (`encode_math.py`), score-table
  steps (`tables.py`), values (`value_decode.py`, `value_encode.py`).
"""

from .impls.encode import encode_unit
from .kinds import DecodeKind, KindEncode, KindTables, kind_named, kinds, register_kind, unregister_kind
from .launch import AttnConfig, EncodeConfig
from .select import attention, encode_keys
from .spec import KernelCodec, PackedKeys, PackedValues, WideSegment
from .value_encode import encode_values

__all__ = ["AttnConfig", "DecodeKind", "EncodeConfig", "KernelCodec", "KindEncode", "KindTables",
           "PackedKeys", "PackedValues", "WideSegment", "attention", "encode_keys", "encode_unit",
           "encode_values", "kind_named", "kinds", "register_kind", "unregister_kind"]
