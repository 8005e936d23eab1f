"""One decoder layer of an OctopusCache: transformers' per-layer cache contract over CompressedKVCache.

A layer's tokens go into a CompressedKVCache (one token is one unit, a prompt the units below), which keeps
the newest `window` tokens native and encodes each older token once. transformers' attention layer calls
`update(k, v)`, then the attention function with what `update` returned (`octopus_audio.hf.attention`):

- a prompt (the first tokens of the layer): `update` appends them and returns them as they are; the
  attention runs transformers' SDPA over these native keys with the model's mask, and reads the prompt's left
  padding from that mask (`attention.left_padding`).
- a decode step (one token): `update` appends it and returns marked keys; the attention is
  `CompressedKVCache.attend`, one softmax over the compressed store and the native window (the fused kernels
  on CUDA, the PyTorch reference on the CPU), never over a decoded copy.
- several tokens after the prompt (chunked prefill, a speculative verification step): the held tokens are
  decoded and attended with the new ones by SDPA under the model's mask (the one path that decodes the store).

Left padding: `CompressedKVCache.attend` has no key mask, so padding never enters a store. The rows of a batch
are grouped by their padding (one group, every row, when nothing is padded), each group holds its own cache
of its rows' tokens after the padding, and a decode step appends and attends group by group (one attention
call a group). A padded prompt is encoded twice (once at `update`, again per group once the mask shows the
padding).
"""

from __future__ import annotations

import dataclasses
import logging

import torch
from transformers.cache_utils import CacheLayerMixin
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from octopus_audio.cache import CompressedKVCache
from octopus_audio.hf.attention import ATTENTION, left_padding, marked

log = logging.getLogger(__name__)
_announced: set[str] = set()


def _announce(what: str, message: str, *args) -> None:
    """Log which attention path runs, once per path."""
    if what not in _announced:
        _announced.add(what)
        log.info(message, *args)


def append_tokens(cache: CompressedKVCache, k: torch.Tensor, v: torch.Tensor) -> None:
    """Append tokens k, v [B, H, T, d] so that the window holds the newest `cache.window` tokens: the older
    ones as one unit (encoded when the first of the newest arrives), each of the newest as a unit of its
    own."""
    n = k.shape[2]
    if n == 1:  # a decode step
        cache.append(k, v)
        return
    head = n - min(cache.window, n) if cache.window else n
    if head:
        cache.append(k[:, :, :head], v[:, :, :head])
    for t in range(head, n):
        cache.append(k[:, :, t:t + 1], v[:, :, t:t + 1])


@dataclasses.dataclass
class _Group:
    """Batch rows that share their left padding: `rows` (their indices, None for every row of the batch), the
    padding positions `pad` (not stored) and the cache of their tokens."""

    rows: list[int] | None
    pad: int
    cache: CompressedKVCache
    index: torch.Tensor | None = None  # `rows` on the device


