"""Distribution metrics over an eval's draws: the Frechet distance between Gaussian fits of two sets of
embeddings (FAD), the mean condition adherence, seeded bootstrap intervals over clips, and the verdict.

How to read the numbers:
- `frechet_distance(mu1, cov1, mu2, cov2) = |mu1 - mu2|^2 + tr(cov1) + tr(cov2) - 2 tr sqrt(cov1^1/2 cov2
  cov1^1/2)`, the squared 2-Wasserstein distance between the two Gaussians (FAD, as fadtk and
  frechet-audio-distance compute it from the embeddings' means and covariances, the covariances normalised by
  n - 1). 0 for identical fits; in squared embedding units, so only rows of one embedding compare.
- Bias: from n vectors a Gaussian fit is noisy, and the noise raises the distance (two sets of the same
  distribution lie apart by about tr-terms / n). Every distance here compares sets of equal size (a row's
  outputs against as many outputs of the uncompressed model: the same clips and draws), and each row is read
  against the floor measured on the same clips, so rows with the same number of outputs compare fairly.
- Intervals: a bootstrap over clips (`bootstrap_weights`: each resample draws the clips with replacement, a
  clip's draws and frames going with it), seeded, so a report is a function of its rows; the 95% interval is
  the 2.5th and 97.5th percentile of RESAMPLES resamples, the point estimate the statistic of the whole set.
  All sets of one comparison are resampled with the same clip weights (paired). A resample repeats clips,
  which makes its fits noisier, so a FAD interval may sit above its point estimate; a difference between two
  rows, taken on the same resamples, carries that shift on both sides.
- Verdict (`verdict`): a row is "not distinguishable from uncompressed at this sample size" when, for every
  measure (each FAD embedding and the adherence), the bootstrap interval of its difference from the
  uncompressed model's value (on the same resamples) contains 0; otherwise it names each measure whose
  interval lies entirely above or below 0. With m measures each interval is at 1 - 5%/m (Bonferroni: 98.3%
  for three), so the row's verdict as a whole holds at 95%, not each measure alone. A verdict needs
  MIN_VERDICT_CLIPS clips: a percentile bootstrap over few clips is narrower than its level (over n clips
  about as a normal interval with sqrt((n - 1) / n) of the spread and no t correction; three clips all of
  one sign exclude 0).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

CONFIDENCE = 0.95
RESAMPLES = 1000
BOOTSTRAP_SEED = 0  # the resamples are a function of the number of clips alone: reports are reproducible
MIN_CLIPS = 2  # a bootstrap over fewer clips has no spread: no interval
MIN_VERDICT_CLIPS = 10  # fewer clips: intervals shown, no verdict (module docstring)
CHUNK = 250  # resamples fitted at once (covariance stacks of CHUNK x C x C float64)
THREADS = 16  # (chunk, set) pieces at once, at most one a core
# the Cholesky factor of the covariance compared with: JITTER times its mean variance on its diagonal, so a
# singular covariance factors too. It moves a distance by about JITTER of its size where the covariance is
# regular, by about sqrt(JITTER) (1e-5) of its size along directions where it is exactly singular but the
# other is not (tests/test_eval_distribution.py). (An eigen-decomposition with vectors instead of the factor
# took 5-18 s for 1000 covariances of 80 x 80 with torch's MKL and 1-4.5 s with numpy's OpenBLAS on the
# shared 2-core development machine, the factor 0.17 s and the eigenvalues alone 0.4 s.)
JITTER = 1e-10


def frechet_distance(mu1: np.ndarray, cov1: np.ndarray, mu2: np.ndarray, cov2: np.ndarray) -> float:
    """The Frechet distance between N(mu1, cov1) and N(mu2, cov2) (module docstring); covariances symmetric
    positive semi-definite (C, C); float64."""
    d = frechet_distances(*(np.asarray(a, dtype=np.float64)[None] for a in (mu1, cov1, mu2, cov2)))
    return float(d[0])


def frechet_distances(mu1_BC: np.ndarray, cov1_BCC: np.ndarray, mu2_BC: np.ndarray,
                      cov2_BCC: np.ndarray) -> np.ndarray:
    """`frechet_distance` of each of B pairs."""
    mu1, cov1, mu2, cov2 = (torch.as_tensor(np.asarray(a, dtype=np.float64))
                            for a in (mu1_BC, cov1_BCC, mu2_BC, cov2_BCC))
    return _frechet(mu1, cov1, mu2, cov2, _factor(cov2)).cpu().numpy()


def _factor(cov_BCC: torch.Tensor) -> torch.Tensor:
    """The lower Cholesky factor L of each covariance with JITTER times its mean variance added to its
    diagonal (so a singular covariance factors too)."""
    scale = torch.diagonal(cov_BCC, dim1=1, dim2=2).mean(-1)
    eye = torch.eye(cov_BCC.shape[-1], dtype=cov_BCC.dtype, device=cov_BCC.device)
    factor, info = torch.linalg.cholesky_ex(cov_BCC + (JITTER * scale)[:, None, None] * eye)
    if bool((info != 0).any()) or bool((scale <= 0).any()):
        raise ValueError("a Gaussian fit has a covariance that is zero or not positive semi-definite (its "
                         "frames are all equal, or not finite)")
    return factor


def _frechet(mu1: torch.Tensor, cov1: torch.Tensor, mu2: torch.Tensor, cov2: torch.Tensor,
             factor2: torch.Tensor) -> torch.Tensor:
    """The distances of B pairs; tr sqrt(cov1^1/2 cov2 cov1^1/2) as the sum of the square roots of the
    eigenvalues of L^T cov1 L (L L^T = cov2: the same eigenvalues as cov2 cov1), a symmetric PSD matrix."""
    m = factor2.transpose(1, 2) @ cov1 @ factor2
    tr_sqrt = torch.linalg.eigvalsh(0.5 * (m + m.transpose(1, 2))).clamp_min(0.0).sqrt().sum(-1)
    diff = mu1 - mu2
    traces = torch.diagonal(cov1, dim1=1, dim2=2).sum(-1) + torch.diagonal(cov2, dim1=1, dim2=2).sum(-1)
    return (diff * diff).sum(-1) + traces - 2.0 * tr_sqrt


def bootstrap_weights(n_clips: int, resamples: int | None = None, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """(1 + resamples, n_clips) int64 clip counts: row 0 all ones (the whole set: the point estimate), each
    other row the counts of n_clips clips drawn with replacement (from a generator seeded with `seed`); row 0
    alone below MIN_CLIPS clips. `resamples` None: RESAMPLES (read at the call: the tests lower it)."""
    resamples = RESAMPLES if resamples is None else resamples
    if n_clips < 1:
        raise ValueError(f"a bootstrap needs at least one clip, got {n_clips}")
    if n_clips < MIN_CLIPS:
        return np.ones((1, n_clips), dtype=np.int64)
    picks = np.random.default_rng(seed).integers(0, n_clips, size=(resamples, n_clips))
    counts = np.zeros((resamples, n_clips), dtype=np.int64)
    np.add.at(counts, (np.arange(resamples)[:, None], picks), 1)
    return np.concatenate([np.ones((1, n_clips), dtype=np.int64), counts])


@dataclass(frozen=True)
class Estimate:
    """A statistic on the whole set (`value`) and its bootstrap interval [`low`, `high`] (None, None with
    fewer than MIN_CLIPS clips)."""

    value: float
    low: float | None
    high: float | None

    def as_dict(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high}


def estimate(replicates: np.ndarray, confidence: float = CONFIDENCE) -> Estimate:
    """Row 0 of `replicates` (the whole set, `bootstrap_weights`' row 0) with the percentile interval of the
    others (the resamples; none below MIN_CLIPS clips: no interval)."""
    value = float(replicates[0])
    if replicates.shape[0] < 2:
        return Estimate(value, None, None)
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(replicates[1:], [tail, 100.0 - tail])
    return Estimate(value, float(low), float(high))


class ClipFrames:
    """One set's embeddings of one kind, per clip: every frame of every draw of the clip as a row (a
    clip-level embedding is one frame an output). Gaussian fits of any clip weighting come from the per-clip
    sums, taken around a common `shift` (any point near the data: it only keeps the sums well conditioned),
    in float64 on the CPU (torch's batched eigenvalues on CUDA loop over the matrices above 32 x 32)."""

    def __init__(self, frames: Sequence[np.ndarray], shift_C: np.ndarray) -> None:
        if not frames:
            raise ValueError("a set needs at least one clip")
        self.frames = [np.asarray(f, dtype=np.float64) - shift_C for f in frames]
        dims = {f.shape[1] for f in self.frames}
        if len(dims) != 1 or any(f.ndim != 2 or f.shape[0] < 1 for f in self.frames):
            raise ValueError(f"each clip's frames must be (n >= 1, C) with one C, got "
                             f"{[f.shape for f in self.frames]}")
        self.n_K = np.array([f.shape[0] for f in self.frames], dtype=np.float64)
        self.s1_KC = np.stack([f.sum(0) for f in self.frames])
        self.s2_KCC = torch.as_tensor(np.stack([f.T @ f for f in self.frames]))

    @property
    def dim(self) -> int:
        return self.s1_KC.shape[1]

    def fit(self, weights_BK: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(mu_BC, cov_BCC): the Gaussian fit of the frames with clip k counted weights_BK[b, k] times (the
        covariance normalised by the count - 1, as numpy's `cov`)."""
        w = torch.as_tensor(np.asarray(weights_BK, dtype=np.float64))
        n_B = w @ torch.as_tensor(self.n_K)
        if bool((n_B < 2).any()):
            raise ValueError("a Gaussian fit needs at least two frames")
        mu_BC = (w @ torch.as_tensor(self.s1_KC)) / n_B[:, None]
        s2_BCC = (w @ self.s2_KCC.reshape(len(self.frames), -1)).reshape(-1, self.dim, self.dim)
        outer_BCC = mu_BC[:, :, None] * mu_BC[:, None, :]
        return mu_BC, (s2_BCC - n_B[:, None, None] * outer_BCC) / (n_B - 1)[:, None, None]


def frechet_replicates(sets: Mapping[str, ClipFrames], against: ClipFrames,
                       weights_BK: np.ndarray) -> dict[str, np.ndarray]:
    """Per set, `frechet_distance` between its fit and `against`'s under each row of clip weights (the same
    clips, in the same order, in every set), CHUNK rows at a time, `against`'s factor once a chunk; the
    (chunk, set) pieces on up to THREADS threads (torch's batched eigenvalues run one matrix after another on
    one core, and release the GIL). Where a set holds fewer frames than dimensions (CLAP: one 512-d vector an
    output), through `_gram_replicates`, whose cost follows the frame count instead of the dimension."""
    from concurrent.futures import ThreadPoolExecutor

    small = min([against.n_K.sum(), *(s.n_K.sum() for s in sets.values())]) < against.dim
    if small:
        return {name: _gram_replicates(s, against, weights_BK) for name, s in sets.items()}
    chunks = [weights_BK[start:start + CHUNK] for start in range(0, weights_BK.shape[0], CHUNK)]
    fitted = []
    for w in chunks:
        mu_a, cov_a = against.fit(w)
        fitted.append((mu_a, cov_a, _factor(cov_a)))

    def piece(i: int, s: ClipFrames) -> np.ndarray:
        mu, cov = s.fit(chunks[i])
        return _frechet(mu, cov, *fitted[i]).numpy()

    with ThreadPoolExecutor(min(THREADS, os.cpu_count() or 1)) as pool:
        futures = {name: [pool.submit(piece, i, s) for i in range(len(chunks))] for name, s in sets.items()}
        return {name: np.concatenate([f.result() for f in parts]) for name, parts in futures.items()}


def _gram_replicates(x: ClipFrames, y: ClipFrames, weights_BK: np.ndarray) -> np.ndarray:
    """`frechet_distance` of the weighted fits of x and y through their n-by-m products instead of C-by-C
    covariances: with cov_x = A A^T and cov_y = B B^T (A the weighted, centred frames over sqrt(n - 1)),
    tr sqrt(cov_x^1/2 cov_y cov_x^1/2) is the sum of the singular values of A^T B, the square roots of the
    eigenvalues of (A^T B)(A^T B)^T. CHUNK rows of weights at a time."""
    fx, fy = (torch.as_tensor(np.concatenate(s.frames)) for s in (x, y))
    clip_x, clip_y = (torch.as_tensor(np.repeat(np.arange(len(s.frames)), s.n_K.astype(np.int64)))
                      for s in (x, y))
    gram_xy, sq_x, sq_y = fx @ fy.T, (fx * fx).sum(1), (fy * fy).sum(1)
    out = []
    for start in range(0, weights_BK.shape[0], CHUNK):
        w = torch.as_tensor(np.asarray(weights_BK[start:start + CHUNK], dtype=np.float64))
        wx, wy = w[:, clip_x], w[:, clip_y]
        nx, ny = wx.sum(1), wy.sum(1)
        if bool((nx < 2).any() or (ny < 2).any()):
            raise ValueError("a Gaussian fit needs at least two frames")
        mux, muy = (wx @ fx) / nx[:, None], (wy @ fy) / ny[:, None]
        # (x_i - mux).(y_j - muy) from the raw products, then weighted
        cross = (gram_xy[None] - (muy @ fx.T)[:, :, None] - (mux @ fy.T)[:, None, :]
                 + (mux * muy).sum(1)[:, None, None])
        norm = ((nx - 1) * (ny - 1)).sqrt()[:, None, None]
        g = wx.sqrt()[:, :, None] * cross * wy.sqrt()[:, None, :] / norm
        nuclear = torch.linalg.eigvalsh(g @ g.transpose(1, 2)).clamp_min(0.0).sqrt().sum(-1)
        tr_x = (wx @ sq_x - nx * (mux * mux).sum(1)) / (nx - 1)
        tr_y = (wy @ sq_y - ny * (muy * muy).sum(1)) / (ny - 1)
        out.append((((mux - muy) ** 2).sum(1) + tr_x + tr_y - 2.0 * nuclear).cpu().numpy())
    return np.concatenate(out)


def mean_replicates(values_K: Sequence[np.ndarray], weights_BK: np.ndarray) -> np.ndarray:
    """The mean of every value (each clip's values: one per output) with clip k counted weights_BK[b, k]
    times."""
    sums = np.array([float(np.sum(v)) for v in values_K])
    counts = np.array([float(np.size(v)) for v in values_K])
    w = np.asarray(weights_BK, dtype=np.float64)
    return (w @ sums) / (w @ counts)


# the verdict ---------------------------------------------------------------------------------------------

SAME = "not distinguishable from uncompressed at this sample size"


def distinguishable(difference: Estimate) -> bool:
    """Whether the interval of a difference (row minus uncompressed) lies entirely above or below 0."""
    if difference.low is None or difference.high is None:
        raise ValueError("a difference without an interval has no verdict")
    return difference.low > 0.0 or difference.high < 0.0


def verdict_level(measures: int, confidence: float = CONFIDENCE) -> float:
    """The level of each measure's interval in a verdict over `measures` measures (Bonferroni): the verdict
    as a whole then holds at `confidence`."""
    if measures < 1:
        raise ValueError("a verdict needs at least one measure")
    return 1.0 - (1.0 - confidence) / measures


def verdict(differences: Mapping[str, np.ndarray], fmt: Mapping[str, str] | None = None
            ) -> tuple[bool, str, dict[str, Estimate]]:
    """(distinguishable, the verdict in words, each measure's Estimate) from each measure's bootstrap
    replicates of (row minus uncompressed) (label -> replicates, row 0 the whole set; e.g. {"latent FAD":
    ..., "adherence": ...}), each interval at `verdict_level(len(differences))` (`judge`)."""
    level = verdict_level(len(differences))
    estimates = {label: estimate(reps, level) for label, reps in differences.items()}
    return (*judge(estimates, level, fmt), estimates)


def judge(differences: Mapping[str, Estimate], level: float,
          fmt: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """(distinguishable, the verdict in words) from each measure's difference to the uncompressed model with
    its interval at `level`: SAME when every interval contains 0, else `differs from uncompressed:
    <measure> higher|lower (difference <value>, <level> interval [<low>, <high>]); ...` for each measure
    whose interval lies above or below 0. `fmt`: a format per label (default 3 significant digits)."""
    if not differences:
        raise ValueError("a verdict needs at least one measure")
    parts = []
    for label, d in differences.items():
        if distinguishable(d):
            f = (fmt or {}).get(label, "{:+.3g}")
            parts.append(f"{label} {'higher' if d.low > 0 else 'lower'} (difference {f.format(d.value)}, "
                         f"{100 * level:.3g}% interval [{f.format(d.low)}, {f.format(d.high)}])")
    if not parts:
        return False, SAME
    return True, "differs from uncompressed: " + "; ".join(parts)
