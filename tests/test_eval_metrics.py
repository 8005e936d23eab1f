"""Known answers of the four eval metrics (DESIGN section 6), their edge cases and their input checks."""

import math

import numpy as np
import pytest

from octopus_audio.audio_metrics.latent import latent_cosine
from octopus_audio.audio_metrics.logmel import logmel_mse, mel_filterbank
from octopus_audio.audio_metrics.lsd import lsd_db
from octopus_audio.audio_metrics.snr import snr_db
from octopus_audio.eval.metrics import compute_metrics


def noise(n, seed=0, scale=0.1):
    return np.random.default_rng(seed).standard_normal(n) * scale


@pytest.mark.parametrize("n", [24000, 1001, 333], ids=lambda n: f"T{n}")
def test_identical_audio_gives_the_perfect_scores(n):
    x = noise(n).astype(np.float32)
    fhat = noise(128 * 75, seed=1).reshape(1, 128, 75)
    m = compute_metrics(x, x.copy(), fhat, fhat.copy(), 24000)
    assert m == {"lsd_db": 0.0, "logmel_mse": 0.0, "snr_db": 120.0,
                 "latent_cos": pytest.approx(1.0, abs=1e-12)}


def test_scaled_copy_gives_20_db_snr():
    x = noise(24000)
    assert snr_db(x, 0.9 * x) == pytest.approx(20.0, abs=1e-9)  # 10 log10(1 / 0.01)


@pytest.mark.parametrize("n", [24000, 7777], ids=lambda n: f"T{n}")
def test_twice_the_amplitude_gives_6_02_db_lsd(n):
    x = noise(n)
    assert lsd_db(x, 2.0 * x) == pytest.approx(10 * math.log10(4), abs=1e-6)  # 6.0206 dB on every bin


def test_logmel_of_a_gain_is_log_gain_squared():
    x = noise(24000, scale=0.5)  # every mel band far above the 1e-5 floor
    assert logmel_mse(x, 2.0 * x) == pytest.approx(math.log(2.0) ** 2, rel=1e-9)


@pytest.mark.parametrize("n", [24000, 1], ids=lambda n: f"T{n}")
def test_silence_against_silence_is_defined(n):
    z = np.zeros(n)
    assert lsd_db(z, z) == 0.0
    assert logmel_mse(z, z) == 0.0
    assert snr_db(z, z) == 120.0
    assert latent_cosine(z, z) == 1.0


def test_silent_reference_against_sound_is_the_floor_not_nan():
    z, x = np.zeros(4000), noise(4000)
    assert snr_db(z, x) == -120.0
    assert snr_db(x, z) == pytest.approx(0.0, abs=1e-12)  # error as loud as the signal
    assert latent_cosine(z, x) == 0.0
    assert lsd_db(z, x) > 50.0


def test_snr_is_capped_at_120_db_for_tiny_errors():
    x = noise(24000)
    assert snr_db(x, x + 1e-12) == 120.0
    assert 60.0 < snr_db(x, x + 1e-4 * noise(24000, seed=5)) < 120.0


@pytest.mark.parametrize("seed", range(8), ids=lambda s: f"seed{s}")
def test_latent_cosine_of_identical_latents_is_exactly_one(seed):
    """The eval's `none` row compares bit-identical latents and reports 1.0 exactly, on any CPU: with norms
    from np.linalg.norm, 62 of 200 random float32 latents of AAR's shape gave 0.9999999999999998."""
    f = np.random.default_rng(seed).standard_normal((128, 75)).astype(np.float32)
    assert latent_cosine(f, f.copy()) == 1.0


def test_latent_cosine_of_opposite_and_orthogonal_latents():
    f = noise(128 * 75).reshape(128, 75)
    assert latent_cosine(f, -3.0 * f) == pytest.approx(-1.0, abs=1e-12)
    a, b = np.zeros((2, 4)), np.zeros((2, 4))
    a[0, 0], b[1, 3] = 1.0, 2.0
    assert latent_cosine(a, b) == 0.0


def test_metrics_accept_torch_tensors_of_model_shape():
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(noise(24000)).float().reshape(1, 1, -1)
    assert snr_db(x, 0.9 * x) == pytest.approx(20.0, abs=1e-4)


@pytest.mark.parametrize("metric", [lsd_db, logmel_mse, snr_db, latent_cosine], ids=lambda f: f.__name__)
@pytest.mark.parametrize("bad", ["length", "nan", "inf", "empty"])
def test_bad_inputs_raise_instead_of_returning_a_number(metric, bad):
    x = noise(2000)
    y = {"length": noise(1999), "nan": np.where(np.arange(2000) == 7, np.nan, x),
         "inf": np.where(np.arange(2000) == 7, np.inf, x), "empty": np.zeros(0)}[bad]
    with pytest.raises(ValueError):
        metric(x, y)


@pytest.mark.parametrize("sr,n_fft,n_mels", [(24000, 1024, 80), (48000, 2048, 64), (16000, 512, 40)],
                         ids=["model-24k", "clap-48k", "16k"])
def test_mel_filterbank_equals_librosa(sr, n_fft, n_mels):
    librosa = pytest.importorskip("librosa")
    ours = mel_filterbank(sr, n_fft, n_mels)
    ref = librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels, dtype=np.float64)
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-12)


def test_lsd_stft_matches_torch_stft_framing():
    torch = pytest.importorskip("torch")
    from octopus_audio.audio_metrics.audio_pair import stft_frames

    x = noise(5000)
    ours = stft_frames(x, 2048, 512)
    ref = torch.stft(torch.from_numpy(x), 2048, 512, window=torch.hann_window(2048, dtype=torch.float64),
                     center=True, pad_mode="constant", return_complex=True).T.numpy()
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-9)


def test_first_parting_scale_counts_from_one():
    from octopus_audio.eval.parting import first_parting_scale

    ref = [np.array([3]), np.array([1, 2]), np.array([5, 6, 7, 8])]
    assert first_parting_scale(ref, [t.copy() for t in ref]) == 4  # never parts: scales + 1
    assert first_parting_scale(ref, [ref[0], np.array([1, 9]), ref[2]]) == 2
    assert first_parting_scale(ref, [np.array([4]), ref[1], np.array([0, 0, 0, 0])]) == 1
    with pytest.raises(ValueError, match="2 and 3 scales"):
        first_parting_scale(ref[:2], ref)
