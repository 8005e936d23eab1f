"""The key codecs behind `get_codec`: none, turboquant-mse/-qjl, polarquant, octopus, octopus-qjl."""

from __future__ import annotations

import dataclasses

from octopus_audio.codecs.base import KeyCodec, KeyState, RotationCodec, describe_bits
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
# Nominal bits each codec takes with its default options, as its class declares them (`none`: empty, bits
# ignored). octopus and octopus-qjl: 1..7, because the default split's dir_bits = b+1 must be <= 8.
SUPPORTED_BITS: dict[str, tuple[int, ...]] = {name: cls.supported_bits for name, cls in _REGISTRY.items()}


def bits_help() -> str:
    """The bit widths each codec takes, grouped, for `--help`: `octopus, octopus-qjl 1..7; ...`."""
    groups: dict[str, list[str]] = {}
    for name, allowed in SUPPORTED_BITS.items():
        if allowed:
            groups.setdefault(describe_bits(allowed), []).append(name)
    return "; ".join(f"{', '.join(names)} {text}" for text, names in groups.items())


def bits_problem(name: str, bits: int) -> str | None:
    """The sentence for a command line whose `--bits` codec `name` does not take (with its default options),
    or None when it takes it. The accepted widths come from the codec's own `supported_bits`."""
    allowed = SUPPORTED_BITS[name]
    if not allowed or (isinstance(bits, int) and not isinstance(bits, bool) and bits in allowed):
        return None
    return f"{name} does not take --bits {bits} (it takes {describe_bits(allowed)})"


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


__all__ = ["CODECS", "SUPPORTED_BITS", "bits_help", "bits_problem", "describe_bits", "KeyCodec", "KeyState",
           "RotationCodec", "get_codec", "NoneCodec", "TurboQuantMSE", "TurboQuantQJL", "PolarQuant",
           "Octopus", "OctopusQJL"]
