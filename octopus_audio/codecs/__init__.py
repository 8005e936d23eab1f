"""The key codecs behind `get_codec`: none, turboquant-mse/-qjl, polarquant, octopus, octopus-qjl."""

from __future__ import annotations

import dataclasses

from octopus_audio.codecs.base import KeyCodec, KeyState, RotationCodec
from octopus_audio.codecs.none import NoneCodec
from octopus_audio.codecs.octopus import Octopus, OctopusQJL
from octopus_audio.codecs.polarquant import PolarQuant
from octopus_audio.codecs.turboquant import TurboQuantMSE, TurboQuantQJL

CODECS = ("none", "turboquant-mse", "turboquant-qjl", "polarquant", "octopus", "octopus-qjl")
# Nominal bits each codec accepts (`none` ignores bits). octopus: the default split (b+1, b-1) needs b <= 7
# because direction codebooks go up to 8 bits; with explicit dir_bits/rho_bits, b = 8 is accepted too.
SUPPORTED_BITS = {
    "none": "any (ignored)",
    "turboquant-mse": "1..8",
    "turboquant-qjl": "1..8 (b-1 bits for the MSE stage; 0 at b=1)",
    "polarquant": "1..8",
    "octopus": "1..7 (dir_bits 1..8, rho_bits 0..8)",
    "octopus-qjl": "1..7 (dir_bits 1..8, rho_bits 0..8)",
}

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
    Supported bits: SUPPORTED_BITS; head_dim: a power of two in 8..1024. Errors name what is allowed.
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


__all__ = ["CODECS", "SUPPORTED_BITS", "KeyCodec", "KeyState", "RotationCodec", "get_codec", "NoneCodec",
           "TurboQuantMSE", "TurboQuantQJL", "PolarQuant", "Octopus", "OctopusQJL"]
