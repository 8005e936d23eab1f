"""TurboQuant codecs: a Lloyd-Max index per rotated coordinate (`-mse`), plus the QJL side-car (`-qjl`)."""

from __future__ import annotations

import dataclasses

import torch

from octopus_audio.codecs.base import RotationCodec
from octopus_audio.codecs.registry import register
from octopus_audio.packing import pack, unpack


def quantize_scalar(x: torch.Tensor, boundaries: torch.Tensor) -> torch.Tensor:
    """index(x) = #{i : x > beta_i} (a value on a boundary goes to the lower index), int64."""
    return torch.searchsorted(boundaries, x.contiguous(), right=False)


@register
@dataclasses.dataclass(frozen=True, repr=False)
class TurboQuantMSE(RotationCodec):
    """gamma + one b-bit index into C_coord(d, b) per rotated coordinate (b = 1..8)."""

    name = "turboquant-mse"
    supported_bits = tuple(range(1, 9))
    kernel_decode = "scalar"

    @property
    def mse_bits(self) -> int:
        """Bits per coordinate of the Lloyd-Max stage."""
        return self.bits

    @property
    def num_codes(self) -> int:
        return self.head_dim

    @property
    def code_bits(self) -> int:
        return self.mse_bits

    def kernel_tables(self, device) -> dict[str, torch.Tensor]:
        """The coordinate codebook C_coord(d, mse_bits): `centroids` [2^n], `boundaries` [2^n - 1] (none at
        0 bits)."""
        if self.mse_bits == 0:
            return {}
        centroids, boundaries = self.coord_codebook(device)
        return {"centroids": centroids, "boundaries": boundaries}

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


@register
@dataclasses.dataclass(frozen=True, repr=False)
class TurboQuantQJL(TurboQuantMSE):
    """gamma + (b-1)-bit turboquant-mse indices + QJL signs of the residual + its norm (b = 1..8)."""

    name = "turboquant-qjl"
    qjl = True

    @property
    def mse_bits(self) -> int:
        return self.bits - 1
