r"""Chkrebtii et al. (2016), §5.4: the heat equation and the under-coverage of a deterministic solver.

Used by ``chkrebtii_heat.ipynb`` and ``tests/test_case_study_heat.py``; notes 004 §6.6.

The problem (eq. 19): :math:`u_t = \kappa u_{xx}` on :math:`x \in [0, 1]`, :math:`t \in [0, 0.25]`,
:math:`u(x, 0) = \sin(\pi x)`, :math:`u(0, t) = u(1, t) = 0`; exact solution
:math:`\sin(\pi x) e^{-\kappa \pi^2 t}`. Data: the exact solution with :math:`\kappa = 1` on an 8 × 25
space-time grid plus Gaussian noise of standard deviation 0.005.

Three forward models give a likelihood for :math:`\kappa`:

* the exact solution (the paper's reference posterior);
* **FTCS**: forward Euler in time and centred differences in space on the solver grid (deterministic);
* the **probabilistic FTCS-sampling solver** (:class:`SpaceTimeSolver`), our implementation of the paper's
  generalisation of Algorithm 1 ("forward in time, continuous in space"). The paper leaves its details
  to Supplement B, which we do not have; we follow the text's separable prior (notes 004 §6.6) and the
  authors' heat script as summarised in the notes: per time step, draw :math:`u_{xx}` at the interior
  nodes jointly from its GP predictive given all earlier derivative data, interrogate
  :math:`u_t = \kappa u_{xx}`, and condition on it with noise equal to the predictive variance of
  :math:`u_t` there (the paper's rule; 0 at the boundaries, where :math:`u_t = 0` is pseudo-data).

The separable prior: :math:`u = u_0 + g`, :math:`\operatorname{cov} g = \alpha^{-1} k_\nu \otimes Q_\lambda`:
the temporal factor is the once-integrated uniform kernel of Algorithm 1 (the package's
:func:`pymc_pnode.chkrebtii.kernels.prior_covariances`; :math:`u_{xx}` is state-like and :math:`u_t`
derivative-like in time), the spatial factor comes from the squared-exponential :math:`R_\nu` (see
:func:`spatial_factors`: by default stationary; the paper's printed construction integrates from
:math:`x = 0`, which pins :math:`\partial_x g(0, t) = 0` and makes the solution drift asymmetrically).
The prior mean of :math:`u_{xx}` is the exact :math:`u_0'' = -\pi^2 \sin(\pi x)` (the script's "IC + GP").
The boundary conditions enter as the pseudo-data :math:`u_t(0, s_n) = u_t(1, s_n) = 0`.

Because the heat equation is linear, a realisation at fixed :math:`\kappa` is an affine function of the
standard-normal innovations, so the probabilistic solver's likelihood
:math:`p(y \mid \kappa) = \int p(y \mid u) p(u \mid \kappa) du` is an exact Gaussian
(:meth:`SpaceTimeSolver.moments`): no Monte Carlo error in the posterior densities. The sequential
sampler :meth:`SpaceTimeSolver.sample` runs the recursion literally and is the check of that closed form.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import cho_factor, cho_solve, solve_triangular
from scipy.special import erf, logsumexp

from pymc_pnode.chkrebtii.kernels import prior_covariances

T_END = 0.25
KAPPA_TRUE = 1.0
NOISE_SD = 0.005
DATA_GRID = (8, 25)  # (spatial nodes, time points) of the data
SOLVER_GRIDS = ((8, 25), (15, 50), (29, 100))  # the grids of the authors' scripts (notes 004 §6.6)
PRECISION = 1.0e4  # the paper's "prior precision 10,000"
SPACE_SCALE = 1.5  # squared-exponential length-scale / spatial step (paper text)
TIME_SCALE = 2.0  # uniform length-scale / time step (paper text)
BLOW_UP = 2.0  # |mean| / max |u0| beyond which a solve counts as diverged (the exact solution stays ≤ 1)
JITTER = 1e-8  # relative noise of exact (pseudo-)interrogations, as the script's initial noise


def space_time_grid(n_space: int, n_time: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes ``x = 0, ..., 1`` (both ends) and times ``0, Δt, ..., (n_time - 1) Δt`` with ``Δt = T / n_time``
    (the authors' scripts)."""
    return np.linspace(0.0, 1.0, n_space), np.arange(n_time) * (T_END / n_time)


