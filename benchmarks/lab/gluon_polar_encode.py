"""Lab: the polarquant key encode (b=2, d=64, 16-bit keys) as a Gluon kernel whose angle tree runs in a
row-per-thread layout, against the product's `tl` kernel (kernels/encode.py).

Why: the `tl` kernel keeps the rotated tile in the wgmma accumulator layout, where a row's 64 coordinates
sit in four lanes, so every level of the angle tree (`tl.split(tl.reshape(...))`) and the codes'
concatenation go through layout conversions, and the upper levels run replicated across lanes (about a fifth
of its SASS; benchmarks/results/kernels.md, "Session 16"). Here the rotated tile is converted once to one row
a thread, and the whole tree, the norm and the packing run in that thread's registers.

The arithmetic is the product's, operation for operation (codec_encode._polar_codes, _cross_count,
encode._key_norm): the same fma / compare sequences decide every code, so codes must equal encode_keys'
exactly; gamma is summed in another order (stored bf16: rare last-bit differences).

    PYTHONPATH=/tmp/t36only python benchmarks/lab/gluon_polar_encode.py --compile   # sm_90 SASS, no GPU
    PYTHONPATH=$PWD python3 benchmarks/lab/gluon_polar_encode.py --out $OUT/gluon_polar.json   # on the H200
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

D = 64
ROWS = 128
LEVELS = 6
N_BITS = 2
NB = 3  # boundaries a level


@gluon.constexpr_function
def _rows_layout():
    """[128, 64]: one row a thread (4 warps)."""
    return gl.BlockedLayout([1, 64], [32, 1], [4, 1], [1, 0])


@gluon.jit
def _count(o, e, c_ptr, s_ptr, NK: gl.constexpr):
    """#{k < NK : o c_k - e s_k > 0} (codec_encode._cross_count's test, its fma and product)."""
    acc = (gl.fma(o, gl.load(c_ptr), -(e * gl.load(s_ptr))) > 0).to(gl.int32)
    for k in gl.static_range(1, NK):
        acc += (gl.fma(o, gl.load(c_ptr + k), -(e * gl.load(s_ptr + k))) > 0).to(gl.int32)
    return acc


