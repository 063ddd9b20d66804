"""ODE filters: accuracy, convergence order, calibration, exactness on affine ODEs, stability, errors."""

import numpy as np
import pytest
from scipy.integrate import solve_ivp

import pymc_pnode as pn
from pymc_pnode.priors import IWP

PROBLEMS = {
    # name: (fixture, y0, theta, t1)
    "lotka_volterra": ("lv_ode", [1.0, 1.0], [1.5, 1.0, 3.0, 1.0], 5.0),
    "fitzhugh_nagumo": ("fhn_ode", [-1.0, 1.0], [0.2, 0.2, 3.0], 5.0),
    "van_der_pol": ("vdp_ode", [2.0, 0.0], [1.0], 5.0),
    "lorenz63": ("lorenz_ode", [1.0, 1.0, 1.0], [10.0, 28.0, 8.0 / 3.0], 1.0),
}


def reference(ode, y0, theta, t1, times):
    sol = solve_ivp(
        lambda t, y: ode.f(y, t, theta), (0.0, t1), y0, method="DOP853", rtol=1e-12, atol=1e-12,
        dense_output=True,
    )
    return sol.sol(times).T


@pytest.mark.parametrize("problem", PROBLEMS)
@pytest.mark.parametrize("solver", [pn.EK0(order=4), pn.EK1(order=4)], ids=["EK0", "EK1"])
@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "adaptive"])
def test_accuracy_against_scipy(problem, solver, adaptive, request):
    name, y0, theta, t1 = PROBLEMS[problem]
    ode = request.getfixturevalue(name)
    save_at = np.linspace(0.0, t1, 11)
    kwargs = dict(rtol=1e-8, atol=1e-10) if not adaptive else dict(rtol=1e-8, atol=1e-10)
    if not adaptive:
        kwargs["step"] = 1e-3 if problem == "lorenz63" else 5e-3
    sol = pn.solve(ode, y0, theta, (0.0, t1), solver=solver, save_at=save_at, **kwargs)
    assert sol.success, sol.stats
    assert np.array_equal(sol.t, save_at)
    ref = reference(ode, y0, theta, t1, save_at)
    scale = 1.0 + np.abs(ref)
    assert np.max(np.abs(sol.mean - ref) / scale) < 1e-5
    assert np.all(np.isfinite(sol.std))


@pytest.mark.parametrize("q", [1, 2, 3, 4])
def test_convergence_order_fixed_step_ek1(q, logistic_ode):
    r, k, y0 = 3.0, 1.0, 0.1
    exact = lambda t: k / (1 + (k - y0) / y0 * np.exp(-r * t))  # noqa: E731
    steps = np.array([0.1, 0.05, 0.025, 0.0125])
    errors = []
    for h in steps:
        sol = pn.solve(logistic_ode, [y0], [r, k], (0.0, 2.5), solver=pn.EK1(order=q), step=h)
        errors.append(np.max(np.abs(sol.mean[:, 0] - exact(sol.t))))
    slope = np.polyfit(np.log(steps), np.log(errors), 1)[0]
    assert q + 1 - 0.3 < slope < q + 1 + 0.5, (slope, errors)


def _chi2_per_dim(sol, ref):
    err = sol.mean - ref
    stats = [e @ np.linalg.solve(c, e) for e, c in zip(err[1:], sol.cov[1:])]
    return float(np.mean(stats)) / sol.mean.shape[1]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(solver=pn.EK0(order=2), step=0.05, diffusion="calibrated"),
        dict(solver=pn.EK0(order=3), rtol=1e-6, atol=1e-9, diffusion="local"),
        dict(solver=pn.EK0(order=3), step=0.05, diffusion="local"),
    ],
    ids=["EK0-q2-fixed-global", "EK0-q3-adaptive-local", "EK0-q3-fixed-local"],
)
def test_calibrated_std_has_the_size_of_the_true_error(kwargs, lv_ode):
    # chi^2 / d = mean of e^T C^{-1} e / d is 1 for perfect calibration. ODE filters are calibrated
    # only up to the quasi-MLE of the diffusion, so we require the right order of magnitude:
    # within [0.05, 20], i.e. standard deviations within a factor ~4.5 of the true error.
    theta, t1 = [1.5, 1.0, 3.0, 1.0], 10.0
    sol = pn.solve(lv_ode, [1.0, 1.0], theta, (0.0, t1), **kwargs)
    chi2 = _chi2_per_dim(sol, reference(lv_ode, [1.0, 1.0], theta, t1, sol.t))
    assert 0.05 < chi2 < 20.0, chi2


def test_ek1_is_not_overconfident(lv_ode):
    # EK1 is known to be underconfident (notes 002 §4.4, §5.4); it must never be overconfident.
    theta = [1.5, 1.0, 3.0, 1.0]
    sol = pn.solve(lv_ode, [1.0, 1.0], theta, (0.0, 10.0), solver=pn.EK1(order=3), step=0.05)
    assert _chi2_per_dim(sol, reference(lv_ode, [1.0, 1.0], theta, 10.0, sol.t)) < 5.0


