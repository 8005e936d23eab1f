"""Launcher of the single-query table-lookup attention (adc_decode) for the octopus codecs."""

from __future__ import annotations

import math

import torch

from .adc_decode import _adc_attn_kernel, _merge_splits_kernel, _octopus_tables_kernel
from .launch import _cdiv, _interpreting, _pow2, _sm_count, split_buffers, split_chunk
from .spec import KernelCodec, PackedKeys, PackedValues

LOG2E = 1.4426950408889634
FOLD_ENTRIES = 256  # fold C_rho into the triplet table when it has at most this many entries per triplet
MAX_ENTRIES = 4096  # larger direction tables (b_dir >= 7) leave the table path to flash_decode


MAX_WINDOW = 64
STAGE_KEYS = 1024  # keys scored before their values are accumulated (group-16 values)
# a register cap where a thread holds one value row and the codec has no QJL term: it keeps 3 programs of 8
# warps on an SM with the gated loads, without spills (sm_90, d=64 and 128, b=2-4); two value rows a thread,
# or octopus-qjl at b=3, spill under it, so those run uncapped
MAX_REGISTERS = 80


def adc_limit(codec: KernelCodec, n_rows: int, t_win: int = 0) -> str | None:
    """Why the table path cannot serve this call (None when it can): one query row, an octopus codec whose
    per-triplet table is small enough, a native window of at most MAX_WINDOW tokens."""
    if t_win > MAX_WINDOW:
        return f"a native window of {t_win} tokens (at most {MAX_WINDOW})"
    if n_rows != 1:
        return f"{n_rows} query rows per KV head (the table path takes 1)"
    if codec.decode != "triplet":
        return f"the {codec.decode} decode (the table path serves the triplet section)"
    if table_entries(codec)[0] > MAX_ENTRIES:
        return f"a direction table of {4 ** codec.param('b_dir')} entries (at most {MAX_ENTRIES})"
    return None


def table_entries(codec: KernelCodec) -> tuple[int, bool]:
    """(entries per triplet, fold_rho): C_rho is folded in when 2^n <= FOLD_ENTRIES or there is one norm."""
    folded = 1 << codec.code_bits
    if folded <= FOLD_ENTRIES or codec.param("b_rho") == 0:
        return folded, True
    return 4 ** codec.param("b_dir"), False


