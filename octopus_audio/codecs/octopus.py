"""OCTOPUS codec: rotated unit key split into triplets, each an octahedral direction and a Lloyd-Max norm."""

from __future__ import annotations

import dataclasses

import torch

from octopus_audio.codecs.base import RotationCodec, check_bits
from octopus_audio.codecs.registry import register
from octopus_audio.packing import pack, unpack

DIR_BITS = tuple(range(1, 9))
RHO_BITS = tuple(range(0, 9))
OCTOPUS_BITS = tuple(range(1, 9))  # nominal bits with explicit dir_bits / rho_bits
DEFAULT_SPLIT_BITS = tuple(range(1, DIR_BITS[-1]))  # the default dir_bits = b + 1 must stay in DIR_BITS
ROUNDING_MODES = ("scalar", "local3x3", "full")


@register
@dataclasses.dataclass(frozen=True, repr=False)
class Octopus(RotationCodec):
    """gamma + per triplet one code ((i_xi << dir_bits) | i_eta) << rho_bits | i_rho.

    A code has 2 dir_bits + rho_bits bits.

    bits: nominal b (1..7 with the default split, 1..8 with an explicit dir_bits); dir_bits defaults to b+1
    (1..8), rho_bits to b-1 (0..8); rounding is the joint rounding of DESIGN section 2 ("scalar", "local3x3"
    (default) or "full"; it changes only the encode, so a state's writer is named without it).
    """

    dir_bits: int | None = None
    rho_bits: int | None = None
    rounding: str = dataclasses.field(default="local3x3", metadata={"format": False})
    name = "octopus"
    supported_bits = DEFAULT_SPLIT_BITS
    kernel_decode = "triplet"

    def _check_bits(self) -> None:
        if self.dir_bits is None:
            check_bits(self.name, self.bits, self.supported_bits,
                       f" with the default split (dir_bits = b+1 <= {DIR_BITS[-1]}); with an explicit "
                       f"dir_bits, {OCTOPUS_BITS[0]}..{OCTOPUS_BITS[-1]}")
        else:
            check_bits(self.name, self.bits, OCTOPUS_BITS)

    def _validate(self) -> None:
        if self.dir_bits is None:
            object.__setattr__(self, "dir_bits", self.bits + 1)
        if self.rho_bits is None:
            object.__setattr__(self, "rho_bits", self.bits - 1)
        if self.dir_bits not in DIR_BITS:
            raise ValueError(
                f"codec {self.name!r}: dir_bits={self.dir_bits} not supported: "
                f"allowed {DIR_BITS[0]}..{DIR_BITS[-1]} "
                f"(the default b+1 needs bits <= {DIR_BITS[-1] - 1})"
            )
        if self.rho_bits not in RHO_BITS:
            raise ValueError(
                f"codec {self.name!r}: rho_bits={self.rho_bits} not supported: "
                f"allowed {RHO_BITS[0]}..{RHO_BITS[-1]}"
            )
        if self.rounding not in ROUNDING_MODES:
            raise ValueError(
                f"codec {self.name!r}: rounding {self.rounding!r} unknown; "
                f"allowed: {', '.join(ROUNDING_MODES)}"
            )

    @property
    def num_triplets(self) -> int:
        """L = ceil(d / 3) triplets per key (u zero-padded to 3L)."""
        return -(-self.head_dim // 3)

    @property
    def code_bits(self) -> int:
        """Bits n of one triplet code."""
        return 2 * self.dir_bits + self.rho_bits

    @property
    def num_codes(self) -> int:
        return self.num_triplets

    def kernel_tables(self, device) -> dict[str, torch.Tensor]:
        """The decoded-direction table `directions` [4^dir_bits, 3] (row i_xi * 2^dir_bits + i_eta), C_xi
        (`xi_centroids`, `xi_boundaries`) and C_rho (`centroids`, `boundaries`)."""
        from octopus_audio.codebooks import get_codebook

        xi = get_codebook("xi", None, self.dir_bits)
        directions, rho_centroids = self.tables(device)
        return {"directions": directions, "xi_centroids": xi.centroids, "xi_boundaries": xi.boundaries,
                "centroids": rho_centroids,
                "boundaries": get_codebook("rho", self.head_dim, self.rho_bits).boundaries}

    def kernel_params(self) -> dict[str, int]:
        return {"b_dir": self.dir_bits, "b_rho": self.rho_bits}

    def kernel_limit(self, encode: bool) -> str | None:
        if encode and self.rounding != "local3x3":
            return f"the encode kernel implements local3x3 rounding only, not {self.rounding!r}"
        return None

    def tables(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(direction table fp32 [4^dir_bits, 3], rho centroids fp32 [2^rho_bits]) on `device`."""
        def make():
            from octopus_audio.codebooks import get_codebook
            from octopus_audio.octahedral import direction_table

            rho_c = get_codebook("rho", self.head_dim, self.rho_bits).centroids
            return direction_table(self.dir_bits).to(device), rho_c.to(device, torch.float32)

        return self._cached(("octopus", str(device)), make)

    def _quantize(self, u: torch.Tensor) -> torch.Tensor:
        from octopus_audio.octahedral import round_triplets

        L = self.num_triplets
        t = torch.nn.functional.pad(u, (0, 3 * L - self.head_dim)).reshape(*u.shape[:-1], L, 3)
        i_xi, i_eta, i_rho = round_triplets(t, self.dir_bits, self.rho_bits, self.rounding, d=self.head_dim)
        codes = (((i_xi << self.dir_bits) | i_eta) << self.rho_bits) | i_rho
        return pack(codes, self.code_bits)

    def _dequantize(self, codes: torch.Tensor) -> torch.Tensor:
        table, rho_c = self.tables(codes.device)
        c = unpack(codes, self.code_bits, self.num_triplets)
        t_hat = rho_c[c & ((1 << self.rho_bits) - 1)][..., None] * table[c >> self.rho_bits]
        return t_hat.flatten(-2)[..., : self.head_dim]


@register
@dataclasses.dataclass(frozen=True, repr=False)
class OctopusQJL(Octopus):
    """octopus(b) plus the QJL side-car (signs of R' r and the residual norm)."""

    name = "octopus-qjl"
    qjl = True
