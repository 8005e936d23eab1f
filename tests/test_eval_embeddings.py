"""The distribution metrics' embeddings with the embedded default model: the tokenizer's encoder frames as
the backend computes them (batched, on the model's device) against the tokenizer called on each output alone,
deterministic; the log-mel frames; a transformer checkpoint of ours with the shipped tokenizer's safetensors
(the second-checkpoint run's `--aar aar.pth --sat octopus_audio/default_model/sat.safetensors`)."""

import numpy as np
import pytest

from octopus_audio.eval.cli import default_clips_dir

torch = pytest.importorskip("torch")
pytest.importorskip("soundfile")

CLIPS = ("misc_crow.flac", "loop_amen.flac", "perc_bell.flac")


@pytest.fixture(scope="module")
def pipe():
    from octopus_audio.aar_patch import load_aar

    return load_aar()


def outputs_1s() -> np.ndarray:
    """Three 1 s signals at 24 kHz (the shipped clips' first second), as eval outputs are."""
    from octopus_audio.eval.sources import MODEL_RATE, ClipRef, decode, prepare

    rows = []
    for name in CLIPS:
        clip = decode(ClipRef(clip_id=name, origin=name, path=str(default_clips_dir() / name)))
        rows.append(prepare(clip, MODEL_RATE, seconds=1.0))
    return np.stack(rows).astype(np.float32)


def test_latents_are_the_tokenizers_encoder_frames_of_each_output(pipe):
    from octopus_audio.eval.backends import AARBackend
    from octopus_audio.eval.records import EvalConfig

    backend = AARBackend(pipe, EvalConfig(codecs=("octopus",)), "default", "cpu")
    audio_BT = outputs_1s()
    batched = backend.latents(audio_BT)
    again = backend.latents(audio_BT)
    latent_dim, frames = pipe.sat.latent_dim, pipe.sat.config.num_frames
    for i, latent in enumerate(batched):
        assert latent.shape == (frames, latent_dim) and latent.dtype == np.float32
        np.testing.assert_array_equal(latent, again[i])  # deterministic
        with torch.inference_mode():  # the plain reference: the tokenizer on this output alone
            alone = pipe.sat.encode_latent(torch.from_numpy(audio_BT[i])[None, None])[0].T.numpy()
        np.testing.assert_allclose(latent, alone, rtol=1e-4, atol=1e-5 * np.abs(alone).max())
    assert np.abs(batched[0] - batched[1]).mean() > 0.1 * np.abs(batched[0]).mean()  # clips told apart


def test_spectral_frames_are_the_log_mel_metrics(pipe):
    from octopus_audio.audio_metrics.logmel import log_mel
    from octopus_audio.eval.embeddings import spectral_frames

    audio = outputs_1s()[0]
    frames = spectral_frames(audio, 24000)
    assert frames.shape == (94, 80) and frames.dtype == np.float32
    np.testing.assert_array_equal(frames, log_mel(audio.astype(np.float64), 24000).astype(np.float32))


def test_a_transformer_checkpoint_loads_with_the_shipped_tokenizer(pipe, tmp_path):
    """What the lead's second-checkpoint run passes: `train`'s exported aar.pth (fp16, release format) with
    `--sat octopus_audio/default_model/sat.safetensors`."""
    from octopus_audio.aar_patch import load_aar
    from octopus_audio.aar_patch.default_model import default_model_dir
    from octopus_audio.aar_patch.train import export_release
    from octopus_audio.eval.cli import check_model_paths, model_name
    from octopus_audio.eval.identity import model_identity

    aar = tmp_path / "run" / "aar.pth"
    aar.parent.mkdir()
    export_release(pipe.aar, aar, "model_state_dict")
    sat = default_model_dir() / "sat.safetensors"
    check_model_paths(str(aar), str(sat))
    loaded = load_aar(str(aar), str(sat))
    assert loaded.aar.config == pipe.aar.config and loaded.sat.config == pipe.sat.config
    for name, tensor in pipe.sat.state_dict().items():
        torch.testing.assert_close(loaded.sat.state_dict()[name], tensor, rtol=0, atol=0)
    assert model_name(str(aar), str(sat)) == "aar.pth+sat.safetensors"
    assert set(model_identity(str(aar), str(sat))) == {"aar_sha256", "sat_sha256"}
