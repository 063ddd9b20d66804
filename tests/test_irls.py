"""IRLS with isotonic weights (Matsuda & Miyatake): weight update, monotone objective, recovery, CIs."""

import numpy as np
import pytest
from scipy.integrate import solve_ivp
from scipy.optimize import minimize

import pymc_pnode as pn
from pymc_pnode.classical.irls import irls_fit
from pymc_pnode.classical.isotonic import isotonic_weights, weight_objective
from pymc_pnode.classical.profile import CHI2_1_95, profile_intervals
from pymc_pnode.classical.rk import FixedStepSolver


def lorenz(y, t, p):
    return [p[0] * (y[1] - y[0]), y[0] * (p[1] - y[2]) - y[1], y[0] * y[1] - p[2] * y[2]]


def fitzhugh_nagumo(y, t, p):
    # The paper's sign convention: dR/dt = -(V - a + b R) / c.
    return [p[2] * (y[0] - y[0] ** 3 / 3 + y[1]), -(y[0] - p[0] + p[1] * y[1]) / p[2]]


def decay(y, t, p):
    return [-p[0] * y[0]]


@pytest.fixture(scope="module")
def lorenz_ode():
    return pn.ODE(lorenz, n_states=3, n_theta=3)


@pytest.fixture(scope="module")
def fhn_ode():
    return pn.ODE(fitzhugh_nagumo, n_states=2, n_theta=3)


def _simulate(ode, y0, theta, times, noise_var, obs_matrix, seed):
    sol = solve_ivp(lambda t, y: ode.f(y, t, theta), (ode.t0, times[-1]), y0, t_eval=times,
                    method="DOP853", rtol=1e-12, atol=1e-12)
    clean = sol.y.T @ np.atleast_2d(obs_matrix).T
    rng = np.random.default_rng(seed)
    return clean + np.sqrt(noise_var) * rng.normal(size=clean.shape)


@pytest.mark.parametrize("seed", range(4))
def test_isotonic_update_equals_constrained_optimisation(seed):
    rng = np.random.default_rng(seed)
    n_times, n_obs = 9, 2
    # Residuals that grow in time with noise, so that some order constraints are active.
    r = rng.normal(size=(n_times, n_obs)) * np.linspace(0.2, 2.0, n_times)[:, None]
    gamma2 = np.array([0.3, 0.05])
    w = isotonic_weights(r, gamma2)

    # Direct constrained optimisation of the same objective over log-weights (w > 0 built in).
    def objective(u):
        return weight_objective(np.exp(u).reshape(n_times, n_obs), r)

    cons = []
    for j in range(n_obs):
        for k in range(n_times - 1):
            cons.append({"type": "ineq", "fun": lambda u, k=k, j=j: u[k * n_obs + j] - u[(k + 1) * n_obs + j]})
        cons.append({"type": "ineq", "fun": lambda u, j=j: -np.log(gamma2[j]) - u[j]})
    u0 = np.minimum(np.full(n_times * n_obs, -1.0), -np.log(np.tile(gamma2, n_times)))
    res = minimize(objective, u0, constraints=cons, method="SLSQP",
                   options={"ftol": 1e-14, "maxiter": 2000})
    assert res.success
    w_direct = np.exp(res.x).reshape(n_times, n_obs)
    assert weight_objective(w, r) <= res.fun + 1e-8
    np.testing.assert_allclose(w, w_direct, rtol=2e-3)
    # Feasibility of the closed form.
    assert np.all(np.diff(w, axis=0) <= 1e-12)
    assert np.all(w <= 1.0 / gamma2 + 1e-12)


