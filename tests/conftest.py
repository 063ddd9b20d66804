"""Shared ODE definitions for the tests (compiled once per session; generated code is disk-cached)."""

import numpy as np
import pytensor.tensor as pt
import pytest

import pymc_pnode as pn


def lotka_volterra(y, t, p):
    return [p[0] * y[0] - p[1] * y[0] * y[1], p[2] * y[0] * y[1] - p[3] * y[1]]


def fitzhugh_nagumo(y, t, p):
    a, b, c = p[0], p[1], p[2]
    return [c * (y[0] - y[0] ** 3 / 3 + y[1]), -(y[0] - a - b * y[1]) / c]


def van_der_pol(y, t, p):
    return [y[1], p[0] * ((1 - y[0] ** 2) * y[1] - y[0])]


def lorenz63(y, t, p):
    return [p[0] * (y[1] - y[0]), y[0] * (p[1] - y[2]) - y[1], y[0] * y[1] - p[2] * y[2]]


def logistic(y, t, p):
    return [p[0] * y[0] * (1 - y[0] / p[1])]


def linear2(y, t, p):
    # y' = L y with a rotation-plus-decay matrix; affine, so the EK1 filter is exact Gaussian inference.
    return [p[0] * y[0] - p[1] * y[1], p[1] * y[0] + p[0] * y[1]]


@pytest.fixture(scope="session")
def lv_ode():
    return pn.ODE(lotka_volterra, n_states=2, n_theta=4)


@pytest.fixture(scope="session")
def fhn_ode():
    return pn.ODE(fitzhugh_nagumo, n_states=2, n_theta=3)


@pytest.fixture(scope="session")
def vdp_ode():
    return pn.ODE(van_der_pol, n_states=2, n_theta=1)


@pytest.fixture(scope="session")
def lorenz_ode():
    return pn.ODE(lorenz63, n_states=3, n_theta=3)


@pytest.fixture(scope="session")
def logistic_ode():
    return pn.ODE(logistic, n_states=1, n_theta=2)


@pytest.fixture(scope="session")
def linear_ode():
    return pn.ODE(linear2, n_states=2, n_theta=2)


@pytest.fixture(scope="session")
def stack_ode():
    """A field returning a stacked vector and using a vector operation on ``p``."""

    def field(y, t, p):
        return pt.stack([p[0] * y[1], -p[0] * pt.sin(y[0]) - 0.1 * y[1]])

    return pn.ODE(field, n_states=2, n_theta=1)


@pytest.fixture
def rng():
    return np.random.default_rng(20261121)


def assert_gradient_matches_central_differences(build, point, rel=1e-6, abs_=1e-6, eps=1e-6):
    """Compile ``build(*symbolic_inputs)`` and compare ``pytensor.grad`` with central differences.

    ``point`` is a list of numpy arrays (0-d allowed). Central differences have O(eps²) error, so
    agreement to ~1e-6 relative checks that the analytic gradient is exact. ``eps`` may be a list
    with one relative step per input.
    """
    import pytensor

    inputs = [pt.tensor(f"x{i}", shape=np.shape(x), dtype="float64") for i, x in enumerate(point)]
    value = build(*inputs)
    fn = pytensor.function(inputs, [value, *pytensor.grad(value, inputs)])
    outs = fn(*point)
    for i, x in enumerate(point):
        x = np.asarray(x, dtype=float)
        grad = np.asarray(outs[1 + i]).reshape(-1)
        fd = np.empty(x.size)
        for j in range(x.size):
            h = (eps[i] if np.ndim(eps) else eps) * max(1.0, abs(x.reshape(-1)[j]))
            plus, minus = x.copy().reshape(-1), x.copy().reshape(-1)
            plus[j] += h
            minus[j] -= h
            args_p = list(point)
            args_m = list(point)
            args_p[i] = plus.reshape(x.shape)
            args_m[i] = minus.reshape(x.shape)
            fd[j] = (fn(*args_p)[0] - fn(*args_m)[0]) / (2 * h)
        np.testing.assert_allclose(grad, fd, rtol=rel, atol=abs_, err_msg=f"input {i}")
