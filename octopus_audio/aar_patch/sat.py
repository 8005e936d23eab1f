"""The AAR tokenizer (SAT): SEANet encoder/decoder around a multi-scale residual quantizer; strict loading."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping

import torch
from torch import nn

from octopus_audio.errors import UsageError

from .multiscale_vq import MultiScaleQuantizer
from .seanet import SEANetDecoder, SEANetEncoder

# tokens a scale of the released tokenizer (one clip: 16 scales, 455 tokens); the transformer's scales
RELEASE_PATCH_NUMS = (1, 2, 4, 6, 9, 12, 16, 20, 25, 31, 37, 43, 50, 58, 66, 75)


@dataclasses.dataclass(frozen=True)
class SATConfig:
    """Sizes of an SAT tokenizer; the defaults are the released `SAT_d128_lat128` (AAR's tokenizer).

    `dimension` is the SEANet latent width, `latent_dim` the codebook width (the channels of f_hat that the
    transformer sees); when they differ the quantizer has `project_in`/`project_out` (the released
    `SAT_bs_1536_d1024_lat64` is dimension=1024, latent_dim=64). One clip is patch_nums[-1] latent frames of
    prod(ratios) samples each.
    """

    n_filters: int = 32
    ratios: tuple[int, ...] = (8, 5, 4, 2)
    dimension: int = 128
    latent_dim: int = 128
    lstm_layers: int = 2
    n_residual_layers: int = 1
    codebook_size: int = 1024
    patch_nums: tuple[int, ...] = RELEASE_PATCH_NUMS
    num_phi: int = 6
    phi_kernel: int = 9
    phi_ratio: float = 0.5
    channels: int = 1
    sample_rate: int = 24000

    def __post_init__(self) -> None:
        object.__setattr__(self, "ratios", tuple(self.ratios))
        object.__setattr__(self, "patch_nums", tuple(self.patch_nums))
        for name in ("n_filters", "dimension", "latent_dim", "codebook_size", "num_phi", "channels",
                     "sample_rate"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"SATConfig.{name} must be a positive int, got {value!r}")
        for name in ("lstm_layers", "n_residual_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"SATConfig.{name} must be an int >= 0, got {value!r}")
        if not self.ratios or not all(isinstance(r, int) and r >= 1 for r in self.ratios):
            raise ValueError(f"SATConfig.ratios must be a non-empty tuple of positive ints, "
                             f"got {self.ratios!r}")
        if self.n_filters < 2:
            raise ValueError(f"SATConfig.n_filters must be >= 2 (residual blocks halve it), "
                             f"got {self.n_filters}")
        pns = self.patch_nums
        increasing = all(a < b for a, b in zip(pns, pns[1:], strict=False))
        if not pns or not all(isinstance(p, int) and p >= 1 for p in pns) or not increasing:
            raise ValueError(f"SATConfig.patch_nums must be strictly increasing positive ints, got {pns!r}")
        if not isinstance(self.phi_kernel, int) or self.phi_kernel < 1 or self.phi_kernel % 2 == 0:
            raise ValueError(f"SATConfig.phi_kernel must be a positive odd int, got {self.phi_kernel!r}")
        if not 0.0 <= self.phi_ratio <= 1.0:
            raise ValueError(f"SATConfig.phi_ratio must be in [0, 1], got {self.phi_ratio!r}")

    @property
    def hop_length(self) -> int:
        return math.prod(self.ratios)

    @property
    def num_frames(self) -> int:
        return self.patch_nums[-1]

    @property
    def audio_length(self) -> int:
        return self.hop_length * self.num_frames


class SAT(nn.Module):
    """Tokenizer: audio (B, 1, N) <-> 16 token lists <-> f_hat (B, latent_dim, patch_nums[-1]).

    >>> sat = SAT(SATConfig())
    >>> tokens = sat.encode_audio(torch.zeros(2, 1, 24000))   # 16 LongTensors (2, pn)
    >>> audio_B1N = sat.decode(sat.tokens_to_fhat(tokens))     # (2, 1, 24000), float32
    """

    def __init__(self, config: SATConfig | None = None) -> None:
        super().__init__()
        self.config = config = config or SATConfig()
        seanet = dict(channels=config.channels, dimension=config.dimension, n_filters=config.n_filters,
                      ratios=config.ratios, n_residual_layers=config.n_residual_layers,
                      lstm_layers=config.lstm_layers)
        self.encoder = SEANetEncoder(**seanet)
        self.decoder = SEANetDecoder(**seanet)
        self.quantizer = MultiScaleQuantizer(config.dimension, config.latent_dim, config.codebook_size,
                                             config.patch_nums, config.num_phi, config.phi_kernel,
                                             config.phi_ratio)

    @property
    def patch_nums(self) -> tuple[int, ...]:
        return self.config.patch_nums

    @property
    def latent_dim(self) -> int:
        return self.config.latent_dim

    def extra_repr(self) -> str:
        return f"config={self.config}"

    def _check_audio(self, audio_B1N: torch.Tensor) -> None:
        expected = (self.config.channels, self.config.audio_length)
        if audio_B1N.ndim != 3 or tuple(audio_B1N.shape[1:]) != expected:
            raise ValueError(f"audio must have shape (B, {expected[0]}, {expected[1]}) ({expected[1]} "
                             f"samples at {self.config.sample_rate} Hz), got {tuple(audio_B1N.shape)}")

    def encode_latent(self, audio_B1N: torch.Tensor) -> torch.Tensor:
        """Audio (B, 1, N) -> unquantized latent in the quantizer space (B, latent_dim, T)."""
        self._check_audio(audio_B1N)
        return self.quantizer.to_latent(self.encoder(audio_B1N))

    def quantize_audio(self, audio_B1N: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Audio (B, 1, N) -> (16 id tensors (B, pn) int64, f_hat (B, latent_dim, T))."""
        return self.quantizer.quantize(self.encode_latent(audio_B1N).float())

    def encode_audio(self, audio_B1N: torch.Tensor) -> list[torch.Tensor]:
        """Audio (B, 1, N) -> 16 id tensors (B, pn) int64."""
        return self.quantize_audio(audio_B1N)[0]

    def tokens_to_fhat(self, tokens: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> torch.Tensor:
        """16 id tensors (B, pn) -> f_hat (B, latent_dim, T)."""
        return self.quantizer.tokens_to_fhat(tokens)

    def decode(self, f_hat_BCT: torch.Tensor) -> torch.Tensor:
        """f_hat (B, latent_dim, T) -> audio (B, 1, T * hop) in float32 (also under autocast)."""
        if f_hat_BCT.ndim != 3 or f_hat_BCT.shape[1] != self.latent_dim:
            raise ValueError(f"f_hat must have shape (B, {self.latent_dim}, T), got {tuple(f_hat_BCT.shape)}")
        return self.decoder(self.quantizer.from_latent(f_hat_BCT)).float()

    @classmethod
    def config_from_state_dict(cls, state_dict: Mapping[str, torch.Tensor],
                               patch_nums: tuple[int, ...] | None = None) -> SATConfig:
        """Infer a tokenizer's sizes from its state dict's shapes (patch_nums: the release's when the scale
        count matches, else pass them)."""
        def need(key: str) -> torch.Tensor:
            value = state_dict.get(key)
            if not isinstance(value, torch.Tensor):
                sample = ", ".join(repr(k) for k in list(state_dict)[:3])
                raise UsageError(f"the state dict is not an SAT tokenizer: it has no tensor {key!r} (its "
                                 f"{len(state_dict)} keys start with {sample or 'nothing'})")
            return value

        def indices(pattern: str) -> list[int]:
            return sorted({int(m.group(1)) for k in state_dict if (m := re.fullmatch(pattern, k))})

        first_v = need("encoder.model.0.conv.conv.weight_v")
        codebook = need("quantizer.vq.layers.0._codebook.embed")
        tr_kernels = [need(f"decoder.model.{i}.convtr.convtr.weight_v").shape[-1]
                      for i in indices(r"decoder\.model\.(\d+)\.convtr\.convtr\.weight_v")]
        ratios = tuple(k // 2 for k in tr_kernels) or SATConfig.ratios
        num_scales = len(indices(r"quantizer\.vq\.layers\.(\d+)\._codebook\.embed"))
        if patch_nums is None:
            if num_scales != len(RELEASE_PATCH_NUMS):
                raise UsageError(f"the tokenizer state dict has {num_scales} codebooks but the released "
                                 f"scale layout has {len(RELEASE_PATCH_NUMS)}; pass patch_nums with "
                                 f"{num_scales} entries")
            patch_nums = RELEASE_PATCH_NUMS
        num_res_blocks = len(indices(r"encoder\.model\.(\d+)\.shortcut\.conv\.conv\.weight_v"))
        phi_ids = indices(r"quantizer\.vq\.quant_resi\.qresi_ls\.(\d+)\.weight")
        try:
            return SATConfig(
                n_filters=first_v.shape[0],
                channels=first_v.shape[1],
                ratios=ratios,
                dimension=need("decoder.model.0.conv.conv.weight_v").shape[1],
                latent_dim=codebook.shape[1],
                codebook_size=codebook.shape[0],
                lstm_layers=len(indices(r"encoder\.model\.\d+\.lstm\.weight_ih_l(\d+)")),
                n_residual_layers=num_res_blocks // len(ratios),
                patch_nums=tuple(patch_nums),
                num_phi=max(len(phi_ids), 1),
                phi_kernel=need("quantizer.vq.quant_resi.qresi_ls.0.weight").shape[-1],
            )
        except ValueError as e:
            raise UsageError(f"the tokenizer state dict implies an invalid configuration: {e}") from e

    @classmethod
    def from_state_dict(cls, state_dict: Mapping[str, torch.Tensor],
                        patch_nums: tuple[int, ...] | None = None) -> SAT:
        """Build the tokenizer a plain state dict describes and load it strictly (float32 copies, on the state
        dict's device).

        Raises UsageError naming the offending keys when keys are missing or unexpected or shapes differ.
        """
        if not isinstance(state_dict, Mapping):
            raise UsageError(f"a tokenizer state dict must be a mapping of names to tensors, got "
                             f"{type(state_dict).__name__}")
        with torch.device("meta"):  # shapes only: the weights come from the state dict (no init cost)
            model = cls(cls.config_from_state_dict(state_dict, patch_nums))
        expected = model.state_dict()
        missing = [k for k in expected if k not in state_dict]
        unexpected = [k for k in state_dict if k not in expected]
        wrong = [f"{k} {_shape(state_dict[k])} instead of {tuple(v.shape)}" for k, v in expected.items()
                 if k in state_dict and _shape(state_dict[k]) != tuple(v.shape)]
        found = (("missing key", missing), ("unexpected key", unexpected), ("wrong shape", wrong))
        problems = [f"{len(items)} {what}{'s' * (len(items) != 1)} ({_first(items)})" for what, items in found
                    if items]
        if problems:
            raise UsageError("the tokenizer state dict does not match the SAT architecture it implies "
                             f"(n_filters={model.config.n_filters}, dimension={model.config.dimension}, "
                             f"latent_dim={model.config.latent_dim}): " + "; ".join(problems))
        model.load_state_dict({k: v.to(expected[k].dtype, copy=True) for k, v in state_dict.items()},
                              strict=True, assign=True)
        return model


def _shape(value: object) -> tuple[int, ...] | str:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else f"<{type(value).__name__}>"


def _first(items: list[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", and {len(items) - limit} more" if len(items) > limit else "")
