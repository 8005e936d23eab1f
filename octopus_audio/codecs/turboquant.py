"""TurboQuant codecs: a Lloyd-Max index per rotated coordinate (`-mse`), plus the QJL side-car (`-qjl`)."""

from __future__ import annotations

import dataclasses

import torch

from octopus_audio.codecs.base import RotationCodec, check_bits
from octopus_audio.packing import num_words, pack, unpack

TURBOQUANT_BITS = tuple(range(1, 9))


def quantize_scalar(x: torch.Tensor, boundaries: torch.Tensor) -> torch.Tensor:
    """index(x) = #{i : x > beta_i} (a value on a boundary goes to the lower index), int64."""
    return torch.searchsorted(boundaries, x.contiguous(), right=False)


@dataclasses.dataclass(frozen=True, repr=False)
class TurboQuantMSE(RotationCodec):
    """gamma + one b-bit index into C_coord(d, b) per rotated coordinate (b = 1..8)."""

    bits: int
    head_dim: int
    seed: int = 0
    name = "turboquant-mse"
    supported_bits = TURBOQUANT_BITS

    def _validate(self) -> None:
        check_bits(self.name, self.bits, self.supported_bits)

    @property
    def mse_bits(self) -> int:
        """Bits per coordinate of the Lloyd-Max stage."""
        return self.bits

    @property
    def code_words(self) -> int:
        return num_words(self.head_dim, self.mse_bits)

    def coord_codebook(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(centroids, boundaries) of C_coord(d, mse_bits) as float32 on `device`."""
        def make():
            from octopus_audio.codebooks import get_codebook

            cb = get_codebook("coord", self.head_dim, self.mse_bits)
            return cb.centroids.to(device, torch.float32), cb.boundaries.to(device, torch.float32)

        return self._cached(("coord", str(device)), make)

    def _quantize(self, u: torch.Tensor) -> torch.Tensor:
        if self.mse_bits == 0:
            return pack(torch.zeros(u.shape, dtype=torch.int64, device=u.device), 0)
        _, boundaries = self.coord_codebook(u.device)
        return pack(quantize_scalar(u, boundaries), self.mse_bits)

    def _dequantize(self, codes: torch.Tensor) -> torch.Tensor:
        if self.mse_bits == 0:  # the 0-bit Lloyd-Max codebook of a symmetric density is {0}
            return torch.zeros(*codes.shape[:-1], self.head_dim, dtype=torch.float32, device=codes.device)
        centroids, _ = self.coord_codebook(codes.device)
        return centroids[unpack(codes, self.mse_bits, self.head_dim)]


@dataclasses.dataclass(frozen=True, repr=False)
class TurboQuantQJL(TurboQuantMSE):
    """gamma + (b-1)-bit turboquant-mse indices + QJL signs of the residual + its norm (b = 1..8)."""

    name = "turboquant-qjl"
    qjl = True

    @property
    def mse_bits(self) -> int:
        return self.bits - 1