def attention_adc(q_BHTD: torch.Tensor, keys: PackedKeys, values: PackedValues, length: int,
                  k_window: torch.Tensor | None, v_window: torch.Tensor | None, codec: KernelCodec,
                  scale: float | None = None, num_splits: int | None = None, block_k: int | None = None,
                  block_v: int | None = None, num_warps: int | None = None,
                  programs_per_sm: int | None = None) -> torch.Tensor:
    """softmax(scale * q.[K_hat; K_win]) @ [V_hat; V_win] for one query per KV head, by score tables.

    Same arguments and result as attention (q [B, H, 1, d], store [B, H, Tcap, ...], window [B, H, Tw, d]);
    the caller has validated them (attention routes here). Two launches (tables, attention) plus the
    log-sum-exp merge when the keys are split. block_k / block_v: keys per step of the score and value phases;
    the window may hold at most MAX_WINDOW tokens here. A thread takes two value groups of a key per row where
    a step still has a row for every thread (always for widths not dividing 32), else one.
    """
    b, hq, tq, d = q_BHTD.shape
    h = keys.codes.shape[1]
    t_win = 0 if k_window is None else k_window.shape[2]
    why = adc_limit(codec, (hq // h) * tq, t_win)
    if why is not None:
        raise ValueError(f"the table-lookup attention cannot take {why}")
    dev = q_BHTD.device
    codec = codec.to(dev)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    qk_scale = scale * LOG2E
    rows = b * h
    t_cap = keys.codes.shape[2]
    entries, fold = table_entries(codec)
    n_trip = codec.num_codes
    q = q_BHTD.contiguous()

    lut = torch.empty(rows, n_trip, entries, device=dev, dtype=torch.float32)
    qlut = torch.empty(rows, d // 8, 256, device=dev, dtype=torch.float32) if codec.has_qjl else lut
    qjl_signs = codec.qjl_signs if codec.has_qjl else codec.rotation_signs
    tp = 16
    _octopus_tables_kernel[(rows, _cdiv(n_trip, tp))](
        q, codec.rotation_signs, qjl_signs, codec.hadamard, codec.table("directions"),
        codec.table("centroids"), lut, qlut,
        h, 1.0 / math.sqrt(d), qk_scale,
        D=d, L=n_trip, B_RHO=codec.param("b_rho"), FOLD_RHO=fold, N_ENTRIES=entries,
        CHUNK=min(entries, 128), HAS_QJL=codec.has_qjl, TP=tp, num_warps=4)

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
    n_groups = d // values.group
    if 32 % values.bits and n_groups % 2 == 0:  # widths not dividing 32 cut pairs of groups (whole words)
        value_groups = 2
    else:  # fewer rows than threads would change the tile's layout (replicated rows)
        value_groups = 2 if n_groups % 2 == 0 and block_v * n_groups // 2 >= 32 * nw else 1
    value_groups = min(value_groups, n_groups)
    capped = block_v * n_groups // value_groups == 32 * nw and not codec.has_qjl
    stage_keys = max(STAGE_KEYS, step)
    if num_splits is None:
        # floor: one full wave of resident programs; a ceil can spill a few programs into a second wave
        want = max(1, (programs_per_sm or 8) * _sm_count(dev) // rows)
        num_splits = max(1, min(want, _cdiv(length, 4 * step)))
    num_splits, chunk = split_chunk(length, min(int(num_splits), max(1, _cdiv(length, step))), step)
    out = torch.empty(b, hq, tq, d, device=dev, dtype=q.dtype)
    direct = num_splits == 1
    opart, lse = split_buffers(out, num_splits, rows, d)
    signs = keys.signs if codec.has_qjl else keys.codes
    gamma_r = keys.gamma_r if codec.has_qjl else keys.gamma
    v_words = values.codes.shape[-1]
    scores = torch.empty(rows, t_cap, device=dev, dtype=torch.float32)
    _adc_attn_kernel[(rows, num_splits)](
        lut, qlut, q, codec.table("centroids"),
        keys.codes.contiguous(), keys.gamma.contiguous(), signs.contiguous(), gamma_r.contiguous(),
        values.codes.contiguous(), values.scale.contiguous(), values.minimum.contiguous(),
        k_window, v_window, k_window.stride(0), k_window.stride(1), k_window.stride(2),
        v_window.stride(0), v_window.stride(1), v_window.stride(2),
        scores, out, opart, lse,
        h, t_cap, length, t_win, chunk, num_splits, rows, qk_scale, math.sqrt(math.pi / (2 * d)), 0,
        D=d, L=n_trip, K_BITS=codec.code_bits, K_WORDS=codec.code_words, B_RHO=codec.param("b_rho"),
        N_ENTRIES=entries, FOLD_RHO=fold, HAS_QJL=codec.has_qjl,
        V_GROUP=values.group, V_BITS=values.bits, V_WORDS=v_words, V_WP=_pow2(v_words),
        BLOCK_K=block_k, BLOCK_V=block_v, BLOCK_W=max(16, _pow2(t_win)), DIRECT=direct, V_GT=value_groups,
        STAGE_K=stage_keys, num_warps=nw, **({"maxnreg": MAX_REGISTERS} if capped else {}))
    if not direct:
        _merge_splits_kernel[(rows,)](opart, lse, out, rows, num_splits, D=d,
                                      BLOCK_S=min(64, _pow2(num_splits)), num_warps=4)
    return out
