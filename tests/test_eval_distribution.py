"""The eval's distribution math: the Frechet distance against closed forms and scipy's sqrtm, Gaussian fits of
weighted clips against numpy on the repeated frames, the seeded bootstrap, and the verdict on made-up
differences at both sides of its boundary."""

import numpy as np
import pytest

from octopus_audio.eval.distribution import (
    MIN_CLIPS,
    RESAMPLES,
    SAME,
    ClipFrames,
    Estimate,
    bootstrap_weights,
    distinguishable,
    estimate,
    frechet_distance,
    frechet_replicates,
    judge,
    mean_replicates,
    verdict,
    verdict_level,
)

scipy_linalg = pytest.importorskip("scipy.linalg")


def random_cov(rng, c, rank=None):
    a = rng.standard_normal((c, rank or c + 3))
    return a @ a.T / a.shape[1]


def test_diagonal_gaussians_have_the_closed_form_distance():
    # commuting covariances: |mu1 - mu2|^2 + sum (sqrt(a_i) - sqrt(b_i))^2
    a, b = np.array([1.0, 4.0, 0.25, 9.0]), np.array([4.0, 1.0, 0.25, 2.0])
    mu1, mu2 = np.array([0.0, 1.0, -2.0, 0.5]), np.array([1.0, 1.0, 0.0, 0.5])
    expected = 1.0 + 4.0 + (1 - 2) ** 2 + (2 - 1) ** 2 + 0.0 + (3 - np.sqrt(2.0)) ** 2
    assert frechet_distance(mu1, np.diag(a), mu2, np.diag(b)) == pytest.approx(expected, rel=1e-9)


def test_rotated_copies_of_one_covariance_have_the_closed_form_distance():
    # cov2 = R cov1 R^T with both isotropic in a plane: equal covariances give the squared mean distance
    rng = np.random.default_rng(1)
    cov = random_cov(rng, 7)
    mu1, mu2 = rng.standard_normal(7), rng.standard_normal(7)
    assert frechet_distance(mu1, cov, mu2, cov) == pytest.approx(float(((mu1 - mu2) ** 2).sum()), abs=1e-9)
    assert frechet_distance(mu1, cov, mu1, cov) == pytest.approx(0.0, abs=1e-9)
    # scaled covariances: tr(cov) (1 - sqrt(s))^2
    assert frechet_distance(mu1, cov, mu1, 4.0 * cov) == pytest.approx(np.trace(cov), rel=1e-9)


@pytest.mark.parametrize("c,rank", [(1, None), (5, None), (33, None), (16, 3)], ids=["1d", "5d", "33d",
                                                                                  "16d-rank3"])
def test_general_covariances_match_scipy_sqrtm(c, rank):
    rng = np.random.default_rng(c)
    cov1, cov2 = random_cov(rng, c, rank), random_cov(rng, c)
    mu1, mu2 = rng.standard_normal(c), rng.standard_normal(c)
    s1 = scipy_linalg.sqrtm(cov1)
    cross = np.real(scipy_linalg.sqrtm(s1 @ cov2 @ s1))
    expected = ((mu1 - mu2) ** 2).sum() + np.trace(cov1) + np.trace(cov2) - 2 * np.trace(cross)
    assert frechet_distance(mu1, cov1, mu2, cov2) == pytest.approx(expected, rel=1e-8, abs=1e-9)
    # the second covariance is the one factored (with JITTER): singular there, about sqrt(JITTER) of the size
    rel = 1e-8 if rank is None else 2e-5
    assert frechet_distance(mu2, cov2, mu1, cov1) == pytest.approx(expected, rel=rel)


def test_weighted_clip_fits_equal_numpy_on_the_repeated_frames():
    rng = np.random.default_rng(2)
    frames = [rng.standard_normal((n, 6)) + k for k, n in enumerate((5, 9, 1, 4))]
    data = ClipFrames(frames, shift_C=np.full(6, 1.5))
    weights = np.array([[1, 1, 1, 1], [0, 2, 1, 1], [3, 0, 0, 1]])
    mu, cov = data.fit(weights)
    for b, w in enumerate(weights):
        repeated = np.concatenate([f for f, k in zip(frames, w, strict=True) for _ in range(k)])
        np.testing.assert_allclose(mu[b] + 1.5, repeated.mean(0), rtol=1e-12)
        np.testing.assert_allclose(cov[b], np.cov(repeated, rowvar=False), rtol=1e-10, atol=1e-12)


def _each_replicate_is_its_fits_distance(x: ClipFrames, y: ClipFrames, weights: np.ndarray, rel: float):
    """`frechet_replicates` of x against y: resample i is the distance between the two fits at weights i."""
    reps = frechet_replicates({"x": x}, y, weights)["x"]
    for i, w in enumerate(weights):
        (mu_x,), (cov_x,) = x.fit(w[None])
        (mu_y,), (cov_y,) = y.fit(w[None])
        assert reps[i] == pytest.approx(frechet_distance(mu_x, cov_x, mu_y, cov_y), rel=rel)


def test_replicates_equal_the_distance_of_each_weighted_fit():
    rng = np.random.default_rng(3)
    a = ClipFrames([rng.standard_normal((20, 4)) for _ in range(5)], np.zeros(4))
    b = ClipFrames([rng.standard_normal((20, 4)) * 1.3 + 0.2 for _ in range(5)], np.zeros(4))
    _each_replicate_is_its_fits_distance(b, a, bootstrap_weights(5, resamples=7), rel=1e-9)


