"""What the eval runner generates with: the `Backend` interface (generate, teacher-forced distributions, the
codec and bf16-KV contexts), `AARBackend` over `octopus_audio.aar_patch`, and `LazyBackend`, which loads the
model only when a row needs it. Tests inject fakes through the same interface."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from octopus_audio.eval.records import DEFAULT_WIDE_BITS
from octopus_audio.eval.sources import MODEL_RATE

if TYPE_CHECKING:
    from octopus_audio.eval.records import EvalConfig


class Generated(NamedTuple):
    """One generation: audio (T,) float32, latent fhat float32 (any shape), tokens per scale [(pn,) int64]."""

    audio: np.ndarray
    fhat: np.ndarray
    tokens: list[np.ndarray]


class Backend(Protocol):
    """What the runner needs from a model; `name` identifies it in reports, `identity` by content (for
    example {"aar_sha256": ..., "sat_sha256": ...}, eval.identity.model_identity) in the run's fingerprint."""

    name: str
    sample_rate: int
    identity: dict

    def generate(self, cond_BD: np.ndarray, seeds: Sequence[int]) -> list[Generated]:
        """One generation per (512,) condition row of `cond_BD`, row i sampled from its own random stream
        seeded with `seeds[i]` (so its output does not depend on its batch-mates but through float
        rounding)."""

    def teacher_forced(self, cond_BD: np.ndarray, tokens: list[list[np.ndarray]]) -> list:
        """Per row i, the guided next-token distributions (L, V) of every position of every scale (torch,
        where the model is) with `tokens[i]` (that row's tokens per scale) forced."""

    def compressed(self, codec: str, bits: int | None, v_bits: int | None = None,
                   sink_scales: int | None = None, wide_scales: int | None = None,
                   wide_bits: int | None = None) -> contextlib.AbstractContextManager:
        """A context inside which `generate` runs under the codec (keys at `bits`, values at `v_bits`, None:
        `bits`; the first `sink_scales` scales native, None: 0; the `wide_scales` after them, None: 0, at
        `wide_bits` key and value bits; arguments: a `records.Job`); its value has `stats()`."""

    def bf16_kv(self) -> contextlib.AbstractContextManager:
        """A context inside which `generate` and `teacher_forced` run the uncompressed model with every key
        and value rounded to bfloat16 as it enters the KV cache (the KV_FLOOR row)."""

    def latents(self, audio_BT: np.ndarray) -> list[np.ndarray]:
        """Per row of `audio_BT` (generated outputs, float32 at `sample_rate`), the model's own tokenizer's
        encoder frames (T, C) float32: the `latent` embedding of the distribution metrics."""

    def expect_batches(self, sizes: Sequence[int]) -> None:
        """Called once before the first batch with the batch sizes the run will generate (a backend may
        prepare for them: AARBackend compiles the kernels they launch on CUDA)."""


class LazyBackend:
    """Builds the real backend on first use: a rerun with nothing left to generate never loads the model."""

    def __init__(self, build: Callable[[], Backend], name: str, sample_rate: int = MODEL_RATE,
                 identity: dict | None = None) -> None:
        self._build = build
        self._backend: Backend | None = None
        self._batch_sizes: tuple[int, ...] = ()
        self.name = name
        self.sample_rate = sample_rate
        self.identity = dict(identity or {})

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = self._build()
            if (self._backend.name, self._backend.sample_rate) != (self.name, self.sample_rate):
                raise RuntimeError(f"the model built as {self._backend.name!r} at "
                                   f"{self._backend.sample_rate} Hz was announced as {self.name!r} at "
                                   f"{self.sample_rate} Hz")
            if self._batch_sizes:
                self._backend.expect_batches(self._batch_sizes)
        return self._backend

    def expect_batches(self, sizes: Sequence[int]) -> None:
        """Kept until the model is built (then passed on), or passed on now if it is."""
        self._batch_sizes = tuple(sizes)
        if self._backend is not None:
            self._backend.expect_batches(self._batch_sizes)

    def generate(self, cond_BD: np.ndarray, seeds: Sequence[int]) -> list[Generated]:
        return self.backend.generate(cond_BD, seeds)

    def teacher_forced(self, cond_BD: np.ndarray, tokens: list[list[np.ndarray]]) -> list:
        return self.backend.teacher_forced(cond_BD, tokens)

    def compressed(self, codec: str, bits: int | None, v_bits: int | None = None,
                   sink_scales: int | None = None, wide_scales: int | None = None,
                   wide_bits: int | None = None):
        return self.backend.compressed(codec, bits, v_bits, sink_scales, wide_scales, wide_bits)

    def bf16_kv(self):
        return self.backend.bf16_kv()

    def latents(self, audio_BT: np.ndarray) -> list[np.ndarray]:
        return self.backend.latents(audio_BT)


