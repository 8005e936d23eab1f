"""The decode kinds: one module each (`scalar`, `polar`, `triplet`), registered in `kind.py`'s registry.

`octopus_audio.kernels.register_kind` adds a kind from anywhere (kind.py says what a kind declares);
importing this package registers the built-in ones, in this order (their `id`s).
"""

import importlib

from .kind import (
    ATTENTION_PARAMS,
    ENCODE_PARAMS,
    AttentionConstants,
    DecodeKind,
    EncodeConstants,
    KindEncode,
    KindTables,
    kind_named,
    kinds,
    register_kind,
    unregister_kind,
)

_BUILT_IN = ("octopus_audio.kernels.kinds.scalar", "octopus_audio.kernels.kinds.polar",
             "octopus_audio.kernels.kinds.triplet")
for _module in _BUILT_IN:  # each registers its kind on import, in this order
    importlib.import_module(_module)

__all__ = ["ATTENTION_PARAMS", "ENCODE_PARAMS", "AttentionConstants", "DecodeKind", "EncodeConstants",
           "KindEncode", "KindTables", "kind_named", "kinds", "register_kind", "unregister_kind"]
