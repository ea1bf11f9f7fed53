"""Fidelity metrics against closed-form cases: equal samples, known KLs, known shifts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from edgetwin.contract.errors import InputError
from edgetwin.contract.metrics import (
    c2st_auc,
    correlation_distance,
    fidelity_report,
    kl_categorical,
    kl_marginal,
    marginal_histograms,
    mmd_rbf,
)
from edgetwin.contract.spec import Feature, TwinSpec


def gauss_kl(mu0: float, s0: float, mu1: float, s1: float) -> float:
    """KL(N(mu0, s0^2) || N(mu1, s1^2)) in closed form."""
    return float(np.log(s1 / s0) + (s0**2 + (mu0 - mu1) ** 2) / (2 * s1**2) - 0.5)


def test_kl_identical_samples_is_zero() -> None:
    x = np.random.default_rng(0).normal(size=5000)
    assert kl_marginal(x, x) == pytest.approx(0.0, abs=1e-12)
    assert kl_marginal(x, x.copy(), Feature("profile.x", "heavy_tailed", low=None)) == pytest.approx(
        0.0, abs=1e-12
    )


@pytest.mark.parametrize(("mu1", "s1"), [(0.5, 1.0), (1.0, 1.0), (0.0, 1.5)])
def test_kl_matches_gaussian_closed_form(mu1: float, s1: float) -> None:
    rng = np.random.default_rng(1)
    real = rng.normal(0.0, 1.0, 200_000)
    gen = rng.normal(mu1, s1, 200_000)
    want = gauss_kl(0.0, 1.0, mu1, s1)
    # 50 bins over real's [q0.1%, q99.9%]: discretisation and the tails lumped into edge bins
    # make the estimate a little low; a few percent of the true value.
    assert kl_marginal(real, gen) == pytest.approx(want, rel=0.08, abs=0.005)


def test_kl_grows_with_shift_and_direction_is_real_to_gen() -> None:
    rng = np.random.default_rng(2)
    real = rng.normal(size=50_000)
    kls = [kl_marginal(real, rng.normal(d, 1.0, 50_000)) for d in (0.0, 0.3, 0.6, 1.2)]
    assert kls == sorted(kls) and kls[0] < 0.01 < kls[1]
    # KL(real || gen) is not symmetric: a narrow real vs a wide gen costs less than the reverse.
    narrow, wide = rng.normal(0, 1, 100_000), rng.normal(0, 2, 100_000)
    assert kl_marginal(narrow, wide) == pytest.approx(gauss_kl(0, 1, 0, 2), rel=0.1)


def test_heavy_tailed_bins_in_log_space() -> None:
    rng = np.random.default_rng(3)
    f = Feature("profile.t", "heavy_tailed", low=0.0)
    real = np.exp(rng.normal(3.0, 1.0, 200_000))
    gen = np.exp(rng.normal(3.5, 1.0, 200_000))
    # KL is invariant under the monotone log1p map, so the log-space histogram estimates
    # KL(N(3,1) || N(3.5,1)) = 0.125; linear bins would put almost all mass in one bin.
    assert kl_marginal(real, gen, f) == pytest.approx(0.125, rel=0.1)
    _, _, edges = marginal_histograms(real, gen, f)
    assert edges[-1] < 20  # log-space edges


def test_discrete_kl_uses_allowed_values_exactly() -> None:
    f = Feature("profile.p", "discrete", values=(1.0, 2.0))
    real = np.array([1.0] * 500 + [2.0] * 500)
    gen = np.array([1.0] * 900 + [2.1] * 100)  # 2.1 counts as the nearest allowed value, 2
    want = 0.5 * np.log(0.5 / 0.9) + 0.5 * np.log(0.5 / 0.1)
    assert kl_marginal(real, gen, f) == pytest.approx(want, abs=1e-4)


def test_kl_categorical_closed_form_and_unseen_labels() -> None:
    real = ["a"] * 50 + ["b"] * 50
    gen = ["a"] * 90 + ["b"] * 10
    assert kl_categorical(real, gen) == pytest.approx(
        0.5 * np.log(0.5 / 0.9) + 0.5 * np.log(0.5 / 0.1), abs=1e-4
    )
    assert kl_categorical(real, real) == pytest.approx(0.0, abs=1e-12)
    # a label the generator never makes is expensive but finite (smoothing 1e-6)
    big = kl_categorical(real, ["a"] * 100)
    assert 5.0 < big < np.inf


def test_mmd_zero_for_same_distribution_and_grows_with_shift() -> None:
    rng = np.random.default_rng(4)
    real = rng.normal(size=(1000, 3))
    same = rng.normal(size=(1000, 3))
    assert abs(mmd_rbf(real, same)) < 0.005
    mmds = [mmd_rbf(real, rng.normal(d, 1.0, (1000, 3))) for d in (0.25, 0.5, 1.0)]
    assert mmds == sorted(mmds) and mmds[0] > 0.01
    assert mmd_rbf(real, same, seed=1) == mmd_rbf(real, same, seed=1)


def test_c2st_half_for_same_and_high_for_shifted() -> None:
    rng = np.random.default_rng(5)
    real = rng.normal(size=(2000, 2))
    assert abs(c2st_auc(real, rng.normal(size=(2000, 2))) - 0.5) < 0.05
    # shift of 1 sd on one axis: the Bayes AUC is Phi(1/sqrt(2)) = 0.76
    shifted = rng.normal(size=(2000, 2)) + np.array([1.0, 0.0])
    assert c2st_auc(real, shifted) == pytest.approx(0.76, abs=0.05)


def test_correlation_distance() -> None:
    rng = np.random.default_rng(6)
    cov = np.array([[1.0, 0.8], [0.8, 1.0]])
    corr = rng.multivariate_normal([0, 0], cov, 20_000)
    corr2 = rng.multivariate_normal([0, 0], cov, 20_000)
    indep = rng.normal(size=(20_000, 2))
    assert correlation_distance(corr, corr2) < 0.02
    # Spearman rho of a Gaussian with r = 0.8 is (6/pi) asin(0.4) = 0.786
    assert correlation_distance(corr, indep) == pytest.approx(0.786, abs=0.02)
    assert correlation_distance(corr[:, :1], indep[:, :1]) == 0.0


def test_bad_inputs_raise_input_error() -> None:
    with pytest.raises(InputError, match="non-finite"):
        kl_marginal(np.array([1.0, np.nan]), np.array([1.0, 2.0]))
    with pytest.raises(InputError, match="columns"):
        mmd_rbf(np.zeros((5, 2)), np.zeros((5, 3)))
    with pytest.raises(InputError, match="empty"):
        kl_marginal(np.array([]), np.array([1.0]))


def test_fidelity_report_on_a_spec() -> None:
    spec = TwinSpec(
        features=(
            Feature("profile.a", "continuous"),
            Feature("profile.b", "heavy_tailed", low=0.0),
            Feature("profile.c", "discrete", values=(0.0, 1.0, 2.0)),
            Feature("action.x"),
        )
    )
    rng = np.random.default_rng(7)

    def table(n: int, shift: float) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "scenario": rng.choice(["s1", "s2"], n),
                "profile.a": rng.normal(shift, 1, n),
                "profile.b": np.exp(rng.normal(shift, 1, n)),
                "profile.c": rng.choice([0.0, 1.0, 2.0], n),
            }
        )

    cols = spec.names("profile")
    real = table(1500, 0.0)
    good = fidelity_report(real, table(1500, 0.0), spec, cols)
    bad = fidelity_report(real, table(1500, 1.0), spec, cols)
    assert set(good) >= {"kl", "kl_label", "kl_mean", "kl_max", "mmd", "c2st_auc", "corr_dist"}
    assert set(good["kl"]) == set(cols)
    assert good["kl_mean"] < 0.03 < bad["kl_mean"]
    assert good["c2st_auc"] < 0.56 < 0.7 < bad["c2st_auc"]
    assert good["mmd"] < bad["mmd"]
    assert good["kl_label"] < 0.01
    with pytest.raises(InputError, match="missing"):
        fidelity_report(real, real.drop(columns=["profile.a"]), spec, cols)
