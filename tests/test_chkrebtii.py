"""Chkrebtii et al.'s Algorithm 1: exactness against a dense implementation, Monte Carlo, convergence.

The reference ``dense_algorithm1`` below is an independent, straightforward O(N^3) implementation of
Algorithm 1 (notes 004 §3.2-3.3b: dense rank-one updates of means and covariances on the grid plus
the output times), with the kernels' closed forms written out again here.
"""

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from scipy import integrate, special

import pymc_pnode as pn
from pymc_pnode.chkrebtii import ChkrebtiiSolution, DelayODE, chkrebtii_sample
from pymc_pnode.chkrebtii.kernels import KERNELS, kc, kt, kx

SQPI = np.sqrt(np.pi)


# ---------------------------------------------------------------- independent dense reference
def _kernel_blocks(kernel, lam, alpha, a, b):
    """Dense prior blocks: Ct(a, a), X(b, a) = cov(u(b), u_t(a)), C(b, b) (times from t0)."""
    if kernel == "uniform":
        def phi(d):
            return np.maximum(2 * lam - np.abs(d), 0.0)

        def phi1(d):
            ad = np.abs(d)
            return np.sign(d) * np.where(ad <= 2 * lam, 2 * lam * ad - ad**2 / 2, 2 * lam**2)

        def phi2(d):
            ad = np.abs(d)
            return np.where(ad <= 2 * lam, lam * ad**2 - ad**3 / 6, 2 * lam**2 * ad - 4 / 3 * lam**3)
    else:
        def phi(d):
            return SQPI * lam * np.exp(-(d**2) / (4 * lam**2))

        def phi1(d):
            return np.pi * lam**2 * special.erf(d / (2 * lam))

        def phi2(d):
            return (np.pi * lam**2 * d * special.erf(d / (2 * lam))
                    + 2 * SQPI * lam**3 * (np.exp(-(d**2) / (4 * lam**2)) - 1))

    ct = phi(a[:, None] - a[None, :]) / alpha
    x = (phi1(a[None, :]) - phi1(a[None, :] - b[:, None])) / alpha
    c = (phi2(b[:, None]) + phi2(b[None, :]) - phi2(b[:, None] - b[None, :])) / alpha
    return ct, x, c


def dense_algorithm1(f, y0, t_span, n_grid, alpha, lam, kernel, noise, times, z, zt, jitter=1e-12,
                     delay=None, return_cov=False):
    """Algorithm 1 with dense rank-one updates (per component ``i``: own ``alpha[i]``, ``lam[i]``).

    ``f(u, t, lag)`` is the vector field; with ``delay`` the lag is the linear interpolation of the
    step-ahead means ``m^{k-1}(s_k)`` (``y0`` before ``t0``). Returns (final draw, conditional mean) and,
    with ``return_cov``, the final covariances at ``times`` with the nugget, ``(d, len(times), len(times))``.
    """
    t0, t1 = t_span
    d = len(y0)
    s = np.linspace(0.0, t1 - t0, n_grid)
    h = s[1] - s[0]
    tr = np.asarray(times) - t0
    pts = np.concatenate([s, tr])
    alpha = np.broadcast_to(alpha, (d,))
    lam = np.broadcast_to(lam, (d,))
    blocks = [_kernel_blocks(kernel, lam[i], alpha[i], s, pts) for i in range(d)]
    ct = [b[0].copy() for b in blocks]
    ct0 = [b[0] for b in blocks]
    x = [b[1].copy() for b in blocks]
    c = [b[2].copy() for b in blocks]
    m = np.tile(np.asarray(y0, float), (len(pts), 1))
    mt = np.zeros((n_grid, d))
    means = [np.asarray(y0, float)]

    def lag_at(n):
        if delay is None:
            return None
        a = s[n] - delay
        if a <= 0:
            return np.asarray(y0, float)
        j = int(np.floor(a / h))
        j, w = (n - 1, 1.0) if j >= n else (j, a / h - j)
        return (1 - w) * means[j] + w * means[j + 1]

    fn = f(np.asarray(y0, float), t0, lag_at(0))
    g = np.array([ct[i][0, 0] for i in range(d)])
    for n in range(n_grid):
        res = fn - mt[n]
        for i in range(d):
            cti, xi = ct[i][:, n].copy(), x[i][:, n].copy()
            m[:, i] += xi * res[i] / g[i]
            mt[:, i] += cti * res[i] / g[i]
            c[i] -= np.outer(xi, xi) / g[i]
            x[i] -= np.outer(xi, cti) / g[i]
            ct[i] -= np.outer(cti, cti) / g[i]
        if n < n_grid - 1:
            means.append(m[n + 1].copy())
            u = np.array([m[n + 1, i] + np.sqrt(max(c[i][n + 1, n + 1], 0.0)) * z[n, i] for i in range(d)])
            fn = f(u, t0 + s[n + 1], lag_at(n + 1))
            for i in range(d):
                v = ct[i][n + 1, n + 1]
                g[i] = {"paper": 2 * v, "zero": v, "code": v + ct[i][n, n]}[noise]
                g[i] = max(g[i], jitter * ct0[i][n + 1, n + 1])
    nt = len(tr)
    draw = m[n_grid:].copy()
    covs = np.empty((d, nt, nt))
    for i in range(d):
        c0 = _kernel_blocks(kernel, lam[i], alpha[i], s, tr)[2]
        covs[i] = c[i][n_grid:, n_grid:] + jitter * np.max(np.diag(c0)) * np.eye(nt)
        draw[:, i] += np.linalg.cholesky(covs[i]) @ zt[:, i]
    return (draw, m[n_grid:], covs) if return_cov else (draw, m[n_grid:])


