"""Lab (no GPU needed; a Triton with the Gluon API and ptxas): compile the product Gluon kernels for
GPUTarget("cuda", 90, 32), so a GPU session starts from kernels known to compile: the attention kernel
(kernels/impls/gluon/flash.py) for every codec and key bits in its scope (gluon/scope.py's KEY_BITS) and
every value bit width it takes (shared memory, registers per variant), and the polarquant key encode
(gluon/encode.py) at every width in gluon/scope.py's ENCODE_BITS, both 16-bit dtypes, aligned and unaligned
blocks (registers, SASS warp-instructions a key). Exit code 1 when any variant fails.

    PYTHONPATH=/tmp/t36only python benchmarks/lab/gluon_compile_sm90.py   # the GPU image's Triton 3.6
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

from octopus_audio import CODECS, get_codec
from octopus_audio.cache import kernel_codec, kernel_limit
from octopus_audio.codecs import SUPPORTED_BITS
from octopus_audio.kernels import select
from octopus_audio.kernels.impls.gluon import columns as gluon_columns
from octopus_audio.kernels.impls.gluon import encode as gluon_encode
from octopus_audio.kernels.impls.gluon import flash as gluon_flash
from octopus_audio.kernels.impls.gluon import scope as gluon_scope
from octopus_audio.kernels.launch import pack_shape

HEADS = 16
# the types the launcher passes (signs / gamma_r: the codes / gamma for codecs without the QJL side-car)
TYPES = {"q_ptr": "*bf16", "map_ptr": "*bf16", "kc_ptr": "*i32", "kg_ptr": "*bf16", "ks_ptr": "*i32",
         "kr_ptr": "*bf16", "vc_ptr": "*i32", "vs_ptr": "*fp16", "vm_ptr": "*fp16", "kw_ptr": "*bf16",
         "vw_ptr": "*bf16", "out_ptr": "*bf16", "rot_scale": "fp32", "qjl_scale": "fp32", "qk_scale": "fp32"}
TABLE_TYPES = {8: "*i64", 4: "*i32", 2: "*i16"}


def in_scope() -> list[tuple[str, int, int]]:
    """(codec, key bits, value bits) of every variant in the Gluon kernel's scope at d=64."""
    out = []
    for name in CODECS:
        for bits in SUPPORTED_BITS.get(name, ()):
            codec = get_codec(name, bits, gluon_scope.HEAD_DIM)
            if not codec.compressed or kernel_limit(codec, for_encode=False) is not None:
                continue
            try:
                kc = kernel_codec(codec, HEADS, "cpu")
            except ValueError:  # no kernel view at these bits (e.g. octopus b >= 6: codes over 16 bits)
                continue
            for v_bits in gluon_scope.VALUE_BITS:
                if gluon_scope.codec_limit(kc.kind, kc.has_qjl, kc.head_dim, kc.code_bits, v_bits,
                                           gluon_scope.VALUE_GROUP) is None:
                    out.append((name, bits, v_bits))
    return out


def compile_one(name: str, bits: int, v_bits: int, wide: tuple[int, int] | None = None) -> dict:
    """The attention kernel for `name` at `bits` with `v_bits` values; `wide` (key bits, value bits): the
    wide-store entry point with a wide prefix at those widths."""
    kc = kernel_codec(get_codec(name, bits, gluon_scope.HEAD_DIM), HEADS, "cpu")
    consts = gluon_flash.kernel_constants(kc, v_bits, gluon_scope.VALUE_GROUP)
    types = {**TYPES, "tab_ptr": TABLE_TYPES[gluon_columns.key_table(kc).element_size()]}
    kernel = gluon_flash._gluon_attn_kernel
    if wide is not None:
        wc = kernel_codec(get_codec(name, wide[0], gluon_scope.HEAD_DIM), HEADS, "cpu")
        kernel = gluon_flash._gluon_attn_wide_kernel
        consts.update(gluon_flash.wide_constants(wc, wide[1], gluon_scope.VALUE_GROUP))
        types.update({f"w{k}": v for k, v in TYPES.items()
                      if k[:2] in ("kc", "kg", "ks", "kr", "vc", "vs", "vm")})
        types["wtab_ptr"] = TABLE_TYPES[gluon_columns.key_table(wc).element_size()]
    params = list(inspect.signature(kernel.fn).parameters)
    sig = {p: "constexpr" if p in consts else types.get(p, "i32") for p in params}
    div16 = [p for p in params if p.endswith("_ptr") or p in ("sqb", "sqh", "sqt", "skb", "skh", "skt", "svb",
                                                               "svh", "svt", "H")]
    attrs = {(params.index(p), ): [["tt.divisibility", 16]] for p in div16}
    src = GluonASTSource(kernel, sig, constexprs={(params.index(k), ): v for k, v in consts.items()},
                         attrs=attrs)
    t0 = time.perf_counter()
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": 4, "maxnreg": gluon_flash.MAXNREG})
    return {"seconds": round(time.perf_counter() - t0, 1), "shared_bytes": ck.metadata.shared,
            "cubin_bytes": len(ck.asm["cubin"]), **resource_usage(ck.asm["cubin"]), "ptx": ck.asm["ptx"]}


