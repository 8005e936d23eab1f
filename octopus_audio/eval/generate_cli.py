"""`octopus-audio generate`: one second of audio per condition row, written as 24 kHz 16-bit WAV files."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np

from octopus_audio.errors import UsageError
from octopus_audio.outdir import (
    add_to_manifest,
    check_out_file,
    check_out_path,
    hold_folder,
    path_arg,
    read_manifest,
    refuse_foreign,
)
from octopus_audio.wav import write_wav

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from octopus_audio.codecs import CODECS, UNCOMPRESSED, bits_help

    parser.add_argument("--codec", default=UNCOMPRESSED,
                        help=f"KV-cache codec: {', '.join(CODECS)} (default: {UNCOMPRESSED}, uncompressed)")
    parser.add_argument("--bits", type=int, default=None,
                        help=f"bits per key and value coordinate, for a codec other than {UNCOMPRESSED} "
                             f"({bits_help()}); --codec {UNCOMPRESSED} keeps the cache uncompressed and "
                             f"takes no --bits")
    parser.add_argument("--k-bits", type=int, default=None, help="the keys' bits (default: --bits)")
    parser.add_argument("--v-bits", type=int, default=None,
                        help="the values' bits, 1..8 (default: --bits; b-bit groups of 16 channels)")
    from octopus_audio.aar_patch.config import DEFAULT_SINK_SCALES

    parser.add_argument("--sink-scales", type=int, default=None, metavar="S",
                        help=f"keep the first S scales native in the compressed cache (every later scale "
                             f"attends to them; their bytes count as native), 0 .. the model's scales "
                             f"(default {DEFAULT_SINK_SCALES}); --codec {UNCOMPRESSED} takes none")
    parser.add_argument("--wide-scales", type=int, default=0, metavar="N",
                        help="store the N scales after the sink scales at --wide-bits (more bits for the "
                             "coarse scales later ones attend to; default 0: none)")
    parser.add_argument("--wide-bits", type=int, default=4, metavar="B",
                        help="key and value bits of the --wide-scales scales (default 4)")
    parser.add_argument("--aar", type=path_arg, help="AAR transformer checkpoint (e.g. AAR_d16_bs2048.pth)")
    parser.add_argument("--sat", type=path_arg, help="SAT tokenizer checkpoint (SAT_d128_lat128.pth)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--clip", type=path_arg, default=None,
                        help="audio clip to condition on (through CLAP)")
    source.add_argument("--cond", type=path_arg, default=None,
                        help="condition array FILE.npy of shape (B, 512)")
    parser.epilog = ("With neither --clip nor --cond the default condition is used: the `spectral` embedding "
                     "of a shipped clip (named in the output), the kind of condition the embedded default "
                     "model was trained on.")
    parser.add_argument("--clap", default="auto",
                        help="conditioner for --clip: auto, spectral, hf:ID_OR_DIR or laion:FILE (auto)")
    parser.add_argument("--seed", type=int, default=42, help="sampling seed, 0 .. 2**64 - 1 (default: 42)")
    parser.add_argument("--cfg", type=float, default=4.0, help="classifier-free guidance (default: 4)")
    parser.add_argument("--top-k", type=int, default=200, help="keep the k likeliest ids; 1 is greedy (200)")
    parser.add_argument("--top-p", type=float, default=0.95, help="nucleus mass kept, 0 turns it off (0.95)")
    parser.add_argument("--batch", type=int, default=None, help="repeat a single condition N times")
    parser.add_argument("--compare", action="store_true",
                        help="also generate the uncompressed reference and print one metrics line")
    parser.add_argument("--save-latents", type=path_arg, default=None, metavar="FILE.pt",
                        help='write {"tokens": [16 tensors], "fhat": tensor, "audio": tensor}')
    parser.add_argument("--out", type=path_arg, required=True,
                        help="output folder for the WAV files: new, empty, or one `generate` wrote before")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace existing output files, and write into a folder holding other files")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: cuda when available, else cpu")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                        help="auto: bf16 autocast on cuda, fp32 (the released numerics) on cpu")


def run(args: argparse.Namespace) -> int:
    from octopus_audio.aar_patch.loading import load_aar

    _check_args(args)
    device = _device(args.device)
    cond_BE, stem = _load_condition(args, device)
    from octopus_audio.codecs import UNCOMPRESSED, codec_class

    tag = f"{args.codec}-{_bits_tag(args)}" if codec_class(args.codec).compressed else args.codec
    wavs = [args.out / f"{stem}_{i:03d}_seed{args.seed}_{tag}.wav" for i in range(cond_BE.shape[0])]
    ref_wavs = ([w.with_name(w.name.replace(f"_{tag}.wav", f"_{UNCOMPRESSED}.wav")) for w in wavs]
                if args.compare else [])
    outputs = wavs + ref_wavs + ([args.save_latents] if args.save_latents else [])

    pipe = load_aar(args.aar, args.sat, device=device)
    with hold_folder(args.out):  # no other run writes into --out until this one ends
        _refuse_existing(wavs + ref_wavs, args.save_latents, args.overwrite)
        return _run(args, pipe, cond_BE, wavs, ref_wavs, outputs)


def _run(args: argparse.Namespace, pipe, cond_BE: np.ndarray, wavs: list[Path], ref_wavs: list[Path],
         outputs: list[Path]) -> int:
    """Generate under the codec and write the files (every argument checked, --out held)."""
    import torch

    handle = _apply_codec(pipe, args)
    fast = {"auto": None, "fp32": False, "bf16": True}[args.precision]
    from octopus_audio.aar_patch.compile_ahead import stderr_progress

    dtypes = (torch.float32,) if fast is False else (torch.bfloat16,)
    handle.compile_ahead(cond_BE.shape[0], dtypes, progress=stderr_progress())  # CUDA: kernels compiled first
    result = _generate(pipe, cond_BE, args, fast)
    print(handle.stats().line())
    handle.unpatch()
    # recorded as generate's own before any is written, so a later run into --out knows them
    add_to_manifest(args.out, [p for p in outputs if args.out.resolve() in p.resolve().parents])
    if args.compare:
        _compare(pipe, cond_BE, result, args, fast, ref_wavs, handle.config)

    sample_rate = pipe.sat.config.sample_rate
    audio_BN = result.audio[:, 0].float().cpu().numpy()
    for path, audio_N in zip(wavs, audio_BN, strict=True):
        write_wav(path, audio_N, sample_rate)
    if args.save_latents:
        args.save_latents.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"tokens": [t.cpu() for t in result.tokens], "fhat": result.fhat.cpu(),
                    "audio": result.audio.cpu()}, args.save_latents)
    written = len(wavs) + len(ref_wavs)
    print(f"wrote {written} WAV file{'s' * (written != 1)} to {args.out}"
          + (f" and latents to {args.save_latents}" if args.save_latents else ""))
    return 0


def _generate(pipe, cond_BE, args: argparse.Namespace, fast: bool | None):
    """One generation of the rows of `cond_BE`, eagerly: a CUDA graph of the scale loop (`GraphedGenerator`)
    pays only when replayed, and the command generates once (measured on the H200, warm, process wall:
    5.1 s eager against 6.2 s through a graph; benchmarks/results/eval_speed.md)."""
    from octopus_audio.aar_patch.generation import generate

    return generate(pipe, cond_BE, cfg=args.cfg, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                    fast=fast)


def _check_args(args: argparse.Namespace) -> None:
    """Every argument check that needs no model and no audio decoding, before any work."""
    from octopus_audio.aar_patch.generation import SamplingConfig, cfg_problem, seed_problem
    from octopus_audio.codecs import CODECS, DEFAULT_CODEC, bits_problem, codec_class
    from octopus_audio.values import VALUE_BITS

    for flag, path in (("--clip", args.clip), ("--cond", args.cond)):
        if path is not None and path.is_dir():
            raise UsageError(f"{flag} {path} is a folder; {flag} takes one file"
                             + (" (for a folder of clips: octopus-audio eval --clips DIR)" if flag == "--clip"
                                else " (a .npy array)"))
    if args.clip is not None and not args.clip.is_file():
        raise UsageError(f"the clip {args.clip} does not exist")
    if args.batch is not None and args.batch < 1:
        raise UsageError(f"--batch must be at least 1, got {args.batch}")
    if args.codec not in CODECS:
        raise UsageError(f"unknown --codec {args.codec!r}; allowed: {', '.join(CODECS)}")
    compressed = codec_class(args.codec).compressed
    given = [f"{flag} {value}" for flag, value in (("--bits", args.bits), ("--k-bits", args.k_bits),
                                                     ("--v-bits", args.v_bits)) if value is not None]
    if not compressed and given:
        raise UsageError(f"--codec {args.codec} keeps the KV cache uncompressed and takes no --bits, "
                         f"--k-bits or --v-bits; drop {' '.join(given)}, or pass a codec that uses them (for "
                         f"example --codec {DEFAULT_CODEC})")
    if not compressed and args.sink_scales is not None:
        raise UsageError(f"--codec {args.codec} keeps every scale native and takes no --sink-scales; drop "
                         f"--sink-scales {args.sink_scales}, or pass a codec that compresses (for example "
                         f"--codec {DEFAULT_CODEC} --bits 2)")
    if not compressed and args.wide_scales:
        raise UsageError(f"--codec {args.codec} keeps every scale native and takes no --wide-scales; drop "
                         f"--wide-scales {args.wide_scales}, or pass a codec that compresses")
    if args.wide_scales < 0:
        raise UsageError(f"--wide-scales must be an integer >= 0 (the scales after the sink scales stored at "
                         f"--wide-bits), got {args.wide_scales}")
    if args.wide_scales and bits_problem(args.codec, args.wide_bits):
        raise UsageError(bits_problem(args.codec, args.wide_bits).replace("--bits", "--wide-bits"))
    if args.wide_scales and args.wide_bits not in VALUE_BITS:
        raise UsageError(f"--wide-bits {args.wide_bits}: values take {VALUE_BITS[0]}..{VALUE_BITS[-1]} bits")
    if args.sink_scales is not None and args.sink_scales < 0:
        raise UsageError(f"--sink-scales must be an integer >= 0 (the first scales kept native), got "
                         f"{args.sink_scales}")
    from octopus_audio.aar_patch.config import DEFAULT_SINK_SCALES

    args.sink_scales = DEFAULT_SINK_SCALES if args.sink_scales is None else args.sink_scales
    args.k_bits = args.bits if args.k_bits is None else args.k_bits
    args.v_bits = args.bits if args.v_bits is None else args.v_bits
    if compressed and (args.k_bits is None or args.v_bits is None):
        raise UsageError(f"--codec {args.codec} needs --bits (for example --bits 2), or both --k-bits and "
                         f"--v-bits")
    if compressed and bits_problem(args.codec, args.k_bits):
        flag = "--bits" if args.k_bits == args.bits else "--k-bits"
        raise UsageError(bits_problem(args.codec, args.k_bits).replace("--bits", flag))
    if compressed and args.v_bits not in VALUE_BITS:
        flag = "--bits" if args.v_bits == args.bits else "--v-bits"
        raise UsageError(f"{flag} {args.v_bits}: values take {VALUE_BITS[0]}..{VALUE_BITS[-1]} bits")
    if args.compare and not compressed:
        raise UsageError(f"--compare compares a compressed cache with the uncompressed reference; pass a "
                         f"--codec other than {args.codec} (for example --codec {DEFAULT_CODEC} --bits 2)")
    problem = seed_problem(args.seed, "--seed") or cfg_problem(args.cfg, "--cfg")
    if problem:
        raise UsageError(problem)
    SamplingConfig(cfg=args.cfg, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    check_out_path(args.out)
    refuse_foreign(args.out, read_manifest(args.out), "generate", args.overwrite)
    if args.save_latents is not None:
        check_out_file(args.save_latents, "--save-latents")


def _device(choice: str) -> str:
    import torch

    if choice == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda was asked for but no CUDA device is available; use --device cpu")
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return choice


def _bits_tag(args: argparse.Namespace) -> str:
    """`b2` when keys and values share the width, else `k2v4`; `-s3` after it with sink scales, `-w4x4` with
    wide scales (file names)."""
    bits = f"b{args.k_bits}" if args.k_bits == args.v_bits else f"k{args.k_bits}v{args.v_bits}"
    return bits + (f"-s{args.sink_scales}" if args.sink_scales else "") + (
        f"-w{args.wide_scales}x{args.wide_bits}" if args.wide_scales else "")


def _load_condition(args: argparse.Namespace, device: str) -> tuple[np.ndarray, str]:
    """The (B, 512) condition from --cond, --clip or the default condition, repeated to --batch rows when it
    has one row, and the stem the WAV names start with."""
    if args.clip:
        cond, stem = _condition_from_clip(args.clip, args.clap, device), args.clip.stem
    elif args.cond:
        cond, stem = _read_cond(args.cond), args.cond.stem
    else:
        from octopus_audio.aar_patch.default_model import default_condition

        cond, what, stem = default_condition()
        print(f"no --clip or --cond: conditioning on the default condition, {what}")
    if args.batch is not None:
        if cond.shape[0] == 1:
            cond = np.repeat(cond, args.batch, axis=0)
        elif cond.shape[0] != args.batch:
            raise UsageError(f"--batch {args.batch} repeats a single condition, but {args.cond} has "
                             f"{cond.shape[0]} rows; drop --batch or pass a (1, 512) array")
    return cond.astype(np.float32), stem


def _condition_from_clip(path: Path, spec: str, device: str) -> np.ndarray:
    """(1, 512): the clip's embedding, prepared as `octopus-audio eval` prepares it (10 s at 48 kHz)."""
    try:
        from octopus_audio.eval.conditioning import make_conditioner
        from octopus_audio.eval.sources import CLAP_RATE, ClipRef, decode, prepare
    except ModuleNotFoundError as e:
        raise UsageError(f"--clip needs the package `{e.name}` (pip install 'octopus-audio[eval]'); or pass "
                         f"--cond FILE.npy") from e
    try:
        clip = decode(ClipRef(clip_id=path.stem, origin=str(path), path=str(path)))
    except Exception as e:  # soundfile raises its own error types for unreadable files
        raise UsageError(f"could not read the clip {path} as audio ({type(e).__name__}: {e})") from e
    conditioner = make_conditioner(spec, device)
    print(f"conditioning on {path} with the `{conditioner.name}` conditioner")
    return np.asarray(conditioner.embed(prepare(clip, CLAP_RATE)), dtype=np.float32)[None]


