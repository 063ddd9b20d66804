"""Single-shooting RK least squares: exact gradients, recovery, failures, bad input."""

import numpy as np
import pytest

import pymc_pnode as pn
from pymc_pnode.baselines import integrate, least_squares_objective, rk_least_squares


def lotka_volterra(y, t, p):
    return [-p[0] * y[0] + p[1] * y[0] * y[1], p[2] * y[1] - p[3] * y[0] * y[1]]


def stiff_chain(y, t, p):
    # Fast equilibration (rate 1000 p[1]) next to slow decay: stiff for explicit solvers.
    return [-p[0] * y[0] + 1000.0 * p[1] * (y[1] - y[0]), 1000.0 * p[1] * (y[0] - y[1]) - y[1]]


@pytest.fixture(scope="module")
def lv():
    return pn.ODE(lotka_volterra, n_states=2, n_theta=4)


@pytest.fixture(scope="module")
def lv_data(lv):
    times = np.arange(11.0)
    clean = integrate(lv, [0.4, 1.0], [1, 1, 1, 1], times, rtol=1e-10, atol=1e-12).y
    rng = np.random.default_rng(20240601)
    return times, clean, clean + 0.05 * rng.standard_normal(clean.shape)


def test_objective_gradient_matches_central_differences(lv, lv_data):
    times, _, data = lv_data
    theta = np.array([0.9, 1.1, 0.95, 1.05])
    y0 = np.array([0.45, 0.9])
    kw = dict(rtol=1e-11, atol=1e-13, obs_matrix=[[1.0, 0.0], [0.3, 1.0]], obs_sigma=[0.05, 0.1])
    data = data.copy()
    data[3, 1] = np.nan  # a missing value is skipped
    value, g_theta, g_y0 = least_squares_objective(lv, data, times, theta, y0, **kw)
    assert np.isfinite(value)
    eps = 1e-6
    for i in range(4):
        e = np.zeros(4)
        e[i] = eps
        fd = (least_squares_objective(lv, data, times, theta + e, y0, **kw)[0]
              - least_squares_objective(lv, data, times, theta - e, y0, **kw)[0]) / (2 * eps)
        assert g_theta[i] == pytest.approx(fd, rel=1e-6, abs=1e-6)
    for i in range(2):
        e = np.zeros(2)
        e[i] = eps
        fd = (least_squares_objective(lv, data, times, theta, y0 + e, **kw)[0]
              - least_squares_objective(lv, data, times, theta, y0 - e, **kw)[0]) / (2 * eps)
        assert g_y0[i] == pytest.approx(fd, rel=1e-6, abs=1e-6)


def test_recovers_parameters_from_noise_free_data(lv, lv_data):
    times, clean, _ = lv_data
    res = rk_least_squares(lv, clean, times, theta0=[0.8, 0.8, 0.8, 0.8], log_theta=True,
                           rtol=1e-10, atol=1e-12)
    assert res.converged, res.message
    np.testing.assert_allclose(res.theta, 1.0, atol=1e-4)
    np.testing.assert_allclose(res.y0, [0.4, 1.0], atol=1e-4)
    assert res.objective < 1e-8
    assert res.extra["trajectory"].shape == (11, 2)
    assert res.method == "rk_least_squares" and res.wall_time > 0 and res.n_iterations > 0


def test_noisy_fit_with_fixed_y0_and_bounds(lv, lv_data):
    times, _, data = lv_data
    res = rk_least_squares(lv, data, times, theta0=[0.8, 0.8, 0.8, 0.8], y0=[0.4, 1.0],
                           bounds=[(0.1, 5.0)] * 4)
    assert res.converged, res.message
    np.testing.assert_allclose(res.theta, 1.0, atol=0.1)
    np.testing.assert_array_equal(res.y0, [0.4, 1.0])  # not fitted
    # A tight upper bound is respected.
    capped = rk_least_squares(lv, data, times, theta0=[0.8, 0.8, 0.8, 0.8], y0=[0.4, 1.0],
                              bounds=[(0.1, 0.9)] + [(0.1, 5.0)] * 3, log_theta=True)
    assert capped.theta[0] <= 0.9 + 1e-12


def test_stiff_problem_with_radau():
    ode = pn.ODE(stiff_chain, n_states=2, n_theta=2)
    times = np.linspace(0.0, 3.0, 16)[1:]
    truth = np.array([0.8, 0.5])
    clean = integrate(ode, [1.0, 0.0], truth, times, method="Radau", rtol=1e-10, atol=1e-12).y
    res = rk_least_squares(ode, clean[:, :1], times, theta0=[0.4, 1.0], y0=[1.0, 0.0],
                           obs_matrix=[[1.0, 0.0]], method="Radau", log_theta=True,
                           rtol=1e-6, atol=1e-8)
    assert res.converged, res.message
    assert res.theta[0] == pytest.approx(0.8, rel=1e-3)


def test_pole_at_initial_guess_is_reported(lv, lv_data):
    # notes 001 §4.3: from p0 = (0.5, 0.5, 0.5, -0.2) the solution has a pole near t = 3.3.
    times, _, data = lv_data
    res = rk_least_squares(lv, data, times, theta0=[0.5, 0.5, 0.5, -0.2])
    assert not res.converged
    assert "initial guess" in res.message and "t = 3." in res.message
    assert res.objective == np.inf


def test_bad_input(lv, lv_data):
    times, _, data = lv_data
    ok = dict(theta0=[1, 1, 1, 1])
    with pytest.raises(ValueError, match="data"):
        rk_least_squares(lv, data[:, :1], times, **ok)
    with pytest.raises(ValueError, match="times"):
        rk_least_squares(lv, data, times[::-1], **ok)
    with pytest.raises(ValueError, match="theta0"):
        rk_least_squares(lv, data, times, theta0=[1, 1])
    with pytest.raises(ValueError, match="method"):
        rk_least_squares(lv, data, times, method="rk4", **ok)
    with pytest.raises(ValueError, match="log_theta"):
        rk_least_squares(lv, data, times, theta0=[1, 1, 1, -1], log_theta=True)
    with pytest.raises(ValueError, match="bounds"):
        rk_least_squares(lv, data, times, bounds=[(2, 3)] * 4, **ok)
    with pytest.raises(ValueError, match="obs_sigma"):
        rk_least_squares(lv, data, times, obs_sigma=-1.0, **ok)
    with pytest.raises(ValueError, match="y0 is required"):
        rk_least_squares(lv, data[:, :1], times, obs_matrix=[[1, 0]], **ok)
    with pytest.raises(ValueError, match="rtol"):
        rk_least_squares(lv, data, times, rtol=0.0, **ok)


def riccati(y, t, p):
    # y' = p y^2 has a pole at t = 1 / (p y0): large trial values of p make the solve fail.
    return [p[0] * y[0] * y[0]]


def test_failed_trial_points_are_rejected_and_the_fit_recovers():
    ode = pn.ODE(riccati, n_states=1, n_theta=1)
    times = np.linspace(0.5, 10.0, 20)
    clean = integrate(ode, [1.0], [0.08], times).y
    res = rk_least_squares(ode, clean, times, theta0=[0.01], y0=[1.0])
    assert res.extra["n_failed_solves"] >= 1  # L-BFGS-B's first step runs into the pole
    assert res.converged, res.message
    assert res.theta[0] == pytest.approx(0.08, rel=1e-5)
    # An exhausted evaluation budget is a reported failure too.
    starved = rk_least_squares(ode, clean, times, theta0=[0.01], y0=[1.0], max_nfev=20)
    assert not starved.converged and "max_nfev" in starved.message
