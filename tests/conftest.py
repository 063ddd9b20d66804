"""Shared ODE definitions for the tests (compiled once per session; generated code is disk-cached)."""

import threading
import warnings

import numpy as np
import pytensor.tensor as pt
import pytest

import pymc_pnode as pn


@pytest.fixture(autouse=True)
def _accuracy_reports_land_in_their_test():
    """Let the watcher threads of multiprocess sampling (pymc_pnode.accuracy) that have a report due finish
    within the test that started them, so that their AccuracyWarning is not recorded by a later test."""
    yield
    for thread in threading.enumerate():
        if thread.name.startswith("pymc_pnode-watch-") and getattr(thread, "reporting", False):
            thread.join(timeout=5.0)


def central_differences(f, y0, theta, eps=1e-6):
    """Central-difference gradients ``(df/dy0, df/dtheta)`` of the scalar ``f(y0, theta)``."""
    y0, theta = np.asarray(y0, dtype=float), np.asarray(theta, dtype=float)
    steps_y0, steps_theta = eps * np.eye(y0.size), eps * np.eye(theta.size)
    g_y0 = np.array([(f(y0 + e, theta) - f(y0 - e, theta)) / (2 * eps) for e in steps_y0])
    g_theta = np.array([(f(y0, theta + e) - f(y0, theta - e)) / (2 * eps) for e in steps_theta])
    return g_y0, g_theta


def lotka_volterra(y, t, p):
    return [p[0] * y[0] - p[1] * y[0] * y[1], p[2] * y[0] * y[1] - p[3] * y[1]]


def fitzhugh_nagumo(y, t, p):
    a, b, c = p[0], p[1], p[2]
    return [c * (y[0] - y[0] ** 3 / 3 + y[1]), -(y[0] - a - b * y[1]) / c]


def van_der_pol(y, t, p):
    return [y[1], p[0] * ((1 - y[0] ** 2) * y[1] - y[0])]


def lorenz63(y, t, p):
    return [p[0] * (y[1] - y[0]), y[0] * (p[1] - y[2]) - y[1], y[0] * y[1] - p[2] * y[2]]


def robertson(y, t, p):
    # Robertson's stiff kinetics (stiffness ratio ≈ 1e9 by t = 100), the rate constants 0.04, 3e7, 1e4 scaled by p
    k1, k2, k3 = 0.04 * p[0], 3e7 * p[1], 1e4 * p[2]
    return [-k1 * y[0] + k3 * y[1] * y[2], k1 * y[0] - k3 * y[1] * y[2] - k2 * y[1] ** 2, k2 * y[1] ** 2]


ROBERTSON_TIMES, ROBERTSON_Y0 = np.geomspace(0.1, 100.0, 12), np.array([1.0, 0.0, 0.0])


def check_robertson_solution(solution_of) -> None:
    """``solution_of(theta)``, the states at ``ROBERTSON_TIMES`` from ``ROBERTSON_Y0`` (a tensor), against Radau at
    1e-12 (within 1e-5 relative) at θ = (1, 1, 1), and the gradient of a weighted sum of it against central
    differences; no ``pn.AccuracyWarning``."""
    import pytensor
    from scipy.integrate import solve_ivp

    theta, th = np.ones(3), pt.dvector("theta")
    ys = solution_of(th)
    weights = np.random.default_rng(3).standard_normal(ROBERTSON_TIMES.shape + (3,)) * [1.0, 1e4, 1.0]  # y2 ≈ 1e-5
    objective = pt.sum(weights * ys)
    values = pytensor.function([th], [ys, objective, pytensor.grad(objective, th)])
    with warnings.catch_warnings():
        warnings.simplefilter("error", pn.AccuracyWarning)
        solution, _, gradient = values(theta)
    exact = solve_ivp(lambda t, y: robertson(y, t, theta), (0.0, 100.0), ROBERTSON_Y0, method="Radau",
                      t_eval=ROBERTSON_TIMES, rtol=1e-12, atol=1e-14).y.T
    np.testing.assert_allclose(solution, exact, rtol=1e-5, atol=1e-9)
    h = 1e-6
    fd = [(values(theta + e)[1] - values(theta - e)[1]) / (2 * h) for e in np.eye(3) * h]
    np.testing.assert_allclose(gradient, fd, rtol=1e-3, atol=1e-3 * np.abs(fd).max())


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


# --- mutation checks -----------------------------------------------------------------------------
# A test that claims a posterior, MAP or fit is right must fail when the likelihood is wrong. Such
# tests are written as a check function of the model; the check runs once on the model as built and
# once per mutation below, where it must raise AssertionError.
LIKELIHOOD_MUTATIONS = pytest.mark.parametrize("factor", [0.0, 0.5], ids=["prior-only", "half-likelihood"])


def scale_likelihood(model, factor: float):
    """``model`` with the log-density of every observed variable multiplied by ``factor``.

    ``factor = 0`` returns a copy of the model without its observed variables (only the priors
    remain; cancelling the terms numerically would leave rounding noise of size |log p| that wrecks
    NUTS where the likelihood is huge). Other factors add the potential
    ``(factor - 1) · log p(observed)`` to ``model`` in place; it applies with every sampler and
    backend (multiprocess ``pm.sample``, nutpie, ``find_MAP``, and it sits in ``datalogp``, which
    parallel tempering tempers). Always use the returned model.
    """
    import pymc as pm
    from pymc.model.fgraph import fgraph_from_model, model_from_fgraph

    if factor == 0.0:
        # fgraph conversion refuses custom initial values: carry them over by name.
        initvals = {rv.name: v for rv, v in model.rvs_to_initial_values.items() if v is not None}
        saved = dict(model.rvs_to_initial_values)
        model.rvs_to_initial_values = {rv: None for rv in saved}
        try:
            fgraph, memo = fgraph_from_model(model)
        finally:
            model.rvs_to_initial_values = saved
        observed = {memo[v] for v in model.observed_RVs}
        for i in reversed(range(len(fgraph.outputs))):
            if fgraph.outputs[i] in observed:
                fgraph.remove_output(i)
        prior_model = model_from_fgraph(fgraph, mutate_fgraph=True)
        for name, value in initvals.items():
            prior_model.set_initval(prior_model[name], value)
        return prior_model
    if factor != 1.0:
        with model:
            pm.Potential("likelihood_mutation", (factor - 1.0) * model.logp(vars=model.observed_RVs))
    return model