def exact_solution(x: np.ndarray, t: np.ndarray, kappa: float) -> np.ndarray:
    """:math:`\\sin(\\pi x) e^{-\\kappa \\pi^2 t}` on the grid ``t × x``, shape ``(len(t), len(x))``."""
    return np.exp(-kappa * np.pi**2 * np.asarray(t))[:, None] * np.sin(np.pi * np.asarray(x))[None, :]


def make_data(seed: int = 2016) -> np.ndarray:
    """Noisy exact solution with ``κ = 1`` on the 8 × 25 data grid, shape ``(25, 8)``."""
    x, t = space_time_grid(*DATA_GRID)
    rng = np.random.default_rng(seed)
    return exact_solution(x, t, KAPPA_TRUE) + NOISE_SD * rng.normal(size=(t.size, x.size))


def _data_indices(n_space: int, n_time: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the data grid's nodes and times in a finer solver grid (the grids nest)."""
    xs, ts = space_time_grid(n_space, n_time)
    xd, td = space_time_grid(*DATA_GRID)
    ix = np.searchsorted(xs, xd - 1e-12)
    it = np.searchsorted(ts, td - 1e-12)
    if not (np.allclose(xs[ix], xd) and np.allclose(ts[it], td)):
        raise ValueError(f"the solver grid {n_space} × {n_time} does not contain the data grid {DATA_GRID}")
    return ix, it


def ftcs(kappa: float, n_space: int, n_time: int) -> np.ndarray:
    """The deterministic FTCS scheme (forward Euler, centred differences) on the data grid, shape ``(25, 8)``.

    Stable for ``κ Δt / Δx² <= 1/2`` (0.49 κ on the data grid); beyond, rounding errors grow like
    ``|1 - 4 κ Δt / Δx²|`` per step.
    """
    x, t = space_time_grid(n_space, n_time)
    dt, dx = t[1] - t[0], x[1] - x[0]
    u = np.sin(np.pi * x)
    u[-1] = 0.0
    out = np.empty((n_time, n_space))
    out[0] = u
    for n in range(1, n_time):
        u = u + kappa * dt / dx**2 * np.concatenate([[0.0], u[:-2] - 2.0 * u[1:-1] + u[2:], [0.0]])
        out[n] = u
    ix, it = _data_indices(n_space, n_time)
    return out[np.ix_(it, ix)]


def gaussian_loglik(data: np.ndarray, mean: np.ndarray, cov: np.ndarray) -> float:
    """``log N(vec data; vec mean, cov)`` (row-major ``vec``)."""
    resid = (data - mean).reshape(-1)
    factor = cho_factor(cov, lower=True)
    return float(-0.5 * resid @ cho_solve(factor, resid) - np.log(np.diag(factor[0])).sum()
                 - 0.5 * resid.size * np.log(2.0 * np.pi))


def iid_loglik(data: np.ndarray, mean: np.ndarray) -> float:
    """Log-likelihood of ``data`` around a deterministic ``mean`` with the known noise."""
    resid = data - mean
    return float(-0.5 * np.sum(resid**2) / NOISE_SD**2 - resid.size * np.log(NOISE_SD * np.sqrt(2.0 * np.pi)))


def spatial_factors(x_rows: np.ndarray, x_cols: np.ndarray, nu: float, prior: str) -> dict[str, np.ndarray]:
    """Spatial covariance factors ``{"SS": u–u, "RS": u_xx–u, "RR": u_xx–u_xx}`` for the base kernel
    :math:`R_\\nu(x, z) = e^{-(x - z)^2 / 2\\nu^2}`.

    ``prior="stationary"``: :math:`u` has the stationary covariance :math:`k(d) = \\int R R = \\sqrt{\\pi}\\nu
    e^{-d^2/4\\nu^2}` and :math:`u_{xx}` its derivatives :math:`\\partial^2 k`, :math:`\\partial^4 k` (closed forms).
    ``prior="integrated"``: the paper's printed construction, :math:`S(x, z) = \\int_0^x \\int_0^y R(w, z) dw dy`
    and ``∫ A B dz`` for ``A, B ∈ {R, S}`` (trapezoid rule); it forces :math:`g(0) = \\partial_x g(0) = 0`.
    """
    if prior == "stationary":
        d = x_rows[:, None] - x_cols[None, :]
        v = 2.0 * nu**2  # k is a squared exponential of variance parameter 2 ν²
        k = np.sqrt(np.pi) * nu * np.exp(-(d**2) / (2.0 * v))
        return {"SS": k, "RS": k * (d**2 / v**2 - 1.0 / v), "RR": k * (d**4 / v**4 - 6.0 * d**2 / v**3 + 3.0 / v**2)}
    if prior != "integrated":
        raise ValueError(f"prior must be 'stationary' or 'integrated', got {prior!r}")
    z = np.linspace(-10.0 * nu, 1.0 + 10.0 * nu, 6001)
    w = np.full(z.size, z[1] - z[0])
    w[[0, -1]] *= 0.5
    s2 = np.sqrt(2.0) * nu

    def r_of(x):
        return np.exp(-((x[:, None] - z[None, :]) ** 2) / (2.0 * nu**2))

    def f_of(v):  # an antiderivative of erf(v / (√2 ν)) in v
        return v * erf(v / s2) + s2 / np.sqrt(np.pi) * np.exp(-(v**2) / s2**2)

    def s_of(x):
        xc = x[:, None]
        return nu * np.sqrt(np.pi / 2.0) * (f_of(xc - z) - f_of(-z) + xc * erf(z / s2))

    return {"SS": (s_of(x_rows) * w) @ s_of(x_cols).T, "RS": (r_of(x_rows) * w) @ s_of(x_cols).T,
            "RR": (r_of(x_rows) * w) @ r_of(x_cols).T}


@dataclass(frozen=True)
class SpaceTimeSolver:
    """The probabilistic FTCS-sampling solver on one grid; every covariance and gain is κ-free.

    Data vector: ``u_t`` at every node at the grid times, ordered time-major (at both ends the exact
    pseudo-data ``u_t = 0`` of the boundary conditions). ``chol`` is the lower Cholesky factor of its
    covariance plus the noise (built step by step, the noise rule evaluated on the fly); the rows
    :meth:`interior_rows` ``(n)`` of ``drift_gain`` map the whitened data of steps ``< n`` to the predictive mean
    of ``u_xx`` at the interior nodes at step ``n`` (its other rows, the boundaries', are zero: it is the
    ``E G`` of :meth:`moments`); ``drift_sd[n]`` is a square root of that prediction's covariance; ``state_gain`` and
    ``state_sd`` give the state at the data grid from all whitened data. ``precision`` is the α it was
    built with.
    """

    n_space: int
    n_time: int
    precision: float
    chol: np.ndarray
    drift_gain: np.ndarray  # (n_time * n_space, n_time * n_space), strictly block lower
    drift_sd: np.ndarray  # (n_time, n_interior, n_interior)
    state_gain: np.ndarray  # (n_obs, n_time * n_data_nodes)
    state_sd: np.ndarray  # (n_obs, n_obs)
    state_prior_mean: np.ndarray  # (n_obs,) u0 at the data grid
    drift_prior_mean: np.ndarray  # (n_interior,) u0'' at the interior nodes

    @classmethod
    def build(cls, n_space: int, n_time: int, precision: float = PRECISION, space_scale: float = SPACE_SCALE,
              time_scale: float = TIME_SCALE, prior: str = "stationary", noise: str = "paper") -> SpaceTimeSolver:
        """The κ-free structure on an ``n_space × n_time`` grid (which must contain the data grid).

        ``precision`` is α (all covariances scale like ``1/α``), the length-scales are ``space_scale`` spatial and
        ``time_scale`` temporal steps, ``noise`` is ``"paper"`` (the predictive variance of the interrogated
        ``u_t``) or ``"zero"`` (exact interrogations).
        """
        _data_indices(n_space, n_time)
        x, s = space_time_grid(n_space, n_time)
        nu, lam = space_scale * (x[1] - x[0]), time_scale * (s[1] - s[0])
        xd, td = space_time_grid(*DATA_GRID)
        interior = x[1:-1]  # u_t is data at every node, u_xx is drawn at the interior ones
        nd, ni, m = x.size, interior.size, n_time * x.size
        to_nodes = spatial_factors(np.concatenate([interior, xd, x]), x, nu, prior)
        xx_data = to_nodes["RS"][:ni]  # u_xx(interior) – u_t(nodes)
        state_data = to_nodes["SS"][ni : ni + xd.size]  # u(data nodes) – u_t(nodes)
        data_data = to_nodes["SS"][ni + xd.size :]  # u_t(nodes) – u_t(nodes)
        xx_xx = spatial_factors(interior, interior, nu, prior)["RR"]
        state_state = spatial_factors(xd, xd, nu, prior)["SS"]
        # Time factors: derivative–derivative, state–derivative and state–state (u_xx is state-like in time).
        ct, xs, cs = prior_covariances("uniform", lam, precision, s, s)
        _, xo, co = prior_covariances("uniform", lam, precision, s, td)

        chol = np.zeros((m, m))
        drift_gain = np.zeros((m, m))
        drift_sd = np.zeros((n_time, ni, ni))
        for n in range(n_time):
            prev, blk = slice(0, n * nd), slice(n * nd, (n + 1) * nd)
            # u_xx at step n given the data of steps < n (time-major data: np.kron(time, space)).
            g = _whiten(chol[prev, prev], np.kron(xs[n, :n][None, :], xx_data))
            drift_gain[n * nd + 1 : (n + 1) * nd - 1, prev] = g
            drift_sd[n] = _psd_sqrt(xx_xx * cs[n, n] - g @ g.T)
            # The data block of step n; noise = its predictive variance (the paper's rule), except for the
            # exact first interrogation and the boundary pseudo-data u_t(1, s_n) = 0.
            k_nn = data_data * ct[n, n]
            lp = _whiten(chol[prev, prev], np.kron(ct[n, :n][None, :], data_data))
            pred = k_nn - lp @ lp.T
            r = np.diag(pred).copy() if (n and noise == "paper") else JITTER * np.diag(k_nn)
            r[[0, -1]] = JITTER * np.max(np.diag(k_nn))
            chol[blk, prev] = lp
            chol[blk, blk] = np.linalg.cholesky(pred + np.diag(r))
        state_gain = _whiten(chol, np.einsum("ak,jl->ajkl", xo, state_data).reshape(td.size * xd.size, m))
        state_sd = _psd_sqrt(np.kron(co, state_state) - state_gain @ state_gain.T)
        u0 = np.sin(np.pi * xd)
        u0[-1] = 0.0
        return cls(n_space, n_time, precision, chol, drift_gain, drift_sd, state_gain, state_sd, np.tile(u0, td.size),
                   -np.pi**2 * np.sin(np.pi * interior))

    @property
    def n_interior(self) -> int:
        return self.n_space - 2

    def interior_rows(self, n: int) -> slice:
        """The entries of step ``n``'s interior nodes in the time-major data vector."""
        return slice(n * self.n_space + 1, (n + 1) * self.n_space - 1)

    def moments(self, kappa: float) -> tuple[np.ndarray, np.ndarray]:
        """Mean and covariance of the realisation at the data grid (time-major) for conductivity ``kappa``.

        With ``e`` the whitened data, ``L e = κ E (u0'' + G e + D z)``, so ``e = κ (L - κ E G)^{-1} E (u0'' + D z)``
        (a lower-triangular solve) and the state ``u0 + H e + C^{1/2} z'`` is Gaussian.
        """
        ni = self.n_interior
        system = self.chol - kappa * self.drift_gain
        weights = solve_triangular(system.T, self.state_gain.T, lower=False).T  # H (L - κ E G)^{-1}
        mean = self.state_prior_mean.copy()
        spread = np.empty((weights.shape[0], self.n_time * ni))
        for n in range(self.n_time):
            w_n = weights[:, self.interior_rows(n)]
            mean += kappa * w_n @ self.drift_prior_mean
            spread[:, n * ni : (n + 1) * ni] = kappa * w_n @ self.drift_sd[n]
        return mean, spread @ spread.T + self.state_sd @ self.state_sd.T

    def sample(self, kappa: float, size: int, rng: np.random.Generator | int | None = None) -> np.ndarray:
        """Realisations at the data grid by running the recursion step by step, shape ``(size, 25, 8)``."""
        rng = np.random.default_rng(rng)
        nd, ni = self.n_space, self.n_interior
        out = np.empty((size, self.state_gain.shape[0]))
        for r in range(size):
            e = np.zeros(self.chol.shape[0])
            for n in range(self.n_time):
                blk = slice(n * nd, (n + 1) * nd)
                drift = (self.drift_prior_mean + self.drift_gain[self.interior_rows(n)] @ e
                         + self.drift_sd[n] @ rng.normal(size=ni))
                f = np.concatenate([[0.0], kappa * drift, [0.0]])
                rhs = f - self.chol[blk, : n * nd] @ e[: n * nd]
                e[blk] = solve_triangular(self.chol[blk, blk], rhs, lower=True)
            out[r] = self.state_prior_mean + self.state_gain @ e + self.state_sd @ rng.normal(size=out.shape[1])
        return out.reshape(size, DATA_GRID[1], DATA_GRID[0])

    def loglik(self, kappa: float, data: np.ndarray, precisions: np.ndarray | None = None) -> np.ndarray:
        """``log p(data | κ, α)`` for each prior precision ``α`` in ``precisions`` (default: the built one), the
        realisation integrated out exactly (known noise). ``-inf`` where the explicit recursion blew up: a mean
        beyond ``BLOW_UP`` times the initial maximum breaks the heat equation's maximum principle (an unstable
        run can stay finite and still fit the data with a wrong κ).

        Every weight of the recursion is ``α``-free and every covariance scales like ``1/α``, so one
        :meth:`moments` call serves all precisions.
        """
        precisions = np.atleast_1d(self.precision if precisions is None else precisions).astype(float)
        mean, cov = self.moments(kappa)
        out = np.full(precisions.size, -np.inf)
        if not (np.all(np.isfinite(cov)) and np.max(np.abs(mean)) <= BLOW_UP * np.max(self.state_prior_mean)):
            return out
        noise = NOISE_SD**2 * np.eye(cov.shape[0])
        for i, alpha in enumerate(precisions):
            try:
                out[i] = gaussian_loglik(data, mean.reshape(data.shape), cov * (self.precision / alpha) + noise)
            except np.linalg.LinAlgError:
                pass
        return out


def _whiten(chol: np.ndarray, cross: np.ndarray) -> np.ndarray:
    """``cross L^{-T}``: the gain of a Gaussian conditional in whitened data (empty when there are no data)."""
    if chol.size == 0:
        return cross
    return solve_triangular(chol, cross.T, lower=True).T


def _psd_sqrt(cov: np.ndarray) -> np.ndarray:
    """A square root ``B B^T = cov`` of a covariance that rounding may have made slightly indefinite."""
    vals, vecs = np.linalg.eigh(0.5 * (cov + cov.T))
    return vecs * np.sqrt(np.clip(vals, 0.0, None))


def posterior_density(logliks: np.ndarray, kappas: np.ndarray) -> np.ndarray:
    """Normalised posterior density of κ on an equally spaced grid (flat prior). A second axis of ``logliks``
    (e.g. prior precisions on an equally spaced log grid, flat prior) is integrated out."""
    logliks = np.asarray(logliks, dtype=float)
    if logliks.ndim == 2:
        logliks = logsumexp(logliks, axis=1)
    dens = np.exp(logliks - np.max(logliks))
    return dens / (dens.sum() * (kappas[1] - kappas[0]))


def credible_interval(density: np.ndarray, kappas: np.ndarray, mass: float = 0.99) -> tuple[float, float]:
    """Equal-tailed interval of a gridded density."""
    cdf = np.cumsum(density) * (kappas[1] - kappas[0])
    return float(np.interp(0.5 * (1 - mass), cdf, kappas)), float(np.interp(0.5 * (1 + mass), cdf, kappas))
