"""The one selector: which implementation runs a call, said once (logging) with why, and the public entry
points `attention` and `encode_keys` that check a call, pick its implementation and run it.

Attention, in priority order (each implementation declares which calls it takes and, when not, why):
- `gluon` (impls/gluon/flash.py): the warp-specialised sm_90 kernel, where `gluon/scope.gluon_limit` finds the
  call in scope (an H100/H200, bf16, d = 64, 2..80 query rows a KV head, a full grid...) and
  `gluon/scope.wide_limit` its wide prefix if it has one, the Gluon kernels are allowed (`gluon=True`) and no
  launch configuration or split count is forced;
- `sdpa` (impls/native.py): a call with no compressed key (the store and the wide prefix empty), torch's SDPA
  over the native keys, unless a launch configuration or split count is forced;
- `score-tables` (impls/score_tables.py): one query row a KV head of a kind with score tables
  (`score_tables.adc_limit`);
- `split-k` (impls/flash.py): every call.
Key encode: `gluon` (impls/gluon/encode.py, where `gluon/scope.encode_limit` finds the call in scope and no
launch configuration is forced), else `triton` (impls/encode.py; a kind without an encode is an error).

The Gluon modules are imported only where the device and the installed Triton allow (`gluon_api`). Which
implementations a caller allows comes from the caller: the cache reads OCTOPUS_AUDIO_KERNELS once per sequence
(octopus_audio/cache/backend.py) and passes `gluon`; `record` (a dict) collects, per op, the implementations
that ran and why (the cache's `repr` shows them).
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import re

import torch

from .impls import encode as triton_encode
from .impls import flash, native, score_tables
from .impls.gluon import scope
from .launch import AttnConfig, EncodeConfig, _interpreting, _outside_autocast, _sm_count, device_capability
from .spec import KernelCodec, PackedKeys, PackedValues, WideSegment

log = logging.getLogger(__name__)

GLUON = "gluon"
# attention implementations, in priority order
ATTENTION = (GLUON, native.NAME, score_tables.NAME, flash.NAME)
ENCODE = (GLUON, triton_encode.NAME)  # key encode implementations, in priority order
_announced: set[tuple[str, ...]] = set()
# why a forced launch keeps a call on the Triton kernels (off Gluon and SDPA)
FORCED_LIMIT = "a launch configuration or split count given"
# why the score tables decline a call with a wide segment (they read one key and value width a call)
WIDE_LIMIT = "a wide prefix (a second store at other widths; it reads one width a call)"


@functools.cache
def gluon_api() -> str | None:
    """Why the installed Triton cannot run the Gluon kernels (None when it can): gluon/flash.py and
    gluon/encode.py must import and gl.warp_specialize take (partitions, worker warps, worker registers), as
    from Triton 3.6."""
    try:
        from triton.experimental.gluon import language as gl

        from .impls.gluon import encode, flash  # noqa: F401  (import every Gluon name the kernels use)
    except Exception as exc:  # any import failure means the Gluon kernel cannot run
        return f"the installed Triton lacks the Gluon API ({type(exc).__name__}: {exc})"
    params = list(inspect.signature(gl.warp_specialize).parameters)
    if params[:3] != ["functions_and_args", "worker_num_warps", "worker_num_regs"]:
        return f"the installed Triton's gl.warp_specialize takes ({', '.join(params[:3])}), not the 3.6 form"
    return None


def _gluon_facts(device: torch.device) -> dict:
    """The device's part of a Gluon scope question: capability, API error (CUDA only), interpreter."""
    capability = device_capability(device)
    return dict(capability=capability, api_error=gluon_api() if capability is not None else None,
                interpreting=_interpreting())


