"""Fenrir marginal likelihood: exact gradients, dense batch equality, limits, PyMC integration."""

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from scipy.integrate import solve_ivp
from scipy.stats import multivariate_normal, norm

import pymc_pnode as pn
from tests.conftest import assert_gradient_matches_central_differences
from tests.test_solve import _dense_batch_posterior


def _fhn_data(ode, times, sigma, rng, theta=(0.2, 0.2, 3.0), y0=(-1.0, 1.0)):
    ref = solve_ivp(lambda t, y: ode.f(y, t, theta), (0.0, times[-1]), y0, rtol=1e-12, atol=1e-12,
                    dense_output=True)
    truth = ref.sol(times).T
    return truth, truth[:, :1] + sigma * rng.standard_normal((times.size, 1))


@pytest.mark.parametrize(
    "solver, step", [(pn.EK1(order=3), 0.2), (pn.EK0(order=2), 0.05)], ids=["EK1", "EK0"]
)
def test_exact_gradient_fitzhugh_nagumo(fhn_ode, rng, solver, step):
    times = np.arange(0.5, 3.01, 0.25)
    _, data = _fhn_data(fhn_ode, times, 0.1, rng)

    def loglik(y0, theta, log_sigma, log_kappa):
        return pn.fenrir_loglik(fhn_ode, y0, theta, times, data, obs_matrix=[[1.0, 0.0]],
                                obs_sigma=pt.exp(log_sigma), diffusion=pt.exp(log_kappa),
                                solver=solver, step=step)

    point = [np.array([-1.0, 1.0]), np.array([0.2, 0.2, 3.0]), np.array(np.log(0.1)), np.array(np.log(50.0))]
    assert_gradient_matches_central_differences(loglik, point)


def test_exact_gradient_lotka_volterra_two_observed_components(lv_ode, rng):
    times = np.linspace(0.2, 2.0, 10)
    data = np.abs(rng.normal(1.0, 0.3, size=(10, 2)))
    data[3, 1] = np.nan  # a missing value is skipped, gradients stay exact

    def loglik(y0, theta, sigma, kappa):
        return pn.fenrir_loglik(lv_ode, y0, theta, times, data, obs_sigma=sigma, diffusion=kappa,
                                step=0.1)

    point = [np.array([1.0, 1.0]), np.array([1.5, 1.0, 3.0, 1.0]), np.array([0.2, 0.3]), np.array(0.5)]
    assert_gradient_matches_central_differences(loglik, point)


@pytest.mark.parametrize("solver", [pn.EK1(order=3), pn.EK0(order=2)], ids=["EK1", "EK0"])
def test_exact_gradient_lorenz_mixed_observations_including_t0(lorenz_ode, rng, solver):
    # Three states, two observed mixtures with their own noise scales, one datum at t0 itself.
    times = np.array([0.0, 0.1, 0.25, 0.3, 0.5])
    cmat = np.array([[1.0, 0.5, 0.0], [0.0, -1.0, 2.0]])
    data = rng.normal(size=(times.size, 2))
    data[2, 0] = np.nan

    def loglik(y0, theta, sigma, kappa):
        return pn.fenrir_loglik(lorenz_ode, y0, theta, times, data, obs_matrix=cmat, obs_sigma=sigma,
                                diffusion=kappa, solver=solver, step=0.05)

    point = [np.array([1.0, 1.5, 2.0]), np.array([10.0, 28.0, 8.0 / 3.0]), np.array([0.7, 1.3]),
             np.array(30.0)]
    # |loglik| ≈ 6e3 while ∂/∂κ ≈ 6e-5: with eps = 1e-6 rounding noise in the value (≈ 1e-13 relative)
    # gives central-difference errors of ≈ 2e-6 for κ, so κ gets a larger step (truncation < 1e-8).
    assert_gradient_matches_central_differences(loglik, point, eps=[1e-6, 1e-6, 1e-6, 1e-4])


def test_exact_gradient_more_sensors_than_filter_state(rng):
    # Four noisy sensors of one state, IWP(1): the observation dimension exceeds the state's (D = 2).
    ode = pn.ODE(lambda y, t, p: [-p[0] * y[0]], n_states=1, n_theta=1)
    times = np.linspace(0.2, 1.0, 5)
    cmat = np.array([[1.0], [2.0], [-1.0], [0.5]])
    data = rng.normal(size=(times.size, 4))

    def loglik(y0, theta, sigma):
        return pn.fenrir_loglik(ode, y0, theta, times, data, obs_matrix=cmat, obs_sigma=sigma, diffusion=2.0,
                                solver=pn.EK1(order=1), step=0.1)

    point = [np.array([1.0]), np.array([0.7]), np.array([0.5, 0.6, 0.7, 0.8])]
    assert_gradient_matches_central_differences(loglik, point)


