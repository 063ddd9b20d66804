"""pn.probabilistic_solution: the ODE filter's mean and standard deviation as differentiable tensors."""

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest

import pymc_pnode as pn
from tests.conftest import central_differences, fitzhugh_nagumo, lotka_volterra


def blowup(y, t, p):
    return [p[0] * y[0] * y[0]]


@pytest.fixture(scope="module")
def lv_ode():
    return pn.ODE(lotka_volterra, n_states=2, n_theta=4)


@pytest.fixture(scope="module")
def fhn():
    return pn.ODE(fitzhugh_nagumo, n_states=2, n_theta=3)


Y0_LV, THETA_LV = np.array([1.0, 1.0]), np.array([1.5, 1.0, 1.0, 3.0])
SETTINGS = [
    dict(step=0.05),  # EK1(3), calibrated diffusion
    dict(step=0.05, diffusion=0.3),
    dict(solver=pn.EK0(order=2), step=0.02),
    dict(solver=pn.EK1(order=2)),  # error-controlled steps
]


def _functions(ode, times, weights, **kwargs):
    y0, theta = pt.dvector("y0"), pt.dvector("theta")
    mean, std = pn.probabilistic_solution(ode, y0, theta, times, **kwargs)
    objective = pt.sum(weights[0] * mean) + pt.sum(weights[1] * pt.log(std))
    values = pytensor.function([y0, theta], [mean, std, objective, *pt.grad(objective, [y0, theta])])
    return values, pytensor.function([y0, theta], objective)


@pytest.mark.parametrize("kwargs", SETTINGS, ids=["ek1-calibrated", "ek1-fixed-diffusion", "ek0", "ek1-adaptive"])
def test_values_equal_solve_and_gradients_match_central_differences(lv_ode, kwargs):
    times = np.linspace(0.0, 6.0, 13)  # includes t0, where std = 0
    weights = np.random.default_rng(1).standard_normal((2, times.size, 2))
    weights[1, 0] = 0.0  # log std is -inf at t0
    values, objective = _functions(lv_ode, times, weights, **kwargs)
    mean, std, _, g_y0, g_theta = values(Y0_LV, THETA_LV)
    solve_kwargs = {k: v for k, v in kwargs.items() if k != "diffusion"}
    sol = pn.solve(lv_ode, Y0_LV, THETA_LV, (0.0, 6.0), save_at=times, smooth=False,
                   diffusion=kwargs.get("diffusion", "calibrated"), **solve_kwargs)
    np.testing.assert_array_equal(mean, sol.mean)
    np.testing.assert_array_equal(std, sol.std)
    assert np.all(std[1:] > 0) and np.all(std[0] == 0)
    # Fixed steps: the exact derivative. Error control: the derivative on the chosen grid, which central
    # differences (whose grids move with the parameters) match to the order of the grid's sensitivity.
    rtol = 1e-6 if "step" in kwargs else 1e-3
    for grad, fd in zip((g_y0, g_theta), central_differences(objective, Y0_LV, THETA_LV)):
        np.testing.assert_allclose(grad, fd, rtol=rtol, atol=rtol * np.abs(fd).max())


def test_delta_method_lognormal_model_gradient_and_numba_mode(fhn):
    times = np.arange(0.5, 10.01, 0.5)
    sol = pn.solve(fhn, [-1.0, 1.0], [0.2, 0.2, 3.0], (0.0, 10.0), save_at=times, step=0.01, smooth=False)
    data = sol.mean[:, :1] + 0.05 * np.random.default_rng(2).standard_normal((times.size, 1))
    with pm.Model() as model:
        theta = pm.LogNormal("theta", np.log([0.2, 0.2, 3.0]), 0.2, shape=3)
        sigma = pm.HalfNormal("sigma", 0.2)
        mean, std = pn.probabilistic_solution(fhn, [-1.0, 1.0], theta, times, step=0.125)
        # Gaussian noise plus the solver's variance on the observed state.
        pm.Normal("V", mu=mean[:, :1], sigma=pt.sqrt(sigma**2 + std[:, :1] ** 2), observed=data)
    assert "pn_solution_failed" in model.named_vars
    point = {"theta_log__": np.log([0.25, 0.18, 2.8]), "sigma_log__": np.log(0.07)}
    logp, dlogp = model.compile_logp(), model.compile_dlogp()
    grad = dlogp(point)
    flat = np.concatenate([point["theta_log__"], [point["sigma_log__"]]])

    def at(x):
        return logp({"theta_log__": x[:3], "sigma_log__": x[3]})

    fd = np.array([(at(flat + e) - at(flat - e)) / 2e-6 for e in 1e-6 * np.eye(4)])
    np.testing.assert_allclose(grad, fd, rtol=1e-5)
    # At this coarse step the solver's standard deviation is not negligible next to the noise.
    _, std_coarse = pn.probabilistic_solution(fhn, [-1.0, 1.0], [0.25, 0.18, 2.8], times, step=0.125)
    assert std_coarse.eval()[:, 0].max() > 0.01
    # mode="NUMBA" (nutpie's backend) gives the same numbers.
    np.testing.assert_allclose(model.compile_logp(mode="NUMBA")(point), logp(point), rtol=1e-12)
    np.testing.assert_allclose(model.compile_dlogp(mode="NUMBA")(point), grad, rtol=1e-12)


def test_failed_solve_is_minus_inf_in_a_model_and_nan_outside():
    ode = pn.ODE(blowup, n_states=1, n_theta=1)
    times = np.array([0.5, 1.5, 2.0])
    with pm.Model() as model:
        p = pm.LogNormal("p", 0.0, 1.0)
        mean, std = pn.probabilistic_solution(ode, [1.0], p[None], times, name="growth")
        pm.Normal("obs", mu=mean[:, 0], sigma=pt.sqrt(0.01 + std[:, 0] ** 2), observed=[1.2, 2.0, 3.0])
    logp, dlogp = model.compile_logp(), model.compile_dlogp()
    assert logp({"p_log__": np.log(1.0)}) == -np.inf  # singular at t = 1
    assert np.all(np.isfinite(dlogp({"p_log__": np.log(1.0)})))
    assert np.isfinite(logp({"p_log__": np.log(0.3)}))
    mean, std = pn.probabilistic_solution(ode, [1.0], [1.0], times)
    assert np.all(np.isnan(mean.eval())) and np.all(np.isnan(std.eval()))


def test_bad_arguments_raise_value_errors_naming_them(lv_ode):
    times = np.linspace(0.5, 5.0, 10)
    for kwargs, match in [
        (dict(step=-0.1), "step"),
        (dict(step=10.0), "step"),
        (dict(rtol=2.0), "rtol"),
        (dict(diffusion="local"), "diffusion"),
        (dict(solver="ek1"), "solver"),
    ]:
        with pytest.raises(ValueError, match=match):
            pn.probabilistic_solution(lv_ode, Y0_LV, THETA_LV, times, **kwargs)
    with pytest.raises(ValueError, match="times"):
        pn.probabilistic_solution(lv_ode, Y0_LV, THETA_LV, times[::-1])
    with pytest.raises(ValueError, match="theta"):
        pn.probabilistic_solution(lv_ode, Y0_LV, THETA_LV[:3], times)