def announce(op: str, impl: str, why: str, record: dict | None = None) -> None:
    """Log once which implementation runs an op (attention, key encode) and why (once per reason, whatever its
    numbers); `record` (a dict) gets {op: {impl: first reason}}."""
    if record is not None:
        record.setdefault(op, {}).setdefault(impl, why)
    said = ("said", op, impl, why)  # this exact reason seen before: the common case, no substitution
    if said in _announced:
        return
    _announced.add(said)
    key = (op, impl, re.sub(r"\d+", "N", why))
    if key not in _announced:
        _announced.add(key)
        log.info("octopus-audio %s: %s (%s)", op, impl, why)


def _check_packed(keys: PackedKeys, values: PackedValues, codec: KernelCodec, b: int, h: int) -> int:
    t_cap = keys.codes.shape[2]
    d = codec.head_dim
    if values.group < 1 or values.group & (values.group - 1) or d % values.group:
        raise ValueError(f"value group {values.group} must be a power of two dividing the head dim {d}")
    expect = {"keys.codes": (keys.codes, (b, h, t_cap, codec.code_words), torch.int32),
              "keys.gamma": (keys.gamma, (b, h, t_cap), torch.bfloat16),
              "values.codes": (values.codes, (b, h, t_cap, -(-d * values.bits // 32)), torch.int32),
              "values.scale": (values.scale, (b, h, t_cap, d // values.group), torch.float16),
              "values.minimum": (values.minimum, (b, h, t_cap, d // values.group), torch.float16)}
    if codec.has_qjl:
        expect["keys.signs"] = (keys.signs, (b, h, t_cap, -(-d // 32)), torch.int32)
        expect["keys.gamma_r"] = (keys.gamma_r, (b, h, t_cap), torch.bfloat16)
    for name, (t, shape, dtype) in expect.items():
        if t is None or tuple(t.shape) != shape or t.dtype != dtype:
            got = None if t is None else (tuple(t.shape), t.dtype)
            raise ValueError(f"{name} must be {dtype} of shape {shape} (formats.md), got {got}")
    return t_cap


def attention_gluon_limit(q_BHTD: torch.Tensor, values: PackedValues, k_window: torch.Tensor | None,
                          codec: KernelCodec, n_rows: int, programs: int) -> str | None:
    """gluon/scope.gluon_limit for one attention call (None: the Gluon kernel takes it)."""
    dev = q_BHTD.device
    window_dtype = None if k_window is None or not k_window.shape[2] else k_window.dtype
    return scope.gluon_limit(**_gluon_facts(dev), q_dtype=q_BHTD.dtype, window_dtype=window_dtype,
                             kind=codec.kind, has_qjl=codec.has_qjl, head_dim=codec.head_dim,
                             code_bits=codec.code_bits, v_bits=values.bits, v_group=values.group, rows=n_rows,
                             programs=programs, sm_count=_sm_count(dev))


def _same_rotation(codec: KernelCodec, wide: KernelCodec) -> bool:
    """Whether the wide codec's query map equals the store codec's (the Gluon kernel scores both stores with
    one rotated query); compared once per pair of codecs, the answer kept on the wide codec."""
    seen = wide.__dict__.setdefault("_same_rotation", {})
    got = seen.get(id(codec))
    if got is None or got[0] is not codec:
        dtype = torch.float32
        got = seen[id(codec)] = (codec, torch.equal(codec.query_map(dtype), wide.query_map(dtype)))
    return got[1]


def wide_gluon_limit(codec: KernelCodec, wide: WideSegment) -> str | None:
    """gluon/scope.wide_limit for a call's wide segment beside `codec`'s store (None: the Gluon kernel reads
    it)."""
    wc = wide.codec
    return scope.wide_limit(kind=wc.kind, has_qjl=wc.has_qjl, head_dim=wc.head_dim, code_bits=wc.code_bits,
                            v_bits=wide.values.bits, v_group=wide.values.group,
                            same_rotation=_same_rotation(codec, wc))


def encode_gluon_limit(k: torch.Tensor, codec: KernelCodec) -> str | None:
    """gluon/scope.encode_limit for keys `k` of `codec` (None: the Gluon encode takes them)."""
    return scope.encode_limit(**_gluon_facts(k.device), k_dtype=k.dtype, kind=codec.kind,
                              has_qjl=codec.has_qjl, head_dim=codec.head_dim, code_bits=codec.code_bits)


def attention(q_BHTD: torch.Tensor, keys: PackedKeys, values: PackedValues, length: int,
              k_window: torch.Tensor | None, v_window: torch.Tensor | None, codec: KernelCodec,
              scale: float | None = None, num_splits: int | None = None,
              config: AttnConfig | None = None, gluon: bool = True,
              record: dict | None = None, wide: WideSegment | None = None) -> torch.Tensor:
    """softmax(scale * q.[K_hat; K_win]) @ [V_hat; V_win], decoding the store in registers.

    q [B, Hq, Tq, d] (any float dtype, any strides); `keys`/`values` buffers [B, H, Tcap, ...] of
    which the first `length` tokens are valid; window K/V [B, H, Tw, d] native (None or Tw = 0: no window).
    Hq = G*H, query head h*G + g reads KV head h. Returns [B, Hq, Tq, d] in q's dtype (fp32 accumulation).
    The implementation is the first of ATTENTION that takes the call (module docstring; said once per reason
    in the log). `num_splits` forces the split-K count (default: enough programs to fill the GPU); `config`
    overrides the launch heuristic (AttnConfig); either keeps the call on the Triton kernels. `gluon` False:
    never the Gluon kernel. `record`: a dict that collects the implementation that ran (`announce`). `wide`: a
    second store in the same softmax (a cache's wide prefix, its keys and values at their own widths, a codec
    of the same kind and head dim), which the Gluon kernel (`scope.wide_limit`) and the split-K kernel read.

    >>> out = attention(q, keys, values, 455, k_win, v_win, codec)  # doctest: +SKIP
    """
    b, hq, tq, d = q_BHTD.shape
    if d != codec.head_dim:
        raise ValueError(f"query head dim {d} does not match the codec's {codec.head_dim}")
    h = keys.codes.shape[1]
    if hq % h or codec.num_heads != h:
        raise ValueError(f"{hq} query heads cannot share {h} KV heads (codec built for {codec.num_heads})")
    t_cap = _check_packed(keys, values, codec, b, h)
    if not 0 <= length <= t_cap:
        raise ValueError(f"length {length} is outside the store's capacity 0..{t_cap}")
    t_win = 0 if k_window is None else k_window.shape[2]
    if t_win and (k_window.shape != (b, h, t_win, d) or v_window is None or v_window.shape != k_window.shape):
        raise ValueError(f"window K/V must both be [{b}, {h}, Tw, {d}], got {tuple(k_window.shape)} and "
                         f"{None if v_window is None else tuple(v_window.shape)}")
    if wide is not None:
        wc = wide.codec
        if wc.kind is not codec.kind or wc.head_dim != d or wc.has_qjl != codec.has_qjl:
            raise ValueError(f"the wide segment's codec ({wc.kind.name}, d={wc.head_dim}) must be of the "
                             f"store codec's kind and head dim ({codec.kind.name}, d={d})")
        if wc.num_heads != h:
            raise ValueError(f"the wide segment's codec was built for {wc.num_heads} KV heads, not {h}")
        if not 0 <= wide.length <= _check_packed(wide.keys, wide.values, wide.codec, b, h):
            raise ValueError(f"wide segment length {wide.length} is outside its store's capacity")
        if not wide.length:
            wide = None
    if length + t_win + (0 if wide is None else wide.length) == 0:
        raise ValueError("attention needs at least one key: the store and the window are both empty")
    codec = codec.to(q_BHTD.device)
    if wide is not None:
        wide = WideSegment(wide.keys, wide.values, wide.length, wide.codec.to(q_BHTD.device))
    n_rows = hq // h * tq
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    forced = config is not None or num_splits is not None
    if not gluon:
        why_gluon = "Gluon kernels not allowed"
    elif forced:
        why_gluon = FORCED_LIMIT
    else:
        why_gluon = attention_gluon_limit(q_BHTD, values, k_window, codec, n_rows, b * h)
        if why_gluon is None and wide is not None:
            why_gluon = wide_gluon_limit(codec, wide)
        if why_gluon is None:
            from .impls.gluon.flash import attention_gluon  # imported where the device and Triton allow

            why = "in scope" if wide is None else "in scope, with a wide prefix"
            announce("attention", GLUON, why, record)
            return attention_gluon(q_BHTD, keys, values, length, k_window, v_window, codec, scale, wide)
    why_native = FORCED_LIMIT if forced else native.native_limit(length, 0 if wide is None else wide.length,
                                                                 t_win)
    if why_native is None:
        announce("attention", native.NAME, f"no compressed key; {GLUON}: {why_gluon}", record)
        return native.attention_native(q_BHTD, k_window, v_window, scale)
    why_tables = WIDE_LIMIT if wide is not None else score_tables.adc_limit(codec, n_rows, t_win)
    if why_tables is None:
        announce("attention", score_tables.NAME, f"one query row a KV head; {GLUON}: {why_gluon}", record)
        return score_tables.table_attention(q_BHTD, keys, values, length, k_window, v_window, codec, scale,
                                            num_splits, config)
    announce("attention", flash.NAME, f"{GLUON}: {why_gluon}; {native.NAME}: {why_native}; "
             f"{score_tables.NAME}: {why_tables}", record)
    return flash.attention_flash(q_BHTD, keys, values, length, k_window, v_window, codec, scale, num_splits,
                                 config, wide)


@_outside_autocast
def encode_keys(k: torch.Tensor, codec: KernelCodec, config: EncodeConfig | None = None, gluon: bool = True,
                record: dict | None = None) -> PackedKeys:
    """K [..., H, T, d] (any float dtype) -> PackedKeys with `codes` [..., H, T, W] int32, `gamma` [..., H, T]
    bf16 (and `signs`, `gamma_r` for the -qjl codecs), identical to the reference up to inputs within fp32
    rounding of a decision boundary.

    The implementation is the first of ENCODE that takes the call (module docstring; said once per reason in
    the log): the Gluon encode where in scope, `gluon` True and no `config` given, else the Triton kernel
    (`config` overrides its launch, EncodeConfig). A codec whose kind has no kernel encode is a ValueError.
    `record`: as `attention`'s.

    >>> keys = encode_keys(torch.randn(1, 2, 455, 64, device="cuda"), codec)  # doctest: +SKIP
    """
    d = codec.head_dim
    if k.shape[-1] != d or k.ndim < 2:
        raise ValueError(f"keys must be [..., H, T, {d}], got {tuple(k.shape)}")
    if k.ndim == 2:
        k = k[None]
    if k.shape[-3] != codec.num_heads:
        raise ValueError(f"keys have {k.shape[-3]} heads, the codec was built for {codec.num_heads}")
    if k.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"keys must be float32, float16 or bfloat16, got {k.dtype}")
    if codec.kind.encode is None:
        raise ValueError(f"the {codec.kind.name} kind has no kernel key encode (its codecs encode in the "
                         f"library)")
    codec = codec.to(k.device)
    if not gluon:
        why_gluon = "Gluon kernels not allowed"
    elif config is not None:
        why_gluon = "a launch configuration given"
    else:
        why_gluon = encode_gluon_limit(k, codec)
        if why_gluon is None:
            from .impls.gluon.encode import encode_keys_gluon  # imported where the device and Triton allow

            announce("key encode", GLUON, "in scope", record)
            return encode_keys_gluon(k, codec)
    announce("key encode", triton_encode.NAME, f"{GLUON}: {why_gluon}", record)
    return triton_encode.encode_keys_triton(k, codec, config)
