"""SEANet encoder and decoder, EnCodec layout (weight-normed convs, reflect padding, LSTM), for AAR's SAT."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# Fixed by the released architecture (README "Tokenizer (SAT)"); the sizes live in SATConfig.
KERNEL_SIZE = 7  # first conv
LAST_KERNEL_SIZE = 7  # last conv
RESIDUAL_KERNEL_SIZE = 3  # first conv of a residual block (the second is 1x1)
COMPRESS = 2  # residual block hidden width = dim // COMPRESS
DILATION_BASE = 2  # residual block j of a stage uses dilation DILATION_BASE**j


class _WeightNormed(nn.Module):
    """Holds `bias`, `weight_g`, `weight_v` (classic weight-norm key names, in that order); builds the weight.

    weight = weight_g * weight_v / ||weight_v||, the norm over every dim but 0 (torch's weight_norm, dim=0).
    """

    def __init__(self, v_shape: tuple[int, int, int], out_channels: int, fan_in: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.empty(out_channels))
        self.weight_g = nn.Parameter(torch.empty(v_shape[0], 1, 1))
        self.weight_v = nn.Parameter(torch.empty(v_shape))
        if self.weight_v.is_meta:  # shapes only (a checkpoint's weights replace them): no init, and no norm
            return  # on meta tensors, whose Python decomposition would import torch._dynamo (3 s on a CPU)
        with torch.no_grad():  # torch's default conv init, then g = ||v|| so that weight == v at start
            nn.init.kaiming_uniform_(self.weight_v, a=math.sqrt(5))
            self.weight_g.copy_(self.weight_v.norm(dim=(1, 2), keepdim=True))
            bound = 1.0 / math.sqrt(fan_in)
            nn.init.uniform_(self.bias, -bound, bound)

    def weight(self) -> torch.Tensor:
        return self.weight_v * (self.weight_g / self.weight_v.norm(dim=(1, 2), keepdim=True))


class WNConv1d(_WeightNormed):
    """Conv1d (no padding) with a weight-normed weight of shape (out, in, k)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 dilation: int = 1) -> None:
        super().__init__((out_channels, in_channels, kernel_size), out_channels, in_channels * kernel_size)
        self.kernel_size, self.stride, self.dilation = kernel_size, stride, dilation

    def forward(self, x_BCT: torch.Tensor) -> torch.Tensor:
        return F.conv1d(x_BCT, self.weight(), self.bias, stride=self.stride, dilation=self.dilation)

    def extra_repr(self) -> str:
        out_ch, in_ch, _ = self.weight_v.shape
        return (f"{in_ch}, {out_ch}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"dilation={self.dilation}")


class WNConvTranspose1d(_WeightNormed):
    """ConvTranspose1d (no padding), weight-normed weight of shape (in, out, k); weight_g is (in, 1, 1)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        super().__init__((in_channels, out_channels, kernel_size), out_channels, out_channels * kernel_size)
        self.kernel_size, self.stride = kernel_size, stride

    def forward(self, x_BCT: torch.Tensor) -> torch.Tensor:
        return F.conv_transpose1d(x_BCT, self.weight(), self.bias, stride=self.stride)

    def extra_repr(self) -> str:
        in_ch, out_ch, _ = self.weight_v.shape
        return f"{in_ch}, {out_ch}, kernel_size={self.kernel_size}, stride={self.stride}"


def _reflect_pad(x_BCT: torch.Tensor, left: int, right: int) -> torch.Tensor:
    """Reflect padding that also works when the input is no longer than the pad (zero-extends first)."""
    length = x_BCT.shape[-1]
    extra = max(left, right) - length + 1 if length <= max(left, right) else 0
    if extra:
        x_BCT = F.pad(x_BCT, (0, extra))
    padded = F.pad(x_BCT, (left, right), mode="reflect")
    return padded[..., : padded.shape[-1] - extra]


class _NormConv1d(nn.Module):
    """Nesting level of the released keys (`conv.conv.weight_g`); the norm itself lives in the inner conv."""

    def __init__(self, *args: int, **kwargs: int) -> None:
        super().__init__()
        self.conv = WNConv1d(*args, **kwargs)

    def forward(self, x_BCT: torch.Tensor) -> torch.Tensor:
        return self.conv(x_BCT)


class _NormConvTranspose1d(nn.Module):
    """Nesting level of the released keys (`convtr.convtr.weight_g`)."""

    def __init__(self, *args: int) -> None:
        super().__init__()
        self.convtr = WNConvTranspose1d(*args)

    def forward(self, x_BCT: torch.Tensor) -> torch.Tensor:
        return self.convtr(x_BCT)


class SConv1d(nn.Module):
    """Non-causal conv with EnCodec padding: total (k-1)*dilation+1-stride, the left side gets the larger
    half, the right side also what a whole number of output frames needs (output length ceil(T / stride))."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 dilation: int = 1) -> None:
        super().__init__()
        self.conv = _NormConv1d(in_channels, out_channels, kernel_size, stride=stride, dilation=dilation)

    def forward(self, x_BCT: torch.Tensor) -> torch.Tensor:
        inner = self.conv.conv
        k_eff = (inner.kernel_size - 1) * inner.dilation + 1
        total = k_eff - inner.stride
        length = x_BCT.shape[-1]
        n_frames = -(-(length - k_eff + total) // inner.stride) + 1  # integer ceil
        extra = (n_frames - 1) * inner.stride + (k_eff - total) - length
        right = total // 2
        return self.conv(_reflect_pad(x_BCT, total - right, right + extra))


class SConvTranspose1d(nn.Module):
    """Non-causal transposed conv trimming k - stride samples: total//2 on the right, the rest on the left."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.convtr = _NormConvTranspose1d(in_channels, out_channels, kernel_size, stride)

    def forward(self, x_BCT: torch.Tensor) -> torch.Tensor:
        inner = self.convtr.convtr
        total = inner.kernel_size - inner.stride
        right = total // 2
        y_BCT = self.convtr(x_BCT)
        return y_BCT[..., total - right: y_BCT.shape[-1] - right]


class ResidualBlock(nn.Module):
    """ELU -> conv(k=3, dilation) to dim//2 -> ELU -> conv(k=1) back to dim, plus a 1x1 conv shortcut."""

    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        hidden = dim // COMPRESS
        self.block = nn.Sequential(
            nn.ELU(), SConv1d(dim, hidden, RESIDUAL_KERNEL_SIZE, dilation=dilation),
            nn.ELU(), SConv1d(hidden, dim, 1),
        )
        self.shortcut = SConv1d(dim, dim, 1)

    def forward(self, x_BCT: torch.Tensor) -> torch.Tensor:
        return self.shortcut(x_BCT) + self.block(x_BCT)


class SLSTM(nn.Module):
    """Multi-layer LSTM over time with a skip connection; runs in its weights' dtype with autocast off (so in
    fp32 inside a bf16/fp16 autocast region, where cuDNN's LSTM would otherwise see mixed dtypes)."""

    def __init__(self, dim: int, num_layers: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(dim, dim, num_layers)

    def forward(self, x_BCT: torch.Tensor) -> torch.Tensor:
        x_TBC = x_BCT.permute(2, 0, 1).to(self.lstm.weight_ih_l0.dtype)
        with torch.autocast(x_BCT.device.type, enabled=False):
            y_TBC, _ = self.lstm(x_TBC)
        return (y_TBC + x_TBC).permute(1, 2, 0)


class SEANetEncoder(nn.Module):
    """Audio (B, channels, N) -> latent (B, dimension, N / prod(ratios)); downsamples by reversed `ratios`."""

    def __init__(self, channels: int, dimension: int, n_filters: int, ratios: tuple[int, ...],
                 n_residual_layers: int, lstm_layers: int) -> None:
        super().__init__()
        mult = 1
        layers: list[nn.Module] = [SConv1d(channels, n_filters, KERNEL_SIZE)]
        for ratio in reversed(ratios):
            width = mult * n_filters
            layers += [ResidualBlock(width, DILATION_BASE ** j) for j in range(n_residual_layers)]
            layers += [nn.ELU(), SConv1d(width, 2 * width, 2 * ratio, stride=ratio)]
            mult *= 2
        if lstm_layers:
            layers.append(SLSTM(mult * n_filters, lstm_layers))
        layers += [nn.ELU(), SConv1d(mult * n_filters, dimension, LAST_KERNEL_SIZE)]
        self.model = nn.Sequential(*layers)

    def forward(self, audio_BCN: torch.Tensor) -> torch.Tensor:
        return self.model(audio_BCN)


class SEANetDecoder(nn.Module):
    """Latent (B, dimension, T) -> audio (B, channels, T * prod(ratios)); upsamples by `ratios` in order, with
    no final activation."""

    def __init__(self, channels: int, dimension: int, n_filters: int, ratios: tuple[int, ...],
                 n_residual_layers: int, lstm_layers: int) -> None:
        super().__init__()
        mult = 2 ** len(ratios)
        layers: list[nn.Module] = [SConv1d(dimension, mult * n_filters, KERNEL_SIZE)]
        if lstm_layers:
            layers.append(SLSTM(mult * n_filters, lstm_layers))
        for ratio in ratios:
            width = mult * n_filters // 2
            layers += [nn.ELU(), SConvTranspose1d(2 * width, width, 2 * ratio, ratio)]
            layers += [ResidualBlock(width, DILATION_BASE ** j) for j in range(n_residual_layers)]
            mult //= 2
        layers += [nn.ELU(), SConv1d(n_filters, channels, LAST_KERNEL_SIZE)]
        self.model = nn.Sequential(*layers)

    def forward(self, z_BCT: torch.Tensor) -> torch.Tensor:
        return self.model(z_BCT)