def test_irls_decreases_objective_monotonically_on_fitzhugh_nagumo(fhn_ode):
    times = np.arange(101) * 0.2
    theta = np.array([0.2, 0.2, 3.0])
    y0 = np.array([-1.0, -1.0])
    data = _simulate(fhn_ode, y0, theta, times, 0.01, [[1.0, 0.0]], seed=3)
    res = irls_fit(fhn_ode, data, times, noise_var=0.01, method="euler", step=0.05,
                   theta0=[1.0, 1.0, 1.0], y0=y0, fix_y0=True, n_iter=6, obs_matrix=[[1.0, 0.0]])
    h = res.history
    assert len(h.objective) == 6
    # Weight update and parameter update each lower g: g(l-1,l-1) >= g(l-1,l) >= g(l,l).
    sequence = np.column_stack([h.objective_after_weights, h.objective]).ravel()
    assert np.all(np.diff(sequence) <= 1e-8 * np.abs(sequence).max())
    assert h.objective[-1] < h.objective[0]
    # Fitted variances are monotone in time and the weights capped at 1/noise_var.
    assert np.all(np.diff(res.error_var[:, 0]) >= 0)
    assert res.weights.max() <= 100.0 + 1e-9
    # Per-parameter recovery. A tight RK4 least-squares fit of the same V data gives
    # (0.197, 0.210, 2.998) (seed 3) and (0.195, 0.173, 3.006) (seed 4): b is weakly identified from
    # V alone; Euler-IRLS gives (0.195, 0.211, 2.946) and (0.187, 0.266, 2.924).
    assert np.all(np.abs(res.theta - theta) < [0.025, 0.1, 0.12]), res.theta
    # The common result type: iterations counted, variances in the xarray form.
    assert res.n_iterations == res.n_iter == 6 and res.n_ode_solves == 2 * res.n_function_evals
    np.testing.assert_array_equal(res.to_xarray()["error_var"].values, res.error_var)


def test_irls_recovers_lorenz_parameters(lorenz_ode):
    times = np.arange(101) * 0.01
    theta = np.array([10.0, 28.0, 8.0 / 3.0])
    y0 = np.array([-10.0, -1.0, 40.0])
    noise = np.array([0.5, 0.1, 0.1])
    data = _simulate(lorenz_ode, y0, theta, times, noise, np.eye(3), seed=11)
    res = irls_fit(lorenz_ode, data, times, noise_var=noise, method="rk4", step=5e-3,
                   theta0=[11.0, 29.0, 3.0], y0=[-9.0, -1.5, 39.0], n_iter=4)
    assert res.converged and res.newton_decrement < 1e-6
    np.testing.assert_allclose(res.theta, theta, rtol=0.02)
    np.testing.assert_allclose(res.y0, y0, atol=0.4)
    assert res.param_names == ["y0[0]", "y0[1]", "y0[2]", "theta[0]", "theta[1]", "theta[2]"]
    # RK4 at this step is accurate: the weights stay near their caps 1/noise_var early on.
    np.testing.assert_allclose(res.weights[0], 1.0 / noise, rtol=1e-12)

    base = irls_fit(lorenz_ode, data, times, noise_var=noise, method="rk4", step=5e-3,
                    theta0=[11.0, 29.0, 3.0], y0=[-9.0, -1.5, 39.0], n_iter=0)
    assert base.method == "baseline"
    np.testing.assert_array_equal(base.weights, np.tile(1.0 / noise, (times.size, 1)))
    np.testing.assert_array_equal(base.error_var, 0.0)
    np.testing.assert_allclose(base.theta, theta, rtol=0.02)


def test_converged_flag_detects_an_unfinished_optimisation(lorenz_ode):
    times = np.arange(51) * 0.01
    theta = np.array([10.0, 28.0, 8.0 / 3.0])
    y0 = np.array([-10.0, -1.0, 40.0])
    data = _simulate(lorenz_ode, y0, theta, times, 0.1, np.eye(3), seed=2)
    kw = dict(noise_var=0.1, method="heun", step=5e-3, theta0=[11.0, 29.0, 3.0],
              y0=[-9.0, -1.5, 39.0], n_iter=0)
    done = irls_fit(lorenz_ode, data, times, **kw)
    assert done.converged and done.newton_decrement < 1e-6
    # Three L-BFGS iterations from the initial guess are far from the minimum.
    early = irls_fit(lorenz_ode, data, times, lbfgs_options={"maxiter": 3}, **kw)
    assert early.history.lbfgs_iterations == [3]
    assert not early.converged and early.newton_decrement > 1.0
    # Near the minimum the decrement predicts the remaining decrease of the objective.
    near = irls_fit(lorenz_ode, data, times, lbfgs_options={"maxiter": 1},
                    **{**kw, "theta0": done.theta + 0.03, "y0": done.y0 - 0.03})
    assert not near.converged
    np.testing.assert_allclose(near.newton_decrement, near.objective - done.objective, rtol=0.1)


