"""Single-query attention over an octopus store by table lookup: per-query score tables, then one pass a key.

With one query row per KV head the decoded key is used exactly once, so decoding it is waste: the score
of key n is a sum of per-triplet terms that depend only on the triplet's code,

    q . k_n = gamma_n * sum_i rho(c_ni) * (q_rot,i . n_hat(dir(c_ni)))           (octopus, formats.md)

so a table T[i, c] = qk_scale * rho(c) * (q_rot,i . n_hat(dir(c))) built once per query row turns the key loop
into one lookup and one add per triplet (asymmetric distance computation, as in product quantization). The
QJL term (R' q_rot) . sigma_n takes a second table over the sign bytes: S[p, e] = qk_scale * sum_t
q_j[8p + t] * (2 bit_t(e) - 1), one lookup per 8 signs. Tables live in global memory and are read through
L1 (a row's table is 11-22 KB at d = 64-128, b = 2).

Two phases per program, so each runs in the layout that suits it (one key a thread for the scores, keys x
channels for the values) with few registers and no per-block cross-thread reductions:
1. scores: each thread owns whole keys, loads a key's code words once each and cuts the codes with
   compile-time shifts (the unrolled loops), adds one table entry per triplet; the scores (log2 units,
   4 bytes a key) go to a scratch row, and their maximum m is kept.
2. values: p_n = 2^(s_n - m) (an exact two-pass softmax: m is known), and sum_n p_n (c_nj scale_ng +
   min_ng) accumulated elementwise per thread and reduced once at the end. Group-16 values up to 8 bits
   (_values_in_place): a channel costs one mask and one FMA, the code masked where it lies read as an fp32
   subnormal (c * 2^pos * 2^-149, exact) and the per-column power of two removed after the loop; other value
   formats cut each key's word tile (_values_by_key).
For group-16 values the phases alternate by stages of STAGE_K keys (an online softmax by stages: the running
maximum rescales the accumulators when it grows), so warps done with a stage's values score the next stage
while others still accumulate, and the scores are re-read while still in L2.
"""

import triton
import triton.language as tl

from .bits import cut_codes
from .flash_decode import _store_out


@triton.jit
def _cut(w_cur, w_next, SH: tl.constexpr, N_BITS: tl.constexpr):
    """The N_BITS-bit code starting at bit SH of w_cur (continuing into w_next when it straddles), int32."""
    if SH + N_BITS <= 32:
        c = (w_cur >> SH) & ((1 << N_BITS) - 1)
    else:
        c = ((w_cur >> SH) | (w_next << (32 - SH))) & ((1 << N_BITS) - 1)
    return c.to(tl.int32, bitcast=True)


@triton.jit
def _triplet_component(qs, had_ptr, k, i, C: tl.constexpr, D: tl.constexpr):
    """q_rot[3i + C] for the triplets i [TP] (zero beyond d), from qs = s_h * q / sqrt(d) [D]."""
    col = 3 * i + C
    hk = tl.load(had_ptr + k[:, None] * D + col[None, :], mask=(col < D)[None, :], other=0.0)
    return tl.sum(qs[:, None] * hk, axis=0)