def test_linear_ode_equals_dense_batch_gaussian(linear_ode, rng):
    theta, y0, kappa, sigma = np.array([-0.3, 2.0]), np.array([1.0, 0.5]), 3.7, 0.2
    grid = np.linspace(0.0, 1.0, 9)
    obs_idx = np.array([2, 3, 5, 8])
    times = grid[obs_idx]
    cmat = np.array([[1.0, -0.5]])
    data = rng.normal(size=(times.size, 1))
    value = pn.fenrir_loglik(linear_ode, y0, theta, times, data, obs_matrix=cmat, obs_sigma=sigma,
                             diffusion=kappa, solver=pn.EK1(order=2), step=0.125).eval()
    _, post_m, post_c = _dense_batch_posterior(theta, y0, grid, 2, kappa)
    dd = 6
    sel = np.concatenate([np.arange((i - 1) * dd, (i - 1) * dd + 2) for i in obs_idx])
    big_c = np.kron(np.eye(times.size), cmat)
    mean = big_c @ post_m[obs_idx - 1, :2].reshape(-1)
    cov = big_c @ post_c[np.ix_(sel, sel)] @ big_c.T + sigma**2 * np.eye(times.size)
    expected = multivariate_normal(mean, cov).logpdf(data.reshape(-1))
    assert value == pytest.approx(expected, rel=1e-8)


def test_approaches_gaussian_loglik_around_exact_solution(fhn_ode, rng):
    times = np.arange(1.0, 5.01, 0.5)
    truth, data = _fhn_data(fhn_ode, times, 0.1, rng)
    exact = norm(truth[:, 0], 0.1).logpdf(data[:, 0]).sum()
    gaps = []
    for step, kappa in [(0.1, 1e-2), (0.02, 1e-6), (0.005, 1e-10)]:
        value = pn.fenrir_loglik(fhn_ode, [-1.0, 1.0], [0.2, 0.2, 3.0], times, data,
                                 obs_matrix=[[1.0, 0.0]], obs_sigma=0.1, diffusion=kappa, step=step).eval()
        gaps.append(abs(value - exact))
    assert gaps[-1] < 1e-6 * abs(exact)
    assert gaps[0] > gaps[1] > gaps[2]


def test_pointwise_terms_sum_to_total(fhn_ode, rng):
    times = np.arange(0.5, 3.01, 0.5)
    _, data = _fhn_data(fhn_ode, times, 0.1, rng)
    kw = dict(obs_matrix=[[1.0, 0.0]], obs_sigma=0.1, diffusion=1.0, step=0.1)
    terms = pn.fenrir_loglik(fhn_ode, [-1.0, 1.0], [0.2, 0.2, 3.0], times, data, pointwise=True, **kw).eval()
    total = pn.fenrir_loglik(fhn_ode, [-1.0, 1.0], [0.2, 0.2, 3.0], times, data, **kw).eval()
    assert terms.shape == (times.size,)
    assert terms.sum() == pytest.approx(total, rel=1e-12)