class OctopusLayer(CacheLayerMixin):
    """The cache of one attention layer for transformers (`update`, `get_seq_length`, `get_mask_sizes`,
    `crop`, `reorder_cache`, `reset`), built by OctopusCache; `make_cache()` returns a new, empty
    CompressedKVCache of its settings. `attend` is what the `octopus_audio` attention function calls for this
    layer's keys."""

    is_compileable = False
    is_croppable = True
    is_sliding = False
    supports_early_init = False

    def __init__(self, make_cache, attention_config) -> None:
        super().__init__()
        self.make_cache = make_cache
        self.attention_config = attention_config  # the (text) config whose attention implementation runs
        self.first = make_cache()  # the first group's cache, kept across sequences with its codec tables
        self.groups: list[_Group] = []
        self.length = 0  # positions a row holds, padding included (transformers' sequence length)
        self._rows = 0  # batch rows of the current sequence
        self._prompt: tuple[torch.Tensor, torch.Tensor] | None = None  # until the attention reads its mask

    def __repr__(self) -> str:
        return f"OctopusLayer(length={self.length}, groups={len(self.groups)}, cache={self.first!r})"

    # ---- transformers' contract ----
    @property
    def batch_size(self) -> int:
        """Batch rows held (-1 before the first tokens, as transformers' Cache.batch_size expects)."""
        return self._rows if self.is_initialized else -1

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        self._rows = key_states.shape[0]
        self.first.reset()
        self.groups = [_Group(None, 0, self.first)]
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args,
               **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Take the new tokens' k, v [B, H, T, d]; return what the attention function needs (the module
        docstring says what, per kind of step)."""
        implementation = self.attention_config._attn_implementation
        if implementation != ATTENTION:
            raise ValueError(f"OctopusCache attends through the {ATTENTION!r} attention implementation, but "
                             f"the model runs {implementation!r}: call "
                             f"model.set_attn_implementation({ATTENTION!r}) or build a new OctopusCache")
        self._prompt = None
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[2]
        if key_states.shape[0] != self._rows:
            raise ValueError(f"this OctopusCache holds a batch of {self._rows} rows, got "
                             f"{key_states.shape[0]}: reset() it (or build a new one) for another batch")
        if self.length == 0:
            self._append(key_states, value_states)
            self.length = n
            self._prompt = (key_states, value_states)
            return marked(key_states, self), value_states
        if n == 1:
            self._append(key_states, value_states)
            self.length += 1
            return marked(key_states, self), value_states
        _announce("chunk", "OctopusCache: a step of several tokens after the prompt attends with SDPA over "
                  "the decoded store (steps of one token read the compressed store)")
        k_held, v_held = self._decoded(key_states.dtype)
        self._append(key_states, value_states)
        self.length += n
        return torch.cat([k_held, key_states], 2), torch.cat([v_held, value_states], 2)

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.first.reset()
        self.groups = []
        self.length = 0
        self._prompt = None
        self.is_initialized = False

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the newest `-tokens_to_remove` positions of every row (transformers' convention: a negative
        count). The kept tokens stay as held (`CompressedKVCache.crop`)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes minus the number of tokens to remove (transformers' convention), "
                             f"got {tokens_to_remove}")
        n = -tokens_to_remove
        if n == 0 or not self.is_initialized:
            return
        if n >= self.length:
            self.reset()
            return
        if any(n >= self.length - g.pad for g in self.groups):
            shortest = min(self.length - g.pad for g in self.groups)
            raise ValueError(f"crop of {n} tokens would remove every token of a left-padded row (the "
                             f"shortest holds {shortest})")
        for g in self.groups:
            g.cache.crop(g.cache.num_tokens - n)
        self.length -= n

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Row i takes the tokens of row beam_idx[i] (beam search). With left padding, a row moves only among
        the rows of its own padding (beam search moves rows within one prompt's beams)."""
        if not self.is_initialized or self.length == 0:
            return
        if len(self.groups) == 1 and self.groups[0].rows is None:
            self.first.select_rows(beam_idx)
            self._rows = beam_idx.shape[0]
            return
        order = beam_idx.tolist()
        group_of = {row: g for g in self.groups for row in g.rows}
        moved = any(group_of[old] is not group_of[new] for new, old in enumerate(order))
        if len(order) != self._rows or moved:
            raise ValueError("reorder_cache of a left-padded batch moves rows only among rows of the same "
                             "padding (as beam search does within one prompt's beams), keeping the batch "
                             "size")
        for g in self.groups:
            where = {row: i for i, row in enumerate(g.rows)}
            g.cache.select_rows(torch.tensor([where[order[row]] for row in g.rows], device=self.device))

    def offload(self):
        raise NotImplementedError("OctopusCache does not offload layers to the CPU: its store is already "
                                  "compressed on the device")

    def prefetch(self):
        raise NotImplementedError("OctopusCache does not offload layers, so there is nothing to prefetch")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("OctopusCache cannot repeat a filled batch: expand the inputs before the "
                                  "prompt (generate does for num_return_sequences and beams)")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("OctopusCache cannot select rows of a filled batch except by reorder_cache "
                                  "(beam search)")

    # ---- the attention function's side ----
    def attend(self, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, dropout: float, scaling: float,
               **kwargs) -> tuple[torch.Tensor, None]:
        """Attention of this layer's queries [B, Hq, Tq, d] -> ([B, Tq, Hq, d], None): a prompt by SDPA over
        its native keys (and its padding read from the mask), a decode step from the compressed store."""
        if dropout:
            raise ValueError("OctopusCache is an inference cache: attention dropout must be 0 (call "
                             "model.eval())")
        if kwargs.get("output_attentions"):
            raise ValueError("OctopusCache does not return attention weights (output_attentions): decode "
                             "steps never form them")
        if self._prompt is not None:
            k, v = self._prompt
            self._prompt = None
            pads = left_padding(attention_mask, self.length)
            if pads is not None:
                self._regroup(pads, k, v)
            _announce("prompt", "OctopusCache: a prompt attends with SDPA over its native keys, then waits "
                      "encoded in the store")
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
        if query.shape[2] != 1:
            raise RuntimeError(f"an OctopusLayer decode step has one query a row, got {query.shape[2]}")
        if attention_mask is not None and attention_mask.shape[-1] != self.length:
            raise ValueError(f"the attention mask covers {attention_mask.shape[-1]} keys, the cache holds "
                             f"{self.length} positions a row")
        if attention_mask is not None and all(g.pad == 0 for g in self.groups):
            raise ValueError("this decode step's attention mask hides keys, but the prompt had no padding: "
                             "OctopusCache takes padding only at the left of the prompt")
        backend = self.first.backend
        _announce(f"decode-{backend}", "OctopusCache: decode steps attend from the compressed store "
                  "(CompressedKVCache.attend, backend %s)", backend)
        return self._attend(query, scaling).transpose(1, 2).contiguous(), None

    # ---- groups of rows ----
    def _append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        for g in self.groups:
            if g.index is None:
                append_tokens(g.cache, k, v)
            else:
                append_tokens(g.cache, k.index_select(0, g.index), v.index_select(0, g.index))

    def _attend(self, query: torch.Tensor, scale: float) -> torch.Tensor:
        if len(self.groups) == 1 and self.groups[0].index is None:
            return self.first.attend(query, scale)
        out = torch.empty_like(query)
        for g in self.groups:
            out.index_copy_(0, g.index, g.cache.attend(query.index_select(0, g.index), scale))
        return out

    def _regroup(self, pads: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
        """One group (and cache) per distinct padding, holding its rows' prompt tokens after the padding."""
        by_pad: dict[int, list[int]] = {}
        for row, pad in enumerate(pads):
            by_pad.setdefault(pad, []).append(row)
        self.first.reset()
        self.groups = []
        for pad, rows in by_pad.items():
            cache = self.first if not self.groups else self.make_cache()
            if len(rows) == self._rows:
                group = _Group(None, pad, cache)
                k_g, v_g = k, v
            else:
                index = torch.tensor(rows, device=k.device)
                group = _Group(rows, pad, cache, index)
                k_g, v_g = k.index_select(0, index), v.index_select(0, index)
            append_tokens(cache, k_g[:, :, pad:], v_g[:, :, pad:])
            self.groups.append(group)

    def _decoded(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Every held position's K, V [B, H, length, d] in `dtype` (zeros on the padding, which the mask
        hides)."""
        if len(self.groups) == 1 and self.groups[0].pad == 0:
            return self.first.decoded_kv(dtype)
        k_all = v_all = None
        for g in self.groups:
            k_g, v_g = g.cache.decoded_kv(dtype)
            if k_all is None:
                shape = (self._rows, k_g.shape[1], self.length, k_g.shape[3])
                k_all = torch.zeros(shape, dtype=dtype, device=k_g.device)
                v_all = torch.zeros(shape, dtype=dtype, device=k_g.device)
            rows = slice(None) if g.index is None else g.index
            k_all[rows, :, g.pad:] = k_g
            v_all[rows, :, g.pad:] = v_g
        return k_all, v_all
