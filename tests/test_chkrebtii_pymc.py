"""Chkrebtii layer in PyMC: exact gradients, NUTS and Algorithm 2 calibration, pickling, numba backend."""

import cloudpickle
import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.graph.replace import graph_replace
from scipy.stats import multivariate_normal, norm

import pymc_pnode as pn
from pymc_pnode.chkrebtii import ChkrebtiiMetropolis, ChkrebtiiSolution, DelayODE
from tests.conftest import (
    LIKELIHOOD_MUTATIONS,
    assert_gradient_matches_central_differences,
    scale_likelihood,
)


def _layer_value(ode, y0, theta, log_alpha, log_lam, z, weights, **kw):
    """``sum(weights * u)`` of the layer with its innovations replaced by the symbolic ``z``."""
    with pm.Model() as model:
        u = ChkrebtiiSolution("u", ode, y0=y0, theta=theta, alpha=pt.exp(log_alpha),
                              lam=pt.exp(log_lam), **kw)
    (value,) = graph_replace([(u * weights).sum()], {model["u_innovations"]: z}, strict=False)
    return value


@pytest.mark.parametrize(
    "kernel, noise, lam, output",
    [("uniform", "zero", [0.3, 0.45], "draw"), ("uniform", "paper", 0.7, "mean"),
     ("squared_exponential", "paper", 0.35, "draw")],
)
def test_exact_gradients_theta_y0_alpha_lam_innovations(lv_ode, rng, kernel, noise, lam, output):
    times = np.array([0.4, 1.1, 2.5, 3.0])
    n = 24
    n_z = n - 1 + (times.size if output == "draw" else 0)
    weights = rng.standard_normal((times.size, 2))
    kw = dict(t_span=(0.0, 3.0), n_grid=n, kernel=kernel, noise=noise, times=times, output=output)

    def build(theta, y0, log_alpha, log_lam, z):
        return _layer_value(lv_ode, y0, theta, log_alpha, log_lam, z, weights, **kw)

    point = [np.array([1.0, 0.8, 0.6, 1.1]), np.array([1.0, 0.5]), np.log(np.array([20.0, 5.0])),
             np.log(np.atleast_1d(lam)), 0.5 * rng.standard_normal((n_z, 2))]
    assert_gradient_matches_central_differences(build, point, rel=1e-5, abs_=1e-7)


def test_exact_gradients_delay_history_and_forcing(rng):
    # Lagged states enter both components; the delay is theta[1], the history depends on theta[2].
    def field(y, t, p, lag, forcing):
        return [-p[0] * lag[0] + 0.3 * forcing[0], -p[2] * y[1] * lag[0] + 0.2 * lag[1]]

    dde = DelayODE(field, 2, 3, delay_param=1, history=lambda t, p: [1.0 + 0.1 * t, pt.cos(p[2] * t)],
                   forcing=([0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 0.5, 0.2]))
    times = np.array([0.7, 1.5, 2.9])
    weights = rng.standard_normal((3, 2))
    kw = dict(t_span=(0.0, 3.0), n_grid=31, noise="paper", times=times)

    def build(theta, y0, log_alpha, log_lam, z):
        return _layer_value(dde, y0, theta, log_alpha, log_lam, z, weights, **kw)

    point = [np.array([1.0, 0.73, 0.5]), np.array([1.0, 1.0]), np.array(np.log(50.0)),
             np.array(np.log(0.17)), rng.standard_normal((33, 2))]
    assert_gradient_matches_central_differences(build, point, rel=1e-5, abs_=1e-7)


@pytest.fixture(scope="module")
def driven_ode():
    from tests import test_fenrir_discontinuities as chain

    return pn.ODE(chain._field, n_states=2, n_theta=2)


