"""How often the octopus key encode re-decides near ties: the fraction of keys holding a triplet whose two
best local3x3 scores lie within NEAR (relative) off the symmetry planes, and of row groups (64-row blocks,
16-row groups) holding one, on random unit keys of d=64 (CPU, plain PyTorch through the kernel's search
tables).

    python benchmarks/lab/near_tie_rate.py [--keys 200000] [--bits 2,3,4]
"""

from __future__ import annotations

import argparse

import torch

from octopus_audio.codebooks import get_codebook
from octopus_audio.codecs import get_codec
from octopus_audio.kernels.kinds import triplet_search as tt
from octopus_audio.octahedral import direction_table

NEAR = 4e-7  # codec_encode.NEAR
D = 64


def rates(bits: int, keys: int, seed: int = 0) -> dict:
    codec = get_codec("octopus", bits, D)
    b_dir, b_rho = codec.dir_bits, codec.rho_bits
    xi = get_codebook("xi", None, b_dir)
    tables = tt.search_tables(direction_table(b_dir), xi.centroids, xi.boundaries,
                              get_codebook("rho", D, b_rho).boundaries)
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(keys, D, generator=g)
    u = u / u.norm(dim=1, keepdim=True)
    n_trip = codec.num_triplets
    t = torch.nn.functional.pad(u, (0, 3 * n_trip - D)).reshape(-1, 3)
    l1 = t.abs().sum(1).clamp_min(1e-30)
    px, py = t[:, 0] / l1, t[:, 1] / l1
    lower = t[:, 2] < 0
    xi_c = torch.where(lower, torch.where(px < 0, py.abs() - 1, 1 - py.abs()), px)
    eta_c = torch.where(lower, torch.where(py < 0, px.abs() - 1, 1 - px.abs()), py)
    rows = tt.region(xi_c, tables.lut, tables.lut_scale) * tables.regions + tt.region(eta_c, tables.lut,
                                                                                      tables.lut_scale)
    c = tables.candidates[rows]
    s = (t[:, 0, None] * c[..., 0] + t[:, 1, None] * c[..., 1]) + t[:, 2, None] * c[..., 2]
    top = torch.nan_to_num(s, nan=float("-inf")).topk(2, dim=1).values
    sym = (t[:, 0] == 0) | (t[:, 1] == 0) | (t[:, 0].abs() == t[:, 1].abs())
    near = ((top[:, 0] - top[:, 1] <= NEAR * top[:, 0].abs()) & ~sym).reshape(keys, n_trip).any(1)
    out = {"bits": bits, "b_dir": b_dir, "keys": near.float().mean().item()}
    for group in (64, 16):
        flagged = near[: keys // group * group].reshape(-1, group).any(1)
        out[f"groups_of_{group}"] = flagged.float().mean().item()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--bits", default="2,3,4")
    args = parser.parse_args()
    for bits in (int(b) for b in args.bits.split(",")):
        r = rates(bits, args.keys)
        print(f"octopus b={bits} (b_dir {r['b_dir']}): keys {r['keys']:.2e}, "
              f"64-row blocks {r['groups_of_64']:.3f}, 16-row groups {r['groups_of_16']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
