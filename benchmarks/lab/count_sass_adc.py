"""Lab (no GPU needed; a triton with ptxas): compile the score-table attention (kernels/impls/score_tables.py)
for sm_90 as attention_adc launches it at the H200 defaults of score_tables.table_attention, per codec, bits
and head dim, and print registers, spills and SASS instructions per key of the attention kernel (and
registers of the table kernel).

    PYTHONPATH=/tmp/t36only python benchmarks/lab/count_sass_adc.py   # the GPU image's Triton 3.6
    PYTHONPATH=/tmp/t36only python benchmarks/lab/count_sass_adc.py --codec turboquant-mse --group 1 3
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import torch

from octopus_audio.cache import kernel_codec
from octopus_audio.codecs import get_codec
from octopus_audio.kernels import PackedValues
from octopus_audio.kernels.impls import score_tables
from octopus_audio.kernels.kinds import polar, scalar, triplet

_spec = importlib.util.spec_from_file_location(
    "count_sass_encode", os.path.join(os.path.dirname(os.path.abspath(__file__)), "count_sass_encode.py"))
sass = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sass)

HEADS = 16
JOBS = [(n, b, d) for n in ("turboquant-mse", "turboquant-qjl", "polarquant", "octopus", "octopus-qjl")
        for b in (2, 3, 4)
        for d in (64, 128)]
ATTN_TYPES = {"lut_ptr": "*fp32", "qlut_ptr": "*fp32", "qn_ptr": "*bf16", "rho_ptr": "*fp32",
              "kc_ptr": "*i32", "kg_ptr": "*bf16", "ks_ptr": "*i32", "kr_ptr": "*bf16", "vc_ptr": "*i32",
              "vs_ptr": "*fp16", "vm_ptr": "*fp16", "kw_ptr": "*bf16", "vw_ptr": "*bf16", "s_ptr": "*fp32",
              "out_ptr": "*bf16", "opart_ptr": "*fp32", "lse_ptr": "*fp32", "qk_scale": "fp32",
              "qjl_coef": "fp32"}
TABLE_TYPES = {"q_ptr": "*bf16", "rs_ptr": "*fp32", "qs_ptr": "*fp32", "had_ptr": "*fp32", "dir_ptr": "*fp32",
               "rho_ptr": "*fp32", "cent_ptr": "*fp32", "cs_ptr": "*fp32", "lut_ptr": "*fp32",
               "qlut_ptr": "*fp32",
               "inv_sqrt_d": "fp32", "qk_scale": "fp32"}


def launch_shape(d: int) -> tuple[int, int, int]:
    """(block_k, block_v, num_warps) of score_tables.table_attention's defaults."""
    return (256, 64, 8) if d >= 128 else (128, 64, 4)


def count(name: str, bits: int, d: int, group: int | None, maxnreg: int | None = None) -> dict:
    kc = kernel_codec(get_codec(name, bits, d), HEADS, "cpu")
    lay = kc.kind.score_tables.layout(kc, group)
    block_k, block_v, nw = launch_shape(d)
    values = PackedValues(torch.zeros(1, 1, 1, -(-d * bits // 32), dtype=torch.int32),
                          torch.zeros(1, 1, 1, d // 16), torch.zeros(1, 1, 1, d // 16), bits)
    consts, options = score_tables.attention_constants(kc, lay, values, 1, block_k, block_v, nw)
    consts["DIRECT"] = False
    cap = maxnreg or options.get("maxnreg")
    kernel = sass._compile(score_tables._adc_attn_kernel, ATTN_TYPES, consts, nw, cap)
    st = sass.sass_stats(kernel)
    tab_consts = dict(D=d, L=lay.codes, N_ENTRIES=lay.entries, CHUNK=min(lay.entries, 128), TP=16)
    if kc.kind is polar.KIND:  # no QJL side-car
        tab_fn = polar._polar_tables_kernel
        tab_consts = dict(tab_consts, A_BITS=kc.code_bits, G=lay.levels)
    elif kc.kind is scalar.KIND:
        tab_fn = scalar._scalar_tables_kernel
        tab_consts = dict(tab_consts, HAS_QJL=kc.has_qjl, B=kc.code_bits, G=lay.group)
    else:
        tab_fn = triplet._octopus_tables_kernel
        tab_consts = dict(tab_consts, HAS_QJL=kc.has_qjl, B_RHO=kc.param("b_rho"), FOLD_RHO=lay.fold_rho)
    tab = sass.sass_stats(sass._compile(tab_fn, TABLE_TYPES, tab_consts, 4))
    st.update(codec=name, bits=bits, d=d, group=lay.group, table_codes=lay.codes, code_bits=lay.bits,
              entries=lay.entries, table_kib=lay.codes * lay.entries * 4 / 1024,
              maxnreg=cap,
              table_regs=tab["regs"], table_spills=tab["spill_st"] + tab["spill_ld"],
              per_key=st["instructions"] * nw / block_k)
    return st


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--codec")
    parser.add_argument("--bits", type=int)
    parser.add_argument("--d", type=int)
    parser.add_argument("--group", type=int, nargs="*", default=[None],
                        help="scalar section: coordinates a table code (default: table_layout's)")
    parser.add_argument("--maxnreg", type=int,
                        help="register cap of the attention kernel (default: the launcher's)")
    args = parser.parse_args()
    import triton

    print(f"triton {triton.__version__}", flush=True)
    jobs = [(n, b, d) for n, b, d in JOBS if args.codec in (None, n) and args.bits in (None, b)
            and args.d in (None, d)] or [(args.codec, args.bits, d) for d in (64, 128) if args.d in (None, d)]
    failed = 0
    for name, bits, d in jobs:
        for group in args.group if name.startswith("turboquant") else [None]:
            try:
                r = count(name, bits, d, group, args.maxnreg)
            except Exception as exc:  # one failing variant still lets the others report
                failed += 1
                print(f"{name:15s} b={bits} d={d:3d} group={group}: FAILED {type(exc).__name__}: "
                      f"{str(exc)[:1500]}", flush=True)
                continue
            print(f"{name:15s} b={bits} d={d:3d} group={r['group']} "
                  f"codes={r['table_codes']:3d}x{r['code_bits']}b "
                  f"entries={r['entries']:4d} table={r['table_kib']:5.1f} KiB cap={r['maxnreg']} "
                  f"regs={r['regs']} stack={r['stack']} spills st/ld={r['spill_st']}/{r['spill_ld']} "
                  f"instr={r['instructions']} per key={r['per_key']:.1f} | "
                  f"table kernel regs={r['table_regs']} "
                  f"spills={r['table_spills']}", flush=True)
    print("all compiled" if not failed else f"{failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
