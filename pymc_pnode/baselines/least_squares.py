r"""Single-shooting least squares with an accurate adaptive solver and exact gradients.

The classical baseline of the Fenrir and diffusion-tempering tables: minimise

.. math::

    L(\theta, y_0) = \sum_i \sum_o \Big(\frac{(H y(t_i; \theta, y_0))_o - \eta_{io}}{\sigma_o}\Big)^2

with L-BFGS-B, the gradient coming from forward sensitivities integrated together with the state
(:mod:`pymc_pnode.baselines.sensitivities`). Parameters may be optimised on a log scale and/or in a
box. A solve that fails (a pole, excessive stiffness) makes the trial point infeasible: the line search
backs off; if it fails at the initial guess the result reports it instead of raising.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field

import numpy as np

from pymc_pnode._lbfgs import FAILED_VALUE as _FAILED_VALUE  # returned for failed solves
from pymc_pnode._lbfgs import minimize_with_restarts
from pymc_pnode.baselines._inputs import Observations, validate_observations
from pymc_pnode.baselines.sensitivities import (
    DEFAULT_ATOL,
    DEFAULT_MAX_NFEV,
    DEFAULT_METHOD,
    DEFAULT_RTOL,
    integrate,
    validate_method,
)
from pymc_pnode.estimation import EstimationResult
from pymc_pnode.ode import ODE
from pymc_pnode.validation import as_positive_float, as_positive_int, validate_bounds

__all__ = ["least_squares_objective", "rk_least_squares"]

# Largest relative projected gradient (see ``_relative_gradient``) accepted as stationary.
_STATIONARY = 1e-4


@dataclass
class _SingleShootingProblem:
    """Objective and exact gradient of single shooting in the optimiser's coordinates."""

    ode: ODE
    obs: Observations
    y0_fixed: np.ndarray
    fit_y0: bool
    log_mask: np.ndarray
    _: KW_ONLY
    method: str
    rtol: float
    atol: float
    max_step: float = np.inf
    max_nfev: int = DEFAULT_MAX_NFEV
    n_solves: int = field(default=0, init=False)
    n_failed: int = field(default=0, init=False)
    last_message: str = field(default="", init=False)

    @property
    def k(self) -> int:
        return self.ode.n_theta

    def split(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        theta = np.array(u[: self.k], dtype=np.float64)
        theta[self.log_mask] = np.exp(theta[self.log_mask])
        y0 = np.array(u[self.k :]) if self.fit_y0 else self.y0_fixed
        return theta, y0

    def solve(self, theta, y0, sensitivities: bool):
        self.n_solves += 1
        return integrate(
            self.ode, y0, theta, self.obs.times, t0=self.obs.t0, wrt_y0=sensitivities and self.fit_y0,
            wrt_theta=sensitivities, method=self.method, rtol=self.rtol, atol=self.atol,
            max_step=self.max_step, max_nfev=self.max_nfev,
        )

    def value_and_grad(self, u: np.ndarray) -> tuple[float, np.ndarray]:
        theta, y0 = self.split(u)
        sol = self.solve(theta, y0, sensitivities=True)
        if not sol.success:
            self.n_failed += 1
            self.last_message = sol.message
            return _FAILED_VALUE, np.zeros_like(u)
        r = self.obs.residuals(sol.y)  # (n, n_obs)
        value = float(np.sum(r * r))
        # dL/dy_i = 2 H^T (r_i / sigma)
        gy = 2.0 * (r / self.obs.sigma) @ self.obs.H  # (n, d)
        g_theta = np.einsum("nd,ndk->k", gy, sol.dy_dtheta)
        g_theta[self.log_mask] *= theta[self.log_mask]  # chain rule for theta = exp(u)
        if self.fit_y0:
            g_y0 = np.einsum("nd,nde->e", gy, sol.dy_dy0)
            return value, np.concatenate([g_theta, g_y0])
        return value, g_theta


def _log_mask(log_theta, k: int) -> np.ndarray:
    if isinstance(log_theta, (bool, np.bool_)):
        return np.full(k, bool(log_theta))
    mask = np.asarray(log_theta)
    if mask.shape != (k,) or mask.dtype != bool:
        raise ValueError(f"log_theta must be a bool or a boolean array of shape ({k},)")
    return mask.copy()


def least_squares_objective(
    ode,
    data,
    times,
    theta,
    y0,
    *,
    t0: float | None = None,
    obs_matrix=None,
    obs_sigma=1.0,
    method: str = DEFAULT_METHOD,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
) -> tuple[float, np.ndarray, np.ndarray]:
    """The single-shooting objective and its exact gradient at one point (natural coordinates).

    Returns
    -------
    value : float
        Sum of squared weighted residuals (``inf`` if the solve fails).
    grad_theta : ndarray, shape (n_theta,)
    grad_y0 : ndarray, shape (d,)
    """
    obs = validate_observations(ode, data, times, t0=t0, obs_matrix=obs_matrix, obs_sigma=obs_sigma)
    validate_method(method)
    theta = ode.validate_theta(theta)
    y0 = ode.validate_y0(y0)
    prob = _SingleShootingProblem(ode, obs, y0, True, np.zeros(ode.n_theta, bool), method=method, rtol=rtol,
                                  atol=atol)
    value, grad = prob.value_and_grad(np.concatenate([theta, y0]))
    if value == _FAILED_VALUE:
        return np.inf, np.full(ode.n_theta, np.nan), np.full(ode.n_states, np.nan)
    return value, grad[: ode.n_theta], grad[ode.n_theta :]


def rk_least_squares(
    ode,
    data,
    times,
    *,
    theta0: Sequence[float],
    y0: Sequence[float] | None = None,
    fit_y0: bool | None = None,
    t0: float | None = None,
    obs_matrix=None,
    obs_sigma=1.0,
    method: str = DEFAULT_METHOD,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    log_theta: bool | Sequence[bool] = False,
    bounds: Sequence[tuple[float | None, float | None]] | None = None,
    y0_bounds: Sequence[tuple[float | None, float | None]] | None = None,
    maxiter: int = 1000,
    gtol: float = 1e-8,
    ftol: float = 1e-12,
    max_step: float = np.inf,
    max_nfev: int = DEFAULT_MAX_NFEV,
    max_restarts: int = 10,
) -> EstimationResult:
    r"""Single-shooting nonlinear least squares with an adaptive solver and exact gradients.

    Minimises the sum of squared weighted residuals
    :math:`\sum_{i,o} ((H y(t_i))_o - \eta_{io})^2 / \sigma_o^2` over the parameters (and optionally
    the initial state) with L-BFGS-B. Gradients come from forward sensitivities (exact for the
    augmented ODE up to the integration tolerance).

    Parameters
    ----------
    ode : pymc_pnode.ODE
        The model.
    data : array_like, shape (n, n_obs)
        Observations at ``times``; NaN marks a missing value.
    times : array_like, shape (n,)
        Strictly increasing observation times ``>= t0``.
    theta0 : array_like, shape (n_theta,)
        Initial guess of the parameters.
    y0 : array_like, shape (d,), optional
        Initial state at ``t0``: the starting guess if ``fit_y0``, else held fixed. If omitted the
        initial state is fitted, starting from ``data[0]`` (requires full observation at ``t0``).
    fit_y0 : bool, optional
        Whether to estimate the initial state (default: ``y0 is None``).
    t0 : float, optional
        Initial time (default ``ode.t0``).
    obs_matrix : array_like, shape (n_obs, d), optional
        Linear observation operator ``H`` (default identity).
    obs_sigma : float or array_like, shape (n_obs,)
        Noise scale of each observed output (the weights are ``1/sigma**2``).
    method : str
        ``solve_ivp`` method. ``RK45``/``DOP853`` for non-stiff problems, ``Radau``/``BDF``/``LSODA``
        (given the exact Jacobian) for stiff ones.
    rtol, atol : float
        Integration tolerances.
    log_theta : bool or array of bool, shape (n_theta,)
        Optimise these parameters on a log scale (they must be positive).
    bounds : sequence of (low, high), optional
        Box for the parameters in natural units (``None`` for unbounded sides).
    y0_bounds : sequence of (low, high), optional
        Box for the initial state.
    maxiter : int
        Maximum L-BFGS-B iterations.
    gtol, ftol : float
        L-BFGS-B stopping tolerances (projected gradient and relative decrease).
    max_step : float
        Maximum integrator step.
    max_nfev : int
        Budget of right-hand-side evaluations per solve; a trial point exceeding it (e.g. one that
        makes the problem stiff for an explicit method) counts as a failed solve.
    max_restarts : int
        Restarts of L-BFGS-B from the last accepted point (with a ten times shorter first step)
        when its line search stalled on a failed solve.

    Returns
    -------
    EstimationResult
        ``objective`` is the sum of squared weighted residuals; ``extra`` holds ``trajectory``
        (states at ``times``), ``fitted`` (``H y``), ``n_failed_solves`` and ``relative_gradient``
        (``converged`` requires it below 1e-4). A failed solve at the initial guess is reported
        with ``converged=False``.

    Raises
    ------
    ValueError
        For invalid input (shapes, non-finite values, unsorted times, non-positive log parameters,
        bounds that exclude the initial guess, unknown method).

    Examples
    --------
    >>> res = rk_least_squares(ode, data, times, theta0=[0.5, 0.5], y0=[1.0, 1.0])  # doctest: +SKIP
    >>> res.theta, res.converged  # doctest: +SKIP
    """
    start = time.perf_counter()
    obs = validate_observations(ode, data, times, t0=t0, obs_matrix=obs_matrix, obs_sigma=obs_sigma)
    validate_method(method)
    rtol = as_positive_float(rtol, "rtol")
    atol = as_positive_float(atol, "atol")
    maxiter = as_positive_int(maxiter, "maxiter")
    gtol = as_positive_float(gtol, "gtol")
    ftol = as_positive_float(ftol, "ftol")
    if not (max_step > 0):
        raise ValueError(f"max_step must be positive, got {max_step}")
    max_nfev = as_positive_int(max_nfev, "max_nfev")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, (int, np.integer)) or max_restarts < 0:
        raise ValueError(f"max_restarts must be a non-negative integer, got {max_restarts!r}")
    k, d = ode.n_theta, ode.n_states
    theta0 = ode.validate_theta(theta0, "theta0")
    if fit_y0 is None:
        fit_y0 = y0 is None
    if y0 is None:
        if not fit_y0:
            raise ValueError("y0 is required when fit_y0=False")
        if not (obs.identity and obs.times[0] == obs.t0 and np.all(obs.mask[0])):
            raise ValueError(
                "y0 is required unless every state is observed at t0 (then data[0] is the "
                "starting guess)"
            )
        y0 = obs.data[0]
    y0 = ode.validate_y0(y0)
    if k == 0 and not fit_y0:
        raise ValueError("nothing to estimate: the ODE has no parameters and fit_y0=False")
    log_mask = _log_mask(log_theta, k)
    if np.any(theta0[log_mask] <= 0):
        raise ValueError("theta0 must be positive for the parameters in log_theta")
    tb = validate_bounds(bounds, k, "bounds")
    yb = validate_bounds(y0_bounds, d, "y0_bounds")
    for i, (lo, hi) in enumerate(tb):
        if not lo <= theta0[i] <= hi:
            raise ValueError(f"theta0[{i}] = {theta0[i]} lies outside bounds ({lo}, {hi})")
        if log_mask[i]:
            if hi <= 0:
                raise ValueError(f"bounds[{i}] must allow positive values for a log parameter")
            tb[i] = (np.log(lo) if lo > 0 else -np.inf, np.log(hi) if np.isfinite(hi) else np.inf)
    if fit_y0:
        for i, (lo, hi) in enumerate(yb):
            if not lo <= y0[i] <= hi:
                raise ValueError(f"y0[{i}] = {y0[i]} lies outside y0_bounds ({lo}, {hi})")

    prob = _SingleShootingProblem(ode, obs, y0, fit_y0, log_mask, method=method, rtol=rtol, atol=atol,
                                  max_step=max_step, max_nfev=max_nfev)
    u0 = theta0.copy()
    u0[log_mask] = np.log(u0[log_mask])
    if fit_y0:
        u0 = np.concatenate([u0, y0])
    all_bounds = tb + (yb if fit_y0 else [])
    lbfgs_bounds = [(None if not np.isfinite(lo) else lo, None if not np.isfinite(hi) else hi)
                    for lo, hi in all_bounds]

    def finish(theta, y0_est, value, nit, nfev, converged, message, sol=None, rel_grad=np.nan):
        extra = {"n_failed_solves": prob.n_failed, "log_theta": log_mask, "method_ivp": method,
                 "relative_gradient": rel_grad}
        if sol is not None and sol.success:
            extra["trajectory"] = sol.y
            extra["fitted"] = sol.y @ obs.H.T
            extra["times"] = obs.times
        return EstimationResult(
            theta=theta, y0=y0_est, objective=value, n_iterations=nit,
            wall_time=time.perf_counter() - start, converged=converged, message=message,
            method="rk_least_squares", objective_name="sum of squared weighted residuals",
            n_function_evals=nfev, n_ode_solves=prob.n_solves, extra=extra,
        )

    f0, _ = prob.value_and_grad(u0)
    if f0 == _FAILED_VALUE:
        return finish(theta0, y0, np.inf, 0, 1, False,
                      f"ODE solve failed at the initial guess: {prob.last_message}")

    # Restarts after line-search stalls at failed solves: see pymc_pnode._lbfgs.
    res = minimize_with_restarts(
        prob.value_and_grad, u0, bounds=lbfgs_bounds, maxiter=maxiter, gtol=gtol, ftol=ftol,
        max_restarts=max_restarts,
        is_stationary=lambda u, f, g: _relative_gradient(u, g, f, lbfgs_bounds) <= _STATIONARY)
    u, grad, nit, nfev, restarts = res.x, res.jac, res.nit, res.nfev, res.restarts
    theta, y0_est = prob.split(u)
    sol = prob.solve(theta, y0_est, sensitivities=False)
    if not sol.success:  # pragma: no cover - the optimiser only accepts feasible points
        return finish(theta, y0_est, np.inf, nit, nfev, False,
                      f"ODE solve failed at the final point: {sol.message}")
    r = obs.residuals(sol.y)
    value = float(np.sum(r * r))
    message = str(res.message)
    rel_grad = _relative_gradient(u, grad, value, lbfgs_bounds)
    # Trust L-BFGS-B's stop only at a (relatively) stationary point: its "relative reduction" exit
    # also fires when the line search stalls, and its "ABNORMAL" exit at a stationary point is only
    # a numerical-precision stop.
    converged = rel_grad <= _STATIONARY and (res.success or "ABNORMAL" in message.upper())
    if not converged:
        where = ("a point that is not stationary" if rel_grad > _STATIONARY
                 else "a nearly stationary point")
        message = (f"L-BFGS-B stopped ({message.strip() or 'no message'}) at {where} "
                   f"(relative gradient {rel_grad:.2g})")
    if restarts:
        message += f"; {restarts} restart(s) after line-search stalls"
    if prob.n_failed:
        message += f"; {prob.n_failed} trial point(s) with failed ODE solves were rejected"
    return finish(theta, y0_est, value, nit, nfev, converged, message, sol, rel_grad)


def _relative_gradient(x, g, f, bounds) -> float:
    """``max_i |pg_i| max(1, |x_i|) / max(1, |f|)`` with ``pg`` the projected gradient."""
    pg = _projected_gradient(x, g, bounds)
    scale = np.maximum(1.0, np.abs(x)) / max(1.0, abs(float(f)))
    return float(np.max(np.abs(pg) * scale)) if pg.size else 0.0


def _projected_gradient(x, g, bounds) -> np.ndarray:
    g = np.array(g, dtype=np.float64)
    for i, (lo, hi) in enumerate(bounds):
        if lo is not None and x[i] <= lo and g[i] > 0:
            g[i] = 0.0
        if hi is not None and x[i] >= hi and g[i] < 0:
            g[i] = 0.0
    return g
