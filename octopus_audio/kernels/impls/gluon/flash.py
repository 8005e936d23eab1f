"""Attention over the compressed cache as a warp-specialised Gluon kernel for Hopper (sm_90): the default on
an H200 where `scope.gluon_limit` finds the shape in scope; the Triton implementations (impls/flash.py,
impls/score_tables.py) everywhere else.

Math (as impls/flash.py): out = softmax(scale q.[K_hat; K_win]) @ [V_hat; V_win], one softmax over the
compressed
store and the native window. A compressed key's score is gamma (q_rot . u_hat) [+ gamma (q_qjl . gamma_r
sigma)], with q_rot = sqrt(d) R q scaled by qk_scale / sqrt(d) and q_qjl = d R' R q scaled by qk_scale
sqrt(pi / (2d)) / d (qk_scale = scale log2 e: the softmax runs in exp2); a window key's score is
qk_scale q . k. Values: group dequantization code * scale + minimum (fp16).

One program per (batch row, KV head), 4 + 4 warps: a producer warp group decodes each 64-key tile of the
store, then of the window, into a two-stage ring in shared memory (`decode.py`: the key tiles in the
kernel's column order, the values in fp16, and per key a score scale, gamma or qk_scale, and a bias, 0 or
-inf past the last key), loading the next tile's packed words into registers while it decodes this one. The
default warp group rotates the query rows once through the head's query map (`query_map`, tile by tile, a
wgmma against the map in shared memory), then per ring tile runs S = Q K^T as wgmma (queries 0..63 as rows,
64..79 swapped: S2^T = K Q2^T, 16 columns), applies the column scale and bias in one FMA, updates the online
softmax (exp2) and accumulates P V in fp16 (P in [0, 1]). The window's tiles are scored with the native query
rows (kept in their own buffer) against tile a alone; a last window tile of at most TAIL = 16 keys (AAR's
scales of 66 and 75 tokens leave 2 and 11, its first seven scales 1-16 in all) runs a narrow step whose 64
wgmma rows score and accumulate only its first 16 keys (`_fx_step` with N1 = 16). A wide store (a cache's
wide prefix: keys and values at other widths, the store codec's kind and rotation; `_gluon_attn_wide_kernel`)
comes first: the producer decodes its tiles at their own widths into the store's key and value column orders
(`decode._key_reorder`, `decode._value_order`), so the consumer scores them as store tiles. The
epilogue divides by the row sums, puts the columns in their true order (`_true_order`, a register
relabelling, then one layout conversion) and stores 16-byte rows.

Launch (H200, Triton 3.6, AAR shapes 2B x 16 heads, 75 queries x (380 + 75) keys, d=64): 64 keys a tile, 2
stages, 128 registers a thread (two programs an SM), the producer at 72 registers (88 for polarquant and
octopus-qjl: the least without spills in its tile loop). Against stages=3, L1 prefetch 1-2 tiles ahead,
loads at decode, producer 56 registers, 128-key tiles and 3 programs an SM, this configuration was fastest or
within 4% (benchmarks/results/kernels.md, "Attention at AAR shapes"); a software-pipelined consumer (3 stages)
was no faster (kernels.md, "Tried, not kept"). Octopus b=2 takes 1.29-1.34x SDPA's time at AAR shapes
(kernels.md, "Attention").
"""

from __future__ import annotations

import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ...spec import KernelCodec, PackedKeys, PackedValues, WideSegment
from .columns import _table_spec, key_table, query_map
from .decode import (
    OCJ,
    POL,
    TQJ,
    TQM,
    _key_order,
    _mma,
    _row_layout,
    _smem,
    _true_order,
    _unit_decode,
    _unit_raw,
    _window_section,
)
from .scope import codec_id

BLOCK = 64  # keys a ring tile
STAGES = 2  # ring stages
TAIL = 16  # a last window tile of at most TAIL keys runs the narrow step (_fx_step's N1)
WIDE_NARROW = 32  # with a wide prefix: a last tile of either store with at most this many keys runs narrow
MAXNREG = 128  # registers a thread: two programs of 8 warps an SM
PRODUCER_REGS = {POL.value: 88, OCJ.value: 88}  # else 72


# ---------------------------------------------------------------------------------------------------------
# producer partition

@gluon.jit
def _next_stage(t, empty, STAGES: gl.constexpr):
    """Wait until ring tile t's stage is released by the consumer (the empty barriers start complete: phase
    1 passes at once); returns the stage."""
    s = t % STAGES
    mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)
    return s


