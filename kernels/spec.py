"""What the kernels know of a key codec (tables, rotations, bit layout), and the packed-state tensors."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

KERNEL_CODECS = ("turboquant-mse", "turboquant-qjl", "polarquant", "octopus", "octopus-qjl")
CODEC_IDS = {name: i for i, name in enumerate(KERNEL_CODECS)}  # the kernels' tl.constexpr CODEC
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256  # the fused kernels' range (formats.md allows 8..1024 for the reference)
V_GROUP = 16
_TENSOR_FIELDS = ("rotation_signs", "qjl_signs", "centroids", "boundaries", "xi_boundaries", "xi_centroids",
                  "directions")


def _fp32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().to(torch.float32).contiguous()


@dataclass(frozen=True)
class KernelCodec:
    """A key codec as the kernels see it: name, bit widths, rotation sign vectors and codebook tables.

    Tables (float32): `centroids`/`boundaries` are the coordinate codebook (turboquant-*), the per-level angle
    codebooks `[levels, 2**bits]`/`[levels, 2**bits - 1]` (polarquant, level 1 first), or the norm codebook
    C_rho (octopus*). Octopus also carries C_xi (`xi_centroids`, `xi_boundaries`) and the decoded-direction
    table `directions` `[4**b_dir, 3]` (row i_xi * 2**b_dir + i_eta).
    `rotation_signs`/`qjl_signs` are `[H, d]` +-1 vectors, one per KV head (formats.md, streams 0 and 1).
    """

    name: str
    head_dim: int
    bits: int
    rotation_signs: torch.Tensor
    qjl_signs: torch.Tensor | None = None
    centroids: torch.Tensor | None = None
    boundaries: torch.Tensor | None = None
    xi_boundaries: torch.Tensor | None = None
    xi_centroids: torch.Tensor | None = None
    directions: torch.Tensor | None = None
    b_dir: int = 0
    b_rho: int = 0

    def __post_init__(self) -> None:
        if self.name not in KERNEL_CODECS:
            raise ValueError(f"kernel codec {self.name!r} is not one of {', '.join(KERNEL_CODECS)}")
        d = self.head_dim
        if d & (d - 1) or not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM:
            raise ValueError(f"the fused kernels take head_dim a power of two in "
                             f"[{MIN_HEAD_DIM}, {MAX_HEAD_DIM}], got {d}")
        if not 1 <= self.bits <= 8:
            raise ValueError(f"bits must be in 1..8, got {self.bits}")
        if self.rotation_signs.ndim != 2 or self.rotation_signs.shape[1] != d:
            raise ValueError(f"rotation_signs must be [H, {d}], got {tuple(self.rotation_signs.shape)}")
        if self.has_qjl and (self.qjl_signs is None or self.qjl_signs.shape != self.rotation_signs.shape):
            raise ValueError(f"{self.name} needs qjl_signs shaped like rotation_signs")
        if self.name.startswith("octopus"):
            if self.b_dir < 1 or self.b_rho < 0:
                raise ValueError(f"octopus needs b_dir >= 1 and b_rho >= 0, got {self.b_dir}, {self.b_rho}")
            self._check("directions", (4**self.b_dir, 3))
            self._check("xi_boundaries", (2**self.b_dir - 1,))
            self._check("xi_centroids", (2**self.b_dir,))
            self._check("centroids", (2**self.b_rho,))
            self._check("boundaries", (2**self.b_rho - 1,))
        elif self.name == "polarquant":
            levels = int(math.log2(d))
            self._check("centroids", (levels, 2**self.bits))
            self._check("boundaries", (levels, 2**self.bits - 1))
        elif self.key_code_bits > 0:
            self._check("centroids", (2**self.key_code_bits,))
            self._check("boundaries", (2**self.key_code_bits - 1,))
        for field in _TENSOR_FIELDS:
            object.__setattr__(self, field, _fp32(getattr(self, field)))

    def _check(self, field: str, shape: tuple[int, ...]) -> None:
        t = getattr(self, field)
        if t is None or tuple(t.shape) != shape:
            got = None if t is None else tuple(t.shape)
            raise ValueError(f"{self.name} b={self.bits}: {field} must have shape {shape}, got {got}")

    @property
    def has_qjl(self) -> bool:
        return self.name.endswith("-qjl")

    @property
    def num_heads(self) -> int:
        return self.rotation_signs.shape[0]

    @property
    def key_code_bits(self) -> int:
        """n: bits per code of the `codes` field."""
        if self.name.startswith("octopus"):
            return 2 * self.b_dir + self.b_rho
        return self.bits - 1 if self.name == "turboquant-qjl" else self.bits

    @property
    def key_codes(self) -> int:
        """L: codes per key."""
        if self.name.startswith("octopus"):
            return -(-self.head_dim // 3)
        return self.head_dim - 1 if self.name == "polarquant" else self.head_dim

    @property
    def key_words(self) -> int:
        """W: int32 words per key of the `codes` field."""
        return -(-self.key_codes * self.key_code_bits // 32)

    @property
    def triplet_lanes(self) -> int:
        """LP: the octopus triplet count padded to a power of two >= 16 (the kernels' tile width)."""
        return max(16, 1 << max(0, (self.key_codes - 1).bit_length()))

    def query_map(self, dtype: torch.dtype) -> torch.Tensor:
        """[H, d, NP] integer matrices (exact in every float dtype) that take a query row q to the layouts
        the attention kernel scores with: q @ M_h = [sqrt(d) R q | d R' R q] (formats.md; the QJL block only
        for -qjl codecs), where octopus reorders the R q block into its triplet components, x | y | z
        (column c * LP + i holds coordinate 3i + c, zero past d). Built once per codec and dtype, cached."""
        maps = self.__dict__.setdefault("_query_maps", {})
        if dtype not in maps:
            d = self.head_dim
            dev = self.rotation_signs.device
            had = torch.ones(1, 1, device=dev)
            while had.shape[0] < d:
                had = torch.cat([torch.cat([had, had], 1), torch.cat([had, -had], 1)], 0)
            rot = self.rotation_signs[:, :, None] * had  # q @ rot[h] = sqrt(d) R_h q (H_d symmetric)
            blocks = [rot]
            if self.name.startswith("octopus"):
                lp = self.triplet_lanes
                j = 3 * torch.arange(lp, device=dev)[None, :] + torch.arange(3, device=dev)[:, None]
                j = j.reshape(-1)
                blocks = [torch.where(j < d, rot[:, :, j.clamp_max(d - 1)], 0.0)]
            if self.has_qjl:
                blocks.append(rot @ (self.qjl_signs[:, :, None] * had))  # d R' R q
            maps[dtype] = torch.cat(blocks, 2).to(dtype).contiguous()
        return maps[dtype]

    def folded_directions(self) -> torch.Tensor:
        """octopus: [2**n * 4] fp32, row `code` = (x, y, z, 0) of C_rho[code & (2**b_rho - 1)] times
        D[code >> b_rho] (a triplet's whole decode as one 16-byte row; n = 2 b_dir + b_rho), cached."""
        if "_folded" not in self.__dict__:
            rho = self.centroids.repeat(4**self.b_dir)[:, None]
            rows = self.directions.repeat_interleave(2**self.b_rho, 0) * rho
            self.__dict__["_folded"] = torch.nn.functional.pad(rows, (0, 1)).reshape(-1).contiguous()
        return self.__dict__["_folded"]

    def polar_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the polarquant angle centroids, flattened level-major (cached)."""
        if "_polar_tables" not in self.__dict__:
            self.__dict__["_polar_tables"] = (torch.cos(self.centroids).reshape(-1).contiguous(),
                                              torch.sin(self.centroids).reshape(-1).contiguous())
        return self.__dict__["_polar_tables"]

    def to(self, device: torch.device) -> KernelCodec:
        """This codec with all its tables on `device` (itself when they are all there already)."""
        device = torch.device(device)
        if self.__dict__.get("_home") == device:  # checked before (the launchers call this every time)
            return self
        if all(getattr(self, f) is None or getattr(self, f).device == device for f in _TENSOR_FIELDS):
            self.__dict__["_home"] = device
            return self
        moved = {f: None if getattr(self, f) is None else getattr(self, f).to(device) for f in _TENSOR_FIELDS}
        return KernelCodec(self.name, self.head_dim, self.bits, b_dir=self.b_dir, b_rho=self.b_rho, **moved)


@dataclass(frozen=True)
class PackedKeys:
    """Compressed keys `[B, H, T, ...]` (formats.md): `codes` int32 words, `gamma` bf16 norms, and for the
    -qjl codecs `signs` int32 words and `gamma_r` bf16 residual norms."""

    codes: torch.Tensor
    gamma: torch.Tensor
    signs: torch.Tensor | None = None
    gamma_r: torch.Tensor | None = None


@dataclass(frozen=True)
class PackedValues:
    """Compressed values `[B, H, T, ...]`: `codes` int32 words (d codes of `bits`), `scale`/`minimum` fp16 per
    group of `group` channels (16 by default)."""

    codes: torch.Tensor
    scale: torch.Tensor
    minimum: torch.Tensor
    bits: int
    group: int = V_GROUP
