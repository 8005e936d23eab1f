"""The four metrics of DESIGN section 6 computed together for one (reference, codec output) pair."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from octopus_audio.audio_metrics.audio_pair import as_array, check_pair
from octopus_audio.audio_metrics.latent import latent_cosine
from octopus_audio.audio_metrics.logmel import check_sample_rate, log_mel, logmel_mse_from_log_mels
from octopus_audio.audio_metrics.lsd import lsd_from_power_db, power_db
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


class MetricReference:
    """One clip's uncompressed output, prepared to be compared with many outputs (one per codec row).

    `compare(audio, fhat)` gives exactly what `compute_metrics(ref_audio, audio, ref_fhat, fhat, sample_rate)`
    gives, the same numbers and the same ValueErrors in the same order, but the reference's spectra (LSD's
    power in dB, the log-mel) are computed once, at the first compare whose inputs pass the checks, instead
    of once per row. A bad reference (empty, NaN) is not an error here: every compare raises it, as
    `compute_metrics` does for every row.
    """

    def __init__(self, ref_audio, ref_fhat, sample_rate: int):
        # copies: the spectra cached below must stay those of the reference whatever the caller does with it
        self._ref_T = as_array(ref_audio, "ref_audio").reshape(-1).copy()
        self._ref_fhat = as_array(ref_fhat, "ref_fhat").reshape(-1).copy()
        self._sample_rate = sample_rate

    @property
    def sample_rate(self) -> int:
        return self._sample_rate

    @cached_property
    def _ref_spectra(self) -> tuple[np.ndarray, np.ndarray]:
        """(power_db, log_mel) of the reference; read only after the checks of a compare have passed."""
        return power_db(self._ref_T), log_mel(self._ref_T, self.sample_rate)

    def compare(self, audio, fhat) -> dict[str, float]:
        """All four metrics of `audio` / `fhat` against the reference (see `compute_metrics`)."""
        a, b = check_pair(self._ref_T, as_array(audio, "audio").reshape(-1))
        check_sample_rate(self.sample_rate)
        ref_power_db, ref_log_mel = self._ref_spectra
        return {
            "lsd_db": lsd_from_power_db(ref_power_db, power_db(b)),
            "logmel_mse": logmel_mse_from_log_mels(ref_log_mel, log_mel(b, self.sample_rate)),
            "snr_db": snr_db(a, b),
            "latent_cos": latent_cosine(self._ref_fhat, fhat),
        }


def compute_metrics(ref_audio, audio, ref_fhat, fhat, sample_rate: int) -> dict[str, float]:
    """All four metrics of `audio` / `fhat` against the uncompressed `ref_audio` / `ref_fhat`.

    Audio at the model's `sample_rate`, any shapes holding T samples; latents any shapes of equal size. A
    bad input (length mismatch, NaN) raises ValueError: the caller records it as the row's error, never as a
    number. The values are those of `lsd_db`, `logmel_mse`, `snr_db` and `latent_cosine`; comparing many
    outputs with one reference, `MetricReference` computes the reference's spectra once.
    """
    return MetricReference(ref_audio, ref_fhat, sample_rate).compare(audio, fhat)