@gluon.jit
def _tables(tab_ptr, CODEC: gl.constexpr, NB: gl.constexpr, TAB: gl.constexpr, TAB_SMEM: gl.constexpr):
    """The key table a producer thread holds: (tab, the table in registers for gl.gather, or a placeholder;
    tlo, thi: the PRMT table of turboquant's 1-2 bit codes, or 0)."""
    LT: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    if TAB_SMEM:  # the table in registers for gl.gather
        tab = gl.load(tab_ptr + gl.arange(0, TAB, LT))
    else:
        tab = gl.zeros([128], gl.int32, LT)
    if (CODEC == TQM or CODEC == TQJ) and NB <= 2:  # the PRMT table of turboquant's 1-2 bit codes
        tlo = gl.load(tab_ptr)
        thi = gl.load(tab_ptr + 1)
    else:
        tlo = 0
        thi = 0
    return tab, tlo, thi


@gluon.jit
def _producer(ka, kc, vt, cv, ready, empty, n_ct, n_wt, row0, length, t_win, kc_ptr, kg_ptr, ks_ptr,
              kr_ptr, vc_ptr, vs_ptr, vm_ptr, tab_ptr, kw_base, vw_base, skt, svt, qk_scale, wide,
              CODEC: gl.constexpr, NB: gl.constexpr, KW: gl.constexpr, SW: gl.constexpr, V_BITS: gl.constexpr,
              V_GROUP: gl.constexpr, TAB: gl.constexpr, TAB_SMEM: gl.constexpr, STAGES: gl.constexpr,
              WIDE: gl.constexpr, NB_W: gl.constexpr, KW_W: gl.constexpr, V_BITS_W: gl.constexpr,
              V_GROUP_W: gl.constexpr, TAB_W: gl.constexpr, TAB_SMEM_W: gl.constexpr):
    """Worker partition (4 warps): fill stage t % STAGES with tile t once the consumer released it, fence,
    arrive on its ready barrier; tile t + 1's packed fields load into registers before tile t decodes (past
    the last compressed tile every load is masked off). Window tiles fill tile a alone (and the values).
    WIDE: the wide store's tiles come first (`wide`: its row0, length, tiles and pointers), each decoded at
    its own widths into the store's column orders (one or two tiles a sequence: no prefetch of their own;
    the store's first tile loads before them)."""
    if WIDE:
        raw = _unit_raw(0, row0, length, kc_ptr, kg_ptr, ks_ptr, kr_ptr, vc_ptr, vs_ptr, vm_ptr, CODEC, NB,
                        KW, SW, V_BITS, V_GROUP)
        w_row0, w_len, n_wd, wkc, wkg, wks, wkr, wvc, wvs, wvm, wtab_ptr = wide
        wtab, wlo, whi = _tables(wtab_ptr, CODEC, NB_W, TAB_W, TAB_SMEM_W)
        for tw in range(n_wd):
            wraw = _unit_raw(tw * 64, w_row0, w_len, wkc, wkg, wks, wkr, wvc, wvs, wvm, CODEC, NB_W, KW_W, SW,
                             V_BITS_W, V_GROUP_W)
            s = _next_stage(tw, empty, STAGES)
            _unit_decode(wraw, ka.index(s), kc.index(s), vt.index(s), cv, s, tw * 64, w_len, wtab, wtab_ptr,
                         wlo, whi, CODEC, NB_W, KW_W, V_BITS_W, TAB_SMEM_W, _key_order(CODEC, NB), V_BITS)
            fence_async_shared()
            mbarrier.arrive(ready.index(s))
        tab, tlo, thi = _tables(tab_ptr, CODEC, NB, TAB, TAB_SMEM)
    else:
        n_wd = 0
        tab, tlo, thi = _tables(tab_ptr, CODEC, NB, TAB, TAB_SMEM)
        raw = _unit_raw(0, row0, length, kc_ptr, kg_ptr, ks_ptr, kr_ptr, vc_ptr, vs_ptr, vm_ptr, CODEC, NB,
                        KW, SW, V_BITS, V_GROUP)
    for t in range(n_ct):
        nxt = _unit_raw((t + 1) * 64, row0, length, kc_ptr, kg_ptr, ks_ptr, kr_ptr, vc_ptr, vs_ptr, vm_ptr,
                        CODEC, NB, KW, SW, V_BITS, V_GROUP)
        s = _next_stage(n_wd + t, empty, STAGES)
        _unit_decode(raw, ka.index(s), kc.index(s), vt.index(s), cv, s, t * 64, length, tab,
                     tab_ptr, tlo, thi, CODEC, NB, KW, V_BITS, TAB_SMEM, _key_order(CODEC, NB), V_BITS)
        fence_async_shared()
        raw = nxt
        mbarrier.arrive(ready.index(s))
    for tw in range(n_wt):
        s = _next_stage(n_wd + n_ct + tw, empty, STAGES)
        _window_section(ka.index(s), vt.index(s), cv, s, kw_base, vw_base, skt, svt, tw * 64, t_win, qk_scale,
                        V_BITS)
        fence_async_shared()
        mbarrier.arrive(ready.index(s))