def _ode6(y, t, p):
    return [y[1], -y[0] + pt.sin(p[0] * t)]


def _ode6_exact(t):
    return (-3 * np.cos(t) + 2 * np.sin(t) - np.sin(2 * t)) / 3


@pytest.fixture(scope="module")
def ode6():
    return pn.ODE(_ode6, n_states=2, n_theta=1)


def _ode6_numpy(u, t, lag):
    return np.array([u[1], -u[0] + np.sin(2.0 * t)])


def _draw_with(ode, y0, theta, t_span, z, zt, **kw):
    """The layer's realisation for given innovations (compiled from the PyMC graph)."""
    with pm.Model():
        u = ChkrebtiiSolution("u", ode, y0=y0, theta=theta, t_span=t_span, **kw)
        innov = pm.modelcontext(None)["u_innovations"]
    fn = pytensor.function([innov], u)
    return fn(np.concatenate([z, zt]) if zt is not None else z)


# ---------------------------------------------------------------- exactness
@pytest.mark.parametrize(
    "kernel, noise, lam",
    [("uniform", "zero", 0.55), ("uniform", "paper", 0.55), ("uniform", "code", 1.3),
     ("squared_exponential", "paper", 0.4), ("squared_exponential", "zero", 0.15)],
)
def test_layer_equals_dense_algorithm1(ode6, rng, kernel, noise, lam):
    n, times = 30, np.array([0.0, 0.35, 2.0, 5.5, 9.99, 10.0])
    z, zt = rng.standard_normal((n - 1, 2)), rng.standard_normal((times.size, 2))
    kw = dict(n_grid=n, alpha=4.0, lam=lam, kernel=kernel, noise=noise, times=times)
    ours = _draw_with(ode6, [-1.0, 0.0], [2.0], (0.0, 10.0), z, zt, **kw)
    ref, _ = dense_algorithm1(_ode6_numpy, [-1.0, 0.0], (0.0, 10.0), n, 4.0, lam, kernel, noise,
                              times, z, zt)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-10 * max(1.0, np.abs(ref).max()))


def test_per_component_hyperparameters_and_offset_span_equal_dense(lv_ode, rng):
    n, times, t_span = 40, np.array([1.3, 2.0, 3.7, 4.5]), (1.0, 5.0)
    alpha, lam = np.array([30.0, 8.0]), np.array([0.25, 0.4])
    z, zt = rng.standard_normal((n - 1, 2)), rng.standard_normal((times.size, 2))
    theta = np.array([1.0, 0.8, 0.6, 1.1])
    ours = _draw_with(lv_ode, [1.0, 0.5], theta, t_span, z, zt, n_grid=n, alpha=alpha, lam=lam,
                      times=times, noise="paper")
    ref, _ = dense_algorithm1(lambda u, t, lag: lv_ode.f(u, t, theta), [1.0, 0.5], t_span, n,
                              alpha, lam, "uniform", "paper", times, z, zt)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-10)


