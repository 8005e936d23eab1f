"""The Gluon attention kernel's host side of its tiles (flash.py): the key column order of each codec's ring
tiles, the query map that rotates a query into that order, and the key table the producer decodes with. The
values' column order is the kernel's own (`decode._true_order`)."""

from __future__ import annotations

import torch

from ...launch import _pow2
from ...spec import KernelCodec
from .decode import OCJ, OCT, POL, TQJ, TQM
from .scope import codec_id


def _pair_columns(n: int, nb: int) -> torch.Tensor:
    """[n]: the coordinate at kernel column c of a byte-permute decoded tile of nb-bit codes (nb = 1 or 2):
    word w's pair p holds codes j and j + 8 / nb, j = p % (8 / nb) + 2 (8 / nb) (p // (8 / nb))."""
    cw, dl = 32 // nb, 8 // nb
    c = torch.arange(n)
    w, rem = c // cw, c % cw
    p, hh = rem // 2, rem % 2
    return w * cw + p % dl + 2 * dl * (p // dl) + hh * dl


def sign_columns(n: int) -> torch.Tensor:
    """[n]: the QJL sign index at kernel column c: word w's pair j holds signs j and j + 16."""
    c = torch.arange(n)
    w, rem = c // 32, c % 32
    return w * 32 + rem // 2 + (rem % 2) * 16


def key_columns(kc: KernelCodec) -> list[torch.Tensor]:
    """Per key tile of the kernel (a, then c for QJL): the index into the codec's `query_map` columns of each
    kernel column, -1 for a zero column. The one definition of the kernel's key column order, from which
    `query_map` is built. The triplet kind (d = 64, 22 triplets, 64 useful coordinates) fills tile a with
    table rows: column 4i + c (c < 3) holds component c of triplet i < 16, column 4i + 3 component i % 3 of
    triplet 16 + i // 3 (the last six triplets; triplet 21 has only its x)."""
    cid, d = codec_id(kc.kind, kc.has_qjl), kc.head_dim
    if cid in (OCT.value, OCJ.value):
        lp = kc.triplet_lanes
        i = torch.arange(16)[:, None]
        comp = torch.arange(4)[None, :]
        t = torch.where(comp < 3, i, 16 + i // 3)  # the fourth slot: component i % 3 of triplet 16 + i // 3
        c = torch.where(comp < 3, comp, i % 3)
        tiles, qjl0 = [(c * lp + t).reshape(-1)], 3 * lp
    elif cid in (TQM.value, TQJ.value) and kc.code_bits <= 2:
        tiles, qjl0 = [_pair_columns(d, kc.code_bits)], d
    else:
        tiles, qjl0 = [torch.arange(d)], d
    if kc.has_qjl:
        tiles.append(qjl0 + sign_columns(d))
    return tiles


def query_map(kc: KernelCodec) -> torch.Tensor:
    """[H, 64, DQ] bf16 (+-1, d-scaled integers or 0, exact): q @ map[h] = the query's projections in the
    kernel's key column order (tile a | c), from `KernelCodec.query_map`; cached on the codec."""
    cached = kc.__dict__.get("_gluon_map")
    if cached is None:
        qm = kc.query_map(torch.float32)
        cols = [torch.where(idx.to(qm.device) >= 0, qm[:, :, idx.to(qm.device).clamp(min=0)], 0.0)
                for idx in key_columns(kc)]
        cached = kc.__dict__["_gluon_map"] = torch.cat(cols, 2).to(torch.bfloat16).contiguous()
    return cached


def _table_spec(kc: KernelCodec) -> tuple[int, bool]:
    """(rows, through gl.gather) of the kernel's key table: tables gathered from registers are padded to at
    least 128 rows (one or more a producer thread); triplet tables are read with gathered global loads (L1
    hits; at octopus b=2, against gl.gather's copy of the table into shared memory and the two barriers around
    each gather: 0.6% faster for octopus, 2.8% for octopus-qjl at AAR shapes, benchmarks/results/kernels.md);
    turboquant's 1-2 bit table sits in two registers."""
    cid, nb = codec_id(kc.kind, kc.has_qjl), kc.code_bits
    if cid in (OCT.value, OCJ.value):
        return 1 << nb, False
    if cid == POL.value:
        return max(_pow2(6 << nb), 128), True
    if nb <= 2:
        return 4, False
    return max(1 << nb, 128), True


def key_table(kc: KernelCodec) -> torch.Tensor:
    """The kernel's table (tab_ptr), zero padded to `_table_spec`'s rows: triplet, the folded rows (x, y, z,
    0) in bf16 as int64; scalar with 1-2 bit codes, its 4 bf16 centroids as int32 [2]; scalar otherwise, bf16
    centroids as int16; polar, (cos, sin) fp32 of level lvl's code at row lvl 2^n + code, int64. Cached on
    the codec."""
    cached = kc.__dict__.get("_gluon_table")
    if cached is None:
        from ...kinds.triplet import folded_directions

        rows, _ = _table_spec(kc)
        cid = codec_id(kc.kind, kc.has_qjl)
        if cid in (OCT.value, OCJ.value):
            vals = folded_directions(kc).reshape(-1, 4).to(torch.bfloat16).contiguous().view(torch.int64)
        elif cid == POL.value:
            cos, sin = kc.kind.attention_tables(kc)
            vals = torch.stack([cos, sin], 1).contiguous().view(torch.int64)
        else:
            vals = kc.table("centroids").to(torch.bfloat16).contiguous().view(torch.int16)
        vals = vals.reshape(-1)
        tab = torch.zeros(rows, dtype=vals.dtype, device=vals.device)
        tab[:vals.numel()] = vals
        cached = kc.__dict__["_gluon_table"] = tab.view(torch.int32) if rows == 4 else tab
    return cached


