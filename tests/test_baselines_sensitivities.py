"""Forward sensitivities and adjoints of the adaptive scipy integration."""

import numpy as np
import pytest

import pymc_pnode as pn
from pymc_pnode.baselines import adjoint_gradient, integrate


def lotka_volterra(y, t, p):
    # The convention of the multiple-shooting paper (notes 001 eq. (18)).
    return [-p[0] * y[0] + p[1] * y[0] * y[1], p[2] * y[1] - p[3] * y[0] * y[1]]


def forced(y, t, p):
    # Non-autonomous, to check that t reaches the vector field.
    return [-p[0] * y[0] + pn_sin(t), p[1] * y[0] - y[1]]


def pn_sin(t):
    import pytensor.tensor as pt

    return pt.sin(t)


@pytest.fixture(scope="module")
def lv():
    return pn.ODE(lotka_volterra, n_states=2, n_theta=4)


@pytest.fixture(scope="module")
def forced_ode():
    return pn.ODE(forced, n_states=2, n_theta=2)


TIGHT = dict(rtol=1e-11, atol=1e-13)


def _end_state(ode, y0, theta, t_end, t0=0.0):
    return integrate(ode, y0, theta, [t_end], t0=t0, method="DOP853", **TIGHT).y[-1]


@pytest.mark.parametrize("method", ["RK45", "DOP853", "Radau", "BDF", "LSODA"])
def test_forward_sensitivities_match_central_differences(lv, method):
    y0 = np.array([0.5, 1.2])
    theta = np.array([0.9, 1.1, 0.8, 1.2])
    sol = integrate(lv, y0, theta, [0.5, 1.5], wrt_y0=True, wrt_theta=True, method=method,
                    rtol=1e-10, atol=1e-12)
    assert sol.success
    eps = 1e-6
    fd_p = np.empty((2, 4))
    for i in range(4):
        e = np.zeros(4)
        e[i] = eps
        fd_p[:, i] = (_end_state(lv, y0, theta + e, 1.5) - _end_state(lv, y0, theta - e, 1.5)) / (2 * eps)
    fd_y = np.empty((2, 2))
    for i in range(2):
        e = np.zeros(2)
        e[i] = eps
        fd_y[:, i] = (_end_state(lv, y0 + e, theta, 1.5) - _end_state(lv, y0 - e, theta, 1.5)) / (2 * eps)
    tol = 1e-7 if method != "BDF" else 1e-6
    np.testing.assert_allclose(sol.dy_dtheta[-1], fd_p, atol=tol)
    np.testing.assert_allclose(sol.dy_dy0[-1], fd_y, atol=tol)


def test_non_autonomous_sensitivities(forced_ode):
    y0 = np.array([1.0, 0.0])
    theta = np.array([0.7, 1.3])
    sol = integrate(forced_ode, y0, theta, [2.0], t0=0.5, wrt_theta=True, **TIGHT)
    eps = 1e-6
    for i in range(2):
        e = np.zeros(2)
        e[i] = eps
        fd = (_end_state(forced_ode, y0, theta + e, 2.0, 0.5)
              - _end_state(forced_ode, y0, theta - e, 2.0, 0.5)) / (2 * eps)
        np.testing.assert_allclose(sol.dy_dtheta[-1][:, i], fd, atol=1e-7)
    assert sol.dy_dy0 is None


def test_adjoint_matches_notes_and_central_differences(lv):
    # notes 001 §3.4 [check]: interval [0, 1], s0=(0.5, 1.2), s1=(0.4, 1.5), p=(0.9, 1.1, 0.8, 1.2).
    s0, s1 = np.array([0.5, 1.2]), np.array([0.4, 1.5])
    p = np.array([0.9, 1.1, 0.8, 1.2])
    fwd = integrate(lv, s0, p, [1.0], dense_output=True, **TIGHT)
    gap = fwd.y[-1] - s1
    g_s, g_p, ok, _, _ = adjoint_gradient(lv, p, fwd.dense, (0.0, 1.0), 2 * gap, **TIGHT)
    assert ok
    np.testing.assert_allclose(g_s, [1.56370, 0.38320], atol=5e-6)
    np.testing.assert_allclose(g_p, [-0.80104, 1.00793, -0.10304, 0.09583], atol=5e-6)

    def h(s, q):
        g = _end_state(lv, s, q, 1.0) - s1
        return g @ g

    eps = 1e-6
    for i in range(4):
        e = np.zeros(4)
        e[i] = eps
        assert g_p[i] == pytest.approx((h(s0, p + e) - h(s0, p - e)) / (2 * eps), abs=1e-7)
    for i in range(2):
        e = np.zeros(2)
        e[i] = eps
        assert g_s[i] == pytest.approx((h(s0 + e, p) - h(s0 - e, p)) / (2 * eps), abs=1e-7)


def test_implicit_adjoint_agrees(lv):
    s0 = np.array([0.5, 1.2])
    p = np.array([0.9, 1.1, 0.8, 1.2])
    fwd = integrate(lv, s0, p, [1.0], dense_output=True, **TIGHT)
    ref = adjoint_gradient(lv, p, fwd.dense, (0.0, 1.0), [1.0, -1.0], **TIGHT)
    rad = adjoint_gradient(lv, p, fwd.dense, (0.0, 1.0), [1.0, -1.0], method="Radau",
                           rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(rad[0], ref[0], atol=1e-8)
    np.testing.assert_allclose(rad[1], ref[1], atol=1e-8)


def test_pole_is_reported_not_raised(lv):
    # notes 001 §4.3: with p0 the solution has a pole near t = 3.3.
    sol = integrate(lv, [0.4, 1.0], [0.5, 0.5, 0.5, -0.2], np.arange(11.0), wrt_theta=True)
    assert not sol.success
    assert sol.t.size == 4  # t = 0, 1, 2, 3 were reached
    assert "3.3" in sol.message


def test_bad_arguments(lv):
    with pytest.raises(ValueError, match="method"):
        integrate(lv, [1, 1], [1, 1, 1, 1], [1.0], method="Euler")
    with pytest.raises(ValueError, match="times"):
        integrate(lv, [1, 1], [1, 1, 1, 1], [1.0, 0.5])
    with pytest.raises(ValueError, match="y0"):
        integrate(lv, [1, 1, 1], [1, 1, 1, 1], [1.0])
    with pytest.raises(ValueError, match="theta"):
        integrate(lv, [1, 1], [1, 1], [1.0])
    with pytest.raises(ValueError, match="terminal_grad"):
        adjoint_gradient(lv, [1, 1, 1, 1], lambda t: np.ones(2), (0.0, 1.0), [1.0])
    with pytest.raises(ValueError, match="t_span"):
        adjoint_gradient(lv, [1, 1, 1, 1], lambda t: np.ones(2), (1.0, 0.0), [1.0, 1.0])