@pytest.mark.parametrize("output", ["draw", "mean"])
def test_restarts_at_discontinuities_have_exact_gradients(driven_ode, rng, output):
    """Through the restarts at the jumps of the switched input (each segment starts from the realisation where the
    previous one ended): exact gradients in y0, theta, alpha, lam and every segment's innovations."""
    from tests import test_fenrir_discontinuities as chain

    times = np.array([1.0, chain.ON, 3.5, 6.0, 7.5])  # one at a jump: the end of the segment before it
    weights = rng.standard_normal((times.size, 2))
    kw = dict(t_span=(0.0, 8.0), n_grid=33, times=times, output=output, discontinuities=[chain.OFF, chain.ON])
    with pm.Model() as model:
        ChkrebtiiSolution("u", driven_ode, y0=chain.Y0, theta=chain.THETA, alpha=10.0, lam=0.5, **kw)
    # grids of 9, 13 and 13 points (32 steps shared out by length); "draw" adds each segment's outputs and its end
    n_z = 32 + (2 + 2 + 3 if output == "draw" else 0)
    assert model["u_innovations"].type.shape == (n_z, 2)

    def build(theta, y0, log_alpha, log_lam, z):
        return _layer_value(driven_ode, y0, theta, log_alpha, log_lam, z, weights, **kw)

    # λ = 0.37: the uniform kernel's covariances have kinks in λ where two grid points are 2λ apart (0.5 would
    # put the grid spacing 0.25 of the first segment on one)
    point = [chain.THETA, chain.Y0, np.log(np.array([10.0, 20.0])), np.log(np.array([0.37])),
             0.5 * rng.standard_normal((n_z, 2))]
    assert_gradient_matches_central_differences(build, point, rel=1e-5, abs_=1e-7)


def test_declared_discontinuities_restore_the_convergence_order(driven_ode):
    """The conditional mean at zero innovations against the piecewise exact solution: second order in the grid
    spacing with the jumps declared, first order (and 15–30× larger errors here) without."""
    from tests import test_fenrir_discontinuities as chain

    exact = chain.reference(chain.THETA)
    errors = {}
    for declared in (False, True):
        for n_grid in (81, 161):
            with pm.Model() as model:
                u = ChkrebtiiSolution("u", driven_ode, y0=chain.Y0, theta=chain.THETA, t_span=(0.0, 8.0),
                                      n_grid=n_grid, alpha=100.0, lam=0.5, times=chain.TIMES, output="mean",
                                      discontinuities=[chain.ON, chain.OFF] if declared else None)
            z = model["u_innovations"]
            value = pytensor.function([z], u)(np.zeros(z.type.shape))
            errors[declared, n_grid] = np.abs(value - exact).max()
    assert errors[True, 81] / errors[True, 161] > 3.5  # h²
    assert 1.7 < errors[False, 81] / errors[False, 161] < 2.5  # h
    assert errors[True, 161] < errors[False, 161] / 10


def test_forward_sampler_restarts_as_the_layer(driven_ode):
    """``chkrebtii_sample(..., discontinuities=...)`` is the layer at the innovations the same generator gives, drawn
    segment by segment (steps, then outputs) in the layer's order."""
    from tests import test_fenrir_discontinuities as chain

    times = np.array([1.0, chain.ON, 3.5, 6.0, 7.5])
    kw = dict(t_span=(0.0, 8.0), n_grid=33, times=times, alpha=10.0, lam=0.37, discontinuities=[chain.ON, chain.OFF])
    draws, means = pn.chkrebtii_sample(driven_ode, chain.Y0, chain.THETA, size=2, rng=11, return_mean=True, **kw)
    with pm.Model() as model:
        u = ChkrebtiiSolution("u", driven_ode, y0=chain.Y0, theta=chain.THETA, **kw)
    z = model["u_innovations"]
    innovations = np.random.default_rng(11).standard_normal((2,) + z.type.shape)  # each draw's rows, in turn
    layer = pytensor.function([z], u)
    for b in range(2):
        np.testing.assert_allclose(draws[b], layer(innovations[b]), rtol=1e-12, atol=1e-12)
    assert np.abs(draws - means).max() > 0  # the draws are not the conditional means


def test_discontinuities_are_validated(driven_ode, lv_ode):
    kw = dict(y0=[1.0, 0.0], theta=[0.7, 3.0], t_span=(0.0, 8.0), n_grid=20, alpha=10.0, lam=0.5)
    with pm.Model(), pytest.raises(ValueError, match="discontinuities"):
        ChkrebtiiSolution("u", driven_ode, discontinuities=[2.0, np.nan], **kw)
    dde = DelayODE(lambda y, t, p, lag: [-p[0] * lag[0]], 1, 2, delay_param=1, history=lambda t, p: [1.0])
    with pm.Model(), pytest.raises(ValueError, match="DelayODE"):
        ChkrebtiiSolution("u", dde, y0=[1.0], theta=[0.5, 0.3], t_span=(0.0, 3.0), n_grid=20, alpha=10.0, lam=0.5,
                          discontinuities=[1.0])
    with pm.Model() as model:  # jumps outside the span do not split it
        ChkrebtiiSolution("u", driven_ode, discontinuities=[-1.0, 8.0, 9.0], **kw)
    assert model["u_innovations"].type.shape == (19 + 20, 2)


