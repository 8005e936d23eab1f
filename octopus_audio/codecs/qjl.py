"""QJL side-car: one sign bit per coordinate of R' r plus the residual norm, and its score correction."""

from __future__ import annotations

import math

import torch

from octopus_audio import rotation
from octopus_audio.packing import pack, unpack

QJL_STREAM = 1  # sign-vector stream of the QJL rotation R' (the main rotation R uses stream 0)


def scale(d: int) -> float:
    """sqrt(pi / (2 d)), the constant of the QJL inner-product estimator."""
    return math.sqrt(math.pi / (2 * d))


def encode(r: torch.Tensor, signs1_HD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual r fp32 [..., H, T, d] (rotated frame) -> (signs int32 [..., H, T, ceil(d/32)],
    gamma_r bf16 [..., H, T]).

    sigma = sign(R' r) with sign(0) = +1, stored as bit 1 for +1.
    """
    bits = (rotation.rotate(r, signs1_HD) >= 0).to(torch.int64)
    return pack(bits, 1), r.norm(dim=-1).to(torch.bfloat16)


def _sigma(signs: torch.Tensor, d: int) -> torch.Tensor:
    return unpack(signs, 1, d).to(torch.float32) * 2 - 1


def vector(signs: torch.Tensor, gamma_r: torch.Tensor, signs1_HD: torch.Tensor) -> torch.Tensor:
    """The QJL term as a rotated-frame vector: sqrt(pi/(2d)) gamma_r R'^T sigma, fp32 [..., H, T, d]."""
    d = signs1_HD.shape[-1]
    return rotation.unrotate(_sigma(signs, d), signs1_HD) * (scale(d) * gamma_r.float()[..., None])


def scores(q_rot: torch.Tensor, signs: torch.Tensor, gamma_r: torch.Tensor,
           signs1_HD: torch.Tensor) -> torch.Tensor:
    """The QJL score term sqrt(pi/(2d)) gamma_r (R' q_rot).sigma: q_rot [..., H, Tq, d] -> [..., H, Tq, T]."""
    d = q_rot.shape[-1]
    s = rotation.rotate(q_rot, signs1_HD) @ _sigma(signs, d).mT
    return s * (scale(d) * gamma_r.float()[..., None, :])
