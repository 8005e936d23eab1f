"""octopus-audio: OCTOPUS and peer rotation codecs for the KV cache of next-scale autoregressive audio models.

Public names (imported lazily, so `import octopus_audio` and the CLI stay light):
`get_codec`, `CODECS`, `CompressedKVCache`, `ValueQuantizer`, `attention_backend`.
"""

__version__ = "0.1.0"

_LAZY = {
    "get_codec": ("octopus_audio.codecs", "get_codec"),
    "CODECS": ("octopus_audio.codecs", "CODECS"),
    "KeyState": ("octopus_audio.codecs", "KeyState"),
    "CompressedKVCache": ("octopus_audio.cache", "CompressedKVCache"),
    "ValueQuantizer": ("octopus_audio.values", "ValueQuantizer"),
    "ValueState": ("octopus_audio.values", "ValueState"),
    "attention_backend": ("octopus_audio.cache.backend", "attention_backend"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'octopus_audio' has no attribute {name!r}")
