"""Value encode: group-quantized values (fp16 scale and minimum per group) into the packed state, the kernels
and their launcher `encode_values`; the fused unit encode (encode.py) reuses the group kernel."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .bits import pack_codes, round_half_even
from .launch import EncodeConfig, _interpreting, _outside_autocast, pack_shape, unused_buffer
from .spec import V_GROUP, PackedValues


@triton.jit
def mark_bad(flag_ptr):
    """Record a bad input in the one-element flag at flag_ptr: +inf in a float32 flag (the cache's deferred
    record, where anything not finite reads as bad), 1 in an int32 flag. Every program that sees a bad value
    stores the same thing, so no atomic is needed."""
    if flag_ptr.dtype.element_ty == tl.float32:
        tl.store(flag_ptr, float("inf"))
    else:
        tl.store(flag_ptr, 1)


@triton.jit
def unit_rows(rows, T, H, T_OUT, OFFSET, stride_b, stride_h, stride_t):
    """Row r of a unit [B, H, T, .] (r = (b * H + h) * T + t) -> (element offset of its first channel in the
    input, whose strides are given, its row in a store [B, H, T_OUT, .] at token OFFSET + t, its head)."""
    bh = rows // T
    t = rows - bh * T
    head = bh % H
    src = (bh // H) * stride_b + head * stride_h + t * stride_t
    return src, bh * T_OUT + OFFSET + t, head


@triton.jit
def _round_code(a, s, inv_s, MAXC: tl.constexpr):
    """clamp(round_half_even(RN(a / s)), 0, MAXC) for s > 0 (an fp16 value) and |a| < 2**17, without a
    division per element. q0 = a * inv_s is within a few ulps of a / s (inv_s ~ 1/s), so the code is k or k+1,
    k = floor(clamp(q0)), split at y = k + 1/2. RN(a/s) > y exactly when a/s > y + ulp(y)/2 (a tie there goes
    to y, whose last bit is 0), i.e. a - y*s > s*ulp(y)/2; y*s is exact (<= 9 + 11 bits) and the fma rounds
    a - y*s once, exactly wherever the comparison is close (Sterbenz), so the test is exact. RN(a/s) == y
    (a tie, to even) adds 1 when k is odd (then y is not a power of two: the lower threshold is the same)."""
    q0 = tl.minimum(tl.maximum(a * inv_s, 0.0), MAXC * 1.0)
    k = tl.floor(q0)
    y = k + 0.5
    d1 = tl.fma(y, -s, a)
    half_ulp = ((y.to(tl.int32, bitcast=True) & 0x7F800000) - (24 << 23)).to(tl.float32, bitcast=True)
    thr = half_ulp * s
    ki = k.to(tl.int32)
    up = (d1 > thr) | (((ki & 1) != 0) & (d1 >= -thr))
    return tl.minimum(ki + up.to(tl.int32), MAXC)


@triton.jit(do_not_specialize=["n_groups", "T", "OFFSET"])
def _encode_values_kernel(v_ptr, stride_vb, stride_vh, stride_vt, codes_ptr, scale_ptr, min_ptr, flag_ptr,
                          n_groups, T, H, T_OUT, OFFSET,
                          D: tl.constexpr, GROUP: tl.constexpr, BITS: tl.constexpr, ROW_UNITS: tl.constexpr,
                          BLOCK_G: tl.constexpr, CHECK: tl.constexpr):
    """Values in groups of GROUP >= 8 channels, BLOCK_G groups per program (`encode_value_groups`)."""
    encode_value_groups(tl.program_id(0), v_ptr, stride_vb, stride_vh, stride_vt, codes_ptr, scale_ptr,
                         min_ptr, flag_ptr, n_groups, T, H, T_OUT, OFFSET, D, GROUP, BITS, ROW_UNITS, BLOCK_G,
                         CHECK)


@triton.jit
def encode_value_groups(pid, v_ptr, stride_vb, stride_vh, stride_vt, codes_ptr, scale_ptr, min_ptr, flag_ptr,
                         n_groups, T, H, T_OUT, OFFSET,
                         D: tl.constexpr, GROUP: tl.constexpr, BITS: tl.constexpr, ROW_UNITS: tl.constexpr,
                         BLOCK_G: tl.constexpr, CHECK: tl.constexpr):
    """Groups [BLOCK_G] (block `pid`) of GROUP (>= 8) channels of a unit V [B, H, T, D] (group g is channels
    [(g % (D / GROUP)) * GROUP, +GROUP) of row g // (D / GROUP), rows as in `unit_rows`; strides given, unit
    stride along D) -> mn = fp16(min), scale = fp16(min((max-min)/(2^b-1), 65504)) (1 where that is 0),
    code = clamp(round((v - mn) / scale), 0, 2^b - 1) as in fp32 with ties to even (`_round_code`), written
    to rows (b * H + h) * T_OUT + OFFSET + t of the outputs. A group is HC chunks of 8 channels; chunk i's
    8 codes are 8*BITS bits = BITS bytes of the little-endian stream, written with one store per chunk
    (codes_ptr typed uint8, int16, int32, int64 for BITS = 1, 2, 4, 8; otherwise uint8 and byte by byte);
    rows start ROW_UNITS elements of codes_ptr apart. CHECK: any |v| > 65504 or NaN sets the flag
    (`mark_bad`)."""
    HC: tl.constexpr = GROUP // 8
    GPR: tl.constexpr = D // GROUP
    MAXC: tl.constexpr = (1 << BITS) - 1
    g = pid * BLOCK_G + tl.arange(0, BLOCK_G)
    ok = g < n_groups
    row = g // GPR
    j = g - row * GPR  # the group's index within its row
    src, dst, _ = unit_rows(row, T, H, T_OUT, OFFSET, stride_vb, stride_vh, stride_vt)
    h = tl.arange(0, HC)[None, :, None]
    c = tl.arange(0, 8)[None, None, :]
    v = tl.load(v_ptr + (src + j * GROUP)[:, None, None] + h * 8 + c, mask=ok[:, None, None], other=0.0)
    v = v.to(tl.float32)
    if CHECK:
        if tl.max(tl.max(tl.max((~(tl.abs(v) <= 65504.0)).to(tl.int32), 2), 1), 0) > 0:
            mark_bad(flag_ptr)
    mx = tl.max(tl.max(v, 2), 1)
    mn = tl.min(tl.min(v, 2), 1)
    mn16 = mn.to(tl.float16)
    sc16 = tl.minimum(tl.math.div_rn(mx - mn, MAXC * 1.0), 65504.0).to(tl.float16)
    sc16 = tl.where(sc16 == 0, 1.0, sc16.to(tl.float32)).to(tl.float16)
    tl.store(scale_ptr + dst * GPR + j, sc16, mask=ok)
    tl.store(min_ptr + dst * GPR + j, mn16, mask=ok)
    s = sc16.to(tl.float32)[:, None, None]
    a = v - mn16.to(tl.float32)[:, None, None]
    code = _round_code(a, s, 1.0 / s, MAXC)
    if (BITS == 1) or (BITS == 2) or (BITS == 4):
        val = tl.sum(code << (c * BITS), 2)
    else:
        val = tl.sum(code.to(tl.int64) << (c * BITS).to(tl.int64), 2)
    chunk = j[:, None] * HC + tl.arange(0, HC)[None, :]
    okc = ok[:, None]
    if (BITS == 1) or (BITS == 2) or (BITS == 4) or (BITS == 8):
        # codes_ptr has the element type of one chunk (BITS bytes): one store per chunk
        tl.store(codes_ptr + dst[:, None] * ROW_UNITS + chunk, val.to(codes_ptr.dtype.element_ty),
                 mask=okc)
    else:
        p = tl.arange(0, 8)[None, None, :]
        piece = ((val[:, :, None] >> (p * 8)) & 255).to(tl.uint8)
        byte = dst[:, None] * ROW_UNITS + chunk * BITS
        tl.store(codes_ptr + byte[:, :, None] + p, piece, mask=okc[:, :, None] & (p < BITS))


@triton.jit(do_not_specialize=["n_rows"])
def _encode_values_any_group_kernel(v_ptr, codes_ptr, scale_ptr, min_ptr, n_rows,
                          D: tl.constexpr, GROUP: tl.constexpr, BITS: tl.constexpr, WORDS: tl.constexpr,
                          WP: tl.constexpr, KP: tl.constexpr, BLOCK_T: tl.constexpr):
    """(Groups of fewer than 8 channels.) Rows of V [n_rows, D] -> per group of GROUP channels:
    mn = fp16(min), scale = fp16(min((max-min)/(2^b-1), 65504)) (1 where that is 0),
    code = clamp(round((v - mn) / scale), 0, 2^b - 1) in fp32, ties to even."""
    G: tl.constexpr = D // GROUP
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = rows < n_rows
    dcol = tl.arange(0, D)[None, :]
    v = tl.load(v_ptr + rows[:, None] * D + dcol, mask=ok[:, None], other=0.0).to(tl.float32)
    g = tl.reshape(v, (BLOCK_T, G, GROUP))
    mx = tl.max(g, 2)
    mn = tl.min(g, 2)
    mn16 = mn.to(tl.float16)
    sc16 = tl.minimum(tl.math.div_rn(mx - mn, (1 << BITS) - 1.0), 65504.0).to(tl.float16)
    sc16 = tl.where(sc16 == 0, 1.0, sc16.to(tl.float32)).to(tl.float16)
    q = tl.math.div_rn(g - mn16.to(tl.float32)[:, :, None], sc16.to(tl.float32)[:, :, None])
    code = tl.minimum(tl.maximum(round_half_even(q), 0.0), (1 << BITS) - 1.0).to(tl.int32)
    words = pack_codes(tl.reshape(code, (BLOCK_T, D)), 0, D, BITS, WP, KP)
    wcol = tl.arange(0, WP)[None, :]
    tl.store(codes_ptr + rows[:, None] * WORDS + wcol, words, mask=ok[:, None] & (wcol < WORDS))
    gcol = rows[:, None] * G + tl.arange(0, G)[None, :]
    tl.store(scale_ptr + gcol, sc16, mask=ok[:, None])
    tl.store(min_ptr + gcol, mn16, mask=ok[:, None])


def _values_launch(group: int, config: EncodeConfig | None) -> tuple[int, dict]:
    """(groups per program, launch options) of the values kernel. `config.block_t` counts rows of d=64
    (4 groups of 16): block_t rows = 4 * block_t groups of 16 channels. Default 128 rows (the
    H200 sweep, values b=2 at 64k tokens x 16 heads: 0.070 ms = 56% of copy bandwidth; 32 rows 0.073)."""
    cfg = config or EncodeConfig()
    rows = cfg.block_t or 128
    return max(1, rows * 64 // group), {"num_warps": cfg.num_warps or 4, "num_stages": cfg.num_stages or 1,
                                        "enable_fp_fusion": False}


def _any_group_launch(d: int, config: EncodeConfig | None) -> tuple[int, dict]:
    """(rows per program, launch options) of the kernel for groups of fewer than 8 channels: 32 rows (16 above
    d=64); the CPU interpreter pays per op, not per element, so it takes 128 rows."""
    cfg = config or EncodeConfig()
    block_t = cfg.block_t or (128 if _interpreting() else (16 if d > 64 else 32))
    launch = {"num_warps": cfg.num_warps or 4, "num_stages": cfg.num_stages or 1, "enable_fp_fusion": False}
    return block_t, launch

_CHUNK_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

_RANGE_MESSAGE = "values must be finite and within the fp16 range |v| <= 65504, got {}"


@_outside_autocast
def encode_values(v: torch.Tensor, bits: int, group: int = V_GROUP, check_range: bool = True,
                  config: EncodeConfig | None = None, range_flag: torch.Tensor | None = None) -> PackedValues:
    """V [..., H, T, d] (any float dtype, |v| <= 65504) -> PackedValues: `codes` [..., H, T, ceil(d*bits/32)]
    int32, `scale`/`minimum` [..., H, T, d/group] fp16.

    The range check runs inside the kernel. `check_range=True` reads its flag back (one host sync after the
    kernel) and raises ValueError for a value beyond the fp16 range or NaN; `check_range=False` skips it;
    `range_flag` (an int32 tensor of one element on v's device) makes the kernel set it to 1 on a bad value
    and leaves reading it to the caller (no sync; `check_range` is then ignored).
    """
    d = v.shape[-1]
    if group < 1 or group & (group - 1) or d % group or not 1 <= bits <= 8:
        raise ValueError(f"values need a power-of-two group dividing d and bits in 1..8, got d={d}, "
                         f"group={group}, bits={bits}")
    if v.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"values must be float32, float16 or bfloat16, got {v.dtype}")
    if range_flag is not None and (range_flag.dtype != torch.int32 or range_flag.numel() != 1
                                   or range_flag.device != v.device):
        raise ValueError("range_flag must be an int32 tensor of one element on the values' device")
    vc = v.contiguous()
    lead = v.shape[:-1]
    n_rows = vc.numel() // d
    words, wp, kp = pack_shape(bits, d)
    dev = v.device
    alloc = torch.empty if (d * bits) % 32 == 0 else torch.zeros  # padding bytes of the last word stay 0
    codes = alloc(*lead, words, device=dev, dtype=torch.int32)
    scale = torch.empty(*lead, d // group, device=dev, dtype=torch.float16)
    minimum = torch.empty_like(scale)
    if group < 8:
        if check_range and v.numel() and not bool(v.abs().max().float() <= 65504.0):
            raise ValueError(_RANGE_MESSAGE.format(float(v.abs().max())))
        block_t, launch = _any_group_launch(d, config)
        _encode_values_any_group_kernel[(triton.cdiv(max(n_rows, 1), block_t),)](
            vc, codes, scale, minimum, n_rows, D=d, GROUP=group, BITS=bits, WORDS=words, WP=wp, KP=kp,
            BLOCK_T=block_t, **launch)
        return PackedValues(codes, scale, minimum, bits, group)
    check = range_flag is not None or check_range
    if range_flag is not None:
        flag = range_flag
    else:  # without a check the flag is never written
        flag = torch.zeros(1, device=dev, dtype=torch.int32) if check else unused_buffer(dev)
    n_groups = n_rows * (d // group)
    block_g, launch = _values_launch(group, config)
    unit = _CHUNK_DTYPES.get(bits, torch.uint8)
    rows = max(n_rows, 1)  # a contiguous [rows, d]: one "head" of `rows` tokens
    _encode_values_kernel[(triton.cdiv(max(n_groups, 1), block_g),)](
        vc, rows * d, rows * d, d, codes.view(unit), scale, minimum, flag, n_groups, rows, 1, rows, 0,
        D=d, GROUP=group, BITS=bits, ROW_UNITS=words * 4 // unit.itemsize, BLOCK_G=block_g, CHECK=check,
        **launch)
    if check_range and range_flag is None and v.numel() and bool(flag.item()):
        raise ValueError(_RANGE_MESSAGE.format(float(v.abs().max())))
    return PackedValues(codes, scale, minimum, bits, group)
