"""Single-query attention over an octopus store by table lookup: per-query score tables, then one pass a key.

With one query row per KV head the decoded key is used exactly once, so decoding it is waste: the score
of key n is a sum of per-triplet terms that depend only on the triplet's code,

    q . k_n = gamma_n * sum_i rho(c_ni) * (q_rot,i . n_hat(dir(c_ni)))           (octopus, formats.md)

so a table T[i, c] = qk_scale * rho(c) * (q_rot,i . n_hat(dir(c))) built once per query row turns the key loop
into one lookup and one add per triplet (asymmetric distance computation, as in product quantization). The
QJL term (R' q_rot) . sigma_n takes a second table over the sign bytes: S[p, e] = qk_scale * sum_t
q_j[8p + t] * (2 bit_t(e) - 1), one lookup per 8 signs. Tables live in global memory and are read through
L1 (a row's table is 11-22 KB at d = 64-128, b = 2).

Each thread owns whole keys: it loads a key's code words one column at a time and cuts the codes with
compile-time shifts (the unrolled loop below), so no per-code address arithmetic is spent on the words.
Values are group-dequantized in the original frame as in flash_decode; the probability p_n and the group
scale multiply first (p_n * scale_ng), so a channel costs one shift, one bit-or, one subtract and one FMA
(the int -> float conversion is the exponent trick `(c | 0x4B000000) - 2^23`, exact for c < 2^23).
The online softmax rescales lazily: the running maximum moves only when a block's maximum exceeds it by
more than RESCALE (log2 units), which keeps p <= 2^RESCALE and is exact after the final division.
"""

import triton
import triton.language as tl

from .bits import bf16_value, cut_codes


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
    """q_rot[3i + C] for the triplets i [LP] (zero beyond d), from qs = s_h * q / sqrt(d) [D]."""
    col = 3 * i + C
    hk = tl.load(had_ptr + k[:, None] * D + col[None, :], mask=(col < D)[None, :], other=0.0)
    return tl.sum(qs[:, None] * hk, axis=0)


