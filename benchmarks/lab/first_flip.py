"""Where a codec's sampled generation parts ways with the uncompressed reference: for each clip of an eval
run, the first scale whose tokens differ and the share of equal tokens per scale.

Reads the references an `octopus-audio eval --out DIR` run saved (DIR/refs/*.npz: condition and tokens) and
its settings (seed, cfg, top-k, top-p, window, value group, patch seed), regenerates the reference once per
clip to check it matches the saved tokens, then generates under each codec and bit width with the same
condition and seed (the eval's own generation: one clip a call, fp32 on the CPU). The first row is the eval's
`reference (bf16 KV)` floor: the uncompressed model with every key and value rounded to bf16 as it enters the
KV cache (the patch's `kv_dtype`, as the eval's row runs it), same condition and seed; where the run saved
that row's WAV, its regenerated audio is checked against it.

    python benchmarks/lab/first_flip.py --eval out/eval [--codecs all] [--bits 2,4] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def first_difference(ref_S: list[np.ndarray], got_S: list[np.ndarray]) -> int | None:
    """1-based index of the first scale whose tokens differ, None when every scale is equal."""
    for s, (a, b) in enumerate(zip(ref_S, got_S, strict=True)):
        if not np.array_equal(a, b):
            return s + 1
    return None


def matches_saved_wav(path: Path, audio_T: np.ndarray) -> bool:
    """True when `path` is absent (the run had no such row) or holds `audio_T` as the eval wrote it (clipped
    to [-1, 1], 16-bit PCM: within 2^-14)."""
    if not path.is_file():
        return True
    import soundfile

    saved_T, _ = soundfile.read(str(path), dtype="float32")
    if saved_T.shape != audio_T.shape:
        return False
    return float(np.abs(saved_T - np.clip(audio_T, -1, 1)).max()) < 2.0**-14


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval", required=True, help="an eval output folder (with refs/ and settings.json)")
    parser.add_argument("--codecs", default="all", help="comma list or all")
    parser.add_argument("--bits", default="2,4", help="comma list of bit widths (default 2,4)")
    parser.add_argument("--json", help="write every case here")
    args = parser.parse_args(argv)

    import torch

    from octopus_audio.aar_patch import compressed_kv
    from octopus_audio.aar_patch.default_model import default_paths
    from octopus_audio.aar_patch.generation import generate
    from octopus_audio.aar_patch.loading import load_aar
    from octopus_audio.codecs import CODECS
    from octopus_audio.eval.records import KV_FLOOR
    from octopus_audio.eval.run_files import wav_name

    root = Path(args.eval)
    try:
        settings = json.loads((root / "settings.json").read_text())
        refs = sorted((root / "refs").glob("*.npz"))
    except (OSError, ValueError) as e:
        print(f"--eval must be an eval output folder with settings.json and refs/: {e}", file=sys.stderr)
        return 2
    if settings.get("model") != "default" or not refs:
        print(f"--eval must be a run of the embedded default model with saved references; got model "
              f"{settings.get('model')!r} and {len(refs)} references", file=sys.stderr)
        return 2
    codecs = [c for c in CODECS if c != "none"] if args.codecs == "all" else args.codecs.split(",")
    bits = [int(b) for b in args.bits.split(",")]
    pipe = load_aar(*default_paths())
    sampling = {k: settings[k] for k in ("cfg", "top_k", "top_p", "seed")}
    patch = dict(window=settings["window"], v_group=settings["v_group"], seed=settings["patch_seed"])
    torch.set_grad_enabled(False)
    jobs = [(KV_FLOOR, None)] + [(c, b) for c in codecs for b in bits]
    cases, t0 = [], time.time()
    for path in refs:
        saved = np.load(path)
        sizes = saved["token_sizes"].tolist()
        ref_S = np.split(saved["tokens"], np.cumsum(sizes)[:-1])
        cond_1E = torch.from_numpy(saved["cond"][None])
        again = [t[0].numpy() for t in generate(pipe, cond_1E, **sampling).tokens]
        if first_difference(ref_S, again) is not None:
            print(f"{path.stem}: regenerating the reference does not give the saved tokens; is this the same "
                  "model and torch build?", file=sys.stderr)
            return 1
        for codec, b in jobs:
            context = (compressed_kv(pipe, codec="none", bits=16, kv_dtype=torch.bfloat16)
                       if codec == KV_FLOOR else compressed_kv(pipe, codec=codec, bits=b, **patch))
            with context:
                got = generate(pipe, cond_1E, **sampling)
            got_S = [t[0].numpy() for t in got.tokens]
            if codec == KV_FLOOR and not matches_saved_wav(root / "wav" / wav_name(path.stem, codec, b),
                                                            got.audio[0, 0].numpy()):
                print(f"{path.stem}: the {KV_FLOOR} generation differs from the run's saved WAV; is this "
                      "the same model and torch build?", file=sys.stderr)
                return 1
            flip = first_difference(ref_S, got_S)
            equal = [float(np.mean(a == g)) for a, g in zip(ref_S, got_S, strict=True)]
            cases.append({"clip": path.stem, "codec": codec, "bits": b, "first_diff_scale": flip,
                          "equal_share_per_scale": equal})
        print(f"[{time.time() - t0:6.1f} s] {path.stem}", file=sys.stderr)

    n_scales = len(sizes)
    print("| codec | bits | clips | identical generations | first differing scale: median [min, max] "
          "| clips with scales 1-4 identical | equal tokens, last scale (mean) |")
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: |")
    for codec, b in jobs:
        rows = [c for c in cases if c["codec"] == codec and c["bits"] == b]
        flips = [c["first_diff_scale"] or n_scales + 1 for c in rows]
        same = sum(c["first_diff_scale"] is None for c in rows)
        early = sum(f > 4 for f in flips)
        last = np.mean([c["equal_share_per_scale"][-1] for c in rows])
        spread = f"{int(np.median(flips))} [{min(flips)}, {max(flips)}]"
        label = "-" if b is None else b
        print(f"| {codec} | {label} | {len(rows)} | {same} | {spread} | {early} | {last:.3f} |")
    print(f"\n(first differing scale {n_scales + 1} = none differs; {time.time() - t0:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": settings, "cases": cases}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
