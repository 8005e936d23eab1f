"""What the kernels know of a key codec (its decode kind, tables, rotations, bit layout), and the packed-state
tensors."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .kinds import DecodeKind, kind_named

MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256  # the fused kernels' range (formats.md allows 8..1024 for the reference)
MAX_CODE_BITS = 16  # the widest code the kernels unpack (a code spans at most two 32-bit words)
V_GROUP = 16


def _fp32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float32).contiguous()


@dataclass(frozen=True, eq=False)
class KernelCodec:
    """A key codec as the kernels see it, built from the codec's declaration (octopus_audio.cache.kernel_view
    builds it):

    kind: the decode kind of its keys (a DecodeKind, or its registered name: a codec's `kernel_decode`);
    head_dim d; the `codes` field: num_codes codes of code_bits bits per key (little-endian int32 words);
    rotation_signs / qjl_signs: [H, d] +-1 vectors, one per KV head (formats.md, streams 0 and 1; qjl_signs
    None for codecs without the QJL side-car); hadamard: the Sylvester matrix H_d [d, d]; tables: the float32
    tables the kind reads, by name (its `DecodeKind.tables` says which, with their shapes); params: the
    kind's integer parameters (triplet: b_dir, b_rho); name: the library codec's, for messages.
    """

    kind: DecodeKind | str
    head_dim: int
    code_bits: int
    num_codes: int
    rotation_signs: torch.Tensor
    hadamard: torch.Tensor
    qjl_signs: torch.Tensor | None = None
    tables: dict[str, torch.Tensor] = field(default_factory=dict)
    params: dict[str, int] = field(default_factory=dict)
    name: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.kind, DecodeKind):
            try:
                object.__setattr__(self, "kind", kind_named(self.kind))
            except ValueError as e:
                raise ValueError(f"{self.name or self.kind}: {e}") from None
        label = self.name or self.kind.name
        d = self.head_dim
        if d & (d - 1) or not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM:
            raise ValueError(f"the fused kernels take head_dim a power of two in "
                             f"[{MIN_HEAD_DIM}, {MAX_HEAD_DIM}], got {d}")
        if not 0 <= self.code_bits <= MAX_CODE_BITS or self.num_codes < 1:
            raise ValueError(f"{label}: codes of 0..{MAX_CODE_BITS} bits, at least one a key, got "
                             f"{self.num_codes} of {self.code_bits} bits")
        if self.rotation_signs.ndim != 2 or self.rotation_signs.shape[1] != d:
            raise ValueError(f"rotation_signs must be [H, {d}], got {tuple(self.rotation_signs.shape)}")
        if tuple(self.hadamard.shape) != (d, d):
            raise ValueError(f"hadamard must be [{d}, {d}], got {tuple(self.hadamard.shape)}")
        if self.qjl_signs is not None and self.qjl_signs.shape != self.rotation_signs.shape:
            raise ValueError(f"{label}: qjl_signs must be shaped like rotation_signs")
        for name, shape in self.kind.tables(self).items():
            t = self.tables.get(name)
            if t is None or tuple(t.shape) != shape:
                got = None if t is None else tuple(t.shape)
                raise ValueError(f"{label}: table {name} must have shape {shape}, got {got}")
        object.__setattr__(self, "tables", {k: _fp32(t) for k, t in self.tables.items()})
        object.__setattr__(self, "rotation_signs", _fp32(self.rotation_signs))
        object.__setattr__(self, "hadamard", _fp32(self.hadamard))
        if self.qjl_signs is not None:
            object.__setattr__(self, "qjl_signs", _fp32(self.qjl_signs))

    def table(self, name: str) -> torch.Tensor:
        """The table `name` (ValueError naming the tables present when it is absent)."""
        if name not in self.tables:
            raise ValueError(f"{self.name or self.kind.name} has no table {name!r}; it has "
                             f"{', '.join(self.tables) or 'no tables'}")
        return self.tables[name]

    def param(self, name: str) -> int:
        """The kind parameter `name`, 0 when the codec has none of that name."""
        return self.params.get(name, 0)

    @property
    def has_qjl(self) -> bool:
        return self.qjl_signs is not None

    @property
    def num_heads(self) -> int:
        return self.rotation_signs.shape[0]

    @property
    def code_words(self) -> int:
        """W: int32 words per key of the `codes` field."""
        return -(-self.num_codes * self.code_bits // 32)

    @property
    def triplet_lanes(self) -> int:
        """LP: the triplet count padded to a power of two >= 16 (the kernels' tile width)."""
        return max(16, 1 << max(0, (self.num_codes - 1).bit_length()))

    def query_map(self, dtype: torch.dtype) -> torch.Tensor:
        """[H, d, NP] integer matrices (exact in every float dtype) that take a query row q to the layouts
        the attention kernel scores with: q @ M_h = [sqrt(d) R q | d R' R q] (formats.md; the QJL block only
        with the side-car), the R q block in the kind's column layout (DecodeKind.query_block; triplet: its
        components x | y | z). Built once per codec and dtype, cached."""
        maps = self.__dict__.setdefault("_query_maps", {})
        if dtype not in maps:
            had = self.hadamard
            rot = self.rotation_signs[:, :, None] * had  # q @ rot[h] = sqrt(d) R_h q (H_d symmetric)
            blocks = [self.kind.query_block(self, rot)]
            if self.has_qjl:
                blocks.append(rot @ (self.qjl_signs[:, :, None] * had))  # d R' R q
            maps[dtype] = torch.cat(blocks, 2).to(dtype).contiguous()
        return maps[dtype]

    def to(self, device: torch.device) -> KernelCodec:
        """This codec with all its tables on `device` (itself when they are all there already)."""
        device = torch.device(device)
        if self.__dict__.get("_home") == device:  # checked before (the launchers call this every time)
            return self
        tensors = [self.rotation_signs, self.hadamard, self.qjl_signs, *self.tables.values()]
        if all(t is None or t.device == device for t in tensors):
            self.__dict__["_home"] = device
            return self

        def move(t):
            return None if t is None else t.to(device)

        return KernelCodec(self.kind, self.head_dim, self.code_bits, self.num_codes,
                           move(self.rotation_signs), move(self.hadamard), move(self.qjl_signs),
                           {k: move(t) for k, t in self.tables.items()}, dict(self.params), self.name)


@dataclass(frozen=True)
class PackedKeys:
    """Compressed keys `[B, H, T, ...]` (formats.md): `codes` int32 words, `gamma` bf16 norms, and for the
    -qjl codecs `signs` int32 words and `gamma_r` bf16 residual norms."""

    codes: torch.Tensor
    gamma: torch.Tensor
    signs: torch.Tensor | None = None
    gamma_r: torch.Tensor | None = None

    def launch_args(self, has_qjl: bool) -> tuple[torch.Tensor, ...]:
        """codes, gamma, signs, gamma_r, contiguous, as the attention kernels take them; without QJL
        (`has_qjl` False) codes and gamma stand in for the never-read signs and gamma_r."""
        signs, gamma_r = (self.signs, self.gamma_r) if has_qjl else (self.codes, self.gamma)
        return self.codes.contiguous(), self.gamma.contiguous(), signs.contiguous(), gamma_r.contiguous()


@dataclass(frozen=True)
class PackedValues:
    """Compressed values `[B, H, T, ...]`: `codes` int32 words (d codes of `bits`), `scale`/`minimum` fp16 per
    group of `group` channels (16 by default)."""

    codes: torch.Tensor
    scale: torch.Tensor
    minimum: torch.Tensor
    bits: int
    group: int = V_GROUP

    def launch_args(self) -> tuple[torch.Tensor, ...]:
        """codes, scale, minimum, contiguous, as the attention kernels take them."""
        return self.codes.contiguous(), self.scale.contiguous(), self.minimum.contiguous()


@dataclass(frozen=True)
class WideSegment:
    """A second compressed store attended in the same softmax as the main one (a cache's wide prefix): its
    `keys` and `values` [B, H, Tcap, ...] at their own widths, of which the first `length` tokens are valid,
    and the `codec` (a KernelCodec of the main codec's kind, at the wide key width) that decodes them."""

    keys: PackedKeys
    values: PackedValues
    length: int
    codec: KernelCodec