def test_diverging_solve_gives_minus_infinity_and_zero_gradient():
    # y' = y^3 has a pole at t = 0.5; the explicit EK0 overflows past it.
    blowup = pn.ODE(lambda y, t, p: [p[0] * y[0] ** 3], n_states=1, n_theta=1)
    theta = pt.vector("theta")
    ll = pn.fenrir_loglik(blowup, [1.0], theta, [0.4, 2.0], [[1.0], [1.0]], obs_sigma=0.1,
                          diffusion=1.0, step=0.01, solver=pn.EK0(order=2))
    fn = pytensor.function([theta], [ll, pytensor.grad(ll, theta)])
    value, grad = fn([1.0])
    assert value == -np.inf
    assert np.all(np.isfinite(grad))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(times=[1.0, 0.5, 2.0]), "times"),
        (dict(times=[-1.0, 0.5, 2.0]), "times"),
        (dict(data=np.zeros((2, 1))), "rows"),
        (dict(obs_matrix=[[1.0, 0.0], [0.0, 1.0]]), "columns"),
        (dict(obs_matrix=[[1.0, 0.0, 0.0]]), "obs_matrix"),
        (dict(obs_sigma=-0.1), "obs_sigma"),
        (dict(diffusion=0.0), "diffusion"),
        (dict(step=0.0), "step"),
        (dict(times=[[0.5], [1.0], [2.0]]), "times"),
        (dict(data=np.array([[0.0], [np.inf], [0.0]])), "finite"),
        (dict(theta=[0.2, 0.2]), "theta"),
        (dict(theta=[0.2, 0.2, 3.0, 1.0]), "theta"),
        (dict(y0=[-1.0]), "y0"),
        (dict(y0=[np.nan, 1.0]), "y0"),
    ],
)
def test_bad_input(kwargs, match, fhn_ode):
    args = dict(y0=[-1.0, 1.0], theta=[0.2, 0.2, 3.0], times=[0.5, 1.0, 2.0], data=np.zeros((3, 1)),
                obs_matrix=[[1.0, 0.0]], obs_sigma=0.1, diffusion=1.0, step=0.1)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        pn.fenrir_loglik(fhn_ode, args.pop("y0"), args.pop("theta"), args.pop("times"), args.pop("data"),
                         **args)


def test_parameter_lengths_checked_at_build_and_run_time(fhn_ode):
    kw = dict(times=[0.5, 1.0], observed=np.zeros((2, 1)), obs_matrix=[[1.0, 0.0]], obs_sigma=0.1,
              diffusion=1.0, step=0.1)
    with pm.Model():
        with pytest.raises(ValueError, match=r"theta must have shape \(3,\)"):
            pn.Fenrir("a", fhn_ode, y0=[-1.0, 1.0], theta=pm.HalfNormal("t2", shape=2), **kw)
        with pytest.raises(ValueError, match=r"y0 must have shape \(2,\)"):
            pn.Fenrir("b", fhn_ode, y0=pm.Normal("y3", shape=3), theta=[0.2, 0.2, 3.0], **kw)
    # a symbolic theta of unknown length is pinned: a wrong run-time length fails loudly
    theta = pt.vector("theta")
    ll = pn.fenrir_loglik(fhn_ode, [-1.0, 1.0], theta, kw["times"], kw["observed"], obs_matrix=[[1.0, 0.0]],
                          obs_sigma=0.1, diffusion=1.0, step=0.1)
    fn = pytensor.function([theta], ll)
    assert np.isfinite(fn([0.2, 0.2, 3.0]))
    with pytest.raises(AssertionError):
        fn([0.2, 0.2])


def test_scalar_y0_and_noise_scales_declared_with_dims():
    logistic = pn.ODE(lambda y, t, p: [p[0] * y[0] * (1.0 - y[0])], n_states=1, n_theta=1)
    times = np.array([1.0, 2.0, 4.0])
    truth = 1.0 / (1.0 + 9.0 * np.exp(-times))
    with pm.Model(coords={"time": times, "obs": ["x"]}) as model:
        y0 = pm.Beta("y0", 1.0, 5.0)  # scalar for a one-state ODE
        sigma = pm.HalfNormal("sigma", 0.1, dims="obs")  # static length unknown
        pn.Fenrir("x", logistic, y0=y0, theta=1.0, times=times, observed=truth[:, None], obs_sigma=sigma,
                  diffusion=1.0, step=0.1, dims=("time", "obs"))
    logp = model.compile_logp()
    point = {"y0_logodds__": np.log(0.1 / 0.9), "sigma_log__": np.log([0.01])}
    ref = pn.fenrir_loglik(logistic, [0.1], [1.0], times, truth[:, None], obs_sigma=0.01, diffusion=1.0,
                           step=0.1).eval()
    prior = (pm.logp(pm.Beta.dist(1.0, 5.0), 0.1) + np.log(0.1 * 0.9)
             + pm.logp(pm.HalfNormal.dist(0.1), 0.01) + np.log(0.01)).eval()
    assert logp(point) == pytest.approx(ref + prior, rel=1e-10)


@pytest.fixture(scope="module")
def fhn_fit_data(fhn_ode):
    rng = np.random.default_rng(3)
    times = np.arange(0.5, 4.01, 0.25)
    return times, _fhn_data(fhn_ode, times, 0.05, rng)[1]


