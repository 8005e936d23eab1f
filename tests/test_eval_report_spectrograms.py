"""The report's spectrograms (eval/spectrograms.py) drawn on a thread pool: byte for byte the PNGs of one
`spectrogram_png` call per WAV in turn, whatever the thread count; write_report's plots and page equal to a
serial build; a failure raised, not hung on."""

import threading
from pathlib import Path

import numpy as np
import pytest

from octopus_audio.eval import report, spectrograms
from octopus_audio.eval.records import FLOOR, KV_FLOOR, Job
from octopus_audio.eval.run_files import wav_name
from octopus_audio.wav import write_wav

pytest.importorskip("soundfile")
pytest.importorskip("matplotlib")
pytest.importorskip("PIL")

RATE = 24000
JOBS = [Job(FLOOR), Job(KV_FLOOR), Job("none"), Job("octopus", 2, 2), Job("octopus", 3, 3),
        Job("turboquant-mse", 2, 4)]
# clip -> its audio length in samples; `noref` has no reference WAV (its reference failed), so only its input
# gets an image; `short` has a failed octopus b3 row (no WAV)
CLIPS = {"alpha": RATE, "noref": 3001, "short": 100}


def make_run(out: Path) -> tuple[list[dict], list[dict]]:
    """WAVs under out/wav and the rows and clips write_report takes (rows as the runner writes them)."""
    rng = np.random.default_rng(7)
    (out / "wav").mkdir(parents=True)
    rows, clips = [], []
    for cid, n in CLIPS.items():
        clips.append({"clip": cid, "origin": f"/data/{cid}.flac"})
        t = np.arange(n) / RATE
        ref = 0.4 * np.sin(2 * np.pi * rng.uniform(100, 900) * t * (1 + t)) + 0.05 * rng.standard_normal(n)
        write_wav(out / "wav" / wav_name(cid, "input", None), 0.5 * rng.standard_normal(n + 17), RATE)
        if cid != "noref":
            write_wav(out / "wav" / wav_name(cid, "reference", None), ref, RATE)
        for k, job in enumerate(JOBS):
            failed = cid == "noref" or (cid == "short" and job == Job("octopus", 3, 3))
            row = {"clip": cid, "origin": clips[-1]["origin"], "run": "t", "clip_sha256": None,
                   **job._asdict(), "seed": 3, "status": "error" if failed else "ok",
                   "stage": "reference" if failed else None, "error": "RuntimeError: no" if failed else None,
                   "metrics": None, "kv": None, "seconds": None, "threads": None}
            if not failed:
                noisy = ref + 0.02 * (k + 1) * rng.standard_normal(n)
                write_wav(out / "wav" / wav_name(cid, *job), noisy, RATE)
                row["metrics"] = {"lsd_db": 1.0 + k, "logmel_mse": 0.1 * k, "snr_db": 20.0 - k,
                                  "latent_cos": 1.0 - 0.01 * k}
                if job.codec != FLOOR:
                    row["metrics"] |= {"tf_top1": 1.0 - 0.02 * k, "tf_kl_nats": 0.001 * k}
                if job.bits is not None:
                    row["kv"] = {"ratio": 16.0 / job.bits, "k_bits": job.bits + 0.25,
                                 "v_bits": job.v_bits + 0.5}
            rows.append(row)
    return rows, clips


def serial_spectrograms(wav_dir: Path, spec_dir: Path) -> dict[str, bytes]:
    """The reference: every WAV of the folder drawn in turn, each clip's input and reference on its own
    scale and its other WAVs on the reference's; a clip without a reference gets its input's image only."""
    spec_dir.mkdir(parents=True)
    names = sorted(p.name for p in wav_dir.iterdir())
    for cid in sorted({n.split("__")[0] for n in names}):
        mine = [n for n in names if n.startswith(f"{cid}__")]
        spectrograms.spectrogram_png(wav_dir / f"{cid}__00_input.wav", spec_dir / f"{cid}__00_input.png")
        if f"{cid}__00_reference.wav" not in mine:
            continue
        ref = f"{cid}__00_reference"
        top = spectrograms.spectrogram_png(wav_dir / f"{ref}.wav", spec_dir / f"{ref}.png")
        for n in mine:
            if n not in (f"{cid}__00_input.wav", f"{cid}__00_reference.wav"):
                spectrograms.spectrogram_png(wav_dir / n, spec_dir / (n[:-4] + ".png"), ref_db=top)
    return {p.name: p.read_bytes() for p in spec_dir.iterdir()}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("report-spec") / "run"
    rows, clips = make_run(out)
    expected = serial_spectrograms(out / "wav", out.parent / "serial-spec")
    return out, rows, clips, expected


