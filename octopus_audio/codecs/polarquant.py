"""PolarQuant codec: recursive polar angles of the rotated unit key, b bits each, Lloyd-Max per level."""

from __future__ import annotations

import dataclasses
import math

import torch

from octopus_audio.codecs.base import RotationCodec
from octopus_audio.codecs.registry import register
from octopus_audio.codecs.turboquant import quantize_scalar
from octopus_audio.packing import pack, unpack


@register
@dataclasses.dataclass(frozen=True, repr=False)
class PolarQuant(RotationCodec):
    """gamma + d-1 angles: level 1 (d/2 angles in [0, 2 pi), uniform codebook), levels 2..log2(d) (Lloyd-Max).

    Codes are ordered level 1 (pair j = coords 2j, 2j+1), level 2, ..., the top level (one angle);
    the top radius is 1 and is not stored. b = 1..8.
    """

    name = "polarquant"
    supported_bits = tuple(range(1, 9))
    kernel_decode = "polar"

    @property
    def levels(self) -> int:
        return int(math.log2(self.head_dim))

    @property
    def num_codes(self) -> int:
        return self.head_dim - 1

    @property
    def code_bits(self) -> int:
        return self.bits

    def kernel_tables(self, device) -> dict[str, torch.Tensor]:
        """The per-level angle codebooks, level 1 first: `centroids` [levels, 2^b], `boundaries`
        [levels, 2^b - 1]."""
        books = [self.level_codebook(level, device) for level in range(1, self.levels + 1)]
        return {"centroids": torch.stack([c for c, _ in books]),
                "boundaries": torch.stack([b for _, b in books])}

    def level_codebook(self, level: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(centroids, boundaries) of level `level` (1-based) as float32 on `device`."""
        def make():
            from octopus_audio.codebooks import get_codebook

            cb = get_codebook(f"polar{level}", self.head_dim, self.bits)
            return cb.centroids.to(device, torch.float32), cb.boundaries.to(device, torch.float32)

        return self._cached((f"polar{level}", str(device)), make)

    def _quantize(self, u: torch.Tensor) -> torch.Tensor:
        x = u
        idx = []
        for level in range(1, self.levels + 1):
            even, odd = x[..., 0::2], x[..., 1::2]
            psi = torch.atan2(odd, even)
            if level == 1:
                psi = torch.where(psi < 0, psi + 2 * math.pi, psi)
            idx.append(quantize_scalar(psi, self.level_codebook(level, u.device)[1]))
            x = torch.sqrt(even * even + odd * odd)
        return pack(torch.cat(idx, dim=-1), self.bits)

    def _dequantize(self, codes: torch.Tensor) -> torch.Tensor:
        idx = unpack(codes, self.bits, self.head_dim - 1)
        r = torch.ones(*codes.shape[:-1], 1, dtype=torch.float32, device=codes.device)
        for level in range(self.levels, 0, -1):
            n_angles = self.head_dim >> level
            start = self.head_dim - (self.head_dim >> (level - 1))  # angles of levels < `level` come first
            psi = self.level_codebook(level, codes.device)[0][idx[..., start:start + n_angles]]
            r = torch.stack([r * torch.cos(psi), r * torch.sin(psi)], dim=-1).flatten(-2)
        return r
