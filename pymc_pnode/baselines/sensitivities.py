r"""Adaptive scipy integration of an :class:`~pymc_pnode.ODE` with forward sensitivities or adjoints.

Forward sensitivities integrate the augmented system

.. math::

    \dot y = f(y, t, \theta), \qquad
    \dot S = J_y S + [\,0 \;|\; J_\theta\,], \qquad S(t_0) = [\,I \;|\; 0\,],

where :math:`S = \partial y / \partial (y_0, \theta)`, so gradients are exact for the augmented ODE up to
the integration tolerance (the error control covers the sensitivities too). The adjoint integrates

.. math::

    \dot\mu = -J_y^\top \mu, \quad \mu(t_1) = \nabla_{y(t_1)} h, \qquad
    \dot g = -J_\theta^\top \mu, \quad g(t_1) = 0,

backwards along the dense forward solution, giving :math:`\partial h/\partial y_0 = \mu(t_0)` and
:math:`\partial h/\partial\theta = g(t_0)` for a terminal function :math:`h(y(t_1))`.

The right-hand sides are small Python callables around the ODE's compiled functions (called
directly: about a microsecond each); scipy's ``solve_ivp`` does the stepping.
Implicit methods (``Radau``, ``BDF``, ``LSODA``) receive the exact Jacobian of the augmented system.
Failures (poles, stiffness, non-finite values) are returned in the solution, never raised.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from scipy import sparse
from scipy.integrate import solve_ivp

from pymc_pnode.validation import validate_times

__all__ = [
    "EXPLICIT_METHODS",
    "IMPLICIT_METHODS",
    "ODESolution",
    "adjoint_gradient",
    "integrate",
    "validate_method",
]

EXPLICIT_METHODS = ("RK45", "RK23", "DOP853")
IMPLICIT_METHODS = ("Radau", "BDF", "LSODA")

# Dense Jacobians of the augmented system up to this size; sparse (CSC) beyond.
_DENSE_JAC_MAX = 300

# Default budget of right-hand-side evaluations per solve. An optimiser's trial point can make the
# problem stiff or nearly singular; an explicit solver would then crawl for minutes. Exceeding the
# budget ends the solve as a failure (reported, not raised).
DEFAULT_MAX_NFEV = 100_000

# Default integration settings of every classical baseline (an explicit pair, tight tolerances).
DEFAULT_METHOD = "RK45"
DEFAULT_RTOL = 1e-8
DEFAULT_ATOL = 1e-10


class _BudgetExceeded(Exception):
    pass


def validate_method(method: str) -> str:
    """Return ``method`` if it is a supported ``solve_ivp`` method, else raise ``ValueError``."""
    if method not in EXPLICIT_METHODS + IMPLICIT_METHODS:
        raise ValueError(
            f"method must be one of {EXPLICIT_METHODS + IMPLICIT_METHODS}, got {method!r}"
        )
    return method


# ----------------------------------------------------------------------------- results
@dataclass
class ODESolution:
    """Output of :func:`integrate`.

    Attributes
    ----------
    t : ndarray, shape (n,)
        Output times (only those reached when the solve failed).
    y : ndarray, shape (n, d)
        States at ``t``.
    dy_dy0 : ndarray, shape (n, d, d) or None
        Sensitivities :math:`\\partial y(t)/\\partial y_0` (if requested).
    dy_dtheta : ndarray, shape (n, d, n_theta) or None
        Sensitivities :math:`\\partial y(t)/\\partial\\theta` (if requested).
    success : bool
        Whether the integration reached the last output time with finite values.
    message : str
        Termination reason; on failure it includes the time where integration stopped.
    nfev : int
        Right-hand-side evaluations.
    dense : callable or None
        ``dense(t) -> y`` over the whole span (state components only), if requested.
    """

    t: np.ndarray
    y: np.ndarray
    dy_dy0: np.ndarray | None
    dy_dtheta: np.ndarray | None
    success: bool
    message: str
    nfev: int
    dense: Callable[[float], np.ndarray] | None = None


class _AugmentedSystem:
    """Python callables for ``solve_ivp`` around the ODE's compiled functions (preallocated buffers)."""

    def __init__(self, ode, theta: np.ndarray, wrt_y0: bool, wrt_theta: bool, max_nfev: int):
        self.ode = ode
        self.max_nfev = max_nfev
        self.p = theta
        self.d = ode.n_states
        self.k = ode.n_theta
        self.n_y0 = self.d if wrt_y0 else 0
        self.n_p = self.k if wrt_theta else 0
        self.c = self.n_y0 + self.n_p
        self.n = self.d * (1 + self.c)
        self.last_t = np.nan
        self.nfev = 0
        self._f = np.empty(self.d)
        self._jy = np.empty((self.d, self.d))
        self._jp = np.empty((self.d, self.k))

    def z0(self, y0: np.ndarray) -> np.ndarray:
        z = np.zeros(self.n)
        z[: self.d] = y0
        if self.n_y0:
            s = z[self.d :].reshape(self.d, self.c)
            s[:, : self.d] = np.eye(self.d)
        return z

    def fun(self, t: float, z: np.ndarray) -> np.ndarray:
        self.last_t = t
        self.nfev += 1
        if self.nfev > self.max_nfev:
            raise _BudgetExceeded
        d, c = self.d, self.c
        t = float(t)
        out = np.empty(self.n)
        y = np.ascontiguousarray(z[:d])
        f = self._f
        self.ode.rhs(y, t, self.p, f)
        out[:d] = f
        if c:
            self.ode.jac_y(y, t, self.p, self._jy)
            ds = out[d:].reshape(d, c)
            np.matmul(self._jy, z[d:].reshape(d, c), out=ds)
            if self.n_p:
                self.ode.jac_p(y, t, self.p, self._jp)
                ds[:, self.n_y0 :] += self._jp
        return out

    def jac(self, t: float, z: np.ndarray):
        """Exact Jacobian of the augmented system (lower block-triangular)."""
        d, c = self.d, self.c
        y = np.ascontiguousarray(z[:d])
        self.ode.jac_y(y, float(t), self.p, self._jy)
        jy = self._jy.copy()
        if c == 0:
            return jy
        hyy = np.empty((d, d, d))
        self.ode.hess_yy(y, float(t), self.p, hyy)
        s = z[d:].reshape(d, c)
        # d(J S)[i, col] / dy_l = sum_j H[i, j, l] S[j, col]  (+ dJp[i, m]/dy_l for parameter columns)
        a = np.einsum("ijl,jc->icl", hyy, s)
        if self.n_p:
            hyp = np.empty((d, d, self.k))
            self.ode.hess_yp(y, float(t), self.p, hyp)
            a[:, self.n_y0 :, :] += np.transpose(hyp, (0, 2, 1))[:, : self.n_p, :]
        lower = a.reshape(d * c, d)
        if self.n <= _DENSE_JAC_MAX:
            m = np.zeros((self.n, self.n))
            m[:d, :d] = jy
            m[d:, :d] = lower
            m[d:, d:] = np.kron(jy, np.eye(c))
            return m
        return sparse.bmat(
            [[sparse.csr_matrix(jy), None],
             [sparse.csr_matrix(lower), sparse.kron(sparse.csr_matrix(jy), sparse.eye(c))]],
            format="csc",
        )


