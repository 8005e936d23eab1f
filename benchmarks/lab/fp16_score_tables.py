"""Lab (CPU, the Triton interpreter): would fp16 per-query score tables keep the one-row attention's accuracy?
The score-table attention (kernels/score_tables.py) at d=128, 2048 compressed keys, run once with its fp32
tables and once with the same tables rounded to fp16 (build_tables wrapped), fp32 queries and outputs, against
the float64 decode-then-softmax reference (tests/helpers.decoded_attention). An fp16 table would halve the
per-query table's L1 footprint (octopus d=128: 21.5 -> 10.8 KB) and the lines a warp's gather meets.

    python benchmarks/lab/fp16_score_tables.py
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))

import torch  # noqa: E402
from test_kernels_adc import make_store, reference, rel, tables  # noqa: E402

CASES = [("octopus", 2), ("octopus", 3), ("octopus-qjl", 2), ("turboquant-mse", 2)]
LENGTH, D = 2048, 128


def main() -> int:
    st = tables()
    exact = st.build_tables

    def rounded(*args, **kwargs):
        lut, qlut = exact(*args, **kwargs)
        lut16 = lut.half().float()
        return lut16, (lut16 if qlut is lut else qlut.half().float())

    for name, bits in CASES:
        for seed in (0, 1):
            lib, codec, q, keys, values, kw, vw = make_store(name, bits, batch=1, heads=2, length=LENGTH,
                                                             window=1, d=D, dtype=torch.float32, seed=seed)
            want = reference(lib, q, keys, values, LENGTH, kw, vw)
            outs = []
            for build in (exact, rounded):
                st.build_tables = build
                try:
                    outs.append(st.attention_adc(q, keys, values, LENGTH, kw, vw, codec))
                finally:
                    st.build_tables = exact
            r32, r16 = rel(outs[0], want)[0], rel(outs[1], want)[0]
            between = rel(outs[1], outs[0].double())[0]
            print(f"{name:15s} b={bits} seed={seed}: relative RMS error against the reference: fp32 tables "
                  f"{r32:.2e}, fp16 tables {r16:.2e}; fp16 against fp32 {between:.2e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