def test_conditional_mean_output_equals_dense(ode6, rng):
    n, times = 25, np.linspace(0.5, 10.0, 7)
    z = rng.standard_normal((n - 1, 2))
    ours = _draw_with(ode6, [-1.0, 0.0], [2.0], (0.0, 10.0), z, None, n_grid=n, alpha=2.0, lam=0.9,
                      times=times, output="mean")
    _, ref = dense_algorithm1(_ode6_numpy, [-1.0, 0.0], (0.0, 10.0), n, 2.0, 0.9, "uniform", "zero",
                              times, z, np.zeros((7, 2)))
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-10)


def test_delay_equation_equals_dense(rng):
    # y' = -k y(t - tau) + F(t), constant history y0; F interpolated linearly from data.
    ft, fv = np.array([0.0, 1.0, 2.5, 4.0]), np.array([0.0, 1.0, -0.5, 0.3])
    dde = DelayODE(lambda y, t, p, lag, F: [-p[0] * lag[0] + F[0]], 1, 2, delay_param=1,
                   forcing=(ft, fv))
    n, times, tau = 41, np.array([0.5, 1.7, 3.0, 4.0]), 0.63
    z, zt = rng.standard_normal((n - 1, 1)), rng.standard_normal((times.size, 1))
    ours = _draw_with(dde, [1.0], [1.5, tau], (0.0, 4.0), z, zt, n_grid=n, alpha=50.0, lam=0.2,
                      times=times, noise="paper")
    ref, _ = dense_algorithm1(lambda u, t, lag: np.array([-1.5 * lag[0] + np.interp(t, ft, fv)]),
                              [1.0], (0.0, 4.0), n, 50.0, 0.2, "uniform", "paper", times, z, zt,
                              delay=tau)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-10)


def test_code_rule_coincides_with_zero_rule(ode6):
    # The authors' rule adds the just-conditioned derivative variance at the previous grid point,
    # which vanishes after a noise-free step: by induction it is the zero rule.
    kw = dict(n_grid=60, alpha=10.0, lam=0.4, size=3)
    a = chkrebtii_sample(ode6, [-1.0, 0.0], [2.0], (0, 10), noise="code", rng=5, **kw)
    b = chkrebtii_sample(ode6, [-1.0, 0.0], [2.0], (0, 10), noise="zero", rng=5, **kw)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


def test_sampler_matches_layer_given_the_same_innovations(ode6):
    times = np.array([1.0, 4.0, 9.0])
    draws, means = chkrebtii_sample(ode6, [-1.0, 0.0], [2.0], (0, 10), n_grid=30, alpha=3.0,
                                    lam=0.7, times=times, size=2, rng=11, return_mean=True)
    rng = np.random.default_rng(11)
    z, zt = rng.standard_normal((29, 2)), rng.standard_normal((3, 2))
    ours = _draw_with(ode6, [-1.0, 0.0], [2.0], (0.0, 10.0), z, zt, n_grid=30, alpha=3.0, lam=0.7,
                      times=times)
    np.testing.assert_allclose(draws[0], ours, atol=1e-12)
    assert draws.shape == means.shape == (2, 3, 2)


@pytest.mark.parametrize("kernel, noise", [("uniform", "zero"), ("uniform", "paper"),
                                           ("squared_exponential", "paper")])
def test_final_covariance_equals_dense(ode6, rng, kernel, noise):
    times = np.array([0.7, 2.5, 3.0])
    alpha, lam = np.array([4.0, 9.0]), np.array([0.6, 0.9])  # one per component
    _, _, ref = dense_algorithm1(_ode6_numpy, [-1.0, 0.0], (0.5, 3.0), 12, alpha, lam, kernel, noise, times,
                                 rng.standard_normal((11, 2)), rng.standard_normal((3, 2)), return_cov=True)
    cov = pn.chkrebtii_covariance((0.5, 3.0), n_grid=12, alpha=alpha, lam=lam, kernel=kernel, noise=noise,
                                  times=times)
    np.testing.assert_allclose(cov, ref, rtol=1e-9, atol=1e-14)
    shared = pn.chkrebtii_covariance((0.5, 3.0), n_grid=12, alpha=4.0, lam=0.6, kernel=kernel, noise=noise,
                                     times=times)
    np.testing.assert_allclose(shared, ref[:1], rtol=1e-9, atol=1e-14)
    with pytest.raises(ValueError, match="alpha"):
        pn.chkrebtii_covariance((0.5, 3.0), n_grid=12, alpha=[1.0, -1.0], lam=0.6)


