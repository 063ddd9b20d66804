"""Fenrir with declared discontinuities of the vector field in t (``discontinuities=``): the likelihood of a
system driven by a switched input against the exact Gaussian log-likelihood of a piecewise reference solution,
exact gradients through the restarts, the segments the problem is split into, the warning without the
declaration, bad input and the PyMC block (predictive draws restart too)."""

import warnings

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from scipy.integrate import solve_ivp

import pymc_pnode as pn
from pymc_pnode.filtering.odefilter import DIFFUSION_LOCAL
from pymc_pnode.likelihoods.fenrir import FenrirProblem, StepControl

ON, OFF = 2.0, 5.0  # the input is switched on at t = 2 and off at t = 5
TIMES = np.linspace(0.25, 8.0, 32)  # observations at both switching times too
SIGMA = 0.1
Y0 = np.array([1.0, 0.0])
THETA = np.array([0.7, 3.0])


def _input(t, amplitude, where):
    return where((t >= ON) * (t < OFF), amplitude, 0.0)


def _field(y, t, p):
    """A driven two-compartment chain: y1' = -a y1 + u(t), y2' = y1 - y2 / 2, u = b on [2, 5)."""
    return [-p[0] * y[0] + _input(t, p[1], pt.switch), y[0] - 0.5 * y[1]]


def _field_np(t, y, p):
    return [-p[0] * y[0] + (p[1] if ON <= t < OFF else 0.0), y[0] - 0.5 * y[1]]


@pytest.fixture(scope="module")
def ode():
    return pn.ODE(_field, n_states=2, n_theta=2)


def reference(theta, y0=Y0, times=TIMES):
    """The solution at ``times`` (in (0, 8]), each smooth piece solved on its own to 1e-12."""
    out = np.empty((times.size, 2))
    y = np.asarray(y0, float)
    for a, b in [(0.0, ON), (ON, OFF), (OFF, TIMES[-1])]:
        sol = solve_ivp(_field_np, (a, b), y, args=(theta,), method="DOP853", rtol=1e-12, atol=1e-12,
                        dense_output=True)
        sel = (times > a) & (times <= b)
        out[sel] = sol.sol(times[sel]).T
        y = sol.y[:, -1]
    return out


DATA = reference(THETA) + SIGMA * np.random.default_rng(1).standard_normal((TIMES.size, 2))


def exact_loglik(theta, y0=Y0):
    resid = DATA - reference(theta, y0)
    return float(-0.5 * np.sum(resid**2) / SIGMA**2 - DATA.size * np.log(SIGMA * np.sqrt(2.0 * np.pi)))


@pytest.fixture(scope="module")
def compiled(ode):
    """Value and gradient (w.r.t. y0, θ and σ) of the Fenrir likelihood with the jumps declared: the defaults, a
    fixed step 0.005 with a fixed diffusion, and global calibration."""
    y0, theta, sigma = pt.vector("y0"), pt.vector("theta"), pt.scalar("sigma")
    out = {}
    for label, kwargs in [("defaults", {}), ("fixed step", dict(step=0.005, diffusion=1e-3)),
                          ("global", dict(diffusion="global"))]:
        ll = pn.fenrir_loglik(ode, y0, theta, TIMES, DATA, obs_sigma=sigma, discontinuities=[OFF, ON], **kwargs)
        out[label] = pytensor.function([y0, theta, sigma], [ll, *pytensor.grad(ll, [y0, theta, sigma])])
    return out


@pytest.mark.parametrize("theta", [[0.7, 3.0], [0.2, 0.5], [2.5, 8.0], [6.0, 1.0]])
def test_value_equals_exact_gaussian_loglik_of_the_piecewise_solution(compiled, theta):
    exact = exact_loglik(np.array(theta))
    for label in ("defaults", "fixed step"):
        value = compiled[label](Y0, theta, SIGMA)[0]
        assert abs(value - exact) < max(1e-3 * abs(exact), 0.05), (label, value, exact)


