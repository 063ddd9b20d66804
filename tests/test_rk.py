"""Fixed-step solvers with discrete adjoints: gradients, convergence orders, Ops, bad input."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import pymc_pnode as pn
from pymc_pnode.classical.rk import METHODS, FixedStepSolver, rk_solve

RK_METHODS = ["euler", "heun", "midpoint", "rk4"]


def lorenz(y, t, p):
    return [p[0] * (y[1] - y[0]), y[0] * (p[1] - y[2]) - y[1], y[0] * y[1] - p[2] * y[2]]


def pendulum(y, t, p):
    # Separable second-order system [q, v]: q' = v, v' = -p0 sin(q) + p1 cos(t) (forced).
    return [y[1], -p[0] * pt.sin(y[0]) + p[1] * pt.cos(t)]


def oscillator(y, t, p):
    # q' = v, v' = -w^2 q: closed-form solution for the convergence orders.
    return [y[1], -p[0] * p[0] * y[0]]


def blowup(y, t, p):
    return [p[0] * y[0] * y[0]]


@pytest.fixture(scope="module")
def lorenz_rk():
    return pn.ODE(lorenz, n_states=3, n_theta=3)


@pytest.fixture(scope="module")
def pendulum_ode():
    return pn.ODE(pendulum, n_states=2, n_theta=2)


@pytest.fixture(scope="module")
def oscillator_ode():
    return pn.ODE(oscillator, n_states=2, n_theta=1)


def _central_differences(solver, y0, theta, weights, eps=1e-6):
    z = np.concatenate([y0, theta])
    d = y0.size

    def loss(zz):
        return np.sum(weights * solver.solve(zz[:d], zz[d:]))

    grad = np.empty_like(z)
    for i in range(z.size):
        e = np.zeros_like(z)
        e[i] = eps * max(1.0, abs(z[i]))
        grad[i] = (loss(z + e) - loss(z - e)) / (2 * e[i])
    return grad


@pytest.mark.parametrize("method", RK_METHODS)
def test_adjoint_equals_central_differences_rk(lorenz_rk, method):
    # Includes an observation at t0 and uneven gaps (alignment "exact" with 1..3 steps per gap).
    times = np.array([0.0, 0.02, 0.06, 0.08, 0.14, 0.2])
    solver = FixedStepSolver(lorenz_rk, times, method=method, step=0.02)
    y0 = np.array([-10.0, -1.0, 40.0])
    theta = np.array([10.0, 28.0, 8.0 / 3.0])
    weights = np.random.default_rng(0).normal(size=(times.size, 3))
    g_y0, g_theta = solver.vjp(y0, theta, weights)
    fd = _central_differences(solver, y0, theta, weights)
    np.testing.assert_allclose(np.concatenate([g_y0, g_theta]), fd, rtol=1e-6, atol=1e-6)


def test_adjoint_equals_central_differences_stormer_verlet(pendulum_ode):
    times = np.array([0.3, 0.6, 1.2, 1.5])  # first time after t0
    solver = FixedStepSolver(pendulum_ode, times, method="stormer_verlet", step=0.1)
    y0 = np.array([1.0, -0.3])
    theta = np.array([2.0, 0.5])
    weights = np.random.default_rng(1).normal(size=(times.size, 2))
    g_y0, g_theta = solver.vjp(y0, theta, weights)
    fd = _central_differences(solver, y0, theta, weights)
    np.testing.assert_allclose(np.concatenate([g_y0, g_theta]), fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("method", ["euler", "rk4", "stormer_verlet"])
def test_verify_grad_of_op(pendulum_ode, method):
    times = np.array([0.2, 0.4, 0.8])
    rng = np.random.default_rng(2)
    pytensor.gradient.verify_grad(
        lambda y0, th: rk_solve(pendulum_ode, y0, th, times, method=method, step=0.1),
        [np.array([1.0, -0.3]), np.array([2.0, 0.5])],
        rng=rng,
        eps=1e-7,
        mode="FAST_COMPILE",
    )


@pytest.mark.parametrize("method", sorted(METHODS))
def test_convergence_orders(oscillator_ode, method):
    w, q0, v0, t_end = 1.3, 1.0, 0.5, 2.0

    def error(step):
        solver = FixedStepSolver(oscillator_ode, [t_end], method=method, step=step)
        q, v = solver.solve([q0, v0], [w])[0]
        exact_q = q0 * np.cos(w * t_end) + v0 / w * np.sin(w * t_end)
        exact_v = -q0 * w * np.sin(w * t_end) + v0 * np.cos(w * t_end)
        return np.hypot(q - exact_q, v - exact_v)

    steps = [0.05, 0.025, 0.0125]
    errs = [error(h) for h in steps]
    orders = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
    np.testing.assert_allclose(orders, METHODS[method], atol=0.15)


def test_op_value_and_gradient_numba_mode_matches(lorenz_rk):
    times = np.arange(1, 6) * 0.05
    y0 = pt.vector("y0")
    th = pt.vector("th")
    ys = rk_solve(lorenz_rk, y0, th, times, method="rk4", step=0.01)
    loss = (ys**2).sum()
    grads = pytensor.grad(loss, [y0, th])
    args = (np.array([-10.0, -1.0, 40.0]), np.array([10.0, 28.0, 8.0 / 3.0]))
    ref = pytensor.function([y0, th], [loss, *grads], mode="FAST_COMPILE")(*args)
    out = pytensor.function([y0, th], [loss, *grads], mode="NUMBA")(*args)
    for a, b in zip(ref, out):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    # The Op's value is the solver's value.
    direct = FixedStepSolver(lorenz_rk, times, method="rk4", step=0.01).solve(*args)
    np.testing.assert_allclose(ref[0], np.sum(direct**2), rtol=1e-12)


def test_observation_at_t0_and_step_grid(oscillator_ode):
    solver = FixedStepSolver(oscillator_ode, [0.0, 0.5, 1.5], method="rk4", step=0.25)
    np.testing.assert_array_equal(solver.nsub, [0, 2, 4])
    ys = solver.solve([1.0, 0.0], [1.0])
    np.testing.assert_array_equal(ys[0], [1.0, 0.0])
    assert solver.n_steps == 6


def test_shrink_alignment(oscillator_ode):
    times = [0.3, 0.5, 1.0]
    shrink = FixedStepSolver(oscillator_ode, times, method="heun", step=0.25, alignment="shrink")
    np.testing.assert_array_equal(shrink.nsub, [2, 1, 2])
    assert np.all(shrink.hsub <= 0.25)
    exact = FixedStepSolver(oscillator_ode, [0.5, 1.0], method="heun", step=0.25)
    same = FixedStepSolver(oscillator_ode, [0.5, 1.0], method="heun", step=0.25, alignment="shrink")
    np.testing.assert_array_equal(exact.solve([1.0, 0.0], [1.0]), same.solve([1.0, 0.0], [1.0]))


def test_divergence_gives_nan_and_zero_gradient():
    ode = pn.ODE(blowup, n_states=1, n_theta=1)
    times = np.linspace(0.1, 2.0, 20)
    solver = FixedStepSolver(ode, times, method="euler", step=0.1)
    ys, traj, ok = solver.forward(np.array([10.0]), np.array([50.0]))
    assert not ok
    assert np.isnan(ys[-1, 0])
    g_y0, g_theta = solver.backward(np.array([50.0]), traj, np.ones_like(ys))
    assert np.all(g_y0 == 0.0) and np.all(g_theta == 0.0)
    y0 = pt.vector("y0")
    out = rk_solve(ode, y0, [50.0], times, method="euler", step=0.1)
    grad = pytensor.grad(out.sum(), y0)
    value, g = pytensor.function([y0], [out, grad], mode="FAST_COMPILE")(np.array([10.0]))
    assert np.isnan(value[-1, 0]) and np.all(np.isfinite(g))


def test_bad_input(lorenz_rk, oscillator_ode):
    y0, theta = [-10.0, -1.0, 40.0], [10.0, 28.0, 8.0 / 3.0]
    times = np.arange(1, 5) * 0.1
    with pytest.raises(ValueError, match="larger than the observation spacing"):
        rk_solve(lorenz_rk, y0, theta, times, method="rk4", step=0.2)
    with pytest.raises(ValueError, match="integer multiple"):
        rk_solve(lorenz_rk, y0, theta, times, method="rk4", step=0.03)
    with pytest.raises(ValueError, match="strictly increasing"):
        rk_solve(lorenz_rk, y0, theta, [0.1, 0.3, 0.2], step=0.1)
    with pytest.raises(ValueError, match="t0"):
        rk_solve(lorenz_rk, y0, theta, [-0.1, 0.1], step=0.1)
    with pytest.raises(ValueError, match="method"):
        rk_solve(lorenz_rk, y0, theta, times, method="rk45", step=0.1)
    for bad_step in (0.0, -0.1, np.nan):
        with pytest.raises(ValueError, match="step"):
            rk_solve(lorenz_rk, y0, theta, times, step=bad_step)
    with pytest.raises(ValueError, match="y0"):
        rk_solve(lorenz_rk, [1.0, 2.0], theta, times, step=0.1)
    with pytest.raises(ValueError, match="theta"):
        rk_solve(lorenz_rk, y0, pt.vector("th", shape=(2,)), times, step=0.1)
    with pytest.raises(ValueError, match="even number"):
        FixedStepSolver(lorenz_rk, times, method="stormer_verlet", step=0.1)
    with pytest.raises(ValueError, match="separable"):
        FixedStepSolver(pn.ODE(pendulum_damped, 2, 1), times, method="stormer_verlet", step=0.1)
    with pytest.raises(ValueError, match="alignment"):
        FixedStepSolver(oscillator_ode, times, step=0.1, alignment="nearest")


def pendulum_damped(y, t, p):
    return [y[1], -p[0] * y[0] - 0.1 * y[1]]  # dv/dt depends on v: not separable
