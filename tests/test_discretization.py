"""Bayesian monotone discretisation-error variance model: structure, logp, divergence, NUTS."""

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from scipy.stats import norm

import pymc_pnode as pn
from pymc_pnode.classical.rk import FixedStepSolver
from pymc_pnode.likelihoods.discretization import DiscretizationErrorNormal
from tests.conftest import LIKELIHOOD_MUTATIONS, scale_likelihood


def decay(y, t, p):
    return [-p[0] * y[0]]


def oscillator(y, t, p):
    return [y[1], -p[0] * y[0]]


def blowup(y, t, p):
    return [p[0] * y[0] * y[0]]


@pytest.fixture(scope="module")
def decay_ode():
    return pn.ODE(decay, n_states=1, n_theta=1)


@pytest.fixture(scope="module")
def osc_ode():
    return pn.ODE(oscillator, n_states=2, n_theta=1)


TIMES = np.linspace(0.5, 4.0, 8)


def _decay_data(seed=0):
    rng = np.random.default_rng(seed)
    return 2.0 * np.exp(-0.8 * TIMES) + 0.05 * rng.normal(size=TIMES.size)


def test_model_structure_names_and_dims(osc_ode):
    times = np.arange(0, 11) * 0.5  # includes t0: no error increment there
    data = np.zeros((11, 1))
    with pm.Model(coords={"time": times, "obs": ["q"]}) as model:
        w2 = pm.LogNormal("w2", 0.0, 0.3)
        out = DiscretizationErrorNormal(
            "q", osc_ode, y0=[1.0, 0.0], theta=pt.stack([w2]), times=times, observed=data,
            noise_var=0.01, method="stormer_verlet", step=0.25, obs_matrix=[[1.0, 0.0]],
            dims=("time", "obs"),
        )
    assert out.name == "q"
    assert {v.name for v in model.free_RVs} == {"w2", "q_error_sd", "q_error_shape"}
    assert model.named_vars_to_dims["q"] == ("time", "obs")
    assert model.named_vars_to_dims["q_error_var"] == ("time", "obs")
    assert model["q_error_shape"].type.shape == (1, 10)
    point = model.initial_point()
    var = model.compile_fn(model["q_error_var"], inputs=model.value_vars, on_unused_input="ignore")(point)
    assert var.shape == (11, 1)
    assert var[0, 0] == 0.0 and np.all(np.diff(var[:, 0]) > 0)
    logp = model.compile_logp()(point)
    assert np.isfinite(logp)
    with model:
        prior = pm.sample_prior_predictive(draws=5, random_seed=1)
    assert prior.prior_predictive["q"].shape == (1, 5, 11, 1)


def test_logp_equals_heteroscedastic_normal(decay_ode):
    data = _decay_data()
    inc = np.linspace(0.0, 0.002, TIMES.size)
    with pm.Model() as model:
        k = pm.Normal("k", 0.8, 0.1, shape=1)
        DiscretizationErrorNormal("y", decay_ode, y0=[2.0], theta=k, times=TIMES, observed=data,
                                  noise_var=0.05**2, method="euler", step=0.25, increments=inc)
    point = {"k": np.array([0.75])}
    got = model.compile_logp(vars=[model["y"]])(point)
    mean = FixedStepSolver(decay_ode, TIMES, method="euler", step=0.25).solve([2.0], [0.75])[:, 0]
    expected = norm.logpdf(data, mean, np.sqrt(0.05**2 + np.cumsum(inc))).sum()
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_diverging_solve_gives_minus_inf_logp_and_finite_gradient():
    ode = pn.ODE(blowup, n_states=1, n_theta=1)
    times = np.linspace(0.1, 2.0, 20)
    with pm.Model() as model:
        a = pm.LogNormal("a", 0.0, 1.0, shape=1)
        DiscretizationErrorNormal("y", ode, y0=[1.0], theta=a, times=times,
                                  observed=np.ones(20), noise_var=0.1, method="euler", step=0.1)
    point = model.initial_point()
    point["a_log__"] = np.log([100.0])  # y' = 100 y^2 blows up at t = 0.01
    assert model.compile_logp()(point) == -np.inf
    assert np.all(np.isfinite(model.compile_dlogp()(point)))
    point["a_log__"] = np.log([0.1])
    assert np.isfinite(model.compile_logp()(point))


def test_nuts_samples_without_divergences(decay_ode):
    data = _decay_data()
    with pm.Model():
        k = pm.LogNormal("k", 0.0, 0.5, shape=1)
        y0 = pm.Normal("y0", 2.0, 0.5, shape=1)
        DiscretizationErrorNormal("y", decay_ode, y0=y0, theta=k, times=TIMES, observed=data,
                                  noise_var=0.05**2, method="euler", step=0.25)
        idata = pm.sample(draws=150, tune=200, chains=2, cores=1, random_seed=3,
                          progressbar=False, compute_convergence_checks=False)
    assert int(idata.sample_stats.diverging.sum()) == 0
    post_k = idata.posterior["k"].values.ravel()
    assert abs(post_k.mean() - 0.8) < 0.15
    var = idata.posterior["y_error_var"].values.reshape(-1, TIMES.size)
    assert np.all(np.diff(var, axis=1) >= 0.0)


