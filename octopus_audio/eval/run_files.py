"""What an eval run writes per clip besides its rows: WAV names (`wav_name`, sorting a clip's files together),
each WAV's spectrogram (`spectrogram_name`), and the saved reference (`refs/<clip>.npz` with the reference
WAV), read back only for the same audio, run and condition. Each is listed in the run's manifest
(outdir.Manifest) before it is written (`wav_files`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from octopus_audio.eval.backends import Generated
from octopus_audio.eval.records import FLOOR, KV_FLOOR, REFERENCE
from octopus_audio.outdir import Manifest
from octopus_audio.wav import write_wav

log = logging.getLogger(__name__)


def wav_name(clip_id: str, codec: str, bits: int | None, v_bits: int | None = None,
             sink_scales: int | None = None, wide_scales: int | None = None,
             wide_bits: int | None = None) -> str:
    """`<clip>__00_input.wav`, `<clip>__00_reference.wav`, `<clip>__00_reference_other_seed.wav` (FLOOR),
    `<clip>__00_reference_bf16_kv.wav` (KV_FLOOR), `<clip>__<codec>_b<bits>.wav` (keys and values at one
    width) or `<clip>__<codec>_k<bits>v<v_bits>.wav`, `_s<S>` after it with S sink scales and `_w<N>x<B>`
    after that with N wide scales at B bits (`scales_tag`): sorting together (arguments: clip, *job)."""
    if codec in ("input", REFERENCE):
        return f"{clip_id}__00_{codec}.wav"
    if codec == FLOOR:
        return f"{clip_id}__00_reference_other_seed.wav"
    if codec == KV_FLOOR:
        return f"{clip_id}__00_reference_bf16_kv.wav"
    if bits is None:
        return f"{clip_id}__{codec}.wav"
    return f"{clip_id}__{codec}_{bits_tag(bits, v_bits)}{scales_tag(sink_scales, wide_scales, wide_bits)}.wav"


def spectrogram_name(wav: str) -> str:
    """The report's spectrogram of WAV `wav` (a name under wav/): the same name as a PNG, under spec/."""
    return wav[:-4] + ".png"


def wav_files(wav: str) -> list[str]:
    """What writing WAV `wav` puts in the run folder, for its manifest: the WAV and its spectrogram (the
    report draws one for every WAV of the run)."""
    return [f"wav/{wav}", f"spec/{spectrogram_name(wav)}"]


def bits_tag(bits: int, v_bits: int | None) -> str:
    """`b2` when keys and values share the width (v_bits None or equal), else `k2v4`."""
    return f"b{bits}" if v_bits in (None, bits) else f"k{bits}v{v_bits}"


def scales_tag(sink_scales: int | None, wide_scales: int | None = None, wide_bits: int | None = None,
               sep: str = "_") -> str:
    """`_s3` with 3 sink scales, then `_w4x4` with 4 wide scales at 4 bits, each left out at 0 (file names;
    `sep` "-" for the listening page's ids)."""
    return (f"{sep}s{sink_scales}" if sink_scales else "") + (
        f"{sep}w{wide_scales}x{wide_bits}" if wide_scales else "")


def as_generated(g: Generated) -> Generated:
    return Generated(np.asarray(g.audio, dtype=np.float32), np.asarray(g.fhat, dtype=np.float32),
                     [np.asarray(t, dtype=np.int64).reshape(-1) for t in g.tokens])


def load_reference(path: Path, cond_D: np.ndarray, identity: str) -> Generated | None:
    """The saved reference if it was made for this clip's audio by this run's fingerprint (`identity`, the
    JSON of the row identity), with this condition, and holds its tokens; None (logged) if not."""
    with np.load(path) as saved:
        if "identity" not in saved or str(saved["identity"]) != identity:
            log.warning("%s was made for other audio or by another run; generating the reference again", path)
            return None
        if saved["cond"].shape != cond_D.shape or not np.array_equal(saved["cond"], cond_D):
            log.warning("%s was made with another condition; generating the reference again", path)
            return None
        if "tokens" not in saved:
            log.warning("%s has no tokens (an older run); generating the reference again", path)
            return None
        tokens = np.split(saved["tokens"], np.cumsum(saved["token_sizes"])[:-1])
        return Generated(saved["audio"], saved["fhat"], tokens)


def save_reference(out_dir: Path, clip_id: str, cond_D: np.ndarray, out: Generated, identity: str,
                   sample_rate: int, files: Manifest) -> None:
    """`refs/<clip>.npz` (audio, fhat, the condition, the tokens of all scales concatenated with
    `token_sizes`, the row identity as JSON) and the reference WAV, both listed in `files` first."""
    path = out_dir / "refs" / f"{clip_id}.npz"
    files.add([f"refs/{clip_id}.npz", *wav_files(wav_name(clip_id, REFERENCE, None))])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
    np.savez(tmp, audio=out.audio, fhat=out.fhat, cond=cond_D, tokens=np.concatenate(out.tokens),
             token_sizes=np.array([t.size for t in out.tokens], dtype=np.int64), identity=np.array(identity))
    os.replace(tmp, path)
    write_wav(out_dir / "wav" / wav_name(clip_id, REFERENCE, None), out.audio, sample_rate)