@gluon.jit
def _pack(c, W: gl.constexpr):
    """Codes c [R, S] of W bits (S a power of two) -> [R] with code i at bit W i: pairs OR-ed by halving
    (in-thread: a row's codes are one thread's registers)."""
    R: gl.constexpr = c.shape[0]
    S: gl.constexpr = c.shape[1]
    if S == 1:
        return gl.reshape(c, [R])
    else:
        e, o = gl.split(gl.reshape(c, [R, S // 2, 2]))
        return _pack(e | (o << W), 2 * W)


@gluon.jit
def _upper(r2, trig_ptr, LVL: gl.constexpr, S: gl.constexpr, w3, ROWS_: gl.constexpr):
    """Levels LVL >= 1 from the squared radii r2 [R, 2S]: level 1's word (LVL = 1) or word 3's fields."""
    e, o = gl.split(gl.reshape(r2, [ROWS_, S, 2]))
    codes = _count(o, e, trig_ptr + LVL * 3, trig_ptr + (6 + LVL) * 3, 3)
    if LVL == 1:
        w2 = _pack(codes.to(gl.uint32, bitcast=True), 2)
        w3 = _upper(e + o, trig_ptr, 2, S // 2, w3, ROWS_)
        return w2, w3
    else:
        # word 3: level 2 from bit 0, level 3 from 16, level 4 from 24, level 5 from 28
        FIRST: gl.constexpr = 0 if LVL == 2 else 16 if LVL == 3 else 24 if LVL == 4 else 28
        w3 = w3 + gl.convert_layout(_pack(codes.to(gl.uint32, bitcast=True), 2) << FIRST, w3.type.layout)
        if S > 1:
            w3 = _upper(e + o, trig_ptr, LVL + 1, S // 2, w3, ROWS_)
        return w3


@gluon.jit
def _polar_encode_kernel(k_ptr, rs_ptr, had_ptr, trig_ptr, codes_ptr, gamma_ptr, T, H):
    """Rows [128 pid, 128 pid + 128) of K [B, H, T, 64] (contiguous, T % 128 == 0) -> 4 code words, gamma."""
    ROW: gl.constexpr = _rows_layout()
    pid = gl.program_id(0)
    r = pid * 128 + gl.arange(0, 128, layout=gl.SliceLayout(1, ROW))
    c = gl.arange(0, 64, layout=gl.SliceLayout(0, ROW))
    x = gl.load(k_ptr + r.to(gl.int64)[:, None] * 64 + c[None, :])
    head = (pid * 128 // T) % H
    xf = x.to(gl.float32)
    # encode._key_norm
    e = gl.max(gl.abs(xf), axis=1).to(gl.int32, bitcast=True) & 0x7F800000
    e = gl.minimum(gl.maximum(e, 1 << 23), 253 << 23)
    scale = ((254 << 23) - e).to(gl.float32, bitcast=True)
    xs = xf * scale[:, None]
    gamma = gl.sqrt_rn(gl.sum(xs * xs, axis=1)) * e.to(gl.float32, bitcast=True)
    gb = gamma.to(gl.int32, bitcast=True)
    gb = gb + 0x7FFF + ((gb >> 16) & 1)
    gl.store(gamma_ptr + r, (gb >> 16).to(gl.int16))
    # the rotation: (x * signs) @ H on the tensor cores, then one conversion to a row a thread
    xsg = x * gl.load(rs_ptr + head * 64 + c)[None, :]
    a_s = gl.allocate_shared_memory(gl.bfloat16, [128, 64], gl.NVMMASharedLayout.get_default_for([128, 64],
                                                                                               gl.bfloat16))
    h_s = gl.allocate_shared_memory(gl.bfloat16, [64, 64], gl.NVMMASharedLayout.get_default_for([64, 64],
                                                                                              gl.bfloat16))
    HL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    hr = gl.arange(0, 64, layout=gl.SliceLayout(1, HL))
    hc = gl.arange(0, 64, layout=gl.SliceLayout(0, HL))
    h_s.store(gl.load(had_ptr + hr[:, None] * 64 + hc[None, :]))
    a_s.store(xsg)
    fence_async_shared()
    gl.thread_barrier()
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 64, 16])
    acc = warpgroup_mma(a_s, h_s, gl.zeros([128, 64], gl.float32, MMA), use_acc=False)
    y = gl.convert_layout(acc, ROW) * scale[:, None]
    # level 1 (codec_encode._polar_codes at N = 2: h = 2, one lower boundary, the middle one on its own)
    a, b = gl.split(gl.reshape(y, [128, 32, 2]))
    neg = b < 0
    ar = gl.where(neg, -a, a)
    br = gl.abs(b)
    lower = _count(br, ar, trig_ptr, trig_ptr + 6 * 3, 1)
    s_mid = gl.load(trig_ptr + 6 * 3 + 1)
    cross = gl.fma(b, gl.load(trig_ptr + 1), -(a * s_mid)) > 0
    below_pi = s_mid > 0
    mid = gl.where(neg, cross | below_pi, cross & below_pi)
    codes0 = gl.where(neg, 1, 0) + lower + mid.to(gl.int32)
    lo, hi = gl.split(gl.permute(gl.reshape(codes0.to(gl.uint32, bitcast=True), [128, 2, 16]), (0, 2, 1)))
    w0 = _pack(lo, 2)
    w1 = _pack(hi, 2)
    w3 = gl.zeros([128], gl.uint32, gl.SliceLayout(1, ROW))
    w2, w3 = _upper(gl.fma(a, a, b * b), trig_ptr, 1, 16, w3, 128)
    out = codes_ptr + r.to(gl.int64) * 4
    gl.store(out, gl.convert_layout(w0, gl.SliceLayout(1, ROW)).to(gl.int32, bitcast=True))
    gl.store(out + 1, gl.convert_layout(w1, gl.SliceLayout(1, ROW)).to(gl.int32, bitcast=True))
    gl.store(out + 2, gl.convert_layout(w2, gl.SliceLayout(1, ROW)).to(gl.int32, bitcast=True))
    gl.store(out + 3, w3.to(gl.int32, bitcast=True))


def compile_sm90() -> int:
    import inspect
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = _polar_encode_kernel
    types = {"k_ptr": "*bf16", "rs_ptr": "*bf16", "had_ptr": "*bf16", "trig_ptr": "*fp32",
             "codes_ptr": "*i32", "gamma_ptr": "*i16", "T": "i32", "H": "i32"}
    params = list(inspect.signature(fn.fn).parameters)
    attrs = {(params.index(p),): [["tt.divisibility", 16]] for p in params if p.endswith("_ptr")}
    src = GluonASTSource(fn, {p: types[p] for p in params}, constexprs={}, attrs=attrs)
    # unfused fp32 arithmetic, as the product's encode kernels (the codes are the library's)
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": 4, "enable_fp_fusion": False})
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"])
        f.flush()
        res = subprocess.run([str(tool / "cuobjdump"), "-res-usage", f.name], capture_output=True,
                             text=True).stdout
        sass = subprocess.run([str(tool / "nvdisasm"), "-c", f.name], capture_output=True, text=True).stdout
    n = len(re.findall(r"/\*[0-9a-f]{4,}\*/\s+[A-Z@]", sass))
    print(res.strip().splitlines()[-1].strip())
    print(f"SASS instructions a warp: {n}; warp-instructions a key: {n * 4 / ROWS:.1f} (the tl kernel: 90.5)")
    return 0


def run_gpu(out: Path, tokens: int, heads: int) -> int:
    import triton

    from octopus_audio import backend, get_codec
    from octopus_audio.kernels import encode

    dev = torch.device("cuda")
    codec = get_codec("polarquant", 2, D)
    kc = backend.kernel_codec(codec, heads, dev)
    g = torch.Generator(device=dev).manual_seed(0)
    k = torch.randn(1, heads, tokens, D, generator=g, device=dev).bfloat16()
    ref = encode.encode_keys(k, kc)
    trig = encode._polar_trig(kc).to(dev)
    signs = kc.rotation_signs.to(torch.bfloat16).contiguous()  # [H, 64]: head h's at h * 64
    had = kc.hadamard.to(torch.bfloat16).contiguous()
    rows = heads * tokens
    codes = torch.empty(rows, 4, device=dev, dtype=torch.int32)
    gamma = torch.empty(rows, device=dev, dtype=torch.bfloat16)

    def launch():
        _polar_encode_kernel[(rows // ROWS,)](k, signs, had, trig, codes, gamma.view(torch.int16), tokens,
                                              heads, num_warps=4, enable_fp_fusion=False)

    launch()
    torch.cuda.synchronize()
    ref_codes = ref.codes.reshape(rows, -1)
    code_diff = (ref_codes != codes).float().mean().item()
    gamma_diff = (ref.gamma.reshape(-1) != gamma).float().mean().item()
    t_gluon = triton.testing.do_bench(launch, warmup=10, rep=50, return_mode="median")
    t_tl = triton.testing.do_bench(lambda: encode.encode_keys(k, kc), warmup=10, rep=50, return_mode="median")
    row = {"tokens": tokens, "heads": heads, "gluon_ms": t_gluon, "tl_encode_keys_ms": t_tl,
           "code_words_differing": code_diff, "gamma_differing": gamma_diff}
    print(json.dumps(row))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(row, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true", help="compile for sm_90 only (no GPU)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--heads", type=int, default=16)
    args = parser.parse_args()
    if args.compile:
        return compile_sm90()
    if args.out is None:
        print("--out is needed to run on the GPU (or --compile)", file=sys.stderr)
        return 2
    return run_gpu(args.out, args.tokens, args.heads)


if __name__ == "__main__":
    raise SystemExit(main())