def _solve_ivp(fun, jac, t_span, z0, *, method, rtol, atol, t_eval=None, dense_output=False, max_step=np.inf,
               first_step=None):
    kwargs: dict[str, Any] = dict(
        method=method, rtol=rtol, atol=atol, t_eval=t_eval, dense_output=dense_output,
        max_step=max_step,
    )
    if first_step is not None:
        kwargs["first_step"] = first_step
    if method in IMPLICIT_METHODS and jac is not None:
        kwargs["jac"] = jac
    # Overflow on the way to a pole is expected and reported through the status, not as warnings.
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return solve_ivp(fun, t_span, z0, **kwargs)


def integrate(
    ode,
    y0,
    theta,
    times,
    *,
    t0: float | None = None,
    wrt_y0: bool = False,
    wrt_theta: bool = False,
    method: str = DEFAULT_METHOD,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    max_step: float = np.inf,
    first_step: float | None = None,
    dense_output: bool = False,
    max_nfev: int = DEFAULT_MAX_NFEV,
) -> ODESolution:
    r"""Solve the ODE with scipy, optionally with forward sensitivities.

    Parameters
    ----------
    ode : pymc_pnode.ODE
        The ODE.
    y0 : array_like, shape (d,)
        Initial state at ``t0``.
    theta : array_like, shape (n_theta,)
        Parameters.
    times : array_like, shape (n,)
        Strictly increasing output times, all ``>= t0``.
    t0 : float, optional
        Initial time (default ``ode.t0``).
    wrt_y0, wrt_theta : bool
        Which sensitivities to integrate alongside the state.
    method : str
        ``solve_ivp`` method: ``RK45``, ``RK23``, ``DOP853`` (explicit) or ``Radau``, ``BDF``,
        ``LSODA`` (implicit, with the exact Jacobian of the augmented system).
    rtol, atol : float
        Tolerances (applied to states and sensitivities alike).
    max_step, first_step : float, optional
        Passed to ``solve_ivp``.
    dense_output : bool
        Attach a continuous interpolant of the state as ``solution.dense``.
    max_nfev : int
        Budget of right-hand-side evaluations; exceeding it ends the solve as a failure.

    Returns
    -------
    ODESolution
        With ``success=False`` and a message (instead of an exception) if the integration fails.
    """
    validate_method(method)
    y0 = ode.validate_y0(y0)
    theta = ode.validate_theta(theta)
    t0 = float(ode.t0 if t0 is None else t0)
    times = validate_times(times, "times", start=t0)
    if not (rtol > 0 and atol > 0):
        raise ValueError(f"rtol and atol must be positive, got rtol={rtol}, atol={atol}")
    if int(max_nfev) != max_nfev or max_nfev < 1:
        raise ValueError(f"max_nfev must be a positive integer, got {max_nfev!r}")
    system = _AugmentedSystem(ode, theta, wrt_y0, wrt_theta, int(max_nfev))
    if method in IMPLICIT_METHODS and system.c > 0:
        ode.hess_yy  # compile the Hessians before timing-sensitive use  # noqa: B018
    d = system.d
    n_out = times.size
    if times[-1] == t0:
        # Degenerate span: the only output is the initial condition.
        z = system.z0(y0)
        return _pack(system, times, np.tile(z, (n_out, 1)), True, "zero-length span", None)
    try:
        sol = _solve_ivp(
            system.fun, system.jac, (t0, float(times[-1])), system.z0(y0), method=method, rtol=rtol, atol=atol,
            t_eval=times, dense_output=dense_output, max_step=max_step, first_step=first_step,
        )
    except _BudgetExceeded:
        return _pack(
            system, times[:0], np.empty((0, system.n)), False,
            f"more than max_nfev={system.max_nfev} right-hand-side evaluations (stiff or nearly "
            f"singular problem?); integration stopped near t = {system.last_t:.6g}", None,
        )
    except (ValueError, ArithmeticError, np.linalg.LinAlgError) as err:
        return _pack(
            system, times[:0], np.empty((0, system.n)), False,
            f"ODE solver raised {type(err).__name__}: {err} (near t = {system.last_t:.6g})", None,
        )
    # (scipy returns an empty list instead of an array when no output time was reached)
    z = np.asarray(sol.y, dtype=np.float64).reshape(system.n, -1).T
    reached = np.size(sol.t)
    success = sol.status == 0 and reached == n_out
    message = str(sol.message)
    if success and not np.all(np.isfinite(z)):
        success = False
        bad = int(np.argmax(~np.all(np.isfinite(z), axis=1)))
        message = f"non-finite solution at t = {times[bad]:.6g}"
    elif not success:
        message = f"{message} (integration stopped near t = {system.last_t:.6g})"
    dense = None
    if dense_output and sol.sol is not None:
        interp = sol.sol
        dense = (lambda t, _s=interp, _d=d: _s(t)[:_d])  # noqa: E731
    return _pack(system, sol.t, z, bool(success), message, dense)


