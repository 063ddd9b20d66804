"""Jumps of the state at declared discontinuities (``jumps=``, a bolus dose) in every solver that restarts there:
``pn.solve``, the Fenrir likelihood, ``pn.probabilistic_solution``, ``pn.DifferentialEquation``, the Chkrebtii layer
and sampler, ``pn.posterior_trajectories``. Test problem: oral dosing, one compartment (gut → central →
elimination), a first dose in ``y0`` and three more, of different sizes, into the gut."""

import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from scipy.integrate import solve_ivp

import pymc_pnode as pn
from tests.conftest import central_differences

DOSES = np.array([4.0, 8.0, 12.0])
JUMPS = np.array([[1.0, 0.0], [0.5, 0.0], [1.5, 0.0]])
Y0 = np.array([1.0, 0.0])
THETA = np.array([1.2, 0.3])  # absorption and elimination rates
TIMES = np.linspace(0.5, 16.0, 32)  # observed at every dose time too: the state before the dose
SIGMA = 0.02


def _oral(y, t, p):
    return [-p[0] * y[0], p[0] * y[0] - p[1] * y[1]]


@pytest.fixture(scope="module")
def ode():
    return pn.ODE(_oral, n_states=2, n_theta=2)


def reference(theta, y0=Y0, jumps=JUMPS, times=TIMES) -> np.ndarray:
    """The exact solution at ``times`` (the state before the jump at a dose time), segment by segment."""
    edges = np.concatenate([[0.0], DOSES, [max(times[-1], DOSES[-1])]])
    y, out = np.array(y0, dtype=float), np.empty((times.size, 2))
    for s in range(DOSES.size + 1):
        a, b = edges[s], edges[s + 1]
        rows = (times > a if s else times >= a) & (times <= b)
        sol = solve_ivp(lambda t, x: _oral(x, t, theta), (a, b), y, rtol=1e-12, atol=1e-13, dense_output=True)
        out[rows] = sol.sol(times[rows]).T
        y = sol.y[:, -1] + (jumps[s] if s < DOSES.size else 0.0)
    return out


DATA = reference(THETA)[:, 1:] + SIGMA * np.random.default_rng(1).standard_normal((TIMES.size, 1))


def exact_loglik(theta, y0=Y0, jumps=JUMPS) -> float:
    mean = reference(theta, y0, jumps)[:, 1]
    return float(-0.5 * np.sum(((DATA[:, 0] - mean) / SIGMA) ** 2 + np.log(2 * np.pi * SIGMA**2)))


def _central(f, x, eps=1e-6):
    x = np.asarray(x, dtype=float)
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = eps
        grad[i] = (f(x + e) - f(x - e)) / (2 * eps)
    return grad


def test_solve_adds_the_jumps_at_the_restarts(ode):
    sol = pn.solve(ode, Y0, THETA, (0.0, 16.0), save_at=TIMES, discontinuities=DOSES, jumps=JUMPS)
    assert sol.success
    np.testing.assert_allclose(sol.mean, reference(THETA), atol=1e-6)  # 1.6e-8 measured
    assert sol.mean[TIMES == DOSES[1], 0] < 0.05  # before the second dose the gut is almost empty
    # zero jumps are the restarts alone
    zero = pn.solve(ode, Y0, THETA, (0.0, 16.0), save_at=TIMES, discontinuities=DOSES, jumps=np.zeros((3, 2)))
    plain = pn.solve(ode, Y0, THETA, (0.0, 16.0), save_at=TIMES, discontinuities=DOSES)
    np.testing.assert_array_equal(zero.mean, plain.mean)
    assert np.abs(zero.mean - sol.mean).max() > 0.5


def _fenrir_function(ode, **settings):
    y0, theta, sigma, jumps = pt.dvector("y0"), pt.dvector("theta"), pt.dscalar("sigma"), pt.dmatrix("jumps")
    ll = pn.fenrir_loglik(ode, y0, theta, TIMES, DATA, obs_matrix=[[0.0, 1.0]], obs_sigma=sigma,
                          discontinuities=DOSES, jumps=jumps, **settings)
    return pytensor.function([y0, theta, sigma, jumps], [ll, *pt.grad(ll, [y0, theta, sigma, jumps])])


def test_fenrir_with_jumps_is_the_exact_likelihood_with_exact_gradients(ode):
    value = _fenrir_function(ode)(Y0, THETA, SIGMA, JUMPS)[0]  # the defaults: error control, local diffusion
    assert value == pytest.approx(exact_loglik(THETA), abs=1e-3)  # 1e-6 nats measured
    assert exact_loglik(THETA, jumps=0.9 * JUMPS) < exact_loglik(THETA) - 100  # the jumps matter to the data
    # exact gradients for a fixed grid, in y0, θ, σ and every jump
    f = _fenrir_function(ode, step=0.05)
    ll, g_y0, g_theta, g_sigma, g_jumps = f(Y0, THETA, SIGMA, JUMPS)
    fd_y0, fd_theta = central_differences(lambda y, th: f(y, th, SIGMA, JUMPS)[0], Y0, THETA)
    fd_jumps = _central(lambda j: f(Y0, THETA, SIGMA, j)[0], JUMPS)
    fd_sigma = _central(lambda s: f(Y0, THETA, s, JUMPS)[0], SIGMA)
    for grad, fd in ((g_y0, fd_y0), (g_theta, fd_theta), (g_jumps, fd_jumps), (g_sigma, fd_sigma)):
        np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-5 * np.abs(fd).max())
    assert np.abs(g_jumps[:, 0]).min() > 1.0  # every dose moves the likelihood