# ---------------------------------------------------------------------------------------------------------
# consumer partition (the default warp group): queries 0..63 as wgmma rows, 64..79 swapped


@gluon.jit
def _load_q(q_base, sqt, r0, TQ, M: gl.constexpr, LQ: gl.constexpr):
    r = r0 + gl.arange(0, M, gl.SliceLayout(1, LQ))
    c = gl.arange(0, 64, gl.SliceLayout(0, LQ))
    return gl.load(q_base + r[:, None] * sqt + c[None, :], mask=(r < TQ)[:, None] & (c < 64)[None, :],
                   other=0.0)


@gluon.jit
def _load_map(map_base, c0, DQ: gl.constexpr, W: gl.constexpr):
    """The head's map columns c0 .. c0 + W [64, W] into registers."""
    LM: gl.constexpr = _row_layout(W, 4)
    r = gl.arange(0, 64, gl.SliceLayout(1, LM))
    c = gl.arange(0, W, gl.SliceLayout(0, LM))
    return gl.load(map_base + r[:, None] * DQ + c0 + c[None, :])


@gluon.jit
def _rotate_tile(q, dst, scale):
    """dst [128, W] = bf16(q @ M * scale), M [64, W] staged in dst's first 64 rows (q: the query rows in
    registers as the A operand, or in shared memory)."""
    W: gl.constexpr = dst.shape[1]
    mma: gl.constexpr = _mma(W)
    acc = warpgroup_mma(q, dst.slice(0, 64), gl.zeros([128, W], gl.float32, mma), use_acc=False)
    gl.thread_barrier()  # every warp's dot has read the staged map before dst is overwritten
    dst.store((acc * scale).to(gl.bfloat16))


@gluon.jit
def _fx_issue(qa1, qc1, qa2, qc2, ka, kc, HAS_C: gl.constexpr, BLOCK: gl.constexpr, N1: gl.constexpr):
    """Start (async) S1 = Q1 K^T [64, N1] over the stage's first N1 keys and S2^T = K Q2^T [BLOCK, 16] over
    all its keys (its wgmma's M is the keys: 64 rows whatever N1)."""
    s1 = warpgroup_mma(qa1, ka.slice(0, N1).permute((1, 0)), gl.zeros([64, N1], gl.float32, _mma(N1)),
                       use_acc=False, is_async=True)
    s2 = warpgroup_mma(ka, qa2.permute((1, 0)), gl.zeros([BLOCK, 16], gl.float32, _mma(16)), use_acc=False,
                       is_async=True)
    if HAS_C:
        s1 = warpgroup_mma(qc1, kc.slice(0, N1).permute((1, 0)), s1, is_async=True)
        s2 = warpgroup_mma(kc, qc2.permute((1, 0)), s2, is_async=True)
    return s1, s2


@gluon.jit
def _fx_update(s1, s2, m1, l1, o1, m2, l2, o2, cs, cb, vt, pt2):
    """Scores times the column scale plus the bias (one FMA), both online softmax updates (every ring tile
    holds a valid key, so the running max is finite after the first), then start O1 += P1 V (P1 in
    registers) and O2^T += V^T P2^T (P2^T through shared memory); fp16 P and V. The swapped queries' sums
    stay per element (l2 [keys, 16], reduced over the keys once, in the epilogue). S1 may be narrower than
    the tile (N1 = s1.shape[1] keys, a tail step): its columns are the tile's first N1 keys, P1 V reads the
    value tile's first N1 rows; m1 and l1 keep the 64-column accumulator's row layout (the same rows: the
    conversions move no data)."""
    N1: gl.constexpr = s1.shape[1]
    mmaN: gl.constexpr = _mma(N1)
    mmaC: gl.constexpr = _mma(16)
    s1 = gl.fma(s1, cs.slice(0, N1).load(gl.SliceLayout(0, mmaN))[None, :],
                cb.slice(0, N1).load(gl.SliceLayout(0, mmaN))[None, :])
    s2 = gl.fma(s2, cs.load(gl.SliceLayout(1, mmaC))[:, None], cb.load(gl.SliceLayout(1, mmaC))[:, None])
    mn1 = gl.maximum(m1, gl.convert_layout(gl.max(s1, axis=1), m1.type.layout))
    a1 = gl.exp2(m1 - mn1)
    p1 = gl.exp2(s1 - gl.convert_layout(mn1, gl.SliceLayout(1, mmaN))[:, None])
    l1 = l1 * a1 + gl.convert_layout(gl.sum(p1, axis=1), l1.type.layout)
    o1 = o1 * gl.convert_layout(a1, gl.SliceLayout(1, _mma(64)))[:, None]  # trivial: the same rows
    mn2 = gl.maximum(m2, gl.max(s2, axis=0))
    a2 = gl.exp2(m2 - mn2)
    p2 = gl.exp2(s2 - mn2[None, :])
    l2 = l2 * a2[None, :] + p2
    o2 = o2 * a2[None, :]
    gl.thread_barrier()  # every warp's previous P2^T dot is done (waited) before pt2 is rewritten
    pt2.store(p2.to(gl.float16))
    fence_async_shared()
    p1d = gl.convert_layout(p1.to(gl.float16), gl.DotOperandLayout(operand_index=0, parent=_mma(64),
                                                                    k_width=2))
    o1 = warpgroup_mma(p1d, vt.slice(0, N1), o1, is_async=True)
    o2 = warpgroup_mma(vt.permute((1, 0)), pt2, o2, is_async=True)
    return mn1, l1, o1, mn2, l2, o2


