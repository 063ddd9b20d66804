r"""IRLS estimation with isotonic discretisation-error variances (Matsuda & Miyatake, 2021, §2–3).

The observations are modelled as :math:`y_{k,j} \sim N(H_j \tilde x_k(\theta), \gamma_j^2 +
\sigma_{k,j}^2)` where :math:`\tilde x_k` is a fixed-step numerical solution and the discretisation
error variances :math:`\sigma_{k,j}^2` are non-decreasing in k. With weights
:math:`w_{k,j} = 1/(\gamma_j^2 + \sigma_{k,j}^2)` the negative log-likelihood is (up to constants)

.. math::

    g(\theta, w) = \sum_{k,j} \bigl(-\log w_{k,j} + w_{k,j} r_{k,j}(\theta)^2\bigr),

minimised by alternating (i) the closed-form isotonic weight update
(:func:`~pymc_pnode.classical.isotonic.isotonic_weights`) and (ii) weighted least squares in
:math:`\theta` by L-BFGS with exact discrete-adjoint gradients. ``n_iter = 0`` is the conventional
(quasi-maximum-likelihood) baseline with all weights fixed at :math:`1/\gamma_j^2`. The alternative weight
update of Remark 3.7 (:class:`PerturbedSolverWeights`) estimates :math:`\sigma_{k,j}^2` from randomised solves
instead.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import minimize
from threadpoolctl import threadpool_limits

from pymc_pnode.classical.isotonic import isotonic_weights, weight_objective
from pymc_pnode.classical.rk import FixedStepSolver
from pymc_pnode.estimation import EstimationResult
from pymc_pnode.validation import validate_noise, validate_obs_matrix

__all__ = ["STATIONARITY_TOL", "IRLSHistory", "IRLSResult", "PerturbedSolverWeights", "WeightedLSProblem", "irls_fit"]

_DEFAULT_LBFGS = {"maxiter": 2000, "ftol": 1e-13, "gtol": 1e-8, "maxcor": 20}


def single_threaded_blas():
    """Context limiting BLAS to one thread.

    L-BFGS-B works on a handful of parameters; multi-threaded OpenBLAS on such tiny vectors spends
    its time synchronising threads (measured: 180 ms instead of 2 ms per small L-BFGS run on a
    loaded 2-core machine).
    """
    return threadpool_limits(limits=1, user_api="blas")


def _obs_matrix(obs_matrix, n_states: int) -> np.ndarray:
    h = validate_obs_matrix(obs_matrix, n_states)
    if np.linalg.matrix_rank(h) < h.shape[0]:
        raise ValueError("obs_matrix must have full row rank")
    return np.ascontiguousarray(h)


def _data_matrix(data, n_times: int, n_obs: int) -> np.ndarray:
    y = np.asarray(data, dtype=np.float64)
    if y.ndim == 1 and n_obs == 1:
        y = y[:, None]
    if y.shape != (n_times, n_obs):
        raise ValueError(f"data must have shape ({n_times}, {n_obs}) (times x observed components), "
                         f"got {np.shape(data)}")
    if not np.all(np.isfinite(y)):
        raise ValueError("data must be finite")
    return y


@dataclass(frozen=True)
class PerturbedSolverWeights:
    r"""The weight update of Matsuda & Miyatake (2021, Remark 3.7): :math:`\sigma_{k,j}^2` is the sample variance
    of :math:`H_j x_k` over ``n_samples`` randomised solves at the current parameters (the probabilistic integrator
    of Conrad et al., 2017, :meth:`~pymc_pnode.classical.rk.FixedStepSolver.perturbed_solve`), and
    :math:`w_{k,j} = 1/(\gamma_j^2 + \sigma_{k,j}^2)`.

    No monotonicity is imposed; every update costs ``n_samples`` solves at three RK steps per step (the
    isotonic update costs none). Every update draws the same noise (``seed``): common random numbers make the
    weights a smooth function of the parameters, so IRLS iterates a deterministic map.

    Parameters
    ----------
    n_samples : int, default 100
        Randomised solves per update (the paper's 100).
    seed : int, default 0
        Seed of the solves' noise.
    """

    n_samples: int = 100
    seed: int = 0

    def __post_init__(self):
        if int(self.n_samples) != self.n_samples or self.n_samples < 2:
            raise ValueError(f"n_samples must be an integer >= 2, got {self.n_samples!r}")

    def weights(self, problem: WeightedLSProblem, z: np.ndarray) -> np.ndarray | None:
        """Weights at ``z`` (None if a randomised solve diverges)."""
        y0, theta = problem.split(z)
        samples = problem.solver.perturbed_solve(y0, theta, self.n_samples, self.seed) @ problem.obs_matrix.T
        if not np.all(np.isfinite(samples)):
            return None
        return 1.0 / (problem.noise_var + samples.var(axis=0, ddof=1))


class WeightedLSProblem:
    r"""The weighted least-squares problem behind IRLS, on the stacked vector ``z = [y0, theta]``.

    Only the entries marked ``free`` are optimised; the others stay at their values in ``z``.

    Parameters
    ----------
    solver : FixedStepSolver
        Fixed-step solver on the observation times.
    data : ndarray, shape (K, J)
        Observations.
    obs_matrix : ndarray, shape (J, n_states)
        Observation matrix H.
    noise_var : ndarray, shape (J,)
        Noise variances (or lower bounds): the weight caps are ``1 / noise_var``.
    z : ndarray, shape (n_states + n_theta,)
        Values of the fixed entries (and starting values of the free ones).
    free : ndarray of bool, shape (n_states + n_theta,)
        Which entries are estimated.
    lbfgs_options : dict, optional
        Options of ``scipy.optimize.minimize(method="L-BFGS-B")``.
    weight_update : PerturbedSolverWeights, optional
        The weight update; default the isotonic one.
    """

    def __init__(self, solver, data, obs_matrix, noise_var, z, free, lbfgs_options=None, weight_update=None):
        self.solver = solver
        self.data = data
        self.obs_matrix = obs_matrix
        self.noise_var = noise_var
        self.z = np.array(z, dtype=np.float64)
        self.free = np.array(free, dtype=bool)
        self.lbfgs_options = {**_DEFAULT_LBFGS, **(lbfgs_options or {})}
        self.weight_update = weight_update
        self.max_restarts = 3
        self.n_states = solver.n_states
        self.n_evals = 0
        names = [f"y0[{i}]" for i in range(solver.n_states)]
        names += [f"theta[{i}]" for i in range(solver.n_theta)]
        self.names = names

    @property
    def free_names(self) -> list[str]:
        return [n for n, f in zip(self.names, self.free) if f]

    def with_fixed(self, index: int, value: float) -> WeightedLSProblem:
        """The same problem with entry ``index`` of ``z`` fixed at ``value`` (for profiling)."""
        z = self.z.copy()
        z[index] = value
        free = self.free.copy()
        free[index] = False
        sub = WeightedLSProblem(
            self.solver, self.data, self.obs_matrix, self.noise_var, z, free, self.lbfgs_options, self.weight_update
        )
        sub.max_restarts = self.max_restarts
        return sub

    def expand(self, x: np.ndarray, z: np.ndarray | None = None) -> np.ndarray:
        out = (self.z if z is None else z).copy()
        out[self.free] = x
        return out

    def split(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        d = self.n_states
        return np.ascontiguousarray(z[:d]), np.ascontiguousarray(z[d:])

    def solve(self, z: np.ndarray):
        """``(states at times, trajectory, ok)`` for the stacked parameters ``z``."""
        y0, theta = self.split(z)
        return self.solver.forward(y0, theta)

    def residuals(self, z: np.ndarray) -> np.ndarray | None:
        """Residuals ``data - ys H^T`` (``(K, J)``), or None when the solve diverges."""
        ys, _, ok = self.solve(z)
        if not ok:
            return None
        return self.data - ys @ self.obs_matrix.T

    def objective(self, z: np.ndarray, weights: np.ndarray) -> float:
        """:math:`g(z, w)`; ``inf`` when the solve diverges."""
        r = self.residuals(z)
        return math.inf if r is None else weight_objective(weights, r)

    def rss_and_grad(self, x: np.ndarray, weights: np.ndarray, z: np.ndarray | None = None):
        """Weighted residual sum of squares and its exact gradient in the free entries."""
        zz = self.expand(x, z)
        y0, theta = self.split(zz)
        ys, traj, ok = self.solver.forward(y0, theta)
        self.n_evals += 1
        if not ok:
            # Signal a failed trial point; L-BFGS backtracks from a non-finite value.
            return math.inf, np.zeros_like(x)
        r = self.data - ys @ self.obs_matrix.T
        wr = weights * r
        value = float(np.sum(wr * r))
        g_obs = np.ascontiguousarray(-2.0 * wr @ self.obs_matrix)
        g_y0, g_theta = self.solver.backward(theta, traj, g_obs)
        grad = np.concatenate([g_y0, g_theta])[self.free]
        return value, grad

    def minimize_rss(self, weights: np.ndarray, z_start: np.ndarray):
        """Weighted least squares from ``z_start``: ``(z_opt, rss, scipy result)``.

        Never returns a point worse than the start (so IRLS decreases ``g`` monotonically).
        """
        x0 = z_start[self.free]
        if x0.size == 0:
            r = self.residuals(z_start)
            rss = math.inf if r is None else float(np.sum(weights * r * r))
            return z_start.copy(), rss, None
        f0, g0 = self.rss_and_grad(x0, weights, z_start)
        # L-BFGS-B stops on an infinite trial value; a finite value above f0 (never accepted by
        # the sufficient-decrease test) makes its line search backtrack from a diverging solve.
        penalty = 10.0 * (1.0 + abs(f0))
        best = [f0, x0.copy(), g0]

        def fun(x):
            value, grad = self.rss_and_grad(x, weights, z_start)
            if not math.isfinite(value):
                return penalty, grad
            if value < best[0]:
                best[0], best[1], best[2] = value, x.copy(), grad.copy()
            return value, grad

        # A failed line search (e.g. near-singular trajectories with huge gradients) may leave
        # scipy's result at its last trial point: keep the best point seen and restart from it
        # while that still makes progress. The reported result is the last run that made progress,
        # with the iterations of all runs.
        x_start, f_start, report, total_nit = x0, f0, None, 0
        for _ in range(1 + self.max_restarts):
            before = best[0]
            res = minimize(fun, x_start, jac=True, method="L-BFGS-B", options=self.lbfgs_options)
            total_nit += int(res.nit)
            if report is None or best[0] < before:
                report = res
            # status 1: the iteration/evaluation budget is spent (no restart beyond it).
            stalled = not best[0] < f_start - 1e-12 * max(1.0, abs(f_start))
            if res.success or res.status == 1 or stalled:
                break
            x_start, f_start = best[1], best[0]
        # The scipy result describes the point returned.
        report.x, report.fun, report.jac, report.nit = best[1], best[0], best[2], total_nit
        return self.expand(best[1], z_start), float(best[0]), report

    def newton_decrement(self, z: np.ndarray, weights: np.ndarray, rel_step: float = 1e-5) -> float:
        r"""Decrease of the weighted residual sum predicted by one more Newton step from ``z``.

        :math:`\tfrac12 \nabla R^T (\nabla^2 R)^{+} \nabla R` in the free entries, with the
        Hessian from central differences of the exact adjoint gradient (``2 n_free`` solves). It
        is invariant to rescaling the parameters and measured in units of :math:`g = -2\log L`,
        so it tells whether an optimiser's end point is a minimum to statistical precision.

        Parameters
        ----------
        z : ndarray
            Stacked ``[y0, theta]``.
        weights : ndarray, shape (K, J)
            Weights of the residual sum.
        rel_step : float, default 1e-5
            Difference step relative to ``max(|z_i|, 1)``.

        Returns
        -------
        float
            The decrement (``>= 0``); ``inf`` when a solve fails or the Hessian has a clearly
            negative eigenvalue (not a minimum).
        """
        x = np.asarray(z, dtype=np.float64)[self.free]
        if x.size == 0:
            return 0.0
        f, grad = self.rss_and_grad(x, weights, z)
        if not math.isfinite(f) or not np.all(np.isfinite(grad)):
            return math.inf
        n = x.size
        hess = np.empty((n, n))
        for i in range(n):
            eps = rel_step * max(abs(x[i]), 1.0)
            e = np.zeros(n)
            e[i] = eps
            f_plus, g_plus = self.rss_and_grad(x + e, weights, z)
            f_minus, g_minus = self.rss_and_grad(x - e, weights, z)
            if not (math.isfinite(f_plus) and math.isfinite(f_minus)):
                return math.inf
            hess[:, i] = (g_plus - g_minus) / (2.0 * eps)
        hess = 0.5 * (hess + hess.T)
        if not np.all(np.isfinite(hess)):
            return math.inf
        vals, vecs = np.linalg.eigh(hess)
        top = max(float(np.max(np.abs(vals))), 1e-300)
        if vals.min() < -1e-6 * top:
            return math.inf
        proj = vecs.T @ grad
        keep = vals > 1e-12 * top
        return float(0.5 * np.sum(proj[keep] ** 2 / vals[keep]))

    def weights_at(self, z: np.ndarray) -> np.ndarray | None:
        """The weight update at ``z``, isotonic unless :attr:`weight_update` says otherwise (None if the solve
        diverges)."""
        if self.weight_update is not None:
            return self.weight_update.weights(self, z)
        r = self.residuals(z)
        return None if r is None else isotonic_weights(r, self.noise_var)

    def fixed_weights(self) -> np.ndarray:
        """The baseline weights ``1 / noise_var`` at every time."""
        return np.tile(1.0 / self.noise_var, (self.data.shape[0], 1))


@dataclass
class IRLSHistory:
    """Per-iteration record of an IRLS run (iteration ``l = 1..L``).

    Attributes
    ----------
    objective : list of float
        :math:`g(\\theta^{(l)}, w^{(l)})` after the parameter update of iteration l (for the
        baseline, one entry with the fixed weights).
    objective_after_weights : list of float
        :math:`g(\\theta^{(l-1)}, w^{(l)})` after the weight update of iteration l.
    params : list of ndarray
        Free parameters; entry 0 is the initial guess, entry l the estimate after iteration l.
    weights : list of ndarray
        :math:`w^{(l)}` of every iteration, shape ``(K, J)`` each.
    lbfgs_iterations : list of int
        L-BFGS iterations used by every parameter update (summed over restarts).
    lbfgs_messages : list of str
        Termination messages of L-BFGS.
    """

    objective: list[float] = field(default_factory=list)
    objective_after_weights: list[float] = field(default_factory=list)
    params: list[np.ndarray] = field(default_factory=list)
    weights: list[np.ndarray] = field(default_factory=list)
    lbfgs_iterations: list[int] = field(default_factory=list)
    lbfgs_messages: list[str] = field(default_factory=list)


@dataclass(kw_only=True, repr=False)  # the common repr of EstimationResult, not every array
class IRLSResult(EstimationResult):
    """Result of :func:`irls_fit`: an :class:`~pymc_pnode.estimation.EstimationResult` with the fitted
    discretisation-error variances.

    The common fields mean: ``theta``, ``y0`` the estimated (or, where fixed, given) parameters and
    initial state; ``objective`` the final :math:`g(\\theta, w)` (:math:`-2\\log L` up to the constant
    :math:`KJ\\log 2\\pi`); ``n_iterations`` the IRLS iterations performed (0 for the baseline; also
    ``n_iter``); ``n_function_evals`` the forward solves, each with one adjoint pass (``n_ode_solves``
    counts both), including the ``2 n_free + 1`` of the convergence check; ``method`` ``"irls"`` or
    ``"baseline"``; ``converged`` whether the last weighted least-squares solve ended at a minimum: its
    Newton decrement (see ``newton_decrement``) is at most ``1e-6`` (or ``1e-10`` times the weighted
    residual sum). This says nothing about whether IRLS itself has settled (see
    ``history.objective``) or whether the minimum is the global one.

    Attributes
    ----------
    weights : ndarray, shape (K, J)
        Final weights :math:`w_{k,j} = 1/(\\gamma_j^2 + \\sigma_{k,j}^2)`, non-increasing in k.
    error_var : ndarray, shape (K, J)
        Fitted discretisation-error variances :math:`\\sigma_{k,j}^2` per time and observed
        component (non-decreasing in k; zero for the baseline).
    noise_var : ndarray, shape (J,)
        The noise variances used; with ``noise_var_is_lower_bound=True`` the estimates
        :math:`1/w_{1,j}`.
    fitted : ndarray, shape (K, n_states)
        Numerical solution at the observation times at the estimate.
    history : IRLSHistory
        Iteration history.
    param_names : list of str
        Names of the estimated entries of ``[y0, theta]`` (``"y0[i]"``, ``"theta[i]"``).
    problem : WeightedLSProblem
        The problem definition, reused by :func:`~pymc_pnode.classical.profile.profile_intervals`.
    newton_decrement : float
        Decrease of the weighted residual sum that one more Newton step would achieve at the
        estimate (Hessian by differences of the exact gradient), in units of
        :math:`g = -2 \\log L`; ``inf`` if the Hessian is not positive semi-definite.
    """

    weights: np.ndarray
    error_var: np.ndarray
    noise_var: np.ndarray
    fitted: np.ndarray
    history: IRLSHistory
    param_names: list[str]
    problem: WeightedLSProblem = field(repr=False)
    newton_decrement: float = math.nan

    @property
    def n_iter(self) -> int:
        """Alias of ``n_iterations``."""
        return self.n_iterations

    def estimates(self) -> dict[str, np.ndarray]:
        """``theta``, ``y0``, the discretisation-error variances ``error_var`` and ``noise_var``."""
        return {**super().estimates(), "error_var": self.error_var, "noise_var": self.noise_var}

    @property
    def params(self) -> np.ndarray:
        """The estimated entries of ``[y0, theta]``, in the order of ``param_names``."""
        return np.concatenate([self.y0, self.theta])[self.problem.free]

    @property
    def z(self) -> np.ndarray:
        """The full stacked vector ``[y0, theta]``."""
        return np.concatenate([self.y0, self.theta])

    def profile(self, **kwargs: Any):
        """Profile-likelihood confidence intervals; see
        :func:`~pymc_pnode.classical.profile.profile_intervals`."""
        from pymc_pnode.classical.profile import profile_intervals

        return profile_intervals(self, **kwargs)


#: Largest Newton decrement (in units of g = -2 log L) of a converged fit.
STATIONARITY_TOL = 1e-6


def run_irls(problem: WeightedLSProblem, z_start: np.ndarray, n_iter: int, tol: float | None = None):
    """Alternate isotonic weight updates and weighted least squares from ``z_start``.

    Returns ``(z, weights, g, history, success)`` (``success``: scipy's flag for the last
    weighted least-squares solve). With ``n_iter = 0`` the weights stay at
    ``1 / noise_var`` and a single weighted least-squares problem is solved. With ``tol``, stops
    once an iteration lowers ``g`` by less than ``tol * max(1, |g|)``.
    """
    hist = IRLSHistory()
    hist.params.append(z_start[problem.free].copy())
    z = z_start.copy()
    success = True

    def record(res):
        nonlocal success
        if res is None:
            hist.lbfgs_iterations.append(0)
            hist.lbfgs_messages.append("no free parameters")
            return
        hist.lbfgs_iterations.append(int(res.nit))
        hist.lbfgs_messages.append(str(res.message))
        success = bool(res.success)

    def fit(w, z):
        """Minimise the weighted RSS from ``z`` and record the fit; the minimiser and its objective."""
        z, _, res = problem.minimize_rss(w, z)
        record(res)
        g = problem.objective(z, w)
        hist.objective.append(g)
        hist.params.append(z[problem.free].copy())
        hist.weights.append(w)
        return z, g

    if n_iter == 0:
        w = problem.fixed_weights()
        z, g = fit(w, z)
        return z, w, g, hist, success

    w = None
    g = math.inf
    for iteration in range(n_iter):
        w_new = problem.weights_at(z)
        if w_new is None:  # the solve at the initial guess, or a randomised solve of PerturbedSolverWeights
            where = "the initial guess" if iteration == 0 else f"the estimate of iteration {iteration}"
            raise ValueError(f"the weight update failed: a numerical solution diverges at {where}")
        w = w_new
        hist.objective_after_weights.append(problem.objective(z, w))
        z, g_new = fit(w, z)
        done = tol is not None and g - g_new <= tol * max(1.0, abs(g_new))
        g = g_new
        if done:
            break
    return z, w, g, hist, success


def irls_fit(
    ode,
    data,
    times,
    *,
    noise_var,
    method: str = "rk4",
    step: float,
    theta0,
    y0,
    n_iter: int = 20,
    obs_matrix=None,
    fix_y0: bool = False,
    fix_theta=None,
    noise_var_is_lower_bound: bool = False,
    alignment: str = "exact",
    tol: float | None = None,
    lbfgs_options: dict | None = None,
    weights: str | PerturbedSolverWeights = "isotonic",
) -> IRLSResult:
    r"""Fit ODE parameters with Matsuda & Miyatake's IRLS (isotonic discretisation-error variances).

    Parameters
    ----------
    ode : pymc_pnode.ODE
        The differential equation; the solve starts at ``ode.t0``.
    data : array_like, shape (K, J)
        Observations :math:`y_k = H x(t_k) + \varepsilon_k` (``(K,)`` allowed when J = 1).
    times : array_like, shape (K,)
        Strictly increasing observation times, ``times[0] >= ode.t0``.
    noise_var : float or array_like, shape (J,)
        Observation-noise variances :math:`\gamma_j^2 > 0` (variances, not standard deviations).
        With ``noise_var_is_lower_bound=True``, lower bounds on them (the unknown-noise variant,
        Remark 3.3 of the paper).
    method : {"rk4", "euler", "heun", "midpoint", "stormer_verlet"}, default "rk4"
        Fixed-step scheme (see :func:`~pymc_pnode.classical.rk.rk_solve`).
    step : float
        Step size of the scheme.
    theta0 : array_like, shape (n_theta,)
        Initial guess of the parameters.
    y0 : array_like, shape (n_states,)
        Initial state at ``ode.t0``: initial guess (estimated together with theta) or, with
        ``fix_y0=True``, its known value.
    n_iter : int, default 20
        IRLS iterations L (IRLS(L) of the paper; 20 is the paper's "IRLS"). ``0`` gives the
        conventional baseline: weights fixed at ``1 / noise_var``.
    obs_matrix : array_like, shape (J, n_states), optional
        Observation matrix H (full row rank); default identity.
    fix_y0 : bool, default False
        Keep the initial state at ``y0``.
    fix_theta : array_like of bool or int, optional
        Mask (or indices) of parameters kept at their ``theta0`` values.
    noise_var_is_lower_bound : bool, default False
        Treat ``noise_var`` as lower bounds; the noise variances are then estimated as
        :math:`1/w_{1,j}` and the error variances as :math:`1/w_{k,j} - 1/w_{1,j}` (Matsuda &
        Miyatake, 2021, Remark 3.3). The estimate :math:`1/w_{1,j}` is biased low: the isotonic
        fit's first value is the smallest running mean :math:`\min_m \frac1m\sum_{k\le m} r_{k,j}^2`
        of the squared residuals (clipped at the bound), the boundary inconsistency of isotonic
        regression (Woodroofe & Sun, 1993). For residuals that are pure noise of variance
        :math:`\gamma^2` and K = 191 times its mean is :math:`0.37\gamma^2`, its median
        :math:`0.31\gamma^2` and its 5–95 % range :math:`0.004`–:math:`0.94\gamma^2` (simulated); use
        it as a rough scale, as the paper does, not as an estimate of :math:`\gamma^2`.
    alignment : {"exact", "shrink"}, default "exact"
        Step alignment with the observation times (see :class:`FixedStepSolver`).
    tol : float, optional
        Stop early when an iteration lowers g by less than ``tol * max(1, |g|)``. Default: run
        exactly ``n_iter`` iterations, as in the paper.
    lbfgs_options : dict, optional
        Options passed to ``scipy.optimize.minimize(method="L-BFGS-B")``.
    weights : "isotonic" or PerturbedSolverWeights, default "isotonic"
        The weight update: the closed-form isotonic one (§3.2), or error variances from randomised solves
        (Remark 3.7, :class:`PerturbedSolverWeights`; its weights need not be monotone).

    Returns
    -------
    IRLSResult

    Raises
    ------
    ValueError
        Invalid shapes or values (non-positive noise variance, non-increasing times, misaligned
        step, negative ``n_iter``), or a numerical solution that diverges at the initial guess.

    Examples
    --------
    >>> res = irls_fit(ode, y, t_obs, noise_var=0.01, method="euler", step=0.02,
    ...                theta0=[1, 1, 1], y0=[-1, -1], fix_y0=True)  # doctest: +SKIP
    >>> res.theta, res.error_var[-1]  # doctest: +SKIP
    """
    start = time.perf_counter()
    if int(n_iter) != n_iter or n_iter < 0:
        raise ValueError(f"n_iter must be a non-negative integer, got {n_iter!r}")
    n_iter = int(n_iter)
    if tol is not None and not (tol >= 0.0):
        raise ValueError(f"tol must be non-negative, got {tol!r}")
    solver = FixedStepSolver(ode, times, method=method, step=step, alignment=alignment)
    h = _obs_matrix(obs_matrix, ode.n_states)
    y = _data_matrix(data, solver.times.size, h.shape[0])
    gamma2 = validate_noise(noise_var, h.shape[0], "noise_var")
    y0_arr = ode.validate_y0(y0)
    theta_arr = ode.validate_theta(theta0, "theta0")
    free = np.ones(ode.n_states + ode.n_theta, dtype=bool)
    if fix_y0:
        free[: ode.n_states] = False
    if fix_theta is not None:
        mask = np.asarray(fix_theta)
        if mask.dtype == bool:
            if mask.shape != (ode.n_theta,):
                raise ValueError(f"fix_theta mask must have shape ({ode.n_theta},), got {mask.shape}")
            free[ode.n_states:][mask] = False
        else:
            idx = mask.astype(int).reshape(-1)
            if np.any((idx < 0) | (idx >= ode.n_theta)):
                raise ValueError(f"fix_theta indices must lie in [0, {ode.n_theta}), got {idx}")
            free[ode.n_states + idx] = False
    if not free.any():
        raise ValueError("nothing to estimate: all of y0 and theta are fixed")
    z0 = np.concatenate([y0_arr, theta_arr])
    if not ((isinstance(weights, str) and weights == "isotonic") or isinstance(weights, PerturbedSolverWeights)):
        raise ValueError(f"weights must be 'isotonic' or a PerturbedSolverWeights, got {weights!r}")
    if isinstance(weights, PerturbedSolverWeights) and method == "stormer_verlet":
        raise ValueError("weights=PerturbedSolverWeights(...) needs an explicit Runge–Kutta method, not stormer_verlet")
    update = weights if isinstance(weights, PerturbedSolverWeights) else None
    problem = WeightedLSProblem(solver, y, h, gamma2, z0, free, lbfgs_options, update)
    if problem.residuals(z0) is None:
        raise ValueError("the numerical solution diverges at the initial guess (theta0, y0)")

    with single_threaded_blas():
        z, w, g, hist, _ = run_irls(problem, z0, n_iter, tol)
        # L-BFGS often ends with a failed line search at the optimum; judge the end point itself.
        decrement = problem.newton_decrement(z, w) if math.isfinite(g) else math.inf
    rss = float(np.sum(w * (y - problem.solve(z)[0] @ h.T) ** 2)) if math.isfinite(g) else math.inf
    converged = decrement <= max(STATIONARITY_TOL, 1e-10 * abs(rss))
    total_var = 1.0 / w
    if noise_var_is_lower_bound and n_iter > 0:
        noise_est = total_var[0].copy()
    else:
        noise_est = gamma2.copy()
    error_var = np.maximum(total_var - noise_est, 0.0)
    fitted = problem.solve(z)[0]
    n_done = len(hist.objective) if n_iter > 0 else 0
    message = (
        f"{'baseline (fixed weights)' if n_iter == 0 else f'IRLS, {n_done} iterations'}; "
        f"L-BFGS: {hist.lbfgs_messages[-1] if hist.lbfgs_messages else 'n/a'}"
    )
    return IRLSResult(
        theta=z[ode.n_states:].copy(),
        y0=z[: ode.n_states].copy(),
        weights=w,
        error_var=error_var,
        noise_var=noise_est,
        objective=float(g),
        fitted=fitted,
        history=hist,
        n_iterations=n_done,
        converged=bool(converged),
        message=message,
        wall_time=time.perf_counter() - start,
        n_function_evals=problem.n_evals,
        n_ode_solves=2 * problem.n_evals,
        objective_name="g = -2 log L - KJ log 2 pi",
        param_names=problem.free_names,
        problem=problem,
        method="irls" if n_iter > 0 else "baseline",
        newton_decrement=float(decrement),
    )
