"""Key-codec interface, the packed key state, and the rotation/norm preconditioning shared by the codecs."""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import torch

from octopus_audio import rotation
from octopus_audio.codecs import qjl
from octopus_audio.codecs.state import T_LAST1, T_LAST2, TensorState, tensor_field
from octopus_audio.packing import num_words

GAMMA_EPS = 1e-30
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class KeyState(TensorState):
    """Packed keys of one codec. Fields absent from a codec are None (formats.md lists them per codec).

    codes   int32 [..., H, T, W]   packed per-key codes (n bits each, little-endian bit stream)
    gamma   bf16  [..., H, T]      key norm ||k||
    signs   int32 [..., H, T, d/32] QJL signs of R' r (bit 1 = +1)
    gamma_r bf16  [..., H, T]      QJL residual norm ||r||
    native  input dtype [..., H, T, d]  (codec `none` only)
    dtype   the dtype of the encoded keys (decode returns it)
    """

    codes: torch.Tensor | None = tensor_field(T_LAST2)
    gamma: torch.Tensor | None = tensor_field(T_LAST1)
    signs: torch.Tensor | None = tensor_field(T_LAST2)
    gamma_r: torch.Tensor | None = tensor_field(T_LAST1)
    native: torch.Tensor | None = tensor_field(T_LAST2)


