"""The attention modules the patch finds in a model (by the released code's attribute names), the model's
scales and the tokens of its first scales (the sink scales): what the patch and compile ahead
(aar_patch/compile_ahead.py) both read of a model."""

from __future__ import annotations

from torch import nn

# attributes an attention module must have to be patched (the released code's names)
ATTENTION_ATTRIBUTES = ("mat_qkv", "q_bias", "v_bias", "zero_k_bias", "proj", "num_heads", "head_dim",
                        "caching", "cached_k", "cached_v", "kv_caching")


def _is_attention(m: object) -> bool:
    return (isinstance(m, nn.Module) and all(hasattr(m, a) for a in ATTENTION_ATTRIBUTES)
            and callable(m.kv_caching))


def find_attention(model: object) -> list[nn.Module]:
    """The attention modules of `model` (an nn.Module, or an object holding nn.Modules), in module order."""
    if isinstance(model, nn.Module):
        roots = [model]
    else:
        attrs = vars(model).values() if hasattr(model, "__dict__") else ()
        roots = [v for v in attrs if isinstance(v, nn.Module)]
    found: list[nn.Module] = []
    seen: set[int] = set()
    for root in roots:
        for m in root.modules():
            if id(m) not in seen and _is_attention(m):
                seen.add(id(m))
                found.append(m)
    return found


def model_patch_nums(model: object) -> tuple[int, ...] | None:
    """The model's scales, tokens per scale (`patch_nums` on the model, its `.aar`, or their `.config`); None
    when it does not say."""
    for owner in (model, getattr(model, "aar", None)):
        for holder in (owner, getattr(owner, "config", None)):
            patch_nums = getattr(holder, "patch_nums", None)
            if patch_nums is not None:
                return tuple(int(pn) for pn in patch_nums)
    return None


def sink_tokens(model: object, sink_scales: int) -> int:
    """The tokens of the model's first `sink_scales` scales (`model_patch_nums`): the native prefix that
    keeps them. A ValueError when there are not that many scales, or when the model does not say its scales
    and `sink_scales` is not 0."""
    patch_nums = model_patch_nums(model)
    if patch_nums is None:
        if sink_scales:
            raise ValueError(f"sink_scales={sink_scales} keeps the first scales native, but "
                             f"{type(model).__name__} does not say its scales (patch_nums); pass "
                             f"sink_scales=0")
        return 0
    if sink_scales > len(patch_nums):
        raise ValueError(f"sink_scales must be 0 .. {len(patch_nums)} (the model's scales), got "
                         f"{sink_scales}")
    return sum(patch_nums[:sink_scales])


def wide_tokens(model: object, sink_scales: int, wide_scales: int) -> int:
    """The tokens of the `wide_scales` scales after the first `sink_scales` (`model_patch_nums`): the wide
    prefix that stores them at other widths. A ValueError when the model has fewer scales or does not say
    them (and `wide_scales` is not 0)."""
    patch_nums = model_patch_nums(model)
    if not wide_scales:
        return 0
    if patch_nums is None:
        raise ValueError(f"wide_scales={wide_scales} stores scales at other widths, but "
                         f"{type(model).__name__} does not say its scales (patch_nums); pass wide_scales=0")
    if sink_scales + wide_scales > len(patch_nums):
        raise ValueError(f"sink_scales + wide_scales must be at most the model's {len(patch_nums)} scales, "
                         f"got {sink_scales} + {wide_scales}")
    return sum(patch_nums[sink_scales:sink_scales + wide_scales])
