"""The eval report: tables that agree with the rows, WAV names that sort together, and the listening page
opened in headless Chromium (every image renders, every audio source loads, no page errors)."""

import base64
import contextlib
import csv
import io
import json
import os
import re
import select
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from test_eval_runner import FAKE_PATCH_NUMS, FakePipe, make_clips, run_fake

from octopus_audio.aar_patch.patch import DEFAULT_SINK_SCALES

METRIC_KEYS = ("lsd_db", "logmel_mse", "snr_db", "latent_cos", "first_parting_scale", "tf_top1", "tf_kl_nats")
S = DEFAULT_SINK_SCALES  # the sink scales of the codec rows


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval-report")
    clips = make_clips(root / "clips", n=2, broken=True)
    run_fake(clips, root / "out", pipe=FakePipe(fail_codec=("octopus", 4)))
    return root / "out"


def test_tables_agree_with_the_rows(report_dir):
    rows = [json.loads(line) for line in (report_dir / "rows.jsonl").read_text().splitlines()]
    results = json.loads((report_dir / "results.json").read_text())
    meta = results["meta"]
    assert (meta["model"], meta["conditioner"], meta["seed"]) == ("fake-aar", "fake-cond", 3)
    assert meta["clip_count"] == 3
    table = list(csv.DictReader(io.StringIO((report_dir / "table.csv").read_text())))
    assert [(r["codec"], r["bits"], r["v_bits"]) for r in table] == [
        ("reference (other seed)", "", ""), ("none", "", ""), ("octopus", "2", "2"), ("octopus", "4", "4"),
        ("turboquant-mse", "2", "2"), ("turboquant-mse", "4", "4")]
    for line in table:
        bits = int(line["bits"]) if line["bits"] else None
        ok = [r for r in rows if r["codec"] == line["codec"] and r["bits"] == bits and r["status"] == "ok"]
        assert int(line["clips_ok"]) == len(ok)
        assert int(line["clips_failed"]) == 3 - len(ok)
        for key in METRIC_KEYS:
            values = np.array([r["metrics"][key] for r in ok if key in r["metrics"]])
            if len(values) == 0:
                assert line[f"{key}_mean"] == ""
                continue
            assert float(line[f"{key}_min"]) == values.min() and float(line[f"{key}_max"]) == values.max()
            assert float(line[f"{key}_mean"]) == pytest.approx(values.mean(), rel=1e-12)
    md = (report_dir / "table.md").read_text()
    assert md.count(f"\n| octopus | 2 | 2 | {S} | 2 (1 failed) |") == 1
    assert f"| octopus | 4 | 4 | {S} | 0 (3 failed) | - |" in md
    assert "| TF top-1 agreement mean [min, max] | TF KL (nats/token) mean [min, max] |" in md
    assert "teacher-forced" in md and "isolates the codec's error from the divergence of sampling" in md
    # codec none through the patch: seven exact metrics (LSD, MSE, SNR, cosine, the tokens never part from
    # the reference's: the number of scales + 1, TF top-1, TF KL)
    n = len(FAKE_PATCH_NUMS) + 1
    assert ("| none | native | native | - | 2 (1 failed) | 0.000 [0.000, 0.000] | 0.0000 [0.0000, 0.0000] | "
            f"120.00 [120.00, 120.00] | 1.0000 [1.0000, 1.0000] | {n:.2f} [{n:.2f}, {n:.2f}] | "
            "1.0000 [1.0000, 1.0000] | 0.00000 [0.00000, 0.00000] |") in md
    tf = {(g["codec"], g["bits"]): g["metrics"]["tf_top1"] for g in results["groups"]}
    assert tf[("none", None)] == {"min": 1.0, "mean": 1.0, "max": 1.0} and tf[("octopus", 4)] is None
    assert len(results["failures"]) == 7 + 2  # the broken clip's 7 rows, octopus b4 on 2 clips
    for name in METRIC_KEYS:
        assert (report_dir / "plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_wav_names_sort_together_per_clip(report_dir):
    names = sorted(p.name for p in (report_dir / "wav").iterdir())
    clips = [n.split("__")[0] for n in names]
    assert clips == sorted(clips) and set(clips) == {"clip0", "clip1"}
    assert names[:3] == ["clip0__00_input.wav", "clip0__00_reference.wav",
                         "clip0__00_reference_other_seed.wav"]
    sinks = f"_s{S}" if S else ""  # the default sink scales name the codec rows' WAVs
    assert f"clip0__octopus_b2{sinks}.wav" in names and f"clip0__octopus_b4{sinks}.wav" not in names  # failed


class PipeCDP:
    """A minimal Chrome DevTools Protocol client over `--remote-debugging-pipe` (the browser reads commands on
    fd 3 and writes answers and events on fd 4, each message NUL-terminated JSON)."""

    def __init__(self, binary: str, flags: list[str], timeout: float = 30.0):
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()

        def child_fds():  # runs in the child before exec: our pipe ends become its fds 3 and 4
            a, b = os.dup(to_r), os.dup(from_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen([binary, *flags, "--remote-debugging-pipe", "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=child_fds, close_fds=False)
        os.close(to_r)
        os.close(from_w)
        self.w, self.r, self.buf, self.next_id, self.events, self.timeout = to_w, from_r, b"", 0, [], timeout

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            if select.select([self.r], [], [], left)[0]:
                chunk = os.read(self.r, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed the debugging pipe")
                self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            m = self._read(deadline)
            if m.get("id") == self.next_id:
                assert "error" not in m, f"{method}: {m['error']}"
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method: str) -> dict:
        for i, m in enumerate(self.events):
            if m.get("method") == method:
                return self.events.pop(i)
        deadline = time.monotonic() + self.timeout
        while True:
            m = self._read(deadline)
            if m.get("method") == method:
                return m
            self.events.append(m)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.send("Browser.close")
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.w)
        os.close(self.r)


CHECK = """(async () => {
  const images = [...document.images].map(i => ({src: i.getAttribute('src'), width: i.naturalWidth,
                                                  ok: i.complete && i.naturalWidth > 0}));
  const audio = await Promise.all([...document.querySelectorAll('audio')].map(a => new Promise(done => {
    const probe = new Audio();
    probe.preload = 'metadata';
    probe.onloadedmetadata = () => done({src: a.getAttribute('src'), ok: true, duration: probe.duration});
    probe.onerror = () => done({src: a.getAttribute('src'), ok: false});
    probe.src = a.src;
  })));
  const root = document.documentElement;
  return {images, audio, scroll_width: root.scrollWidth, client_width: root.clientWidth};
})()"""

# The A/B switch on the first codec cell: paused (the position moves across), playing (the other side plays on
# from where this one was), and from the keyboard (x repeats the last switch).
AB = """(async () => {
  const sleep = ms => new Promise(r => setTimeout(r, ms));
  const ready = m => m.readyState >= 1 ? Promise.resolve() : new Promise(r => {
    m.addEventListener('loadedmetadata', r, {once: true}); m.load(); });
  const btn = document.querySelector('button.ab');
  const a = document.getElementById(btn.dataset.a), b = document.getElementById(btn.dataset.b);
  await ready(a); await ready(b);
  const out = {a: a.getAttribute('src'), b: b.getAttribute('src')};
  a.currentTime = 0.1; await sleep(50);
  btn.click(); await sleep(50);
  out.paused = {b_time: b.currentTime, pressed: btn.getAttribute('aria-pressed'), b_paused: b.paused};
  b.currentTime = 0.2; await sleep(50);
  document.dispatchEvent(new KeyboardEvent('keydown', {key: 'x'})); await sleep(50);
  out.key = {a_time: a.currentTime, pressed: btn.getAttribute('aria-pressed')};
  a.currentTime = 0.02;
  await a.play(); await sleep(60);
  const before = a.currentTime;
  btn.click();
  const after = b.currentTime;
  await sleep(60);
  out.playing = {a_before: before, b_start: after, a_paused: a.paused, b_time: b.currentTime,
                 b_playing: !b.paused || b.ended};
  btn.focus();
  out.focus = document.activeElement === btn;
  return out;
})()"""


def chromium_binary():
    return next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)


def check_page(page: Path, profile: Path, screenshot: Path | None = None, extra: str | None = None) -> dict:
    """Load the page in headless Chromium at 1400 x 1000, wait for its load event, then check every image
    and (by loading its metadata) every audio source, and the page's width; page errors are the console's
    error entries and uncaught exceptions. `extra`: one more script whose value comes back as `extra`."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--autoplay-policy=no-user-gesture-required", f"--user-data-dir={profile}"]
    cdp = PipeCDP(chromium_binary(), flags)
    try:
        target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            cdp.send(f"{domain}.enable", session=sid)
        cdp.send("Emulation.setDeviceMetricsOverride",
                 {"width": 1400, "height": 1000, "deviceScaleFactor": 1, "mobile": False}, session=sid)
        cdp.send("Page.navigate", {"url": page.as_uri()}, session=sid)
        cdp.wait_event("Page.loadEventFired")

        def run(expression: str) -> dict:
            answer = cdp.send("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                                   "returnByValue": True}, session=sid)
            assert "exceptionDetails" not in answer, answer["exceptionDetails"]
            return answer["result"]["value"]

        found = run(CHECK)
        if extra is not None:
            found["extra"] = run(extra)
        if screenshot is not None:
            shot = cdp.send("Page.captureScreenshot", {"format": "png"}, session=sid)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
        found["errors"] = [e["params"] for e in cdp.events
                           if e.get("method") == "Runtime.exceptionThrown"
                           or (e.get("method") == "Log.entryAdded"
                               and e["params"]["entry"]["level"] == "error")]
        return found
    finally:
        cdp.close()


def test_listening_page_in_headless_chromium(report_dir, tmp_path):
    if chromium_binary() is None:
        pytest.skip("chromium is not installed (Debian package `chromium`); .ci/run installs it")
    page = report_dir / "index.html"
    text = page.read_text()
    srcs = re.findall(r"<(?:audio|img)[^>]* src='([^']+)'", text)
    assert srcs and all((report_dir / s).is_file() for s in srcs)
    assert str(report_dir.parent) not in text  # every path relative to the report (clip origins too)
    assert "../clips/clip0.wav" in text

    shot = tmp_path / "index.png"
    found = check_page(page, tmp_path / "profile", screenshot=shot, extra=AB)
    print(f"\nlistening-page screenshot: {shot}")
    assert found["errors"] == []
    assert found["scroll_width"] <= found["client_width"] <= 1400  # no sideways scrolling at 1400 px
    images = found["images"]
    # the plots (each metric's, then the distribution's: latent FAD, spectral FAD, adherence), then per clip
    # 13 spectrograms: input, reference, floor, none, 2 codecs x 2 widths ... and the failed rows' cells,
    # which have none (clip0 and clip1 lack octopus b4)
    players = 2 * (3 + 1 + 4 - 1)
    assert len(images) == len(METRIC_KEYS) + 3 + players and all(i["ok"] for i in images), images
    assert len(found["audio"]) == players and all(a["ok"] for a in found["audio"]), found["audio"]
    durations = {a["src"]: a["duration"] for a in found["audio"]}
    assert durations["wav/clip0__00_input.wav"] == pytest.approx(0.5)  # the clip's own length, not 10 s
    sinks = f"_s{S}" if S else ""
    assert durations[f"wav/clip1__turboquant-mse_b4{sinks}.wav"] == pytest.approx(0.25)
    assert durations["wav/clip1__00_reference_other_seed.wav"] == pytest.approx(0.25)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "injected generation failure" in text
    assert "cos 1.0000; TF top-1 1.0000, KL 0.00000" in text  # a codec-none cell

    ab = found["extra"]
    assert (ab["a"], ab["b"]) == ("wav/clip0__00_reference.wav", "wav/clip0__00_reference_other_seed.wav")
    assert ab["paused"] == {"b_time": pytest.approx(0.1, abs=1e-3), "pressed": "true", "b_paused": True}
    assert ab["key"] == {"a_time": pytest.approx(0.2, abs=1e-3), "pressed": "false"}
    playing = ab["playing"]
    assert playing["a_before"] > 0.02 and playing["a_paused"]  # A played, then stopped at the switch
    assert playing["b_start"] == pytest.approx(playing["a_before"], abs=0.02)  # B took A's position
    assert playing["b_playing"] and playing["b_time"] >= playing["b_start"]
    assert ab["focus"]

    # the check notices missing files: a copy of the report with one image and one WAV gone
    broken = tmp_path / "broken"
    shutil.copytree(report_dir, broken, ignore=shutil.ignore_patterns("refs", "rows*"))
    (broken / "wav" / "clip1__none.wav").unlink()
    (broken / "spec" / f"clip0__octopus_b2{sinks}.png").unlink()
    found = check_page(broken / "index.html", tmp_path / "profile-broken")
    assert [i["src"] for i in found["images"] if not i["ok"]] == [f"spec/clip0__octopus_b2{sinks}.png"]
    assert [a["src"] for a in found["audio"] if not a["ok"]] == ["wav/clip1__none.wav"]
    assert found["errors"]


def _group(codec, bits, sinks, rate, kl):
    """A made-up aggregate row (report.aggregate's shape) with only what the equal-rate tables read."""
    none = {m: None for m in METRIC_KEYS}
    return {"codec": codec, "bits": bits, "v_bits": bits, "sink_scales": sinks, "wide_scales": 0,
            "wide_bits": None, "clips_ok": 1,
            "clips_failed": 0, "metrics": {**none, "tf_kl_nats": {"mean": kl, "min": kl, "max": kl}},
            "kv_bits_per_coord": {"mean": rate, "min": rate, "max": rate}}


def test_equal_rate_tables_compare_codecs_at_the_same_sink_scales():
    """A run with several counts of sink scales gets one equal-rate table per count, each comparing codecs at
    that count only (a column per codec, not per codec and count); with one count, one table as before."""
    from octopus_audio.eval.report import _equal_rate_lines, equal_rate_entries

    groups = [_group(codec, b, s, b + 1 + 0.1 * s + (0.5 if codec == "octopus" else 0), kl / b)
              for codec, kl in (("octopus", 0.1), ("turboquant-mse", 0.12))
              for s in (0, 3) for b in (2, 3, 4)]
    text = "\n".join(_equal_rate_lines(groups))
    assert "at equal rate, 0 sink scales" in text and "at equal rate, 3 sink scales" in text
    heads = [line for line in text.splitlines() if line.startswith("| codec |")]
    assert len(heads) == 2
    assert "turboquant-mse S=0 at this rate" in heads[0] and "S=3" not in heads[0]
    assert "turboquant-mse S=3 at this rate" in heads[1] and "S=0" not in heads[1]
    entries = equal_rate_entries(groups)
    assert entries and all(e["peer"].endswith(f"S={e['sink_scales']}") for e in entries)
    # octopus b2 at S=0 (rate 3.5, KL 0.05) read on turboquant-mse S=0 (3 -> 0.06, 4 -> 0.04) at 3.5
    e = next(e for e in entries if e["label"] == "octopus b2" and e["peer"] == "turboquant-mse S=0")
    assert e["peer_value"] == pytest.approx((0.06 * 0.04) ** 0.5)
    one = "\n".join(_equal_rate_lines([g for g in groups if g["sink_scales"] == 3]))
    assert one.count("| codec |") == 1 and "sink scales" not in one.split("\n")[1]
