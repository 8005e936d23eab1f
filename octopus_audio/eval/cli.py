"""`octopus-audio eval`: batch-evaluate codecs against the uncompressed output and write the report."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from octopus_audio.errors import UsageError
from octopus_audio.outdir import check_out_path, nonempty

if TYPE_CHECKING:
    from octopus_audio.eval.records import EvalConfig

log = logging.getLogger(__name__)


def default_clips_dir() -> Path:
    """The shipped clips: the data folder `octopus_audio/clips`, beside this layer's folder."""
    return Path(__file__).resolve().parent.parent / "clips"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clips", default=None, type=nonempty,
                   help="a folder of audio files (wav, flac, ogg, mp3 where libsndfile reads it) or "
                        "`audioset-20k` (default: the shipped clips/ folder)")
    p.add_argument("--n", "--n-clips", dest="n", type=int, default=100,
                   help="clips to draw (seeded by --seed; all if fewer; default 100); under torchrun write "
                        "--n-clips: torchrun's own parser refuses --n, which abbreviates its flags")
    from octopus_audio.codecs import CODECS

    p.add_argument("--codecs", default="all",
                   help=f"`all` (every codec but none) or a comma list of {', '.join(CODECS)}; `none` checks "
                        f"the patched model against the reference (default all)")
    from octopus_audio.codecs import bits_help

    p.add_argument("--bits", default=None,
                   help=f"comma list of bit widths for the codecs other than none, keys and values alike "
                        f"(default {DEFAULT_BITS}; {bits_help()}); `--codecs none` alone refuses --bits")
    p.add_argument("--k-bits", default=None,
                   help="comma list of key widths (default: --bits); with --k-bits or --v-bits every pair of "
                        "a key width and a value width is run")
    p.add_argument("--v-bits", default=None, help="comma list of value widths, 1..8 (default: --bits)")
    from octopus_audio.aar_patch.config import DEFAULT_SINK_SCALES

    p.add_argument("--sink-scales", default=None,
                   help=f"comma list of counts of first scales kept native in the compressed cache (each "
                        f"count runs at every width, as --bits; their bytes count as native in the rates), "
                        f"0 .. the model's scales (default {DEFAULT_SINK_SCALES})")
    from octopus_audio.eval.records import DEFAULT_WIDE_BITS

    p.add_argument("--wide-scales", default=None,
                   help="comma list of counts N: the N scales after the sink scales stored at --wide-bits "
                        "(each count runs at every width and count of sink scales, as --sink-scales does; "
                        "default 0: none)")
    p.add_argument("--wide-bits", type=int, default=DEFAULT_WIDE_BITS, metavar="B",
                   help=f"key and value bits of the --wide-scales scales, one width for the run (default "
                        f"{DEFAULT_WIDE_BITS})")
    p.add_argument("--clap", default="auto",
                   help="conditioner: auto, spectral (offline stand-in), hf:HUB_ID_OR_DIR, "
                        "laion:FILE[#AMODEL] (default auto: hf:laion/larger_clap_general if cached locally, "
                        "else spectral)")
    p.add_argument("--aar", default=None, type=nonempty,
                   help="AAR transformer checkpoint, or a model folder (config.json and its weights) alone "
                        "(default: the embedded model)")
    p.add_argument("--sat", default=None, type=nonempty,
                   help="SAT tokenizer checkpoint (with an --aar checkpoint file)")
    p.add_argument("--seed", type=int, default=42,
                   help="sampling seed and clip-choice seed, 0 .. 2**64 - 2 (draw d samples with --seed + d, "
                        "the floor row's with --seed + --draws + d; default 42)")
    p.add_argument("--cfg", type=float, default=4.0, help="classifier-free guidance (default 4)")
    p.add_argument("--top-k", type=int, default=200, help="top-k sampling (default 200)")
    p.add_argument("--top-p", type=float, default=0.95, help="top-p sampling (default 0.95)")
    p.add_argument("--window", type=int, default=1, help="native residual window in scales (default 1)")
    p.add_argument("--v-group", type=int, default=16, help="value quantization group size (default 16)")
    p.add_argument("--device", default="auto",
                   help="auto, cpu, cuda or cuda:N (default auto: a GPU when one is visible); under torchrun "
                        "auto and cuda give each process its local rank's GPU, and cuda:N is refused")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads per process, 1 .. the cores it may run on (default: torch's "
                        "own, from OMP_NUM_THREADS or the core count); 1 can be faster on CPU when other "
                        "processes share the cores")
    p.add_argument("--out", required=True, type=nonempty,
                   help="output folder: new, empty, or an earlier eval's, which a rerun with the same model, "
                        "conditioner and settings resumes")
    p.add_argument("--overwrite", action="store_true",
                   help="start afresh in a folder holding another run (every file that run wrote, its "
                        "embeddings included, is deleted; other files stay) or write into one holding other "
                        "files")
    p.add_argument("--cache-dir", default=None, type=nonempty,
                   help="embedding cache (default: $XDG_CACHE_HOME/octopus-audio/conditioning, "
                        "XDG_CACHE_HOME defaulting to ~/.cache)")
    p.add_argument("--dataset", default="agkphysics/AudioSet",
                   help="hub id or local folder that audioset-20k streams from (default agkphysics/AudioSet)")
    p.add_argument("--dataset-config", default="balanced", help="its config (default balanced; '' for none)")
    p.add_argument("--dataset-split", default="train", help="its split (default train)")
    p.add_argument("--no-floor", action="store_true",
                   help="skip the two floor rows: by default each clip gets one more uncompressed generation "
                        "a draw, draw d with seed --seed + --draws + d, reported as the row `reference "
                        "(other seed)` (how far two samples of the same model lie apart on LSD, log-mel MSE, "
                        "SNR and latent cosine; the set every FAD is measured against), and one a draw at "
                        "the draw's seed with every key and value rounded to bfloat16 as it enters the KV "
                        "cache, the row `reference (bf16 KV)` (how near the smallest 16-bit perturbation of "
                        "the cache keeps the outputs, teacher-forced metrics included)")
    p.add_argument("--batch-size", default=None,
                   help="generations run together in one batch, a clip's draws counting one each (a batch "
                        "takes N // --draws clips, at least one, with all their draws): each (codec, bits),"
                        " the reference, the floor rows and the teacher-forced passes run once per batch, "
                        "every output from its own random stream with the seed it has alone, so rows equal "
                        "batch size 1's up to float rounding and a run resumes under any batch size "
                        f"(default: {CPU_BATCH} on CPU; on CUDA {CUDA_BATCH}, or fewer as the GPU's memory "
                        f"allows: one per {CUDA_GIB_PER_CLIP} GiB of total memory)")
    p.add_argument("--draws", type=int, default=None,
                   help="samples of every row per clip (the reference, the floors, each codec and width), "
                        "draw d with seed --seed + d (the other-seed floor's draws with the seeds after "
                        "those): draw 0 gives the paired and teacher-forced metrics and the WAVs, every "
                        "draw the distribution metrics (FAD, adherence, their intervals, the verdict) "
                        f"(default {CPU_DRAWS} on CPU, {CUDA_DRAWS} on CUDA)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


CPU_BATCH = 16  # measured on 2 cores with the embedded model (benchmarks/results/eval_speed.md, CPU)
# draws a clip: on the CPU what keeps the README's first command under 10 minutes on 2 cores, on CUDA enough
# outputs for the distribution metrics (16 clips x 8 = 128 a row) within the GPU eval's time target
# (benchmarks/results/verdict.md)
CPU_DRAWS = 2
CUDA_DRAWS = 8
# CUDA: a batch's generations and teacher-forced passes cost about the same launches whatever its size, so
# the default takes as many clips as memory allows, up to CUDA_BATCH (benchmarks/results/eval_speed.md has
# the measured peak memory per clip of the full-size model)
CUDA_BATCH = 128
CUDA_GIB_PER_CLIP = 1


def parse_batch_size(text: str | None, device: str) -> int:
    """--batch-size as an int >= 1 (exit 2 otherwise); unset: CPU_BATCH on CPU, on CUDA CUDA_BATCH or one
    clip per CUDA_GIB_PER_CLIP GiB of the device's total memory, whichever is fewer."""
    from octopus_audio.eval.runner import batch_size_problem

    if text is None:
        if not str(device).startswith("cuda"):
            return CPU_BATCH
        import torch

        total_gib = torch.cuda.get_device_properties(torch.device(device)).total_memory / 2**30
        return max(1, min(CUDA_BATCH, int(total_gib // CUDA_GIB_PER_CLIP)))
    try:
        value = int(text)
    except ValueError:
        value = text
    problem = batch_size_problem(value)
    if problem:
        raise UsageError(problem)
    return value


def comma_list(text: str, flag: str, example: str) -> list[str]:
    """The items of a comma list flag, stripped; an empty list or an empty item is a UsageError."""
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise UsageError(f"{flag} is empty; pass a comma list such as {example}")
    if not all(items):
        raise UsageError(f"{flag} {text!r} has an empty item; pass a comma list such as {example}, each "
                         f"item once")
    return items


def default_draws(device_spec: str) -> int:
    """--draws unset: CUDA_DRAWS where the run's device (`--device`, as `resolve_device` reads it) is a GPU,
    else CPU_DRAWS."""
    from octopus_audio.eval.distributed import DistInfo, resolve_device

    return CUDA_DRAWS if resolve_device(device_spec, DistInfo.from_env()).startswith("cuda") else CPU_DRAWS


def parse_codecs(text: str) -> tuple[str, ...]:
    from octopus_audio.codecs import compressed_codecs

    if text.strip() == "all":
        return compressed_codecs()
    return tuple(comma_list(text, "--codecs", "octopus,polarquant"))


DEFAULT_BITS = "2,3,4"


def parse_bits(text: str | None, flag: str = "--bits") -> tuple[int, ...] | None:
    if text is None:
        return None
    items = comma_list(text, flag, DEFAULT_BITS)
    try:
        return tuple(int(b) for b in items)
    except ValueError as e:
        raise UsageError(f"{flag} must be a comma list of integers such as 2,3,4, got {text!r}") from e


def parse_counts(text: str | None, flag: str, default: int, example: str) -> tuple[int, ...]:
    """A comma list of scale counts (--sink-scales, --wide-scales) as a tuple of ints (unset: `default`
    alone); EvalConfig checks the values."""
    if text is None:
        return (default,)
    items = comma_list(text, flag, example)
    try:
        return tuple(int(s) for s in items)
    except ValueError as e:
        raise UsageError(f"{flag} must be a comma list of integers >= 0 such as {example}, got "
                         f"{text!r}") from e


def check_scale_counts(config: EvalConfig, aar: str | None, sat: str | None) -> None:
    """Every count of --sink-scales, and every sum of one with a count of --wide-scales, within the model's
    scales (read before the run: the default model's and a model folder's from config.json, a checkpoint's
    from its state dict)."""
    sinks, wide = max(config.sink_scales), max(config.wide_scales)
    if sinks + wide == 0:
        return
    from octopus_audio.aar_patch.loading import model_patch_nums

    scales = len(model_patch_nums(aar, sat))
    if sinks > scales:
        raise UsageError(f"--sink-scales {sinks} is more than the model's {scales} scales; pass counts from "
                         f"0 to {scales}")
    if sinks + wide > scales:
        raise UsageError(f"--sink-scales {sinks} + --wide-scales {wide} is more than the model's {scales} "
                         f"scales; pass counts whose sum is at most {scales}")


def model_name(aar: str | None, sat: str | None) -> str:
    if aar is None:
        return "default"
    return Path(aar).name if sat is None else f"{Path(aar).name}+{Path(sat).name}"


def check_model_paths(aar: str | None, sat: str | None) -> None:
    if aar is not None and sat is None and Path(aar).is_dir():
        return  # a model folder: load_aar checks its config.json
    if (aar is None) != (sat is None):
        raise UsageError("pass --aar and --sat together (a transformer and its tokenizer), --aar alone "
                         "naming a model folder, or neither for the embedded default model")
    for flag, path in (("--aar", aar), ("--sat", sat)):
        if path is not None and not Path(path).is_file():
            raise UsageError(f"{flag} {path!r} does not exist")


def load_model(aar: str | None, sat: str | None, device: str):
    """`octopus_audio.aar_patch.load_aar` on the device, in eval mode."""
    check_model_paths(aar, sat)
    try:
        from octopus_audio.aar_patch import load_aar
    except ImportError as e:
        raise RuntimeError("the AAR model (octopus_audio.aar_patch.load_aar) is not in this build") from e
    return load_aar(aar, sat).to(device).eval()


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_threads(threads: int | None) -> None:
    """--threads: None or 1 .. `usable_cores()`. More intra-op threads than cores only contend for them, and
    a count past about 32,000 crashes the process: at torch's first parallel region (at the latest when it
    exits) the OpenMP runtime starts one thread per count, each stack takes two of the 65,530 memory mappings
    Linux allows a process (vm.max_map_count), and the runtime segfaults when thread creation fails."""
    if threads is None:
        return
    cores = usable_cores()
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= cores:
        raise UsageError(f"--threads must be an integer >= 1 and at most the {cores} CPU cores this process "
                         f"may run on, got {threads!r}")


def check_v_group(v_group: int, head_dim: int) -> None:
    """--v-group must divide the model's head dim (the value quantizer's groups tile each head)."""
    from octopus_audio.values import ValueQuantizer

    try:
        ValueQuantizer(2, head_dim, v_group)
    except ValueError as e:
        raise UsageError(f"--v-group {v_group}: {e}") from e


def set_threads(threads: int | None) -> None:
    """`torch.set_num_threads(threads)` when given (`check_threads` first); either way, log the count this
    process will use."""
    import torch

    check_threads(threads)
    if threads is not None:
        torch.set_num_threads(threads)
    log.info("torch intra-op threads: %d (%s)", torch.get_num_threads(),
             "--threads" if threads is not None else "torch's default; pass --threads N to choose")


def eval_config(args: argparse.Namespace) -> EvalConfig:
    """The run's EvalConfig from the flags (the widths and scale counts refused, one sentence each, with
    codecs that keep the cache uncompressed alone)."""
    from octopus_audio.aar_patch.config import DEFAULT_SINK_SCALES
    from octopus_audio.codecs import CODECS, DEFAULT_CODEC, compressed_codecs
    from octopus_audio.eval.records import EvalConfig

    codecs = parse_codecs(args.codecs)
    listed = ",".join(codecs)
    given = [f"{flag} {value}" for flag, value in (("--bits", args.bits), ("--k-bits", args.k_bits),
                                                     ("--v-bits", args.v_bits)) if value is not None]
    if given and set(codecs) <= set(CODECS) and not set(codecs) & set(compressed_codecs()):
        raise UsageError(f"--codecs {listed} keeps the KV cache uncompressed and takes no --bits, --k-bits "
                         f"or --v-bits; drop {' '.join(given)}, or add a codec that uses them (for example "
                         f"--codecs {listed},{DEFAULT_CODEC})")
    for flag, value in (("--sink-scales", args.sink_scales), ("--wide-scales", args.wide_scales)):
        if value is not None and codecs and not set(codecs) & set(compressed_codecs()):
            raise UsageError(f"--codecs {listed} keeps every scale native and takes no {flag}; drop {flag} "
                             f"{value}, or add a codec that compresses (for example --codecs "
                             f"{listed},{DEFAULT_CODEC})")
    sink_scales = parse_counts(args.sink_scales, "--sink-scales", DEFAULT_SINK_SCALES, "0,3,5")
    wide_scales = parse_counts(args.wide_scales, "--wide-scales", 0, "0,4")
    return EvalConfig(codecs=codecs, bits=parse_bits(DEFAULT_BITS if args.bits is None else args.bits),
                      seed=args.seed, cfg=args.cfg, top_k=args.top_k, top_p=args.top_p, window=args.window,
                      v_group=args.v_group, floor=not args.no_floor, bf16_floor=not args.no_floor,
                      k_bits=parse_bits(args.k_bits, "--k-bits"), v_bits=parse_bits(args.v_bits, "--v-bits"),
                      sink_scales=sink_scales, wide_scales=wide_scales, wide_bits=args.wide_bits,
                      draws=args.draws if args.draws is not None else default_draws(args.device))


def run(args: argparse.Namespace) -> int:
    from octopus_audio.eval.backends import AARBackend, LazyBackend
    from octopus_audio.eval.conditioning import CachedConditioner, default_cache_dir, make_conditioner
    from octopus_audio.eval.distributed import DistInfo, resolve_device, use_device
    from octopus_audio.eval.identity import model_identity
    from octopus_audio.eval.runner import evaluate
    from octopus_audio.eval.sources import DatasetSpec, list_clips

    check_threads(args.threads)  # first: torch takes the count only once every other check has passed
    check_out_path(args.out)
    cache_dir = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    check_out_path(cache_dir, "--cache-dir")
    config = eval_config(args)
    check_model_paths(args.aar, args.sat)
    check_scale_counts(config, args.aar, args.sat)
    if args.batch_size is not None:
        parse_batch_size(args.batch_size, "cpu")  # refused before anything loads
    set_threads(args.threads)
    device = resolve_device(args.device, DistInfo.from_env())
    use_device(device)  # before any CUDA work: the conditioner below may load onto the GPU
    clips = args.clips or str(default_clips_dir())
    if args.clips is None and not default_clips_dir().is_dir():
        raise UsageError("this installation has no clips/ folder; pass --clips DIR or --clips audioset-20k")
    dataset = DatasetSpec(path=args.dataset, name=args.dataset_config or None, split=args.dataset_split)
    refs = list_clips(clips, args.n, args.seed, dataset, out=Path(args.out))
    conditioner = CachedConditioner(make_conditioner(args.clap, device), cache_dir)
    name = model_name(args.aar, args.sat)
    # the model loads here, so a checkpoint `generate` would refuse is refused before any file is written
    pipe = load_model(args.aar, args.sat, device)
    check_v_group(args.v_group, pipe.aar.config.head_dim)
    identity = model_identity(args.aar, args.sat)
    batch_size = parse_batch_size(args.batch_size, device)
    log.info("eval batch size %d", batch_size)

    def make_backend(dev: str) -> LazyBackend:
        def build() -> AARBackend:
            from octopus_audio.aar_patch.compile_ahead import stderr_progress

            # the runner's batch sizes compile ahead on CUDA
            return AARBackend(pipe.to(dev), config, name, dev, identity=identity,
                              compile_progress=stderr_progress())

        return LazyBackend(build, name, identity=identity)

    meta = {"clips": args.clips or "clips/ (shipped)", "n_requested": args.n}
    results = evaluate(refs, args.out, config, make_backend, conditioner, meta=meta, device=device,
                       progress=not args.no_progress, overwrite=args.overwrite, batch_size=batch_size)
    if results is None:
        return 0
    out = Path(args.out)
    print((out / "table.md").read_text(), end="")
    ok, failed = results["rows"]["ok"], results["rows"]["failed"]
    import torch

    print(f"report: {out / 'index.html'} ({ok} rows ok, {failed} failed; see results.json; "
          f"{torch.get_num_threads()} torch intra-op threads)")
    return 1 if failed and not ok else 0