@triton.jit
def _octopus_tables_kernel(q_ptr, rs_ptr, qs_ptr, had_ptr, dir_ptr, rho_ptr, lut_ptr, qlut_ptr,
                           H, inv_sqrt_d, qk_scale,
                           D: tl.constexpr, L: tl.constexpr, LP: tl.constexpr, B_RHO: tl.constexpr,
                           FOLD_RHO: tl.constexpr, N_ENTRIES: tl.constexpr, CHUNK: tl.constexpr,
                           HAS_QJL: tl.constexpr):
    """One program per query row r (KV head h = r % H): the score tables of that row.

    q_rot = R q = H_d (s_h * q) / sqrt(d); triplet i's components are q_rot[3i + c] (zero beyond d).
    T[r, i, e] = qk_scale * C_rho[e & mask] * (q_rot,i . D[e >> B_RHO]) when FOLD_RHO (e < 2^n), else
    T[r, i, e] = qk_scale * (q_rot,i . D[e]) (e < 4^b_dir; rho is looked up in the attention loop).
    HAS_QJL: q_j = R' q_rot, S[r, p, e] = qk_scale * sum_t q_j[8p + t] * (2 ((e >> t) & 1) - 1).
    """
    r = tl.program_id(0)
    h = r % H
    k = tl.arange(0, D)
    qs = tl.load(q_ptr + r * D + k).to(tl.float32) * tl.load(rs_ptr + h * D + k) * inv_sqrt_d
    i = tl.arange(0, LP)
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
    if HAS_QJL:
        # q_rot along the contraction axis, then q_j = H_d (s'_h * q_rot) / sqrt(d)
        hfull = tl.load(had_ptr + k[:, None] * D + k[None, :])
        q_rot = tl.sum(qs[:, None] * hfull, axis=0)
        qr = q_rot[:, None] * tl.load(qs_ptr + h * D + k)[:, None] * inv_sqrt_d
        p = tl.arange(0, D // 8)
        e = tl.arange(0, 256)
        s = tl.zeros((D // 8, 256), tl.float32)
        for bit in tl.static_range(8):
            col = 8 * p + bit
            hj = tl.load(had_ptr + k[:, None] * D + col[None, :])
            qj = tl.sum(qr * hj, axis=0)  # q_j[8p + t], [D/8]
            sgn = ((e >> bit) & 1).to(tl.float32) * 2.0 - 1.0
            s += qj[:, None] * sgn[None, :]
        tl.store(qlut_ptr + r * (D // 8 * 256) + p[:, None] * 256 + e[None, :], s * qk_scale)


@triton.jit
def _adc_attn_kernel(
    lut_ptr, qlut_ptr, qn_ptr, rho_ptr,
    kc_ptr, kg_ptr, ks_ptr, kr_ptr,
    vc_ptr, vs_ptr, vm_ptr,
    kw_ptr, vw_ptr, stride_kwb, stride_kwh, stride_kwt, stride_vwb, stride_vwh, stride_vwt,
    out_ptr, opart_ptr, lse_ptr,
    H, t_cap, t_comp, t_win, chunk, n_splits, total_rows, qk_scale, qjl_coef,
    D: tl.constexpr, L: tl.constexpr, K_BITS: tl.constexpr, K_WORDS: tl.constexpr, B_RHO: tl.constexpr,
    N_ENTRIES: tl.constexpr, FOLD_RHO: tl.constexpr, HAS_QJL: tl.constexpr,
    V_GROUP: tl.constexpr, V_BITS: tl.constexpr, V_WORDS: tl.constexpr, V_WP: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, RESCALE: tl.constexpr, DIRECT: tl.constexpr,
):
    """One (query row, split) program: score tables instead of decoded keys (module docstring).

    Split s covers compressed keys [s*chunk, (s+1)*chunk); the last split also covers the native window
    (score q . k * qk_scale). DIRECT: one split writes the normalised output; otherwise o/l and the
    log2-sum-exp go to the partial buffers of flash_decode's merge kernel.
    """
    r = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = r // H
    h = r % H
    G: tl.constexpr = D // V_GROUP
    row_lut = lut_ptr + r * (L * N_ENTRIES)
    k_base = kc_ptr + r.to(tl.int64) * t_cap * K_WORDS
    v_base = vc_ptr + r.to(tl.int64) * t_cap * V_WORDS
    g_base = r.to(tl.int64) * t_cap
    if not FOLD_RHO:
        rho0 = tl.load(rho_ptr)
        rho1 = tl.load(rho_ptr + 1)

    m_i = tl.full((), float("-inf"), tl.float32)
    l_i = tl.zeros((), tl.float32)
    acc = tl.zeros((G, V_GROUP), tl.float32)
    acc_min = tl.zeros((G,), tl.float32)
    wcol = tl.arange(0, V_WP)
    gcol = tl.arange(0, G)

    start = pid_s * chunk
    end = tl.minimum(start + chunk, t_comp)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < end
        # scores: one table lookup per triplet, codes cut from each key's words with constant shifts
        s = tl.zeros((BLOCK_N,), tl.float32)
        krow = k_base + n * K_WORDS
        w_cur = tl.load(krow, mask=n_ok, other=0).to(tl.uint32, bitcast=True)
        for wi in tl.static_range(K_WORDS):
            if wi + 1 < K_WORDS:
                w_next = tl.load(krow + (wi + 1), mask=n_ok, other=0).to(tl.uint32, bitcast=True)
            else:
                w_next = w_cur
            for i in tl.static_range((32 * wi + K_BITS - 1) // K_BITS, (32 * wi + 31) // K_BITS + 1):
                if i < L:
                    code = _cut(w_cur, w_next, i * K_BITS - 32 * wi, K_BITS)
                    if FOLD_RHO:
                        s += tl.load(row_lut + i * N_ENTRIES + code)
                    else:
                        t = tl.load(row_lut + i * N_ENTRIES + (code >> B_RHO))
                        if B_RHO == 1:
                            rho = tl.where((code & 1) != 0, rho1, rho0)
                        else:
                            rho = tl.load(rho_ptr + (code & ((1 << B_RHO) - 1)))
                        s += rho * t
            w_cur = w_next
        if HAS_QJL:
            S_WORDS: tl.constexpr = D // 32
            srow = ks_ptr + g_base * S_WORDS + n * S_WORDS
            sq = tl.zeros((BLOCK_N,), tl.float32)
            for wi in tl.static_range(S_WORDS):
                w = tl.load(srow + wi, mask=n_ok, other=0).to(tl.uint32, bitcast=True)
                for byte in tl.static_range(4):
                    e = ((w >> (8 * byte)) & 255).to(tl.int32, bitcast=True)
                    sq += tl.load(qlut_ptr + r * (D // 8 * 256) + (4 * wi + byte) * 256 + e)
            g_r = tl.load(kr_ptr + g_base + n, mask=n_ok, other=0.0).to(tl.float32)
            s += qjl_coef * g_r * sq
        gamma = tl.load(kg_ptr + g_base + n, mask=n_ok, other=0.0).to(tl.float32)
        s = tl.where(n_ok, s * gamma, float("-inf"))

        # lazy online softmax (the maximum moves by more than RESCALE or not at all)
        m_blk = tl.max(s, 0)
        if m_blk > m_i + RESCALE:
            alpha = tl.exp2(m_i - m_blk)
            acc = acc * alpha
            acc_min = acc_min * alpha
            l_i = l_i * alpha
            m_i = m_blk
        p = tl.exp2(s - m_i)
        l_i += tl.sum(p, 0)

        # values: sum_n p_n (c_nj * scale_ng + min_ng), codes to float by the exponent trick
        v_ok = n_ok[:, None] & (wcol < V_WORDS)[None, :]
        vw = tl.load(v_base + n[:, None] * V_WORDS + wcol[None, :], mask=v_ok, other=0)
        vw = vw.to(tl.uint32, bitcast=True)
        codes = cut_codes(vw, tl.arange(0, D)[None, :], V_BITS)
        cf = (codes | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
        gidx = (g_base + n)[:, None] * G + gcol[None, :]
        sc = tl.load(vs_ptr + gidx, mask=n_ok[:, None], other=0.0).to(tl.float32)
        mn = tl.load(vm_ptr + gidx, mask=n_ok[:, None], other=0.0).to(tl.float32)
        pc = tl.reshape(p, (BLOCK_N, 1))
        acc += tl.sum(tl.reshape(cf, (BLOCK_N, G, V_GROUP)) * (pc * sc)[:, :, None], axis=0)
        acc_min += tl.sum(pc * mn, axis=0)

    # native window: the last split's tail, scores q . k in the original frame
    w_end = tl.where(pid_s == n_splits - 1, t_win, 0)
    dcol = tl.arange(0, D)
    qn = tl.load(qn_ptr + r * D + dcol).to(tl.float32)
    kw_base = kw_ptr + b * stride_kwb + h * stride_kwh
    vw_base = vw_ptr + b * stride_vwb + h * stride_vwh
    for n0 in range(0, w_end, BLOCK_W):
        n = n0 + tl.arange(0, BLOCK_W)
        n_ok = n < t_win
        kt = tl.load(kw_base + n[:, None] * stride_kwt + dcol[None, :], mask=n_ok[:, None], other=0.0)
        s = tl.where(n_ok, tl.sum(kt.to(tl.float32) * qn[None, :], axis=1) * qk_scale, float("-inf"))
        m_blk = tl.max(s, 0)
        if m_blk > m_i + RESCALE:
            alpha = tl.exp2(m_i - m_blk)
            acc = acc * alpha
            acc_min = acc_min * alpha
            l_i = l_i * alpha
            m_i = m_blk
        p = tl.exp2(s - m_i)
        l_i += tl.sum(p, 0)
        vt = tl.load(vw_base + n[:, None] * stride_vwt + dcol[None, :], mask=n_ok[:, None], other=0.0)
        pv = tl.reshape(vt.to(tl.float32), (BLOCK_W, G, V_GROUP)) * tl.reshape(p, (BLOCK_W, 1, 1))
        acc += tl.sum(pv, axis=0)

    o = tl.reshape(acc + acc_min[:, None], (D,))
    if DIRECT:
        o = o / tl.where(l_i > 0, l_i, 1.0)
        if out_ptr.dtype.element_ty == tl.bfloat16:
            o = bf16_value(o)
        tl.store(out_ptr + r * D + dcol, o.to(out_ptr.dtype.element_ty))
    else:
        part = pid_s * total_rows + r
        tl.store(opart_ptr + part * D + dcol, o / tl.where(l_i > 0, l_i, 1.0))
        tl.store(lse_ptr + part, m_i + tl.log2(l_i))