def test_unknown_noise_variant_with_partial_observation(lorenz_ode):
    # Section 4.1.3/4.1.4 of the paper: x3 unobserved, data on [0.1, 2], noise only bounded below.
    times = np.arange(10, 201) * 0.01
    theta = np.array([10.0, 28.0, 8.0 / 3.0])
    y0 = np.array([-10.0, -1.0, 40.0])
    h = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    noise = np.array([0.5, 0.1])
    data = _simulate(lorenz_ode, y0, theta, times, noise, h, seed=5)
    res = irls_fit(lorenz_ode, data, times, noise_var=1e-3, noise_var_is_lower_bound=True,
                   method="rk4", step=5e-3, theta0=[11.0, 29.0, 3.0], y0=[-9.0, -1.5, 39.0],
                   n_iter=4, obs_matrix=h)
    np.testing.assert_allclose(res.theta, theta, rtol=0.02)
    assert res.weights.max() <= 1e3 * (1 + 1e-12)
    # The noise variances are estimated by the first (largest) weights, i.e. PAVA's first block: the
    # smallest running mean of the squared residuals, clipped at the lower bound (recomputed here from
    # the final fit; the weights come from the residuals of the previous iterate, hence rtol 0.15 —
    # the mean squared residual, the unbiased alternative, would be ≈ 0.5 and 0.1).
    r2 = (data - res.fitted @ h.T) ** 2
    running_min = np.min(np.cumsum(r2, axis=0) / np.arange(1, times.size + 1)[:, None], axis=0)
    np.testing.assert_allclose(res.noise_var, np.maximum(running_min, 1e-3), rtol=0.15)
    # That estimator is biased low (the boundary inconsistency of isotonic regression; see irls_fit):
    # compare with the truth through its distribution for pure-noise residuals, simulated.
    chi2 = np.random.default_rng(0).chisquare(1, size=(20000, times.size))
    null = np.min(np.cumsum(chi2, axis=1) / np.arange(1, times.size + 1), axis=1)
    lo, hi = np.quantile(null, [0.005, 0.995])
    ratio = res.noise_var / noise
    assert np.all((lo < ratio) & (ratio < hi)), (ratio, lo, hi)
    assert 0.3 < null.mean() < 0.45  # the documented bias: mean ≈ 0.37 γ²
    assert np.all(res.error_var >= 0.0) and np.all(np.diff(res.error_var, axis=0) >= -1e-12)


def test_profile_intervals_contain_truth():
    ode = pn.ODE(decay, n_states=1, n_theta=1)
    times = np.linspace(0.25, 4.0, 16)
    theta, y0, noise = np.array([0.7]), np.array([2.0]), 0.02**2
    data = _simulate(ode, y0, theta, times, noise, [[1.0]], seed=7)
    res = irls_fit(ode, data, times, noise_var=noise, method="heun", step=0.125,
                   theta0=[1.0], y0=[1.5], n_iter=5)
    ci = profile_intervals(res)
    assert ci.names == ["y0[0]", "theta[0]"]
    assert np.all(ci.contains([2.0, 0.7]))
    assert np.all(ci.lower < ci.estimate) and np.all(ci.estimate < ci.upper)
    # The end points are where the profile objective crosses the chi-square threshold.
    for name, lo, hi in zip(ci.names, ci.lower, ci.upper):
        values, dg = ci.profiles[name]
        for end in (lo, hi):
            near = np.argmin(np.abs(values - end))
            assert abs(dg[near] - CHI2_1_95) < 0.05


def test_bad_input(fhn_ode):
    times = np.arange(11) * 0.2
    data = np.zeros((11, 1))
    kw = dict(method="euler", step=0.05, theta0=[1.0, 1.0, 1.0], y0=[-1.0, -1.0], fix_y0=True,
              obs_matrix=[[1.0, 0.0]])
    with pytest.raises(ValueError, match="noise_var"):
        irls_fit(fhn_ode, data, times, noise_var=-0.01, **kw)
    with pytest.raises(ValueError, match="noise_var"):
        irls_fit(fhn_ode, data, times, noise_var=0.0, **kw)
    with pytest.raises(ValueError, match="strictly increasing"):
        irls_fit(fhn_ode, data, times[::-1], noise_var=0.01, **kw)
    with pytest.raises(ValueError, match="larger than the observation spacing"):
        irls_fit(fhn_ode, data, times, noise_var=0.01, **{**kw, "step": 0.5})
    with pytest.raises(ValueError, match="data"):
        irls_fit(fhn_ode, np.zeros((10, 1)), times, noise_var=0.01, **kw)
    with pytest.raises(ValueError, match="n_iter"):
        irls_fit(fhn_ode, data, times, noise_var=0.01, n_iter=-1, **kw)
    with pytest.raises(ValueError, match="obs_matrix"):
        irls_fit(fhn_ode, data, times, noise_var=0.01, **{**kw, "obs_matrix": [[1.0, 0.0, 0.0]]})
    with pytest.raises(ValueError, match="residuals"):
        isotonic_weights(np.zeros((2, 2, 2)), 1.0)


