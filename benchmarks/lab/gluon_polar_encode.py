"""Lab: the polarquant key encode (d=64, 16-bit keys, every width) as a Gluon kernel whose angle tree runs in
a row-per-thread layout, against the product's `tl` kernel (kernels/encode.py).

Why: the `tl` kernel keeps the rotated tile in the wgmma accumulator layout, where a row's 64 coordinates
sit in four lanes, so every level of the angle tree (`tl.split(tl.reshape(...))`) and the codes'
concatenation go through layout conversions, and the upper levels run replicated across lanes (about a fifth
of its SASS; benchmarks/results/kernels.md, "Session 16"). Here the rotated tile is converted once to one row
a thread, and the whole tree, the norm and the packing run in that thread's registers.

The arithmetic is the product's, operation for operation (codec_encode._polar_codes, _cross_count,
encode._key_norm): the same fma / compare sequences decide every code, so codes must equal encode_keys'
exactly; gamma is summed in another order (stored bf16: rare last-bit differences). The H200 run of session 16
(run57) timed the b=2 form of 6e7c977; this generalisation (every width, partial blocks, fp16) is compiled
only (sm_90 SASS), not yet run.

    PYTHONPATH=/tmp/t36only python benchmarks/lab/gluon_polar_encode.py --compile --bits 1,2,3,4   # no GPU
    PYTHONPATH=$PWD python3 benchmarks/lab/gluon_polar_encode.py --bits 2,3,4 --out $OUT/gluon_polar.json
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
LEVELS = gl.constexpr(6)  # log2(D)


@gluon.constexpr_function
def _rows_layout():
    """[128, 64]: one row a thread (4 warps)."""
    return gl.BlockedLayout([1, 64], [32, 1], [4, 1], [1, 0])


@gluon.jit
def _count(o, e, c_ptr, s_ptr, NBITS: gl.constexpr):
    """#{k < 2^NBITS - 1 : o c_k - e s_k > 0} for boundaries whose test holds on a prefix of k
    (codec_encode._cross_count: its fma and product; compares up to 3 bits, a binary search beyond)."""
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
    """The S entries of t [..., S] along its last axis (S a power of two, one thread's registers) as a tuple
    of [...] tensors, in order (splits only: register relabelling)."""
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
def _key_norm(xf):
    """(gamma = ||x||, the power of two 2^-e scaling max|x| into [1, 2)) per row of xf [R, 64] (fp32): the
    product's encode._key_norm, its sum in this layout's order."""
    e = gl.max(gl.abs(xf), axis=1).to(gl.int32, bitcast=True) & 0x7F800000
    e = gl.minimum(gl.maximum(e, 1 << 23), 253 << 23)
    scale = ((254 << 23) - e).to(gl.float32, bitcast=True)
    xs = xf * scale[:, None]
    return gl.sqrt_rn(gl.sum(xs * xs, axis=1)) * e.to(gl.float32, bitcast=True), scale


@gluon.jit
def _bf16_bits(x):
    """The bf16 bit pattern (int16) of fp32 x, rounded to nearest even (kernels.bits.bf16_bits)."""
    b = x.to(gl.int32, bitcast=True)
    b = b + 0x7FFF + ((b >> 16) & 1)
    return (b >> 16).to(gl.int16)


@gluon.jit
def _level1(a, b, trig_ptr, N_BITS: gl.constexpr):
    """Level-1 angle codes of the pairs (a, b) (codec_encode._polar_codes, operation for operation)."""
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
    """Rows [128 pid, 128 pid + 128) of K [B, H, T, 64] (contiguous, 16-bit) -> K_WORDS code words and gamma
    (bf16 bits) a row. ALIGNED: T % 128 == 0 (a block lies in one head)."""
    ROW: gl.constexpr = _rows_layout()
    pid = gl.program_id(0)
    r = pid * 128 + gl.arange(0, 128, layout=gl.SliceLayout(1, ROW))
    c = gl.arange(0, 64, layout=gl.SliceLayout(0, ROW))
    ok = r < n_rows
    x = gl.load(k_ptr + r.to(gl.int64)[:, None] * 64 + c[None, :], mask=ok[:, None], other=0.0)
    xf = x.to(gl.float32)
    gamma, scale = _key_norm(xf)
    gl.store(gamma_ptr + r, _bf16_bits(gamma), mask=ok)
    # the rotation: (x * signs) @ H on the tensor cores, then one conversion to a row a thread
    if ALIGNED:
        sgn = gl.load(rs_ptr + ((pid * 128 // T) % H) * 64 + c)[None, :]
    else:
        sgn = gl.load(rs_ptr + ((r // T) % H)[:, None] * 64 + c[None, :])
    xsg = x * sgn
    DT: gl.constexpr = x.dtype
    a_s = gl.allocate_shared_memory(DT, [128, 64], gl.NVMMASharedLayout.get_default_for([128, 64], DT))
    h_s = gl.allocate_shared_memory(DT, [64, 64], gl.NVMMASharedLayout.get_default_for([64, 64], DT))
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
    a, b = gl.split(gl.reshape(y, [128, 32, 2]))
    codes = _unstack(_level1(a, b, trig_ptr, N_BITS)) + _upper(gl.fma(a, a, b * b), trig_ptr, 1, N_BITS)
    out = codes_ptr + r.to(gl.int64) * K_WORDS
    for w in gl.static_range(K_WORDS):
        word = gl.convert_layout(_word(codes, w, N_BITS), gl.SliceLayout(1, ROW))  # the same map: no movement
        gl.store(out + w, word.to(gl.int32, bitcast=True), mask=ok)


def words(bits: int) -> int:
    return -(-(D - 1) * bits // 32)


def sm90_usage(fn, types: dict, consts: dict) -> dict:
    """Compile the Gluon kernel `fn` for sm_90 (4 warps, unfused fp32 arithmetic as the product's encode
    kernels, pointers 16-byte aligned): registers, stack bytes, shared bytes and SASS instructions a warp."""
    import inspect
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    params = list(inspect.signature(fn.fn).parameters)
    sig = {p: "constexpr" if p in consts else types.get(p, "i32") for p in params}
    attrs = {(params.index(p),): [["tt.divisibility", 16]] for p in params if p.endswith("_ptr")}
    src = GluonASTSource(fn, sig, constexprs={(params.index(k),): v for k, v in consts.items()}, attrs=attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": 4, "enable_fp_fusion": False})
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"])
        f.flush()
        res = subprocess.run([str(tool / "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True)
        sass = subprocess.run([str(tool / "nvdisasm"), "-c", f.name], capture_output=True, text=True)
    usage = re.search(r"REG:(\d+) STACK:(\d+)", res.stdout)
    return {"registers": int(usage.group(1)), "stack": int(usage.group(2)), "shared": ck.metadata.shared,
            "instructions": len(re.findall(r"/\*[0-9a-f]{4,}\*/\s+[A-Z@]", sass.stdout))}


def compile_sm90(bits_list: list[int], dtype: str) -> int:
    for bits in bits_list:
        for aligned in (True, False):
            consts = {"N_BITS": bits, "K_WORDS": words(bits), "ALIGNED": aligned}
            types = {"k_ptr": f"*{dtype}", "rs_ptr": f"*{dtype}", "had_ptr": f"*{dtype}", "trig_ptr": "*fp32",
                     "codes_ptr": "*i32", "gamma_ptr": "*i16"}
            u = sm90_usage(_polar_encode_kernel, types, consts)
            print(f"b={bits} aligned={aligned:d} {dtype}: registers {u['registers']}, stack {u['stack']}, "
                  f"{u['instructions']} SASS instructions a warp, "
                  f"{u['instructions'] * 4 / ROWS:.1f} warp-instructions a key", flush=True)
    return 0


def run_gpu(out: Path, tokens: int, heads: int, bits_list: list[int], dtype: torch.dtype) -> int:
    import triton

    from octopus_audio import backend, get_codec
    from octopus_audio.kernels import encode

    dev = torch.device("cuda")
    rows_out = []
    for bits in bits_list:
        for t in (tokens, tokens - 37):
            codec = get_codec("polarquant", bits, D)
            kc = backend.kernel_codec(codec, heads, dev)
            g = torch.Generator(device=dev).manual_seed(bits)
            k = torch.randn(1, heads, t, D, generator=g, device=dev).to(dtype)
            ref = encode.encode_keys(k, kc)
            trig = encode._polar_trig(kc).to(dev)
            signs = kc.rotation_signs.to(dtype).contiguous()  # [H, 64]: head h's at h * 64
            had = kc.hadamard.to(dtype).contiguous()
            rows = heads * t
            nw = words(bits)
            codes = torch.empty(rows, nw, device=dev, dtype=torch.int32)
            gamma = torch.empty(rows, device=dev, dtype=torch.bfloat16)

            def launch(k=k, signs=signs, had=had, trig=trig, codes=codes, gamma=gamma, rows=rows, t=t,
                       bits=bits, nw=nw):
                _polar_encode_kernel[(triton.cdiv(rows, ROWS),)](
                    k, signs, had, trig, codes, gamma.view(torch.int16), rows, t, heads, N_BITS=bits,
                    K_WORDS=nw, ALIGNED=t % ROWS == 0, num_warps=4, enable_fp_fusion=False)

            launch()
            torch.cuda.synchronize()
            row = {"bits": bits, "tokens": t, "heads": heads, "dtype": str(dtype),
                   "code_words_differing": (ref.codes.reshape(rows, -1) != codes).float().mean().item(),
                   "gamma_differing": (ref.gamma.reshape(-1) != gamma).float().mean().item(),
                   "gluon_ms": triton.testing.do_bench(launch, warmup=10, rep=50, return_mode="median"),
                   "tl_encode_keys_ms": triton.testing.do_bench(lambda k=k, kc=kc: encode.encode_keys(k, kc),
                                                                warmup=10, rep=50, return_mode="median")}
            print(json.dumps(row), flush=True)
            rows_out.append(row)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows_out, indent=1))
    return 0


def cli(description: str, codec: str, widths: tuple[int, ...], compile_fn, run_fn) -> int:
    """The probes' command line: --compile (sm_90, no GPU) or a GPU run into --out, per width and dtype."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--compile", action="store_true", help="compile for sm_90 only (no GPU)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--bits", default="2",
                        help=f"comma list of {codec} widths ({min(widths)}-{max(widths)})")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    args = parser.parse_args()
    bits_list = [int(b) for b in args.bits.split(",")]
    if any(b not in widths for b in bits_list):
        print(f"--bits {args.bits}: this lab kernel takes {codec} at {min(widths)}-{max(widths)} bits",
              file=sys.stderr)
        return 2
    if args.compile:
        return compile_fn(bits_list, args.dtype)
    if args.out is None:
        print("--out is needed to run on the GPU (or --compile)", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    return run_fn(args.out, args.tokens, args.heads, bits_list, dtype)


if __name__ == "__main__":
    raise SystemExit(cli(__doc__.splitlines()[0], "polarquant", tuple(range(1, 9)), compile_sm90, run_gpu))