# ---------------------------------------------------------------- calibration
def _decay(y, t, p):
    return [-p[0] * y[0]]


@pytest.fixture(scope="module")
def calibration():
    """y' = -k y, k = 0.8, six noisy observations; a coarse grid (the layer carries its error)."""
    ode = pn.ODE(_decay, n_states=1, n_theta=1)
    times = np.linspace(0.5, 3.0, 6)
    rng = np.random.default_rng(7)
    data = np.exp(-0.8 * times)[:, None] + 0.02 * rng.standard_normal((6, 1))
    return ode, times, data


def _calibration_model(ode, times, data, output="draw"):
    with pm.Model() as model:
        k = pm.LogNormal("k", 0.0, 0.5)
        u = ChkrebtiiSolution("u", ode, y0=[1.0], theta=pt.stack([k]), t_span=(0.0, 3.0),
                              n_grid=16, alpha=200.0, lam=0.4, times=times, output=output)
        pm.Normal("y", u, 0.02, observed=data)
    return model


@pytest.fixture(scope="module")
def calibration_reference(calibration):
    """Posterior mean and sd of log k by quadrature, the innovations integrated out exactly.

    For the linear field f(u) = -k u the realisation is affine in the innovations z (Chkrebtii et
    al. 2016, Algorithm 1: every gain and covariance is independent of f), u = m(k) + L(k) z, so
    y | k ~ N(m(k), L(k) L(k)ᵀ + σ² I) in closed form. m and L are read off the layer itself
    (u at z = 0 and at unit vectors; affinity is checked at a random z), and the posterior of
    log k (prior N(0, 0.5²)) is integrated on a grid: a reference independent of the samplers and
    of the gradients they use.
    """
    ode, times, data = calibration
    model = _calibration_model(ode, times, data)
    (u_of_values,) = model.replace_rvs_by_values([model["u"]])
    layer = pytensor.function(model.value_vars, u_of_values)
    z_shape = model.initial_point()["u_innovations"].shape
    n_z = int(np.prod(z_shape))
    log_k = np.linspace(-0.9, 0.4, 521)
    logpost = np.empty(log_k.size)
    y = data.reshape(-1)
    for i, lk in enumerate(log_k):
        u0 = np.asarray(layer(lk, np.zeros(z_shape))).reshape(-1)
        cols = np.column_stack([np.asarray(layer(lk, e.reshape(z_shape))).reshape(-1) - u0 for e in np.eye(n_z)])
        if i == 0:
            z = np.random.default_rng(0).standard_normal(n_z)
            np.testing.assert_allclose(np.asarray(layer(lk, z.reshape(z_shape))).reshape(-1), u0 + cols @ z,
                                       atol=1e-12)
        cov = cols @ cols.T + 0.02**2 * np.eye(y.size)
        logpost[i] = multivariate_normal(u0, cov).logpdf(y) + norm(0.0, 0.5).logpdf(lk)
    w = np.exp(logpost - logpost.max())
    w /= w.sum()
    mean = float(w @ log_k)
    sd = float(np.sqrt(w @ (log_k - mean) ** 2))
    assert w[0] < 1e-8 and w[-1] < 1e-8  # the grid covers the posterior
    return mean, sd


def _check_posterior(idata, ref):
    """Mean of log k within 0.3 reference sd, sd within 20 %: a half-weighted likelihood widens
    the posterior by ≈ √2, the prior alone by ≈ 10×."""
    draws = np.log(idata.posterior["k"].values.reshape(-1))
    mean, sd = ref
    assert abs(draws.mean() - mean) < 0.3 * sd, (draws.mean(), mean, sd)
    assert 0.8 < draws.std() / sd < 1.2, (draws.std(), sd)