def _read_cond(path: Path) -> np.ndarray:
    """A (B, 512) float array from a .npy file, its values within the accepted range (`condition_problem`).
    The header is read first, so a file of another kind, or of objects, is named as such."""
    from numpy.lib import format as npy

    from octopus_audio.aar_patch.generation import condition_problem

    if not path.is_file():
        raise UsageError(f"the condition file {path} does not exist")
    with open(path, "rb") as f:
        try:
            version = npy.read_magic(f)
            shape, _, dtype = (npy.read_array_header_1_0(f) if version == (1, 0)
                               else npy.read_array_header_2_0(f))
        except ValueError as e:
            kind = "a .npz archive" if _is_zip(path) else "it does not start with the .npy header"
            raise UsageError(f"--cond {path} is not a .npy file ({kind}); pass one (B, 512) float array "
                             f"saved with numpy.save") from e
    if not np.issubdtype(dtype, np.floating):
        raise UsageError(f"the condition in {path} must be a float array of shape (B, 512); "
                         f"got dtype {dtype}")
    if len(shape) != 2 or shape[0] < 1:  # the width is checked against the model by `generate`
        raise UsageError(f"the condition in {path} must have shape (B, 512), one CLAP embedding per row; "
                         f"got shape {shape}")
    try:
        cond = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise UsageError(f"--cond {path} is a damaged .npy file ({e}); save the array again with "
                         f"numpy.save") from e
    problem = condition_problem(cond, f"the condition in {path}")
    if problem:
        raise UsageError(problem)
    return cond


