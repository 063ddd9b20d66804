"""Multiple shooting (Aydogmus & Tor): derivatives, the Lotka–Volterra pole experiment, failures."""

import numpy as np
import pytest

import pymc_pnode as pn
from pymc_pnode.baselines import (
    MultipleShootingProblem,
    integrate,
    multiple_shooting,
    rk_least_squares,
    shooting_trajectories,
)

P0 = [0.5, 0.5, 0.5, -0.2]  # the paper's start point: pole near t = 3.3


def lotka_volterra(y, t, p):
    return [-p[0] * y[0] + p[1] * y[0] * y[1], p[2] * y[1] - p[3] * y[0] * y[1]]


@pytest.fixture(scope="module")
def lv():
    return pn.ODE(lotka_volterra, n_states=2, n_theta=4)


@pytest.fixture(scope="module")
def lv_data(lv):
    # notes 001 §7: p = 1, x(0) = (0.4, 1), data at t = 0..10, sigma = 0.05.
    times = np.arange(11.0)
    clean = integrate(lv, [0.4, 1.0], [1, 1, 1, 1], times, rtol=1e-10, atol=1e-12).y
    rng = np.random.default_rng(7)
    return times, clean + 0.05 * rng.standard_normal(clean.shape)


def _central_jacobian(fun, q, eps=1e-6):
    cols = []
    for i in range(q.size):
        e = np.zeros_like(q)
        e[i] = eps
        cols.append((np.atleast_1d(fun(q + e)) - np.atleast_1d(fun(q - e))) / (2 * eps))
    return np.stack(cols, axis=-1)


@pytest.mark.parametrize("kind", ["scalar", "vector"])
def test_objective_and_constraint_derivatives(lv, lv_data, kind):
    times, data = lv_data
    prob = MultipleShootingProblem(lv, data[:5], times[:5], constraints=kind, obs_sigma=0.5,
                                   rtol=1e-11, atol=1e-13)
    rng = np.random.default_rng(0)
    q = prob.pack(data[:5] + 0.05 * rng.standard_normal((5, 2)), [0.9, 1.1, 0.8, 1.2])
    np.testing.assert_allclose(prob.objective_grad(q), _central_jacobian(prob.objective, q)[0],
                               atol=1e-7)
    jac = prob.constraints_jac(q)
    fd = _central_jacobian(prob.constraints, q)
    assert jac.shape == fd.shape == ((4,) if kind == "scalar" else (8,)) + (q.size,)
    np.testing.assert_allclose(jac, fd, atol=2e-7)
    if kind == "scalar":
        # Sparsity claimed by the paper: 2d + m nonzeros per row.
        assert np.all(np.count_nonzero(jac, axis=1) <= 2 * 2 + 4)


def test_extra_node_when_data_start_after_t0(lv, lv_data):
    times, data = lv_data
    prob = MultipleShootingProblem(lv, data[1:4], times[1:4], t0=0.0)
    assert prob.n_nodes == 4 and prob.node_times[0] == 0.0
    q = prob.pack(prob.initial_nodes(), [1, 1, 1, 1])
    g = prob.objective_grad(q)
    assert np.all(g[:2] == 0.0)  # the node at t0 has no data


def test_multiple_shooting_succeeds_where_single_shooting_fails(lv, lv_data):
    times, data = lv_data
    single = rk_least_squares(lv, data, times, theta0=P0)
    assert not single.converged and "t = 3." in single.message

    vector = multiple_shooting(lv, data, times, theta0=P0, constraints="vector",
                               rtol=1e-7, atol=1e-9)
    assert vector.converged, vector.message
    np.testing.assert_allclose(vector.theta, 1.0, atol=0.12)
    assert vector.extra["max_gap"] < 1e-4 and vector.n_iterations < 40

    # The paper's scalarised constraints with adjoint gradients reach the same estimate, more slowly.
    scalar = multiple_shooting(lv, data, times, theta0=P0, constraints="scalar",
                               rtol=1e-6, atol=1e-8, ftol=1e-8)
    assert scalar.converged, scalar.message
    np.testing.assert_allclose(scalar.theta, vector.theta, atol=2e-3)
    assert scalar.n_iterations > vector.n_iterations

    # ... and both agree with single shooting started near the optimum.
    polished = rk_least_squares(lv, data, times, theta0=vector.theta, y0=vector.y0, rtol=1e-9,
                                atol=1e-11)
    np.testing.assert_allclose(polished.theta, vector.theta, atol=2e-4)

    segments = shooting_trajectories(lv, vector.extra["node_times"], vector.extra["nodes"],
                                     vector.theta, n_points=5)
    assert len(segments) == 10
    np.testing.assert_allclose(segments[3][1][-1], vector.extra["nodes"][4], atol=1e-4)


def test_failed_interval_solve_is_reported(lv, lv_data):
    # A single interval [0, 10] from p0 runs into the pole: no derivative exists at the start.
    times, data = lv_data
    res = multiple_shooting(lv, data[[0, -1]], times[[0, -1]], theta0=P0, constraints="vector")
    assert not res.converged
    assert "interval 0" in res.message and "aborted" in res.message
    assert res.extra["n_failed_intervals"] == 1 and res.extra["max_gap"] == np.inf


def test_bad_input(lv, lv_data):
    times, data = lv_data
    with pytest.raises(ValueError, match="constraints"):
        multiple_shooting(lv, data, times, theta0=P0, constraints="matrix")
    with pytest.raises(ValueError, match="nodes0"):
        multiple_shooting(lv, data[:, :1], times, theta0=P0, obs_matrix=[[1, 0]])
    with pytest.raises(ValueError, match="nodes0"):
        multiple_shooting(lv, data, times, theta0=P0, nodes0=np.ones((3, 2)))
    with pytest.raises(ValueError, match="theta0"):
        multiple_shooting(lv, data, times, theta0=[1.0])
    with pytest.raises(ValueError, match="two node times"):
        multiple_shooting(lv, data[:1], times[:1], theta0=P0)
    with pytest.raises(ValueError, match="maxiter"):
        multiple_shooting(lv, data, times, theta0=P0, maxiter=0)
    with pytest.raises(ValueError, match="bounds"):
        multiple_shooting(lv, data, times, theta0=P0, bounds=[(0, 1)] * 4)
