"""The polarquant key encode as a Gluon kernel for Hopper (sm_90), one key row a thread: `encode_keys`'
default where `scope.encode_limit` finds a call in scope (an H200, d = 64, 16-bit keys, the widths measured
faster); the Triton key encode (impls/encode.py) everywhere else, and the reference this kernel is tested
against.

Math (impls/encode.py, kinds/polar._polar_codes, operation for operation): gamma = ||k|| (fp32: the row scaled
by the power of two 2^-e taking max|k| into [1, 2), squared, summed, the root scaled back; stored bf16,
rounded to nearest even); y = 2^-e (s_h * k) H_64, the rotation a matmul with the +-1 Hadamard matrix
(exact products in the keys' dtype, fp32 sums); the angles do not depend on y's positive scale.
Level 1, pairs (a, b) = (y_2i, y_2i+1): psi = atan2(b, a) against the boundaries beta_k, decided by the
signs of b cos beta_k - a sin beta_k (for b < 0 on the reflected pair, the middle boundary on its own, pairs
on an axis or a diagonal from 3 bits by the reference's own code). Levels l >= 2 on the squared radii
r2 = a^2 + b^2 of the level below, pairs (e, o): the count of k with o cos^2 beta_k - e sin^2 beta_k > 0.
Codes go out as the N-bit stream of formats.md (code j at bit N j of the row's words).

Why a Gluon kernel: the Triton encode keeps the rotated tile in the wgmma accumulator layout, where a row's 64
coordinates sit in four lanes, so every level of the angle tree and the codes' packing go through layout
conversions and the upper levels run replicated across lanes. Here the rotated tile is converted once to one
row a thread, and the tree, the norm and the packing run in that thread's registers (sm_90, b = 2: 73.2
against 90.5 warp-instructions a key, 128 against 168 registers; H200 at 64k tokens x 16 heads: 0.125 against
0.172 ms, benchmarks/results/kernels.md).

Launch: 128 rows a program, 4 warps (one warp group: the wgmma's rows), unfused fp32 arithmetic as the Triton
encode.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

from ...bits import bf16_bits
from ...spec import KernelCodec, PackedKeys
from ..encode import key_norm, key_tables

HEAD_DIM = 64
ROWS = 128  # key rows a program: one a thread of one warp group
WARPS = 4
LEVELS = gl.constexpr(6)  # log2(HEAD_DIM): the angle tree's levels


@gluon.constexpr_function
def _rows_layout():
    """[128, 64]: one row a thread (4 warps)."""
    return gl.BlockedLayout([1, 64], [32, 1], [4, 1], [1, 0])


@gluon.jit
def _count(o, e, c_ptr, s_ptr, NBITS: gl.constexpr):
    """#{k < 2^NBITS - 1 : o c_k - e s_k > 0} for boundaries whose test holds on a prefix of k
    (kinds/polar._cross_count: its fma and product; compares up to 3 bits, a binary search beyond)."""
    if NBITS <= 3:
        acc = (gl.fma(o, gl.load(c_ptr), -(e * gl.load(s_ptr))) > 0).to(gl.int32)
        for k in gl.static_range(1, (1 << NBITS) - 1):
            acc += (gl.fma(o, gl.load(c_ptr + k), -(e * gl.load(s_ptr + k))) > 0).to(gl.int32)
        return acc
    else:
        idx = gl.full(o.shape, 0, gl.int32, o.type.layout)
        for level in gl.static_range(NBITS):
            j = idx + ((1 << (NBITS - 1 - level)) - 1)
            hit = gl.fma(o, gl.load(c_ptr + j), -(e * gl.load(s_ptr + j))) > 0
            idx = gl.where(hit, idx + (1 << (NBITS - 1 - level)), idx)
        return idx


@gluon.jit
def _unstack(t):
    """The S entries of t [..., S] along its last axis (S a power of two, in one thread's registers) as a
    tuple of [...] tensors, in order (splits only: a register relabelling)."""
    S: gl.constexpr = t.shape[-1]
    if S == 1:
        return (gl.reshape(t, t.shape[:-1]),)
    else:
        e, o = gl.split(gl.reshape(t, t.shape[:-1] + [S // 2, 2]))
        ev = _unstack(e)
        od = _unstack(o)
        out = ()
        for i in gl.static_range(S // 2):
            out = out + (ev[i], od[i])
        return out


@gluon.jit
def _level1(a, b, trig_ptr, N_BITS: gl.constexpr):
    """Level-1 angle codes of the pairs (a, b) (kinds/polar._polar_codes)."""
    NB: gl.constexpr = (1 << N_BITS) - 1
    H: gl.constexpr = 1 << (N_BITS - 1)
    c_ptr = trig_ptr
    s_ptr = trig_ptr + LEVELS * NB
    neg = b < 0
    ar = gl.where(neg, -a, a)
    br = gl.abs(b)
    s_mid = gl.load(s_ptr + (H - 1))
    cross = gl.fma(b, gl.load(c_ptr + (H - 1)), -(a * s_mid)) > 0
    below_pi = s_mid > 0
    mid = gl.where(neg, cross | below_pi, cross & below_pi)
    codes = gl.where(neg, H - 1, 0) + mid.to(gl.int32)
    if N_BITS > 1:
        codes += _count(br, ar, c_ptr, s_ptr, N_BITS - 1)
    if N_BITS >= 3:
        # (a, b) on an axis or a diagonal: the reference's code from the table (9 cases after the trig rows)
        sa = (a.to(gl.int32, bitcast=True) >> 31) & 1
        sb = (b.to(gl.int32, bitcast=True) >> 31) & 1
        bz = b == 0
        az = a == 0
        k = gl.where(bz, sa * (4 + 4 * sb), gl.where(az, 2 + 4 * sb, 1 + 2 * (2 * sb + (sa ^ sb))))
        tie = bz | az | (gl.abs(a) == gl.abs(b))
        codes = gl.where(tie, gl.load(trig_ptr + 2 * LEVELS * NB + k).to(gl.int32), codes)
    return codes


@gluon.jit
def _upper(r2, trig_ptr, LVL: gl.constexpr, N_BITS: gl.constexpr):
    """The codes of levels LVL >= 1 (0-based) from the squared radii r2 [R, 2S] of the level below, as a
    tuple of [R] tensors in stream order."""
    NB: gl.constexpr = (1 << N_BITS) - 1
    R: gl.constexpr = r2.shape[0]
    S: gl.constexpr = r2.shape[1] // 2
    e, o = gl.split(gl.reshape(r2, [R, S, 2]))
    codes = _unstack(_count(o, e, trig_ptr + LVL * NB, trig_ptr + (LEVELS + LVL) * NB, N_BITS))
    if S == 1:
        return codes
    else:
        return codes + _upper(e + o, trig_ptr, LVL + 1, N_BITS)


@gluon.jit
def _word(codes, W: gl.constexpr, N_BITS: gl.constexpr):
    """Word W of the N_BITS-bit stream of `codes` (a tuple of [R] int32, code j at bit N j), uint32."""
    J0: gl.constexpr = (32 * W) // N_BITS
    J1: gl.constexpr = min((32 * W + 31) // N_BITS + 1, len(codes))
    w = codes[J0].to(gl.uint32, bitcast=True) * 0
    for j in gl.static_range(J0, J1):
        u = codes[j].to(gl.uint32, bitcast=True)
        if j * N_BITS >= 32 * W:  # the code starts in this word
            w = w | (u << (j * N_BITS - 32 * W))
        else:  # it started in the word before: its high bits
            w = w | (u >> (32 * W - j * N_BITS))
    return w


@gluon.jit
def _polar_encode_kernel(k_ptr, rs_ptr, had_ptr, trig_ptr, codes_ptr, gamma_ptr, n_rows, T, H,
                         N_BITS: gl.constexpr, K_WORDS: gl.constexpr, ALIGNED: gl.constexpr):
    """Rows [128 pid, 128 pid + 128) of K [..., H, T, 64] (contiguous, 16-bit; row r is token r % T of head
    (r // T) % H) -> K_WORDS code words and gamma (bf16 bits) a row. rs_ptr [H, 64]: the heads' rotation
    signs, had_ptr [64, 64]: H_64, both in the keys' dtype; trig_ptr: kinds/polar._polar_trig. ALIGNED:
    T % 128 == 0 (a program's rows lie in one head)."""
    ROW: gl.constexpr = _rows_layout()
    pid = gl.program_id(0)
    r = pid * 128 + gl.arange(0, 128, layout=gl.SliceLayout(1, ROW))
    c = gl.arange(0, 64, layout=gl.SliceLayout(0, ROW))
    ok = r < n_rows
    x = gl.load(k_ptr + r.to(gl.int64)[:, None] * 64 + c[None, :], mask=ok[:, None], other=0.0)
    gamma, scale = key_norm(x.to(gl.float32))  # impls/encode.py's @triton.jit helper, compiled as Gluon
    gl.store(gamma_ptr + r, bf16_bits(gamma), mask=ok)
    # the rotation: (x * signs) @ H_64 on the tensor cores (+-1 factors: exact), then one conversion to a
    # row a thread
    if ALIGNED:
        sgn = gl.load(rs_ptr + ((pid * 128 // T) % H) * 64 + c)[None, :]
    else:
        sgn = gl.load(rs_ptr + ((r // T) % H)[:, None] * 64 + c[None, :])
    DT: gl.constexpr = x.dtype
    a_s = gl.allocate_shared_memory(DT, [128, 64], gl.NVMMASharedLayout.get_default_for([128, 64], DT))
    h_s = gl.allocate_shared_memory(DT, [64, 64], gl.NVMMASharedLayout.get_default_for([64, 64], DT))
    HL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    hr = gl.arange(0, 64, layout=gl.SliceLayout(1, HL))
    hc = gl.arange(0, 64, layout=gl.SliceLayout(0, HL))
    h_s.store(gl.load(had_ptr + hr[:, None] * 64 + hc[None, :]))
    a_s.store(x * sgn)
    fence_async_shared()
    gl.thread_barrier()
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 64, 16])
    acc = warpgroup_mma(a_s, h_s, gl.zeros([128, 64], gl.float32, MMA), use_acc=False)
    y = gl.convert_layout(acc, ROW) * scale[:, None]
    a, b = gl.split(gl.reshape(y, [128, 32, 2]))
    codes = _unstack(_level1(a, b, trig_ptr, N_BITS)) + _upper(gl.fma(a, a, b * b), trig_ptr, 1, N_BITS)
    out = codes_ptr + r.to(gl.int64) * K_WORDS
    for w in gl.static_range(K_WORDS):
        word = gl.convert_layout(_word(codes, w, N_BITS), gl.SliceLayout(1, ROW))  # the same map: no movement
        gl.store(out + w, word.to(gl.int32, bitcast=True), mask=ok)


def encode_keys_gluon(k: torch.Tensor, codec: KernelCodec) -> PackedKeys:
    """K [..., H, T, 64] (bf16 or fp16, on an sm_90 GPU; the selector checks the scope) -> PackedKeys (codes
    [..., H, T, W] int32, gamma [..., H, T] bf16) of a polarquant codec, with the Triton key encode's cached
    tables in the keys' dtype (`key_tables`: the Hadamard matrix [64, 64], the heads' signs [H, 64], the
    polar kind's trig table)."""
    k = k.contiguous()
    tables = key_tables(codec, k.dtype)
    had, signs, trig = tables[0], tables[2], tables[7]
    h, t = k.shape[-3], k.shape[-2]
    lead = k.shape[:-1]
    n_rows = k.numel() // HEAD_DIM
    words = codec.code_words
    codes = torch.empty(*lead, words, device=k.device, dtype=torch.int32)
    gamma = torch.empty(*lead, device=k.device, dtype=torch.bfloat16)
    if n_rows:
        _polar_encode_kernel[(triton.cdiv(n_rows, ROWS),)](
            k, signs, had, trig, codes, gamma.view(torch.int16), n_rows, t, h, N_BITS=codec.code_bits,
            K_WORDS=words, ALIGNED=t % ROWS == 0, num_warps=WARPS, enable_fp_fusion=False)
    return PackedKeys(codes, gamma, None, None)