# ---------------------------------------------------------------- kernels
@pytest.mark.parametrize("kernel", ["uniform", "squared_exponential"])
def test_integrated_kernels_match_quadrature(kernel):
    kind, lam = KERNELS[kernel], 0.37
    for a, b in [(0.3, 0.5), (1.2, 0.4), (0.1, 2.0), (2.5, 2.5)]:
        brk = [b - 2 * lam, b, b + 2 * lam]
        xq = integrate.quad(lambda s: kt(s, b, lam, kind)[0], 0, a, points=brk, limit=200)[0]
        cq = integrate.quad(
            lambda w: integrate.quad(lambda s: kt(s, w, lam, kind)[0], 0, a,
                                     points=[w - 2 * lam, w, w + 2 * lam], limit=200)[0],
            0, b, limit=200)[0]
        assert kx(a, b, lam, kind)[0] == pytest.approx(xq, abs=1e-9)
        assert kc(a, b, lam, kind)[0] == pytest.approx(cq, abs=1e-8)
        for fn in (kt, kx, kc):  # lam-derivatives
            fd = (fn(a, b, lam + 1e-6, kind)[0] - fn(a, b, lam - 1e-6, kind)[0]) / 2e-6
            assert fn(a, b, lam, kind)[1] == pytest.approx(fd, rel=1e-6, abs=1e-8)


# ---------------------------------------------------------------- Monte Carlo
def _affine_algorithm1(a_mat, y0, t_span, n_grid, alpha, lam, times):
    """Exact law of Algorithm 1's output for the linear field u' = A u (uniform kernel, zero rule).

    Every quantity is affine in the innovations Z = (z, zt): carry (constant, coefficients).
    """
    t0, t1 = t_span
    d = len(y0)
    s = np.linspace(0.0, t1 - t0, n_grid)
    tr = np.asarray(times) - t0
    nz = (n_grid - 1 + len(tr)) * d
    pts = np.concatenate([s, tr])
    ct, x, c = (b.copy() for b in _kernel_blocks("uniform", lam, alpha, s, pts))
    m = np.zeros((len(pts), d, 1 + nz))
    m[:, :, 0] = y0
    mt = np.zeros((n_grid, d, 1 + nz))
    u = m[0].copy()
    g = ct[0, 0]
    for n in range(n_grid):
        res = a_mat @ u - mt[n]
        ctn, xn = ct[:, n].copy(), x[:, n].copy()
        m += xn[:, None, None] * res[None] / g
        mt += ctn[:, None, None] * res[None] / g
        c -= np.outer(xn, xn) / g
        x -= np.outer(xn, ctn) / g
        ct -= np.outer(ctn, ctn) / g
        if n < n_grid - 1:
            u = m[n + 1].copy()
            for i in range(d):
                u[i, 1 + n * d + i] += np.sqrt(max(c[n + 1, n + 1], 0.0))
            g = ct[n + 1, n + 1]
    out = m[n_grid:].copy()
    c0 = _kernel_blocks("uniform", lam, alpha, s, tr)[2]
    lt = np.linalg.cholesky(c[n_grid:, n_grid:] + 1e-12 * np.max(np.diag(c0)) * np.eye(len(tr)))
    base = 1 + (n_grid - 1) * d
    for i in range(d):
        for j in range(len(tr)):
            out[:, i, base + j * d + i] += lt[:, j]
    mean = out[:, :, 0].reshape(-1)
    coef = out[:, :, 1:].reshape(len(tr) * d, nz)
    return mean, coef @ coef.T, c[n_grid:, n_grid:]


