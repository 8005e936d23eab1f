"""One-row score tables: one query row per KV head from per-query score tables, the attention kernel and its
launcher `attention_adc` (`table_attention` at its default launch).

Supports one query row a KV head, a kind with score tables (`DecodeKind.score_tables`), codes to look up,
tables of at most MAX_ENTRIES entries a code and a window of at most MAX_WINDOW tokens (`adc_limit` says why
not).

With one query row per KV head the decoded key is used exactly once, so decoding it is waste: the score
of key n is a sum of terms that each depend only on one code of the key,

    q . k_n = gamma_n * sum_i rho(c_ni) * (q_rot,i . n_hat(dir(c_ni)))           (octopus, formats.md)

so a table T[i, c] = qk_scale * rho(c) * (q_rot,i . n_hat(dir(c))) built once per query row turns the key loop
into one lookup and one add per triplet (asymmetric distance computation, as in product quantization). Each
kind lays out and builds its tables and scores a step of keys from them (its `KindTables`: the scalar kind
groups adjacent coordinates into one table code, the polar kind folds the angle tree above a subtree's
table; octopus_audio/kernels/tables.py holds the shared steps). The QJL term (R' q_rot) . sigma_n takes a
second table over the sign bytes: S[p, e] = qk_scale * sum_t q_j[8p + t] * (2 bit_t(e) - 1), one lookup per
8 signs. Tables live in global memory and are read through L1 (a row's table is 11-22 KB at d = 64-128,
b = 2, octopus; 5.5-11 KB turboquant-mse).

Two phases per program, so each runs in the layout that suits it (one key a thread for the scores, keys x
channels for the values) with few registers and no per-block cross-thread reductions:
1. scores: each thread owns whole keys, loads a key's code words once each and cuts the codes with
   compile-time shifts (the unrolled loops), adds one table entry per code; the scores (log2 units,
   4 bytes a key) go to a scratch row, and their maximum m is kept.
2. values: p_n = 2^(s_n - m) (an exact two-pass softmax: m is known), and sum_n p_n (c_nj scale_ng +
   min_ng) accumulated elementwise per thread and reduced once at the end. Group-16 values up to 8 bits
   (`values_in_place`): a channel costs one mask and one FMA, the code masked where it lies read as an fp32
   subnormal (c * 2^pos * 2^-149, exact) and the per-column power of two removed after the loop; other value
   formats cut each key's word tile (`values_by_key`).
For group-16 values the phases alternate by stages of STAGE_K keys (an online softmax by stages: the running
maximum rescales the accumulators when it grows), so warps done with a stage's values score the next stage
while others still accumulate, and the scores are re-read while still in L2.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..bits import store_rounded
from ..launch import AttnConfig, _cdiv, _interpreting, _pow2, _sm_count, split_buffers, split_chunk
from ..spec import KernelCodec, PackedKeys, PackedValues
from ..tables import TableLayout, build_tables
from ..value_decode import in_place_sum, values_by_key, values_in_place

NAME = "score-tables"


@triton.jit(do_not_specialize=["total_rows", "n_splits"])
def _merge_splits_kernel(opart_ptr, lse_ptr, out_ptr, total_rows, n_splits, D: tl.constexpr,
                         BLOCK_S: tl.constexpr):
    """out[r] = sum_s 2^(lse_s - m) o_s / sum_s 2^(lse_s - m), one program per row r, BLOCK_S splits a step
    (flash_decode's merge with the splits, not the rows, across the threads: a few long rows here)."""
    r = tl.program_id(0)
    sp = tl.arange(0, BLOCK_S)
    dcol = tl.arange(0, D)
    m = tl.full((), float("-inf"), tl.float32)
    for s0 in range(0, n_splits, BLOCK_S):
        ok = s0 + sp < n_splits
        lse = tl.load(lse_ptr + (s0 + sp) * total_rows + r, mask=ok, other=float("-inf"))
        m = tl.maximum(m, tl.max(lse, 0))
    m = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros((D,), tl.float32)
    den = tl.zeros((), tl.float32)
    for s0 in range(0, n_splits, BLOCK_S):
        ok = s0 + sp < n_splits
        part = (s0 + sp) * total_rows + r
        w = tl.exp2(tl.load(lse_ptr + part, mask=ok, other=float("-inf")) - m)
        o = tl.load(opart_ptr + part[:, None] * D + dcol[None, :], mask=ok[:, None], other=0.0)
        acc += tl.sum(w[:, None] * o, axis=0)
        den += tl.sum(w, 0)
    store_rounded(out_ptr + r * D + dcol, acc / tl.where(den > 0, den, 1.0), None)


@triton.jit
def _store_scores(lut_ptr, qlut_ptr, rho_ptr, kc_ptr, kg_ptr, ks_ptr, kr_ptr, s_ptr, r, start, end, qjl_coef,
                  zero, D: tl.constexpr, L: tl.constexpr, K_BITS: tl.constexpr, K_WORDS: tl.constexpr,
                  B_RHO: tl.constexpr, N_ENTRIES: tl.constexpr, FOLD_RHO: tl.constexpr, HAS_QJL: tl.constexpr,
                  BLOCK_K: tl.constexpr, PAIRS: tl.constexpr, SCORE_STEP: tl.constexpr, LEVELS: tl.constexpr,
                  A_BITS: tl.constexpr, LOG2D: tl.constexpr):
    """Phase 1: the scores (log2 units) of compressed keys [start, end) of row r into s_ptr; their maximum.
    The key pointers (kc, kg, ks, kr) and s_ptr point at row r already; the tables are indexed by r.

    A thread owns whole keys: it loads each code word of its key once and cuts the codes with constant
    shifts (the unrolled loops), then adds one table entry per code (and one per 8 QJL signs): the kind's
    SCORE_STEP (tables.sum_step gives its signature). Whole steps run without load masks, the tail step with
    them."""
    row_lut = lut_ptr + r * (L * N_ENTRIES)
    if not FOLD_RHO:
        rho0 = tl.load(rho_ptr)
        rho1 = tl.load(rho_ptr + 1)
    else:
        rho0 = 1.0
        rho1 = 1.0
    m_vec = tl.full((BLOCK_K,), float("-inf"), tl.float32)
    full = start + (end - start) // BLOCK_K * BLOCK_K
    for n0 in range(start, full, BLOCK_K):
        m_vec = SCORE_STEP(row_lut, qlut_ptr, rho_ptr, kc_ptr, kg_ptr, ks_ptr, kr_ptr, s_ptr, r, n0, end,
                           qjl_coef, zero, m_vec, rho0, rho1, D, L, K_BITS, K_WORDS, B_RHO, N_ENTRIES,
                           FOLD_RHO, HAS_QJL, BLOCK_K, PAIRS, LEVELS, A_BITS, LOG2D, False)
    if full < end:
        m_vec = SCORE_STEP(row_lut, qlut_ptr, rho_ptr, kc_ptr, kg_ptr, ks_ptr, kr_ptr, s_ptr, r, full, end,
                           qjl_coef, zero, m_vec, rho0, rho1, D, L, K_BITS, K_WORDS, B_RHO, N_ENTRIES,
                           FOLD_RHO, HAS_QJL, BLOCK_K, PAIRS, LEVELS, A_BITS, LOG2D, True)
    return tl.max(m_vec, 0)


@triton.jit
def _window_scores(qn_ptr, kw_base, stride_kwt, r, t_win, qk_scale, D: tl.constexpr, BLOCK_W: tl.constexpr):
    """Scores (log2 units) of the first BLOCK_W native window keys, -inf past t_win."""
    n = tl.arange(0, BLOCK_W)
    n_ok = n < t_win
    dcol = tl.arange(0, D)
    qn = tl.load(qn_ptr + r * D + dcol).to(tl.float32)
    kt = tl.load(kw_base + n[:, None] * stride_kwt + dcol[None, :], mask=n_ok[:, None], other=0.0)
    return tl.where(n_ok, tl.sum(kt.to(tl.float32) * qn[None, :], axis=1) * qk_scale, float("-inf"))


# the per-call integers used only in bounds, masks and split indices are not specialised on (== 1, % 16), as
# flash.PER_CALL_INTS: a decode step's store length and window, the split count and the rows; t_cap (row base
# of the score scratch), chunk (a split's first key) and the strides keep it (they align vector accesses)
@triton.jit(do_not_specialize=["t_comp", "t_win", "n_splits", "total_rows"])
def _adc_attn_kernel(
    lut_ptr, qlut_ptr, qn_ptr, rho_ptr,
    kc_ptr, kg_ptr, ks_ptr, kr_ptr,
    vc_ptr, vs_ptr, vm_ptr,
    kw_ptr, vw_ptr, stride_kwb, stride_kwh, stride_kwt, stride_vwb, stride_vwh, stride_vwt,
    s_ptr, out_ptr, opart_ptr, lse_ptr,
    H, t_cap, t_comp, t_win, chunk, n_splits, total_rows, qk_scale, qjl_coef, zero,
    D: tl.constexpr, L: tl.constexpr, K_BITS: tl.constexpr, K_WORDS: tl.constexpr, B_RHO: tl.constexpr,
    N_ENTRIES: tl.constexpr, FOLD_RHO: tl.constexpr, HAS_QJL: tl.constexpr,
    V_GROUP: tl.constexpr, V_BITS: tl.constexpr, V_WORDS: tl.constexpr, V_WP: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_W: tl.constexpr, DIRECT: tl.constexpr,
    V_GT: tl.constexpr, STAGE_K: tl.constexpr, SCORE_STEP: tl.constexpr, LEVELS: tl.constexpr,
    A_BITS: tl.constexpr,
    LOG2D: tl.constexpr, VALUE_STAGES: tl.constexpr,
):
    """One (query row, split) program: score tables instead of decoded keys (module docstring).

    Split s covers compressed keys [s*chunk, (s+1)*chunk); the last split also covers the native window
    (at most BLOCK_W keys, score q . k * qk_scale). Phase 1 writes the split's scores to s_ptr (row r,
    t_cap entries) and takes their maximum m; phase 2 (after a barrier) reads them back and accumulates
    p = 2^(s - m) times the dequantized values, elementwise per thread, reduced once at the end. DIRECT:
    one split writes the normalised output; otherwise o/l and the log2-sum-exp go to the partial buffers
    of the merge kernel. Group-16 values up to 8 bits go through values_in_place (V_GT groups of a key a
    thread row; widths not dividing 32 need V_GT = 2), the split in stages of STAGE_K keys, each scored, then
    its values accumulated, the accumulators rescaled when the running maximum grows; other value formats
    through values_by_key after the whole split is scored. SCORE_STEP: the kind's score step (LEVELS, A_BITS:
    the polar kind's bottom levels a table code and bits an angle; rho_ptr: the kind's `KindTables.aux` table,
    C_rho or the angles' cos | sin pairs). The score phase loads code words two at a time
    where a key has an even number of them (PAIRS) and predicates its table reads on all of a step's loads
    (`zero` must be 0; _score_step).
    """
    r = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = r // H
    h = r % H
    G: tl.constexpr = D // V_GROUP
    row = r.to(tl.int64) * t_cap
    start = pid_s * chunk
    end = tl.minimum(start + chunk, t_comp)
    s_row = s_ptr + row
    last = pid_s == n_splits - 1
    n_win = tl.where(last, t_win, 0)
    kw_base = kw_ptr + b * stride_kwb + h * stride_kwh
    PAIRS: tl.constexpr = K_WORDS % 2 == 0  # odd rows are not 8-byte aligned: a pair would need a conversion
    IN_PLACE: tl.constexpr = (V_GROUP == 16) and (V_BITS <= 8) and ((32 % V_BITS == 0) or (V_GT == 2))
    if IN_PLACE:
        # stages of STAGE_K keys: scores, then their values, the running maximum
        # rescaling the accumulators when it grows (an online softmax by stages, exact like the two-pass one)
        R: tl.constexpr = BLOCK_V * G // V_GT
        acc_t = tl.zeros((R, 16 * V_GT), tl.float32)
        acc_min = tl.zeros((R, V_GT), tl.float32)
        l_vec = tl.zeros((R, 1), tl.float32)
        m_run = tl.full((), float("-inf"), tl.float32)
        for c0 in range(start, end, STAGE_K):
            c1 = tl.minimum(c0 + STAGE_K, end)
            m_c = _store_scores(lut_ptr, qlut_ptr, rho_ptr, kc_ptr + row * K_WORDS, kg_ptr + row,
                                ks_ptr + row * (D // 32), kr_ptr + row, s_row, r, c0, c1, qjl_coef, zero,
                                D, L, K_BITS, K_WORDS, B_RHO, N_ENTRIES, FOLD_RHO, HAS_QJL, BLOCK_K, PAIRS,
                                SCORE_STEP, LEVELS, A_BITS, LOG2D)
            tl.debug_barrier()
            if m_c > m_run:
                alpha = tl.exp2(m_run - m_c)  # 0 at the first stage
                acc_t *= alpha
                acc_min *= alpha
                l_vec *= alpha
                m_run = m_c
            acc_t, acc_min, l_vec = values_in_place(vc_ptr + row * V_WORDS, vs_ptr + row * G,
                                                     vm_ptr + row * G, s_row, m_run, c0, c1, acc_t, acc_min,
                                                     l_vec, G, V_BITS, BLOCK_V, V_GT, VALUE_STAGES)
        s_win = _window_scores(qn_ptr, kw_base, stride_kwt, r, n_win, qk_scale, D, BLOCK_W)
        m = tl.maximum(m_run, tl.max(s_win, 0))
        m = tl.where(m == float("-inf"), 0.0, m)
        alpha = tl.exp2(m_run - m)
        acc, l_i = in_place_sum(acc_t * alpha, acc_min * alpha, l_vec * alpha, G, V_BITS, BLOCK_V, V_GT)
    else:
        m = _store_scores(lut_ptr, qlut_ptr, rho_ptr, kc_ptr + row * K_WORDS, kg_ptr + row,
                          ks_ptr + row * (D // 32), kr_ptr + row, s_row, r, start, end, qjl_coef, zero,
                          D, L, K_BITS, K_WORDS, B_RHO, N_ENTRIES, FOLD_RHO, HAS_QJL, BLOCK_K, PAIRS,
                          SCORE_STEP, LEVELS, A_BITS, LOG2D)
        s_win = _window_scores(qn_ptr, kw_base, stride_kwt, r, n_win, qk_scale, D, BLOCK_W)
        m = tl.maximum(m, tl.max(s_win, 0))
        m = tl.where(m == float("-inf"), 0.0, m)
        tl.debug_barrier()

        # phase 2: sum_n p_n (c_nj * scale_ng + min_ng)
        acc, l_i = values_by_key(vc_ptr + row * V_WORDS, vs_ptr + row * G, vm_ptr + row * G, s_row, m,
                                  start, end, D, V_GROUP, V_BITS, V_WORDS, V_WP, BLOCK_V)

    # the native window (last split)
    p_win = tl.exp2(s_win - m)
    l_i += tl.sum(p_win, 0)
    wn = tl.arange(0, BLOCK_W)
    dcol = tl.arange(0, D)
    vw_base = vw_ptr + b * stride_vwb + h * stride_vwh
    vt = tl.load(vw_base + wn[:, None] * stride_vwt + dcol[None, :], mask=(wn < n_win)[:, None], other=0.0)
    pv = tl.reshape(vt.to(tl.float32), (BLOCK_W, G, V_GROUP)) * tl.reshape(p_win, (BLOCK_W, 1, 1))
    acc += tl.sum(pv, axis=0)

    o = tl.reshape(acc, (D,)) / tl.where(l_i > 0, l_i, 1.0)
    if DIRECT:
        store_rounded(out_ptr + r * D + dcol, o, None)
    else:
        part = pid_s * total_rows + r
        tl.store(opart_ptr + part * D + dcol, o)
        tl.store(lse_ptr + part, m + tl.log2(l_i))


LOG2E = 1.4426950408889634


MAX_ENTRIES = 4096  # larger tables (octopus with b_dir >= 7) leave one query row to split-K

MAX_WINDOW = 64

STAGE_KEYS = 1024  # keys scored before their values are accumulated (group-16 values)

# a register cap where a thread holds one value row and the key loop fits under it (the kind says:
# `KindTables.capped`): it keeps 3 programs of 8 warps on an SM with the gated loads, without spills (sm_90,
# d=64 and 128). Two value rows a thread spill under it, so those run uncapped
MAX_REGISTERS = 80


def adc_limit(codec: KernelCodec, n_rows: int, t_win: int = 0, group: int | None = None) -> str | None:
    """Why the table path cannot serve this call (None when it can): one query row, a codec of a kind with
    score tables with codes to look up and tables of at most MAX_ENTRIES entries a code, a native window of at
    most MAX_WINDOW tokens. `group`: attention_adc's."""
    if t_win > MAX_WINDOW:
        return f"a native window of {t_win} tokens (at most {MAX_WINDOW})"
    if n_rows != 1:
        return f"{n_rows} query rows per KV head (the table path takes 1)"
    tables = codec.kind.score_tables
    if tables is None:
        return f"the {codec.kind.name} kind (it has no score tables)"
    if codec.code_bits == 0:
        return "keys without codes (0 bits a code: nothing to look up)"
    if group is not None and (not tables.groups or not isinstance(group, int) or group < 1):
        return f"group={group!r} (a positive number of coordinates, for a kind that groups them: scalar)"
    entries = tables.layout(codec, group).entries
    if entries > MAX_ENTRIES:
        return f"{tables.what} of {entries} entries a code (at most {MAX_ENTRIES})"
    return None


def attention_constants(codec: KernelCodec, lay: TableLayout, values: PackedValues, t_win: int, block_k: int,
                        block_v: int, num_warps: int, value_stages: int = 0) -> tuple[dict, dict]:
    """The attention kernel's compile-time constants but DIRECT, and its launch options (num_warps, the
    register cap), as attention_adc launches it. A thread takes two value groups of a key per row where a
    step still has a row for every thread (always for widths not dividing 32), else one; with one row a
    thread and a key loop that fits (MAX_REGISTERS' comment) the kernel runs under MAX_REGISTERS."""
    d = codec.head_dim
    n_groups = d // values.group
    if 32 % values.bits and n_groups % 2 == 0:  # widths not dividing 32 cut pairs of groups (whole words)
        value_groups = 2
    else:  # fewer rows than threads would change the tile's layout (replicated rows)
        value_groups = 2 if n_groups % 2 == 0 and block_v * n_groups // 2 >= 32 * num_warps else 1
    value_groups = min(value_groups, n_groups)
    tables = codec.kind.score_tables
    capped = block_v * n_groups // value_groups == 32 * num_warps and tables.capped(codec, lay)
    v_words = -(-d * values.bits // 32)
    consts = dict(D=d, L=lay.codes, K_BITS=lay.bits, K_WORDS=codec.code_words, B_RHO=codec.param("b_rho"),
                  N_ENTRIES=lay.entries, FOLD_RHO=lay.fold_rho, HAS_QJL=codec.has_qjl,
                  V_GROUP=values.group, V_BITS=values.bits, V_WORDS=v_words, V_WP=_pow2(v_words),
                  BLOCK_K=block_k, BLOCK_V=block_v, BLOCK_W=max(16, _pow2(t_win)), V_GT=value_groups,
                  STAGE_K=max(STAGE_KEYS, block_k, block_v), SCORE_STEP=tables.step, LEVELS=lay.levels,
                  A_BITS=codec.code_bits,
                  LOG2D=d.bit_length() - 1, VALUE_STAGES=value_stages)
    return consts, {"num_warps": num_warps, **({"maxnreg": MAX_REGISTERS} if capped else {})}


def attention_adc(q_BHTD: torch.Tensor, keys: PackedKeys, values: PackedValues, length: int,
                  k_window: torch.Tensor | None, v_window: torch.Tensor | None, codec: KernelCodec,
                  scale: float | None = None, num_splits: int | None = None, block_k: int | None = None,
                  block_v: int | None = None, num_warps: int | None = None,
                  programs_per_sm: int | None = None, group: int | None = None,
                  value_stages: int = 0) -> torch.Tensor:
    """softmax(scale * q.[K_hat; K_win]) @ [V_hat; V_win] for one query per KV head, by score tables.

    Same arguments and result as `select.attention` (q [B, H, 1, d], store [B, H, Tcap, ...], window
    [B, H, Tw, d]); the caller has validated them (the selector routes here). Two launches (tables,
    attention) plus the log-sum-exp merge when the keys are split. block_k / block_v: keys per step of the
    score and value phases; the window may hold at most MAX_WINDOW tokens here (value layout, register cap:
    attention_constants).
    group (a kind that groups coordinates: the scalar kind): coordinates a table code (its layout's
    default when None). value_stages: the
    group-16 value loop's software-pipeline depth (values_in_place; 0: its register double buffer).
    """
    if value_stages not in (0, 2, 3, 4):
        raise ValueError(f"value_stages={value_stages!r}: one of 0 (a register double buffer), 2, 3, 4")
    b, hq, tq, d = q_BHTD.shape
    h = keys.codes.shape[1]
    t_win = 0 if k_window is None else k_window.shape[2]
    why = adc_limit(codec, (hq // h) * tq, t_win, group)
    if why is not None:
        raise ValueError(f"the table-lookup attention cannot take {why}")
    dev = q_BHTD.device
    codec = codec.to(dev)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    qk_scale = scale * LOG2E
    rows = b * h
    t_cap = keys.codes.shape[2]
    lay = codec.kind.score_tables.layout(codec, group)
    q = q_BHTD.contiguous()

    lut, qlut = build_tables(q, codec, lay, h, qk_scale)

    if k_window is None or t_win == 0:
        k_window = v_window = torch.zeros(1, 1, 1, d, device=dev, dtype=q.dtype)
    if k_window.stride(-1) != 1:
        k_window = k_window.contiguous()
    if v_window.stride(-1) != 1:
        v_window = v_window.contiguous()

    nw = num_warps or 4
    block_k = block_k or 32 * nw
    block_v = block_v or (64 if _interpreting() else 16)
    step = max(block_k, block_v)
    consts, options = attention_constants(codec, lay, values, t_win, block_k, block_v, nw, value_stages)
    if num_splits is None:
        # floor: one full wave of resident programs; a ceil can spill a few programs into a second wave
        want = max(1, (programs_per_sm or 8) * _sm_count(dev) // rows)
        num_splits = max(1, min(want, _cdiv(length, 4 * step)))
    num_splits, chunk = split_chunk(length, min(int(num_splits), max(1, _cdiv(length, step))), step)
    out = torch.empty(b, hq, tq, d, device=dev, dtype=q.dtype)
    direct = num_splits == 1
    opart, lse = split_buffers(out, num_splits, rows, d)
    scores = torch.empty(rows, t_cap, device=dev, dtype=torch.float32)
    _adc_attn_kernel[(rows, num_splits)](
        lut, qlut, q, codec.kind.score_tables.aux(codec),
        *keys.launch_args(codec.has_qjl), *values.launch_args(),
        k_window, v_window, k_window.stride(0), k_window.stride(1), k_window.stride(2),
        v_window.stride(0), v_window.stride(1), v_window.stride(2),
        scores, out, opart, lse,
        h, t_cap, length, t_win, chunk, num_splits, rows, qk_scale, math.sqrt(math.pi / (2 * d)), 0,
        DIRECT=direct, **consts, **options)
    if not direct:
        _merge_splits_kernel[(rows,)](opart, lse, out, rows, num_splits, D=d,
                                      BLOCK_S=min(64, _pow2(num_splits)), num_warps=4)
    return out


# (keys a score step, keys a value step, warps, programs an SM, value-loop pipeline depth) of the one-row
# score-table path, by head dim (a kind may set its own at d >= 128: `KindTables.wide_launch`): the H200 sweep
# at 128k keys, graph-timed (benchmarks/lab/sweep_table_occupancy.py; kernels.md, "Split counts of the
# one-row path"). d <= 64 at 16 heads: 6 programs an SM (what the 80-register cap keeps resident) against 4:
# octopus 0.0933 -> 0.0785 ms, every table codec 14-19% faster; d >= 128 at 32 heads: 256 keys, 8 warps, 3
# programs (one wave of 12 splits), within 1% of (128, 32, 4, 6) for octopus and the turboquants. The value
# loop software-pipelined 3 deep (values_in_place) against its register double buffer: d=64 octopus 0.0750
# -> 0.0732, turboquant-mse 0.0726 -> 0.0705; octopus d=128 0.2202 -> 0.2261 (spills under the cap).
TABLE_LAUNCH = {"narrow": (128, 64, 4, 6, 3), "wide": (256, 64, 8, 3, 0)}


def table_attention(q_BHTD: torch.Tensor, keys: PackedKeys, values: PackedValues, length: int,
                    k_window: torch.Tensor | None, v_window: torch.Tensor | None, codec: KernelCodec,
                    scale: float, num_splits: int | None = None,
                    config: AttnConfig | None = None) -> torch.Tensor:
    """`attention_adc` at TABLE_LAUNCH's launch (the kind's own at d >= 128 where it has one) where `config`
    leaves it open: the implementation the selector runs for one query row a KV head."""
    cfg = config or AttnConfig()
    wide = codec.kind.score_tables.wide_launch or TABLE_LAUNCH["wide"]
    block_k, block_v, warps, per_sm, value_stages = TABLE_LAUNCH["narrow"] if codec.head_dim < 128 else wide
    return attention_adc(q_BHTD, keys, values, length, k_window, v_window, codec, scale=scale,
                         num_splits=num_splits, block_k=cfg.block_n or block_k,
                         block_v=cfg.block_v or block_v, num_warps=cfg.num_warps or warps,
                         programs_per_sm=cfg.programs_per_sm or per_sm, value_stages=value_stages)
