"""The `octopus_audio` attention implementation of transformers: decode steps read an OctopusCache's
compressed store, every other call runs transformers' SDPA attention unchanged.

Registered under `ATTENTION` in transformers' `AttentionInterface` (the attention function) and
`AttentionMaskInterface` (the mask: SDPA's, a boolean [B, 1, Tq, Tk] or None) when this module is imported,
which `octopus_audio.hf` does. An attention layer calls `cache.update(k, v, layer)` and then the attention
function with what `update` returned; an `OctopusLayer` marks the keys it returns (`marked`), so the
function knows which calls are its own. Unmarked keys (another cache, no cache, the decoded history of a
multi-token step) go to `sdpa_attention_forward` with the model's mask.
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

ATTENTION = "octopus_audio"
_MARK = "_octopus_layer"  # attribute of a key tensor an OctopusLayer returned: that layer


def marked(key: torch.Tensor, layer: object) -> torch.Tensor:
    """An alias of `key` (same storage, a new tensor object) that names `layer` to the attention function."""
    alias = key.view(key.shape)
    setattr(alias, _MARK, layer)
    return alias


def octopus_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query [B, Hq, Tq, d], key and value [B, H, Tk, d];
    returns ([B, Tq, Hq, d], None). Keys from an OctopusLayer are served by that layer
    (`OctopusLayer.attend`), the rest by SDPA."""
    layer = getattr(key, _MARK, None)
    if layer is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    return layer.attend(module, query, key, value, attention_mask, dropout, scaling, **kwargs)


AttentionInterface.register(ATTENTION, octopus_attention)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def left_padding(mask: torch.Tensor | None, kv_length: int) -> list[int] | None:
    """Per batch row, the padding positions at the left of a prompt, read from the model's SDPA mask of that
    prompt (boolean [B, 1, Tq, Tk], True where a query sees a key; None: no padding); None when no row is
    padded. The last query of a left-padded prompt is a real token, so its row of the mask is False on the
    padding and True on every other key. One host sync. Raises ValueError for a mask that is not that: padding
    anywhere but at the left, or a row that is all padding."""
    if mask is None:
        return None
    if mask.dtype != torch.bool or mask.ndim != 4 or mask.shape[-1] != kv_length:
        raise ValueError(f"OctopusCache reads the padding from a boolean attention mask [B, 1, Tq, "
                         f"{kv_length}] (transformers' SDPA mask); got {mask.dtype} {tuple(mask.shape)}")
    last_BK = mask[:, 0, -1, :]
    pads_B = kv_length - last_BK.sum(-1)
    left_BK = torch.arange(kv_length, device=mask.device)[None, :] >= pads_B[:, None]
    rows = torch.stack([pads_B, (left_BK == last_BK).all(-1).long()], 1).tolist()
    for b, (pad, on_left) in enumerate(rows):
        if not on_left:
            raise ValueError(f"OctopusCache takes padding at the left of a prompt only (tokenizer "
                             f"padding_side='left', as generation with decoder-only models expects); the "
                             f"attention mask of batch row {b} hides keys after its first visible one")
        if pad == kv_length:
            raise ValueError(f"batch row {b} of the prompt is all padding: give every row at least one token")
    pads = [pad for pad, _ in rows]
    return pads if any(pads) else None
