"""The eval's shared records: what a run generates for each clip (`EvalConfig`), one row's job (`Job`), a job
at one draw (`Unit`) and the reference's and floor rows' codec names. The runner, the batch, the backends and
the reports read them from here, so none imports another's module for them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar, NamedTuple

from octopus_audio.aar_patch.config import DEFAULT_SINK_SCALES, PatchConfig
from octopus_audio.aar_patch.generation import SamplingConfig
from octopus_audio.errors import UsageError

DEFAULT_WIDE_BITS = PatchConfig.wide_bits  # --wide-bits unset; what a patch without wide scales is given
REFERENCE = "reference"  # the uncompressed draws' rows (codec field): what every row is compared with
FLOOR = "reference (other seed)"  # the sampling-floor row's codec (never a real codec name)
KV_FLOOR = "reference (bf16 KV)"  # the bf16-KV floor row's codec (never a real codec name)


def floor_seed(seed: int, draws: int = 1, draw: int = 0) -> int:
    """The seed of the sampling floor's draw `draw`: the run's seed + draws + draw, apart from the seeds of
    the reference's and the codecs' draws (seed .. seed + draws - 1); seed + 1 with one draw."""
    return seed + draws + draw


def compresses(codec: str) -> bool:
    """Whether a registered codec compresses (the native one gets a single row, without bits)."""
    from octopus_audio.codecs import codec_class

    return codec_class(codec).compressed


@dataclass(frozen=True)
class EvalConfig:
    """What is generated for each clip. `codecs` may include the native codec (one row, no bits: it checks the
    patch);
    `floor` adds the sampling-floor row (FLOOR: the uncompressed model at `floor_seed(seed)`); `bf16_floor`
    the bf16-KV row (KV_FLOOR: the uncompressed model, keys and values rounded to bf16 in the cache). The CLI
    turns both on unless `--no-floor`; `bf16_floor` is off here so a library caller opts in.

    Draws: each row (the reference, the floors and every codec at every width) is sampled `draws` times per
    clip, draw d with seed `seed + d` (`sample_seed`; the FLOOR row with `floor_seed(seed, draws, d)`, apart
    from those). The paired metrics, teacher forcing and the WAVs are draw 0's; every draw gives the
    embeddings and the adherence of the distribution metrics (eval/distribution.py). `draws` changes the
    floor's seeds, so it is part of every row's identity.

    Bit widths: with `k_bits` and `v_bits` None each codec runs at every width of `bits`, keys and values
    alike; when either is given, at every pair of a key width from `k_bits` (None: `bits`) and a value width
    from `v_bits` (None: `bits`). Each compressing codec runs each bit pair at every count of `sink_scales`
    (the first scales kept native, `patch_aar(sink_scales=S)`) and at every count of `wide_scales` (the
    scales after them stored at `wide_bits` key and value bits, `patch_aar(wide_scales=N, wide_bits=B)`; 0:
    none), as it runs every width; `wide_bits` is part of every row's identity (`identity()`)."""

    codecs: tuple[str, ...]
    bits: tuple[int, ...] = (2, 3, 4)
    seed: int = SamplingConfig.seed  # sampling: the released inference defaults, aar_patch's one definition
    cfg: float = SamplingConfig.cfg
    top_k: int = SamplingConfig.top_k
    top_p: float = SamplingConfig.top_p
    window: int = 1
    v_group: int = 16
    patch_seed: int = 0
    floor: bool = True
    bf16_floor: bool = False
    k_bits: tuple[int, ...] | None = None
    v_bits: tuple[int, ...] | None = None
    sink_scales: tuple[int, ...] = (DEFAULT_SINK_SCALES,)
    wide_scales: tuple[int, ...] = (0,)
    wide_bits: int = DEFAULT_WIDE_BITS
    draws: int = 1
    # Fields that choose which rows a run has (each row records its own), not what any row's numbers are: a
    # rerun may change them and keeps the rows it shares. Every other field is part of each row's identity
    # (`identity()`), so a new setting that changes a number is one new field above.
    JOB_FIELDS: ClassVar[tuple[str, ...]] = ("codecs", "bits", "floor", "bf16_floor", "k_bits", "v_bits",
                                             "sink_scales", "wide_scales")

    def __post_init__(self) -> None:
        from octopus_audio.codecs import CODECS

        known = tuple(CODECS)
        if not self.codecs:
            raise UsageError(f"no codecs to evaluate; accepted: all or a comma list of {', '.join(known)}")
        for c in self.codecs:
            if c not in known:
                raise UsageError(f"unknown codec {c!r}; accepted: all or a comma list of {', '.join(known)}")
        if len(set(self.codecs)) != len(self.codecs):
            raise UsageError(f"codec list {','.join(self.codecs)} names a codec twice")
        if any(compresses(c) for c in self.codecs):
            for flag, widths in (("--bits", self.bits), ("--k-bits", self.k_bits), ("--v-bits", self.v_bits)):
                if widths is None and flag != "--bits":
                    continue
                if not widths or any(isinstance(b, bool) or not isinstance(b, int) for b in widths):
                    raise UsageError(f"{flag} must be a comma list of integers such as 2,3,4, got {widths!r}")
                if len(set(widths)) != len(widths):
                    raise UsageError(f"{flag} {widths!r} names a width twice")
            from octopus_audio.codecs import bits_problem
            from octopus_audio.values import VALUE_BITS

            flag = "--bits" if self.k_bits is None else "--k-bits"
            for c in self.codecs:  # each codec's own supported bits, before any clip is generated
                for b in (self.k_bits or self.bits) if compresses(c) else ():
                    if bits_problem(c, b):
                        raise UsageError(bits_problem(c, b).replace("--bits", flag))
            flag = "--bits" if self.v_bits is None else "--v-bits"
            for b in self.v_bits or self.bits:
                if b not in VALUE_BITS:
                    raise UsageError(f"{flag} {b}: values take {VALUE_BITS[0]}..{VALUE_BITS[-1]} bits")
            _check_counts(self.sink_scales, "--sink-scales", "0,3,5", "the first scales kept native")
            _check_counts(self.wide_scales, "--wide-scales", "0,4",
                          "the scales after the sink scales stored at --wide-bits")
            if any(self.wide_scales):
                self._check_wide_bits()
        from octopus_audio.aar_patch.generation import SEED_MAX, seed_problem

        problem = seed_problem(self.seed, "--seed")
        if problem:
            raise UsageError(problem)
        if isinstance(self.draws, bool) or not isinstance(self.draws, int) or self.draws < 1:
            raise UsageError(f"--draws must be an integer >= 1 (samples of every row per clip), got "
                             f"{self.draws!r}")
        last = floor_seed(self.seed, self.draws, self.draws - 1) if self.floor else self.seed + self.draws - 1
        if last > SEED_MAX:
            which = (f"the sampling-floor row, which samples with --seed + {last - self.seed}" if self.floor
                     else f"draw {self.draws - 1}, which samples with --seed + {last - self.seed}")
            raise UsageError(f"--seed {self.seed} leaves no seed for {which} (torch's generator takes 0 to "
                             f"{SEED_MAX}); pass --seed at most {SEED_MAX - (last - self.seed)}"
                             + (", or --no-floor" if self.floor else "") + " or fewer --draws")
        for name in ("floor", "bf16_floor"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"{name} must be True or False, got {getattr(self, name)!r}")
        from octopus_audio.aar_patch.generation import cfg_problem

        problem = cfg_problem(self.cfg, "--cfg")
        if problem:
            raise UsageError(problem)
        for name, low in (("window", 0), ("v_group", 1)):  # v_group must also divide the model's head dim
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise UsageError(f"--{name.replace('_', '-')} must be an integer >= {low}, got {value!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise UsageError(f"--top-k must be an integer >= 0, got {self.top_k!r}")
        if not 0.0 <= self.top_p <= 1.0:
            raise UsageError(f"--top-p must be in [0, 1], got {self.top_p!r}")

    def _check_wide_bits(self) -> None:
        """`wide_bits`: a width every compressing codec of the run takes, and a value width (checked when a
        count of wide scales is not 0, as `generate` checks --wide-bits)."""
        from octopus_audio.codecs import bits_problem
        from octopus_audio.values import VALUE_BITS

        b = self.wide_bits
        for c in self.codecs:
            if compresses(c) and bits_problem(c, b):
                raise UsageError(bits_problem(c, b).replace("--bits", "--wide-bits"))
        if b not in VALUE_BITS:
            raise UsageError(f"--wide-bits {b}: values take {VALUE_BITS[0]}..{VALUE_BITS[-1]} bits")

    def bit_pairs(self) -> list[tuple[int, int]]:
        """(key bits, value bits) of every codec row, in report order (see the class docstring)."""
        if self.k_bits is None and self.v_bits is None:
            return [(b, b) for b in self.bits]
        return [(k, v) for k in (self.k_bits or self.bits) for v in (self.v_bits or self.bits)]

    def sample_seed(self, codec: str, draw: int) -> int:
        """The seed of a row's draw: `floor_seed(seed, draws, draw)` for the FLOOR row, else seed + draw."""
        return floor_seed(self.seed, self.draws, draw) if codec == FLOOR else self.seed + draw

    def units(self) -> list[Unit]:
        """Every row of a clip: each of `row_jobs()` at each draw."""
        return [Unit(job, draw) for job in self.row_jobs() for draw in range(self.draws)]

    def row_jobs(self) -> list[Job]:
        """Every job a clip has rows of, each for every draw: the reference's own (REFERENCE, the uncompressed
        draws the distribution metrics compare with), then `jobs()`."""
        return [Job(REFERENCE), *self.jobs()]

    def jobs(self) -> list[Job]:
        """Jobs in report order: the sampling floor and the bf16-KV floor first when on, then each codec at
        each count of sink scales, each count of wide scales (their bits `wide_bits`, None without any) and
        each bit pair; the floors and a codec that does not compress get bits and scales None."""
        out = [Job(FLOOR)] if self.floor else []
        if self.bf16_floor:
            out.append(Job(KV_FLOOR))
        for c in self.codecs:
            out.extend([Job(c, k, v, s, w, self.wide_bits if w else None) for s in self.sink_scales
                        for w in self.wide_scales for k, v in self.bit_pairs()]
                       if compresses(c) else [Job(c)])
        return out

    def patch_configs(self) -> list:
        """The KV-cache patch of each compressed job (what `AARBackend.compressed` installs), in job order."""
        return [PatchConfig(job.codec, job.bits, self.window, self.v_group, self.patch_seed, job.v_bits,
                            sink_scales=job.sink_scales, wide_scales=job.wide_scales,
                            wide_bits=job.wide_bits or DEFAULT_WIDE_BITS)
                for job in self.jobs() if job.bits is not None]

    def identity(self) -> dict:
        """The settings that must match for a rerun to reuse earlier rows: every field but JOB_FIELDS
        (codecs, bits and the floors may change: a rerun adds the missing rows), and `wide_bits` only when it
        is not its default (so the fingerprint of a run made before --wide-bits existed stays its own)."""
        d = asdict(self)
        for name in self.JOB_FIELDS:
            del d[name]
        if d["wide_bits"] == DEFAULT_WIDE_BITS:
            del d["wide_bits"]
        return d


class Job(NamedTuple):
    """One row per clip: a codec (or a floor row) at key bits `bits` and value bits `v_bits`, the first
    `sink_scales` scales kept native, the `wide_scales` after them stored at `wide_bits` key and value bits
    (0 and None: none; all five None for the floors and `none`)."""

    codec: str
    bits: int | None = None
    v_bits: int | None = None
    sink_scales: int | None = None
    wide_scales: int | None = None
    wide_bits: int | None = None


def _check_counts(counts: tuple[int, ...], flag: str, example: str, what: str) -> None:
    """A comma list of scale counts (`--sink-scales`, `--wide-scales`): distinct integers >= 0."""
    if (not counts or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in counts)
            or len(set(counts)) != len(counts)):
        raise UsageError(f"{flag} must be a comma list of distinct integers >= 0 such as {example} ({what}), "
                         f"got {counts!r}")


class Unit(NamedTuple):
    """One row of a clip: a job (REFERENCE, a floor or a codec at its widths) at one draw."""

    job: Job
    draw: int