def _is_zip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


def _apply_codec(pipe, args: argparse.Namespace):
    """Put the compressed cache of `--codec` and its key / value bits under the model; returns the patch
    handle.

    `--codec none` goes through the patch too (bit-identical to the model's own cache), so the cache
    accounting line is printed for every codec.
    """
    from octopus_audio.aar_patch.patch import patch_aar
    from octopus_audio.codecs import codec_class

    if not codec_class(args.codec).compressed:
        return patch_aar(pipe, args.codec, 16, sink_scales=0)
    try:
        return patch_aar(pipe, args.codec, args.k_bits, v_bits=args.v_bits, sink_scales=args.sink_scales,
                         wide_scales=args.wide_scales, wide_bits=args.wide_bits)
    except ValueError as e:
        given = (f"--bits {args.bits}" if args.k_bits == args.v_bits == args.bits
                 else f"--k-bits {args.k_bits} --v-bits {args.v_bits}")
        wide = f" --wide-scales {args.wide_scales}" if args.wide_scales else ""
        said = str(e).replace('sink_scales', '--sink-scales').replace('wide_scales', '--wide-scales')
        raise UsageError(f"--codec {args.codec} {given} --sink-scales {args.sink_scales}{wide}: "
                         f"{said}") from e


def _compare(pipe, cond_BE: np.ndarray, result, args: argparse.Namespace, fast: bool | None,
             ref_wavs: list[Path], config) -> None:
    """--compare: the uncompressed reference of the same inputs and seed (written beside the codec's WAVs)
    and one metrics line: LSD, SNR and latent cosine of the codec's output against it, over the rows
    (`config`: the patch's PatchConfig, named as the accounting line names it)."""
    from octopus_audio.audio_metrics.latent import latent_cosine
    from octopus_audio.audio_metrics.lsd import lsd_db
    from octopus_audio.audio_metrics.snr import snr_db

    ref = _generate(pipe, cond_BE, args, fast)
    args.out.mkdir(parents=True, exist_ok=True)
    ref_BN = ref.audio[:, 0].float().cpu().numpy()
    for path, audio_N in zip(ref_wavs, ref_BN, strict=True):
        write_wav(path, audio_N, pipe.sat.config.sample_rate)
    out_BN = result.audio[:, 0].float().cpu().numpy()
    pairs = zip(ref_BN, out_BN, ref.fhat.cpu(), result.fhat.cpu(), strict=True)
    per_row = np.array([(lsd_db(r, o), snr_db(r, o), latent_cosine(fr, fo)) for r, o, fr, fo in pairs])
    parts = []
    names = (("LSD", " dB"), ("SNR", " dB"), ("latent cosine", ""))
    for (name, unit), v in zip(names, per_row.T, strict=True):
        spread = f" [{v.min():.4g}..{v.max():.4g}]" if v.size > 1 else ""
        parts.append(f"{name} {v.mean():.4g}{unit}{spread}")
    rows_note = f"mean [min..max] over {len(out_BN)} rows" if len(out_BN) > 1 else "1 row"
    print(f"compare {config.label} vs uncompressed ({rows_note}): {', '.join(parts)}")


def _refuse_existing(wavs: list[Path], latents: Path | None, overwrite: bool) -> None:
    """UsageError naming the first output file that exists already (unless `overwrite`), and the flags that
    choose other names."""
    existing = [p for p in [*wavs, latents] if p is not None and p.exists()]
    if existing and not overwrite:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        flags = [flag for flag, named in (("--out", any(p in wavs for p in existing)),
                                          ("--save-latents", latents in existing)) if named]
        raise UsageError(f"{existing[0]} already exists{more}; pass --overwrite to replace "
                         f"{'it' if len(existing) == 1 else 'them'} or choose another {' and '.join(flags)}")