def test_gradient_through_the_restarts_equals_central_differences(compiled):
    point = [np.array([0.8, 0.3]), np.array([1.1, 2.0]), 0.12]
    for label in ("defaults", "fixed step", "global"):
        fn = compiled[label]
        _, *grads = fn(*point)
        for i, g in enumerate(grads):
            base = np.atleast_1d(np.asarray(point[i], float))
            for j in range(base.size):
                e = np.zeros(base.size)
                e[j] = 1e-6

                def at(x):
                    args = list(point)
                    args[i] = x if np.ndim(point[i]) else float(x[0])
                    return fn(*args)[0]

                fd = (at(base + e) - at(base - e)) / 2e-6
                assert np.atleast_1d(g)[j] == pytest.approx(fd, rel=1e-5, abs=1e-6), (label, i, j)


def test_segments_restart_around_each_discontinuity(ode):
    span = TIMES[-1]
    problem = FenrirProblem.build(ode, TIMES, DATA.shape, None, 1, pn.EK1(3), StepControl(),
                                  DIFFUSION_LOCAL, discontinuities=[OFF, 9.0, ON, ON, 0.0])
    grids = [s.grid for s in problem.segments]
    assert len(grids) == 3  # 9 and 0 lie outside (t0, times[-1]); the repeated 2 counts once
    assert grids[0][0] == 0.0 and grids[2][-1] == span
    for end, start, t_d in [(grids[0][-1], grids[1][0], ON), (grids[1][-1], grids[2][0], OFF)]:
        assert t_d - 1e-8 < end < t_d < start < t_d + 1e-8
    rows = np.concatenate([s.obs_at[s.obs_at >= 0] for s in problem.segments])
    np.testing.assert_array_equal(rows, np.arange(TIMES.size))  # every observation once, in order
    at_on = int(np.flatnonzero(TIMES == ON)[0])
    assert problem.segments[0].obs_at[-1] == at_on  # an observation at a jump closes the segment before it
    fixed = FenrirProblem.build(ode, TIMES, DATA.shape, None, 1, pn.EK1(3), StepControl(step=0.1), DIFFUSION_LOCAL,
                                discontinuities=[ON, OFF])
    for segment in fixed.segments:
        assert np.all(np.diff(segment.grid) <= 0.1 + 1e-12)


@pytest.mark.parametrize("theta", [[0.7, 3.0], [6.0, 1.0]])
def test_an_undeclared_jump_gives_minus_infinity_and_says_where(ode, theta):
    """Without the declaration the controller can shrink its step until the jump passes the tolerance, and the
    likelihood was then finite and wrong (-25434 against the exact -21075 at θ = (6, 1), before the check)."""
    problem = FenrirProblem.build(ode, TIMES, DATA.shape, None, 1, pn.EK1(3), StepControl(), DIFFUSION_LOCAL)
    with pytest.warns(pn.AccuracyWarning, match=r"jump of the vector field in t.*discontinuities=\[\.\.\.\]"):
        terms, _ = problem.evaluate(Y0, theta, DATA, SIGMA, 1.0)
    assert np.all(terms == -np.inf)
    stopped_at = float(problem.diagnostics.last_failure.rsplit("at t = ", 1)[1])
    assert abs(stopped_at - ON) < 1e-3  # where the input is switched on (printed to 6 digits)


def test_smooth_fast_solutions_are_not_taken_for_jumps():
    """The jump check fires only where f changes in t at fixed y: a stiff relaxation oscillation (Van der Pol,
    μ = 100) with steps 1000 times shorter in its fast phases, and a fast but smooth forcing, solve."""
    vdp = pn.ODE(lambda y, t, p: [y[1], p[0] * (1 - y[0] ** 2) * y[1] - y[0]], n_states=2, n_theta=1)
    sol = pn.solve(vdp, [2.0, 0.0], [100.0], (0.0, 200.0), rtol=1e-4, atol=1e-6, diffusion="local")
    assert sol.success and np.diff(sol.run.grid).min() < 1e-3 * np.diff(sol.run.grid).max()
    forced = pn.ODE(lambda y, t, p: [-y[0] + pt.tanh(p[0] * (t - 1.0))], n_states=1, n_theta=1)
    assert pn.solve(forced, [0.0], [1e3], (0.0, 2.0), rtol=1e-6, atol=1e-9, diffusion="local").success


