"""Conditioners: the spectral stand-in, the on-disk cache, hf CLAP with a tiny saved ClapModel, errors."""

import numpy as np
import pytest

from octopus_audio.errors import UsageError
from octopus_audio.eval.conditioning import (
    CachedConditioner,
    HFClapConditioner,
    SpectralConditioner,
    make_conditioner,
)


def clip48(seed, seconds=10.0):
    rng = np.random.default_rng(seed)
    t = np.arange(int(48000 * seconds)) / 48000
    x = 0.3 * np.sin(2 * np.pi * (200 + 300 * seed) * t) + 0.01 * rng.standard_normal(t.size)
    return x.astype(np.float32)


def test_spectral_is_deterministic_unit_norm_and_tells_clips_apart():
    c = SpectralConditioner()
    a, a2, b = c.embed(clip48(0)), c.embed(clip48(0)), c.embed(clip48(1))
    assert a.shape == (512,) and a.dtype == np.float32
    assert np.linalg.norm(a) == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_array_equal(a, a2)
    assert float(a @ b) < 0.99
    silence = c.embed(np.zeros(480000, dtype=np.float32))
    assert np.all(np.isfinite(silence)) and np.linalg.norm(silence) == pytest.approx(1.0, abs=1e-6)


def spectral_transforming_every_frame(audio_T):
    """The spectral stand-in as defined (every STFT frame of the 10 s transformed), the plain reference of
    SpectralConditioner.embed, which transforms only the frames before the last nonzero sample."""
    from octopus_audio.audio_metrics.audio_pair import stft_frames
    from octopus_audio.audio_metrics.logmel import mel_filterbank
    from octopus_audio.eval.conditioning import l2_normalise

    x = np.asarray(audio_T, dtype=np.float64)
    power = np.abs(stft_frames(x, 2048, 480)) ** 2
    logmel = np.log10(np.einsum("fk,mk->fm", power, mel_filterbank(48000, 2048, 64)) + 1e-10)
    delta = np.abs(np.diff(logmel, axis=0)).mean(axis=0) if logmel.shape[0] > 1 else np.zeros(64)
    v = np.concatenate([logmel.mean(0), logmel.std(0), logmel.min(0),
                        *np.percentile(logmel, [10, 50, 90], axis=0), logmel.max(0), delta])
    return l2_normalise(v - v.mean(), "reference")


@pytest.mark.parametrize("nonzero", [0, 1, 455, 47999, 48000, 48001, 240000, 479999, 480000],
                         ids=lambda n: f"{n}-samples")
def test_spectral_of_a_padded_clip_equals_transforming_every_frame(nonzero):
    # an eval output is 1 s padded to 10 s: the frames after its last sample are skipped, the same bits
    x = np.zeros(480000, dtype=np.float32)
    x[:nonzero] = clip48(2)[:nonzero]
    np.testing.assert_array_equal(SpectralConditioner().embed(x), spectral_transforming_every_frame(x))
    lone = np.zeros(48007, dtype=np.float32)  # one sample, not 10 s long
    lone[min(nonzero, lone.size - 1)] = 0.5
    np.testing.assert_array_equal(SpectralConditioner().embed(lone), spectral_transforming_every_frame(lone))


class Counting:
    name = "counting"
    fingerprint = "v1"

    def __init__(self):
        self.calls = 0

    def embed(self, audio):
        self.calls += 1
        v = np.zeros(512, dtype=np.float32)
        v[int(abs(audio).sum()) % 512] = 1.0
        return v


def test_cache_is_keyed_by_content_and_backend(tmp_path):
    inner = Counting()
    cached = CachedConditioner(inner, tmp_path)
    x, y = clip48(0, 1.0), clip48(1, 1.0)
    e1 = cached.embed(x)
    e2 = cached.embed(x.copy())
    cached.embed(y)
    assert inner.calls == 2 and (cached.hits, cached.misses) == (1, 2)
    np.testing.assert_array_equal(e1, e2)
    other = Counting()
    other.fingerprint = "v2"  # other weights: a separate cache entry
    CachedConditioner(other, tmp_path).embed(x)
    assert other.calls == 1
    assert len(list(tmp_path.rglob("*.npy"))) == 3


@pytest.mark.parametrize("spec", ["clap", "hf:", "laion:", "openl3:x"])
def test_unknown_spec_is_a_usage_error(spec):
    with pytest.raises(UsageError, match="accepted"):
        make_conditioner(spec)


def test_laion_missing_checkpoint_is_one_sentence(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        make_conditioner(f"laion:{tmp_path / 'missing.pt'}")


def test_hf_missing_directory_is_a_usage_error(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UsageError, match="no-such-model is neither a folder nor a hub id"):
        make_conditioner(f"hf:{tmp_path / 'no-such-model'}")  # refused before any loading
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="is a folder without a CLAP model"):
        make_conditioner(f"hf:{tmp_path / 'empty'}")
    c = make_conditioner("hf:nobody/no-such-model")  # a hub id: found out when it is loaded
    with pytest.raises(UsageError, match="could not load a CLAP model"):
        c.embed(clip48(0))


def save_tiny_clap(folder):
    """A randomly initialised ClapModel small enough for CPU tests, with its feature extractor, saved the way
    a real checkpoint directory is (save_pretrained)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    audio = dict(window_size=8, num_mel_bins=64, spec_size=256, patch_size=4, patch_stride=(4, 4),
                 hidden_size=32, patch_embeds_hidden_size=16, depths=(1, 1), num_attention_heads=(1, 2),
                 projection_dim=512, num_hidden_layers=2)
    text = dict(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=37, projection_dim=512, max_position_embeddings=64)
    torch.manual_seed(0)
    clap_config = transformers.ClapConfig(text_config=text, audio_config=audio, projection_dim=512)
    model = transformers.ClapModel(clap_config)
    model.save_pretrained(folder)
    transformers.ClapFeatureExtractor(feature_size=64, sampling_rate=48000, hop_length=480, max_length_s=10,
                                      fft_window_size=1024, truncation="rand_trunc").save_pretrained(folder)
    return model


def test_hf_clap_loads_a_saved_tiny_model_and_embeds(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = save_tiny_clap(tmp_path / "tiny-clap")
    cond = make_conditioner(f"hf:{tmp_path / 'tiny-clap'}")
    assert isinstance(cond, HFClapConditioner) and cond.name == f"hf:{tmp_path / 'tiny-clap'}"
    x, y = clip48(0), clip48(1)
    a = cond.embed(x)
    assert a.shape == (512,) and np.linalg.norm(a) == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(cond.embed(x), a, atol=1e-6)
    assert not np.allclose(cond.embed(y), a, atol=1e-4)
    # the same numbers as the in-memory model through transformers' own feature extractor
    from transformers import ClapFeatureExtractor

    fe = ClapFeatureExtractor.from_pretrained(tmp_path / "tiny-clap")
    with torch.inference_mode():
        out = model.eval().get_audio_features(**fe([x], sampling_rate=48000, return_tensors="pt"))
    ref = (out if isinstance(out, torch.Tensor) else out.pooler_output)[0].numpy()
    np.testing.assert_allclose(a, ref / np.linalg.norm(ref), atol=1e-5)
    # cached through CachedConditioner: a second conditioner over the same folder does not load the model
    cached = CachedConditioner(cond, tmp_path / "cache")
    cached.embed(x)
    fresh = make_conditioner(f"hf:{tmp_path / 'tiny-clap'}")
    np.testing.assert_array_equal(CachedConditioner(fresh, tmp_path / "cache").embed(x), cached.embed(x))
    assert fresh._model is None