def _sample_nuts(model):
    with model:
        return pm.sample(draws=500, tune=300, chains=2, cores=1, progressbar=False, random_seed=1,
                         compute_convergence_checks=False)


def _sample_algorithm2(model):
    with model:
        step = ChkrebtiiMetropolis([model["k"]])
        idata = pm.sample(draws=2000, tune=800, chains=1, step=step, progressbar=False,
                          random_seed=2, compute_convergence_checks=False)
    return idata, step


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_nuts_posterior_matches_quadrature(calibration, calibration_reference):
    idata = _sample_nuts(_calibration_model(*calibration))
    _check_posterior(idata, calibration_reference)
    assert int(idata.sample_stats["diverging"].sum()) < 10


def test_algorithm2_posterior_matches_quadrature_and_adapts(calibration, calibration_reference):
    model = _calibration_model(*calibration)
    idata, step = _sample_algorithm2(model)
    assert set(v.name for v in step.vars) == {"k_log__", "u_innovations"}
    _check_posterior(idata, calibration_reference)
    accept = float(idata.sample_stats["accepted"].mean())
    assert 0.1 < accept < 0.7, accept
    assert step.scaling != 0.1  # adapted during tuning


@LIKELIHOOD_MUTATIONS
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_posterior_checks_fail_with_mutated_likelihood(calibration, calibration_reference, factor):
    model = scale_likelihood(_calibration_model(*calibration), factor)
    with pytest.raises(AssertionError):
        _check_posterior(_sample_nuts(model), calibration_reference)
    if factor != 0.0:  # without data Algorithm 2 has no likelihood ratio to work with
        with pytest.raises(AssertionError):
            _check_posterior(_sample_algorithm2(model)[0], calibration_reference)


def test_algorithm2_compounds_with_nuts_and_pickles(calibration):
    ode, times, data = calibration
    with pm.Model():
        k = pm.LogNormal("k", 0.0, 0.5)
        u = ChkrebtiiSolution("u", ode, y0=[1.0], theta=pt.stack([k]), t_span=(0.0, 3.0), n_grid=16,
                              alpha=200.0, lam=0.4, times=times, output="mean")
        sigma = pm.HalfNormal("sigma", 0.05)
        pm.Normal("y", u, sigma, observed=data)
        step = ChkrebtiiMetropolis([k])
        clone = cloudpickle.loads(cloudpickle.dumps(step))
        assert clone.n_theta == 1 and clone.n_innov == 15
        idata = pm.sample(draws=300, tune=300, chains=1, step=[step], progressbar=False,
                          random_seed=3, compute_convergence_checks=False)
    assert {"k", "sigma", "u"} <= set(idata.posterior.data_vars)
    assert np.all(np.isfinite(idata.posterior["sigma"].values))


def test_algorithm2_random_walks_alpha_and_lam(calibration):
    # Issue 4: Algorithm 2 proposes theta "and alpha, lam"; a random lam recomputes the structure.
    ode, times, data = calibration
    with pm.Model():
        k = pm.LogNormal("k", 0.0, 0.5)
        alpha = pm.LogNormal("alpha", np.log(200.0), 0.5)
        lam = pm.LogNormal("lam", np.log(0.4), 0.3)
        u = ChkrebtiiSolution("u", ode, y0=[1.0], theta=pt.stack([k]), t_span=(0.0, 3.0), n_grid=16,
                              alpha=alpha, lam=lam, times=times)
        pm.Normal("y", u, 0.02, observed=data)
        step = ChkrebtiiMetropolis([k, alpha, lam])
        assert step.n_theta == 3
        idata = pm.sample(draws=300, tune=300, chains=1, step=step, progressbar=False,
                          random_seed=5, compute_convergence_checks=False)
    post = idata.posterior
    for name in ("k", "alpha", "lam"):
        values = post[name].values.reshape(-1)
        assert np.all(np.isfinite(values)) and np.unique(values).size > 10, name
    assert 0.05 < float(idata.sample_stats["accepted"].mean()) < 0.8