def compile_encode(bits: int, dtype: str, aligned: bool) -> dict:
    """The polarquant key encode at `bits` for `dtype` keys (the launcher's types and options)."""
    kernel = gluon_encode._polar_encode_kernel
    codec = get_codec("polarquant", bits, gluon_encode.HEAD_DIM)
    consts = {"N_BITS": bits, "K_WORDS": pack_shape(bits, codec.layout.num_codes)[0], "ALIGNED": aligned}
    types = {"k_ptr": f"*{dtype}", "rs_ptr": f"*{dtype}", "had_ptr": f"*{dtype}", "trig_ptr": "*fp32",
             "codes_ptr": "*i32", "gamma_ptr": "*i16"}
    params = list(inspect.signature(kernel.fn).parameters)
    sig = {p: "constexpr" if p in consts else types.get(p, "i32") for p in params}
    attrs = {(params.index(p), ): [["tt.divisibility", 16]] for p in params if p.endswith("_ptr")}
    src = GluonASTSource(kernel, sig, constexprs={(params.index(k), ): v for k, v in consts.items()},
                         attrs=attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": gluon_encode.WARPS, "enable_fp_fusion": False})
    usage = resource_usage(ck.asm["cubin"], sass=True)
    usage["warp_instr_per_key"] = round(usage.pop("sass") * gluon_encode.WARPS / gluon_encode.ROWS, 1)
    return usage


def resource_usage(cubin: bytes, sass: bool = False) -> dict:
    """Registers a thread and spill bytes of the kernel in `cubin` (`cuobjdump -res-usage`, shipped with
    Triton's nvidia backend); sass: also its SASS instructions a warp (`nvdisasm`)."""
    import os
    import re
    import subprocess
    import tempfile

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                              text=True).stdout
        listing = subprocess.run([os.path.join(tools, "nvdisasm"), "-c", f.name], capture_output=True,
                                 text=True).stdout if sass else ""
    found = re.search(r"REG:(\d+).*?STACK:(\d+).*?LOCAL:(\d+)", text)
    out = ({"regs": int(found[1]), "stack": int(found[2]), "local": int(found[3])} if found
           else {"res_usage": text.strip()[:200]})
    if sass:
        out["sass"] = len(re.findall(r"/\*[0-9a-f]{4,}\*/\s+[A-Z@]", listing))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma list of codec names (default: every codec)")
    parser.add_argument("--kernels", default="attention,encode", help="attention, encode or both (default)")
    parser.add_argument("--wide", default="",
                        help="comma list of KEY@VALUE wide widths: also compile the wide-store entry point "
                             "of each attention variant with a wide prefix at each (e.g. 4@4,3@4)")
    parser.add_argument("--bits", default="", help="comma list of key bits (default: every width in scope)")
    parser.add_argument("--ptx-out", default="", help="write {variant: PTX} to this JSON file")
    args = parser.parse_args()
    wides = [tuple(int(x) for x in w.split("@")) for w in args.wide.split(",") if w]
    only_bits = {int(b) for b in args.bits.split(",") if b}
    ptx = {}
    only = {s for s in args.only.split(",") if s}
    kernels = {s for s in args.kernels.split(",") if s}
    print(f"triton {triton.__version__}; Gluon API: {select.gluon_api() or 'ok'}", flush=True)
    failed = 0
    for bits in gluon_scope.ENCODE_BITS[gluon_scope.POLAR] if "encode" in kernels else ():
        for dtype in ("bf16", "fp16"):
            for aligned in (True, False):
                what = f"polarquant encode b={bits} {dtype} aligned={aligned:d}"
                try:
                    print(f"{what}: ok {compile_encode(bits, dtype, aligned)}", flush=True)
                except Exception as exc:  # one failing variant still lets the others report
                    failed += 1
                    print(f"{what}: FAILED {type(exc).__name__}: {str(exc)[:2000]}", flush=True)
    for name, bits, v_bits in in_scope() if "attention" in kernels else ():
        if (only and name not in only) or (only_bits and bits not in only_bits):
            continue
        for wide in [None, *wides]:
            what = f"{name} b={bits} v_bits={v_bits}" + ("" if wide is None else f" wide={wide[0]}@{wide[1]}")
            try:
                res = compile_one(name, bits, v_bits, wide)
                ptx[what] = res.pop("ptx")
                print(f"{what}: ok {res}", flush=True)
            except Exception as exc:  # one failing variant still lets the others report
                failed += 1
                print(f"{what}: FAILED {type(exc).__name__}: {str(exc)[:2000]}", flush=True)
    if args.ptx_out:
        import json

        with open(args.ptx_out, "w") as f:
            json.dump(ptx, f)
    print(f"{'all compiled' if not failed else f'{failed} failed'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
