"""The key codecs behind `get_codec`: none, turboquant-mse/-qjl, polarquant, octopus, octopus-qjl."""

from __future__ import annotations

import dataclasses

from octopus_audio.codecs.base import KeyCodec, KeyState, RotationCodec
from octopus_audio.codecs.none import NoneCodec
from octopus_audio.codecs.octopus import Octopus, OctopusQJL
from octopus_audio.codecs.polarquant import PolarQuant
from octopus_audio.codecs.turboquant import TurboQuantMSE, TurboQuantQJL

CODECS = ("none", "turboquant-mse", "turboquant-qjl", "polarquant", "octopus", "octopus-qjl")

_REGISTRY: dict[str, type[KeyCodec]] = {
    "none": NoneCodec,
    "turboquant-mse": TurboQuantMSE,
    "turboquant-qjl": TurboQuantQJL,
    "polarquant": PolarQuant,
    "octopus": Octopus,
    "octopus-qjl": OctopusQJL,
}


def get_codec(name: str, bits: int, head_dim: int, seed: int = 0, **options) -> KeyCodec:
    """The key codec `name` with `bits` per coordinate (nominal) for keys of dimension `head_dim`.

    Options: octopus and octopus-qjl take `dir_bits` (default bits+1), `rho_bits` (default bits-1) and
    `rounding` in {"scalar", "local3x3", "full"} (default "local3x3"); other codecs take none.
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown codec {name!r}; allowed: {', '.join(CODECS)}")
    cls = _REGISTRY[name]
    allowed = {f.name for f in dataclasses.fields(cls)} - {"bits", "head_dim", "seed"}
    unknown = set(options) - allowed
    if unknown:
        raise ValueError(
            f"codec {name!r} has no option(s) {', '.join(sorted(unknown))}; "
            f"allowed: {', '.join(sorted(allowed)) or 'none'}"
        )
    return cls(bits=bits, head_dim=head_dim, seed=seed, **options)


__all__ = ["CODECS", "KeyCodec", "KeyState", "RotationCodec", "get_codec", "NoneCodec", "TurboQuantMSE",
           "TurboQuantQJL", "PolarQuant", "Octopus", "OctopusQJL"]
