"""``case_studies/chkrebtii_heat.py`` (Chkrebtii et al. 2016, §5.4): the space-time solver's pieces against
independent computations, and the reduced reproduction of the paper's under-coverage result."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.linalg import cho_solve

_PATH = Path(__file__).resolve().parents[1] / "case_studies" / "chkrebtii_heat.py"
_spec = importlib.util.spec_from_file_location("chkrebtii_heat", _PATH)
heat = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = heat  # dataclasses resolve annotations through sys.modules
_spec.loader.exec_module(heat)


@pytest.mark.parametrize("prior", ["stationary", "integrated"])
def test_spatial_factors_are_derivatives_of_each_other(prior):
    """cov(u_xx(x), u(x')) = ∂²_x cov(u(x), u(x')) and cov(u_xx, u_xx) = ∂²_x' cov(u_xx(x), u(x')), checked
    by central differences (the integrated prior's factors come from quadrature)."""
    nu, h = 0.2, 1e-3
    x, xp = np.array([0.15, 0.5, 0.8]), np.array([0.1, 0.45, 0.9])
    f = {s: heat.spatial_factors(x + s * h, xp, nu, prior) for s in (-1, 0, 1)}
    d2_ss = (f[1]["SS"] - 2 * f[0]["SS"] + f[-1]["SS"]) / h**2
    np.testing.assert_allclose(f[0]["RS"], d2_ss, rtol=1e-4, atol=1e-6 * np.abs(f[0]["RS"]).max())
    g = {s: heat.spatial_factors(x, xp + s * h, nu, prior) for s in (-1, 0, 1)}
    d2_rs = (g[1]["RS"] - 2 * g[0]["RS"] + g[-1]["RS"]) / h**2
    np.testing.assert_allclose(f[0]["RR"], d2_rs, rtol=1e-4, atol=1e-6 * np.abs(f[0]["RR"]).max())


def test_ftcs_equals_its_closed_form():
    """FTCS maps sin(πx) to g sin(πx) per step, g = 1 - 4 r sin²(πΔx/2) with r = κΔt/Δx² (stable: r = 0.44)."""
    kappa, (n_space, n_time) = 0.9, (15, 100)
    x, t = heat.space_time_grid(n_space, n_time)
    r = kappa * (t[1] - t[0]) / (x[1] - x[0]) ** 2
    growth = 1.0 - 4.0 * r * np.sin(np.pi * (x[1] - x[0]) / 2.0) ** 2
    xd, td = heat.space_time_grid(*heat.DATA_GRID)
    expected = growth ** np.round(td / (t[1] - t[0]))[:, None] * np.sin(np.pi * xd)[None, :]
    np.testing.assert_allclose(heat.ftcs(kappa, n_space, n_time), expected, atol=1e-14)


def test_structure_equals_dense_conditioning():
    """The blocked Cholesky factor with the paper's noise rule evaluated on the fly equals the factor of the
    dense data covariance plus the noise computed by dense Gaussian conditioning, step by step."""
    from pymc_pnode.chkrebtii.kernels import prior_covariances

    n_space, n_time = heat.DATA_GRID
    solver = heat.SpaceTimeSolver.build(n_space, n_time, precision=3.0)
    x, s = heat.space_time_grid(n_space, n_time)
    nu, lam = heat.SPACE_SCALE * (x[1] - x[0]), heat.TIME_SCALE * (s[1] - s[0])
    k = np.kron(prior_covariances("uniform", lam, 3.0, s, s)[0], heat.spatial_factors(x, x, nu, "stationary")["SS"])
    noise = np.zeros(k.shape[0])
    for n in range(n_time):
        blk, prev = slice(n * n_space, (n + 1) * n_space), slice(0, n * n_space)
        if n:
            cond = k[blk, prev] @ np.linalg.solve(k[prev, prev] + np.diag(noise[prev]), k[prev, blk])
            noise[blk] = np.diag(k[blk, blk] - cond)
        else:
            noise[blk] = heat.JITTER * np.diag(k[blk, blk])
        noise[[n * n_space, (n + 1) * n_space - 1]] = heat.JITTER * np.max(np.diag(k[blk, blk]))
    dense = np.linalg.cholesky(k + np.diag(noise))
    np.testing.assert_allclose(solver.chol, dense, rtol=1e-6, atol=1e-9 * np.abs(dense).max())


def test_closed_form_moments_match_the_sequential_sampler():
    """The realisation is affine in the innovations: its closed-form mean and covariance equal the Monte Carlo
    moments of the recursion run step by step."""
    solver = heat.SpaceTimeSolver.build(*heat.DATA_GRID, precision=0.5)
    mean, cov = solver.moments(0.9)
    n = 3000
    draws = solver.sample(0.9, n, rng=3).reshape(n, -1)
    sd = np.sqrt(np.diag(cov))
    inner = sd > 1e-6
    assert np.all(np.abs(draws.mean(0) - mean)[inner] < 5.0 * sd[inner] / np.sqrt(n))
    ratio = draws.std(0)[inner] / sd[inner]
    assert 0.9 < ratio.min() and ratio.max() < 1.1
    # An off-diagonal entry: the covariance of two nodes at the last time.
    i, j = len(mean) - 4, len(mean) - 3
    mc = np.cov(draws[:, i], draws[:, j])[0, 1]
    assert abs(mc - cov[i, j]) < 5.0 * sd[i] * sd[j] / np.sqrt(n)


def test_loglik_is_the_gaussian_marginal_and_minus_inf_on_blow_up():
    """``loglik`` equals the dense Gaussian log-density at several precisions (covariances ∝ 1/α); an unstable
    run (exact interrogations on the stiff Laplacian) gives -inf instead of a finite wrong number."""
    data = heat.make_data()
    solver = heat.SpaceTimeSolver.build(*heat.DATA_GRID, precision=1.0)
    mean, cov = solver.moments(1.02)
    for alpha in (0.1, 10.0):
        full = cov / alpha + heat.NOISE_SD**2 * np.eye(cov.shape[0])
        resid = data.ravel() - mean
        chol = np.linalg.cholesky(full)
        expected = (-0.5 * resid @ cho_solve((chol, True), resid) - np.log(np.diag(chol)).sum()
                    - 0.5 * resid.size * np.log(2 * np.pi))
        np.testing.assert_allclose(solver.loglik(1.02, data, [alpha])[0], expected, rtol=1e-10)
    unstable = heat.SpaceTimeSolver.build(*heat.DATA_GRID, precision=1.0, noise="zero")
    assert np.all(unstable.loglik(1.0, data, [0.1, 10.0]) == -np.inf)


def test_deterministic_solver_under_covers_and_probabilistic_does_not():
    """The paper's Figure-9 claim on the data grid (8 × 25): FTCS puts no mass near κ = 1, the exact solution
    and the probabilistic solver (precision integrated out) cover it, the latter with a wider posterior."""
    data = heat.make_data()
    kappas = np.linspace(0.9, 1.1, 161)
    x, t = heat.space_time_grid(*heat.DATA_GRID)
    precisions = 10.0 ** np.arange(-4.0, 4.5, 1.0)
    solver = heat.SpaceTimeSolver.build(*heat.DATA_GRID, precision=1.0)
    densities = {
        "exact": heat.posterior_density([heat.iid_loglik(data, heat.exact_solution(x, t, k)) for k in kappas], kappas),
        "ftcs": heat.posterior_density([heat.iid_loglik(data, heat.ftcs(k, *heat.DATA_GRID)) for k in kappas], kappas),
        "pn": heat.posterior_density(np.array([solver.loglik(k, data, precisions) for k in kappas]), kappas),
    }
    intervals = {name: heat.credible_interval(d, kappas, 0.99) for name, d in densities.items()}
    assert intervals["ftcs"][1] < 0.99
    assert intervals["exact"][0] < 1.0 < intervals["exact"][1]
    assert intervals["pn"][0] < 1.0 < intervals["pn"][1]
    width = {name: hi - lo for name, (lo, hi) in intervals.items()}
    assert width["pn"] > 3.0 * width["ftcs"]
