"""Cosine similarity of the model's latents (f_hat) with and without a compressed KV cache."""

from __future__ import annotations

import numpy as np

from octopus_audio.audio_metrics.audio_pair import as_pair


def latent_cosine(fhat, fhat_hat) -> float:
    """Cosine similarity of the flattened latents: `<f, f_hat> / (||f|| ||f_hat||)`, in [-1, 1].

    fhat: the uncompressed run's latent (for AAR (B, 128, 75), any shape works), fhat_hat: the latent of the
    run under a codec, with the same number of elements. Defined edge cases, never NaN: both all zeros gives 1
    (they are identical); exactly one all zeros gives 0 (no direction in common).

    How to read it: 1 means the tokenizer latents point the same way, so the decoder sees the same input up to
    scale; it is the earliest place a codec's effect shows, before the decoder. Values well below 1 mean the
    sampled tokens diverged at some scale. Higher is better.
    """
    a, b = as_pair(fhat, fhat_hat, what="latent")
    # <a,b> / sqrt(<a,a> <b,b>), every sum the same np.dot: identical latents give exactly 1 (the three dots
    # are one number x, and a correctly rounded sqrt(fl(x * x)) is x), whatever the CPU's summation order
    aa, bb = float(np.dot(a, a)), float(np.dot(b, b))
    if aa == 0.0 and bb == 0.0:
        return 1.0
    if aa == 0.0 or bb == 0.0:
        return 0.0
    return float(np.clip(np.dot(a, b) / np.sqrt(aa * bb), -1.0, 1.0))
