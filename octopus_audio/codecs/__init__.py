"""The key codecs behind `get_codec`, registered in the order of DESIGN section 2 (`CODECS`).

Each codec's module declares it and registers it (`registry.register`); everything here derives from that.
"""

from __future__ import annotations

import importlib

from octopus_audio.codecs.base import KeyCodec, KeyLayout, KeyState, RotationCodec, describe_bits
from octopus_audio.codecs.registry import (
    CODECS,
    SUPPORTED_BITS,
    bits_help,
    bits_problem,
    codec_class,
    compressed_codecs,
    get_codec,
    kernel_codecs,
    register,
    unregister,
)

_BUILT_IN = ("octopus_audio.codecs.none", "octopus_audio.codecs.turboquant",
             "octopus_audio.codecs.polarquant", "octopus_audio.codecs.octopus")
for _module in _BUILT_IN:  # each registers its codecs on import: this order is the order of `CODECS`
    importlib.import_module(_module)

from octopus_audio.codecs.none import NoneCodec  # noqa: E402
from octopus_audio.codecs.octopus import Octopus, OctopusQJL  # noqa: E402
from octopus_audio.codecs.polarquant import PolarQuant  # noqa: E402
from octopus_audio.codecs.turboquant import TurboQuantMSE, TurboQuantQJL  # noqa: E402

DEFAULT_CODEC = Octopus.name  # what `patch_aar` and `compressed_kv` apply unless told otherwise
UNCOMPRESSED = NoneCodec.name  # the native cache: the reference every codec is measured against

__all__ = ["CODECS", "DEFAULT_CODEC", "SUPPORTED_BITS", "UNCOMPRESSED", "KeyCodec", "KeyLayout", "KeyState",
           "RotationCodec", "bits_help", "bits_problem", "codec_class", "compressed_codecs", "describe_bits",
           "get_codec", "kernel_codecs", "register", "unregister", "NoneCodec", "TurboQuantMSE",
           "TurboQuantQJL", "PolarQuant", "Octopus", "OctopusQJL"]
