"""Value decode helpers (@triton.jit): group dequantization of a tile of values in registers (`value_tile`,
the attention kernel), and the weighted accumulation of values by the score-table kernel
(`values_in_place` for groups of 16 channels up to 8 bits, `values_by_key` for the rest).

Values (formats.md): per key and head, groups of `group` channels, v_hat = code * scale + minimum with an fp16
scale and minimum per group, the codes a little-endian stream of int32 words.
"""

import triton
import triton.language as tl

from .bits import cut_codes, row_codes


@triton.jit
def value_tile(codes_ptr, scale_ptr, min_ptr, rows, row_ok, BN: tl.constexpr, D: tl.constexpr,
               GROUP: tl.constexpr, N_BITS: tl.constexpr, N_WORDS: tl.constexpr, WP: tl.constexpr,
               TILE: tl.constexpr):
    """Group dequantization: v_hat [BN, D] = code * scale + minimum, per group of GROUP channels."""
    G: tl.constexpr = D // GROUP
    j = tl.arange(0, D)[None, :]
    codes = row_codes(codes_ptr + rows[:, None] * N_WORDS, row_ok[:, None], j, N_BITS, N_WORDS, WP, TILE)
    codes = codes.to(tl.float32)
    gcol = rows[:, None] * G + tl.arange(0, G)[None, :]
    sc = tl.load(scale_ptr + gcol, mask=row_ok[:, None], other=0.0).to(tl.float32)
    mn = tl.load(min_ptr + gcol, mask=row_ok[:, None], other=0.0).to(tl.float32)
    v = tl.reshape(codes, (BN, G, GROUP)) * sc[:, :, None] + mn[:, :, None]
    return tl.reshape(v, (BN, D))


