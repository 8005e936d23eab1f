"""The Triton key encode: K of a codec whose kind has a kernel encode, in any float dtype, into the packed
state of formats.md (`encode_keys_triton`), and the fused unit encode (keys and values of one unit written
into a store in one launch, `encode_unit`); their kernels and launchers.

Supports every key encode of a kind with one (`DecodeKind.encode`): the implementation the selector
(octopus_audio/kernels/select.py) falls back to. The kind's encode is a compile-time parameter: its
`KindEncode.codes` helper is the kernel's ENCODE, its tables the kernel's hadt/xib/aux/dir arguments, its
launch table the launch (`_encode_launch`).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..bits import bf16_bits, pack_tile
from ..kinds import ENCODE_PARAMS, EncodeConstants
from ..launch import EncodeConfig, _interpreting, _sm_count, pack_shape, unused_buffer
from ..spec import KernelCodec, PackedKeys, PackedValues
from ..value_encode import _CHUNK_DTYPES, encode_value_groups, mark_bad

NAME = "triton"


@triton.jit
def _divmod_near(n, d, inv_d):
    """(n // d, n % d) for int32 n >= 0, d >= 1 and quotients below 2**21, without an integer division: the
    fp32 estimate n * RN(1/d) is within one of the quotient, corrected once each way."""
    q = (n.to(tl.float32) * inv_d).to(tl.int32)
    r = n - q * d
    hi = r >= d
    q = tl.where(hi, q + 1, q)
    r = tl.where(hi, r - d, r)
    lo = r < 0
    return tl.where(lo, q - 1, q), tl.where(lo, r + d, r)


@triton.jit
def _key_rows(pid, n_rows, T, T_PAD, H, T_OUT, OFFSET, D: tl.constexpr, stride_b, stride_h, stride_t,
              BLOCK_T: tl.constexpr, ALIGNED: tl.constexpr):
    """Rows [BLOCK_T] of block `pid` of a unit [B, H, T, .] as `_unit_rows` places them: (valid mask, input
    offset, store row, head * D). ALIGNED: the launch numbers each head's tokens 0 .. T_PAD - 1, T_PAD a
    multiple of BLOCK_T (T itself, or T padded: `padded_tokens`), so a block lies in one head, whose offset
    is a scalar, and rows t >= T are masked. Otherwise rows run over B H T without gaps (T_PAD unused): one
    scalar division per program, and per row quotients of at most 1 + BLOCK_T / T and 1 + (BLOCK_T + 1) / H,
    so `_divmod_near` is exact."""
    r0 = pid * BLOCK_T
    i = tl.arange(0, BLOCK_T)
    if ALIGNED:
        bh0 = r0 // T_PAD
        h0 = bh0 % H
        t = r0 - bh0 * T_PAD + i
        src = (bh0 // H) * stride_b + h0 * stride_h + t * stride_t
        return t < T, src, bh0 * T_OUT + OFFSET + t, h0 * D
    else:
        bh0 = r0 // T
        h0 = bh0 % H
        q, t = _divmod_near(r0 - bh0 * T + i, T, 1.0 / (T * 1.0))
        qh, head = _divmod_near(h0 + q, H, 1.0 / (H * 1.0))  # H may be a constexpr 1
        src = (bh0 // H + qh) * stride_b + head * stride_h + t * stride_t
        return r0 + i < n_rows, src, (bh0 + q) * T_OUT + OFFSET + t, (head * D)[:, None]


@triton.jit
def key_norm(xf):
    """(gamma = ||x||, 2**-e) per row of xf [BT, D] (fp32) for any finite x: the row is scaled by the power of
    two 2**-e (exact) that takes max|x| into [1, 2), squared and summed, and the root scaled back by 2**e."""
    e = tl.max(tl.abs(xf), 1).to(tl.int32, bitcast=True) & 0x7F800000
    e = tl.minimum(tl.maximum(e, 1 << 23), 253 << 23)  # binades 1..253: both 2**e and 2**-e are normal
    scale = ((254 << 23) - e).to(tl.float32, bitcast=True)
    xs = xf * scale[:, None]
    return tl.sqrt_rn(tl.sum(xs * xs, 1)) * e.to(tl.float32, bitcast=True), scale


@triton.jit
def _encode_keys_kernel(
    k_ptr, stride_kb, stride_kh, stride_kt, codes_ptr, gamma_ptr, signs_ptr, gamma_r_ptr, flag_ptr,
    near_ptr, had_ptr, hadt_ptr, rs_ptr, qs_ptr,
    cent_ptr, bnd_ptr, xib_ptr, aux_ptr, dir_ptr,
    n_rows, T, T_PAD, H, T_OUT, OFFSET, inv_sqrt_d,
    ENCODE: tl.constexpr, D: tl.constexpr, LOG2D: tl.constexpr,
    K_BITS: tl.constexpr, K_CODES: tl.constexpr, K_WORDS: tl.constexpr, WP: tl.constexpr, KP: tl.constexpr,
    B_DIR: tl.constexpr, B_RHO: tl.constexpr, SEARCH_K: tl.constexpr, LUT_SCALE: tl.constexpr,
    HALF: tl.constexpr, RHO_SCALE: tl.constexpr, LP: tl.constexpr,
    HAS_QJL: tl.constexpr, S_WORDS: tl.constexpr, S_WP: tl.constexpr, S_KP: tl.constexpr,
    DOT_NATIVE: tl.constexpr, SPLIT: tl.constexpr, CHECK: tl.constexpr, BLOCK_T: tl.constexpr,
    ALIGNED: tl.constexpr, EXACT: tl.constexpr, REDO_GROUPS: tl.constexpr = 1,
):
    """Rows [BLOCK_T] (block `tl.program_id(0)`) of a unit K [B, H, T, D] (row r is token r % T of head
    (r // T) % H; the input's strides are given, unit stride along D) -> codes, gamma, QJL fields written to
    rows (b * H + h) * T_OUT + OFFSET + t of the outputs (a store of T_OUT tokens; T_OUT = T, OFFSET = 0 for a
    plain [.., T, .] output). CHECK: a NaN or infinite key sets the flag (`mark_bad`).

    gamma = ||k|| (fp32, `key_norm`; stored bf16); u = (H_d (s_h * k)) / sqrt(d) / max(gamma, 1e-30), the
    rotation a matmul with the +-1 Hadamard matrix (encode_math: the signs s_h and the matrices had_ptr /
    hadt_ptr are in the input's dtype when DOT_NATIVE, else fp32). Then the kind's codes (its ENCODE helper,
    `KindEncode.codes`, with its tables hadt_ptr, xib_ptr, aux_ptr, dir_ptr): codebook search against
    boundaries (scalar), recursive polar angles by cross products (polar), octahedral seeds and local3x3
    joint rounding (triplet); the -qjl codecs add sigma = sign(R' (u - u_hat)) and gamma_r = ||u - u_hat||.
    ALIGNED: each head's tokens are numbered 0 .. T_PAD - 1, T_PAD (T, or T padded: `padded_tokens`) a
    multiple of BLOCK_T, so a block lies in one head (`_key_rows`); n_rows then counts B H T_PAD rows. Codes
    go out through `pack_tile`'s word map.
    EXACT (a kind's near ties, `KindEncode.near_rows`: the triplet kind's, `_octopus_tile`): 0 re-decides
    them inline (the fused unit encode, which calls this kernel as a function for its key programs);
    `encode_keys_triton` launches it twice: 1 writes a flag per group of near_rows rows (the group holds a
    near tie), then 2, with near_rows rows a block, redoes just the flagged groups in the reference's
    arithmetic (a separate launch keeps that rare path's registers out of the first; groups smaller than the
    first launch's blocks redo fewer rows: at 64 rows a block, b=4 flags about one block in seven). The
    second launch's programs take REDO_GROUPS groups each: one vector load of their flags, then the flagged
    ones in turn (a program a group spent 51 us of the 0.50 ms of octopus b=2 at 64k tokens x 16 heads on
    the H200 launching programs that found no flag).
    """
    pid = tl.program_id(0)
    K: tl.constexpr = EncodeConstants(D, LOG2D, K_BITS, K_CODES, WP, KP, B_DIR, B_RHO, SEARCH_K, LUT_SCALE,
                                      HALF, RHO_SCALE, LP, HAS_QJL, DOT_NATIVE, SPLIT, EXACT, BLOCK_T)
    if EXACT == 2:  # REDO_GROUPS groups a program: only those the first launch flagged
        n_groups = (n_rows + BLOCK_T - 1) // BLOCK_T
        g = pid * REDO_GROUPS + tl.arange(0, REDO_GROUPS)
        if tl.max(tl.load(near_ptr + g, mask=g < n_groups, other=0), 0) != 0:
            for i in range(REDO_GROUPS):
                blk = pid * REDO_GROUPS + i
                if tl.load(near_ptr + blk, mask=blk < n_groups, other=0) != 0:
                    _encode_key_block(
                        blk, k_ptr, stride_kb, stride_kh, stride_kt, codes_ptr, gamma_ptr, signs_ptr,
                        gamma_r_ptr, flag_ptr, near_ptr, had_ptr, hadt_ptr, rs_ptr, qs_ptr, cent_ptr, bnd_ptr,
                        xib_ptr, aux_ptr, dir_ptr, n_rows, T, T_PAD, H, T_OUT, OFFSET, inv_sqrt_d, ENCODE,
                        K, K_WORDS, S_WORDS, S_WP, S_KP, CHECK, ALIGNED)
    else:
        _encode_key_block(pid, k_ptr, stride_kb, stride_kh, stride_kt, codes_ptr, gamma_ptr, signs_ptr,
                          gamma_r_ptr, flag_ptr, near_ptr, had_ptr, hadt_ptr, rs_ptr, qs_ptr, cent_ptr,
                          bnd_ptr, xib_ptr, aux_ptr, dir_ptr, n_rows, T, T_PAD, H, T_OUT, OFFSET, inv_sqrt_d,
                          ENCODE, K, K_WORDS, S_WORDS, S_WP, S_KP, CHECK, ALIGNED)


@triton.jit
def _encode_key_block(blk, k_ptr, stride_kb, stride_kh, stride_kt, codes_ptr, gamma_ptr, signs_ptr,
                      gamma_r_ptr, flag_ptr, near_ptr, had_ptr, hadt_ptr, rs_ptr, qs_ptr, cent_ptr, bnd_ptr,
                      xib_ptr, aux_ptr, dir_ptr, n_rows, T, T_PAD, H, T_OUT, OFFSET, inv_sqrt_d,
                      ENCODE: tl.constexpr, K, K_WORDS: tl.constexpr, S_WORDS: tl.constexpr,
                      S_WP: tl.constexpr, S_KP: tl.constexpr, CHECK: tl.constexpr, ALIGNED: tl.constexpr):
    """Block `blk` of `_encode_keys_kernel`'s rows: its keys' fields, encoded and stored (K: the kernel's
    compile-time parameters that the kind's ENCODE reads, an `EncodeConstants`)."""
    D: tl.constexpr = K.D
    ok, src, dst, hoff = _key_rows(blk, n_rows, T, T_PAD, H, T_OUT, OFFSET, D, stride_kb, stride_kh,
                                   stride_kt, K.BLOCK_T, ALIGNED)
    dcol = tl.arange(0, D)[None, :]
    x = tl.load(k_ptr + src[:, None] + dcol, mask=ok[:, None], other=0.0)
    xf = x.to(tl.float32)
    if CHECK:
        if tl.max(tl.max((~(tl.abs(xf) < float("inf"))).to(tl.int32), 1), 0) > 0:
            mark_bad(flag_ptr)
    gamma, rscale = key_norm(xf)
    tl.store(gamma_ptr + dst, bf16_bits(gamma), mask=ok)
    gmax = tl.maximum(gamma, 1e-30)[:, None]
    inv_g = tl.math.div_rn(1.0, gmax)
    sgn = tl.load(rs_ptr + hoff + dcol)
    if K.DOT_NATIVE:
        xsg = x * sgn  # +-1 in the input dtype: exact
    else:
        xsg = xf * sgn
    words, wmap, proj, gamma_r = ENCODE(xsg, rscale, gmax, inv_g, inv_sqrt_d, hoff, blk, near_ptr, had_ptr,
                                        hadt_ptr, qs_ptr, cent_ptr, bnd_ptr, xib_ptr, aux_ptr, dir_ptr, K)
    if K_WORDS > 0:
        tl.store(codes_ptr + dst[:, None] * K_WORDS + wmap, words,
                 mask=ok[:, None] & (wmap >= 0) & (wmap < K_WORDS))
    if K.HAS_QJL:
        tl.store(gamma_r_ptr + dst, bf16_bits(gamma_r), mask=ok)
        sbits, _ = pack_tile((proj >= 0).to(tl.int32), D, 1, S_WP, S_KP)
        scol = tl.arange(0, S_WP)[None, :]
        tl.store(signs_ptr + dst[:, None] * S_WORDS + scol, sbits, mask=ok[:, None] & (scol < S_WORDS))


@triton.jit(do_not_specialize=["n_rows", "T", "T_PAD", "OFFSET", "key_programs", "n_groups"])
def _encode_unit_kernel(
    k_ptr, stride_kb, stride_kh, stride_kt, v_ptr, stride_vb, stride_vh, stride_vt,
    codes_ptr, gamma_ptr, signs_ptr, gamma_r_ptr, v_codes_ptr, scale_ptr, min_ptr, flag_ptr,
    had_ptr, hadt_ptr, rs_ptr, qs_ptr,
    cent_ptr, bnd_ptr, xib_ptr, aux_ptr, dir_ptr,
    n_rows, T, T_PAD, H, T_OUT, OFFSET, inv_sqrt_d, key_programs, n_groups,
    ENCODE: tl.constexpr, D: tl.constexpr, LOG2D: tl.constexpr,
    K_BITS: tl.constexpr, K_CODES: tl.constexpr, K_WORDS: tl.constexpr, WP: tl.constexpr, KP: tl.constexpr,
    B_DIR: tl.constexpr, B_RHO: tl.constexpr, SEARCH_K: tl.constexpr, LUT_SCALE: tl.constexpr,
    HALF: tl.constexpr, RHO_SCALE: tl.constexpr, LP: tl.constexpr,
    HAS_QJL: tl.constexpr, S_WORDS: tl.constexpr, S_WP: tl.constexpr, S_KP: tl.constexpr,
    DOT_NATIVE: tl.constexpr, SPLIT: tl.constexpr, CHECK: tl.constexpr, BLOCK_T: tl.constexpr,
    ALIGNED: tl.constexpr,
    GROUP: tl.constexpr, V_BITS: tl.constexpr, ROW_UNITS: tl.constexpr, BLOCK_G: tl.constexpr,
):
    """One unit's keys and values in one launch, straight into a store [B, H, T_OUT, .] at token OFFSET:
    programs [0, key_programs) encode BLOCK_T key rows each (`_encode_keys_kernel`), the rest BLOCK_G value
    groups each (`encode_value_groups`). CHECK: flag_ptr[0] is set for a non-finite key, flag_ptr[1] for a
    value that is NaN or beyond the fp16 range."""
    pid = tl.program_id(0)
    if pid < key_programs:
        _encode_keys_kernel(
            k_ptr, stride_kb, stride_kh, stride_kt, codes_ptr, gamma_ptr, signs_ptr, gamma_r_ptr,
            flag_ptr, flag_ptr, had_ptr, hadt_ptr, rs_ptr, qs_ptr, cent_ptr, bnd_ptr, xib_ptr, aux_ptr,
            dir_ptr, n_rows, T, T_PAD, H, T_OUT, OFFSET, inv_sqrt_d,
            ENCODE, D, LOG2D, K_BITS, K_CODES, K_WORDS, WP, KP, B_DIR, B_RHO, SEARCH_K, LUT_SCALE, HALF,
            RHO_SCALE, LP, HAS_QJL, S_WORDS,
            S_WP, S_KP, DOT_NATIVE, SPLIT, CHECK, BLOCK_T, ALIGNED, 0)
    else:
        encode_value_groups(pid - key_programs, v_ptr, stride_vb, stride_vh, stride_vt, v_codes_ptr,
                             scale_ptr, min_ptr, flag_ptr + 1, n_groups, T, H, T_OUT, OFFSET, D, GROUP,
                             V_BITS, ROW_UNITS, BLOCK_G, CHECK)


def _encode_tables(codec: KernelCodec, dev: torch.device, dummy: torch.Tensor,
                   dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """The key kernel's table arguments had_ptr .. dir_ptr (unused ones as `dummy`), cached on the codec per
    device and operand dtype: the Hadamard matrices and rotation signs in `dtype` (the input's for native
    16-bit dots, exact as +-1; fp32 otherwise), the QJL signs and codebooks in fp32, and the kind's own
    (`KindEncode.tables`: hadt, xib, aux, dir). Built from the codec's device tensors (no host copy).
    Not keyed on a tensor's version counter: inference tensors (a generation under torch.inference_mode)
    have none."""
    cache = codec.__dict__.setdefault("_encode_tables", {})
    key = (dev, dtype)
    if key not in cache:
        hadt, xib, aux, dir_rows = codec.kind.encode.tables(codec, dtype)
        boundaries = codec.tables.get("boundaries")
        cache[key] = (
            codec.hadamard.to(dtype),
            dummy if hadt is None else hadt,
            codec.rotation_signs.to(dtype).contiguous(),
            codec.qjl_signs if codec.has_qjl else dummy,
            codec.tables.get("centroids", dummy),
            boundaries if boundaries is not None and boundaries.numel() else dummy,
            dummy if xib is None else xib,
            dummy if aux is None else aux,
            dummy if dir_rows is None else dir_rows)
    return cache[key]


# encode_keys' second launch: near-tie groups a program, and its warps. H200, octopus at 64k tokens x 16
# heads, d=64, the whole encode_keys call (benchmarks/lab/sweep_redo_launch.py): (16, 4) against (16, 1)
# b=2 / 3 / 4: 0.3176 / 0.3719 / 0.4337 ms against 0.3276 / 0.3850 / 0.4437 (4 warps cost more instructions
# a key, 591 against 422 at b=4, but a program's one flagged group finishes sooner); 64 groups were slower.
REDO_GROUPS = 16
REDO_WARPS = 4
SMALL_BLOCK = 16  # a launch with few rows halves its default rows per program down to this
KEY_CONSTANTS_KEPT = 256  # `_key_constants` entries a codec keeps (one per launch shape)
# a unit whose T is not a multiple of the rows per program runs with each head's tokens padded to the next
# multiple (blocks within one head: no per-row head divisions or rotation-sign gathers) from this many blocks
# a head on, where the padding costs at most 1/PAD_MIN_BLOCKS of the launch's rows
PAD_MIN_BLOCKS = 8


def padded_tokens(t: int, block_t: int) -> int | None:
    """The tokens a head is numbered over when T does not fill whole blocks (None: the rows run without gaps):
    T itself when block_t divides it, else T rounded up to a multiple of block_t when T spans at least
    PAD_MIN_BLOCKS blocks (`_key_rows`' ALIGNED rows)."""
    if t % block_t == 0:
        return t
    return -(-t // block_t) * block_t if t >= PAD_MIN_BLOCKS * block_t else None


def _numbered_rows(n_rows: int, t: int, block_t: int) -> tuple[int | None, int]:
    """(T_PAD or None, the rows a key launch numbers) for n_rows = (rows of heads) x t keys: B H T_PAD with
    padded heads, else n_rows (also for an empty unit)."""
    t_pad = padded_tokens(t, block_t) if t else None
    return t_pad, (n_rows // t * t_pad if t_pad else n_rows)


def _encode_launch(d: int, config: EncodeConfig | None, codec: KernelCodec, n_rows: int | None = None,
                   device: torch.device | None = None) -> tuple[int, dict]:
    """(rows per program, launch options) of the key kernel for `codec`: its kind's launch table
    (`KindEncode.launch`, `launch_bits` at the codec's code width; head dims up to 64 take the d=64 entries,
    larger ones d=128's, d > 128 with half its rows; its register cap only where the config leaves rows and
    warps to it), its rows halved (to SMALL_BLOCK at least, 4 warps at most) while the launch has fewer than
    two programs per SM (a decode step's unit: B x H rows). The CPU interpreter pays per op, not per element,
    so it takes 128 rows. test_kernels_encode's full-size launches run each entry unhalved on the GPU."""
    cfg = config or EncodeConfig()
    enc, key = codec.kind.encode, launch_key(codec)
    rows, warps, cap = enc.launch_bits.get(key, enc.launch[key[:2]])
    if d > 128:
        rows = max(SMALL_BLOCK, rows // 2)
    if cfg.block_t is None and n_rows is not None and device is not None and device.type == "cuda":
        while rows > SMALL_BLOCK and -(-n_rows // rows) < 2 * _sm_count(device):
            rows, warps = rows // 2, min(warps, 4)
    block_t = cfg.block_t or (128 if _interpreting() else rows)
    launch = {"num_warps": cfg.num_warps or warps, "num_stages": cfg.num_stages or 1,
              "enable_fp_fusion": False}
    if cap is not None and _table_cap_applies(config):
        launch["maxnreg"] = cap
    return block_t, launch


def _table_cap_applies(config: EncodeConfig | None) -> bool:
    """Whether a launch takes its table's register cap (`KindEncode.launch_bits`, `unit_caps`): the cap goes
    with the table's own rows and warps, so not where the config sets either."""
    return config is None or (config.block_t is None and config.num_warps is None)


def _key_constants(codec: KernelCodec, native: bool, split: bool, config: EncodeConfig | None,
                   n_rows: int | None = None, device: torch.device | None = None) -> tuple[dict, int, dict]:
    """(the key kernel's compile-time arguments but CHECK and ALIGNED, rows per program, launch options) for
    `codec`: native 16-bit operands or fp32, SPLIT fp32 dots (compiled) or IEEE dots (the interpreter); a
    launch of n_rows rows on `device` (`_encode_launch`). Cached on the codec (at most KEY_CONSTANTS_KEPT
    entries): an encode_keys call otherwise spends about 20 us of host time here."""
    cache = codec.__dict__.setdefault("_key_constants", {})
    key = (native, split, config, n_rows, device)
    if key not in cache:
        if len(cache) >= KEY_CONSTANTS_KEPT:
            cache.clear()
        cache[key] = _make_key_constants(codec, native, split, config, n_rows, device)
    return cache[key]


def _make_key_constants(codec: KernelCodec, native: bool, split: bool, config: EncodeConfig | None,
                        n_rows: int | None, device: torch.device | None) -> tuple[dict, int, dict]:
    d = codec.head_dim
    n_bits, n_codes = codec.code_bits, codec.num_codes
    words, wp, kp = pack_shape(max(n_bits, 1), n_codes)
    s_words, s_wp, s_kp = pack_shape(1, d)
    block_t, launch = _encode_launch(d, config, codec, n_rows, device)
    params = dict(ENCODE_PARAMS, B_DIR=codec.param("b_dir"), B_RHO=codec.param("b_rho"))
    consts = dict(ENCODE=codec.kind.encode.codes, D=d, LOG2D=int(math.log2(d)),
                  K_BITS=n_bits, K_CODES=n_codes, K_WORDS=words if n_bits > 0 else 0, WP=wp, KP=kp,
                  **dict(params, **codec.kind.encode.constants(codec)),
                  HAS_QJL=codec.has_qjl, S_WORDS=s_words, S_WP=s_wp, S_KP=s_kp,
                  DOT_NATIVE=native, SPLIT=split, BLOCK_T=block_t)
    return consts, block_t, launch


def launch_key(codec: KernelCodec) -> tuple[int, bool, int]:
    """The key of a kind's launch table at the codec's code width (head-dim class, QJL, code bits): head dims
    up to 64 share the d=64 entries, larger ones d=128's."""
    return (64 if codec.head_dim <= 64 else 128, codec.has_qjl, codec.code_bits)


def encode_keys_triton(k: torch.Tensor, codec: KernelCodec, config: EncodeConfig | None = None) -> PackedKeys:
    """K [..., H, T, d] -> PackedKeys by the Triton key kernel, for keys the selector has checked
    (`select.encode_keys`: at least [H, T, d], the codec's heads and head dim, a float dtype; `codec` on k's
    device, its kind with an encode). `config` overrides the launch (EncodeConfig)."""
    d = codec.head_dim
    h, t = k.shape[-3], k.shape[-2]
    dev = k.device
    kc = k.contiguous()
    lead = k.shape[:-1]
    n_rows = kc.numel() // d
    interpreting = _interpreting()
    native = k.dtype != torch.float32 and not interpreting
    consts, block_t, launch = _key_constants(codec, native, not interpreting, config, n_rows, dev)
    words = consts["K_WORDS"]
    codes = torch.empty(*lead, words, device=dev, dtype=torch.int32)
    gamma = torch.empty(*lead, device=dev, dtype=torch.bfloat16)
    signs = torch.empty(*lead, consts["S_WORDS"], device=dev, dtype=torch.int32) if codec.has_qjl else None
    gamma_r = torch.empty(*lead, device=dev, dtype=torch.bfloat16) if codec.has_qjl else None
    dummy = unused_buffer(dev)
    t_pad, n_launch = _numbered_rows(n_rows, t, block_t)
    programs = triton.cdiv(n_launch, block_t)
    near_rows = codec.kind.encode.near_rows
    tables = _encode_tables(codec, dev, dummy, k.dtype if native else torch.float32)
    gamma_r16 = gamma_r.view(torch.int16) if gamma_r is not None else dummy
    # a kind with near ties (octopus): a second launch (REDO_GROUPS groups of its near_rows rows a program,
    # REDO_WARPS warps) redoes the row groups the first flags (kinds/triplet_rounding._octopus_tile)
    group = min(near_rows, block_t)
    near = dummy
    if near_rows and programs:
        near = torch.empty(programs * (block_t // group), device=dev, dtype=torch.int32)
    for exact in (1, 2) if near_rows else (0,):
        rows = group if exact == 2 else block_t
        grid = triton.cdiv(n_launch, rows)
        if exact == 2:
            grid = triton.cdiv(grid, REDO_GROUPS)
        _encode_keys_kernel[(grid,)](
            kc, h * t * d, t * d, d, codes if words else dummy, gamma.view(torch.int16),
            signs if signs is not None else dummy, gamma_r16,
            dummy, near, *tables, n_launch, t, t_pad or t, h, t, 0, 1.0 / math.sqrt(d), CHECK=False,
            ALIGNED=t_pad is not None or t % rows == 0, EXACT=exact,
            REDO_GROUPS=REDO_GROUPS if exact == 2 else 1,
            **dict(consts, BLOCK_T=rows), **(launch if exact != 2 else dict(launch, num_warps=REDO_WARPS)),
        )
    return PackedKeys(codes, gamma, signs, gamma_r)


def key_tables(codec: KernelCodec, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """The key kernel's table arguments (`_encode_tables`) on the codec's device, operands in `dtype`."""
    dev = codec.hadamard.device
    return _encode_tables(codec, dev, unused_buffer(dev), dtype)


def _unit_constants(codec: KernelCodec, bits: int, group: int, native: bool, config: EncodeConfig | None,
                    n_rows: int, device: torch.device) -> tuple[int, int, dict, torch.dtype]:
    """(key rows per program, value groups per program, the unit kernel's compile-time arguments, the value
    codes' chunk dtype), cached on the codec per value format, operand mode, launch configuration and the
    key rows per program a launch of n_rows rows takes (`_encode_launch`)."""
    cache = codec.__dict__.setdefault("_unit_constants", {})
    rows = _encode_launch(codec.head_dim, config, codec, n_rows, device)[0]
    key = (bits, group, native, config, rows)
    if key not in cache:
        d = codec.head_dim
        keys, block_t, launch = _key_constants(codec, native, not _interpreting(), config, n_rows, device)
        # values: 64 rows of d=64 (256 groups of 16) per program; with 128 rows (the values kernel's own
        # default) the value branch alone lifts the fused kernel to 142 registers, with 64 it stays at the
        # key branch's 114 (octopus b=2, sm_90, ptxas; the values kernel times 128 and 32 rows within 4%)
        block_g = max(1, (config.block_t if config and config.block_t else 64) * 64 // group)
        cap = codec.kind.encode.unit_caps.get(launch_key(codec))
        if cap is not None and _table_cap_applies(config):
            launch = {k: v for k, v in launch.items() if k != "maxnreg"}
            if cap:
                launch["maxnreg"] = cap
        unit = _CHUNK_DTYPES.get(bits, torch.uint8)
        v_words = -(-d * bits // 32)
        consts = dict(keys, GROUP=group, V_BITS=bits, ROW_UNITS=v_words * 4 // unit.itemsize, BLOCK_G=block_g,
                      **launch)
        cache[key] = (block_t, block_g, consts, unit)
    return cache[key]


def _expect(name: str, t: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    if t is None or tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous():
        got = None if t is None else (tuple(t.shape), t.dtype, "strided" if not t.is_contiguous() else "")
        raise ValueError(f"{name} must be a contiguous {dtype} buffer of shape {shape} (formats.md), "
                         f"got {got}")


def encode_unit(k: torch.Tensor, v: torch.Tensor, codec: KernelCodec, keys_out: PackedKeys,
                values_out: PackedValues, offset: int, flags: torch.Tensor | None = None,
                config: EncodeConfig | None = None) -> None:
    """Encode one unit's keys and values straight into a compressed store, in one launch.

    k, v: [B, H, T, d] (float32, float16 or bfloat16, one dtype; any strides with unit stride along d, e.g.
    views of a fused qkv projection). keys_out / values_out: the store's buffers [B, H, Tcap, ...]
    (formats.md, contiguous); tokens [offset, offset + T) are written, bit for bit what
    `encode_keys(k, codec)` and `encode_values(v, values_out.bits, values_out.group)` return (value groups
    of at least 8 channels). flags: None, or a float32 tensor of two elements on the device whose element 0
    is set to +inf when a key is NaN or infinite and element 1 when a value is NaN or beyond the fp16 range
    (|v| > 65504); nothing is read back (no host sync).

    >>> encode_unit(k, v, codec, store_keys, store_values, offset=455, flags=row)  # doctest: +SKIP
    """
    d = codec.head_dim
    if k.ndim != 4 or k.shape != v.shape or k.shape[-1] != d:
        raise ValueError(f"k and v must both be [B, H, T, {d}], got {tuple(k.shape)} and {tuple(v.shape)}")
    b, h, t, _ = k.shape
    if h != codec.num_heads:
        raise ValueError(f"keys have {h} heads, the codec was built for {codec.num_heads}")
    if k.dtype != v.dtype or k.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"k and v must share one dtype of float32, float16, bfloat16; "
                         f"got {k.dtype}, {v.dtype}")
    bits, group = values_out.bits, values_out.group
    if group < 8 or group & (group - 1) or d % group or not 1 <= bits <= 8:
        raise ValueError(f"encode_unit needs a power-of-two value group >= 8 dividing d and bits in 1..8, "
                         f"got d={d}, group={group}, bits={bits} (encode_values takes smaller groups)")
    cap = keys_out.gamma.shape[2] if keys_out.gamma is not None and keys_out.gamma.ndim == 3 else -1
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= cap - t:
        raise ValueError(f"offset {offset!r} + {t} tokens must fit the store's {cap} tokens")
    _expect("keys_out.codes", keys_out.codes, (b, h, cap, codec.code_words), torch.int32)
    _expect("keys_out.gamma", keys_out.gamma, (b, h, cap), torch.bfloat16)
    if codec.has_qjl:
        _expect("keys_out.signs", keys_out.signs, (b, h, cap, -(-d // 32)), torch.int32)
        _expect("keys_out.gamma_r", keys_out.gamma_r, (b, h, cap), torch.bfloat16)
    _expect("values_out.codes", values_out.codes, (b, h, cap, -(-d * bits // 32)), torch.int32)
    _expect("values_out.scale", values_out.scale, (b, h, cap, d // group), torch.float16)
    _expect("values_out.minimum", values_out.minimum, (b, h, cap, d // group), torch.float16)
    dev = k.device
    if flags is not None and (flags.dtype != torch.float32 or flags.numel() != 2 or flags.device != dev
                              or (flags.ndim and flags.stride(-1) != 1)):
        raise ValueError("flags must be a float32 tensor of two consecutive elements on the keys' device")
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    codec = codec.to(dev)
    dummy = unused_buffer(dev)
    native = k.dtype != torch.float32 and not _interpreting()
    n_rows = b * h * t
    block_t, block_g, consts, unit = _unit_constants(codec, bits, group, native, config, n_rows, dev)
    n_groups = n_rows * (d // group)
    t_pad, n_launch = _numbered_rows(n_rows, t, block_t)
    key_programs = -(-n_launch // block_t)
    if n_rows == 0:
        return
    _encode_unit_kernel[(key_programs + -(-n_groups // block_g),)](
        k, k.stride(0), k.stride(1), k.stride(2), v, v.stride(0), v.stride(1), v.stride(2),
        keys_out.codes if codec.code_words else dummy, keys_out.gamma.view(torch.int16),
        keys_out.signs if codec.has_qjl else dummy,
        keys_out.gamma_r.view(torch.int16) if codec.has_qjl else dummy,
        values_out.codes.view(unit), values_out.scale, values_out.minimum,
        flags if flags is not None else dummy,
        *_encode_tables(codec, dev, dummy, k.dtype if native else torch.float32),
        n_rows, t, t_pad or t, h, cap, offset, 1.0 / math.sqrt(d), key_programs, n_groups,
        CHECK=flags is not None, ALIGNED=t_pad is not None, **consts,
    )
