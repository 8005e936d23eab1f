"""Static instruction counts of the key encode kernel for sm_90, compiled without a GPU: SASS instructions
per program and per key (the kernel is straight-line: every warp of a program runs the whole stream once),
registers, spills, and the bound they put on the encode time at the H200's issue rate. The bound counts the
kernel's body only: the out-of-line slow paths of sqrt_rn and div_rn (subroutines after the body, entered for
denormal or extreme operands only) are in `instructions` but not in `body`.

Needs a triton whose nvidia backend ships ptxas and nvdisasm (any CUDA-less machine works):
    PYTHONPATH=/tmp/t36only python benchmarks/lab/count_sass_encode.py [--codec octopus --bits 2 --d 64]
Prints one line per (codec, b, d, block_t, num_warps); --json FILE writes the rows.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import json
import os
import re
import subprocess
import tempfile

# 132 SMs x 4 schedulers x 1.98 GHz: warp-instructions issued per second at one per scheduler per cycle
ISSUE_RATE = 132 * 4 * 1.98e9
KEYS = 64 * 1024 * 16  # 64k tokens x 16 heads

JOBS = [("turboquant-mse", b, 64) for b in (2, 3, 4)] + [("turboquant-qjl", b, 64) for b in (2, 3, 4)] + [
    ("polarquant", b, 64) for b in (2, 3, 4)] + [("octopus", b, 64) for b in (2, 3, 4)] + [
    ("octopus-qjl", b, 64) for b in (2, 3, 4)] + [("octopus", 2, 128)]


def _compile(fn, types: dict, constexprs: dict, num_warps: int, maxnreg: int | None = None):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    params = list(inspect.signature(fn.fn).parameters)
    sig = {p: ("constexpr" if p in constexprs else types.get(p, "i32")) for p in params}
    # pointers and the strides are multiples of 16 elements in every launch the sweep times
    div16 = [p for p in params if p not in constexprs and (p.endswith("_ptr") or p.startswith("stride"))]
    attrs = {(params.index(p),): [["tt.divisibility", 16]] for p in div16}
    src = ASTSource(fn, sig, constexprs={(params.index(k),): v for k, v in constexprs.items()}, attrs=attrs)
    options = {"num_warps": num_warps, "num_stages": 1, "enable_fp_fusion": False}
    if maxnreg:
        options["maxnreg"] = maxnreg
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def _tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def sass_text(kernel) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    try:
        return subprocess.run([_tool("nvdisasm"), "-c", "-g", f.name], capture_output=True, text=True,
                              check=True).stdout
    finally:
        os.unlink(f.name)


INSTRUCTION = re.compile(r"\s*/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
SOURCE_LINE = re.compile(r'\s*//## File "(.*)", line (\d+)')


def _instructions(sass: str):
    """(opcode, "file.py:line" from nvdisasm -g's line table, in the body) per instruction of `sass_text`;
    the body ends at the first out-of-line subroutine (the slow paths of sqrt_rn / div_rn)."""
    where, in_body = "?", True
    for line in sass.splitlines():
        if line.startswith("$__internal"):
            in_body = False
        m = SOURCE_LINE.match(line)
        if m:
            where = f"{os.path.basename(m.group(1))}:{m.group(2)}"
            continue
        m = INSTRUCTION.match(line)
        if m:
            yield m.group(2).split(".")[0], where, in_body


def sass_stats(kernel, sass: str | None = None) -> dict:
    """Instruction count (and the commonest opcodes), body instructions (in all and per source line),
    registers, spill stores/loads of a compiled kernel (`sass`: its `sass_text`, disassembled here if not
    given)."""
    if sass is None:
        sass = sass_text(kernel)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    try:
        res = subprocess.run([_tool("cuobjdump"), "-res-usage", f.name], capture_output=True,
                             text=True).stdout
    finally:
        os.unlink(f.name)
    ops = collections.Counter()
    body_lines = collections.Counter()
    for op, where, in_body in _instructions(sass):
        ops[op] += 1
        if in_body and op != "NOP":
            body_lines[where] += 1
    ops.pop("NOP", None)
    regs = re.search(r"REG:(\d+)", res)
    stack = re.search(r"STACK:(\d+)", res)
    ttgir = kernel.asm.get("ttgir", "")
    return {"instructions": sum(ops.values()), "body": sum(body_lines.values()), "body_lines": body_lines,
            "regs": int(regs.group(1)) if regs else None,
            "stack": int(stack.group(1)) if stack else None, "spill_st": ops["STL"], "spill_ld": ops["LDL"],
            "convert_layout": ttgir.count("ttg.convert_layout"), "top_ops": ops.most_common(12)}


def key_constants(name: str, bits: int, d: int, block_t: int | None,
                  native: bool = True):
    """(the kernel's constexprs, rows per program, launch options) exactly as encode_keys launches it."""
    from octopus_audio.cache import kernel_codec
    from octopus_audio.codecs import get_codec
    from octopus_audio.kernels import EncodeConfig
    from octopus_audio.kernels.impls import encode

    kc = kernel_codec(get_codec(name, bits, d), 16, "cpu")
    cfg = EncodeConfig(block_t=block_t)
    return encode._key_constants(kc, native=native, split=True, config=cfg)


def count(name: str, bits: int, d: int, block_t: int | None, num_warps: int | None,
          dump: str | None = None, aligned: bool = True,
          dtype: str = "bf16", exact: int = 1, lines: int = 0) -> dict:
    from octopus_audio.kernels.impls import encode
    from octopus_audio.kernels.impls.encode import _encode_keys_kernel
    from octopus_audio.kernels.kinds.triplet_rounding import NEAR_ROWS, encode_codes

    consts, rows, launch = key_constants(name, bits, d, block_t, native=dtype != "fp32")
    warps = num_warps or launch["num_warps"]
    types = {p: "*fp32" for p in ("qs_ptr", "cent_ptr", "bnd_ptr", "xib_ptr", "aux_ptr", "dir_ptr",
                                  "flag_ptr")}
    # the Hadamard matrices and rotation signs come in the keys' dtype (impls/encode._encode_tables)
    types.update(had_ptr=f"*{dtype}", hadt_ptr=f"*{dtype}", rs_ptr=f"*{dtype}", k_ptr=f"*{dtype}",
                 codes_ptr="*i32", gamma_ptr="*i16", signs_ptr="*i32", gamma_r_ptr="*i16", near_ptr="*i32",
                 inv_sqrt_d="fp32")
    exact = exact if consts["ENCODE"] is encode_codes else 0  # the triplet kind's near-tie pass
    if exact == 2 and block_t is None:  # encode_keys's redo launch: NEAR_ROWS rows a block, REDO_WARPS warps
        rows, consts = NEAR_ROWS.value, dict(consts, BLOCK_T=NEAR_ROWS.value)
        warps = num_warps or encode.REDO_WARPS
    redo = encode.REDO_GROUPS if exact == 2 else 1  # its programs take REDO_GROUPS groups
    kernel = _compile(_encode_keys_kernel, types,
                      dict(consts, CHECK=False, ALIGNED=aligned, EXACT=exact, REDO_GROUPS=redo), warps,
                      launch.get("maxnreg") if num_warps is None else None)
    sass = sass_text(kernel)
    st = sass_stats(kernel, sass)
    body_lines = st.pop("body_lines")
    if lines:
        st["lines"] = body_lines.most_common(lines)
    if dump:
        os.makedirs(dump, exist_ok=True)
        stem = os.path.join(dump, f"{name}_b{bits}_d{d}_t{rows}_w{warps}")
        for ext in ("ttgir", "ptx"):
            with open(f"{stem}.{ext}", "w") as f:
                f.write(kernel.asm[ext])
        with open(f"{stem}.sass", "w") as f:
            f.write(sass)
    per_key = st["instructions"] * warps / rows
    per_key_body = st["body"] * warps / rows
    st.update(codec=name, bits=bits, d=d, block_t=rows, num_warps=warps, per_key=per_key,
              per_key_body=per_key_body, aligned=aligned,
              maxnreg=launch.get("maxnreg") if num_warps is None else None, exact=exact,
              dtype=dtype,
              bound_ms=per_key_body * KEYS * (16 if d == 64 else 32) / 16 / ISSUE_RATE * 1e3)
    return st


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--codec")
    parser.add_argument("--bits", type=int)
    parser.add_argument("--d", type=int)
    parser.add_argument("--block-t", type=int, nargs="*", default=[None])
    parser.add_argument("--num-warps", type=int, nargs="*", default=[None])
    parser.add_argument("--ops", action="store_true", help="print the commonest opcodes")
    parser.add_argument("--unaligned", action="store_true", help="blocks may span heads (T %% block_t != 0)")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"), help="the keys' dtype")
    parser.add_argument("--exact", type=int, choices=(0, 1, 2), default=1,
                        help="octopus: the kernel's EXACT (1: encode_keys's first launch, what every key "
                             "runs; 2: its second, for row groups with a near tie, 16 rows and one warp a "
                             "program unless --block-t / --num-warps say otherwise; 0: encode_unit's inline "
                             "one)")
    parser.add_argument("--lines", type=int, default=0,
                        help="print the N source lines with the most body instructions")
    parser.add_argument("--json")
    parser.add_argument("--dump", help="folder for each kernel's ttgir, ptx and sass")
    args = parser.parse_args()
    jobs = [(n, b, d) for n, b, d in JOBS if (args.codec in (None, n)) and (args.bits in (None, b))
            and (args.d in (None, d))] or [(args.codec, args.bits, args.d or 64)]
    rows = []
    for name, bits, d in jobs:
        for bt in args.block_t:
            for nw in args.num_warps:
                r = count(name, bits, d, bt, nw, args.dump, not args.unaligned,
                          args.dtype, args.exact, args.lines)
                rows.append(r)
                print(f"{name:15s} b={bits} d={d:3d} block_t={r['block_t']:3d} warps={r['num_warps']} "
                      f"cap={r['maxnreg']} "
                      f"instr={r['instructions']:6d} per key={r['per_key']:7.1f} "
                      f"body per key={r['per_key_body']:7.1f} regs={r['regs']} "
                      f"stack={r['stack']} spills st/ld={r['spill_st']}/{r['spill_ld']} "
                      f"cvt={r['convert_layout']} issue bound {r['bound_ms']:.3f} ms", flush=True)
                if args.ops:
                    print("   ", r["top_ops"])
                for where, n in r.get("lines", []):
                    print(f"    {n:5d} {where}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
