"""The compressed KV cache of one attention layer (`CompressedKVCache`) and its parts, one job a module:
layer (the cache), store (the compressed buffers), native (the native prefix and window), checks (what a
unit or a query must be), accounting (bytes), readback (the held tokens as K and V), backend (kernels or
reference, OCTOPUS_AUDIO_KERNELS), kernel_view (the kernels' view of a codec), plan (the ops a sequence runs),
layout (where a sequence's tokens land), block_causal (teacher forcing's whole-sequence pass)."""

from octopus_audio.cache.accounting import bytes_breakdown, fp16_bytes
from octopus_audio.cache.backend import attention_backend, reference_backend
from octopus_audio.cache.block_causal import attend_sequence, encode_sequence, stored_parts
from octopus_audio.cache.checks import DeferredFlags, check_caches, check_flags
from octopus_audio.cache.kernel_view import kernel_codec, kernel_limit
from octopus_audio.cache.layer import CompressedKVCache
from octopus_audio.cache.layout import sequence_capacities, stored_span
from octopus_audio.cache.plan import CachePlan

__all__ = ["CachePlan", "CompressedKVCache", "DeferredFlags", "attend_sequence", "attention_backend",
           "bytes_breakdown", "check_caches", "check_flags", "encode_sequence", "fp16_bytes", "kernel_codec",
           "kernel_limit", "reference_backend", "sequence_capacities", "stored_parts", "stored_span"]