def _fhn_model(fhn_ode, times, data):
    with pm.Model(coords={"time": times, "observable": ["V"]}) as model:
        theta = pm.LogNormal("theta", np.log([0.2, 0.2, 3.0]), 0.3, shape=3)
        sigma = pm.HalfNormal("sigma", 0.2)
        pn.Fenrir("V", fhn_ode, y0=[-1.0, 1.0], theta=theta, times=times, observed=data,
                  obs_matrix=[[1.0, 0.0]], obs_sigma=sigma, diffusion=1.0, step=0.1,
                  dims=("time", "observable"))
    return model


def test_nuts_recovers_parameters_with_multiprocess_chains(fhn_ode, fhn_fit_data):
    times, data = fhn_fit_data
    model = _fhn_model(fhn_ode, times, data)
    with model:
        idata = pm.sample(draws=150, tune=250, chains=2, cores=2, random_seed=7, progressbar=False,
                          compute_convergence_checks=False)
        pm.compute_log_likelihood(idata, progressbar=False)
    post = idata.posterior["theta"].values.reshape(-1, 3)
    lo, hi = np.quantile(post, [0.005, 0.995], axis=0)
    assert np.all((lo < [0.2, 0.2, 3.0]) & ([0.2, 0.2, 3.0] < hi))
    assert int(idata.sample_stats["diverging"].sum()) == 0
    assert idata.log_likelihood["V"].shape[-1] == times.size
    assert np.all(np.isfinite(idata.log_likelihood["V"].values))


def test_map_and_predictive(fhn_ode, fhn_fit_data):
    times, data = fhn_fit_data
    model = _fhn_model(fhn_ode, times, data)
    with model:
        point = pm.find_MAP(progressbar=False)
        prior = pm.sample_prior_predictive(draws=5, random_seed=1)
    assert np.allclose(point["theta"], [0.2, 0.2, 3.0], rtol=0.1, atol=0.03)
    assert prior.prior_predictive["V"].shape == (1, 5, times.size, 1)


def test_posterior_trajectories_bands(fhn_ode):
    import arviz as az

    draws = np.array([[0.2, 0.2, 3.0], [0.25, 0.2, 2.9], [0.18, 0.21, 3.1]])
    idata = az.from_dict(posterior={"theta": draws[None]})
    ds = pn.posterior_trajectories(idata, fhn_ode, y0=[-1.0, 1.0], theta="theta", t_span=(0.0, 2.0),
                                   diffusion=1.0, step=0.05, n_points=21, progressbar=False)
    assert ds["mean"].shape == (3, 21, 2)
    assert bool(ds["success"].all())
    ref = pn.solve(fhn_ode, [-1.0, 1.0], draws[1], (0.0, 2.0), step=0.05, diffusion=1.0,
                   save_at=np.linspace(0, 2, 21))
    assert np.allclose(ds["mean"].values[1], ref.mean)
    assert np.allclose(ds["std"].values[1], ref.std)
    with pytest.raises(ValueError, match="posterior"):
        pn.posterior_trajectories(idata, fhn_ode, y0="nope", theta="theta", t_span=(0.0, 1.0))
    with pytest.raises(ValueError, match="theta"):
        pn.posterior_trajectories(idata, fhn_ode, y0=[-1.0, 1.0], theta=[0.2, 0.2], t_span=(0.0, 1.0))
    # separate scalar variables (the usual PyMC pattern) mixed with constants
    split = az.from_dict(posterior={"a": draws[None, :, 0], "c": draws[None, :, 2]})
    ds2 = pn.posterior_trajectories(split, fhn_ode, y0=[-1.0, 1.0], theta=["a", 0.2, "c"], t_span=(0.0, 2.0),
                                    diffusion=1.0, step=0.05, n_points=21, progressbar=False)
    assert np.allclose(ds2["mean"].values[0], ds["mean"].values[0])
    with pytest.raises(ValueError, match="entries"):
        pn.posterior_trajectories(split, fhn_ode, y0=[-1.0, 1.0], theta=["a", "c"], t_span=(0.0, 1.0))