def test_global_calibration_is_the_quasi_mle(lv_ode):
    # Means do not depend on a constant diffusion; covariances scale linearly with it.
    args = (lv_ode, [1.0, 1.0], [1.5, 1.0, 3.0, 1.0], (0.0, 3.0))
    cal = pn.solve(*args, solver=pn.EK1(order=3), step=0.05)
    sigma2 = cal.stats["diffusion"]
    fixed = pn.solve(*args, solver=pn.EK1(order=3), step=0.05, diffusion=sigma2)
    unit = pn.solve(*args, solver=pn.EK1(order=3), step=0.05, diffusion=1.0)
    assert np.allclose(cal.mean, fixed.mean, rtol=1e-10, atol=1e-12)
    assert np.allclose(cal.cov, fixed.cov, rtol=1e-8, atol=1e-300)
    assert np.allclose(unit.cov * sigma2, cal.cov, rtol=1e-8, atol=1e-300)


def _dense_batch_posterior(theta, y0, grid, q, kappa, extra=()):
    """Exact Gaussian conditioning of the discretised IWP prior for y' = L y on a dense joint."""
    l_mat = np.array([[theta[0], -theta[1]], [theta[1], theta[0]]])
    d = 2
    dd = (q + 1) * d
    mu0 = np.concatenate([np.linalg.matrix_power(l_mat, k) @ y0 for k in range(q + 1)])
    times = np.union1d(grid, extra)
    observed = np.isin(times, grid[1:])
    prior = IWP(q)
    n = times.size
    means = np.zeros((n, dd))
    covs = np.zeros((n, n, dd, dd))
    means[0] = mu0
    trans = [None]
    for i in range(1, n):
        a1, q1 = prior.transition(times[i] - times[i - 1])
        a, qm = np.kron(a1, np.eye(d)), np.kron(q1, np.eye(d)) * kappa
        trans.append(a)
        means[i] = a @ means[i - 1]
        covs[i, i] = a @ covs[i - 1, i - 1] @ a.T + qm
        for j in range(1, i):
            covs[i, j] = a @ covs[i - 1, j]
            covs[j, i] = covs[i, j].T
    big = covs[1:, 1:].transpose(0, 2, 1, 3).reshape((n - 1) * dd, (n - 1) * dd)
    m = means[1:].reshape(-1)
    h_one = np.zeros((d, dd))
    h_one[:, d : 2 * d] = np.eye(d)
    h_one[:, :d] -= l_mat
    rows = [i - 1 for i in range(1, n) if observed[i]]
    h_big = np.zeros((len(rows) * d, (n - 1) * dd))
    for r, i in enumerate(rows):
        h_big[r * d : (r + 1) * d, i * dd : (i + 1) * dd] = h_one
    s = h_big @ big @ h_big.T
    gain = np.linalg.solve(s, h_big @ big).T
    post_m = m - gain @ (h_big @ m)
    post_c = big - gain @ h_big @ big
    return times, post_m.reshape(n - 1, dd), post_c


@pytest.mark.parametrize("solver", [pn.EK0(order=2), pn.EK1(order=3)], ids=["EK0", "EK1"])
def test_affine_ode_equals_dense_batch_gaussian(solver, linear_ode):
    theta, y0, kappa = np.array([-0.3, 2.0]), np.array([1.0, 0.5]), 3.7
    grid = np.linspace(0.0, 1.0, 9)
    q = solver.order
    sol = pn.solve(linear_ode, y0, theta, (0.0, 1.0), solver=solver, step=0.125, diffusion=kappa)
    assert np.allclose(sol.t, grid)
    _, post_m, post_c = _dense_batch_posterior(theta, y0, grid, q, kappa)
    if solver.ek1:
        # EK1 is exact for affine fields: smoothed means and covariances equal the batch posterior.
        assert np.allclose(sol.state_mean[1:].reshape(8, -1), post_m, rtol=1e-8, atol=1e-10)
        dd = (q + 1) * 2
        marg = np.array([post_c[i * dd : i * dd + 2, i * dd : i * dd + 2] for i in range(8)])
        assert np.allclose(sol.cov[1:], marg, rtol=1e-6, atol=1e-12)
    else:
        # EK0 ignores the Jacobian, so it is not the exact posterior; it stays close at this step.
        assert np.allclose(sol.mean[1:], post_m[:, :2], atol=2e-2)
        assert not np.allclose(sol.mean[1:], post_m[:, :2], atol=1e-6)


def test_dense_output_equals_batch_posterior_at_unobserved_times(linear_ode):
    theta, y0, kappa = np.array([-0.3, 2.0]), np.array([1.0, 0.5]), 0.8
    grid = np.linspace(0.0, 1.0, 5)
    extra = np.array([0.1, 0.3, 0.61, 0.99])
    sol = pn.solve(linear_ode, y0, theta, (0.0, 1.0), solver=pn.EK1(order=2), step=0.25, diffusion=kappa)
    times, post_m, post_c = _dense_batch_posterior(theta, y0, grid, 2, kappa, extra)
    mean, cov = sol.interpolate(extra)
    dd = 6
    for t, mu, c in zip(extra, mean, cov):
        i = int(np.nonzero(times == t)[0][0]) - 1
        assert np.allclose(mu, post_m[i, :2], rtol=1e-8, atol=1e-10)
        assert np.allclose(c, post_c[i * dd : i * dd + 2, i * dd : i * dd + 2], rtol=1e-6, atol=1e-12)


