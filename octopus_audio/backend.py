"""The one dispatch point between the codec library and octopus_audio.kernels: picks triton or reference.

OCTOPUS_AUDIO_BACKEND in {auto, reference, triton} (default auto): auto runs the Triton kernels for CUDA
tensors when `octopus_audio.kernels.ops` imports, else the PyTorch reference; a forced backend that cannot
run is an error (triton runs on CPU tensors only under TRITON_INTERPRET=1). The choice is logged once.
The codec `none` always takes the reference path (plain SDPA over native K/V).
"""

from __future__ import annotations

import functools
import logging
import os

import torch

log = logging.getLogger(__name__)

ENV_VAR = "OCTOPUS_AUDIO_BACKEND"
CHOICES = ("auto", "reference", "triton")
KERNEL_OPS = ("encode_keys", "encode_values", "attention")
_announced: set[tuple[str, str]] = set()


def requested_backend() -> str:
    """The backend the environment asks for (auto when unset)."""
    value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV_VAR}={value!r} is not a backend; allowed: {', '.join(CHOICES)}")
    return value


@functools.cache
def _kernel_ops():
    """(ops module or None, reason it is unavailable)."""
    try:
        from octopus_audio.kernels import ops
    except Exception as exc:  # any import failure means the kernels cannot run
        return None, f"importing octopus_audio.kernels.ops failed ({type(exc).__name__}: {exc})"
    missing = [name for name in KERNEL_OPS if not callable(getattr(ops, name, None))]
    if missing:
        return None, f"octopus_audio.kernels.ops lacks {', '.join(missing)}"
    return ops, ""


def kernels_available() -> tuple[bool, str]:
    """Whether the Triton kernel entry points import, and why not."""
    ops, why = _kernel_ops()
    return ops is not None, why


def _announce(backend: str, why: str) -> None:
    if (backend, why) not in _announced:
        _announced.add((backend, why))
        log.info("octopus-audio attention backend: %s (%s)", backend, why)


def attention_backend(device: torch.device | str | None = None, codec_name: str | None = None) -> str:
    """"triton" or "reference" for tensors on `device` (None: cuda if available, else cpu)."""
    requested = requested_backend()
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if codec_name == "none":
        _announce("reference", "codec none: plain SDPA over native K/V")
        return "reference"
    if requested == "reference":
        _announce("reference", f"{ENV_VAR}=reference")
        return "reference"
    ok, why = kernels_available()
    runnable = device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    if requested == "triton":
        if not ok:
            raise RuntimeError(f"{ENV_VAR}=triton but the Triton kernels cannot be used: {why}")
        if not runnable:
            raise RuntimeError(
                f"{ENV_VAR}=triton but the tensors are on {device}: the kernels need CUDA tensors "
                f"(or TRITON_INTERPRET=1 on CPU); set {ENV_VAR}=reference or auto"
            )
        _announce("triton", f"{ENV_VAR}=triton")
        return "triton"
    if device.type == "cuda" and ok:
        _announce("triton", f"auto: CUDA tensors on {device}")
        return "triton"
    _announce("reference", f"auto: {why}" if not ok else f"auto: tensors on {device}")
    return "reference"


def _ops():
    return _kernel_ops()[0]


# ---- the kernels' view of a codec (tables and rotations as octopus_audio.kernels.KernelCodec) ----

def kernel_limit(codec, for_encode: bool = True) -> str | None:
    """Why the fused kernels cannot run this codec (None when they can)."""
    from octopus_audio.kernels.spec import MAX_HEAD_DIM, MIN_HEAD_DIM

    if not MIN_HEAD_DIM <= codec.head_dim <= MAX_HEAD_DIM:
        return f"head dim {codec.head_dim} is outside the kernels' {MIN_HEAD_DIM}..{MAX_HEAD_DIM}"
    if for_encode and getattr(codec, "rounding", "local3x3") != "local3x3":
        return f"the encode kernel implements local3x3 rounding only, not {codec.rounding!r}"
    return None


