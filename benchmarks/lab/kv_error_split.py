"""Which part of a codec's KV error moves the model's distributions: keys, values, or the first token.

Teacher-forced KL(p_ref || p_codec) in nats per token, per scale and overall, on the references of an
`octopus-audio eval --out DIR` run of the embedded default model (DIR/refs/*.npz: condition and tokens), for:
- `patch`: the codec through `compressed_kv` as the eval runs it (one native scale, values in groups of 16);
- `keys+values`, `keys`, `values`: every key and/or value replaced by its codec round trip (encode, decode)
  as it enters the cache, no native window (so the current scale is compressed too);
- `keys+values, first token native`: the same with the first token (the condition) kept exact, the
  attention-sink question: is one outlier token's error what moves the distributions?
Rotation seeds: one per layer (the patch uses one per layer and head), so the round-trip rows measure the
codec's kind of error, not the patch's exact draw. fp32 on the CPU.

    python benchmarks/lab/kv_error_split.py --eval out/eval [--codec octopus] [--bits 4] [--clips 3]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import numpy as np


def kl_per_scale(probs_ref, probs_hat) -> np.ndarray:
    """Mean KL(p_ref || p_hat) over the positions of each scale (nats per token; eval.fidelity's KL)."""
    from octopus_audio.eval.fidelity import fidelity

    return np.array([fidelity([p], [q])["kl_nats"][0] for p, q in zip(probs_ref, probs_hat, strict=True)])


@contextlib.contextmanager
def transformed_kv_cache(model, transform):
    """Inside the block, every key and value entering a KV cache of `model` (our `SelfAttention` modules,
    found as the patch finds them) is replaced by `transform(layer_index, k_BHLD, v_BHLD) -> (k, v)`: each
    module's `_qkv` is wrapped by an instance attribute while `caching` is on, and restored on leaving."""
    from octopus_audio.aar_patch.patch import find_attention

    modules = find_attention(model)
    if not modules or not all(callable(getattr(m, "_qkv", None)) for m in modules):
        raise ValueError("the model needs attention modules with `_qkv` (octopus_audio.aar_patch's)")

    def install(m, index):
        original = m._qkv

        def _qkv(x_BLC):
            q_BHLD, k_BHLD, v_BHLD = original(x_BLC)
            return (q_BHLD, *transform(index, k_BHLD, v_BHLD)) if m.caching else (q_BHLD, k_BHLD, v_BHLD)

        m._qkv = _qkv

    try:
        for i, m in enumerate(modules):
            install(m, i)
        yield modules
    finally:
        for m in modules:
            m.__dict__.pop("_qkv", None)


def round_trip(codec_name: str, bits: int, keys: bool, values: bool, first_native: bool):
    """A `transformed_kv_cache` transform: cached keys and/or values replaced by their codec round trips
    (one rotation seed per layer), the first token of each layer left exact with `first_native`."""
    import octopus_audio as oa

    seen: dict[int, int] = {}

    def transform(layer, k, v):
        first = seen.get(layer, 0) == 0
        seen[layer] = seen.get(layer, 0) + k.shape[2]
        if first and first_native:
            return k, v
        d = k.shape[-1]
        if keys:
            codec = oa.get_codec(codec_name, bits, d, seed=layer)
            k = codec.decode(codec.encode(k)).to(k.dtype)
        if values:
            quant = oa.ValueQuantizer(bits, d, 16)
            v = quant.decode(quant.encode(v)).to(v.dtype)
        return k, v

    return transform


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval", required=True, help="an eval output folder of the default model (refs/)")
    parser.add_argument("--codec", default="octopus")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--clips", type=int, default=3, help="the first N references, sorted by name")
    args = parser.parse_args(argv)

    import torch

    from octopus_audio.aar_patch import compressed_kv
    from octopus_audio.aar_patch.default_model import default_paths
    from octopus_audio.aar_patch.loading import load_aar
    from octopus_audio.codecs import CODECS
    from octopus_audio.eval.fidelity import teacher_forced_probs

    refs = sorted((Path(args.eval) / "refs").glob("*.npz"))[:args.clips]
    if not refs or args.codec not in CODECS or args.codec == "none" or not 2 <= args.bits <= 4:
        print(f"--eval must hold refs/*.npz (found {len(refs)}), --codec one of {', '.join(CODECS[1:])}, "
              f"--bits 2..4; got {args.codec!r} at {args.bits}", file=sys.stderr)
        return 2
    pipe = load_aar(*default_paths())
    sizes = list(pipe.aar.config.patch_nums)
    variants = {"keys+values": (True, True, False), "keys": (True, False, False),
                "values": (False, True, False), "keys+values, first token native": (True, True, True)}
    rows: dict[str, list[np.ndarray]] = {}
    for ref in refs:
        data = np.load(ref)
        tokens = list(torch.split(torch.from_numpy(data["tokens"]).long()[None], sizes, dim=1))
        cond = torch.from_numpy(data["cond"])[None]
        want = teacher_forced_probs(pipe, cond, tokens)
        with compressed_kv(pipe, args.codec, args.bits):
            rows.setdefault("patch", []).append(kl_per_scale(want, teacher_forced_probs(pipe, cond, tokens)))
        for name, (k, v, first) in variants.items():
            with transformed_kv_cache(pipe, round_trip(args.codec, args.bits, k, v, first)):
                rows.setdefault(name, []).append(kl_per_scale(want, teacher_forced_probs(pipe, cond, tokens)))
    weights = np.array(sizes, float)
    print(f"{args.codec} b={args.bits}, {len(refs)} clips; KL nats/token: mean over tokens | per scale "
          f"({', '.join(map(str, sizes))} tokens)")
    for name, per_clip in rows.items():
        kl = np.mean(per_clip, axis=0)
        print(f"{name:34s} {np.sum(kl * weights) / weights.sum():.5f} | " + " ".join(f"{x:.4f}" for x in kl))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