def _pack(system, t, z, success, message, dense) -> ODESolution:
    d, c, n_y0 = system.d, system.c, system.n_y0
    y = np.array(z[:, :d])
    s = z[:, d:].reshape(-1, d, c) if c else None
    dy_dy0 = np.array(s[:, :, :n_y0]) if n_y0 else None
    dy_dtheta = np.array(s[:, :, n_y0:]) if system.n_p else None
    return ODESolution(np.array(t), y, dy_dy0, dy_dtheta, success, message, system.nfev, dense)


class _AdjointSystem:
    def __init__(self, ode, theta: np.ndarray, forward: Callable[[float], np.ndarray], max_nfev: int):
        self.ode = ode
        self.max_nfev = max_nfev
        self.p = theta
        self.forward = forward
        self.d = ode.n_states
        self.k = ode.n_theta
        self.nfev = 0
        self.last_t = np.nan
        self._jy = np.empty((self.d, self.d))
        self._jp = np.empty((self.d, self.k))

    def fun(self, t: float, z: np.ndarray) -> np.ndarray:
        self.last_t = t
        self.nfev += 1
        if self.nfev > self.max_nfev:
            raise _BudgetExceeded
        x = np.ascontiguousarray(self.forward(t), dtype=np.float64)
        d = self.d
        out = np.empty(d + self.k)
        self.ode.jac_y(x, float(t), self.p, self._jy)
        mu = z[:d]
        np.matmul(mu, self._jy, out=out[:d])  # mu^T J = (J^T mu)^T
        out[:d] *= -1.0
        if self.k:
            self.ode.jac_p(x, float(t), self.p, self._jp)
            np.matmul(mu, self._jp, out=out[d:])
            out[d:] *= -1.0
        return out

    def jac(self, t: float, z: np.ndarray) -> np.ndarray:
        d, k = self.d, self.k
        x = np.ascontiguousarray(self.forward(t), dtype=np.float64)
        jy = np.empty((d, d))
        jp = np.empty((d, k))
        self.ode.jac_y(x, float(t), self.p, jy)
        self.ode.jac_p(x, float(t), self.p, jp)
        m = np.zeros((d + k, d + k))
        m[:d, :d] = -jy.T
        m[d:, :d] = -jp.T
        return m