def test_monte_carlo_matches_implied_distribution(linear_ode):
    theta, y0 = np.array([-0.3, 1.2]), np.array([1.0, 0.0])
    a_mat = np.array([[theta[0], -theta[1]], [theta[1], theta[0]]])
    times, n, alpha, lam = np.array([0.5, 1.5, 3.0]), 16, 2.0, 0.3
    draws, means = chkrebtii_sample(linear_ode, y0, theta, (0, 3), n_grid=n, alpha=alpha, lam=lam,
                                    times=times, size=4000, rng=3, return_mean=True)
    mean, cov, cond_cov = _affine_algorithm1(a_mat, y0, (0, 3), n, alpha, lam, times)
    flat = draws.reshape(4000, -1)
    se = np.sqrt(np.diag(cov) / 4000)
    assert np.all(np.abs(flat.mean(0) - mean) < 4.5 * se)
    np.testing.assert_allclose(np.cov(flat.T), cov, rtol=0.12, atol=0.05 * np.abs(cov).max())
    # Given the interrogations, the final draw is N(m^N(t), C^N(t, t)).
    resid = (draws - means)[:, :, 0]
    np.testing.assert_allclose(np.cov(resid.T), cond_cov, rtol=0.12, atol=0.05 * cond_cov.max())


def test_spread_shrinks_as_grid_refines(ode6):
    sds = []
    for n in (25, 50, 100, 200):
        draws = chkrebtii_sample(ode6, [-1.0, 0.0], [2.0], (0, 10), n_grid=n, alpha=20.0,
                                 lam=2 * 10 / (n - 1), times=[2.0, 6.0, 10.0], size=200, rng=n)
        sds.append(draws[:, :, 0].std(axis=0))
    sds = np.array(sds)
    assert np.all(np.diff(sds, axis=0) < 0), sds


@pytest.mark.parametrize("noise", ["zero", "code"])
def test_first_order_convergence_of_the_mean(ode6, noise):
    # Notes 004 §4.3: r = 0 (or the code rule) with uniform lam = 2h converges at first order.
    errors = []
    for n in (50, 100, 200, 400):
        h = 10.0 / (n - 1)
        _, means = chkrebtii_sample(ode6, [-1.0, 0.0], [2.0], (0, 10), n_grid=n, alpha=n,
                                    lam=2 * h, noise=noise, size=20, rng=1, return_mean=True)
        grid = np.linspace(0, 10, n)
        errors.append(np.abs(means.mean(0)[:, 0] - _ode6_exact(grid)).max())
    ratios = np.array(errors[:-1]) / np.array(errors[1:])
    assert np.all((ratios > 1.7) & (ratios < 2.6)), (errors, ratios)
    assert errors[-1] < 0.05


def test_delay_equation_converges_at_first_order():
    # y' = -y(t - 1), history 1: y = 1 - t on [0, 1], 1 - t + (t-1)^2/2 on [1, 2], ... ; y(3) = -1/6.
    dde = DelayODE(lambda y, t, p, lag: [-p[0] * lag[0]], 1, 1, delay=1.0)
    errors = []
    for n in (51, 101, 201):
        _, means = chkrebtii_sample(dde, [1.0], [1.0], (0, 3), n_grid=n, alpha=100.0 * n,
                                    lam=6.0 / (n - 1), times=[2.0, 3.0], size=4, rng=0,
                                    return_mean=True)
        errors.append(np.abs(means.mean(0)[:, 0] - [-0.5, -1.0 / 6.0]).max())
    ratios = np.array(errors[:-1]) / np.array(errors[1:])
    assert np.all((ratios > 1.7) & (ratios < 2.5)), (errors, ratios)


def test_squared_exponential_paper_rule_is_stable_and_close(ode6):
    # The paper's Figure 1 setting (SE, lam = 0.8, alpha = 5, paper rule) at N = 200.
    _, means = chkrebtii_sample(ode6, [-1.0, 0.0], [2.0], (0, 10), n_grid=200, alpha=5.0, lam=0.8,
                                kernel="squared_exponential", noise="paper", size=5, rng=2,
                                return_mean=True)
    grid = np.linspace(0, 10, 200)
    assert np.all(np.isfinite(means))
    assert np.abs(means.mean(0)[:, 0] - _ode6_exact(grid)).max() < 0.05


