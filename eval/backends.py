"""What the eval runner generates with: the `Backend` interface (generate, teacher-forced distributions, the
codec and bf16-KV contexts), `AARBackend` over `octopus_audio.aar_patch`, and `LazyBackend`, which loads the
model only when a row needs it. Tests inject fakes through the same interface."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from octopus_audio.eval.sources import MODEL_RATE

if TYPE_CHECKING:
    from octopus_audio.eval.runner import EvalConfig


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

    def generate(self, cond_D: np.ndarray, seed: int) -> Generated:
        """One generation for a (512,) condition."""

    def teacher_forced(self, cond_D: np.ndarray, tokens: list[np.ndarray]) -> list:
        """Per scale, the guided next-token distribution (1, pn, V) (torch, CPU) with `tokens` forced."""

    def compressed(self, codec: str, bits: int | None,
                   v_bits: int | None = None) -> contextlib.AbstractContextManager:
        """A context inside which `generate` runs under the codec (keys at `bits`, values at `v_bits`, None:
        `bits`); its value has `stats()`."""

    def bf16_kv(self) -> contextlib.AbstractContextManager:
        """A context inside which `generate` and `teacher_forced` run the uncompressed model with every key
        and value rounded to bfloat16 as it enters the KV cache (the KV_FLOOR row)."""


class LazyBackend:
    """Builds the real backend on first use: a rerun with nothing left to generate never loads the model."""

    def __init__(self, build: Callable[[], Backend], name: str, sample_rate: int = MODEL_RATE,
                 identity: dict | None = None) -> None:
        self._build = build
        self._backend: Backend | None = None
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
        return self._backend

    def generate(self, cond_D: np.ndarray, seed: int) -> Generated:
        return self.backend.generate(cond_D, seed)

    def teacher_forced(self, cond_D: np.ndarray, tokens: list[np.ndarray]) -> list:
        return self.backend.teacher_forced(cond_D, tokens)

    def compressed(self, codec: str, bits: int | None, v_bits: int | None = None):
        return self.backend.compressed(codec, bits, v_bits)

    def bf16_kv(self):
        return self.backend.bf16_kv()


class AARBackend:
    """`octopus_audio.aar_patch` behind the runner's interface.

    B = 1 per call, so results never depend on how clips are batched or sharded. `generate_fn`,
    `compressed_kv_fn`, `teacher_forced_fn` and `rounded_kv_fn` default to the package's `generate`,
    `compressed_kv`, `eval.fidelity.teacher_forced_probs` and `compressed_kv` with `kv_dtype` (tests
    inject fakes). Generation runs at `generate`'s default
    precision for the device (fp32 on CPU, bf16-autocast blocks on CUDA); teacher forcing runs in fp32.
    """

    def __init__(self, pipe, config: EvalConfig, name: str, device: str = "cpu",
                 generate_fn: Callable | None = None, compressed_kv_fn: Callable | None = None,
                 teacher_forced_fn: Callable | None = None, rounded_kv_fn: Callable | None = None,
                 identity: dict | None = None) -> None:
        import octopus_audio.aar_patch as aar_patch

        self.pipe = pipe
        self.config = config
        self.name = name
        self.identity = dict(identity or {})
        self.device = device
        self.sample_rate = MODEL_RATE
        self._generate = generate_fn or aar_patch.generate
        self._compressed_kv = compressed_kv_fn or aar_patch.compressed_kv
        if teacher_forced_fn is None:
            from octopus_audio.eval.fidelity import teacher_forced_probs as teacher_forced_fn
        self._teacher_forced = teacher_forced_fn
        self._rounded_kv = rounded_kv_fn or aar_patch.compressed_kv

    def _cond(self, cond_D: np.ndarray):
        import torch

        return torch.from_numpy(np.asarray(cond_D, dtype=np.float32)[None, :]).to(self.device)

    def generate(self, cond_D: np.ndarray, seed: int) -> Generated:
        import torch

        c = self.config
        with torch.inference_mode():
            g = self._generate(self.pipe, self._cond(cond_D), cfg=c.cfg, top_k=c.top_k, top_p=c.top_p,
                               seed=seed)
        return Generated(g.audio[0].reshape(-1).float().cpu().numpy(), g.fhat[0].float().cpu().numpy(),
                         [t[0].to(torch.int64).cpu().numpy() for t in g.tokens])

    def teacher_forced(self, cond_D: np.ndarray, tokens: list[np.ndarray]) -> list:
        import torch

        tokens_1l = [torch.from_numpy(np.asarray(t, dtype=np.int64)[None, :]).to(self.device) for t in tokens]
        with torch.inference_mode():
            probs = self._teacher_forced(self.pipe, self._cond(cond_D), tokens_1l, cfg=self.config.cfg)
        return [p.float().cpu() for p in probs]

    def compressed(self, codec: str, bits: int | None, v_bits: int | None = None):
        c = self.config
        return self._compressed_kv(self.pipe, codec=codec, bits=16 if bits is None else bits, window=c.window,
                                   v_group=c.v_group, seed=c.patch_seed, v_bits=v_bits)

    def bf16_kv(self):
        import torch

        from octopus_audio.codecs import UNCOMPRESSED

        return self._rounded_kv(self.pipe, codec=UNCOMPRESSED, bits=16, kv_dtype=torch.bfloat16)