@gluon.jit
def _fx_step(u, m1, l1, o1, m2, l2, o2, ka, kc, vt, cv, ready, empty, qa, qc, pt2, HAS_C: gl.constexpr,
             BLOCK: gl.constexpr, STAGES: gl.constexpr, N1: gl.constexpr):
    """Ring tile u from stage u % STAGES, scored with the query tiles qa (rows 0..63, 64..79) and qc
    (unrolling the loop over the stages, which makes the stage index a constant, measured no fewer
    instructions: ptxas keeps the descriptors in regular registers and moves them to uniform ones at every
    use either way). N1 < BLOCK: the narrow step of a last window tile of at most N1 keys, whose 64 wgmma
    query rows score and accumulate only its first N1 keys (a quarter of those dots, exp2s and softmax
    arithmetic at N1 = 16); the swapped rows 64..79 keep the whole tile."""
    st = u % STAGES
    mbarrier.wait(ready.index(st), (u // STAGES) & 1)
    s1, s2 = _fx_issue(qa.slice(0, 64), qc.slice(0, 64), qa.slice(64, 16), qc.slice(64, 16), ka.index(st),
                       kc.index(st), HAS_C, BLOCK, N1)
    s1, s2 = warpgroup_mma_wait(0, deps=(s1, s2))
    m1, l1, o1, m2, l2, o2 = _fx_update(s1, s2, m1, l1, o1, m2, l2, o2, cv.index(2 * st),
                                        cv.index(2 * st + 1), vt.index(st), pt2)
    o1, o2 = warpgroup_mma_wait(0, deps=(o1, o2))
    mbarrier.arrive(empty.index(st))
    return m1, l1, o1, m2, l2, o2


@gluon.jit
def _store_rows(out_base, o, r0, TQ, sot, V_BITS: gl.constexpr):
    """Output rows r0 .. r0 + R (o [R, 64] bf16, kernel column order; rows sot elements apart) in the true
    column order, moved to 16-byte row vectors (one layout conversion through shared memory) and stored as
    such."""
    R: gl.constexpr = o.shape[0]
    LO: gl.constexpr = _row_layout(64, 4)
    o = gl.convert_layout(_true_order(o, V_BITS), LO)
    r = r0 + gl.arange(0, R, gl.SliceLayout(1, LO))
    c = gl.arange(0, 64, gl.SliceLayout(0, LO))
    gl.store(out_base + r[:, None] * sot + c[None, :], o, mask=(r < TQ)[:, None] & (c < 64)[None, :])


@gluon.jit
def _fx_epilogue(o1, l1, o2, l2, out_base, TQ, sot, V_BITS: gl.constexpr):
    """O / l for queries 0..63 (rows) and 64..79 (O2^T, transposed), bf16, each column at its true place."""
    l1 = gl.convert_layout(l1, gl.SliceLayout(1, _mma(64)))
    _store_rows(out_base, (o1 / gl.where(l1 > 0, l1, 1.0)[:, None]).to(gl.bfloat16), 0, TQ, sot, V_BITS)
    l2 = gl.sum(l2, axis=0)
    o2 = (o2 / gl.where(l2 > 0, l2, 1.0)[None, :]).to(gl.bfloat16)
    _store_rows(out_base, gl.permute(o2, (1, 0)), 64, TQ, sot, V_BITS)


@gluon.jit
def _store_tiles(u0, n, keys, m1, l1, o1, m2, l2, o2, ka, kc, vt, cv, ready, empty, qa, qc, pt2,
                 HAS_C: gl.constexpr, BLOCK: gl.constexpr, STAGES: gl.constexpr, NARROW: gl.constexpr):
    """Ring tiles u0 .. u0 + n of one compressed store of `keys` keys, scored with the rotated queries; its
    last tile takes the narrow step (N1 = NARROW) when it holds at most NARROW keys (NARROW 0: never)."""
    if NARROW > 0:
        narrow = (n > 0) & (keys - (n - 1) * BLOCK <= NARROW)
        n_full = n - narrow.to(gl.int32)
    else:
        n_full = n
    for u in range(u0, u0 + n_full):
        m1, l1, o1, m2, l2, o2 = _fx_step(u, m1, l1, o1, m2, l2, o2, ka, kc, vt, cv, ready, empty, qa, qc,
                                          pt2, HAS_C, BLOCK, STAGES, BLOCK)
    if NARROW > 0:
        if narrow:
            m1, l1, o1, m2, l2, o2 = _fx_step(u0 + n_full, m1, l1, o1, m2, l2, o2, ka, kc, vt, cv, ready,
                                              empty, qa, qc, pt2, HAS_C, BLOCK, STAGES, NARROW)
    return m1, l1, o1, m2, l2, o2


@gluon.jit
def _consumer(ka, kc, vt, cv, ready, empty, qa, qc, qn, pt2, n_ct, n_wt, t_win, q_base, sqt, map_base,
              out_base, TQ, sot, rot_scale, qjl_scale, wide, CODEC: gl.constexpr, DQ: gl.constexpr,
              V_BITS: gl.constexpr, BLOCK: gl.constexpr, STAGES: gl.constexpr, TAIL: gl.constexpr,
              WIDE: gl.constexpr, NARROW: gl.constexpr):
    """Rotate the query rows through the head's map (tile a: rot_scale; tile c: qjl_scale), then loop over
    the compressed ring tiles with the rotated queries and over the window's with the native ones (tile a
    alone: the producer fills only tile a of a window tile).

    The prologue issues every global load at once (the query rows, each map tile staged in its destination's
    first 64 rows), then runs the rotations from shared memory; the native query rows stay in their own
    buffer qn for the window tiles. WIDE: the first of the n_ct compressed tiles are the wide store's (`wide`:
    its tiles and keys, and the store's keys), and a last tile of either store with at most NARROW keys takes
    the narrow step."""
    HAS_C: gl.constexpr = (CODEC == TQJ) or (CODEC == OCJ)
    q = _load_q(q_base, sqt, 0, TQ, 128, _row_layout(64, 4))
    ma = _load_map(map_base, 0, DQ, 64)
    if HAS_C:
        mc = _load_map(map_base, 64, DQ, 64)
    qn.store(q)
    qa.slice(0, 64).store(ma)
    if HAS_C:
        qc.slice(0, 64).store(mc)
    fence_async_shared()
    gl.thread_barrier()
    _rotate_tile(qn, qa, rot_scale)
    if HAS_C:
        _rotate_tile(qn, qc, qjl_scale)
    fence_async_shared()
    gl.thread_barrier()
    mmaR: gl.constexpr = _mma(BLOCK)
    mmaC: gl.constexpr = _mma(16)
    m1 = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, mmaR))
    l1 = gl.zeros([64], gl.float32, gl.SliceLayout(1, mmaR))
    o1 = gl.zeros([64, 64], gl.float32, _mma(64))
    m2 = gl.full([16], float("-inf"), gl.float32, gl.SliceLayout(0, mmaC))
    l2 = gl.zeros([BLOCK, 16], gl.float32, mmaC)
    o2 = gl.zeros([64, 16], gl.float32, mmaC)
    if WIDE:  # the wide store's tiles, then the store's, each store's last tile narrow when it can be
        n_wd, w_len, length = wide
        m1, l1, o1, m2, l2, o2 = _store_tiles(0, n_wd, w_len, m1, l1, o1, m2, l2, o2, ka, kc, vt, cv, ready,
                                              empty, qa, qc, pt2, HAS_C, BLOCK, STAGES, NARROW)
    else:  # NARROW is 0: every store tile takes the full step (`length` unread)
        n_wd = 0
        length = 0
    m1, l1, o1, m2, l2, o2 = _store_tiles(n_wd, n_ct - n_wd, length, m1, l1, o1, m2, l2, o2, ka, kc, vt, cv,
                                          ready, empty, qa, qc, pt2, HAS_C, BLOCK, STAGES, NARROW)
    # native keys: tile a alone; a last tile of at most TAIL keys takes the narrow step
    tail = (n_wt > 0) & (t_win - (n_wt - 1) * BLOCK <= TAIL)
    n_full = n_ct + n_wt - tail.to(gl.int32)
    for u in range(n_ct, n_full):
        m1, l1, o1, m2, l2, o2 = _fx_step(u, m1, l1, o1, m2, l2, o2, ka, kc, vt, cv, ready, empty, qn, qc,
                                          pt2, False, BLOCK, STAGES, BLOCK)
    if tail:
        m1, l1, o1, m2, l2, o2 = _fx_step(n_full, m1, l1, o1, m2, l2, o2, ka, kc, vt, cv, ready, empty, qn,
                                          qc, pt2, False, BLOCK, STAGES, TAIL)
    _fx_epilogue(o1, l1, o2, l2, out_base, TQ, sot, V_BITS)