# ---------------------------------------------------------------- bad input and divergence
def test_bad_input_raises_value_error(ode6):
    base = dict(n_grid=20, alpha=1.0, lam=0.5)
    args = (ode6, [-1.0, 0.0], [2.0], (0, 10))
    for key, value in [("alpha", 0.0), ("alpha", -1.0), ("lam", 0.0), ("lam", -2.0),
                       ("alpha", [1.0, 2.0, 3.0]), ("lam", np.nan)]:
        with pytest.raises(ValueError, match=key):
            chkrebtii_sample(*args, **{**base, key: value})
    for n in (1, 0, 2.5):
        with pytest.raises(ValueError, match="n_grid"):
            chkrebtii_sample(*args, **{**base, "n_grid": n})
    for times in ([-0.1, 1.0], [1.0, 10.5], [2.0, 1.0]):
        with pytest.raises(ValueError, match="times"):
            chkrebtii_sample(*args, times=times, **base)
    with pytest.raises(ValueError, match="kernel"):
        chkrebtii_sample(*args, kernel="matern", **base)
    with pytest.raises(ValueError, match="noise"):
        chkrebtii_sample(*args, noise="huge", **base)
    with pytest.raises(ValueError, match="theta"):
        chkrebtii_sample(ode6, [-1.0, 0.0], [2.0, 1.0], (0, 10), **base)
    # The same checks at model-build time.
    for key, value in [("alpha", 0.0), ("lam", -1.0), ("n_grid", 1), ("times", [5.0, 11.0])]:
        with pm.Model(), pytest.raises(ValueError, match=key):
            ChkrebtiiSolution("u", ode6, y0=[-1.0, 0.0], theta=[2.0], t_span=(0, 10),
                              **{**base, "times": [1.0, 2.0], key: value})
    with pm.Model(), pytest.raises(ValueError, match="output"):
        ChkrebtiiSolution("u", ode6, y0=[-1.0, 0.0], theta=[2.0], t_span=(0, 10), output="x", **base)
    with pytest.raises(ValueError, match="delay"):
        DelayODE(lambda y, t, p, lag: [lag[0]], 1, 1, delay=-1.0)
    with pytest.raises(ValueError, match="exactly one"):
        DelayODE(lambda y, t, p, lag: [lag[0]], 1, 1)


def test_diverging_solve_gives_nan_draws_and_minus_inf_logp():
    blowup = pn.ODE(lambda y, t, p: [p[0] * y[0] ** 2], n_states=1, n_theta=1)  # y = 1/(1 - t)
    with pytest.warns(RuntimeWarning, match="diverged"):
        draws = chkrebtii_sample(blowup, [1.0], [1.0], (0, 3), n_grid=400, alpha=1.0, lam=0.05,
                                 size=2, rng=0)
    assert np.all(np.isnan(draws))
    with pm.Model() as model:
        k = pm.LogNormal("k", 0.0, 0.1)
        u = ChkrebtiiSolution("u", blowup, y0=[1.0], theta=pt.stack([k]), t_span=(0, 3), n_grid=400,
                              alpha=1.0, lam=0.05, times=[1.0, 2.0])
        pm.Normal("y", u, 1.0, observed=np.ones((2, 1)))
    point = model.initial_point()
    assert model.compile_logp()(point) == -np.inf
    assert np.all(np.isfinite(model.compile_dlogp()(point)))


def test_non_overlapping_uniform_kernel_is_explicit_euler():
    # lam = h/2: no correlation between grid points. With exact interrogations the step-ahead means
    # follow explicit Euler, p_{n+1} = p_n + h f_n after a half first step, and the final conditional
    # mean is the trapezoid-type sum m_j = y0 + h/2 f_0 + h sum_{0<k<j} f_k + h/2 f_j of those f_k.
    ode = pn.ODE(lambda y, t, p: [-p[0] * y[0] + pt.sin(t)], n_states=1, n_theta=1)
    n, k = 41, 1.3
    h = 4.0 / (n - 1)
    _, means = chkrebtii_sample(ode, [1.0], [k], (0, 4), n_grid=n, alpha=1e14, lam=h / 2, size=1,
                                rng=0, return_mean=True)
    grid = np.linspace(0, 4, n)
    p = np.empty(n)
    f = np.empty(n)
    p[0] = 1.0
    f[0] = -k * p[0]
    for i in range(n - 1):
        p[i + 1] = p[i] + (0.5 if i == 0 else 1.0) * h * f[i]
        f[i + 1] = -k * p[i + 1] + np.sin(grid[i + 1])
    m = np.array([1.0] + [1.0 + h * (0.5 * f[0] + f[1:j].sum() + 0.5 * f[j]) for j in range(1, n)])
    np.testing.assert_allclose(means[0, :, 0], m, atol=1e-6)