def test_hierarchical_fitzhugh_nagumo_cells_with_nuts(fhn_ode):
    # Five cells share population-level parameters; each cell has its own recovery parameter b.
    rng = np.random.default_rng(11)
    times = np.arange(0.5, 4.01, 0.5)
    n_cells = 5
    b_true = 0.2 + 0.05 * rng.standard_normal(n_cells)
    data = []
    for b in b_true:
        truth, obs = _fhn_data(fhn_ode, times, 0.05, rng, theta=(0.2, b, 3.0))
        data.append(obs)
    with pm.Model(coords={"cell": np.arange(n_cells), "time": times, "observable": ["V"]}) as model:
        mu_b = pm.Normal("mu_b", 0.2, 0.1)
        tau_b = pm.HalfNormal("tau_b", 0.1)
        b = pm.Normal("b", mu_b, tau_b, dims="cell")
        c = pm.LogNormal("c", np.log(3.0), 0.1)
        for i in range(n_cells):
            theta = pt.stack([pt.constant(0.2), b[i], c])
            pn.Fenrir(f"V_{i}", fhn_ode, y0=[-1.0, 1.0], theta=theta, times=times, observed=data[i],
                      obs_matrix=[[1.0, 0.0]], obs_sigma=0.05, diffusion=1.0, step=0.1,
                      dims=("time", "observable"))
        idata = pm.sample(draws=150, tune=200, chains=1, random_seed=5, progressbar=False,
                          compute_convergence_checks=False)
    c_post = idata.posterior["c"].values.ravel()
    assert np.quantile(c_post, 0.005) < 3.0 < np.quantile(c_post, 0.995)
    b_post = idata.posterior["b"].values.reshape(-1, n_cells)
    assert np.all(np.abs(b_post.mean(axis=0) - b_true) < 4 * b_post.std(axis=0) + 0.02)


def test_numba_mode_matches_default_backend(fhn_ode):
    times = np.arange(0.5, 3.01, 0.25)
    data = np.sin(times)[:, None]
    data[2, 0] = np.nan
    theta, kappa = pt.vector("theta"), pt.scalar("kappa")
    ll = pn.fenrir_loglik(fhn_ode, [-1.0, 1.0], theta, times, data, obs_matrix=[[1.0, 0.0]],
                          obs_sigma=0.1, diffusion=kappa, step=0.1)
    outs = [ll, *pytensor.grad(ll, [theta, kappa])]
    numba_fn = pytensor.function([theta, kappa], outs, mode="NUMBA")
    default_fn = pytensor.function([theta, kappa], outs)
    for a, b in zip(numba_fn([0.2, 0.2, 3.0], 2.0), default_fn([0.2, 0.2, 3.0], 2.0)):
        assert np.allclose(a, b, rtol=1e-12)


def test_logp_and_gradient_share_one_solver_pass(fhn_ode, rng):
    times = np.arange(0.5, 2.01, 0.5)
    _, data = _fhn_data(fhn_ode, times, 0.1, rng)
    theta = pt.vector("theta")
    kw = dict(obs_matrix=[[1.0, 0.0]], obs_sigma=0.1, diffusion=1.0, step=0.1)
    terms = pn.fenrir_loglik(fhn_ode, [-1.0, 1.0], theta, times, data, pointwise=True, **kw)
    value = terms.sum()
    fn = pytensor.function([theta], [value, pytensor.grad(value, theta)])
    names = [str(node.op) for node in fn.maker.fgraph.toposort()]
    assert names.count("FenrirVJPOp") == 1 and "FenrirOp" not in names
    # A cotangent that depends on the terms themselves cannot reuse them: the rewrite must step aside.
    soft = pt.logsumexp(terms)
    fn_soft = pytensor.function([theta], [soft, pytensor.grad(soft, theta)])
    th0 = np.array([0.2, 0.2, 3.0])
    v, g = fn_soft(th0)
    t = pytensor.function([theta], terms)(th0)
    weights = np.exp(t - v)
    fd = np.array([(pytensor.function([theta], soft)(th0 + e) - pytensor.function([theta], soft)(th0 - e)) / 2e-6
                   for e in 1e-6 * np.eye(3)])
    np.testing.assert_allclose(g, fd, rtol=1e-5)
    assert np.isclose(weights.sum(), 1.0)


def test_nutpie_samples_fenrir_model(fhn_ode, fhn_fit_data):
    pytest.importorskip("nutpie")  # optional extra; compiles the model through the numba backend
    times, data = fhn_fit_data
    model = _fhn_model(fhn_ode, times, data)
    with model:
        idata = pm.sample(draws=150, tune=200, chains=2, nuts_sampler="nutpie", random_seed=3,
                          progressbar=False)
    post = idata.posterior["theta"].values.reshape(-1, 3)
    lo, hi = np.quantile(post, [0.005, 0.995], axis=0)
    assert np.all((lo < [0.2, 0.2, 3.0]) & ([0.2, 0.2, 3.0] < hi))
