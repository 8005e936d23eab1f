"""Clip sources: folders, the shipped clips/, AudioSet through `datasets` on a local hub-layout copy."""

import io
import re
from pathlib import Path

import numpy as np
import pytest

from octopus_audio.errors import UsageError
from octopus_audio.eval.cli import default_clips_dir
from octopus_audio.eval.sources import (
    AUDIOSET_NAME,
    ClipRef,
    DatasetSpec,
    decode,
    fit_length,
    list_clips,
    list_folder,
    prepare,
    resample,
    seeded_choice,
)

sf = pytest.importorskip("soundfile")


def tone(seconds, rate, freq=440.0, channels=1):
    t = np.arange(int(seconds * rate)) / rate
    x = 0.5 * np.sin(2 * np.pi * freq * t)
    return np.stack([x] * channels, axis=1) if channels > 1 else x


def test_folder_listing_is_sorted_recursive_and_skips_other_files(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ["b.wav", "a.flac", "sub/c.ogg"]:
        fmt = {"wav": "WAV", "flac": "FLAC", "ogg": "OGG"}[name.rsplit(".", 1)[1]]
        sf.write(tmp_path / name, tone(0.1, 8000), 8000, format=fmt)
    (tmp_path / "notes.txt").write_text("not audio")
    refs = list_folder(tmp_path, n=10, seed=0)
    assert [r.clip_id for r in refs] == ["a", "b", "sub-c"]
    assert all(Path(r.path).is_file() for r in refs)


def test_seeded_choice_is_reproducible_and_differs_by_seed():
    a, b, c = seeded_choice(100, 10, 42), seeded_choice(100, 10, 42), seeded_choice(100, 10, 43)
    assert a == b and a != c and a == sorted(a) and len(set(a)) == 10
    assert seeded_choice(5, 10, 0) == [0, 1, 2, 3, 4]
    with pytest.raises(UsageError):
        seeded_choice(5, 0, 0)


def test_missing_or_empty_folder_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        list_folder(tmp_path / "nope", 3, 0)
    with pytest.raises(UsageError, match="no audio files"):
        list_folder(tmp_path, 3, 0)


@pytest.mark.parametrize("channels", [1, 2], ids=["mono", "stereo"])
def test_decode_mixes_to_mono_and_prepare_resamples_and_fits_10_s(tmp_path, channels):
    sf.write(tmp_path / "x.wav", tone(1.5, 44100, channels=channels), 44100, subtype="FLOAT")
    clip = decode(ClipRef("x", "here", path=str(tmp_path / "x.wav")))
    assert clip.sample_rate == 44100 and clip.audio_T.ndim == 1 and clip.audio_T.size == 66150
    for rate in (48000, 24000):
        y = prepare(clip, rate)
        assert y.shape == (rate * 10,) and y.dtype == np.float32
        assert np.all(y[int(1.6 * rate):] == 0.0)  # zero padding after the 1.5 s of sound
        spectrum = np.abs(np.fft.rfft(y[:rate]))  # 1 s of signal: 1 Hz bins
        assert abs(int(np.argmax(spectrum)) - 440) <= 1  # the tone survived resampling


def test_fit_length_crops_the_start_and_pads_the_end():
    x = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(fit_length(x, 3), [0, 1, 2])
    np.testing.assert_array_equal(fit_length(x, 7), [0, 1, 2, 3, 4, 0, 0])
    np.testing.assert_array_equal(resample(x, 24000, 24000), x)


def test_unreadable_file_fails_at_decode_not_at_listing(tmp_path):
    (tmp_path / "broken.wav").write_bytes(b"RIFF not really a wav file")
    refs = list_folder(tmp_path, 1, 0)
    with pytest.raises(sf.LibsndfileError):
        decode(refs[0])


def test_shipped_clips_are_small_cc0_and_attributed():
    folder = default_clips_dir()
    files = sorted(p for p in folder.iterdir() if p.suffix in (".flac", ".wav"))
    assert 12 <= len(files) <= 20
    assert sum(p.stat().st_size for p in folder.iterdir()) < 10 * 2**20
    attribution = (folder / "ATTRIBUTION.md").read_text()
    for p in files:
        info = sf.info(p)
        assert (info.samplerate, info.channels) == (24000, 1), p.name
        assert 0 < info.duration <= 10.0
        line = next(line for line in attribution.splitlines() if line.startswith(f"| `{p.name}`"))
        assert re.search(r"\| CC0 \|", line), line


# --- AudioSet: the hub path, on a local folder in the hub layout (parquet shards + README configs) ---

def write_hub_layout(root: Path, n_rows: int, rate: int = 16000) -> dict[str, np.ndarray]:
    """A folder laid out like agkphysics/AudioSet: data/bal_train/*.parquet with an Audio column of
    {bytes, path} (FLAC bytes) and the `huggingface` features metadata, and a README naming config
    `balanced`."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from datasets import Audio, Features, List, Value

    (root / "data" / "bal_train").mkdir(parents=True)
    (root / "data" / "eval").mkdir(parents=True)
    (root / "README.md").write_text(
        "---\nconfigs:\n- config_name: balanced\n  data_files:\n"
        "  - split: train\n    path: data/bal_train/*.parquet\n"
        "  - split: test\n    path: data/eval/*.parquet\n---\n")
    features = Features({"video_id": Value("string"), "audio": Audio(), "labels": List(Value("string"))})
    written = {}
    rows = []
    for i in range(n_rows):
        x = (tone(0.5, rate, freq=200.0 + 50 * i) * 0.8).astype(np.float32)
        buf = io.BytesIO()
        sf.write(buf, x, rate, format="FLAC", subtype="PCM_16")
        vid = f"vid{i:02d}"
        rows.append({"video_id": vid, "audio": {"bytes": buf.getvalue(), "path": f"{vid}.flac"},
                     "labels": ["/m/0"]})
        written[vid] = sf.read(io.BytesIO(buf.getvalue()), dtype="float32")[0]
    half = n_rows // 2
    for k, part in enumerate((rows[:half], rows[half:])):
        pq.write_table(pa.Table.from_pylist(part, schema=features.arrow_schema),
                       root / "data" / "bal_train" / f"part{k}.parquet")
    pq.write_table(pa.Table.from_pylist(rows[:1], schema=features.arrow_schema),
                   root / "data" / "eval" / "e.parquet")
    return written


def test_audioset_path_streams_decodes_and_chooses_by_seed(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # datasets sleeps 5 s when a shuffled stream's worker threads shut down; irrelevant to what is tested here
    monkeypatch.setattr(datasets.config, "SLEEP_TIME_ON_THREADS_SHUTDOWN", 0)
    written = write_hub_layout(tmp_path / "AudioSet", 8)
    spec = DatasetSpec(path=str(tmp_path / "AudioSet"))  # everything else as for the hub: balanced / train
    assert (spec.name, spec.split, spec.audio_column) == ("balanced", "train", "audio")

    refs = list_clips(AUDIOSET_NAME, 3, seed=7, dataset=spec)
    again = list_clips(AUDIOSET_NAME, 3, seed=7, dataset=spec)
    other = list_clips(AUDIOSET_NAME, 3, seed=8, dataset=spec)
    assert [r.clip_id for r in refs] == [r.clip_id for r in again]
    assert len({r.clip_id for r in refs}) == 3 and set(r.clip_id for r in refs) <= set(written)
    assert [r.clip_id for r in refs] != [r.clip_id for r in other]
    for r in refs:
        assert r.data is not None and r.path is None
        clip = decode(r)
        assert clip.sample_rate == 16000
        np.testing.assert_array_equal(clip.audio_T, written[r.clip_id])
        assert prepare(clip, 48000).shape == (480000,)
    everything = list_clips(AUDIOSET_NAME, 100, seed=7, dataset=spec)
    assert sorted(r.clip_id for r in everything) == sorted(written)


def test_audioset_unknown_config_is_one_clear_error(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_hub_layout(tmp_path / "AudioSet", 2)
    with pytest.raises(UsageError, match="could not open dataset"):
        list_clips(AUDIOSET_NAME, 1, 0, DatasetSpec(path=str(tmp_path / "AudioSet"), name="unbalanced"))
