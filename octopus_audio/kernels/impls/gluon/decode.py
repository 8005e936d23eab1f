"""The Gluon attention kernel's per-kind decode sections (sm_90): each turns the packed fields of 64
compressed keys into its part of a ring stage in shared memory, as `flash.py`'s producer partition runs
them, plus the native window's section.

A stage holds key tiles a (and c for the QJL signs) in bf16 and the value tile in fp16, in the
kernel's own column orders (`columns.key_columns` for the keys, `_true_order` for the values),
and two column vectors: each key's score scale (gamma; the softmax scale for window keys) and bias (0, or -inf
past the last key). Code words are read once per key as whole words and cut in registers with shifts whose
amounts are compile-time constants after one funnel shift; table lookups go through `gl.gather` of a
register-held table, gathered global loads (octopus tables), or for 1-2 bit turboquant codes a byte
permute (PRMT) of a table in two registers. Values decode in fp16x2: (code | 0x6400) is 1024 + code as fp16,
so a subtract and an fma give code * scale + minimum for two values at once.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .scope import POLAR, SCALAR, TRIPLET, codec_id

# the kernel's codec ids (CODEC constexpr) of the kinds it decodes, with and without the QJL side-car
# (scope.codec_id: from the kinds registry)
TQM = gl.constexpr(codec_id(SCALAR, False))  # turboquant-mse
TQJ = gl.constexpr(codec_id(SCALAR, True))  # turboquant-qjl
POL = gl.constexpr(codec_id(POLAR, False))  # polarquant
OCT = gl.constexpr(codec_id(TRIPLET, False))  # octopus
OCJ = gl.constexpr(codec_id(TRIPLET, True))  # octopus-qjl


# ---------------------------------------------------------------------------------------------------------
# layouts and asm snippets (constexpr helpers)

@gluon.constexpr_function
def _unit_layout(U, R):
    """[128 // U keys, U units, R registers]: one unit (a key's run of codes or words) a thread, 4 warps."""
    return gl.BlockedLayout([1, 1, R], [32 // U, U, 1], [4, 1, 1], [2, 1, 0])


@gluon.constexpr_function
def _words_layout(NW, R):
    """[64 keys, NW words, R registers]: a key's words over 2 lanes (NW / 2 each), 4 warps."""
    return gl.BlockedLayout([1, NW // 2, R], [16, 2, 1], [4, 1, 1], [2, 1, 0])


@gluon.constexpr_function
def _row_layout(cols, warps):
    """[rows, cols] 16-bit with 8 contiguous columns (16 bytes) a thread."""
    tw = min(max(cols // 8, 1), 32)
    return gl.BlockedLayout([1, 8], [32 // tw, tw], [warps, 1], [1, 0])


@gluon.constexpr_function
def _mma(n):
    """The wgmma accumulator layout of one warpgroup with an N = n instruction."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


@gluon.constexpr_function
def _smem(shape, dtype):
    return gl.NVMMASharedLayout.get_default_for(shape, dtype)


@gluon.constexpr_function
def _dequant_asm(nb):
    """fp16x2 (code_lo, code_hi) * scale + minimum from a shifted value word: its bits 0.. and 16.. hold the
    two codes; (code | 0x6400) is 1024 + code in fp16, so a subtract leaves the code exactly."""
    mask = ((1 << nb) - 1) * 0x10001
    return ("{ .reg .b32 t, m; and.b32 t, $2, " + str(mask) + "; or.b32 t, t, 0x64006400; "
            "mov.b32 m, 0x64006400; sub.rn.f16x2 t, t, m; fma.rn.f16x2 t, t, $3, $4; mov.b32 {$0, $1}, t; }")


@gluon.constexpr_function
def _prmt_asm(nb):
    """Two bf16 table values from a shifted code word whose bits 0.. and 8.. hold two codes: the PRMT
    selector (2c, 2c + 1) per code picks each value's two bytes from the 8-byte table {$3, $4}."""
    mask = ((1 << nb) - 1) * 0x101
    return ("{ .reg .b32 a, s, v; and.b32 a, $2, " + str(mask) + "; mad.lo.u32 s, a, 34, 4112; "
            "prmt.b32 v, $3, $4, s; mov.b32 {$0, $1}, v; }")


@gluon.jit
def _pack2(x):
    """A 16-bit value twice in one 32-bit word (both halves of an f16x2 / bf16x2 operand)."""
    return gl.inline_asm_elementwise("mov.b32 $0, {$1, $1};", "=r,h", [x], dtype=gl.int32, is_pure=True,
                                     pack=1)


@gluon.jit
def _bf16x2(x):
    """A 32-bit word as its two bf16 halves (low, high)."""
    return gl.inline_asm_elementwise("mov.b32 {$0, $1}, $2;", "=h,=h,r", [x],
                                     dtype=(gl.bfloat16, gl.bfloat16),
                                     is_pure=True, pack=1)


@gluon.jit
def _bf16x4(x):
    """A 64-bit table row as its four bf16 values."""
    return gl.inline_asm_elementwise("mov.b64 {$0, $1, $2, $3}, $4;", "=h,=h,=h,=h,l", [x],
                                     dtype=(gl.bfloat16, gl.bfloat16, gl.bfloat16, gl.bfloat16), is_pure=True,
                                     pack=1)


@gluon.jit
def _f32x2(x):
    """A 64-bit table row as its two fp32 values (low, high)."""
    return gl.inline_asm_elementwise("mov.b64 {$0, $1}, $2;", "=r,=r,l", [x], dtype=(gl.float32, gl.float32),
                                     is_pure=True, pack=1)


@gluon.jit
def _pairs_to_cols(lo, hi):
    """[K, A, P] pairs -> [K, A * P * 2] with lo at even and hi at odd columns."""
    x = gl.join(lo, hi)
    return gl.reshape(x, [x.shape[0], x.shape[1] * x.shape[2] * 2])


# ---------------------------------------------------------------------------------------------------------
# column orders: the kernel's value columns (`_true_order`) and turboquant's 1-2 bit key columns (pair order);
# a tile decoded in one order is written in another (a wide prefix's tiles, decoded at their own widths, go
# into the store's orders) by these register relabellings (reshape and permute: the compiler moves data
# where the layouts need it)

@gluon.constexpr_function
def _key_order(codec, nb):
    """The key column order of a codec id at nb-bit codes: nb (pair order, `_tq_prmt_decode`) for turboquant
    at 1-2 bits, 0 (each column its coordinate) otherwise."""
    return nb if codec in (TQM.value, TQJ.value) and nb <= 2 else 0


@gluon.jit
def _true_order(o, V_BITS: gl.constexpr):
    """[R, 64] in the kernel's value column order -> the true order. Within each word of C = 32 / V_BITS codes
    kernel columns 2j, 2j + 1 hold codes j, j + C/2 (what one shift of the word leaves at bits 0 and 16), so a
    [R, 64 / C, C / 2, 2] view with its last two axes swapped is the true order (a relabelling of registers,
    no data movement). The one definition of the value column order."""
    C: gl.constexpr = 32 // V_BITS
    x = gl.reshape(o, [o.shape[0], 64 // C, C // 2, 2])
    return gl.reshape(gl.permute(x, (0, 1, 3, 2)), [o.shape[0], 64])


@gluon.jit
def _value_order(o, V_BITS: gl.constexpr):
    """[R, 64] in the true order -> the kernel's value column order at V_BITS (`_true_order`'s inverse)."""
    C: gl.constexpr = 32 // V_BITS
    x = gl.reshape(o, [o.shape[0], 64 // C, 2, C // 2])
    return gl.reshape(gl.permute(x, (0, 1, 3, 2)), [o.shape[0], 64])


@gluon.jit
def _key_reorder(x, FROM: gl.constexpr, TO: gl.constexpr):
    """[R, 64] key columns in order FROM -> order TO (`_key_order`: 0 each column its coordinate; nb = 1, 2
    turboquant's pair order, within each word of C = 32 / nb codes columns (a, j, h) hold coordinate
    (a, h, j), j < 8 / nb, a and h < 2)."""
    if FROM == TO:
        return x
    else:
        R: gl.constexpr = x.shape[0]
        if FROM != 0:  # pair order -> coordinates
            DL: gl.constexpr = 8 // FROM
            y = gl.reshape(x, [R, 64 // (4 * DL), 2, DL, 2])
            x = gl.reshape(gl.permute(y, (0, 1, 2, 4, 3)), [R, 64])
        if TO != 0:  # coordinates -> pair order
            DT: gl.constexpr = 8 // TO
            y = gl.reshape(x, [R, 64 // (4 * DT), 2, 2, DT])
            x = gl.reshape(gl.permute(y, (0, 1, 2, 4, 3)), [R, 64])
        return x


# ---------------------------------------------------------------------------------------------------------
# code words -> codes: a unit's run of R codes of NB bits starting at code I0 + u * R, cut with shifts
# whose amounts are constants once the unit's words are funnel-shifted to its first code

@gluon.jit
def _unit_loads(ptr, row0, n0, length, I0: gl.constexpr, U: gl.constexpr, R: gl.constexpr, NB: gl.constexpr,
                KW: gl.constexpr, S: gl.constexpr = 0):
    """The code words under each unit's run [K, U] (a tuple of WN + 1; K = 128 / U keys n0..): word k of the
    tuple is the key's word (first bit of the run) / 32 + k. Keys >= length and words past the key's last
    read zeros."""
    L2: gl.constexpr = gl.SliceLayout(2, _unit_layout(U, R))
    K: gl.constexpr = 128 // U
    n = n0 + gl.arange(0, K, gl.SliceLayout(1, L2))
    u = gl.arange(0, U, gl.SliceLayout(0, L2))
    ST: gl.constexpr = R if S == 0 else S
    w0 = (((I0 + u * ST) * NB) >> 5)[None, :]
    rows = ptr + (row0 + n)[:, None] * KW + w0
    nok = (n < length)[:, None]
    WN: gl.constexpr = (R * NB + 31 + 31) // 32
    ws = ()
    for k in gl.static_range(WN + 1):
        ws = ws + (gl.load(rows + k, mask=nok & (w0 + k < KW), other=0).to(gl.uint32, bitcast=True), )
    return ws


@gluon.jit
def _unit_funnel(ws, I0: gl.constexpr, U: gl.constexpr, R: gl.constexpr, NB: gl.constexpr,
                 S: gl.constexpr = 0):
    """`_unit_loads`' words funnel-shifted to each unit's first bit: word k holds bits 32 k .. of the run."""
    L2: gl.constexpr = gl.SliceLayout(2, _unit_layout(U, R))
    u = gl.arange(0, U, gl.SliceLayout(0, L2))
    ST: gl.constexpr = R if S == 0 else S
    off = (((I0 + u * ST) * NB) & 31).to(gl.uint32)[None, :]
    ys = ()
    for k in gl.static_range(len(ws) - 1):  # (w_k >> off) | (w_k+1 << (32 - off)), no 32-bit shift at off = 0
        ys = ys + ((ws[k] >> off) | ((ws[k + 1] << 1) << (31 - off)), )
    return ys


@gluon.jit
def _unit_codes(ys, U: gl.constexpr, R: gl.constexpr, NB: gl.constexpr):
    """[K, U, R] int32 codes from the unit words `ys` (code r at bits NB r of the run)."""
    L3: gl.constexpr = _unit_layout(U, R)
    r = gl.arange(0, R, gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    kk = ((r * NB) >> 5)[None, None, :]
    ss = ((r * NB) & 31).to(gl.uint32)[None, None, :]
    K: gl.constexpr = 128 // U
    lo = gl.zeros([K, U, R], gl.uint32, L3)
    hi = gl.zeros([K, U, R], gl.uint32, L3)
    for k in gl.static_range(len(ys)):  # selects on constants: folded per register
        lo = gl.where(kk == k, ys[k][:, :, None], lo)
        hi = gl.where(kk + 1 == k, ys[k][:, :, None], hi)
    code = ((lo >> ss) | ((hi << 1) << (31 - ss))) & ((1 << NB) - 1)
    return code.to(gl.int32)


@gluon.jit
def _lookup(tab, tab_ptr, idx, TAB_SMEM: gl.constexpr):
    """tab[idx] for an index tensor of any shape: through `gl.gather` of the register-held table (one
    shared-memory copy, one load an index) or a gathered global load."""
    if TAB_SMEM:
        shape: gl.constexpr = idx.shape
        flat = gl.reshape(idx, [idx.numel])
        return gl.reshape(gl.gather(tab, flat, 0), shape)
    else:
        return gl.load(tab_ptr + idx)


# ---------------------------------------------------------------------------------------------------------
# decode sections: each turns the packed fields of 64 keys n0 .. n0 + 64 into its part of a ring stage

@gluon.jit
def _regs4(t):
    """The four entries of a [K, U, 4] tensor's last axis as four [K, U] tensors (register relabelling)."""
    ev, od = gl.split(gl.reshape(t, [t.shape[0], t.shape[1], 2, 2]))  # entries (0, 2) and (1, 3)
    t0, t2 = gl.split(ev)
    t1, t3 = gl.split(od)
    return t0, t1, t2, t3


@gluon.jit
def _oct_decode(dst, ws, wx, tab, tab_ptr, NB: gl.constexpr, TAB_SMEM: gl.constexpr):
    """octopus at d=64 (22 triplets, 64 useful coordinates) as one 64-column tile: key column 4i + c (c < 3)
    holds component c of triplet i (i < 16); column 4i + 3 holds component i % 3 of triplet 16 + i // 3 (the
    last six triplets' 16 useful coordinates: triplet 21 has only its x). `ws`: the words of triplets 0..15
    (units of 8); `wx`: unit u's words from triplet 16 + 2u (4 codes: the leftover triplets its 8 slots
    need)."""
    code = _unit_codes(_unit_funnel(ws, 0, 2, 8, NB), 2, 8, NB)
    rows = _lookup(tab, tab_ptr, code, TAB_SMEM)
    x, y, z, w = _bf16x4(rows)
    cx = _unit_codes(_unit_funnel(wx, 16, 2, 4, NB, 2), 2, 4, NB)
    xe, ye, ze, we = _bf16x4(_lookup(tab, tab_ptr, cx, TAB_SMEM))  # [64, 2, 4]: unit u's run entries
    e = (_regs4(xe), _regs4(ye), _regs4(ze))  # e[c][j]: component c of run entry j, [64, 2]
    u = gl.arange(0, 2, gl.SliceLayout(0, e[0][0].type.layout))[None, :]
    # slot r of unit u is slot i = 8u + r: triplet 16 + i // 3 = run entry i // 3 - 2u, component i % 3
    w0 = gl.where(u == 0, e[0][0], e[2][0])
    w1 = gl.where(u == 0, e[1][0], e[0][1])
    w2 = gl.where(u == 0, e[2][0], e[1][1])
    w3 = gl.where(u == 0, e[0][1], e[2][1])
    w4 = gl.where(u == 0, e[1][1], e[0][2])
    w5 = gl.where(u == 0, e[2][1], e[1][2])
    w6 = gl.where(u == 0, e[0][2], e[2][2])
    w7 = gl.where(u == 0, e[1][2], e[0][3])
    lo = gl.join(gl.join(w0, w1), gl.join(w2, w3))  # [64, 2, c, b]: slot 2b + c
    hi = gl.join(gl.join(w4, w5), gl.join(w6, w7))
    ww = gl.reshape(gl.permute(gl.join(lo, hi), (0, 1, 4, 3, 2)), [64, 2, 8])  # slot 4a + 2b + c
    k4 = gl.join(gl.join(x, z), gl.join(y, gl.convert_layout(ww, x.type.layout)))
    dst.store(gl.reshape(k4, [64, 64]))


@gluon.jit
def _words_raw(ptr, row0, n0, length, NW: gl.constexpr, R: gl.constexpr):
    """A [64, NW] word tile (a key's words over 2 lanes, `_words_layout(NW, R)`'s slice); zeros past
    length."""
    L2: gl.constexpr = gl.SliceLayout(2, _words_layout(NW, R))
    n = n0 + gl.arange(0, 64, gl.SliceLayout(1, L2))
    wi = gl.arange(0, NW, gl.SliceLayout(0, L2))
    return gl.load(ptr + (row0 + n)[:, None] * NW + wi[None, :], mask=(n < length)[:, None],
                   other=0).to(gl.uint32, bitcast=True)


@gluon.jit
def _tq_prmt_decode(dst, words, tlo, thi, NB: gl.constexpr, KO: gl.constexpr):
    """turboquant codes of NB = 1 or 2 bits (words [64, KW] from `_words_raw(.., 16 / NB)`) as bf16 table
    values through a byte permute: word w's pair p (codes j and j + 8 / NB, j = p % D + 2 D (p // D),
    D = 8 / NB) goes to key columns w C + 2p, + 1; then to key order KO (`_key_reorder`)."""
    P: gl.constexpr = 16 // NB
    DL: gl.constexpr = 8 // NB
    p = gl.arange(0, P, gl.SliceLayout(0, gl.SliceLayout(1, _words_layout(words.shape[1], P))))
    sh = ((p % DL + 2 * DL * (p // DL)) * NB).to(gl.uint32)
    x = words[:, :, None] >> sh[None, None, :]
    a, b = gl.inline_asm_elementwise(_prmt_asm(NB), "=h,=h,r,r,r", [x, tlo, thi],
                                     dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=1)
    dst.store(_key_reorder(_pairs_to_cols(a, b), NB, KO))


@gluon.jit
def _tq_gather_raw(kc_ptr, row0, n0, length, NB: gl.constexpr, KW: gl.constexpr):
    """The words of `_tq_gather_decode`'s two passes of 32 keys (units of 16 codes)."""
    return (_unit_loads(kc_ptr, row0, n0, length, 0, 4, 16, NB, KW),
            _unit_loads(kc_ptr, row0, n0 + 32, length, 0, 4, 16, NB, KW))


@gluon.jit
def _tq_gather_decode(dst, raw, tab, tab_ptr, NB: gl.constexpr, TAB_SMEM: gl.constexpr, KO: gl.constexpr):
    """turboquant codes of any width as bf16 centroids (a gathered table), key column j = coordinate j, then
    in key order KO (`_key_reorder`)."""
    for hp in gl.static_range(2):
        d = dst.slice(32 * hp, 32)
        code = _unit_codes(_unit_funnel(raw[hp], 0, 4, 16, NB), 4, 16, NB)
        v = _lookup(tab, tab_ptr, code, TAB_SMEM).to(gl.bfloat16, bitcast=True)
        d.store(_key_reorder(gl.reshape(v, [32, 64]), 0, KO))


@gluon.jit
def _polar_raw(kc_ptr, row0, n0, length, KW: gl.constexpr):
    """Every code word of keys n0 .. n0 + 64 for both units (a key's halves read them all; L1 hits), plus a
    zero word past the last."""
    L2: gl.constexpr = gl.SliceLayout(2, _unit_layout(2, 32))
    n = n0 + gl.arange(0, 64, gl.SliceLayout(1, L2))
    h = gl.arange(0, 2, gl.SliceLayout(0, L2))
    nok = (n < length)[:, None]
    rows = kc_ptr + (row0 + n)[:, None] * KW
    ws = ()
    for k in gl.static_range(KW + 1):
        ws = ws + (gl.load(rows + k + 0 * h[None, :], mask=nok & (k < KW), other=0).to(gl.uint32,
                                                                                       bitcast=True), )
    return ws


@gluon.jit
def _polar_decode(dst, ws, tab, NB: gl.constexpr, KW: gl.constexpr):
    """polarquant, top-down from radius 1: unit h (a key's half) owns coordinates 32h .. 32h + 32, i.e. the
    root angle's child h and its subtree (1 + 1 + 2 + 4 + 8 + 16 angles, 32 slots). Slot s of level lvl
    angle i is i 2^(lvl+1) + 2^lvl - 1 (the root: 31), so halving splits peel the levels off in order.
    Table row lvl 2^NB + code: (cos, sin) fp32. Key column j = coordinate j (natural order)."""
    L3: gl.constexpr = _unit_layout(2, 32)
    h = gl.arange(0, 2, gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    s = gl.arange(0, 32, gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    lo = gl.zeros([64, 2, 32], gl.uint32, L3)
    hi = gl.zeros([64, 2, 32], gl.uint32, L3)
    lvl_s = gl.zeros([32], gl.int32, gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    i_s = gl.zeros([32], gl.int32, gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    for lvl in gl.static_range(6):
        lo, hi, lvl_s, i_s = _polar_slots(ws, h, s, lo, hi, lvl_s, i_s, lvl, NB, KW)
    ss = ((i_s * NB) & 31).to(gl.uint32)[None, None, :]
    c = ((lo >> ss) | ((hi << 1) << (31 - ss))) & ((1 << NB) - 1)
    code = c.to(gl.int32) + (lvl_s * (1 << NB))[None, None, :]
    cs = _lookup(tab, tab, code, True)
    # peel the levels: level 0 at even slots, the rest at odd ones, and so on
    lv0, rest = gl.split(gl.reshape(cs, [64, 2, 16, 2]))
    lv1, rest = gl.split(gl.reshape(rest, [64, 2, 8, 2]))
    lv2, rest = gl.split(gl.reshape(rest, [64, 2, 4, 2]))
    lv3, rest = gl.split(gl.reshape(rest, [64, 2, 2, 2]))
    lv4, root = gl.split(gl.reshape(rest, [64, 2, 1, 2]))
    rc, rs = _f32x2(gl.convert_layout(root, _unit_layout(2, 1)))
    hh = gl.arange(0, 2, gl.SliceLayout(0, gl.SliceLayout(2, _unit_layout(2, 1))))
    r = gl.where((hh == 0)[None, :, None], rc, rs)  # [64, 2, 1]: the root's child h
    r = _polar_level(r, lv4)
    r = _polar_level(r, lv3)
    r = _polar_level(r, lv2)
    r = _polar_level(r, lv1)
    r = _polar_level(r, lv0)
    dst.store(gl.reshape(r.to(gl.bfloat16), [64, 64]))


@gluon.jit
def _polar_slots(ws, h, s, lo, hi, lvl_s, i_s, LVL: gl.constexpr, NB: gl.constexpr, KW: gl.constexpr):
    """Level LVL's slots of the [64, 2, 32] code cut: the words holding each slot's code (lo, hi) from the
    level's run of each half, and the slot's level and angle index."""
    if LVL < 5:
        in_lvl = (s % (2 << LVL)) == ((1 << LVL) - 1)
        i = s // (2 << LVL)
    else:
        in_lvl = s == 31
        i = s * 0
    kk = (i * NB) >> 5
    # the level's run for each half, funnel-shifted to its first code (constant per half): level LVL's angles
    # start at code 64 - (64 >> LVL), a half owns (32 >> LVL) / 2 of them (the root: 1, shared)
    SH: gl.constexpr = ((32 >> LVL) // 2) if LVL < 5 else 0
    START0: gl.constexpr = (64 - (64 >> LVL)) * NB
    START1: gl.constexpr = (64 - (64 >> LVL) + SH) * NB
    NWL: gl.constexpr = (max(SH, 1) * NB + 31) // 32 + 1
    for k in gl.static_range(NWL):
        y = gl.where(h[None, :] == 0, _polar_run(ws, START0 + 32 * k, KW),
                     _polar_run(ws, START1 + 32 * k, KW))
        lo = gl.where((in_lvl & (kk == k))[None, None, :], y[:, :, None], lo)
        hi = gl.where((in_lvl & (kk + 1 == k))[None, None, :], y[:, :, None], hi)
    return lo, hi, gl.where(in_lvl, LVL, lvl_s), gl.where(in_lvl, i, i_s)


@gluon.jit
def _polar_run(ws, START: gl.constexpr, KW: gl.constexpr):
    """32 bits of a key's code words from bit START (a constant): (w[k] >> o) | (w[k+1] << (32 - o)); words
    past the key's last are zero."""
    K0: gl.constexpr = START // 32
    O: gl.constexpr = START % 32
    if K0 >= KW:
        return ws[0] * 0
    elif O == 0:
        return ws[K0]
    else:
        return (ws[K0] >> O) | (ws[K0 + 1] << (32 - O))


@gluon.jit
def _polar_level(r, cs):
    """Radii r [64, 2, S] and their angles' (cos, sin) rows [64, 2, S] -> the next level's radii [64, 2, 2S]
    (r cos at even, r sin at odd positions)."""
    c, s = _f32x2(gl.convert_layout(cs, r.type.layout))
    x = gl.join(r * c, r * s)
    return gl.reshape(x, [64, 2, 2 * x.shape[2]])


@gluon.jit
def _vec_raw(ptr, row0, n0, length, L: gl.constexpr):
    """A per-key [64] vector (bf16 / fp16) in layout L; zeros past length."""
    n = n0 + gl.arange(0, 64, L)
    return gl.load(ptr + row0 + n, mask=n < length, other=0.0)


@gluon.jit
def _signs_raw(ks_ptr, kr_ptr, row0, n0, length, SW: gl.constexpr):
    L2: gl.constexpr = gl.SliceLayout(2, _words_layout(SW, 16))
    return (_words_raw(ks_ptr, row0, n0, length, SW, 16),
            _vec_raw(kr_ptr, row0, n0, length, gl.SliceLayout(1, L2)))


@gluon.jit
def _signs_decode(dst, raw):
    """QJL: +-gamma_r as bf16 (exact: the sign bit flipped where the stored bit is 0): word w's pair j
    (signs j and j + 16) goes to key columns 32 w + 2j, + 1."""
    words, gr = raw
    gg = _pack2(gr).to(gl.uint32, bitcast=True)
    j = gl.arange(0, 16, gl.SliceLayout(0, gl.SliceLayout(1, _words_layout(words.shape[1], 16))))
    x = (~words)[:, :, None] << (15 - j).to(gl.uint32)[None, None, :]
    v = (x & 0x80008000) ^ gg[:, None, None]
    a, b = _bf16x2(v.to(gl.int32, bitcast=True))
    dst.store(_pairs_to_cols(a, b))


@gluon.jit
def _values_raw(vc_ptr, vs_ptr, vm_ptr, row0, n0, length, NB: gl.constexpr, GROUP: gl.constexpr):
    """The value words [64, VW] of keys n0.. and each word's group scale and minimum (fp16)."""
    VW: gl.constexpr = 64 * NB // 32
    P: gl.constexpr = 16 // NB
    L2: gl.constexpr = gl.SliceLayout(2, _words_layout(VW, P))
    n = n0 + gl.arange(0, 64, gl.SliceLayout(1, L2))
    wi = gl.arange(0, VW, gl.SliceLayout(0, L2))
    nok = (n < length)[:, None]
    if (32 // NB) == GROUP:  # a word is a group: contiguous (vectorized) loads
        g = (row0 + n)[:, None] * (64 // GROUP) + wi[None, :]
    else:
        g = (row0 + n)[:, None] * (64 // GROUP) + ((wi * (32 // NB)) // GROUP)[None, :]
    return (_words_raw(vc_ptr, row0, n0, length, VW, P), gl.load(vs_ptr + g, mask=nok, other=0.0),
            gl.load(vm_ptr + g, mask=nok, other=0.0))


@gluon.jit
def _values_decode(dst, raw, NB: gl.constexpr, VO: gl.constexpr):
    """Group dequantization in fp16x2 into dst [64, 64] fp16: word w's pair j (codes j and j + C/2 of its C
    = 32 / NB) goes to columns w C + 2j, + 1 (`_true_order` puts them back); VO != NB: written in the
    value column order of VO bits instead (a wide prefix's values in the store's order)."""
    words, sc, mn = raw
    P: gl.constexpr = 16 // NB
    j = gl.arange(0, P, gl.SliceLayout(0, gl.SliceLayout(1, _words_layout(words.shape[1], P))))
    x = words[:, :, None] >> (j * NB).to(gl.uint32)[None, None, :]
    a, b = gl.inline_asm_elementwise(
        _dequant_asm(NB), "=h,=h,r,r,r",
        [x.to(gl.int32, bitcast=True), _pack2(sc)[:, :, None], _pack2(mn)[:, :, None]],
        dtype=(gl.float16, gl.float16), is_pure=True, pack=1)
    if VO == NB:
        dst.store(_pairs_to_cols(a, b))
    else:
        dst.store(_value_order(_true_order(_pairs_to_cols(a, b), NB), VO))


@gluon.jit
def _colv_store(cv, s, gamma, n0, length):
    """The column scale (gamma, [64] in the 1-D layout) and bias (0, or -inf for keys >= length) of 64 keys
    into stage s's vectors (cv rows 2s, 2s + 1)."""
    n = n0 + gl.arange(0, 64, gamma.type.layout)
    cv.index(2 * s).store(gamma.to(gl.float32))
    cv.index(2 * s + 1).store(gl.where(n < length, 0.0, float("-inf")))


@gluon.jit
def _unit_raw(n0, row0, length, kc_ptr, kg_ptr, ks_ptr, kr_ptr, vc_ptr, vs_ptr, vm_ptr, CODEC: gl.constexpr,
              NB: gl.constexpr, KW: gl.constexpr, SW: gl.constexpr, V_BITS: gl.constexpr,
              V_GROUP: gl.constexpr):
    """Every packed field of compressed keys n0 .. n0 + 64 as register tiles: (key words, signs, values,
    gamma); the parts a codec does not have are a placeholder zero."""
    HAS_C: gl.constexpr = (CODEC == TQJ) or (CODEC == OCJ)
    if CODEC == POL:
        keys = _polar_raw(kc_ptr, row0, n0, length, KW)
    elif CODEC == OCT or CODEC == OCJ:
        keys = (_unit_loads(kc_ptr, row0, n0, length, 0, 2, 8, NB, KW),
                _unit_loads(kc_ptr, row0, n0, length, 16, 2, 4, NB, KW, 2))
    elif NB <= 2:
        keys = _words_raw(kc_ptr, row0, n0, length, KW, 16 // NB)
    else:
        keys = _tq_gather_raw(kc_ptr, row0, n0, length, NB, KW)
    if HAS_C:
        signs = _signs_raw(ks_ptr, kr_ptr, row0, n0, length, SW)
    else:
        signs = 0
    gamma = _vec_raw(kg_ptr, row0, n0, length, gl.BlockedLayout([1], [32], [4], [0]))
    return keys, signs, _values_raw(vc_ptr, vs_ptr, vm_ptr, row0, n0, length, V_BITS, V_GROUP), gamma


@gluon.jit
def _unit_decode(raw, a, c, v, cv, s, n0, length, tab, tab_ptr, tlo, thi, CODEC: gl.constexpr,
                 NB: gl.constexpr, KW: gl.constexpr, V_BITS: gl.constexpr, TAB_SMEM: gl.constexpr,
                 KO: gl.constexpr, VO: gl.constexpr):
    """`_unit_raw`'s fields decoded into the stage's tiles a (c) and v and its column vectors, the keys in key
    order KO (`_key_order`), the values in the value column order of VO bits (a wide prefix's tiles: the
    store's orders; else the unit's own, NB's and V_BITS')."""
    keys, signs, values, gamma = raw
    HAS_C: gl.constexpr = (CODEC == TQJ) or (CODEC == OCJ)
    if CODEC == POL:
        _polar_decode(a, keys, tab, NB, KW)
    elif CODEC == OCT or CODEC == OCJ:
        _oct_decode(a, keys[0], keys[1], tab, tab_ptr, NB, TAB_SMEM)
    elif NB <= 2:
        _tq_prmt_decode(a, keys, tlo, thi, NB, KO)
    else:
        _tq_gather_decode(a, keys, tab, tab_ptr, NB, TAB_SMEM, KO)
    if HAS_C:
        _signs_decode(c, signs)
    _values_decode(v, values, V_BITS, VO)
    _colv_store(cv, s, gamma, n0, length)


@gluon.jit
def _window_section(ka, vt, cv, s, kw_base, vw_base, skt, svt, n0, t_win, qk_scale, V_BITS: gl.constexpr):
    """Native window keys n0 .. n0 + 64 (bf16, natural columns) into ka (the consumer scores a window tile
    with tile a alone), values as fp16 in the value column order, column scale qk_scale and bias 0 / -inf."""
    LW: gl.constexpr = _row_layout(64, 4)
    n = n0 + gl.arange(0, 64, gl.SliceLayout(1, LW))
    c = gl.arange(0, 64, gl.SliceLayout(0, LW))
    ok = (n < t_win)[:, None]
    ka.store(gl.load(kw_base + n[:, None] * skt + c[None, :], mask=ok, other=0.0))
    # values: word w's columns as [w, h, j] (true column w C + h C/2 + j) -> stored [w, j, h]
    C: gl.constexpr = 32 // V_BITS
    LV4: gl.constexpr = gl.BlockedLayout([1, 1, 2, C // 2], [16, 2, 1, 1], [4, 1, 1, 1], [3, 2, 1, 0])
    n4 = n0 + gl.arange(0, 64, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, LV4))))
    w4 = gl.arange(0, 64 // C, gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, LV4))))
    h4 = gl.arange(0, 2, gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, LV4))))
    j4 = gl.arange(0, C // 2, gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, LV4))))
    col = (w4 * C)[None, :, None, None] + (h4 * (C // 2))[None, None, :, None] + j4[None, None, None, :]
    v = gl.load(vw_base + n4[:, None, None, None] * svt + col, mask=(n4 < t_win)[:, None, None, None],
                other=0.0)
    v = gl.reshape(gl.permute(v.to(gl.float16), (0, 1, 3, 2)), [64, 64])
    vt.store(v)
    LV: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    nv = n0 + gl.arange(0, 64, LV)
    cv.index(2 * s).store(gl.full([64], qk_scale, gl.float32, LV))
    cv.index(2 * s + 1).store(gl.where(nv < t_win, 0.0, float("-inf")))