class AARBackend:
    """`octopus_audio.aar_patch` behind the runner's interface.

    A call generates a batch of conditions, each row from its own seed (`generate(..., seed=[...])`), so a
    row's tokens do not depend on how clips are batched or sharded but through float rounding in the batched
    matmuls. `generate_fn`, `compressed_kv_fn` and `teacher_forced_fn` default to the package's
    `generate`, `patch_aar` (its handle a context: the codec rows, wide scales included, and with `kv_dtype`
    the bf16-KV floor) and
    `eval.fidelity.teacher_forced_probs` (tests inject fakes). Generation runs at `generate`'s default
    precision for the device (fp32 on CPU, bf16-autocast blocks on CUDA); teacher forcing runs in fp32 with
    PyTorch's attention on every device: on a GPU one block-causal pass per batch, whose stored keys and
    values the encode kernels encode as `append` does (fp32 encode variants, compiled ahead with the rest),
    on the CPU the scale loop through the codec library (`teacher_forced_probs`' defaults by device); its
    distributions are left on the model's device for `fidelity_rows`.

    Generation runs eagerly: each (codec, bits) generates once per batch, so a CUDA graph of the scale
    loop would be captured for one replay (measured on the H200, default eval warm: 18.9 s eager against
    22.9 s with a graph per generation, the same rows; benchmarks/results/eval_speed.md).
    """

    def __init__(self, pipe, config: EvalConfig, name: str, device: str = "cpu",
                 generate_fn: Callable | None = None, compressed_kv_fn: Callable | None = None,
                 teacher_forced_fn: Callable | None = None, identity: dict | None = None,
                 compile_progress: Callable | None = None) -> None:
        import octopus_audio.aar_patch as aar_patch

        self.compile_progress = compile_progress
        self.pipe = pipe
        self.config = config
        self.name = name
        self.identity = dict(identity or {})
        self.device = device
        self.sample_rate = MODEL_RATE
        self._generate = generate_fn or aar_patch.generate
        self._compressed_kv = compressed_kv_fn or aar_patch.patch_aar
        if teacher_forced_fn is None:
            from octopus_audio.eval.fidelity import teacher_forced_probs as teacher_forced_fn
        self._teacher_forced = teacher_forced_fn

    def expect_batches(self, sizes: Sequence[int]) -> None:
        """On CUDA, compile ahead (in parallel, into Triton's cache) the kernels that generations of each
        batch size launch under every codec configuration of the run, bf16 as generation runs them, and the
        fp32 encodes of teacher forcing's one pass; nothing elsewhere. `compile_progress` shows it."""
        if not str(self.device).startswith("cuda"):
            return
        import torch

        from octopus_audio.aar_patch.compile_ahead import compile_ahead

        compile_ahead(self.pipe, self.config.patch_configs(), sizes, (torch.bfloat16,),
                      progress=self.compile_progress, teacher_forced=True)

    def _cond(self, cond_BD: np.ndarray):
        import torch

        return torch.from_numpy(np.atleast_2d(np.asarray(cond_BD, dtype=np.float32))).to(self.device)

    def generate(self, cond_BD: np.ndarray, seeds: Sequence[int]) -> list[Generated]:
        import torch

        c = self.config
        cond = self._cond(cond_BD)
        with torch.inference_mode():
            g = self._generate(self.pipe, cond, cfg=c.cfg, top_k=c.top_k, top_p=c.top_p, seed=list(seeds))
        audio = g.audio.reshape(g.audio.shape[0], -1).float().cpu().numpy()
        fhat = g.fhat.float().cpu().numpy()
        tokens = [t.to(torch.int64).cpu().numpy() for t in g.tokens]
        return [Generated(audio[i], fhat[i], [t[i] for t in tokens]) for i in range(cond.shape[0])]

    def teacher_forced(self, cond_BD: np.ndarray, tokens: list[list[np.ndarray]]) -> list:
        import torch

        tokens_Bl = [torch.from_numpy(np.stack([np.asarray(row[si], dtype=np.int64) for row in tokens]))
                     .to(self.device) for si in range(len(tokens[0]))]
        with torch.inference_mode():
            probs = self._teacher_forced(self.pipe, self._cond(cond_BD), tokens_Bl, cfg=self.config.cfg)
        return list(torch.cat([p.float() for p in probs], dim=1).unbind(0))

    def compressed(self, codec: str, bits: int | None, v_bits: int | None = None,
                   sink_scales: int | None = None, wide_scales: int | None = None,
                   wide_bits: int | None = None):
        c = self.config
        return self._compressed_kv(self.pipe, codec=codec, bits=16 if bits is None else bits, window=c.window,
                                   v_group=c.v_group, seed=c.patch_seed, v_bits=v_bits,
                                   sink_scales=sink_scales or 0, wide_scales=wide_scales or 0,
                                   wide_bits=wide_bits or DEFAULT_WIDE_BITS)

    def bf16_kv(self):
        import torch

        from octopus_audio.codecs import UNCOMPRESSED

        return self._compressed_kv(self.pipe, codec=UNCOMPRESSED, bits=16, kv_dtype=torch.bfloat16)

    def latents(self, audio_BT: np.ndarray) -> list[np.ndarray]:
        """`pipe.sat.encode_latent` of the outputs on the model's device, LATENT_CHUNK at a time, in fp32
        (outside any autocast), as (T, C) frames."""
        import torch

        audio_BT = np.asarray(audio_BT, dtype=np.float32)
        out = []
        with torch.inference_mode(), torch.autocast(torch.device(self.device).type, enabled=False):
            for start in range(0, audio_BT.shape[0], LATENT_CHUNK):
                x_B1N = torch.from_numpy(audio_BT[start:start + LATENT_CHUNK]).to(self.device)[:, None, :]
                z_BCT = self.pipe.sat.encode_latent(x_B1N).float()
                out.extend(z_BCT.transpose(1, 2).cpu().numpy())
        return out


LATENT_CHUNK = 128  # outputs encoded at once (the full-size SAT's first layer: about 400 MB of activations)
