"""Helpers shared by the tests: the comparison that fails (never warns), and interpreted Triton kernels."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import torch

# the shared reference folder (golden AAR tensors) beside the checkout, or where OCTOPUS_AUDIO_SHARED points
SHARED = Path(os.environ.get("OCTOPUS_AUDIO_SHARED", Path(__file__).resolve().parents[2] / "shared"))


def assert_rel_close(actual: torch.Tensor, expected: torch.Tensor, rel_tol: float, what: str) -> None:
    """Fail unless ||actual - expected|| / ||expected|| <= rel_tol; reports relative RMS and max abs error."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    diff = actual.double() - expected.double()
    rel = (diff.norm() / expected.double().norm().clamp_min(1e-30)).item()
    assert rel <= rel_tol, (f"{what}: relative RMS error {rel:.3e} > {rel_tol:.0e} "
                            f"(max abs {diff.abs().max():.3e})")


def decoded_attention(codec, q, keys, values, length: int, k_win, v_win, scale: float,
                      wide=None) -> torch.Tensor:
    """The kernels' reference, in float64: the codec library decodes tokens [0, length) of a packed store
    (the kernels' PackedKeys and PackedValues), then one softmax over [store; window]
    (octopus_audio.reference.attend). `codec` is the library codec (get_codec). `wide`: (codec, keys, values,
    length) of a second store (a wide prefix at its own widths) in the same softmax."""
    from octopus_audio.reference import attend

    parts = [(codec, keys, values, length)] + ([] if wide is None else [wide])
    k_all, v_all = zip(*(_decoded(*part) for part in parts), strict=True)
    k_all, v_all = list(k_all), list(v_all)
    if k_win is not None and k_win.shape[2]:
        k_all.append(k_win.detach().cpu().double())
        v_all.append(v_win.detach().cpu().double())
    return attend(q.detach().cpu().double(), torch.cat(k_all, 2), torch.cat(v_all, 2), scale)


def _decoded(codec, keys, values, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens [0, length) of a packed store decoded by the library codec and value quantizer, float64."""
    from octopus_audio.codecs.base import KeyState
    from octopus_audio.values import ValueQuantizer, ValueState

    cut = slice(0, length)

    def part(t):
        return None if t is None else t[:, :, cut].cpu()

    ks = KeyState(dtype=torch.float32, codes=part(keys.codes), gamma=part(keys.gamma),
                  signs=part(keys.signs), gamma_r=part(keys.gamma_r))
    vs = ValueState(dtype=torch.float32, codes=part(values.codes), scale=part(values.scale),
                    minimum=part(values.minimum))
    return (codec.decode(ks).double(),
            ValueQuantizer(values.bits, codec.head_dim, values.group).decode(vs).double())


def attend_unit_by_unit(cache, units, queries, scale: float) -> torch.Tensor:
    """Each unit (k, v) appended to `cache`, then its queries attended: the outputs [B, Hq, T, d] along T,
    what a patched layer computes scale by scale (teacher forcing's one pass is compared with it)."""
    out = []
    for (k, v), q in zip(units, queries, strict=True):
        cache.append(k, v)
        out.append(cache.attend(q, scale))
    return torch.cat(out, 2)


def attend_sequence_of(cache, q, k, v, units, scale: float) -> torch.Tensor:
    """Teacher forcing's one pass (`octopus_audio.cache.attend_sequence`) with `cache`'s settings (codec,
    value quantizer, window, native prefix, wide prefix), as the AAR patch calls it; the cache itself is not
    touched."""
    from octopus_audio.cache import attend_sequence

    return attend_sequence(q, k, v, units, scale, codec=cache.codec, value_quantizer=cache.value_quantizer,
                           window=cache.window, native_prefix=cache.native_prefix, wide=cache.wide)


def _blas_interpreter_dot() -> None:
    """Test speed only: the interpreter's tl.dot hands np.matmul the transposed view of tl.trans, for which
    numpy skips BLAS (about 40 ms for one 128x32x128 tile instead of 0.1 ms); contiguous fp32 copies give the
    same fp32 dot through BLAS."""
    import numpy as np
    from triton.runtime import interpreter

    builder = getattr(interpreter, "InterpreterBuilder", None)
    slow = getattr(builder, "create_dot", None)
    if slow is None or getattr(slow, "blas", False):
        return

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.data.dtype == b.data.dtype == d.data.dtype == np.float32:
            prod = np.matmul(np.ascontiguousarray(a.data), np.ascontiguousarray(b.data))
            return interpreter.TensorHandle(prod + d.data, d.dtype.scalar)
        return slow(self, a, b, d, input_precision, max_num_imprecise_acc)

    create_dot.blas = True
    builder.create_dot = create_dot


def kernel_ops(device: str):
    """octopus_audio.kernels (the public entry points); on the CPU with interpreted kernels (re-decorated if
    they were imported before TRITON_INTERPRET=1 was set, which the kernel test modules set at import)."""
    import octopus_audio.kernels as pkg
    from octopus_audio.kernels.impls import flash

    if device == "cpu":
        _blas_interpreter_dot()
        if type(flash._attn_fwd_kernel).__name__ != "InterpretedFunction":
            for name in KERNEL_MODULES:  # in dependency order; the kinds re-register (kinds/kind.py)
                importlib.reload(importlib.import_module(name))
            importlib.reload(pkg)
    return pkg


# the modules of octopus_audio.kernels with @triton.jit code or what holds it, lowest first (not the kinds
# registry, octopus_audio.kernels.kinds.kind, which keeps the kinds registered across the reload)
KERNEL_MODULES = tuple(f"octopus_audio.kernels.{m}" for m in (
    "bits", "launch", "operands", "encode_math", "qjl", "tables", "kinds.scalar", "kinds.polar",
    "kinds.triplet_rounding", "kinds.triplet", "kinds", "spec", "value_decode", "value_encode", "impls.flash",
    "impls.score_tables", "impls.encode", "impls.gluon.scope", "select"))
