"""Do two checkouts compile the same split-K kernel for an attention call with a wide segment? One call per
codec (store at b=2, a 31-token wide segment at b=4, 75 queries, a 75-token window, d=64, bf16 and fp32
queries) through `kernels.attention(..., wide=WideSegment(...))`, captured on the CPU (nothing runs, as
`ptx_equivalence.py` does), compiled for sm_90 and hashed by its PTX body with the kernel's own name replaced
(the entry point's name may differ between the trees).

    python benchmarks/lab/ptx_wide_equivalence.py OUT.json    # in each checkout (PYTHONPATH for an older one)
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ptx_equivalence as pe  # noqa: E402  (its capture patch, launch description and portable constants)


def _hash(fn, args, kwargs) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, consts, attrs, opts = pe._describe(fn, args, kwargs)
    consts = {k: pe._local(v) for k, v in consts.items()}
    ptx = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                         options={"num_stages": 1, "enable_fp_fusion": True, **opts}).asm["ptx"]
    lines = [line for line in ptx.splitlines()
             if not line.strip().startswith((".loc", ".file", "//", "$L__", ".section"))]
    text = re.sub(r"\.debug\w*", "", "\n".join(lines))
    body = text[text.find(".visible .entry"):]
    body = body[:body.find("\n}")].replace(fn.__name__, "KERNEL")
    return hashlib.sha256(body.encode()).hexdigest()[:16]


D, HEADS, QUERIES, LENGTH, WINDOW, WIDE_LEN = 64, 4, 75, 380, 75, 31


def _packed(name: str, bits: int, cap: int, g):
    """(kernel codec, random PackedKeys, random PackedValues) of `cap` tokens: codes as random words."""
    import torch

    import octopus_audio.kernels as kernels
    from octopus_audio.cache import kernel_codec
    from octopus_audio.codecs import get_codec

    def words(n):
        shape = (2, HEADS, cap, n)
        return torch.randint(-2**31, 2**31, shape, generator=g, dtype=torch.int64).to(torch.int32)

    codec = get_codec(name, bits, D, seed=3)
    keys = kernels.PackedKeys(words(codec.code_words), torch.rand(2, HEADS, cap).bfloat16(),
                              words(-(-D // 32)) if codec.qjl else None,
                              torch.rand(2, HEADS, cap).bfloat16() if codec.qjl else None)
    scales = [torch.rand(2, HEADS, cap, D // 16).half() for _ in range(2)]
    values = kernels.PackedValues(words(-(-D * bits // 32)), *scales, bits)
    return kernel_codec(codec, HEADS, "cpu"), keys, values


def main(out_path: str) -> None:
    pe._patch_kernels()
    import torch

    import octopus_audio.kernels as kernels

    out = {}
    for name in pe.CODECS:
        for dt, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            pe.CAPTURED.clear()
            g = torch.Generator().manual_seed(1)
            codec, keys, values = _packed(name, 2, LENGTH + 5, g)
            w_codec, w_keys, w_values = _packed(name, 4, WIDE_LEN + 3, g)
            q = torch.randn(2, HEADS, QUERIES, D, generator=g).to(dtype)
            k_win = torch.randn(2, HEADS, WINDOW, D, generator=g).to(dtype)
            kernels.attention(q, keys, values, LENGTH, k_win, torch.randn_like(k_win), codec, scale=0.1,
                              wide=kernels.WideSegment(w_keys, w_values, WIDE_LEN, w_codec))
            for fn, args, kwargs in pe.CAPTURED:
                if "attn_fwd" in fn.__name__:
                    out[f"{name} {dt}"] = {"kernel": fn.__name__, "hash": _hash(fn, args, kwargs)}
                    print(name, dt, out[f"{name} {dt}"], flush=True)
    Path(out_path).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
