"""The compressed KV cache for transformers language models (optional extra `hf`: transformers >= 5).

`OctopusCache(model.config, codec="octopus", bits=2)` is a transformers Cache: pass it to `model.generate`
(`cache=`) or to a forward. Importing this package registers the `octopus_audio` attention implementation
(`attention.py`) that its decode steps run through.
"""

from octopus_audio.hf.attention import ATTENTION
from octopus_audio.hf.cache import CacheSettings, OctopusCache

__all__ = ["ATTENTION", "CacheSettings", "OctopusCache"]