# ---------------------------------------------------------------------------------------------------------
# the kernel

@gluon.jit
def _gluon_attn_body(q_ptr, sqb, sqh, sqt, map_ptr, kc_ptr, kg_ptr, ks_ptr, kr_ptr, vc_ptr, vs_ptr, vm_ptr,
                     kw_ptr, vw_ptr, skb, skh, skt, svb, svh, svt, tab_ptr, out_ptr, sob, soh, sot,
                     H, TQ, t_cap, length,
                     t_win, rot_scale, qjl_scale, qk_scale, wide, CODEC: gl.constexpr, NB: gl.constexpr,
                     KW: gl.constexpr, SW: gl.constexpr, V_BITS: gl.constexpr, V_GROUP: gl.constexpr,
                     TAB: gl.constexpr, TAB_SMEM: gl.constexpr, BLOCK: gl.constexpr, STAGES: gl.constexpr,
                     P_REGS: gl.constexpr, TAIL: gl.constexpr, WIDE: gl.constexpr, NB_W: gl.constexpr,
                     KW_W: gl.constexpr, V_BITS_W: gl.constexpr, V_GROUP_W: gl.constexpr, TAB_W: gl.constexpr,
                     TAB_SMEM_W: gl.constexpr, NARROW: gl.constexpr):
    """One (batch row, KV head) program: TQ <= 80 query rows of the head (d = 64) against `length`
    compressed keys (store rows pid * t_cap ..), `t_win` native window keys and, WIDE, the wide store's keys
    (`wide`: its capacity, length and pointers; the producer's tiles before the store's, scored with the
    same rotated queries)."""
    pid = gl.program_id(0)
    b = pid // H
    h = pid % H
    HAS_C: gl.constexpr = (CODEC == TQJ) or (CODEC == OCJ)
    DQ: gl.constexpr = 128 if HAS_C else 64
    ka = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK, 64], _smem([BLOCK, 64], gl.bfloat16))
    qa = gl.allocate_shared_memory(gl.bfloat16, [128, 64], _smem([128, 64], gl.bfloat16))
    qn = gl.allocate_shared_memory(gl.bfloat16, [128, 64], _smem([128, 64], gl.bfloat16))
    if HAS_C:
        kc = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK, 64], _smem([BLOCK, 64], gl.bfloat16))
        qc = gl.allocate_shared_memory(gl.bfloat16, [128, 64], _smem([128, 64], gl.bfloat16))
    else:  # placeholders, never read
        kc = ka
        qc = qa
    vt = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK, 64], _smem([BLOCK, 64], gl.float16))
    cv = gl.allocate_shared_memory(gl.float32, [2 * STAGES, BLOCK], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    pt2 = gl.allocate_shared_memory(gl.float16, [BLOCK, 16], _smem([BLOCK, 16], gl.float16))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    n_ct = gl.cdiv(length, BLOCK)
    n_wt = gl.cdiv(t_win, BLOCK)
    if WIDE:
        w_cap, w_len, wkc, wkg, wks, wkr, wvc, wvs, wvm, wtab = wide
        n_wd = gl.cdiv(w_len, BLOCK)
        wide_args = (pid * w_cap, w_len, n_wd, wkc, wkg, wks, wkr, wvc, wvs, wvm, wtab)
        wide_c = (n_wd, w_len, length)
    else:
        n_wd = 0
        wide_args = 0
        wide_c = 0
    gl.warp_specialize([
        (_consumer, (ka, kc, vt, cv, ready, empty, qa, qc, qn, pt2, n_wd + n_ct, n_wt, t_win,
                     q_ptr + b * sqb + h * sqh, sqt, map_ptr + h * (64 * DQ),
                     out_ptr + b * sob + h * soh, TQ, sot,
                     rot_scale, qjl_scale, wide_c, CODEC, DQ, V_BITS, BLOCK, STAGES, TAIL, WIDE, NARROW)),
        (_producer, (ka, kc, vt, cv, ready, empty, n_ct, n_wt, pid * t_cap, length, t_win, kc_ptr, kg_ptr,
                     ks_ptr, kr_ptr, vc_ptr, vs_ptr, vm_ptr, tab_ptr, kw_ptr + b * skb + h * skh,
                     vw_ptr + b * svb + h * svh, skt, svt, qk_scale, wide_args, CODEC, NB, KW, SW, V_BITS,
                     V_GROUP, TAB, TAB_SMEM, STAGES, WIDE, NB_W, KW_W, V_BITS_W, V_GROUP_W, TAB_W,
                     TAB_SMEM_W)),
    ], [4], [P_REGS])


@gluon.jit
def _gluon_attn_kernel(q_ptr, sqb, sqh, sqt, map_ptr, kc_ptr, kg_ptr, ks_ptr, kr_ptr, vc_ptr, vs_ptr, vm_ptr,
                       kw_ptr, vw_ptr, skb, skh, skt, svb, svh, svt, tab_ptr, out_ptr, sob, soh, sot,
                       H, TQ, t_cap, length,
                       t_win, rot_scale, qjl_scale, qk_scale, CODEC: gl.constexpr, NB: gl.constexpr,
                       KW: gl.constexpr, SW: gl.constexpr, V_BITS: gl.constexpr, V_GROUP: gl.constexpr,
                       TAB: gl.constexpr, TAB_SMEM: gl.constexpr, BLOCK: gl.constexpr, STAGES: gl.constexpr,
                       P_REGS: gl.constexpr, TAIL: gl.constexpr):
    """`_gluon_attn_body` without a wide store: its launch passes no wide arguments (host time at every
    call)."""
    _gluon_attn_body(q_ptr, sqb, sqh, sqt, map_ptr, kc_ptr, kg_ptr, ks_ptr, kr_ptr, vc_ptr, vs_ptr, vm_ptr,
                     kw_ptr, vw_ptr, skb, skh, skt, svb, svh, svt, tab_ptr, out_ptr, sob, soh, sot,
                     H, TQ, t_cap, length,
                     t_win, rot_scale, qjl_scale, qk_scale, 0, CODEC, NB, KW, SW, V_BITS, V_GROUP, TAB,
                     TAB_SMEM, BLOCK, STAGES, P_REGS, TAIL, False, NB, KW, V_BITS, V_GROUP, TAB, TAB_SMEM, 0)


@gluon.jit
def _gluon_attn_wide_kernel(q_ptr, sqb, sqh, sqt, map_ptr, kc_ptr, kg_ptr, ks_ptr, kr_ptr, vc_ptr, vs_ptr,
                            vm_ptr, kw_ptr, vw_ptr, skb, skh, skt, svb, svh, svt, tab_ptr, out_ptr, sob, soh,
                            sot, H, TQ, t_cap, length, t_win, rot_scale, qjl_scale, qk_scale, wkc_ptr,
                            wkg_ptr, wks_ptr, wkr_ptr, wvc_ptr, wvs_ptr, wvm_ptr, wtab_ptr, w_cap, w_len,
                            CODEC: gl.constexpr, NB: gl.constexpr, KW: gl.constexpr, SW: gl.constexpr,
                            V_BITS: gl.constexpr, V_GROUP: gl.constexpr, TAB: gl.constexpr,
                            TAB_SMEM: gl.constexpr, BLOCK: gl.constexpr, STAGES: gl.constexpr,
                            P_REGS: gl.constexpr, TAIL: gl.constexpr, NB_W: gl.constexpr, KW_W: gl.constexpr,
                            V_BITS_W: gl.constexpr, V_GROUP_W: gl.constexpr, TAB_W: gl.constexpr,
                            TAB_SMEM_W: gl.constexpr, NARROW: gl.constexpr):
    """`_gluon_attn_body` with a wide store (a cache's wide prefix: `w_len` keys at store rows pid * w_cap ..,
    its codes NB_W bits in KW_W words, values V_BITS_W bits in groups of V_GROUP_W, its own table)."""
    _gluon_attn_body(q_ptr, sqb, sqh, sqt, map_ptr, kc_ptr, kg_ptr, ks_ptr, kr_ptr, vc_ptr, vs_ptr, vm_ptr,
                     kw_ptr, vw_ptr, skb, skh, skt, svb, svh, svt, tab_ptr, out_ptr, sob, soh, sot,
                     H, TQ, t_cap, length,
                     t_win, rot_scale, qjl_scale, qk_scale,
                     (w_cap, w_len, wkc_ptr, wkg_ptr, wks_ptr, wkr_ptr, wvc_ptr, wvs_ptr, wvm_ptr, wtab_ptr),
                     CODEC, NB, KW, SW, V_BITS, V_GROUP, TAB, TAB_SMEM, BLOCK, STAGES, P_REGS, TAIL, True,
                     NB_W, KW_W, V_BITS_W, V_GROUP_W, TAB_W, TAB_SMEM_W, NARROW)


_gluon_attn_kernel = gluon.jit(_gluon_attn_kernel.fn, do_not_specialize=["TQ", "t_cap", "length", "t_win"])
_gluon_attn_wide_kernel = gluon.jit(_gluon_attn_wide_kernel.fn,
                                    do_not_specialize=["TQ", "t_cap", "length", "t_win", "w_cap", "w_len"])


# ---------------------------------------------------------------------------------------------------------
# host side: the kernel's constants and launch (its column orders, query map and table: columns.py)

def kernel_constants(kc: KernelCodec, v_bits: int, v_group: int) -> dict:
    """The kernel's constexprs for a KernelCodec in scope (scope.codec_limit) and its values."""
    cid = codec_id(kc.kind, kc.has_qjl)
    tab_rows, tab_smem = _table_spec(kc)
    return dict(CODEC=cid, NB=kc.code_bits, KW=kc.code_words, SW=2 if kc.has_qjl else 1, V_BITS=v_bits,
                V_GROUP=v_group, TAB=tab_rows, TAB_SMEM=tab_smem, BLOCK=BLOCK, STAGES=STAGES,
                P_REGS=PRODUCER_REGS.get(cid, 72), TAIL=TAIL)


def wide_constants(kc: KernelCodec, v_bits: int, v_group: int) -> dict:
    """`_gluon_attn_wide_kernel`'s constexprs of the wide store (a codec of the store codec's kind)."""
    k = kernel_constants(kc, v_bits, v_group)
    return {**{f"{name}_W": k[name] for name in ("NB", "KW", "V_BITS", "V_GROUP", "TAB", "TAB_SMEM")},
            "NARROW": WIDE_NARROW}


def attention_gluon(q_BHTD: torch.Tensor, keys: PackedKeys, values: PackedValues, length: int,
                    k_window: torch.Tensor | None, v_window: torch.Tensor | None, codec: KernelCodec,
                    scale: float, wide: WideSegment | None = None) -> torch.Tensor:
    """`select.attention`'s contract on the Gluon kernel, for arguments the selector has checked and
    `scope.gluon_limit` found in scope: q [B, Hq, Tq, 64] bf16 with Hq = G*H and G*Tq <= 80 (query
    head h*G + g reads KV head h), the packed store [B, H, Tcap, ...], window [B, H, Tw, 64] bf16 or None,
    `wide` a second store in the same softmax (`scope.wide_limit` found it in scope: the same rotation, a
    width the kernel decodes). Returns [B, Hq, Tq, 64] bf16."""
    b, hq, tq, d = q_BHTD.shape
    h = keys.codes.shape[1]
    rows = hq // h * tq
    q = q_BHTD.reshape(b, h, rows, d)  # rows g*Tq + t of KV head h (a view when q's heads are contiguous)
    if q.stride(-1) != 1:
        q = q.contiguous()
    t_win = 0 if k_window is None else k_window.shape[2]
    if not t_win:  # any bf16 tensor serves as the never-read window
        k_window = v_window = q
    k_window = k_window if k_window.stride(-1) == 1 else k_window.contiguous()
    v_window = v_window if v_window.stride(-1) == 1 else v_window.contiguous()
    if rows == tq:  # one query head a KV head: rows in [B, T, H, D] memory order, as cuDNN's SDPA writes
        # them, so a caller merging heads (o.transpose(1, 2).reshape(B, T, H * D)) gets a view, not a copy
        out = torch.empty(b, tq, h, d, device=q.device, dtype=torch.bfloat16).transpose(1, 2)
    else:
        out = torch.empty(b, h, rows, d, device=q.device, dtype=torch.bfloat16)
    qk_scale = scale * 1.4426950408889634
    rot_scale = qk_scale / math.sqrt(d)
    qjl_scale = qk_scale * math.sqrt(math.pi / (2 * d)) / d
    key_args = keys.launch_args(codec.has_qjl)
    args = (q, q.stride(0), q.stride(1), q.stride(2), query_map(codec), *key_args, *values.launch_args(),
            k_window, v_window, *k_window.stride()[:3], *v_window.stride()[:3], key_table(codec), out,
            *out.stride()[:3], h,
            rows, key_args[0].shape[2], length, t_win, rot_scale, qjl_scale, qk_scale)
    consts = kernel_constants(codec, values.bits, values.group)
    if wide is None:
        _gluon_attn_kernel[(b * h, )](*args, **consts, num_warps=4, maxnreg=MAXNREG)
    else:
        wide_keys = wide.keys.launch_args(codec.has_qjl)
        _gluon_attn_wide_kernel[(b * h, )](
            *args, *wide_keys, *wide.values.launch_args(), key_table(wide.codec), wide_keys[0].shape[2],
            wide.length, **consts, **wide_constants(wide.codec, wide.values.bits, wide.values.group),
            num_warps=4, maxnreg=MAXNREG)
    return out if rows == tq else out.view(b, hq, tq, d)