def test_few_high_dimensional_vectors_take_the_gram_path_with_the_same_distances():
    # 512-d, 3 clips x 4 outputs: fewer vectors than dimensions (CLAP); against the covariance formula
    rng = np.random.default_rng(4)
    x = ClipFrames([rng.standard_normal((4, 512)) for _ in range(3)], np.zeros(512))
    y = ClipFrames([rng.standard_normal((4, 512)) + 0.1 for _ in range(3)], np.zeros(512))
    _each_replicate_is_its_fits_distance(x, y, bootstrap_weights(3, resamples=4), rel=1e-7)


def test_the_bootstrap_is_seeded_and_resamples_whole_clips():
    assert RESAMPLES == 1000  # the product's count (the tests' conftest lowers the module's for speed)
    w = bootstrap_weights(16, RESAMPLES)
    assert w.shape == (1 + RESAMPLES, 16) and (w[0] == 1).all() and (w.sum(1) == 16).all()
    np.testing.assert_array_equal(w, bootstrap_weights(16, RESAMPLES))
    assert not np.array_equal(w, bootstrap_weights(16, RESAMPLES, seed=1))
    assert len({tuple(r) for r in w[1:]}) > 0.99 * RESAMPLES  # distinct resamples
    assert bootstrap_weights(MIN_CLIPS - 1).shape == (1, MIN_CLIPS - 1)  # no resamples: no interval
    assert estimate(np.array([2.0])) == Estimate(2.0, None, None)


def test_mean_replicates_weigh_each_output():
    values = [np.array([1.0, 3.0]), np.array([10.0]), np.array([0.0, 0.0, 6.0])]
    reps = mean_replicates(values, np.array([[1, 1, 1], [2, 0, 1]]))
    assert reps.tolist() == pytest.approx([20.0 / 6, (8.0 + 6.0) / 7])


def test_the_interval_of_a_mean_is_about_the_normal_one():
    # 40 clips of one value each: about mean +- 1.96 s / sqrt(40)
    v = np.random.default_rng(5).standard_normal(40)
    e = estimate(mean_replicates([np.array([x]) for x in v], bootstrap_weights(40, RESAMPLES)))
    half = 1.96 * v.std(ddof=1) / np.sqrt(40)
    assert e.value == pytest.approx(v.mean())
    assert e.low == pytest.approx(v.mean() - half, abs=0.15 * half)
    assert e.high == pytest.approx(v.mean() + half, abs=0.15 * half)


@pytest.mark.parametrize("low,high,expected", [
    (-0.001, 0.5, False), (0.0, 0.5, False), (1e-9, 0.5, True),
    (-0.5, 0.0, False), (-0.5, -1e-9, True), (-2.0, 3.0, False),
], ids=["just-covers-0-above", "touches-0-above", "just-above-0", "touches-0-below", "just-below-0", "wide"])
def test_distinguishable_at_both_sides_of_the_boundary(low, high, expected):
    assert distinguishable(Estimate((low + high) / 2, low, high)) is expected


def test_the_verdict_in_words_names_each_measure_outside_the_floor():
    inside = {"latent FAD": Estimate(0.1, -0.05, 0.3), "adherence": Estimate(-0.01, -0.02, 0.001)}
    assert judge(inside, 0.975) == (False, SAME)
    outside = {"latent FAD": Estimate(0.4, 0.01, 0.8), "spectral FAD": Estimate(0.0, -0.1, 0.1),
               "adherence": Estimate(-0.03, -0.05, -0.002)}
    hit, text = judge(outside, 0.9833)
    assert hit and text == ("differs from uncompressed: latent FAD higher (difference +0.4, 98.3% interval "
                            "[+0.01, +0.8]); adherence lower (difference -0.03, 98.3% interval [-0.05, "
                            "-0.002])")
    with pytest.raises(ValueError):
        judge({"adherence": Estimate(0.0, None, None)}, 0.95)


def test_each_measure_of_a_verdict_is_read_at_the_bonferroni_level():
    # made-up replicates of a difference: 2% of the resamples at or below 0, the rest above. A 95% interval
    # excludes 0 (one measure: differs); with three measures each interval is at 98.3% and holds 0
    assert verdict_level(1) == pytest.approx(0.95) and verdict_level(3) == pytest.approx(1 - 0.05 / 3)
    reps = np.concatenate([[0.5], np.linspace(-0.1, 0.0, 20), np.linspace(0.01, 1.0, 980)])
    zero = np.zeros_like(reps)
    alone = verdict({"latent FAD": reps})
    assert alone[0] and alone[2]["latent FAD"].low > 0
    among_three = verdict({"latent FAD": reps, "spectral FAD": zero, "adherence": zero})
    assert among_three[:2] == (False, SAME) and among_three[2]["latent FAD"].low < 0
    # 0.5% at or below 0: outside even the 98.3% interval
    reps = np.concatenate([[0.5], np.linspace(-0.1, 0.0, 5), np.linspace(0.01, 1.0, 995)])
    hit, text, _ = verdict({"latent FAD": reps, "spectral FAD": zero, "adherence": zero})
    assert hit and text.startswith("differs from uncompressed: latent FAD higher (difference +0.5, 98.3%")


def test_a_shifted_set_is_told_apart_and_a_second_sample_is_not():
    # 12 clips x 50 frames: B from the same distribution as A and F; C shifted by 0.5 in every coordinate
    rng = np.random.default_rng(6)

    def draw(shift):
        return ClipFrames([rng.standard_normal((50, 3)) + shift for _ in range(12)], np.zeros(3))

    f, a, b, c = draw(0.0), draw(0.0), draw(0.0), draw(0.5)
    reps = frechet_replicates({"a": a, "b": b, "c": c}, f, bootstrap_weights(12, RESAMPLES))
    same = estimate(reps["b"] - reps["a"])
    shifted = estimate(reps["c"] - reps["a"])
    assert not distinguishable(same) and distinguishable(shifted) and shifted.low > 0
