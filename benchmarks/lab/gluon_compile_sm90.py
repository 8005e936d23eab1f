"""Lab (no GPU needed; a Triton with the Gluon API and ptxas): compile the product Gluon attention kernel
(kernels/gluon_flash.py) for GPUTarget("cuda", 90, 32) for every codec and key bits in its scope
(gluon_scope.KEY_BITS) and every value bit width it takes, and print the shared memory per variant, so a
GPU session starts from kernels known to compile. Exit code 1 when any variant fails.

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

from octopus_audio import CODECS, backend, get_codec
from octopus_audio.codecs import SUPPORTED_BITS
from octopus_audio.kernels import gluon_flash, gluon_scope

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
            if not codec.compressed or backend.kernel_limit(codec, for_encode=False) is not None:
                continue
            try:
                kc = backend.kernel_codec(codec, HEADS, "cpu")
            except ValueError:  # no kernel view at these bits (e.g. octopus b >= 6: codes over 16 bits)
                continue
            for v_bits in gluon_scope.VALUE_BITS:
                if gluon_scope.codec_limit(kc.decode, kc.has_qjl, kc.head_dim, kc.code_bits, v_bits,
                                           gluon_scope.VALUE_GROUP) is None:
                    out.append((name, bits, v_bits))
    return out


def compile_one(name: str, bits: int, v_bits: int) -> dict:
    kc = backend.kernel_codec(get_codec(name, bits, gluon_scope.HEAD_DIM), HEADS, "cpu")
    kernel = gluon_flash._gluon_attn_kernel
    consts = gluon_flash.kernel_constants(kc, v_bits, gluon_scope.VALUE_GROUP)
    types = {**TYPES, "tab_ptr": TABLE_TYPES[gluon_flash.key_table(kc).element_size()]}
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
            "cubin_bytes": len(ck.asm["cubin"]), **resource_usage(ck.asm["cubin"])}


def resource_usage(cubin: bytes) -> dict:
    """Registers a thread and spill bytes of the kernel in `cubin` (`cuobjdump -res-usage`, shipped with
    Triton's nvidia backend)."""
    import os
    import re
    import subprocess
    import tempfile

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+).*?STACK:(\d+).*?LOCAL:(\d+)", text)
    return ({"regs": int(found[1]), "stack": int(found[2]), "local": int(found[3])} if found
            else {"res_usage": text.strip()[:200]})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma list of codec names (default: every codec)")
    args = parser.parse_args()
    only = {s for s in args.only.split(",") if s}
    print(f"triton {triton.__version__}; Gluon API: {gluon_scope.gluon_api() or 'ok'}", flush=True)
    failed = 0
    for name, bits, v_bits in in_scope():
        if only and name not in only:
            continue
        try:
            res = compile_one(name, bits, v_bits)
            print(f"{name} b={bits} v_bits={v_bits}: ok {res}", flush=True)
        except Exception as exc:  # one failing variant still lets the others report
            failed += 1
            print(f"{name} b={bits} v_bits={v_bits}: FAILED {type(exc).__name__}: {str(exc)[:2000]}",
                  flush=True)
    print(f"{'all compiled' if not failed else f'{failed} failed'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
