"""The codec registry: each codec's class declares itself (name, bits, layout, kernel tables) and registers.

Every list of codec names (the CLI's choices, the eval defaults, the probe, the bench rows) reads it, and
behaviour elsewhere follows a codec's declared properties, never its name. A codec registers with
`register(cls)` (the built-in ones when `octopus_audio.codecs` is imported; a user's from their own code):

    @register
    @dataclasses.dataclass(frozen=True, repr=False)
    class MyCodec(RotationCodec):
        name = "my-codec"
        ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

_REGISTRY: dict[str, type] = {}


def register(cls: type) -> type:
    """Add a codec class to the registry (usable as a class decorator); returns the class.

    The class must be a `KeyCodec` dataclass with a non-empty `name` that no registered codec uses.
    ValueError otherwise."""
    from octopus_audio.codecs.base import KeyCodec

    if not (isinstance(cls, type) and issubclass(cls, KeyCodec) and dataclasses.is_dataclass(cls)):
        raise ValueError(f"register takes a KeyCodec dataclass, got {cls!r}")
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name:
        raise ValueError(f"codec class {cls.__name__} needs a non-empty `name`")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"codec name {name!r} is taken by {_REGISTRY[name].__name__}")
    _REGISTRY[name] = cls
    return cls


def unregister(name: str) -> None:
    """Remove a codec from the registry (KeyError when it is not registered)."""
    del _REGISTRY[name]


class CodecNames(Sequence):
    """The registered codec names in registration order (a live view: a codec registered later appears)."""

    def __getitem__(self, i):
        return tuple(_REGISTRY)[i]

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __contains__(self, name) -> bool:
        return name in _REGISTRY

    def __repr__(self) -> str:
        return repr(tuple(_REGISTRY))


CODECS = CodecNames()


def codec_class(name: str) -> type:
    """The registered class of codec `name`; ValueError naming the allowed codecs otherwise."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown codec {name!r}; allowed: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def compressed_codecs() -> tuple[str, ...]:
    """The names of the codecs that compress (every codec but the native one)."""
    return tuple(n for n, cls in _REGISTRY.items() if cls.compressed)


def kernel_codecs() -> tuple[str, ...]:
    """The names of the codecs whose keys the fused attention decodes (they declare `kernel_decode`)."""
    return tuple(n for n, cls in _REGISTRY.items() if cls.kernel_decode is not None)


class SupportedBits(Mapping):
    """Codec name -> the nominal bit widths it takes with its default options (its class's `supported_bits`;
    empty: bits are ignored), a live view of the registry."""

    def __getitem__(self, name):
        return codec_class(name).supported_bits

    def __iter__(self):
        return iter(tuple(_REGISTRY))

    def __len__(self) -> int:
        return len(_REGISTRY)


SUPPORTED_BITS = SupportedBits()


def bits_help() -> str:
    """The bit widths each codec takes, grouped, for `--help`: `octopus, octopus-qjl 1..7; ...`."""
    from octopus_audio.codecs.base import describe_bits

    groups: dict[str, list[str]] = {}
    for name, allowed in SUPPORTED_BITS.items():
        if allowed:
            groups.setdefault(describe_bits(allowed), []).append(name)
    return "; ".join(f"{', '.join(names)} {text}" for text, names in groups.items())


def bits_problem(name: str, bits: int) -> str | None:
    """The sentence for a command line whose `--bits` codec `name` does not take (with its default options),
    or None when it takes it. The accepted widths come from the codec's own `supported_bits`."""
    from octopus_audio.codecs.base import describe_bits

    allowed = SUPPORTED_BITS[name]
    if not allowed or (isinstance(bits, int) and not isinstance(bits, bool) and bits in allowed):
        return None
    return f"{name} does not take --bits {bits} (it takes {describe_bits(allowed)})"


def get_codec(name: str, bits: int, head_dim: int, seed: int = 0, **options):
    """The key codec `name` with `bits` per coordinate (nominal) for keys of dimension `head_dim`.

    Options are the codec's own dataclass fields beyond bits, head_dim and seed (octopus: `dir_bits`,
    `rho_bits`, `rounding`). Supported bits: SUPPORTED_BITS[name]; head_dim: a power of two in 8..1024.
    Errors name what is allowed."""
    cls = codec_class(name)
    allowed = {f.name for f in dataclasses.fields(cls)} - {"bits", "head_dim", "seed"}
    unknown = set(options) - allowed
    if unknown:
        raise ValueError(
            f"codec {name!r} has no option(s) {', '.join(sorted(unknown))}; "
            f"allowed: {', '.join(sorted(allowed)) or 'no options'}"
        )
    return cls(bits=bits, head_dim=head_dim, seed=seed, **options)
