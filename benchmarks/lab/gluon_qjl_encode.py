"""Lab: the turboquant-qjl key encode (d=64, 16-bit keys, b = 2-4) as a Gluon kernel that runs everything but
its two dots one row a thread (as gluon_polar_encode.py does for polarquant), against the product's `tl`
kernel (kernels/encode.py, codec_encode._scalar_encode).

Per row: gamma = ||k|| (encode._key_norm), the rotation (x s) @ H on the tensor cores, converted once to one
row a thread; u = RN(y / (gamma sqrt(d))) (codec_encode._unit_coords, _div_row), the index of each coordinate
against the b - 1 bit boundaries (_index: compares, symmetric from 3 bits), the residual r = u - C[index] and
||r||, then R' r: (r * qjl signs) split in three bf16 parts and multiplied by H in three chained wgmmas (as
_dot_pm1), converted back to one row a thread for the signs. Every operation is the product's, compiled
unfused, so codes, signs and gamma_r must equal encode_keys' (gamma: its sum in another order).
LANES 2 gives each row to two adjacent lanes (32 columns a thread, 64 rows a block): half the registers a
row-tensor, and at b - 1 = 1 bit each lane owns whole code and sign words. Compiled for sm_90 only so far
(no run yet).

    PYTHONPATH=/tmp/t36only python benchmarks/lab/gluon_qjl_encode.py --compile --bits 2,3,4   # no GPU
    PYTHONPATH=$PWD python3 benchmarks/lab/gluon_qjl_encode.py --bits 2,3,4 --out $OUT/gluon_qjl.json
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

_spec = importlib.util.spec_from_file_location(
    "gluon_polar_encode", os.path.join(os.path.dirname(os.path.abspath(__file__)), "gluon_polar_encode.py"))
polar = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(polar)
_unstack, _word, _key_norm, _bf16_bits = polar._unstack, polar._word, polar._key_norm, polar._bf16_bits

D = 64
ROWS = 128


@gluon.jit
def _count_above(x, bnd_ptr, NB: gl.constexpr):
    """#{i < NB : x > beta_i} (codec_encode._count_above's compares)."""
    acc = (x > gl.load(bnd_ptr)).to(gl.int32)
    for i in gl.static_range(1, NB):
        acc += (x > gl.load(bnd_ptr + i)).to(gl.int32)
    return acc


@gluon.jit
def _index(x, bnd_ptr, N_BITS: gl.constexpr):
    """codec_encode._index with SYM for N_BITS <= 3: compares, the symmetric form from 3 bits."""
    if N_BITS >= 3:
        H: gl.constexpr = 1 << (N_BITS - 1)
        pos = x > 0
        ax = (gl.abs(x).to(gl.int32, bitcast=True) + gl.where(pos, 0, 1)).to(gl.float32, bitcast=True)
        cnt = _count_above(ax, bnd_ptr + H, H - 1)
        return gl.where(pos, H + cnt, (H - 1) - cnt)
    else:
        return _count_above(x, bnd_ptr, (1 << N_BITS) - 1)


@gluon.jit
def _centroid(i, cent_ptr, N_BITS: gl.constexpr):
    """C[i] by selects over the 2^N_BITS centroids (the same values as a table read)."""
    v = gl.where(i == 0, gl.load(cent_ptr), gl.load(cent_ptr + 1))
    for k in gl.static_range(2, 1 << N_BITS):
        v = gl.where(i == k, gl.load(cent_ptr + k), v)
    return v


