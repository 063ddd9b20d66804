"""The direct method (Raziperchikolaei & Bhat): objective derivatives, discretisation, recovery."""

import numpy as np
import pytest

import pymc_pnode as pn
from pymc_pnode.baselines import (
    DirectMethodObjective,
    adams_bashforth_predict,
    direct_method,
    integrate,
)
from pymc_pnode.baselines.direct_method import ADAMS_BASHFORTH, ABGrid, discretization_objective


def lotka_volterra(y, t, p):
    # The direct-method paper's convention (notes 003 eq. (16)).
    return [p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]]


def decay(y, t, p):
    return [-p[0] * y[0] + 0.1 * t]


@pytest.fixture(scope="module")
def lv():
    return pn.ODE(lotka_volterra, n_states=2, n_theta=4)


@pytest.fixture(scope="module")
def lv_data(lv):
    times = np.linspace(0.0, 2.0, 101)
    clean = integrate(lv, [5.0, 3.0], [2, 1, 4, 1], times, rtol=1e-10, atol=1e-12).y
    rng = np.random.default_rng(3)
    return times, clean, clean + 0.1 * rng.standard_normal(clean.shape)


@pytest.mark.parametrize("order", [1, 2, 3, 4, 5])
def test_objective_gradients_match_central_differences(lv, lv_data, order):
    times, _, data = lv_data
    obj = DirectMethodObjective(lv, times[:12], order)
    x = data[:12].copy()
    theta = np.array([2.2, 0.9, 3.5, 1.3])
    v, gx = obj.value_and_grad_x(x, theta)
    v2, gt = obj.value_and_grad_theta(x, theta)
    assert v == pytest.approx(v2) and v == pytest.approx(obj.value(x, theta))
    eps = 1e-6
    for i, a in [(0, 0), (1, 1), (5, 0), (10, 1), (11, 0)]:
        xp, xm = x.copy(), x.copy()
        xp[i, a] += eps
        xm[i, a] -= eps
        assert gx[i, a] == pytest.approx((obj.value(xp, theta) - obj.value(xm, theta)) / (2 * eps),
                                         rel=1e-6, abs=1e-6)
    for c in range(4):
        e = np.zeros(4)
        e[c] = eps
        fd = (obj.value(x, theta + e) - obj.value(x, theta - e)) / (2 * eps)
        assert gt[c] == pytest.approx(fd, rel=1e-6, abs=1e-6)


def test_fast_binding_agrees_with_dispatcher(lv, lv_data):
    times, _, data = lv_data
    obj = DirectMethodObjective(lv, times, 3)
    theta = np.array([2.0, 1.0, 4.0, 1.0])
    gx = np.zeros_like(data)
    gt = np.zeros(4)
    grid = ABGrid(np.ascontiguousarray(times), np.diff(times), 3, ADAMS_BASHFORTH)
    ref = discretization_objective(*lv.field_addresses, np.ascontiguousarray(data), theta, grid, gx, gt)
    assert obj.value(data, theta) == ref
    np.testing.assert_array_equal(obj.value_and_grad_x(data, theta)[1], gx)
    np.testing.assert_array_equal(obj.value_and_grad_theta(data, theta)[1], gt)