def kernel_codec(codec, num_heads: int, device):
    """`codec` (a RotationCodec) as octopus_audio.kernels.KernelCodec on `device`, cached on the codec."""
    from octopus_audio.codebooks import get_codebook
    from octopus_audio.kernels import KernelCodec

    device = torch.device(device)

    def make():
        tables = {}
        if codec.name.startswith("octopus"):
            xi = get_codebook("xi", None, codec.dir_bits)
            direction_table, rho_centroids = codec.tables(device)
            tables = dict(directions=direction_table, xi_centroids=xi.centroids, xi_boundaries=xi.boundaries,
                          centroids=rho_centroids,
                          boundaries=get_codebook("rho", codec.head_dim, codec.rho_bits).boundaries,
                          b_dir=codec.dir_bits, b_rho=codec.rho_bits)
        elif codec.name == "polarquant":
            books = [codec.level_codebook(level, device) for level in range(1, codec.levels + 1)]
            tables = dict(centroids=torch.stack([c for c, _ in books]),
                          boundaries=torch.stack([b for _, b in books]))
        elif codec.mse_bits > 0:
            centroids, boundaries = codec.coord_codebook(device)
            tables = dict(centroids=centroids, boundaries=boundaries)
        qjl_signs = codec.signs(num_heads, device, stream=1) if codec.qjl else None
        kc = KernelCodec(codec.name, codec.head_dim, codec.bits, codec.signs(num_heads, device), qjl_signs,
                         **tables)
        return kc.to(device)

    return codec._cached(("kernel_codec", num_heads, str(device)), make)


# ---- one hook per op: the kernels when the backend is triton, the PyTorch reference otherwise ----

def encode_keys(codec, k: torch.Tensor, backend: str):
    """k [B, H, T, d] -> KeyState (finiteness already checked by the caller)."""
    if backend == "triton":
        why = kernel_limit(codec)
        if why is None:
            from octopus_audio.codecs.base import KeyState
            from octopus_audio.rotation import num_heads_of

            p = _ops().encode_keys(k, kernel_codec(codec, num_heads_of(k), k.device))
            return KeyState(dtype=k.dtype, codes=p.codes, gamma=p.gamma, signs=p.signs, gamma_r=p.gamma_r)
        _announce("reference", f"encode: {why}")
    return codec.encode_unchecked(k)


def encode_values(quantizer, v: torch.Tensor, backend: str):
    """v [B, H, T, d] -> ValueState (range already checked by the caller)."""
    if backend == "triton":
        from octopus_audio.values import ValueState

        p = _ops().encode_values(v, quantizer.bits, quantizer.group, check_range=False)
        return ValueState(dtype=v.dtype, codes=p.codes, scale=p.scale, minimum=p.minimum)
    return quantizer.encode_unchecked(v)


def attention(cache, q: torch.Tensor, scale: float, backend: str) -> torch.Tensor:
    """One softmax over the cache's compressed store and native window: q [B, Hq, Tq, d] -> [B, Hq, Tq, d]."""
    if backend == "triton":
        why = kernel_limit(cache.codec, for_encode=False)
        if why is None:
            return _kernel_attention(cache, q, scale)
        _announce("reference", f"attention: {why}")
    return cache.attend_reference(q, scale)


def _kernel_attention(cache, q: torch.Tensor, scale: float) -> torch.Tensor:
    from octopus_audio.kernels import PackedKeys, PackedValues
    from octopus_audio.packing import num_words

    window = cache.window_kv()
    quant = cache.value_quantizer
    if cache.store is not None:
        ks, vs = cache.store.keys, cache.store.values
        keys = PackedKeys(ks.codes, ks.gamma, ks.signs, ks.gamma_r)
        values = PackedValues(vs.codes, vs.scale, vs.minimum, quant.bits, quant.group)
        heads = ks.codes.shape[1]
    else:  # window only: an empty store of the right shapes
        heads = window[0].shape[1]
        kc = kernel_codec(cache.codec, heads, q.device)

        def empty(*tail, dtype):
            return torch.zeros(q.shape[0], heads, 0, *tail, dtype=dtype, device=q.device)

        keys = PackedKeys(empty(kc.key_words, dtype=torch.int32), empty(dtype=torch.bfloat16),
                          empty(num_words(kc.head_dim, 1), dtype=torch.int32) if kc.has_qjl else None,
                          empty(dtype=torch.bfloat16) if kc.has_qjl else None)
        values = PackedValues(empty(num_words(kc.head_dim, quant.bits), dtype=torch.int32),
                              empty(kc.head_dim // quant.group, dtype=torch.float16),
                              empty(kc.head_dim // quant.group, dtype=torch.float16), quant.bits, quant.group)
    k_win, v_win = window if window is not None else (None, None)
    return _ops().attention(q, keys, values, cache.length, k_win, v_win,
                            kernel_codec(cache.codec, heads, q.device), scale=scale)