def test_parameter_lengths_checked_at_build_and_run_time(lv_ode):
    kw = dict(t_span=(0.0, 2.0), n_grid=11, alpha=10.0, lam=0.5, output="mean", times=[2.0])
    with pm.Model():
        with pytest.raises(ValueError, match=r"theta must have shape \(4,\)"):
            ChkrebtiiSolution("a", lv_ode, y0=[1.0, 0.5], theta=pm.HalfNormal("t3", shape=3), **kw)
        with pytest.raises(ValueError, match="y0"):
            ChkrebtiiSolution("b", lv_ode, y0=[1.0], theta=[1.0, 0.8, 0.6, 1.1], **kw)
    with pm.Model():
        theta = pm.Data("theta", np.array([1.0, 0.8, 0.6, 1.1]))  # static length unknown
        u = ChkrebtiiSolution("u", lv_ode, y0=[1.0, 0.5], theta=theta, **kw)
        assert np.all(np.isfinite(pm.draw(u)))
        theta.set_value(np.array([1.0, 0.8]))
        with pytest.raises(AssertionError):  # pinned length: never read past the end
            pm.draw(u)


def test_public_api_exports():
    from pymc_pnode.chkrebtii import ChkrebtiiReplicaMove, chkrebtii_sample
    from pymc_pnode.likelihoods import chkrebtii as lik

    assert pn.chkrebtii_sample is chkrebtii_sample is lik.chkrebtii_sample
    assert pn.ChkrebtiiSolution is ChkrebtiiSolution is lik.ChkrebtiiSolution
    assert pn.ChkrebtiiMetropolis is ChkrebtiiMetropolis is lik.ChkrebtiiMetropolis
    assert pn.DelayODE is DelayODE and pn.ChkrebtiiReplicaMove is ChkrebtiiReplicaMove


def test_metropolis_acceptance_is_the_papers_ratio(calibration):
    # The step's log target excludes the innovations' prior (it cancels with their proposal).
    model = _calibration_model(*calibration)
    with model:
        step = ChkrebtiiMetropolis([model["k"]])
    point = model.initial_point()
    q = np.concatenate([point["k_log__"].reshape(-1), point["u_innovations"].reshape(-1)])
    z = point["u_innovations"]
    full = model.compile_logp()(point)
    assert step.logp_fn(q) == pytest.approx(full + 0.5 * np.sum(z**2) + 0.5 * z.size * np.log(2 * np.pi))
    with model, pytest.raises(ValueError, match="innovations"):
        ChkrebtiiMetropolis([model["u_innovations"]])


def test_numba_backend_matches_default_backend(lv_ode):
    times = np.array([0.5, 1.0, 2.0])
    with pm.Model() as model:
        th = pm.LogNormal("th", np.log([1.0, 0.8, 0.6, 1.1]), 0.1, shape=4)
        lam = pm.LogNormal("lam", np.log(0.4), 0.2)
        u = ChkrebtiiSolution("u", lv_ode, y0=[1.0, 0.5], theta=th, t_span=(0, 3), n_grid=8,
                              alpha=20.0, lam=lam, times=times, noise="paper")
        pm.Normal("y", u, 0.1, observed=np.ones((3, 2)))
    point = model.initial_point()
    point["u_innovations"] = np.random.default_rng(0).standard_normal(point["u_innovations"].shape)
    ref = model.compile_logp()(point), model.compile_dlogp()(point)
    fast = model.compile_logp(mode="NUMBA")(point), model.compile_dlogp(mode="NUMBA")(point)
    assert fast[0] == pytest.approx(ref[0], rel=1e-12)
    np.testing.assert_allclose(fast[1], ref[1], rtol=1e-10, atol=1e-10)
    assert pytensor.config.mode is not None


def test_algorithm2_move_inside_parallel_tempering(calibration, calibration_reference):
    from pymc_pnode.chkrebtii import ChkrebtiiReplicaMove
    from pymc_pnode.sampling import ParallelTempering

    model = _calibration_model(*calibration)
    with model:
        move = ChkrebtiiReplicaMove()
        step = ParallelTempering(n_replicas=3, betas=[1.0, 0.5, 0.25], move=move)
        idata = pm.sample(draws=800, tune=600, chains=1, step=step, progressbar=False,
                          random_seed=4, compute_convergence_checks=False)
    _check_posterior(idata, calibration_reference)
    with model, pytest.raises(ValueError, match="innovations"):
        ChkrebtiiReplicaMove(vars=[model["k"]])