def test_prediction_is_the_discretisation_and_zeroes_the_objective():
    ode = pn.ODE(decay, n_states=1, n_theta=1)
    times = np.linspace(0.0, 1.0, 11)
    h, a = 0.1, 0.7
    euler = adams_bashforth_predict(ode, [1.0], [a], times, order=1)
    expected = [1.0]
    for i in range(10):
        expected.append(expected[-1] + h * (-a * expected[-1] + 0.1 * times[i]))
    np.testing.assert_allclose(euler[:, 0], expected, rtol=1e-14)
    ab3 = adams_bashforth_predict(ode, [1.0], [a], times, order=3)
    f = lambda i: -a * ab3[i, 0] + 0.1 * times[i]  # noqa: E731
    assert ab3[1, 0] == pytest.approx(ab3[0, 0] + h * f(0))  # start-up: Euler, then AB2
    assert ab3[2, 0] == pytest.approx(ab3[1, 0] + h * (1.5 * f(1) - 0.5 * f(0)))
    assert ab3[5, 0] == pytest.approx(ab3[4, 0] + h * (23 * f(4) - 16 * f(3) + 5 * f(2)) / 12)
    # Theorem 1: every predicted trajectory is an exact minimiser, E = 0.
    for order, pred in [(1, euler), (3, ab3)]:
        assert DirectMethodObjective(ode, times, order).value(pred, [a]) < 1e-28
    # AB3 is more accurate than Euler against the exact solution (its error is mostly the
    # Euler start-up step's).
    exact = integrate(ode, [1.0], [a], times, rtol=1e-12, atol=1e-14).y[:, 0]
    assert np.max(np.abs(ab3[:, 0] - exact)) < 0.3 * np.max(np.abs(euler[:, 0] - exact))


def test_recovers_lotka_volterra(lv, lv_data):
    times, clean, data = lv_data
    res = direct_method(lv, data, times, theta0=[2.0, 2.0, 5.0, 2.0], lam=1.0, order=3)
    assert res.converged, res.message
    np.testing.assert_allclose(res.theta, [2, 1, 4, 1], rtol=0.08)
    filtered = res.extra["filtered_states"]
    predicted = res.extra["predicted_states"]
    # The filtered and predicted states are much closer to the truth than the observations.
    noise = np.linalg.norm(data - clean)
    assert np.linalg.norm(filtered - clean) < 0.5 * noise
    assert np.linalg.norm(predicted - clean) < 0.5 * noise
    history = res.extra["objective_history"]
    assert history.size == res.n_iterations and np.all(np.diff(history) <= 1e-12)  # descent, eq. (14)
    assert res.method == "direct_method[AB3]"


def test_lam_zero_jumps_to_a_discrete_trajectory_and_stops(lv, lv_data):
    # notes 003 §3.3/E3: without the proximal term the state step reaches E = 0 and the method
    # stops almost at once, with states far from the data.
    times, clean, data = lv_data
    short = slice(0, 41)
    res = direct_method(lv, data[short], times[short], theta0=[2.0, 2.0, 5.0, 2.0], lam=0.0,
                        max_iter=50)
    assert res.converged and res.n_iterations <= 5
    assert res.objective < 1e-6


def test_iteration_limit_is_reported(lv, lv_data):
    times, _, data = lv_data
    res = direct_method(lv, data, times, theta0=[2.0, 2.0, 5.0, 2.0], max_iter=3, order=1,
                        progress=True)
    assert not res.converged and "maximum number of iterations" in res.message
    assert res.n_iterations == 3 and res.method == "direct_method[Euler]"


def test_bad_input(lv, lv_data):
    times, _, data = lv_data
    ok = dict(theta0=[2.0, 2.0, 5.0, 2.0])
    with pytest.raises(ValueError, match="lam"):
        direct_method(lv, data, times, lam=-1.0, **ok)
    with pytest.raises(ValueError, match="order"):
        direct_method(lv, data, times, order=6, **ok)
    with pytest.raises(ValueError, match="NaN"):
        bad = data.copy()
        bad[4, 0] = np.nan
        direct_method(lv, bad, times, **ok)
    uneven = np.sort(np.concatenate([times[:-1], [times[-2] + 0.001]]))
    with pytest.raises(ValueError, match="equally spaced"):
        direct_method(lv, data, uneven, order=3, **ok)
    with pytest.raises(ValueError, match="data"):
        direct_method(lv, data[:, :1], times, **ok)
    with pytest.raises(ValueError, match="theta0"):
        direct_method(lv, data, times, theta0=[1.0])
    with pytest.raises(ValueError, match="3 time points"):
        direct_method(lv, data[:2], times[:2], **ok)
    # Euler accepts an uneven grid.
    res = direct_method(lv, data, uneven, order=1, max_iter=2, **ok)
    assert res.n_iterations == 2