def test_probabilistic_solution_with_jumps_equals_solve_and_has_exact_gradients(ode):
    y0, theta, jumps = pt.dvector("y0"), pt.dvector("theta"), pt.dmatrix("jumps")
    fixed = dict(step=0.05, rtol=1e-4, atol=1e-6, smooth=True, discontinuities=DOSES)  # within the tolerances
    mean, std, cov = pn.probabilistic_solution(ode, y0, theta, TIMES, joint_cov=True, jumps=jumps, **fixed)
    weights = np.random.default_rng(3).standard_normal((2, TIMES.size, 2))
    objective = pt.sum(weights[0] * mean) + pt.sum(weights[1] * pt.log(std))
    f = pytensor.function([y0, theta, jumps], [mean, std, cov, objective, pt.grad(objective, jumps)])
    m, s, c, _, g_jumps = f(Y0, THETA, JUMPS)
    sol = pn.solve(ode, Y0, THETA, (0.0, 16.0), save_at=TIMES, jumps=JUMPS, **fixed)
    np.testing.assert_array_equal(m, sol.mean)
    np.testing.assert_array_equal(s, sol.std)
    np.testing.assert_array_equal(c, sol.joint_cov().reshape(c.shape))
    np.testing.assert_allclose(m, reference(THETA), atol=1e-5)
    fd = _central(lambda j: f(Y0, THETA, j)[3], JUMPS)
    np.testing.assert_allclose(g_jumps, fd, rtol=1e-6, atol=1e-6 * np.abs(fd).max())


def test_differential_equation_restarts_with_the_jumps(ode):
    """The pm.ode drop-in (Dormand–Prince with adjoints) takes the same declaration: exact values and gradients."""
    solution = pn.DifferentialEquation(ode, TIMES, discontinuities=DOSES)
    theta, jumps = pt.dvector("theta"), pt.dmatrix("jumps")
    ys = solution(y0=Y0, theta=theta, jumps=jumps)
    weights = np.random.default_rng(4).standard_normal((TIMES.size, 2))
    objective = pt.sum(weights * ys)
    f = pytensor.function([theta, jumps], [ys, objective, *pt.grad(objective, [theta, jumps])])
    values, _, g_theta, g_jumps = f(THETA, JUMPS)
    np.testing.assert_allclose(values, reference(THETA), atol=1e-6)
    fd_theta = _central(lambda th: f(th, JUMPS)[1], THETA)
    fd_jumps = _central(lambda j: f(THETA, j)[1], JUMPS)
    for grad, fd in ((g_theta, fd_theta), (g_jumps, fd_jumps)):
        np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-5 * np.abs(fd).max())
    # without jumps the restarts change nothing but the grid
    plain = pn.DifferentialEquation(ode, TIMES)(y0=Y0, theta=THETA).eval()
    restarted = solution(y0=Y0, theta=THETA).eval()
    np.testing.assert_allclose(restarted, plain, atol=1e-6)
    with pytest.raises(ValueError, match="jumps needs discontinuities"):
        pn.DifferentialEquation(ode, TIMES)(y0=Y0, theta=THETA, jumps=JUMPS)


def test_chkrebtii_layer_and_sampler_add_the_jumps(ode):
    kw = dict(t_span=(0.0, 16.0), times=TIMES, alpha=100.0, lam=0.3, discontinuities=DOSES, jumps=JUMPS)
    with pm.Model() as model:
        u = pn.ChkrebtiiSolution("u", ode, y0=Y0, theta=THETA, n_grid=321, output="mean", **kw)
    z = model["u_innovations"]
    mean = pytensor.function([z], u)(np.zeros(z.type.shape))
    np.testing.assert_allclose(mean, reference(THETA), atol=2e-3)  # grid spacing 0.05
    # the forward sampler is the layer at the innovations its generator gives
    draws = pn.chkrebtii_sample(ode, Y0, THETA, n_grid=65, size=2, rng=11, **kw)
    with pm.Model() as model:
        u = pn.ChkrebtiiSolution("u", ode, y0=Y0, theta=THETA, n_grid=65, **kw)
    z = model["u_innovations"]
    layer = pytensor.function([z], u)
    innovations = np.random.default_rng(11).standard_normal((2,) + z.type.shape)
    for b in range(2):
        np.testing.assert_allclose(draws[b], layer(innovations[b]), rtol=1e-12, atol=1e-12)
    # a random dose: the realisation is differentiable in it
    jumps = pt.dmatrix("jumps")
    with pm.Model() as model:
        u = pn.ChkrebtiiSolution("u", ode, y0=Y0, theta=THETA, n_grid=65, **{**kw, "jumps": jumps})
    z = model["u_innovations"]
    point = 0.3 * np.random.default_rng(2).standard_normal(z.type.shape)
    objective = pytensor.function([jumps, z], [u.sum(), pt.grad(u.sum(), jumps)])
    fd = _central(lambda j: objective(j, point)[0], JUMPS)
    np.testing.assert_allclose(objective(JUMPS, point)[1], fd, rtol=1e-6, atol=1e-8)


