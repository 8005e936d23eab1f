"""Launchers (the public entry points): attention over the compressed cache; encode_keys and encode_values
live in encode_ops and are re-exported here."""

from __future__ import annotations

import dataclasses
import math

import torch
import triton.language as tl

from .adc_ops import adc_limit, attention_adc
from .codec_decode import SECTION_IDS
from .encode_ops import EncodeConfig, _interpreting, _pack_shape, encode_keys, encode_values  # noqa: F401
from .flash_decode import _attn_fwd_kernel, _merge_kernel
from .launch import _cdiv, _check_pow2, _interpreter_16bit_dot, _pow2, _sm_count, split_buffers, split_chunk
from .spec import KernelCodec, PackedKeys, PackedValues

LOG2E = 1.4426950408889634
_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
# Folded triplet rows (one 16-byte row a code: C_rho and the direction premultiplied) where the key codes have
# at most this many bits (2**n rows, 16 KiB at n = 10, octopus b=3; b=4 has n = 13), else the direction
# unfolded in registers from the xi centroids: folded rows beat the unfold at every AAR batch on the H200.
FOLDED_MAX_BITS = 10
DIR_UNFOLD, DIR_FOLDED = 0, 2  # the kernel's DIR_TABLE


@dataclasses.dataclass(frozen=True)
class AttnConfig:
    """Launch configuration of the attention kernel; a None field takes the heuristic of `attention`.

    block_m: rows (query head x token pairs) per program, 1 (no tensor cores: FMAs and row sums) or 16..256;
    block_n: keys per step; block_w: native window keys per step (default block_n; the AAR window of 75
    keys pads to 128 at 64 a step, to 80 at 16); num_warps, num_stages (software pipelining of the loads;
    1: none); programs_per_sm: the split-K count aims at this many programs per multiprocessor;
    split_min_keys: no split gets fewer compressed keys than this (default 4 * block_n); window_split: when
    the store is split, the native window gets a split of its own instead of riding on the last one (default
    True). One query row per KV head with score tables (the triplet section) runs the table-lookup kernel:
    there block_n is the keys per step of its score phase, block_v those of its value phase, num_warps and
    programs_per_sm as here.
    """

    block_m: int | None = None
    block_n: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    programs_per_sm: int | None = None
    split_min_keys: int | None = None
    window_split: bool | None = None
    block_v: int | None = None
    block_w: int | None = None

    def __post_init__(self) -> None:
        if self.block_m not in (None, 1):
            _check_pow2("block_m", self.block_m, 16, 256)
        _check_pow2("block_n", self.block_n, 16, 256)
        _check_pow2("num_warps", self.num_warps, 1, 16)
        if self.num_stages is not None and not 1 <= self.num_stages <= 4:
            raise ValueError(f"num_stages must be in 1..4, got {self.num_stages}")
        if self.programs_per_sm is not None and self.programs_per_sm < 1:
            raise ValueError(f"programs_per_sm must be >= 1, got {self.programs_per_sm}")
        _check_pow2("block_v", self.block_v, 8, 256)
        _check_pow2("block_w", self.block_w, 16, 256)
        if self.split_min_keys is not None and self.split_min_keys < 1:
            raise ValueError(f"split_min_keys must be >= 1, got {self.split_min_keys}")


def _dir_table(codec: KernelCodec) -> int:
    """The triplet section's direction decode: folded rows where the key codes have at most FOLDED_MAX_BITS
    bits, else the unfold in registers (the other sections ignore it)."""
    return DIR_FOLDED if codec.code_bits <= FOLDED_MAX_BITS else DIR_UNFOLD


def _key_tables(codec: KernelCodec) -> tuple[torch.Tensor, torch.Tensor]:
    """(tab_a, tab_b) of the attention kernel: centroids (scalar), cos/sin (polar), the folded table or the
    xi centroids, and C_rho (triplet)."""
    if codec.decode == "triplet":
        tab = codec.folded_directions() if _dir_table(codec) == DIR_FOLDED else codec.table("xi_centroids")
        return tab, codec.table("centroids")
    if codec.decode == "polar":
        return codec.polar_tables()
    cent = codec.tables.get("centroids", codec.rotation_signs)  # rotation_signs: never read (0 bits)
    return cent, cent


