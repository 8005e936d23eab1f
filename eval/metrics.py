"""The four metrics of DESIGN section 6 computed together for one (reference, codec output) pair."""

from __future__ import annotations

from dataclasses import dataclass

from octopus_audio.audio_metrics.latent import latent_cosine
from octopus_audio.audio_metrics.logmel import logmel_mse
from octopus_audio.audio_metrics.lsd import lsd_db
from octopus_audio.audio_metrics.snr import snr_db


@dataclass(frozen=True)
class MetricInfo:
    key: str
    label: str
    higher_is_better: bool


METRICS: tuple[MetricInfo, ...] = (
    MetricInfo("lsd_db", "LSD (dB)", False),
    MetricInfo("logmel_mse", "log-mel MSE", False),
    MetricInfo("snr_db", "SNR (dB)", True),
    MetricInfo("latent_cos", "latent cosine", True),
)


def compute_metrics(ref_audio, audio, ref_fhat, fhat, sample_rate: int) -> dict[str, float]:
    """All four metrics of `audio` / `fhat` against the uncompressed `ref_audio` / `ref_fhat`.

    Audio at the model's `sample_rate`, any shapes holding T samples; latents any shapes of equal size. A
    bad input (length mismatch, NaN) raises ValueError: the caller records it as the row's error, never as a
    number.
    """
    return {
        "lsd_db": lsd_db(ref_audio, audio),
        "logmel_mse": logmel_mse(ref_audio, audio, sample_rate),
        "snr_db": snr_db(ref_audio, audio),
        "latent_cos": latent_cosine(ref_fhat, fhat),
    }