def test_the_run_holds_what_the_cases_need(run):
    out, _, _, expected = run
    assert [n for n in expected if n.startswith("noref__")] == ["noref__00_input.png"]
    assert "short__octopus_b3.png" not in expected and "short__turboquant-mse_k2v4.png" in expected
    assert len(expected) == 1 + (2 + 6) + (2 + 5)  # noref's input; alpha's 8; short's 7
    assert len(set(expected.values())) == len(expected)  # every image differs: a swapped file would show


@pytest.mark.parametrize("threads", [1, 2, 5], ids=lambda n: f"{n}-threads")
def test_spectrograms_are_the_serial_bytes(run, tmp_path, threads):
    out, _, clips, expected = run
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "wav").symlink_to(out / "wav")
    with spectrograms.spectrograms_drawn(folder, clips, JOBS, threads=threads):
        pass
    got = {p.name: p.read_bytes() for p in (folder / "spec").iterdir()}
    assert sorted(got) == sorted(expected)
    assert [n for n in got if got[n] != expected[n]] == []


def test_write_report_equals_a_serial_build(run, tmp_path, monkeypatch):
    """Spectrograms on 4 threads while the plots are drawn: every PNG is the serial one, the plots are those
    of plot_metrics alone, and the page is the one index_html writes once every image exists (each image is
    held back here until the plots are done, so a page written before the pool finished would miss some)."""
    out, rows, clips, expected = run
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "wav").symlink_to(out / "wav")
    plotted = threading.Event()
    plot_metrics, spectrogram_png = report.plot_metrics, spectrograms.spectrogram_png

    def plots_then_mark(*args):
        names = plot_metrics(*args)
        plotted.set()
        return names

    def after_the_plots(*args, **kwargs):
        assert plotted.wait(timeout=120), "the spectrograms were not drawn while the plots were"
        return spectrogram_png(*args, **kwargs)

    monkeypatch.setattr(report, "plot_metrics", plots_then_mark)
    monkeypatch.setattr(spectrograms, "spectrogram_png", after_the_plots)
    monkeypatch.setattr(spectrograms, "spectrogram_threads", lambda: 4)
    meta = {"model": "m", "conditioner": "c", "seed": 3, "floor_seed": 4}
    results = report.write_report(folder, rows, clips, JOBS, meta)
    assert {p.name: p.read_bytes() for p in (folder / "spec").iterdir()} == expected
    from octopus_audio.eval import dist_report

    plots = report.plot_metrics(results["groups"], rows, tmp_path / "plots")
    plots += dist_report.plot(results["distribution"], tmp_path / "plots")
    assert {n: (tmp_path / "plots" / n).read_bytes() for n in plots} == {
        n: (folder / "plots" / n).read_bytes() for n in plots}
    page = report.index_html(folder, rows, clips, JOBS, results["groups"], {**meta, "clip_count": 3}, plots,
                             results["distribution"])
    assert (folder / "index.html").read_text() == page
    assert page.count("<img src='spec/") == len(expected)


def test_a_failed_spectrogram_is_raised(run, tmp_path):
    """A reference that cannot be read: its error comes out of the block (its codec images wait on it and fail
    with it), the other clips' images are still written or cancelled, nothing hangs."""
    out, _, clips, _ = run
    (tmp_path / "wav").mkdir()
    for p in (out / "wav").iterdir():
        (tmp_path / "wav" / p.name).write_bytes(p.read_bytes())
    (tmp_path / "wav" / "alpha__00_reference.wav").write_bytes(b"RIFF but not audio")
    with pytest.raises(RuntimeError, match="alpha__00_reference.wav"):
        with spectrograms.spectrograms_drawn(tmp_path, clips, JOBS, threads=3):
            pass
    assert not (tmp_path / "spec" / "alpha__octopus_b2.png").exists()


def test_an_error_in_the_block_is_raised(run, tmp_path):
    out, _, clips, _ = run
    (tmp_path / "wav").symlink_to(out / "wav")
    with pytest.raises(ValueError, match="plots failed"):
        with spectrograms.spectrograms_drawn(tmp_path, clips, JOBS, threads=2):
            raise ValueError("plots failed")