@pytest.mark.parametrize("method, order", [("euler", 1), ("heun", 2), ("rk4", 4)])
def test_perturbed_solves_spread_at_the_order_of_the_local_error(method, order):
    """Conrad et al.'s randomised integrator with step-doubling error estimates: zero noise gives the
    deterministic solve exactly; the spread shrinks like h^(p + 1/2) (perturbations of size h^(p+1) at
    every one of the 1/h steps add up like a random walk), with the mean on the deterministic solution."""
    from pymc_pnode._jit import readonly
    from pymc_pnode.classical.rk import rk_perturbed_forward

    ode = pn.ODE(lambda y, t, p: [y[1], -p[0] * y[0]], n_states=2, n_theta=1)
    times = np.array([1.0, 2.0])
    spreads = []
    for step in (0.02, 0.01):
        solver = FixedStepSolver(ode, times, method=method, step=step)
        y0, theta = np.array([1.0, 0.0]), np.array([4.0])
        quiet = rk_perturbed_forward(ode.rhs.address, theta, y0, solver.grid, solver.tableau,
                                     readonly(np.zeros((1, solver.n_steps, 2))))
        np.testing.assert_array_equal(quiet[0], solver.solve(y0, theta))
        samples = solver.perturbed_solve(y0, theta, 4000, rng=1)
        spread = samples.std(axis=0)[-1, 0]
        assert abs(samples.mean(axis=0)[-1, 0] - solver.solve(y0, theta)[-1, 0]) < 4 * spread / np.sqrt(4000)
        spreads.append(spread)
    assert order + 0.3 < np.log2(spreads[0] / spreads[1]) < order + 0.7


def test_perturbed_weight_update_fits_lorenz(lorenz_ode):
    """Remark 3.7: IRLS with error variances from 100 randomised Euler solves. The weights start at their
    caps (no error at t0), fall as the randomised solves spread, stay positive, and the fit recovers the
    parameters and is reproducible (the same noise at every update)."""
    times = np.arange(101) * 0.01
    theta = np.array([10.0, 28.0, 8.0 / 3.0])
    y0 = np.array([-10.0, -1.0, 40.0])
    noise = np.array([0.5, 0.1, 0.1])
    data = _simulate(lorenz_ode, y0, theta, times, noise, np.eye(3), seed=11)
    kwargs = dict(noise_var=noise, method="euler", step=2e-3, theta0=[11.0, 29.0, 3.0], y0=[-9.0, -1.5, 39.0],
                  n_iter=3)
    perturbed = irls_fit(lorenz_ode, data, times, weights=pn.PerturbedSolverWeights(n_samples=100, seed=3), **kwargs)
    assert perturbed.converged
    assert np.all(perturbed.weights <= 1.0 / noise) and np.all(perturbed.weights > 0)
    np.testing.assert_allclose(perturbed.weights[0], 1.0 / noise)  # no error at t0
    assert np.all(perturbed.weights[-10:].mean(axis=0) < perturbed.weights[:10].mean(axis=0))
    np.testing.assert_allclose(perturbed.theta, theta, rtol=0.02)
    # the last weights are the randomised solves' variances at the estimate they were updated at
    z = perturbed.problem.expand(perturbed.history.params[-2])
    spread = FixedStepSolver(lorenz_ode, times, method="euler", step=2e-3).perturbed_solve(
        z[:3], z[3:], 100, rng=3).var(axis=0, ddof=1)
    np.testing.assert_allclose(perturbed.weights, 1.0 / (noise + spread), rtol=1e-10)
    # the same noise on every update: the fit is reproducible
    again = irls_fit(lorenz_ode, data, times, weights=pn.PerturbedSolverWeights(n_samples=100, seed=3), **kwargs)
    np.testing.assert_array_equal(again.theta, perturbed.theta)
    with pytest.raises(ValueError, match="weights"):
        irls_fit(lorenz_ode, data, times, weights="monotone", **kwargs)
    with pytest.raises(ValueError, match="n_samples"):
        pn.PerturbedSolverWeights(n_samples=1)