_INCREMENTS = np.linspace(0.0, 0.002, TIMES.size)


def _euler_decay_model(ode, data):
    """k ~ LogNormal(0, 0.5) (median 1, truth 0.8), Euler at step 0.25 with fixed variance increments."""
    with pm.Model() as model:
        k = pm.LogNormal("k", 0.0, 0.5, shape=1)
        DiscretizationErrorNormal("y", ode, y0=[2.0], theta=k, times=TIMES, observed=data,
                                  noise_var=0.05**2, method="euler", step=0.25, increments=_INCREMENTS)
    return model


def _euler_decay_reference(data):
    """Posterior mean and sd of log k by quadrature, written independently: Euler's solution of
    y' = -k y is 2 (1 - k h)^(t / h) in closed form, the variances 0.05² + cumsum(increments)."""
    log_k = np.linspace(-1.0, 0.3, 2601)
    k = np.exp(log_k)[:, None]
    mean = 2.0 * (1.0 - 0.25 * k) ** np.round(TIMES / 0.25)
    sd = np.sqrt(0.05**2 + np.cumsum(_INCREMENTS))
    logpost = norm.logpdf(data, mean, sd).sum(axis=1) + norm.logpdf(log_k, 0.0, 0.5)
    w = np.exp(logpost - logpost.max())
    w /= w.sum()
    assert w[0] < 1e-10 and w[-1] < 1e-10
    m = float(w @ log_k)
    return m, float(np.sqrt(w @ (log_k - m) ** 2))


def _check_posterior(idata, ref):
    """log k: mean within 0.3 reference sd, sd within 20 % (half the likelihood widens it by ≈ √2)."""
    draws = np.log(idata.posterior["k"].values.reshape(-1))
    assert abs(draws.mean() - ref[0]) < 0.3 * ref[1], (draws.mean(), ref)
    assert 0.8 < draws.std() / ref[1] < 1.2, (draws.std(), ref)


def _sample(model):
    with model:
        return pm.sample(draws=500, tune=300, chains=2, cores=1, random_seed=4, progressbar=False,
                         compute_convergence_checks=False)


def test_nuts_posterior_matches_quadrature(decay_ode):
    data = _decay_data()
    _check_posterior(_sample(_euler_decay_model(decay_ode, data)), _euler_decay_reference(data))


@LIKELIHOOD_MUTATIONS
def test_posterior_check_fails_with_mutated_likelihood(decay_ode, factor):
    data = _decay_data()
    idata = _sample(scale_likelihood(_euler_decay_model(decay_ode, data), factor))
    with pytest.raises(AssertionError):
        _check_posterior(idata, _euler_decay_reference(data))


def test_unknown_noise_variance_as_random_variable(decay_ode):
    with pm.Model() as model:
        s2 = pm.HalfNormal("s2", 0.01)
        DiscretizationErrorNormal("y", decay_ode, y0=[2.0], theta=[0.8], times=TIMES,
                                  observed=_decay_data(), noise_var=s2, method="rk4", step=0.5)
    assert np.isfinite(model.compile_logp()(model.initial_point()))


def test_bad_input(decay_ode):
    data = _decay_data()
    kw = dict(y0=[2.0], theta=[0.8], times=TIMES, observed=data, noise_var=0.01, method="euler",
              step=0.25)
    with pm.Model():
        with pytest.raises(ValueError, match="noise_var"):
            DiscretizationErrorNormal("y", decay_ode, **{**kw, "noise_var": -0.01})
        with pytest.raises(ValueError, match="strictly increasing"):
            DiscretizationErrorNormal("y", decay_ode, **{**kw, "times": TIMES[::-1]})
        with pytest.raises(ValueError, match="larger than the observation spacing"):
            DiscretizationErrorNormal("y", decay_ode, **{**kw, "step": 1.0})
        with pytest.raises(ValueError, match="observed"):
            DiscretizationErrorNormal("y", decay_ode, **{**kw, "observed": data[:-1]})
        with pytest.raises(ValueError, match="dims"):
            DiscretizationErrorNormal("y", decay_ode, **kw, dims=("a", "b"))
        with pytest.raises(ValueError, match="error_sd_scale"):
            DiscretizationErrorNormal("y", decay_ode, **kw, error_sd_scale=-1.0)
        with pytest.raises(ValueError, match="concentration"):
            DiscretizationErrorNormal("y", decay_ode, **kw, concentration=0.0)
    with pytest.raises(ValueError, match="pm.Model"):
        DiscretizationErrorNormal("y", decay_ode, **kw)
