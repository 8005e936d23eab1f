"""Key-codec interface, the packed key state, and the rotation/norm preconditioning shared by the codecs."""

from __future__ import annotations

import abc
import dataclasses
import functools
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
    written_by  the writing codec's `state_tag` (decode and scores refuse a state another codec, bit width
            or seed wrote); None for a state assembled by hand, whose fields alone are then checked
    """

    codes: torch.Tensor | None = tensor_field(T_LAST2)
    gamma: torch.Tensor | None = tensor_field(T_LAST1)
    signs: torch.Tensor | None = tensor_field(T_LAST2)
    gamma_r: torch.Tensor | None = tensor_field(T_LAST1)
    native: torch.Tensor | None = tensor_field(T_LAST2)
    written_by: str | None = None


def to_dtype(x_fp32: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast to `dtype`, saturating at its finite range (a decode never turns a finite key into Inf)."""
    if dtype != torch.float32:
        fmax = torch.finfo(dtype).max
        x_fp32 = x_fp32.clamp(-fmax, fmax)
    return x_fp32.to(dtype)


def describe_bits(allowed: tuple[int, ...]) -> str:
    """How accepted bit widths read in a message: `1..7`, `2, 4`, or `any (ignored)` when there are none."""
    if not allowed:
        return "any (ignored)"
    if list(allowed) == list(range(allowed[0], allowed[-1] + 1)):
        return f"{allowed[0]}..{allowed[-1]}"
    return ", ".join(map(str, allowed))