@triton.jit
def _as_float(codes):
    """Small non-negative integer codes as fp32 by the exponent trick: (c | 0x4B000000) - 2^23 (exact)."""
    return (codes | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _in_place_columns(G: tl.constexpr, V_BITS: tl.constexpr, GT: tl.constexpr):
    """Per-column constants of values_in_place's [R, 16 * GT] tiles, each [1, 16 * GT]: (group in the row,
    source, bit position of the code in its source). V_BITS | 32: source = the 16-bit half h of the group
    (word h // 2 of the group, shifted by 16 (h % 2)). Otherwise (GT = 2, the row's 32 codes are V_BITS whole
    words): source = 3 * word + kind, kind 0 the word itself (code below bit 23), 1 the word >> 16, 2 the
    word funnel-shifted with the next one (a code straddling them, moved to bit 0)."""
    col = tl.arange(0, 16 * GT)[None, :]
    if 32 % V_BITS == 0:
        PH: tl.constexpr = 16 // V_BITS  # codes per 16-bit half
        return col // 16, (col % 16) // PH, (col % PH) * V_BITS
    else:
        bit = col * V_BITS
        inw = bit % 32
        kind = tl.where(inw + V_BITS <= 23, 0, tl.where(inw + V_BITS <= 32, 1, 2))
        pos = tl.where(kind == 0, inw, tl.where(kind == 1, inw - 16, 0))
        return col // 16, 3 * (bit // 32) + kind, pos


@triton.jit
def _split_columns(t, K: tl.constexpr):
    """A [R, K] register tile (K in 1, 2, 4) as a tuple of its K columns, each [R, 1] (register relabelling:
    a row's K fields come from one vector load)."""
    if K == 1:
        return (t,)
    elif K == 2:
        a, b = tl.split(t)
        return (a[:, None], b[:, None])
    else:  # [R, 2, 2]: the last axis holds columns (0, 2) | (1, 3)
        ev, od = tl.split(tl.reshape(t, (t.shape[0], 2, 2)))
        c0, c2 = tl.split(ev)
        c1, c3 = tl.split(od)
        return (c0[:, None], c1[:, None], c2[:, None], c3[:, None])


@triton.jit
def _row_load(ptr, first, ok, K: tl.constexpr, other):
    """Entries first .. first + K of each row (first, ok [R, 1]; K in 1, 2, 4, 8) as a tuple of K [R, 1]
    tiles, loaded at most 4 at a time as one vector a thread (the row's entries are contiguous)."""
    out = ()
    KK: tl.constexpr = min(4, K)  # K is a power of two
    for k0 in tl.static_range(0, K, KK):
        t = tl.load(ptr + first + k0 + tl.arange(0, KK)[None, :], mask=ok, other=other)
        out = out + _split_columns(t, KK)
    return out


@triton.jit
def _in_place_loads(vc_ptr, vs_ptr, vm_ptr, s_ptr, n0, c1, G: tl.constexpr, V_BITS: tl.constexpr,
                    BLOCK_V: tl.constexpr, GT: tl.constexpr):
    """The packed fields of values_in_place's step at keys [n0, n0 + BLOCK_V) as [R, 1] register tiles, keys
    from c1 on masked off (a step wholly past c1 loads nothing): (scores, scales, minima, code words), the
    last three tuples over the row's GT groups (words: NW a group, or the pair's V_BITS words). A row's
    scales, minima and (for widths dividing 32) words are contiguous: one vector load each."""
    GR: tl.constexpr = G // GT  # rows a key
    R: tl.constexpr = BLOCK_V * GR
    NW: tl.constexpr = (V_BITS + 1) // 2  # words a group (V_BITS = 1: half a word)
    rho = tl.arange(0, R)[:, None]
    n = n0 + rho // GR
    ok = n < c1
    grow = n0 * G + rho * GT  # first (key, group) index of the row from the split's row start
    sc = _row_load(vs_ptr, grow, ok, GT, 0.0)
    mn = _row_load(vm_ptr, grow, ok, GT, 0.0)
    if V_BITS == 1:  # two groups a word: a row's GT <= 2 groups share word grow // 2 (grow is even at GT 2)
        w = tl.load(vc_ptr + (grow >> 1), mask=ok, other=0)
        ws = (w, w) if GT == 2 else (w,)
    elif 32 % V_BITS == 0:  # the row's GT groups own NW words each, contiguous from grow * NW
        ws = _row_load(vc_ptr, grow * NW, ok, NW * GT, 0)
    else:  # GT = 2: the pair of groups owns V_BITS words from word (grow / 2) * V_BITS
        ws = ()
        for wi in tl.static_range(V_BITS):
            ws = ws + (tl.load(vc_ptr + (grow // 2) * V_BITS + wi, mask=ok, other=0),)
    s = tl.load(s_ptr + n, mask=ok, other=float("-inf"), cache_modifier=".cg")
    return s, sc, mn, ws


@triton.jit
def _in_place_math(raw, n0, m, acc, acc_min, l_vec, G: tl.constexpr, V_BITS: tl.constexpr,
                   BLOCK_V: tl.constexpr, GT: tl.constexpr):
    """One step of values_in_place on `_in_place_loads`' fields of keys [n0, n0 + BLOCK_V)."""
    s, sc, mn_raw, ws = raw
    GR: tl.constexpr = G // GT
    R: tl.constexpr = BLOCK_V * GR
    C: tl.constexpr = 16 * GT
    NW: tl.constexpr = (V_BITS + 1) // 2
    rho = tl.arange(0, R)[:, None]
    cg, src, pos = _in_place_columns(G, V_BITS, GT)
    masks = (((1 << V_BITS) - 1) << pos).to(tl.uint32)
    gcol = tl.arange(0, GT)[None, :]
    inw = ((tl.arange(0, 16 * GT)[None, :] * V_BITS) % 32).to(tl.uint32)
    grow = n0 * G + rho * GT
    p = tl.exp2(s - m)
    pw = p * 1.2676506002282294e30  # p * 2^W_EXP, W_EXP = 100: p * scale * 2^100 < 2^116 (fp16 scales)
    wgt = tl.zeros((R, C), tl.float32)
    mn = tl.zeros((R, GT), tl.float32)
    hw = tl.zeros((R, C), tl.uint32)
    for gi in tl.static_range(GT):  # the selects fold per column
        wgt = tl.where(cg == gi, pw * sc[gi].to(tl.float32), wgt)
        mn = tl.where(gcol == gi, mn_raw[gi].to(tl.float32), mn)
        if 32 % V_BITS != 0:  # the row's codes are a stream of V_BITS words, cut after this loop
            pass
        elif V_BITS == 1:
            w = ws[gi].to(tl.uint32, bitcast=True)
            hw = tl.where(cg == gi, w >> (((grow + gi) & 1) * 16).to(tl.uint32), hw)
        else:  # half h of the group is its word h // 2, shifted by 16 (h % 2)
            for wi in tl.static_range(NW):
                w = ws[gi * NW + wi].to(tl.uint32, bitcast=True)
                hw = tl.where((cg == gi) & (src == 2 * wi), w, hw)
                hw = tl.where((cg == gi) & (src == 2 * wi + 1), w >> 16, hw)
    if 32 % V_BITS != 0:
        w_prev = tl.zeros((R, 1), tl.uint32)
        for wi in tl.static_range(V_BITS):
            w = ws[wi].to(tl.uint32, bitcast=True)
            hw = tl.where(src == 3 * wi, w, hw)
            hw = tl.where(src == 3 * wi + 1, w >> 16, hw)
            if wi > 0:  # codes straddling words wi - 1 and wi (a funnel shift; inw > 23 there)
                hw = tl.where(src == 3 * wi - 1, (w_prev >> inw) | (w << (32 - inw)), hw)
            w_prev = w
    x = (hw & masks).to(tl.float32, bitcast=True)
    acc += x * wgt
    acc_min += p * mn
    l_vec += p  # GR times each key's p: divided by GR (a power of two, exact) in in_place_sum
    return acc, acc_min, l_vec


@triton.jit
def values_in_place(vc_ptr, vs_ptr, vm_ptr, s_ptr, m, c0, c1, acc, acc_min, l_vec, G: tl.constexpr,
                     V_BITS: tl.constexpr, BLOCK_V: tl.constexpr, GT: tl.constexpr, STAGES: tl.constexpr = 0):
    """Phase 2 for groups of 16 channels at V_BITS in {1, 2, 4, 8}, two instructions a channel (mask, FMA):
    adds keys [c0, c1) to the accumulators acc [R, 16 GT], acc_min [R, GT], l_vec [R, 1] and returns them.

    Rows are GT consecutive groups of one key (R = BLOCK_V * G / GT a step, 16 * GT columns, a thread owns
    whole rows, so a key's score load and exp2 serve GT groups). A group's 16 codes are cut into 16-bit
    halves (one shift a word); code k of half h sits at bit pos_k = (k % (16 / V_BITS)) * V_BITS, and masking
    it in place gives the bit pattern of the fp32 subnormal c * 2^pos_k * 2^-149, exactly (the pattern stays
    below bit 16). The FMA multiplies it by p * scale * 2^W_EXP (a normal number; the product is normal for
    every term that matters, p * scale > 2^-50), and in_place_sum applies the per-column constant
    2^(149 - W_EXP - pos_k) (a power of two: exact) once. Needs IEEE subnormals in the FMA (Triton emits FFMA
    without .FTZ; the GPU runs it at full rate).

    STAGES 0: the next step's fields load before this step's arithmetic (a register double buffer; every
    load masked at c1): waiting on a step's own loads was the one-row kernel's main stall at 1 q x 128k keys,
    d=128 (Nsight Compute, benchmarks/results/kernels.md). STAGES >= 2: the compiler's software pipeline
    instead (asynchronous copies of STAGES - 1 steps ahead into shared memory, no registers held in flight;
    faster at d=64, slower at d=128 under the register cap: flash.TABLE_LAUNCH)."""
    if STAGES > 1:
        for n0 in tl.range(c0, c1, BLOCK_V, num_stages=STAGES):
            raw = _in_place_loads(vc_ptr, vs_ptr, vm_ptr, s_ptr, n0, c1, G, V_BITS, BLOCK_V, GT)
            acc, acc_min, l_vec = _in_place_math(raw, n0, m, acc, acc_min, l_vec, G, V_BITS, BLOCK_V, GT)
    else:
        raw = _in_place_loads(vc_ptr, vs_ptr, vm_ptr, s_ptr, c0, c1, G, V_BITS, BLOCK_V, GT)
        for n0 in range(c0, c1, BLOCK_V):
            nxt = _in_place_loads(vc_ptr, vs_ptr, vm_ptr, s_ptr, n0 + BLOCK_V, c1, G, V_BITS, BLOCK_V, GT)
            acc, acc_min, l_vec = _in_place_math(raw, n0, m, acc, acc_min, l_vec, G, V_BITS, BLOCK_V, GT)
            raw = nxt
    return acc, acc_min, l_vec


@triton.jit
def in_place_sum(acc, acc_min, l_vec, G: tl.constexpr, V_BITS: tl.constexpr, BLOCK_V: tl.constexpr,
                  GT: tl.constexpr):
    """(acc [G, 16], l) from values_in_place's accumulators: the column scales, the sum over rows."""
    GR: tl.constexpr = G // GT
    W_EXP: tl.constexpr = 100
    cg, half, pos = _in_place_columns(G, V_BITS, GT)
    # 2^(149 - W_EXP - pos) as a bit pattern (exact; exp2 of an integer need not be)
    col_scale = ((127 + 149 - W_EXP - pos) << 23).to(tl.float32, bitcast=True)
    acc = tl.reshape(tl.sum(tl.reshape(acc * col_scale, (BLOCK_V, GR, 16 * GT)), axis=0), (G, 16))
    acc_min = tl.reshape(tl.sum(tl.reshape(acc_min, (BLOCK_V, GR, GT)), axis=0), (G,))
    return acc + acc_min[:, None], tl.sum(tl.reshape(l_vec, (BLOCK_V * GR,)), 0) / GR


@triton.jit
def values_by_key(vc_ptr, vs_ptr, vm_ptr, s_ptr, m, start, end, D: tl.constexpr, V_GROUP: tl.constexpr,
                   V_BITS: tl.constexpr, V_WORDS: tl.constexpr, V_WP: tl.constexpr, BLOCK_V: tl.constexpr):
    """Phase 2, any width and group: each key's word tile cut in registers (cut_codes), [BLOCK_V, G, group]
    accumulated elementwise. Returns (acc [G, V_GROUP], l)."""
    G: tl.constexpr = D // V_GROUP
    acc3 = tl.zeros((BLOCK_V, G, V_GROUP), tl.float32)
    acc_min = tl.zeros((BLOCK_V, G), tl.float32)
    l_vec = tl.zeros((BLOCK_V,), tl.float32)
    wcol = tl.arange(0, V_WP)
    gcol = tl.arange(0, G)
    for n0 in range(start, end, BLOCK_V):
        n = n0 + tl.arange(0, BLOCK_V)
        n_ok = n < end
        p = tl.exp2(tl.load(s_ptr + n, mask=n_ok, other=float("-inf"), cache_modifier=".cg") - m)
        l_vec += p
        v_ok = n_ok[:, None] & (wcol < V_WORDS)[None, :]
        vw = tl.load(vc_ptr + n[:, None] * V_WORDS + wcol[None, :], mask=v_ok, other=0)
        codes = cut_codes(vw.to(tl.uint32, bitcast=True), tl.arange(0, D)[None, :], V_BITS)
        gidx = n[:, None] * G + gcol[None, :]
        sc = tl.load(vs_ptr + gidx, mask=n_ok[:, None], other=0.0).to(tl.float32)
        mn = tl.load(vm_ptr + gidx, mask=n_ok[:, None], other=0.0).to(tl.float32)
        pc = p[:, None]
        acc3 += tl.reshape(_as_float(codes), (BLOCK_V, G, V_GROUP)) * (pc * sc)[:, :, None]
        acc_min += pc * mn
    return tl.sum(acc3, axis=0) + tl.sum(acc_min, axis=0)[:, None], tl.sum(l_vec, 0)