def _codec_constants(codec: KernelCodec) -> dict:
    """The kernel's compile-time constants that depend on the codec alone (cached on the codec)."""
    consts = codec.__dict__.get("_attn_constants")
    if consts is None:
        d = codec.head_dim
        consts = dict(DECODE=SECTION_IDS[codec.decode], D=d,
                      LP=codec.triplet_lanes if codec.decode == "triplet" else 16,
                      LOG2D=int(math.log2(d)), K_BITS=codec.code_bits, K_CODES=codec.num_codes,
                      K_WORDS=codec.code_words, B_DIR=codec.param("b_dir"), B_RHO=codec.param("b_rho"),
                      K_WP=_pow2(max(codec.code_words, 1)), HAS_QJL=codec.has_qjl, S_WP=_pow2(-(-d // 32)),
                      DIR_TABLE=_dir_table(codec))
        codec.__dict__["_attn_constants"] = consts
    return consts


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


def _launch_shape(cfg: AttnConfig, n_rows: int, d: int, length: int, t_win: int, programs_bh: int,
                  device: torch.device, folded: bool = False) -> tuple[int, int, int, bool, int, int]:
    """(block_m, block_n, num_warps, tile_words, num_splits, chunk) for n_rows rows per KV head: split s
    covers the compressed keys [s * chunk, (s + 1) * chunk), the last split the window too (alone, with
    window_split, when there is room for more programs). folded: octopus keys decode from folded rows.

    One query row (H200 sweep, octopus b=2): no tensor cores, 32 keys a step, 4 warps, word tiles, ~8
    programs per SM (1.50 ms at 128k keys x 32 heads, d=128, against 1.81-3.94 ms for the 16-row tensor-core
    variants). A block of queries: up to 128 rows (64 at d > 64), 64 keys a step, 4 warps; gathered codes
    for folded octopus rows, word tiles otherwise. The H200 sweep at AAR shapes (d=64, 16-bit operands),
    octopus b=2 at 128 rows, 64 keys a step, 4 warps: gathered codes with folded rows 0.278 ms at B=64 and
    2.105 ms at B=512, against 0.324 / 2.49 ms unfolded from word tiles, 0.288 / 2.196 ms for folded rows
    from word tiles and 0.104 / 0.748 ms for bf16 SDPA over native K/V; 8 warps, 32 or 128 keys a step, 64
    rows and 2 stages were all slower. turboquant-mse b=2 at B=64 was fastest with word tiles (0.252 ms
    against 0.280 for gathers at 128 keys x 8 warps). d=128 query blocks take the same choices untimed.
    """
    single = n_rows == 1
    block_m = cfg.block_m or (1 if single else min(max(16, _pow2(n_rows)), 128 if d <= 64 else 64))
    block_n = cfg.block_n or (32 if single or d > 64 else 64)
    if _interpreting() and cfg.block_n is None:  # per-op cost on the CPU: fewer, larger key blocks
        block_n = 128
    num_warps = cfg.num_warps or 4
    tile = not (folded and block_m > 1)
    programs = programs_bh * _cdiv(n_rows, block_m)
    want = _cdiv((cfg.programs_per_sm or 8) * _sm_count(device), programs)
    num_splits = max(1, min(want, _cdiv(length, cfg.split_min_keys or 4 * block_n)))
    num_splits, chunk = split_chunk(length, num_splits, block_n)
    if want > 1 and t_win and length and (cfg.window_split is None or cfg.window_split):
        num_splits += 1  # its chunk starts past the store: the window alone
    return block_m, block_n, num_warps, tile, num_splits, chunk


def _table_attention(q_BHTD, keys, values, length, k_window, v_window, codec, scale, num_splits, cfg):
    """The single-query score-table path (adc_ops). Defaults from the H200 sweeps at 128k keys, octopus b=2:
    d >= 128: 256 keys a score step,
    64 a value step, 8 warps, 3 programs per SM, which is what is resident under the 80-register cap, so
    the splits (floor(3 * SMs / rows) = 12 at 32 heads on 132 SMs) fill one wave: 0.229 ms against 0.29 ms
    at 17 splits (1.37 waves); d <= 64: 128 / 64, 4 warps, 8 programs per SM."""
    wide = codec.head_dim >= 128
    return attention_adc(q_BHTD, keys, values, length, k_window, v_window, codec, scale=scale,
                         num_splits=num_splits, block_k=cfg.block_n or (256 if wide else 128),
                         block_v=cfg.block_v or 64, num_warps=cfg.num_warps or (8 if wide else 4),
                         programs_per_sm=cfg.programs_per_sm or (3 if wide else 8))


def attention(q_BHTD: torch.Tensor, keys: PackedKeys, values: PackedValues, length: int,
              k_window: torch.Tensor | None, v_window: torch.Tensor | None, codec: KernelCodec,
              scale: float | None = None, num_splits: int | None = None,
              config: AttnConfig | None = None) -> torch.Tensor:
    """softmax(scale * q.[K_hat; K_win]) @ [V_hat; V_win], decoding the store in registers.

    q [B, Hq, Tq, d] (any float dtype, any strides); `keys`/`values` buffers [B, H, Tcap, ...] of
    which the first `length` tokens are valid; window K/V [B, H, Tw, d] native (None or Tw = 0: no window).
    Hq = G*H, query head h*G + g reads KV head h. Returns [B, Hq, Tq, d] in q's dtype (fp32 accumulation).
    `num_splits` forces the split-K count (default: enough programs to fill the GPU); `config` overrides the
    launch heuristic (AttnConfig). One kernel launch (plus the split merge); the query rotation and layouts
    happen in the kernel's prologue, so the host does no tensor math. One query row per KV head of a codec
    with score tables (the triplet section, a window of at most 64 tokens) runs the table-lookup kernel.

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
    if length + t_win == 0:
        raise ValueError("attention needs at least one key: the store and the window are both empty")
    dev = q_BHTD.device
    codec = codec.to(dev)
    grp = hq // h
    n_rows = grp * tq
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    cfg = config or AttnConfig()
    if adc_limit(codec, n_rows, t_win) is None:
        return _table_attention(q_BHTD, keys, values, length, k_window, v_window, codec, scale, num_splits,
                                cfg)
    folded = codec.decode == "triplet" and _dir_table(codec) == DIR_FOLDED
    block_m, block_n, warps, tile, splits, chunk = _launch_shape(cfg, n_rows, d, length, t_win, b * h, dev,
                                                                 folded)
    if num_splits is not None:
        splits, chunk = split_chunk(length, min(int(num_splits), max(1, _cdiv(length, block_n))), block_n)

    # matmul operands with tensor cores in the queries' dtype when it is 16-bit (decoded K, V and P too, as
    # flash attention does), else fp32 at IEEE precision; accumulation is fp32 always. 16-bit queries
    # project exactly in their own dtype (the map is small integers); input_precision only matters for fp32
    # operands, 16-bit ones take "tf32", tl.dot's default, as every bf16 flash-attention kernel does
    use_dot = block_m >= 16
    q16 = use_dot and q_BHTD.dtype in (torch.bfloat16, torch.float16)
    opd = q_BHTD.dtype if q16 else torch.float32
    prec = "ieee" if opd == torch.float32 else "tf32"
    qmap = codec.query_map(q_BHTD.dtype if q16 else torch.float32)
    # At d >= 128 the d-wide score dots (all but the triplet section's, and the QJL term) run as two of d/2,
    # the 64-deep shape the triplet dots have: with d-wide dots and bf16 operands the H200 gave relative RMS
    # errors of 1.6e-2..2.5e-2 at d = 128, with halves 1.7e-3..2.0e-3, within tolerance.
    halves = d >= 128 and (codec.has_qjl or codec.decode != "triplet")
    interpreting = _interpreting()
    if interpreting:
        _interpreter_16bit_dot()
    if q_BHTD.stride(-1) != 1:
        q_BHTD = q_BHTD.contiguous()
    if not t_win:  # any tensor serves as the never-read window
        k_window = v_window = q_BHTD
    if k_window.stride(-1) != 1:
        k_window = k_window.contiguous()
    if v_window.stride(-1) != 1:
        v_window = v_window.contiguous()
    tab_a, tab_b = _key_tables(codec)
    qk_scale = scale * LOG2E
    rot_scale, qjl_scale = qk_scale / math.sqrt(d), qk_scale * math.sqrt(math.pi / (2 * d)) / d

    total_rows = b * h * n_rows
    out = torch.empty(b, hq, tq, d, device=dev, dtype=q_BHTD.dtype)
    direct = splits == 1
    opart, lse = split_buffers(out, splits, total_rows, d)
    signs = keys.signs if codec.has_qjl else keys.codes
    gamma_r = keys.gamma_r if codec.has_qjl else keys.gamma
    _attn_fwd_kernel[(b * h, _cdiv(n_rows, block_m), splits)](
        q_BHTD, q_BHTD.stride(0), q_BHTD.stride(1), q_BHTD.stride(2), qmap,
        keys.codes.contiguous(), keys.gamma.contiguous(), signs.contiguous(), gamma_r.contiguous(),
        values.codes.contiguous(), values.scale.contiguous(), values.minimum.contiguous(),
        k_window, v_window, k_window.stride(0), k_window.stride(1), k_window.stride(2),
        v_window.stride(0), v_window.stride(1), v_window.stride(2),
        tab_a, tab_b,
        out, opart, lse,
        h, grp, tq, n_rows, t_cap, length, t_win, chunk, splits, total_rows,
        qk_scale, rot_scale, qjl_scale,
        **_codec_constants(codec), NP=qmap.shape[-1],
        V_GROUP=values.group, V_BITS=values.bits, V_WORDS=values.codes.shape[-1],
        V_WP=_pow2(values.codes.shape[-1]), TILE=tile,
        DIRECT=direct, BLOCK_M=block_m, BLOCK_N=block_n, PREC=prec,
        PREC_Q="ieee" if qmap.dtype == torch.float32 else "tf32",
        OPD=_TL_DTYPES[opd], RNE_BY_HAND=interpreting, HALVES=halves,
        K_WP2=_pow2(max(1, d * codec.code_bits // 64)), BLOCK_W=cfg.block_w or block_n, num_warps=warps,
        num_stages=cfg.num_stages or 1,
    )
    if not direct:
        block_r = 32
        _merge_kernel[(_cdiv(total_rows, block_r),)](opart, lse, out, total_rows, splits, D=d,
                                                           BLOCK_R=block_r, num_warps=4)
    return out
