"""Held-out reconstruction figures of a tokenizer (default: the shipped one) for MODEL_CARD.md.

For each held-out file (aar_patch/train_data.HELD_OUT, never trained on): the whole file at 24 kHz mono, cut
into 1 s windows (the last zero-padded), encoded to tokens and decoded; log-mel MSE and SNR (the eval metrics)
against the file, beside the same figures for the file low-passed at 2 kHz (Butterworth order 8, zero phase).

    python benchmarks/lab/held_out_reconstruction.py [--sat PATH] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sat", help="tokenizer checkpoint (default: the shipped model's)")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)

    import numpy as np

    from octopus_audio.aar_patch.default_model import default_paths
    from octopus_audio.aar_patch.loading import load_sat
    from octopus_audio.aar_patch.train_data import HELD_OUT, install_sonic_pi
    from octopus_audio.aar_patch.train_report import held_out_audio, reconstruction_table, table_markdown
    from octopus_audio.eval.sources import read_mono_24k

    sat_path = args.sat or default_paths()[1]
    sat = load_sat(sat_path)
    samples_dir, _ = install_sonic_pi(Path("/tmp/octopus-audio-train"))
    rows = reconstruction_table(sat, held_out_audio(samples_dir, HELD_OUT, read_mono_24k))
    print(table_markdown(rows))
    sat_mse = float(np.mean([r.sat_logmel_mse for r in rows]))
    base_mse = float(np.mean([r.lowpass_logmel_mse for r in rows]))
    print(f"\ntokenizer mean log-mel MSE {sat_mse:.3f} vs 2 kHz low-pass {base_mse:.3f}: "
          f"{'beats' if sat_mse < base_mse else 'does NOT beat'} the baseline")
    if args.json:
        payload = {"sat": str(sat_path), "rows": [dataclasses.asdict(r) for r in rows]}
        Path(args.json).write_text(json.dumps(payload, indent=1))
    return 0 if sat_mse < base_mse else 1


if __name__ == "__main__":
    sys.exit(main())