def to_dtype(x_fp32: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast to `dtype`, saturating at its finite range (a decode never turns a finite key into Inf)."""
    if dtype != torch.float32:
        fmax = torch.finfo(dtype).max
        x_fp32 = x_fp32.clamp(-fmax, fmax)
    return x_fp32.to(dtype)


def check_bits(name: str, bits: int, allowed: tuple[int, ...]) -> None:
    if not isinstance(bits, int) or isinstance(bits, bool) or bits not in allowed:
        raise ValueError(
            f"codec {name!r} does not support bits={bits!r}: allowed {allowed[0]}..{allowed[-1]}"
        )


@dataclasses.dataclass(frozen=True)
class KeyLayout:
    """The packed fields of one key and head (formats.md): `codes` holds `num_codes` codes of `code_bits` bits
    as a little-endian stream of int32 words, `gamma` the bf16 norm; with `qjl` the side-car adds `signs`
    (one bit per coordinate, int32 words) and the bf16 residual norm `gamma_r`."""

    head_dim: int
    num_codes: int
    code_bits: int
    qjl: bool = False

    @property
    def code_words(self) -> int:
        return num_words(self.num_codes, self.code_bits)

    @property
    def sign_words(self) -> int:
        return num_words(self.head_dim, 1) if self.qjl else 0

    @property
    def bits_per_key(self) -> int:
        """Stored bits per key: the packed fields in whole int32 words, 16 per bf16 norm."""
        return 32 * self.code_words + 16 + (32 * self.sign_words + 16 if self.qjl else 0)

    def fields(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Per field present: (its shape after the [..., H, T] axes, dtype)."""
        out = {"codes": ((self.code_words,), torch.int32), "gamma": ((), torch.bfloat16)}
        if self.qjl:
            out.update(signs=((self.sign_words,), torch.int32), gamma_r=((), torch.bfloat16))
        return out


class KeyCodec(abc.ABC):
    """A key codec: encode(k [..., H, T, d]) -> KeyState, decode(state) -> k_hat, scores(q, state) -> q.k_hat.

    Concrete codecs are frozen dataclasses with fields `bits`, `head_dim`, `seed` (+ options), registered with
    `octopus_audio.codecs.register`. What the rest of the package reads from a codec class (its declaration):
    `name` (as the CLI and reports spell it), `supported_bits` (the nominal bits it accepts) and `bits_note`
    (what else limits them, for messages), `compressed` (False: keys and values stay native, no value
    quantizer, bits ignored) and `kernel_decode` (the section of kernels/codec_decode.py that decodes its keys
    inside the fused attention; None: the cache runs the PyTorch reference for it).
    """

    name: str = ""
    compressed: bool = True
    supported_bits: tuple[int, ...] = ()
    bits_note: str = ""
    kernel_decode: str | None = None
    bits: int
    head_dim: int
    seed: int

    @classmethod
    def bits_help(cls) -> str:
        """The nominal bits this codec accepts, in words."""
        bits = cls.supported_bits
        return f"{bits[0]}..{bits[-1]}" + (f" ({cls.bits_note})" if cls.bits_note else "")

    @property
    @abc.abstractmethod
    def bits_per_key(self) -> int:
        """Exact stored bits per key and head, from the format (packed fields in whole int32 words)."""

    @property
    def bits_per_coordinate(self) -> float:
        """Effective stored bits per key coordinate (bits_per_key / d)."""
        return self.bits_per_key / self.head_dim

    @abc.abstractmethod
    def encode(self, k: torch.Tensor) -> KeyState: ...

    @abc.abstractmethod
    def decode(self, state: KeyState, dtype: torch.dtype | None = None) -> torch.Tensor: ...

    @abc.abstractmethod
    def scores(self, q: torch.Tensor, state: KeyState) -> torch.Tensor: ...

    def check_keys(self, x: torch.Tensor, what: str = "keys") -> None:
        """Shape and dtype checks shared by encode and scores (no data-dependent checks, no host sync)."""
        if x.ndim < 2 or x.shape[-1] != self.head_dim:
            raise ValueError(
                f"{what} must have shape [..., H, T, {self.head_dim}] (or [T, {self.head_dim}]), "
                f"got {tuple(x.shape)}"
            )
        if x.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{what} dtype {x.dtype} not supported: use float32, float16 or bfloat16")


def check_finite_keys(k: torch.Tensor) -> None:
    """ValueError when keys hold NaN or Inf (one reduction, one host sync)."""
    if k.numel() and not bool(torch.isfinite(k).all().item()):
        raise ValueError("keys must be finite: found NaN or Inf")


@dataclasses.dataclass(frozen=True, repr=False)
class RotationCodec(KeyCodec):
    """Base of the rotated codecs: gamma = ||k|| (bf16), u = R k / max(gamma, 1e-30) quantized by a subclass.

    Subclasses implement `_quantize(u) -> codes` and `_dequantize(codes) -> u_hat` (both fp32, rotated frame),
    and declare the codes field: `num_codes` codes of `code_bits` bits per key; `qjl = True` adds the QJL
    side-car on r = u - u_hat. A codec with a `kernel_decode` section also gives that section's tables
    (`kernel_tables`) and integer parameters (`kernel_params`). Fields: `bits`, `head_dim`, `seed` (a subclass
    adds its options after them, with defaults).
    """

    bits: int
    head_dim: int
    seed: int = 0
    qjl: ClassVar[bool] = False

    def __post_init__(self):
        rotation.check_head_dim(self.head_dim)
        check_bits(self.name, self.bits, self.supported_bits)
        self._validate()
        object.__setattr__(self, "_device_cache", {})

    def _validate(self) -> None:  # overridden by codecs with options
        pass

    @property
    @abc.abstractmethod
    def num_codes(self) -> int:
        """Codes per key in the `codes` field."""

    @property
    @abc.abstractmethod
    def code_bits(self) -> int:
        """Bits of one code."""

    @property
    def layout(self) -> KeyLayout:
        """The packed fields of one key."""
        return KeyLayout(self.head_dim, self.num_codes, self.code_bits, self.qjl)

    @property
    def code_words(self) -> int:
        """int32 words of the `codes` field per key."""
        return self.layout.code_words

    @property
    def bits_per_key(self) -> int:
        return self.layout.bits_per_key

    # ---- what the fused kernels read (octopus_audio.backend builds their KernelCodec from it) ----
    def kernel_tables(self, device) -> dict[str, torch.Tensor]:
        """The tables the `kernel_decode` section reads, by name, on `device`."""
        return {}

    def kernel_params(self) -> dict[str, int]:
        """Integer parameters of the `kernel_decode` section (e.g. octopus's direction and norm bits)."""
        return {}

    def kernel_limit(self, encode: bool) -> str | None:
        """Why the fused kernels cannot serve this codec's settings (None when they can); `encode`: the
        encode kernel, else the attention kernel."""
        return None

    # ---- shared tables, cached per device ----
    def _cached(self, key, make):
        cache = self._device_cache
        if key not in cache:
            cache[key] = make()
        return cache[key]

    def signs(self, num_heads: int, device, stream: int = 0) -> torch.Tensor:
        """float32 [H, d] sign vectors of heads 0..H-1 (stream 0: R, stream 1: the QJL rotation R')."""
        return self._cached(
            ("signs", num_heads, str(device), stream),
            lambda: rotation.head_signs(self.seed, num_heads, self.head_dim, stream, device=device),
        )

    def rotate_query(self, q: torch.Tensor) -> torch.Tensor:
        """q_rot = R q (fp32), per head."""
        return rotation.rotate(q, self.signs(rotation.num_heads_of(q), q.device))

    # ---- encode / decode / scores ----
    @abc.abstractmethod
    def _quantize(self, u: torch.Tensor) -> torch.Tensor:
        """u fp32 [..., d] (unit or zero rows) -> packed codes int32 [..., code_words]."""

    @abc.abstractmethod
    def _dequantize(self, codes: torch.Tensor) -> torch.Tensor:
        """packed codes int32 [..., code_words] -> u_hat fp32 [..., d]."""

    def encode(self, k: torch.Tensor) -> KeyState:
        """k [..., H, T, d] (fp32/fp16/bf16) -> KeyState. NaN/Inf keys are a ValueError."""
        self.check_keys(k)
        check_finite_keys(k)
        return self.encode_unchecked(k)

    def encode_unchecked(self, k: torch.Tensor) -> KeyState:
        """encode without the data-dependent finiteness check (the cache checks each unit once)."""
        k32 = k.to(torch.float32)
        m = k32.abs().amax(-1, keepdim=True)
        gamma = (k32 / torch.where(m > 0, m, torch.ones_like(m))).norm(dim=-1) * m.squeeze(-1)
        u = self.rotate_query(k32) / gamma.clamp_min(GAMMA_EPS)[..., None]
        codes = self._quantize(u)
        fields = {"codes": codes, "gamma": gamma.to(torch.bfloat16)}
        if self.qjl:
            r = u - self._dequantize(codes)
            fields["signs"], fields["gamma_r"] = qjl.encode(r, self._qjl_signs(k))
        return KeyState(dtype=k.dtype, **fields)

    def _qjl_signs(self, x: torch.Tensor) -> torch.Tensor:
        return self.signs(rotation.num_heads_of(x), x.device, stream=qjl.QJL_STREAM)

    def rotated_estimate(self, state: KeyState) -> torch.Tensor:
        """The codec's unit-key estimate in the rotated frame, fp32 [..., d] (u_hat plus the QJL term)."""
        u_hat = self._dequantize(state.codes)
        if self.qjl:
            u_hat = u_hat + qjl.vector(state.signs, state.gamma_r, self._qjl_signs(u_hat))
        return u_hat

    def decode(self, state: KeyState, dtype: torch.dtype | None = None) -> torch.Tensor:
        """KeyState -> k_hat = gamma R^T u_est [..., H, T, d] in `dtype` (default: the encoded keys' dtype).

        Computed in fp32; for the QJL codecs this is the score estimator as a vector, so q.decode == scores.
        """
        u_est = self.rotated_estimate(state)
        k_hat = rotation.unrotate(u_est, self.signs(rotation.num_heads_of(u_est), u_est.device))
        return to_dtype(k_hat * state.gamma.float()[..., None], dtype or state.dtype)

    def scores(self, q: torch.Tensor, state: KeyState) -> torch.Tensor:
        """The codec's score estimator q.k_hat: q [..., H, Tq, d] -> fp32 [..., H, Tq, T] (rotated frame)."""
        self.check_keys(q, "queries")
        q_rot = self.rotate_query(q)
        s = q_rot @ self._dequantize(state.codes).mT
        if self.qjl:
            s = s + qjl.scores(q_rot, state.signs, state.gamma_r, self._qjl_signs(q))
        return s * state.gamma.float()[..., None, :]

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
        return f"{type(self).__name__}({fields}, bits_per_key={self.bits_per_key})"