def check_bits(name: str, bits: int, allowed: tuple[int, ...], note: str = "") -> None:
    if not isinstance(bits, int) or isinstance(bits, bool) or bits not in allowed:
        raise ValueError(f"codec {name!r} does not support bits={bits!r}: "
                         f"allowed {describe_bits(allowed)}{note}")


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
    `name` (as the CLI and reports spell it), `supported_bits` (the nominal bit widths it takes with its
    default options; empty: bits are ignored; every message about a codec's bits reads this), `compressed`
    (False: keys and values stay native, no value quantizer) and `kernel_decode` (the name of the decode kind
    of octopus_audio/kernels/kinds/ that decodes its keys inside the fused kernels; None: the cache runs the
    PyTorch reference for it).
    """

    name: ClassVar[str] = ""
    supported_bits: ClassVar[tuple[int, ...]] = ()
    compressed: ClassVar[bool] = True
    kernel_decode: ClassVar[str | None] = None
    bits: int
    head_dim: int
    seed: int

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

    @functools.cached_property
    def state_tag(self) -> str:
        """Who writes this codec's states: its name and every field that changes how a state decodes (fields
        with metadata `format=False`, such as octopus's rounding, do not), e.g. `turboquant-mse(bits=2,
        head_dim=64, seed=0)`."""
        fields = [f for f in dataclasses.fields(self) if f.metadata.get("format", True)]
        return f"{self.name}(" + ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields) + ")"

    def _state_fields(self) -> frozenset[str]:
        """The KeyState fields this codec writes."""
        return frozenset({"native"})

    def check_state(self, state: KeyState) -> None:
        """ValueError unless `state` is one this codec writes: the same `state_tag` when the state carries
        one, and the fields (and code words per key) of this codec's format."""
        if not isinstance(state, KeyState):
            raise ValueError(f"{self.name} decodes a KeyState, got {type(state).__name__}")
        if state.written_by is not None and state.written_by != self.state_tag:
            raise ValueError(f"this key state was written by {state.written_by}; {self.state_tag} decodes "
                             f"only the states it writes (use the codec, bit width and seed that encoded it)")
        present = frozenset(state.tensors())
        if present != self._state_fields():
            raise ValueError(f"{self.state_tag} decodes a state with the fields "
                             f"{', '.join(sorted(self._state_fields()))}; this one holds "
                             f"{', '.join(sorted(present)) or 'no fields'} (written by another codec)")

    def check_heads(self, q: torch.Tensor, state: KeyState) -> None:
        """ValueError unless q [..., H, Tq, d] has the state's leading dims [..., H] (batch and heads)."""
        lead = state.gamma.shape[:-1] if state.gamma is not None else state.native.shape[:-2]
        if tuple(q.shape[:-2]) != tuple(lead):
            raise ValueError(f"scores takes queries [..., H, Tq, {self.head_dim}] with the state's batch and "
                             f"heads {tuple(lead)} in front; got queries {tuple(q.shape)}")

    def check_keys(self, x: torch.Tensor, what: str = "keys") -> None:
        """Type, shape and dtype checks shared by encode and scores (nothing data-dependent: no host sync)."""
        require_tensor(x, what)
        if x.ndim < 2 or x.shape[-1] != self.head_dim:
            raise ValueError(
                f"{what} must have shape [..., H, T, {self.head_dim}] (or [T, {self.head_dim}]), "
                f"got {tuple(x.shape)}"
            )
        if x.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{what} dtype {x.dtype} not supported: use float32, float16 or bfloat16")


def require_tensor(x, what: str) -> None:
    """ValueError unless `x` is a torch.Tensor (a numpy array, say, is named with the conversion to use)."""
    if not isinstance(x, torch.Tensor):
        kind = f"{type(x).__module__}.{type(x).__qualname__}".removeprefix("builtins.")
        hint = "; convert it with torch.from_numpy" if type(x).__module__ == "numpy" else ""
        raise ValueError(f"{what} must be a torch.Tensor, got a {kind}{hint}")


def check_finite_keys(k: torch.Tensor) -> None:
    """ValueError when keys hold NaN or Inf (one reduction, one host sync)."""
    if k.numel() and not bool(torch.isfinite(k).all().item()):
        raise ValueError("keys must be finite: found NaN or Inf")


@dataclasses.dataclass(frozen=True, repr=False)
class RotationCodec(KeyCodec):
    """Base of the rotated codecs: gamma = ||k|| (bf16), u = R k / max(gamma, 1e-30) quantized by a subclass.

    Subclasses implement `_quantize(u) -> codes` and `_dequantize(codes) -> u_hat` (both fp32, rotated frame),
    and declare the codes field: `num_codes` codes of `code_bits` bits per key; `qjl = True` adds the QJL
    side-car on r = u - u_hat. A codec with a `kernel_decode` kind also gives that kind's tables
    (`kernel_tables`) and integer parameters (`kernel_params`). Fields: `bits`, `head_dim`, `seed` (a subclass
    adds its options after them, with defaults).
    """

    bits: int
    head_dim: int
    seed: int = 0
    qjl: ClassVar[bool] = False

    def __post_init__(self):
        rotation.check_head_dim(self.head_dim)
        self._check_bits()
        self._validate()
        object.__setattr__(self, "_device_cache", {})

    def _check_bits(self) -> None:  # overridden where options change the widths a codec takes
        check_bits(self.name, self.bits, self.supported_bits)

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

    # ---- what the fused kernels read (octopus_audio.cache.kernel_view builds their KernelCodec) ----
    def kernel_tables(self, device) -> dict[str, torch.Tensor]:
        """The tables the `kernel_decode` kind reads, by name, on `device`."""
        return {}

    def kernel_params(self) -> dict[str, int]:
        """Integer parameters of the `kernel_decode` kind (e.g. octopus's direction and norm bits)."""
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
        return KeyState(dtype=k.dtype, written_by=self.state_tag, **fields)

    def _state_fields(self) -> frozenset[str]:
        return frozenset({"codes", "gamma", "signs", "gamma_r"} if self.qjl else {"codes", "gamma"})

    def check_state(self, state: KeyState) -> None:
        super().check_state(state)
        if state.codes.shape[-1] != self.code_words:
            raise ValueError(f"{self.state_tag} decodes {self.code_words} code words per key; this state has "
                             f"{state.codes.shape[-1]} (written by another codec or bit width)")

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
        A state another codec, bit width or seed wrote is a ValueError (`check_state`).
        """
        self.check_state(state)
        u_est = self.rotated_estimate(state)
        k_hat = rotation.unrotate(u_est, self.signs(rotation.num_heads_of(u_est), u_est.device))
        return to_dtype(k_hat * state.gamma.float()[..., None], dtype or state.dtype)

    def scores(self, q: torch.Tensor, state: KeyState) -> torch.Tensor:
        """The codec's score estimator q.k_hat: q [..., H, Tq, d] -> fp32 [..., H, Tq, T] (rotated frame)."""
        self.check_keys(q, "queries")
        self.check_state(state)
        self.check_heads(q, state)
        q_rot = self.rotate_query(q)
        s = q_rot @ self._dequantize(state.codes).mT
        if self.qjl:
            s = s + qjl.scores(q_rot, state.signs, state.gamma_r, self._qjl_signs(q))
        return s * state.gamma.float()[..., None, :]

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
        return f"{type(self).__name__}({fields}, bits_per_key={self.bits_per_key})"

