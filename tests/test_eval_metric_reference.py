"""The metrics' faster paths against their plain definitions: strided STFT framing, the band-restricted mel
product, and one prepared reference (`MetricReference`) compared with many outputs."""

import numpy as np
import pytest
import torch
from helpers import assert_rel_close

from octopus_audio.audio_metrics.audio_pair import stft_frames
from octopus_audio.audio_metrics.latent import latent_cosine
from octopus_audio.audio_metrics.logmel import (
    N_FFT,
    N_MELS,
    log_mel,
    logmel_mse,
    mel_filterbank,
    mel_spectrum,
)
from octopus_audio.audio_metrics.lsd import POWER_FLOOR, lsd_db
from octopus_audio.audio_metrics.snr import snr_db
from octopus_audio.eval.metrics import MetricReference, compute_metrics

RATE = 24000


def noise(n, seed=0, scale=0.1):
    return np.random.default_rng(seed).standard_normal(n) * scale


def gathered_stft(x_T, n_fft, hop):
    """The framing as first written: every frame's samples gathered by an index array."""
    window = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n_fft) / n_fft)
    padded = np.pad(x_T, (n_fft // 2, n_fft // 2))
    n_frames = 1 + (padded.size - n_fft) // hop
    index = np.arange(n_fft)[None, :] + hop * np.arange(n_frames)[:, None]
    return np.fft.rfft(padded[index] * window, axis=-1)


def four_metrics(ref_audio, audio, ref_fhat, fhat, sample_rate):
    """compute_metrics as it was written before MetricReference: the four public functions, in this order."""
    return {"lsd_db": lsd_db(ref_audio, audio), "logmel_mse": logmel_mse(ref_audio, audio, sample_rate),
            "snr_db": snr_db(ref_audio, audio), "latent_cos": latent_cosine(ref_fhat, fhat)}


# (n_fft, hop): LSD, log-mel, the report's spectrogram, the conditioning check, and an odd window
FRAMINGS = [(2048, 512), (1024, 256), (256, 64), (2048, 480), (255, 100)]


@pytest.mark.parametrize("n", [1, 5, 300, 511, 1023, 1024, 1025, 7777, 24000],
                         ids=lambda n: f"T{n}")
@pytest.mark.parametrize("n_fft,hop", FRAMINGS, ids=lambda v: str(v))
def test_strided_framing_equals_the_index_gather_bit_for_bit(n, n_fft, hop):
    x = noise(n, seed=n)
    ours = stft_frames(x, n_fft, hop)
    ref = gathered_stft(x, n_fft, hop)
    assert ours.shape == ref.shape == (1 + (n + 2 * (n_fft // 2) - n_fft) // hop, n_fft // 2 + 1)
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("sample_rate", [8000, 16000, 24000, 48000, 192000], ids=lambda s: f"sr{s}")
@pytest.mark.parametrize("n", [1, 333, 24000], ids=lambda n: f"T{n}")
def test_band_restricted_mel_equals_the_full_filterbank_product(sample_rate, n):
    """At 192 kHz some bands hold no bin (value 0); the rest differ from the full product in sum order."""
    mag_FK = np.abs(stft_frames(noise(n, seed=3), N_FFT, 256))
    fb_MK = mel_filterbank(sample_rate)
    ours = mel_spectrum(mag_FK, sample_rate)
    ref = np.einsum("fk,mk->fm", mag_FK, fb_MK)
    assert ours.shape == ref.shape == (mag_FK.shape[0], N_MELS)
    np.testing.assert_array_equal(ours[:, ~fb_MK.any(axis=1)], 0.0)
    np.testing.assert_allclose(ours, ref, rtol=1e-13, atol=0)


def test_band_restricted_mel_is_the_product_with_a_matrix_that_has_every_weight():
    """Each weight enters once: a unit spectrum in each single bin gives back the filterbank's column."""
    fb_MK = mel_filterbank(RATE)
    np.testing.assert_array_equal(mel_spectrum(np.eye(fb_MK.shape[1]), RATE), fb_MK.T)


@pytest.mark.parametrize("n", [24000, 7777, 333], ids=lambda n: f"T{n}")
def test_compare_equals_the_public_metrics_exactly_for_many_outputs(n):
    """One reference, several outputs (scaled, noisy, silent, float32, torch of model shape): LSD, SNR and
    the latent cosine are the same computation as the public functions (equal bits); log-mel too (the same
    `log_mel` on both sides)."""
    ref = noise(n).astype(np.float32)
    ref_fhat = noise(128 * 75, seed=1).reshape(1, 128, 75).astype(np.float32)
    outputs = [(2.0 * ref, ref_fhat), (ref + noise(n, seed=2, scale=0.01), noise(128 * 75, seed=4)),
               (np.zeros(n), ref_fhat * 0.5), (ref.copy(), ref_fhat.copy()),
               (torch.from_numpy(noise(n, seed=5)).float().reshape(1, 1, n),
                torch.from_numpy(noise(128 * 75, seed=6)).reshape(1, 128, 75))]
    prepared = MetricReference(torch.from_numpy(ref).reshape(1, 1, n), ref_fhat, RATE)
    for audio, fhat in outputs + outputs[::-1]:  # the cached reference spectra do not depend on the order
        expected = four_metrics(ref, audio, ref_fhat, fhat, RATE)
        assert prepared.compare(audio, fhat) == expected
        assert compute_metrics(ref, audio, ref_fhat, fhat, RATE) == expected


def test_lsd_and_log_mel_against_their_formulas_as_first_written():
    """LSD: the one-line formula of before the split, equal bits; log-mel MSE: the full einsum product,
    equal up to the mel sums' order."""
    ref, out = noise(24000), noise(24000, seed=9)
    p = np.abs(gathered_stft(ref, 2048, 512)) ** 2
    p_hat = np.abs(gathered_stft(out, 2048, 512)) ** 2
    diff_db = 10.0 * np.log10(p_hat + POWER_FLOOR) - 10.0 * np.log10(p + POWER_FLOOR)
    lsd = float(np.mean(np.sqrt(np.mean(diff_db**2, axis=-1))))

    def plain_log_mel(x):
        mel = np.einsum("fk,mk->fm", np.abs(gathered_stft(x, N_FFT, 256)), mel_filterbank(RATE))
        return np.log(np.maximum(mel, 1e-5))

    m = MetricReference(ref, np.ones(4), RATE).compare(out, np.ones(4))
    assert m["lsd_db"] == lsd
    assert m["logmel_mse"] == pytest.approx(float(np.mean((plain_log_mel(out) - plain_log_mel(ref)) ** 2)),
                                            rel=1e-12)
    assert_rel_close(torch.from_numpy(log_mel(ref, RATE)), torch.from_numpy(plain_log_mel(ref)), 1e-14,
                     "log-mel")


BAD = {  # name: (reference audio, output audio, reference latent, output latent, sample rate)
    "length": (noise(2000), noise(1999), np.ones(6), np.ones(6), RATE),
    "nan-output": (noise(2000), np.where(np.arange(2000) == 7, np.nan, 0.1), np.ones(6), np.ones(6), RATE),
    "inf-output": (noise(2000), np.where(np.arange(2000) == 7, np.inf, 0.1), np.ones(6), np.ones(6), RATE),
    "nan-reference": (np.full(2000, np.nan), noise(2000), np.ones(6), np.ones(6), RATE),
    "empty-output": (noise(2000), np.zeros(0), np.ones(6), np.ones(6), RATE),
    "empty-reference": (np.zeros(0), noise(5), np.ones(6), np.ones(6), RATE),
    "length-before-nan-reference": (np.full(20, np.nan), noise(21), np.ones(6), np.ones(6), RATE),
    "sample-rate": (noise(2000), noise(2000), np.ones(6), np.ones(6), 0),
    "length-before-sample-rate": (noise(2000), noise(20), np.ones(6), np.ones(6), -1),
    "latent-length": (noise(2000), noise(2000), np.ones(6), np.ones(5), RATE),
    "latent-nan": (noise(2000), noise(2000), np.ones(6), np.array([1.0, np.nan, 0, 0, 0, 0]), RATE),
}


@pytest.mark.parametrize("bad", list(BAD))
def test_compare_raises_the_same_value_error_as_the_public_metrics(bad):
    ref, audio, ref_fhat, fhat, sample_rate = BAD[bad]
    with pytest.raises(ValueError) as expected:
        four_metrics(ref, audio, ref_fhat, fhat, sample_rate)
    prepared = MetricReference(ref, ref_fhat, sample_rate)  # a bad reference is not an error until compared
    for _ in range(2):  # and every compare raises it again
        with pytest.raises(ValueError) as got:
            prepared.compare(audio, fhat)
        assert str(got.value) == str(expected.value)
    with pytest.raises(ValueError) as one_shot:
        compute_metrics(ref, audio, ref_fhat, fhat, sample_rate)
    assert str(one_shot.value) == str(expected.value)


def test_a_bad_output_leaves_the_reference_usable():
    ref, out = noise(3000), noise(3000, seed=2)
    prepared = MetricReference(ref, np.ones(3), RATE)
    with pytest.raises(ValueError, match="non-finite"):
        prepared.compare(np.full(3000, np.nan), np.ones(3))
    assert prepared.compare(out, np.ones(3)) == four_metrics(ref, out, np.ones(3), np.ones(3), RATE)


def test_the_reference_is_copied_so_later_changes_to_the_callers_array_do_not_leak_in():
    ref, out, fhat, fhat_out = noise(3000), noise(3000, seed=2), noise(12, seed=3), noise(12, seed=4)
    expected = four_metrics(ref, out, fhat, fhat_out, RATE)
    prepared = MetricReference(ref, fhat, RATE)  # the spectra are computed at the first compare, after this
    ref[:] = 0.0
    fhat[:] = 1.0
    assert prepared.compare(out, fhat_out) == expected
