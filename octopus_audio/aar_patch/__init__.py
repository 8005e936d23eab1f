"""An AAR-compatible model (tokenizer + transformer) and the patch that puts a compressed KV cache under it.

Importing this package changes nothing; the patch is applied only by calling it.
"""

from .aar import AAR, AARConfig
from .generation import AARPipeline, Generation, GraphedGenerator, generate
from .loading import load_aar, load_aar_transformer, load_sat
from .patch import CacheStats, PatchHandle, compressed_kv, patch_aar, unpatch

__all__ = [
    "AAR",
    "AARConfig",
    "AARPipeline",
    "Generation",
    "GraphedGenerator",
    "generate",
    "load_aar",
    "load_aar_transformer",
    "load_sat",
    "CacheStats",
    "PatchHandle",
    "compressed_kv",
    "patch_aar",
    "unpatch",
]