@triton.jit
def _octopus_tables_kernel(q_ptr, rs_ptr, qs_ptr, had_ptr, dir_ptr, rho_ptr, lut_ptr, qlut_ptr,
                           H, inv_sqrt_d, qk_scale,
                           D: tl.constexpr, L: tl.constexpr, B_RHO: tl.constexpr,
                           FOLD_RHO: tl.constexpr, N_ENTRIES: tl.constexpr, CHUNK: tl.constexpr,
                           HAS_QJL: tl.constexpr, TP: tl.constexpr):
    """One program per (query row r, block of TP triplets) (KV head h = r % H): that part of the row's score
    tables; the block-0 programs also write the QJL table.

    q_rot = R q = H_d (s_h * q) / sqrt(d); triplet i's components are q_rot[3i + c] (zero beyond d).
    T[r, i, e] = qk_scale * C_rho[e & mask] * (q_rot,i . D[e >> B_RHO]) when FOLD_RHO (e < 2^n), else
    T[r, i, e] = qk_scale * (q_rot,i . D[e]) (e < 4^b_dir; rho is looked up in the attention loop).
    HAS_QJL: q_j = R' q_rot, S[r, p, e] = qk_scale * sum_t q_j[8p + t] * (2 ((e >> t) & 1) - 1).
    """
    r = tl.program_id(0)
    blk = tl.program_id(1)
    h = r % H
    k = tl.arange(0, D)
    qs = tl.load(q_ptr + r * D + k).to(tl.float32) * tl.load(rs_ptr + h * D + k) * inv_sqrt_d
    i = blk * TP + tl.arange(0, TP)
    live = i < L
    qx = _triplet_component(qs, had_ptr, k, i, 0, D)
    qy = _triplet_component(qs, had_ptr, k, i, 1, D)
    qz = _triplet_component(qs, had_ptr, k, i, 2, D)
    row_lut = lut_ptr + r * (L * N_ENTRIES)
    for e0 in tl.static_range(0, N_ENTRIES, CHUNK):
        e = e0 + tl.arange(0, CHUNK)
        if FOLD_RHO:
            dirn = e >> B_RHO
            rho = tl.load(rho_ptr + (e & ((1 << B_RHO) - 1)))
        else:
            dirn = e
            rho = tl.full((CHUNK,), 1.0, tl.float32)
        dx = tl.load(dir_ptr + dirn * 3)
        dy = tl.load(dir_ptr + dirn * 3 + 1)
        dz = tl.load(dir_ptr + dirn * 3 + 2)
        t = qx[:, None] * dx[None, :] + qy[:, None] * dy[None, :] + qz[:, None] * dz[None, :]
        t = t * (rho * qk_scale)[None, :]
        tl.store(row_lut + i[:, None] * N_ENTRIES + e[None, :], t, mask=live[:, None])
    if HAS_QJL and blk == 0:
        # q_rot along the contraction axis, then q_j = H_d (s'_h * q_rot) / sqrt(d)
        hfull = tl.load(had_ptr + k[:, None] * D + k[None, :])
        q_rot = tl.sum(qs[:, None] * hfull, axis=0)
        qr = q_rot[:, None] * tl.load(qs_ptr + h * D + k)[:, None] * inv_sqrt_d
        p = tl.arange(0, D // 8)
        byte = tl.arange(0, 256)
        s = tl.zeros((D // 8, 256), tl.float32)
        for bit in tl.static_range(8):
            col = 8 * p + bit
            hj = tl.load(had_ptr + k[:, None] * D + col[None, :])
            qj = tl.sum(qr * hj, axis=0)  # q_j[8p + t], [D/8]
            sgn = ((byte >> bit) & 1).to(tl.float32) * 2.0 - 1.0
            s += qj[:, None] * sgn[None, :]
        tl.store(qlut_ptr + r * (D // 8 * 256) + p[:, None] * 256 + byte[None, :], s * qk_scale)


@triton.jit
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
    _store_out(out_ptr + r * D + dcol, acc / tl.where(den > 0, den, 1.0), None)


@triton.jit
def _word_pair(krow, n_ok, WI: tl.constexpr, K_WORDS: tl.constexpr, MASKED: tl.constexpr):
    """Words WI and WI + 1 of each key row (one [BK, 2] load, a thread's two words adjacent: an 8-byte load
    when the rows are 8-byte aligned); the second is 0 past the row. MASKED: rows where n_ok is false."""
    if WI + 1 < K_WORDS:
        two = _ld(krow[:, None] + (WI + tl.arange(0, 2))[None, :], n_ok[:, None], 0, MASKED)
        a, b = tl.split(two.to(tl.uint32, bitcast=True))
    else:
        a = _ld(krow + WI, n_ok, 0, MASKED).to(tl.uint32, bitcast=True)
        b = tl.zeros_like(a)
    return a, b


@triton.jit
def _score_step(row_lut, qlut_ptr, rho_ptr, kc_ptr, kg_ptr, ks_ptr, kr_ptr, s_ptr, r, n0, end, qjl_coef, zero,
                m_vec, rho0, rho1, D: tl.constexpr, L: tl.constexpr, K_BITS: tl.constexpr,
                K_WORDS: tl.constexpr, B_RHO: tl.constexpr, N_ENTRIES: tl.constexpr, FOLD_RHO: tl.constexpr,
                HAS_QJL: tl.constexpr, BLOCK_K: tl.constexpr, PAIRS: tl.constexpr, MASKED: tl.constexpr):
    """One step of _store_scores: keys [n0, n0 + BLOCK_K), those from `end` on masked off when MASKED.

    Every code word and norm of the step is loaded first (PAIRS: two words a load) and every table read is
    predicated on all of them (`gate`, always true: `zero` is 0 at run time, but the compiler cannot know), so
    the compiler issues the step's loads together: one memory round trip a step instead of one per word
    (ptxas otherwise sinks each load to its first use)."""
    n = n0 + tl.arange(0, BLOCK_K)
    n_ok = n < end
    s = tl.zeros((BLOCK_K,), tl.float32)
    krow = kc_ptr + n.to(tl.int64) * K_WORDS
    S_WORDS: tl.constexpr = D // 32
    srow = ks_ptr + n.to(tl.int64) * S_WORDS
    gamma = _ld(kg_ptr + n, n_ok, 0.0, MASKED).to(tl.float32)
    ws = ()
    for wi in tl.static_range(0, K_WORDS, 1 + PAIRS):
        if PAIRS:
            pa, pb = _word_pair(krow, n_ok, wi, K_WORDS, MASKED)
            ws = ws + (pa, pb)
        else:
            ws = ws + (_ld(krow + wi, n_ok, 0, MASKED).to(tl.uint32, bitcast=True),)
    mix = gamma.to(tl.uint32, bitcast=True)
    for wi in tl.static_range(K_WORDS):
        mix = mix ^ ws[wi]
    if HAS_QJL:
        g_r = _ld(kr_ptr + n, n_ok, 0.0, MASKED).to(tl.float32)
        sws = ()
        for wi in tl.static_range(S_WORDS):
            sws = sws + (_ld(srow + wi, n_ok, 0, MASKED).to(tl.uint32, bitcast=True),)
            mix = mix ^ sws[wi]
        mix = mix ^ g_r.to(tl.uint32, bitcast=True)
    gate = (mix != 0x5BD1E995).to(tl.int32) + (zero == 0).to(tl.int32) > 0
    w_cur = ws[0]
    for wi in tl.static_range(K_WORDS):
        if wi + 1 >= K_WORDS:
            w_next = w_cur
        else:
            w_next = ws[wi + 1]
        for i in tl.static_range((32 * wi + K_BITS - 1) // K_BITS, (32 * wi + 31) // K_BITS + 1):
            if i < L:
                code = _cut(w_cur, w_next, i * K_BITS - 32 * wi, K_BITS)
                if FOLD_RHO:
                    s += tl.load(row_lut + i * N_ENTRIES + code, mask=gate)
                else:
                    t = tl.load(row_lut + i * N_ENTRIES + (code >> B_RHO), mask=gate)
                    if B_RHO == 1:
                        rho = tl.where((code & 1) != 0, rho1, rho0)
                    else:
                        rho = tl.load(rho_ptr + (code & ((1 << B_RHO) - 1)))
                    s += rho * t
        w_cur = w_next
    if HAS_QJL:
        sq = tl.zeros((BLOCK_K,), tl.float32)
        for wi in tl.static_range(S_WORDS):
            w = sws[wi]
            for byte in tl.static_range(4):
                e = ((w >> (8 * byte)) & 255).to(tl.int32, bitcast=True)
                sq += tl.load(qlut_ptr + r * (D // 8 * 256) + (4 * wi + byte) * 256 + e, mask=gate)
        s += qjl_coef * g_r * sq
    s = s * gamma
    if MASKED:
        tl.store(s_ptr + n, s, mask=n_ok)
        return tl.maximum(m_vec, tl.where(n_ok, s, float("-inf")))
    else:
        tl.store(s_ptr + n, s)
        return tl.maximum(m_vec, s)


@triton.jit
def _store_scores(lut_ptr, qlut_ptr, rho_ptr, kc_ptr, kg_ptr, ks_ptr, kr_ptr, s_ptr, r, start, end, qjl_coef,
                  zero, D: tl.constexpr, L: tl.constexpr, K_BITS: tl.constexpr, K_WORDS: tl.constexpr,
                  B_RHO: tl.constexpr, N_ENTRIES: tl.constexpr, FOLD_RHO: tl.constexpr, HAS_QJL: tl.constexpr,
                  BLOCK_K: tl.constexpr, PAIRS: tl.constexpr):
    """Phase 1: the scores (log2 units) of compressed keys [start, end) of row r into s_ptr; their maximum.
    The key pointers (kc, kg, ks, kr) and s_ptr point at row r already; the tables are indexed by r.

    A thread owns whole keys: it loads each code word of its key once and cuts the codes with constant
    shifts (the unrolled loops), then adds one table entry per triplet (and one per 8 QJL signs). Whole
    steps run without load masks, the tail step with them."""
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
        m_vec = _score_step(row_lut, qlut_ptr, rho_ptr, kc_ptr, kg_ptr, ks_ptr, kr_ptr, s_ptr, r, n0, end,
                            qjl_coef, zero, m_vec, rho0, rho1, D, L, K_BITS, K_WORDS, B_RHO, N_ENTRIES,
                            FOLD_RHO, HAS_QJL, BLOCK_K, PAIRS, False)
    if full < end:
        m_vec = _score_step(row_lut, qlut_ptr, rho_ptr, kc_ptr, kg_ptr, ks_ptr, kr_ptr, s_ptr, r, full, end,
                            qjl_coef, zero, m_vec, rho0, rho1, D, L, K_BITS, K_WORDS, B_RHO, N_ENTRIES,
                            FOLD_RHO, HAS_QJL, BLOCK_K, PAIRS, True)
    return tl.max(m_vec, 0)


@triton.jit
def _as_float(codes):
    """Small non-negative integer codes as fp32 by the exponent trick: (c | 0x4B000000) - 2^23 (exact)."""
    return (codes | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _in_place_columns(G: tl.constexpr, V_BITS: tl.constexpr, GT: tl.constexpr):
    """Per-column constants of _values_in_place's [R, 16 * GT] tiles, each [1, 16 * GT]: (group in the row,
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
def _ld(ptr, ok, other, MASKED: tl.constexpr, CG: tl.constexpr = False):
    """tl.load with the mask only where MASKED (the tail step); CG: through L2 only (.cg)."""
    if MASKED:
        if CG:
            return tl.load(ptr, mask=ok, other=other, cache_modifier=".cg")
        else:
            return tl.load(ptr, mask=ok, other=other)
    else:
        if CG:
            return tl.load(ptr, cache_modifier=".cg")
        else:
            return tl.load(ptr)


@triton.jit
def _in_place_step(vc_ptr, vs_ptr, vm_ptr, s_ptr, m, n0, c1, acc, acc_min, l_vec, G: tl.constexpr,
                   V_BITS: tl.constexpr, BLOCK_V: tl.constexpr, GT: tl.constexpr, MASKED: tl.constexpr):
    """One step of _values_in_place: keys [n0, n0 + BLOCK_V), those from c1 on masked off when MASKED."""
    GR: tl.constexpr = G // GT  # rows a key
    R: tl.constexpr = BLOCK_V * GR
    C: tl.constexpr = 16 * GT
    NW: tl.constexpr = (V_BITS + 1) // 2  # words a group (V_BITS = 1: half a word)
    rho = tl.arange(0, R)[:, None]  # [R, 1]: per-row values in the layout of the [R, C] tiles
    cg, src, pos = _in_place_columns(G, V_BITS, GT)
    masks = (((1 << V_BITS) - 1) << pos).to(tl.uint32)
    gcol = tl.arange(0, GT)[None, :]
    inw = ((tl.arange(0, 16 * GT)[None, :] * V_BITS) % 32).to(tl.uint32)
    n = n0 + rho // GR
    ok = n < c1
    grow = n0 * G + rho * GT  # first (key, group) index of the row from the split's row start
    p = tl.exp2(_ld(s_ptr + n, ok, float("-inf"), MASKED, True) - m)
    pw = p * 1.2676506002282294e30  # p * 2^W_EXP, W_EXP = 100: p * scale * 2^100 < 2^116 (fp16 scales)
    wgt = tl.zeros((R, C), tl.float32)
    mn = tl.zeros((R, GT), tl.float32)
    hw = tl.zeros((R, C), tl.uint32)
    for gi in tl.static_range(GT):  # every load is [R, 1], once; the selects fold per column
        sc_g = _ld(vs_ptr + grow + gi, ok, 0.0, MASKED).to(tl.float32)
        mn_g = _ld(vm_ptr + grow + gi, ok, 0.0, MASKED).to(tl.float32)
        wgt = tl.where(cg == gi, pw * sc_g, wgt)
        mn = tl.where(gcol == gi, mn_g, mn)
        if 32 % V_BITS != 0:  # the row's codes are a stream of V_BITS words, cut after this loop
            pass
        elif V_BITS == 1:  # two groups a word
            w = _ld(vc_ptr + ((grow + gi) >> 1), ok, 0, MASKED).to(tl.uint32, bitcast=True)
            hw = tl.where(cg == gi, w >> (((grow + gi) & 1) * 16).to(tl.uint32), hw)
        else:  # half h of the group is its word h // 2, shifted by 16 (h % 2)
            for wi in tl.static_range(NW):
                w = _ld(vc_ptr + (grow + gi) * NW + wi, ok, 0, MASKED).to(tl.uint32, bitcast=True)
                hw = tl.where((cg == gi) & (src == 2 * wi), w, hw)
                hw = tl.where((cg == gi) & (src == 2 * wi + 1), w >> 16, hw)
    if 32 % V_BITS != 0:  # GT = 2: the pair of groups owns V_BITS words from word (grow / 2) * V_BITS
        w_prev = tl.zeros((R, 1), tl.uint32)
        for wi in tl.static_range(V_BITS):
            w = _ld(vc_ptr + (grow // 2) * V_BITS + wi, ok, 0, MASKED).to(tl.uint32, bitcast=True)
            hw = tl.where(src == 3 * wi, w, hw)
            hw = tl.where(src == 3 * wi + 1, w >> 16, hw)
            if wi > 0:  # codes straddling words wi - 1 and wi (a funnel shift; inw > 23 there)
                hw = tl.where(src == 3 * wi - 1, (w_prev >> inw) | (w << (32 - inw)), hw)
            w_prev = w
    x = (hw & masks).to(tl.float32, bitcast=True)
    acc += x * wgt
    acc_min += p * mn
    l_vec += p  # GR times each key's p: divided by GR (a power of two, exact) in _in_place_sum
    return acc, acc_min, l_vec


@triton.jit
def _values_in_place(vc_ptr, vs_ptr, vm_ptr, s_ptr, m, c0, c1, acc, acc_min, l_vec, G: tl.constexpr,
                     V_BITS: tl.constexpr, BLOCK_V: tl.constexpr, GT: tl.constexpr):
    """Phase 2 for groups of 16 channels at V_BITS in {1, 2, 4, 8}, two instructions a channel (mask, FMA):
    adds keys [c0, c1) to the accumulators acc [R, 16 GT], acc_min [R, GT], l_vec [R, 1] and returns them.

    Rows are GT consecutive groups of one key (R = BLOCK_V * G / GT a step, 16 * GT columns, a thread owns
    whole rows, so a key's score load and exp2 serve GT groups). A group's 16 codes are cut into 16-bit
    halves (one shift a word); code k of half h sits at bit pos_k = (k % (16 / V_BITS)) * V_BITS, and masking
    it in place gives the bit pattern of the fp32 subnormal c * 2^pos_k * 2^-149, exactly (the pattern stays
    below bit 16). The FMA multiplies it by p * scale * 2^W_EXP (a normal number; the product is normal for
    every term that matters, p * scale > 2^-50), and _in_place_sum applies the per-column constant
    2^(149 - W_EXP - pos_k) (a power of two: exact) once. Needs IEEE subnormals in the FMA (Triton emits FFMA
    without .FTZ; the GPU runs it at full rate)."""
    full = c0 + (c1 - c0) // BLOCK_V * BLOCK_V  # whole steps without masks, then the tail step with them
    for n0 in range(c0, full, BLOCK_V):
        acc, acc_min, l_vec = _in_place_step(vc_ptr, vs_ptr, vm_ptr, s_ptr, m, n0, c1, acc, acc_min, l_vec, G,
                                             V_BITS, BLOCK_V, GT, False)
    if full < c1:
        acc, acc_min, l_vec = _in_place_step(vc_ptr, vs_ptr, vm_ptr, s_ptr, m, full, c1, acc, acc_min, l_vec,
                                             G, V_BITS, BLOCK_V, GT, True)
    return acc, acc_min, l_vec


@triton.jit
def _in_place_sum(acc, acc_min, l_vec, G: tl.constexpr, V_BITS: tl.constexpr, BLOCK_V: tl.constexpr,
                  GT: tl.constexpr):
    """(acc [G, 16], l) from _values_in_place's accumulators: the column scales, the sum over rows."""
    GR: tl.constexpr = G // GT
    W_EXP: tl.constexpr = 100
    cg, half, pos = _in_place_columns(G, V_BITS, GT)
    # 2^(149 - W_EXP - pos) as a bit pattern (exact; exp2 of an integer need not be)
    col_scale = ((127 + 149 - W_EXP - pos) << 23).to(tl.float32, bitcast=True)
    acc = tl.reshape(tl.sum(tl.reshape(acc * col_scale, (BLOCK_V, GR, 16 * GT)), axis=0), (G, 16))
    acc_min = tl.reshape(tl.sum(tl.reshape(acc_min, (BLOCK_V, GR, GT)), axis=0), (G,))
    return acc + acc_min[:, None], tl.sum(tl.reshape(l_vec, (BLOCK_V * GR,)), 0) / GR


@triton.jit
def _values_by_key(vc_ptr, vs_ptr, vm_ptr, s_ptr, m, start, end, D: tl.constexpr, V_GROUP: tl.constexpr,
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


@triton.jit
def _window_scores(qn_ptr, kw_base, stride_kwt, r, t_win, qk_scale, D: tl.constexpr, BLOCK_W: tl.constexpr):
    """Scores (log2 units) of the first BLOCK_W native window keys, -inf past t_win."""
    n = tl.arange(0, BLOCK_W)
    n_ok = n < t_win
    dcol = tl.arange(0, D)
    qn = tl.load(qn_ptr + r * D + dcol).to(tl.float32)
    kt = tl.load(kw_base + n[:, None] * stride_kwt + dcol[None, :], mask=n_ok[:, None], other=0.0)
    return tl.where(n_ok, tl.sum(kt.to(tl.float32) * qn[None, :], axis=1) * qk_scale, float("-inf"))


@triton.jit
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
    V_GT: tl.constexpr, STAGE_K: tl.constexpr,
):
    """One (query row, split) program: score tables instead of decoded keys (module docstring).

    Split s covers compressed keys [s*chunk, (s+1)*chunk); the last split also covers the native window
    (at most BLOCK_W keys, score q . k * qk_scale). Phase 1 writes the split's scores to s_ptr (row r,
    t_cap entries) and takes their maximum m; phase 2 (after a barrier) reads them back and accumulates
    p = 2^(s - m) times the dequantized values, elementwise per thread, reduced once at the end. DIRECT:
    one split writes the normalised output; otherwise o/l and the log2-sum-exp go to the partial buffers
    of the merge kernel. Group-16 values up to 8 bits go through _values_in_place (V_GT groups of a key a
    thread row; widths not dividing 32 need V_GT = 2), the split in stages of STAGE_K keys, each scored, then
    its values accumulated, the accumulators rescaled when the running maximum grows; other value formats
    through _values_by_key after the whole split is scored. The score phase loads code words two at a time
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
                                D, L, K_BITS, K_WORDS, B_RHO, N_ENTRIES, FOLD_RHO, HAS_QJL, BLOCK_K, PAIRS)
            tl.debug_barrier()
            if m_c > m_run:
                alpha = tl.exp2(m_run - m_c)  # 0 at the first stage
                acc_t *= alpha
                acc_min *= alpha
                l_vec *= alpha
                m_run = m_c
            acc_t, acc_min, l_vec = _values_in_place(vc_ptr + row * V_WORDS, vs_ptr + row * G,
                                                     vm_ptr + row * G, s_row, m_run, c0, c1, acc_t, acc_min,
                                                     l_vec, G, V_BITS, BLOCK_V, V_GT)
        s_win = _window_scores(qn_ptr, kw_base, stride_kwt, r, n_win, qk_scale, D, BLOCK_W)
        m = tl.maximum(m_run, tl.max(s_win, 0))
        m = tl.where(m == float("-inf"), 0.0, m)
        alpha = tl.exp2(m_run - m)
        acc, l_i = _in_place_sum(acc_t * alpha, acc_min * alpha, l_vec * alpha, G, V_BITS, BLOCK_V, V_GT)
    else:
        m = _store_scores(lut_ptr, qlut_ptr, rho_ptr, kc_ptr + row * K_WORDS, kg_ptr + row,
                          ks_ptr + row * (D // 32), kr_ptr + row, s_row, r, start, end, qjl_coef, zero,
                          D, L, K_BITS, K_WORDS, B_RHO, N_ENTRIES, FOLD_RHO, HAS_QJL, BLOCK_K, PAIRS)
        s_win = _window_scores(qn_ptr, kw_base, stride_kwt, r, n_win, qk_scale, D, BLOCK_W)
        m = tl.maximum(m, tl.max(s_win, 0))
        m = tl.where(m == float("-inf"), 0.0, m)
        tl.debug_barrier()

        # phase 2: sum_n p_n (c_nj * scale_ng + min_ng)
        acc, l_i = _values_by_key(vc_ptr + row * V_WORDS, vs_ptr + row * G, vm_ptr + row * G, s_row, m,
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
        _store_out(out_ptr + r * D + dcol, o, None)
    else:
        part = pid_s * total_rows + r
        tl.store(opart_ptr + part * D + dcol, o)
        tl.store(lse_ptr + part, m + tl.log2(l_i))