def adjoint_gradient(
    ode,
    theta,
    forward: Callable[[float], np.ndarray],
    t_span: tuple[float, float],
    terminal_grad,
    *,
    method: str = DEFAULT_METHOD,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    max_nfev: int = DEFAULT_MAX_NFEV,
) -> tuple[np.ndarray, np.ndarray, bool, str, int]:
    r"""Gradient of a terminal function :math:`h(y(t_1))` by one backward adjoint solve.

    Parameters
    ----------
    ode : pymc_pnode.ODE
        The ODE.
    theta : array_like
        Parameters of the forward solve.
    forward : callable
        ``forward(t) -> y(t)`` on ``[t0, t1]``, e.g. ``integrate(..., dense_output=True).dense``.
    t_span : (float, float)
        ``(t0, t1)`` with ``t0 < t1``.
    terminal_grad : array_like, shape (d,)
        :math:`\nabla_y h` at :math:`y(t_1)`.
    method, rtol, atol, max_nfev
        Integration settings of the backward solve.

    Returns
    -------
    grad_y0 : ndarray, shape (d,)
        :math:`\partial h / \partial y(t_0)`, i.e. :math:`\mu(t_0)`.
    grad_theta : ndarray, shape (n_theta,)
        :math:`\partial h / \partial\theta = \int_{t_0}^{t_1} J_\theta^\top \mu\, dt`.
    success : bool
    message : str
    nfev : int
    """
    validate_method(method)
    theta = ode.validate_theta(theta)
    t0, t1 = float(t_span[0]), float(t_span[1])
    if not t1 > t0:
        raise ValueError(f"t_span must satisfy t0 < t1, got {t_span}")
    g = np.asarray(terminal_grad, dtype=np.float64).reshape(-1)
    if g.shape != (ode.n_states,):
        raise ValueError(f"terminal_grad must have shape ({ode.n_states},), got {g.shape}")
    system = _AdjointSystem(ode, theta, forward, int(max_nfev))
    z1 = np.concatenate([g, np.zeros(ode.n_theta)])
    try:
        sol = _solve_ivp(system.fun, system.jac, (t1, t0), z1, method=method, rtol=rtol, atol=atol)
    except (_BudgetExceeded, ValueError, ArithmeticError, np.linalg.LinAlgError) as err:
        nan = np.full(ode.n_states, np.nan), np.full(ode.n_theta, np.nan)
        what = (f"more than max_nfev={max_nfev} evaluations" if isinstance(err, _BudgetExceeded)
                else f"{type(err).__name__}: {err}")
        return (*nan, False, f"adjoint solver failed: {what}", system.nfev)
    zf = sol.y[:, -1]
    success = sol.status == 0 and bool(np.all(np.isfinite(zf)))
    message = str(sol.message) if sol.status != 0 else ("success" if success else "non-finite adjoint")
    d = ode.n_states
    return np.array(zf[:d]), np.array(zf[d:]), success, message, system.nfev