def test_a_random_dose_in_a_model(ode):
    """Bioavailability F scales every dose: exact model gradients, predictive draws, posterior trajectories."""
    with pm.Model() as model:
        f_bio = pm.Beta("F", 8.0, 2.0)
        rates = pm.LogNormal("rates", np.log(THETA), 0.3, shape=2)
        jumps = pm.Deterministic("jumps", f_bio * pt.as_tensor_variable(JUMPS))
        pn.Fenrir("c", ode, y0=f_bio * pt.as_tensor_variable(Y0), theta=rates, times=TIMES, observed=DATA,
                  obs_matrix=[[0.0, 1.0]], obs_sigma=SIGMA, discontinuities=DOSES, jumps=jumps, step=0.05,
                  check_accuracy=False)
    logp, dlogp = model.compile_logp(), model.compile_dlogp()
    point = model.initial_point()
    x = np.concatenate([point["F_logodds__"].ravel(), point["rates_log__"]])

    def at(v):
        return {"F_logodds__": np.array(v[0]), "rates_log__": v[1:]}

    fd = _central(lambda v: logp(at(v)), x)
    np.testing.assert_allclose(dlogp(at(x)), fd, rtol=1e-5, atol=1e-5 * np.abs(fd).max())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prior = pm.sample_prior_predictive(3, model=model, random_seed=1)
    assert prior.prior_predictive["c"].shape == (1, 3, TIMES.size, 1)
    assert np.all(np.isfinite(prior.prior_predictive["c"].values))
    # posterior trajectories take the jumps as a posterior variable
    idata = az.from_dict(posterior={"rates": np.tile(THETA, (1, 2, 1)), "jumps": np.tile(JUMPS, (1, 2, 1, 1))})
    traj = pn.posterior_trajectories(idata, ode, y0=Y0, theta="rates", t_span=(0.0, 16.0), times=TIMES,
                                     discontinuities=DOSES, jumps="jumps", progressbar=False)
    np.testing.assert_allclose(traj["mean"].values[0], reference(THETA), atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(jumps=JUMPS), "jumps needs discontinuities"),
        (dict(discontinuities=DOSES, jumps=JUMPS[:2]), r"jumps must have shape \(3, 2\)"),
        (dict(discontinuities=DOSES[::-1], jumps=JUMPS), "strictly increasing when jumps are given"),
        (dict(discontinuities=[0.0, 8.0, 12.0], jumps=JUMPS), "must lie after t0"),
        (dict(discontinuities=DOSES, jumps=np.full((3, 2), np.nan)), "jumps must be finite"),
        (dict(discontinuities=DOSES, jumps=pt.dmatrix("j", shape=(2, 2))), r"jumps must have shape \(3, 2\)"),
    ],
)
def test_bad_jumps_raise_naming_the_argument(ode, kwargs, match):
    with pytest.raises(ValueError, match=match):
        pn.fenrir_loglik(ode, Y0, THETA, TIMES, DATA, obs_matrix=[[0.0, 1.0]], obs_sigma=SIGMA, **kwargs)
    with pytest.raises(ValueError, match=match):
        pn.probabilistic_solution(ode, Y0, THETA, TIMES, **kwargs)
    if not isinstance(kwargs["jumps"], pt.TensorVariable):
        with pytest.raises(ValueError, match=match):
            pn.solve(ode, Y0, THETA, (0.0, 16.0), **kwargs)
        with pytest.raises(ValueError, match=match):
            pn.chkrebtii_sample(ode, Y0, THETA, t_span=(0.0, 16.0), n_grid=33, alpha=1.0, lam=0.5, **kwargs)


def test_jumps_after_the_last_observation_are_dropped(ode):
    """A dose after the data changes nothing observed: dropped with its row, whatever its size."""
    times = TIMES[TIMES <= 10.0]
    values = [float(pn.fenrir_loglik(ode, Y0, THETA, times, DATA[: times.size], obs_matrix=[[0.0, 1.0]],
                                     obs_sigma=SIGMA, discontinuities=DOSES, jumps=jumps).eval())
              for jumps in (JUMPS, np.array([[1.0, 0.0], [0.5, 0.0], [100.0, 0.0]]))]
    assert values[0] == values[1]