@pytest.mark.parametrize("bad, match", [([1.0, np.nan], "discontinuities must be finite"),
                                        ("soon", "discontinuities"),
                                        ([[1.0, 2.0]], "discontinuities must be a 1-d"),
                                        ([2.0 + 1e-9], "only 1e-09 apart")])
def test_bad_discontinuities_raise_naming_the_argument(ode, bad, match):
    with pytest.raises(ValueError, match=match):
        pn.fenrir_loglik(ode, Y0, THETA, TIMES, DATA, obs_sigma=SIGMA, discontinuities=bad)


def test_pymc_block_with_discontinuities_has_finite_logp_and_predictive_draws(ode):
    with pm.Model() as model:
        theta = pm.LogNormal("theta", mu=np.log(THETA), sigma=0.2, shape=2)
        pn.Fenrir("y", ode, y0=Y0, theta=theta, times=TIMES, observed=DATA, obs_sigma=SIGMA,
                  discontinuities=[ON, OFF])
    point = model.initial_point()
    logp = model.compile_logp()(point)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pn.AccuracyWarning)
        direct = pn.fenrir_loglik(ode, Y0, np.exp(point["theta_log__"]), TIMES, DATA, obs_sigma=SIGMA,
                                  discontinuities=[ON, OFF]).eval()
    prior = pm.logp(model["theta"], np.exp(point["theta_log__"])).sum().eval() + point["theta_log__"].sum()
    assert logp == pytest.approx(direct + prior, rel=1e-10)
    draws = pm.draw(model["y"], draws=3, random_seed=2)
    assert draws.shape == (3,) + DATA.shape and np.all(np.isfinite(draws))
    # the draws follow the switched solution: well above the input-free decay while the input is on
    on = (TIMES > ON + 0.5) & (TIMES < OFF)
    assert np.all(draws[:, on, 0].mean(axis=0) > reference(THETA)[on, 0] - 0.5)
    assert np.all(reference(THETA)[on, 0] > 1.0)


def test_solve_restarts_at_declared_jumps(ode):
    """``pn.solve(discontinuities=...)``: the piecewise solution agrees with the reference to the tolerance, output
    times at the jumps included; samples, dense output, the joint covariance (block-diagonal over the segments) and
    the dataset have the shapes of the output times; without the declaration the solve stops at the first jump."""
    stopped = pn.solve(ode, Y0, THETA, (0.0, TIMES[-1]), rtol=1e-8, atol=1e-10, save_at=TIMES)
    assert not stopped.success and "jump of the vector field in t" in stopped.stats["message"]
    sol = pn.solve(ode, Y0, THETA, (0.0, TIMES[-1]), rtol=1e-8, atol=1e-10, save_at=TIMES, discontinuities=[ON, OFF])
    assert isinstance(sol, pn.PiecewiseSolution) and sol.success and len(sol.pieces) == 3
    np.testing.assert_array_equal(sol.t, TIMES)
    np.testing.assert_allclose(sol.mean, reference(THETA), rtol=0, atol=1e-6)
    assert sol.std.shape == sol.mean.shape and np.all(sol.std >= 0) and np.all(sol.std < 1e-4)
    assert sol.sample(4, rng=0).shape == (4, TIMES.size, 2)
    joint = sol.joint_cov()
    first, second = np.flatnonzero(TIMES <= ON), np.flatnonzero((TIMES > ON) & (TIMES <= OFF))
    assert np.all(joint[np.ix_(first, [0, 1], second, [0, 1])] == 0.0)  # independent segments
    np.testing.assert_allclose(np.einsum("titi->ti", joint), sol.std**2, rtol=1e-8, atol=1e-300)
    dense_t = np.array([1.0, 3.3, 7.9])
    mean, cov = sol.interpolate(dense_t)
    np.testing.assert_allclose(mean, reference(THETA, times=dense_t), rtol=0, atol=1e-5)
    assert cov.shape == (3, 2, 2) and sol.to_xarray()["mean"].shape == (TIMES.size, 2)
    every_step = pn.solve(ode, Y0, THETA, (0.0, TIMES[-1]), discontinuities=[ON, OFF])
    assert every_step.success and np.all(np.diff(every_step.t) > 0)
    assert every_step.stats["n_steps"] == sum(p.stats["n_steps"] for p, _ in every_step.pieces)