@gluon.constexpr_function
def _lanes_layout(lanes):
    """[128 / lanes, 64]: one row to `lanes` adjacent lanes, 64 / lanes contiguous columns a thread."""
    return gl.BlockedLayout([1, 64 // lanes], [32 // lanes, lanes], [4, 1], [1, 0])


@gluon.jit
def _store_stream(ptr, t, r, c, ok, N_BITS: gl.constexpr, ROW_WORDS: gl.constexpr, LANES: gl.constexpr):
    """Pack the codes t [R, 64] (N_BITS bits, code j at bit N j of its row's stream) and store the row's
    ROW_WORDS words at ptr + row * ROW_WORDS: one row a thread (LANES 1), or each of two lanes packing its
    32 columns into its own N_BITS words (LANES 2)."""
    R: gl.constexpr = t.shape[0]
    if LANES == 1:
        codes = _unstack(t)
        for w in gl.static_range(ROW_WORDS):
            word = gl.convert_layout(_word(codes, w, N_BITS), gl.SliceLayout(1, t.type.layout))
            gl.store(ptr + r.to(gl.int64) * ROW_WORDS + w, word.to(gl.int32, bitcast=True), mask=ok)
    else:
        codes = _unstack(gl.reshape(t, [R, 2, 32]))
        first = _unstack(gl.reshape(r.to(gl.int64)[:, None] * ROW_WORDS + (c[None, :] // 32) * N_BITS,
                                         [R, 2, 32]))[0]
        okk = _unstack(gl.reshape(ok[:, None] & (c[None, :] >= 0), [R, 2, 32]))[0]
        for w in gl.static_range(N_BITS):
            word = gl.convert_layout(_word(codes, w, N_BITS), first.type.layout)
            gl.store(ptr + first + w, word.to(gl.int32, bitcast=True), mask=okk)


@gluon.jit
def _qjl_encode_kernel(k_ptr, rs_ptr, had_ptr, qs_ptr, cent_ptr, bnd_ptr, codes_ptr, gamma_ptr, signs_ptr,
                       gamma_r_ptr, n_rows, T, H, inv_sqrt_d, N_BITS: gl.constexpr, K_WORDS: gl.constexpr,
                       ALIGNED: gl.constexpr, LANES: gl.constexpr):
    """Rows [RB pid, RB pid + RB) (RB = 128 / LANES) of K [B, H, T, 64] (contiguous, 16-bit) -> K_WORDS code
    words, gamma, 2 sign words, gamma_r a row (bf16 as int16 bits); LANES lanes a row."""
    RB: gl.constexpr = 128 // LANES
    ROW: gl.constexpr = _lanes_layout(LANES)
    pid = gl.program_id(0)
    r = pid * RB + gl.arange(0, RB, layout=gl.SliceLayout(1, ROW))
    c = gl.arange(0, 64, layout=gl.SliceLayout(0, ROW))
    ok = r < n_rows
    x = gl.load(k_ptr + r.to(gl.int64)[:, None] * 64 + c[None, :], mask=ok[:, None], other=0.0)
    xf = x.to(gl.float32)
    gamma, _ = _key_norm(xf)
    gl.store(gamma_ptr + r, _bf16_bits(gamma), mask=ok)
    gmax = gl.maximum(gamma, 1e-30)[:, None]
    inv_g = gl.div_rn(1.0, gmax)
    if ALIGNED:
        hoff = ((pid * RB // T) % H) * 64
        sgn = gl.load(rs_ptr + hoff + c)[None, :]
        qsg = gl.load(qs_ptr + hoff + c)[None, :]
    else:
        hoff = ((r // T) % H)[:, None] * 64
        sgn = gl.load(rs_ptr + hoff + c[None, :])
        qsg = gl.load(qs_ptr + hoff + c[None, :])
    DT: gl.constexpr = x.dtype
    a_s = gl.allocate_shared_memory(DT, [RB, 64], gl.NVMMASharedLayout.get_default_for([RB, 64], DT))
    h_s = gl.allocate_shared_memory(DT, [64, 64], gl.NVMMASharedLayout.get_default_for([64, 64], DT))
    p_s = gl.allocate_shared_memory(gl.bfloat16, [3, RB, 64],
                                    gl.NVMMASharedLayout.get_default_for([RB, 64], gl.bfloat16))
    hb_s = gl.allocate_shared_memory(gl.bfloat16, [64, 64], gl.NVMMASharedLayout.get_default_for([64, 64],
                                                                                               gl.bfloat16))
    HL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    hr = gl.arange(0, 64, layout=gl.SliceLayout(1, HL))
    hc = gl.arange(0, 64, layout=gl.SliceLayout(0, HL))
    had = gl.load(had_ptr + hr[:, None] * 64 + hc[None, :])
    h_s.store(had)
    hb_s.store(had.to(gl.float32).to(gl.bfloat16))
    a_s.store(x * sgn)
    fence_async_shared()
    gl.thread_barrier()
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 64, 16])
    y = gl.convert_layout(warpgroup_mma(a_s, h_s, gl.zeros([RB, 64], gl.float32, MMA), use_acc=False), ROW)
    # _unit_coords at LOG2D = 6 (even): _div_row(y, gmax * 8, inv_g * inv_sqrt_d)
    bq = gmax * 8
    inv_b = inv_g * inv_sqrt_d
    q = y * inv_b
    u = gl.fma(gl.fma(q, -bq, y), inv_b, q)
    i_u = _index(u, bnd_ptr, N_BITS)
    _store_stream(codes_ptr, i_u, r, c, ok, N_BITS, K_WORDS, LANES)  # now: frees the codes' registers
    res = u - _centroid(i_u, cent_ptr, N_BITS)
    gl.store(gamma_r_ptr + r, _bf16_bits(gl.sqrt_rn(gl.sum(res * res, axis=1))), mask=ok)
    # R' r as _dot_pm1 with SPLIT: three bf16 parts, each product by +-1 exact, fp32 accumulation in order
    a = res * qsg
    hi = a.to(gl.bfloat16)
    r1 = a - hi.to(gl.float32)
    mid = r1.to(gl.bfloat16)
    lo = (r1 - mid.to(gl.float32)).to(gl.bfloat16)
    p_s.index(0).store(hi)
    p_s.index(1).store(mid)
    p_s.index(2).store(lo)
    fence_async_shared()
    gl.thread_barrier()
    acc = warpgroup_mma(p_s.index(0), hb_s, gl.zeros([RB, 64], gl.float32, MMA), use_acc=False)
    acc = warpgroup_mma(p_s.index(1), hb_s, acc)
    acc = warpgroup_mma(p_s.index(2), hb_s, acc)
    _store_stream(signs_ptr, (gl.convert_layout(acc, ROW) >= 0).to(gl.int32), r, c, ok, 1, 2, LANES)


def words(code_bits: int) -> int:
    return -(-D * code_bits // 32)


def compile_sm90(bits_list: list[int], dtype: str) -> int:
    for bits, lanes in ((b, lanes) for b in bits_list for lanes in (1, 2)):
        consts = {"N_BITS": bits - 1, "K_WORDS": words(bits - 1), "ALIGNED": True, "LANES": lanes}
        types = {"k_ptr": f"*{dtype}", "rs_ptr": f"*{dtype}", "had_ptr": f"*{dtype}", "qs_ptr": "*fp32",
                 "cent_ptr": "*fp32", "bnd_ptr": "*fp32", "codes_ptr": "*i32", "gamma_ptr": "*i16",
                 "signs_ptr": "*i32", "gamma_r_ptr": "*i16", "inv_sqrt_d": "fp32"}
        u = polar.sm90_usage(_qjl_encode_kernel, types, consts)
        print(f"turboquant-qjl b={bits} {dtype} {lanes} lane(s) a row: registers {u['registers']}, stack "
              f"{u['stack']}, shared {u['shared']} B, "
              f"{u['instructions'] * 4 * lanes / ROWS:.1f} warp-instructions a key", flush=True)
    return 0


def run_gpu(out: Path, tokens: int, heads: int, bits_list: list[int], dtype: torch.dtype) -> int:
    import math

    import triton

    from octopus_audio import backend, get_codec
    from octopus_audio.kernels import encode

    dev = torch.device("cuda")
    rows_out = []
    cases = [(b, t, lanes) for b in bits_list for t in (tokens, tokens - 37) for lanes in (1, 2)]
    for bits, t, lanes in cases:
        kc = backend.kernel_codec(get_codec("turboquant-qjl", bits, D), heads, dev)
        g = torch.Generator(device=dev).manual_seed(bits)
        k = torch.randn(1, heads, t, D, generator=g, device=dev).to(dtype)
        ref = encode.encode_keys(k, kc)
        rows = heads * t
        nb = kc.code_bits
        nw = words(nb)
        out_t = dict(codes=torch.empty(rows, nw, device=dev, dtype=torch.int32),
                     gamma=torch.empty(rows, device=dev, dtype=torch.bfloat16),
                     signs=torch.empty(rows, 2, device=dev, dtype=torch.int32),
                     gamma_r=torch.empty(rows, device=dev, dtype=torch.bfloat16))
        tabs = (kc.rotation_signs.to(dtype).contiguous(), kc.hadamard.to(dtype).contiguous(),
                kc.qjl_signs.float().contiguous(), kc.table("centroids").float().contiguous(),
                kc.table("boundaries").float().contiguous())

        def launch(k=k, o=out_t, tabs=tabs, rows=rows, t=t, nb=nb, nw=nw, lanes=lanes):
            _qjl_encode_kernel[(triton.cdiv(rows, ROWS // lanes),)](
                k, *tabs, o["codes"], o["gamma"].view(torch.int16), o["signs"],
                o["gamma_r"].view(torch.int16), rows, t, heads, 1.0 / math.sqrt(D), N_BITS=nb, K_WORDS=nw,
                ALIGNED=t % (ROWS // lanes) == 0, LANES=lanes, num_warps=4, enable_fp_fusion=False)

        launch()
        torch.cuda.synchronize()

        def differ(a, b):
            return (a.reshape(b.shape) != b).float().mean().item()

        row = {"bits": bits, "tokens": t, "heads": heads, "lanes": lanes, "dtype": str(dtype),
               "codes_differing": differ(ref.codes, out_t["codes"]),
               "signs_differing": differ(ref.signs, out_t["signs"]),
               "gamma_differing": differ(ref.gamma, out_t["gamma"]),
               "gamma_r_differing": differ(ref.gamma_r, out_t["gamma_r"]),
               "gluon_ms": triton.testing.do_bench(launch, warmup=10, rep=50, return_mode="median"),
               "tl_encode_keys_ms": triton.testing.do_bench(lambda k=k, kc=kc: encode.encode_keys(k, kc),
                                                            warmup=10, rep=50, return_mode="median")}
        print(json.dumps(row), flush=True)
        rows_out.append(row)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows_out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(polar.cli(__doc__.splitlines()[0], "turboquant-qjl", (2, 3, 4), compile_sm90, run_gpu))
