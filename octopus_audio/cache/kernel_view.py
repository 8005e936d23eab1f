"""The kernels' view of a codec: whether the fused kernels can run it (`kernel_limit`) and its tables and
rotations as octopus_audio.kernels.KernelCodec (`kernel_codec`). The kernels are imported inside the
functions, so importing the cache never imports Triton."""

from __future__ import annotations

import torch

from octopus_audio import rotation


def kernel_limit(codec, for_encode: bool = True) -> str | None:
    """Why the fused kernels cannot run this codec (None when they can): its decode kind (registered, with a
    key encode for `for_encode`), head dim and code width, and the codec's own `kernel_limit`."""
    from octopus_audio.kernels import kind_named
    from octopus_audio.kernels.spec import MAX_CODE_BITS, MAX_HEAD_DIM, MIN_HEAD_DIM

    if codec.kernel_decode is None:
        return f"codec {codec.name} has no kernel decode kind"
    try:
        kind = kind_named(codec.kernel_decode)
    except ValueError as e:
        return f"codec {codec.name}: {e}"
    if for_encode and kind.encode is None:
        return f"the {kind.name} kind has no kernel key encode"
    if not MIN_HEAD_DIM <= codec.head_dim <= MAX_HEAD_DIM:
        return f"head dim {codec.head_dim} is outside the kernels' {MIN_HEAD_DIM}..{MAX_HEAD_DIM}"
    if codec.layout.code_bits > MAX_CODE_BITS:
        return f"{codec.layout.code_bits}-bit codes are wider than the kernels' {MAX_CODE_BITS}"
    return codec.kernel_limit(for_encode)


def kernel_codec(codec, num_heads: int, device):
    """`codec` (a RotationCodec with a `kernel_decode` kind) as octopus_audio.kernels.KernelCodec on
    `device`, built from its declaration (layout, rotations, tables), cached on the codec."""
    from octopus_audio.codecs.qjl import QJL_STREAM
    from octopus_audio.kernels import KernelCodec

    device = torch.device(device)

    def make():
        layout = codec.layout
        qjl_signs = codec.signs(num_heads, device, stream=QJL_STREAM) if codec.qjl else None
        kc = KernelCodec(codec.kernel_decode, codec.head_dim, layout.code_bits, layout.num_codes,
                         codec.signs(num_heads, device), rotation.hadamard(codec.head_dim, device), qjl_signs,
                         codec.kernel_tables(device), codec.kernel_params(), codec.name)
        return kc.to(device)

    return codec._cached(("kernel_codec", num_heads, str(device)), make)