def test_joint_samples_match_posterior_moments(fhn_ode, rng):
    sol = pn.solve(fhn_ode, [-1.0, 1.0], [0.2, 0.2, 3.0], (0.0, 2.0), solver=pn.EK1(order=2), step=0.1)
    draws = sol.sample(4000, rng=rng)
    assert draws.shape == (4000, sol.t.size, 2)
    assert np.allclose(draws[:, 0], [-1.0, 1.0])  # the initial value is known exactly
    se = sol.std / np.sqrt(4000)
    assert np.all(np.abs(draws.mean(axis=0) - sol.mean)[1:] < 5 * se[1:] + 1e-15)
    assert np.allclose(draws.std(axis=0)[1:], sol.std[1:], rtol=0.1)
    # Joint, not marginal: neighbouring times are strongly correlated.
    corr = np.corrcoef(draws[:, 10, 0], draws[:, 11, 0])[0, 1]
    assert corr > 0.5


def test_stability_ten_thousand_ek1_steps_on_stiff_van_der_pol(vdp_ode):
    sol = pn.solve(vdp_ode, [2.0, 0.0], [10.0], (0.0, 10.0), solver=pn.EK1(order=5), step=1e-3)
    assert sol.success and sol.stats["n_steps"] == 10_000
    assert np.all(np.isfinite(sol.mean)) and np.all(np.isfinite(sol.cov))
    eig = np.linalg.eigvalsh(sol.cov)
    assert np.all(eig >= -1e-12 * np.maximum(1.0, eig.max(axis=1, keepdims=True)))
    ref = solve_ivp(lambda t, y: vdp_ode.f(y, t, [10.0]), (0, 10), [2.0, 0.0], method="Radau",
                    rtol=1e-12, atol=1e-12, t_eval=sol.t[::500])
    assert np.max(np.abs(sol.mean[::500] - ref.y.T)) < 1e-5


def test_adaptive_steps_hit_every_output_time(lv_ode):
    save_at = np.array([0.0, 0.123, 1.0, 2.5, 2.5001, 4.0])
    sol = pn.solve(lv_ode, [1.0, 1.0], [1.5, 1.0, 3.0, 1.0], (0.0, 4.0), save_at=save_at)
    assert np.array_equal(sol.t, save_at)
    assert sol.stats["n_steps"] > 10


def test_to_xarray(lv_ode):
    sol = pn.solve(lv_ode, [1.0, 1.0], [1.5, 1.0, 3.0, 1.0], (0.0, 1.0), step=0.1)
    ds = sol.to_xarray()
    assert ds["mean"].dims == ("time", "state")
    assert ds["cov"].shape == (11, 2, 2)
    assert np.allclose(ds["std"].values, sol.std)
    assert ds.attrs["n_steps"] == 10


def test_diverging_solve_is_reported_not_raised():
    blowup = pn.ODE(lambda y, t, p: [p[0] * y[0] ** 2], n_states=1, n_theta=1)  # y = 1/(1 - t)
    sol = pn.solve(blowup, [1.0], [1.0], (0.0, 2.0), max_steps=2000)
    assert not sol.success
    assert sol.stats["t_final"] < 1.01  # stopped at the singularity, not at t1 = 2
    assert sol.stats["message"]
    fixed = pn.solve(blowup, [1.0], [1.0], (0.0, 2.0), step=0.01)
    assert fixed.stats["t_final"] <= 2.0
    assert np.all(np.isfinite(fixed.mean))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(y0=[1.0]), "y0"),
        (dict(theta=[1.0, 2.0]), "theta"),
        (dict(t_span=(1.0, 0.0)), "t_span"),
        (dict(save_at=[0.5, 0.2]), "save_at"),
        (dict(save_at=[0.5, 3.0]), "save_at"),
        (dict(step=0.0), "step"),
        (dict(step=-0.1), "step"),
        (dict(diffusion=-1.0), "diffusion"),
        (dict(diffusion="bogus"), "diffusion"),
        (dict(rtol=0.0), "rtol"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(kwargs, match, lv_ode):
    args = dict(y0=[1.0, 1.0], theta=[1.5, 1.0, 3.0, 1.0], t_span=(0.0, 1.0))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        pn.solve(lv_ode, args.pop("y0"), args.pop("theta"), args.pop("t_span"), **args)


@pytest.mark.parametrize("q", [0, -2])
def test_bad_order_for_solvers(q):
    with pytest.raises(ValueError, match="order"):
        pn.EK1(order=q)
    with pytest.raises(ValueError, match="order"):
        pn.EK0(order=q)
