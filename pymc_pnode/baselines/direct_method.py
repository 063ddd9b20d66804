r"""The direct method of Raziperchikolaei & Bhat: alternating minimisation over states and parameters.

The objective is the squared residual of an explicit s-step Adams–Bashforth discretisation evaluated
on a state sequence :math:`X = (x_1, \dots, x_T)` (Raziperchikolaei & Bhat, 2018, eq. (12)):

.. math::

    E(X, \theta) = \sum_{i=1}^{T-1} \Big\| x_{i+1} - x_i - \Delta t_i \sum_{j=0}^{s_i-1}
    \beta^{(s_i)}_j f(x_{i-j}, t_{i-j}, \theta) \Big\|^2, \qquad s_i = \min(s, i),

(start-up with lower orders; ``order=1`` is explicit Euler, eq. (4)). The data only initialise
:math:`X^{(0)} = Y`. Algorithm 1 alternates

1. :math:`\theta^{(n)} = \arg\min_\theta E(X^{(n-1)}, \theta)` (eq. (7)/(13a)),
2. :math:`X^{(n)} = \arg\min_X E(X, \theta^{(n)}) + \lambda \|X - X^{(n-1)}\|_F^2` (eq. (8)/(13b)),

both by L-BFGS-B (``maxcor=100``), and stops when the objective after the parameter step decreases by
less than ``tol`` (the authors' code: ``1e-8``). The single hyperparameter :math:`\lambda` acts as an
inverse step size. Predicted states :math:`\hat X` step the same discretisation from
:math:`\hat x_1 = x^*_1` with :math:`\hat\theta` (eq. (5)/(11)).

:math:`E` and its gradients are numba kernels taking the ODE's compiled functions as addresses of C
callbacks (one compiled, disk-cached kernel for all ODEs), called through their compiled entry points:
optimisers call them tens of thousands of times.
"""

from __future__ import annotations

import functools
import time
from collections import namedtuple
from collections.abc import Callable, Sequence

import numba as nb
import numpy as np
from scipy.optimize import minimize

from pymc_pnode._callbacks import FN, call
from pymc_pnode._jit import JIT, compile_on_first_use
from pymc_pnode.baselines._inputs import validate_observations
from pymc_pnode.estimation import EstimationResult
from pymc_pnode.validation import as_positive_float, as_positive_int, validate_bounds, validate_times

__all__ = [
    "ADAMS_BASHFORTH",
    "DirectMethodObjective",
    "adams_bashforth_predict",
    "direct_method",
]


# Adams–Bashforth coefficients beta^(s)_j (row s-1, j = 0..s-1; f_i first), s = 1..5.
ADAMS_BASHFORTH = np.zeros((5, 5))
ADAMS_BASHFORTH[0, :1] = [1.0]
ADAMS_BASHFORTH[1, :2] = [3.0 / 2.0, -1.0 / 2.0]
ADAMS_BASHFORTH[2, :3] = [23.0 / 12.0, -16.0 / 12.0, 5.0 / 12.0]
ADAMS_BASHFORTH[3, :4] = [55.0 / 24.0, -59.0 / 24.0, 37.0 / 24.0, -9.0 / 24.0]
ADAMS_BASHFORTH[4, :5] = [1901.0 / 720.0, -2774.0 / 720.0, 2616.0 / 720.0, -1274.0 / 720.0,
                          251.0 / 720.0]
MAX_ORDER = ADAMS_BASHFORTH.shape[0]


# ----------------------------------------------------------------------------- kernels
ABGrid = namedtuple("ABGrid", ["times", "h", "order", "beta"])
ABGrid.__doc__ = """The discretisation: grid ``times`` (T,), steps ``h[i] = t_{i+1} - t_i``, the number of steps
``order`` and the Adams–Bashforth coefficients ``beta`` (:data:`ADAMS_BASHFORTH`)."""
_AB_GRID_T = nb.types.NamedTuple([nb.float64[::1], nb.float64[::1], nb.int64, nb.float64[:, ::1]], ABGrid)
_OBJ_SIG = nb.float64(
    FN, FN, FN, nb.float64[:, ::1], nb.float64[::1], _AB_GRID_T, nb.float64[:, ::1], nb.float64[::1]
)


@compile_on_first_use(_OBJ_SIG, **JIT)
def discretization_objective(rhs, jac_y, jac_p, x, theta, grid, gx, gtheta):  # pragma: no cover - numba
    """``E(X, theta)`` of the s-step AB discretisation; its gradients are added to ``gx`` / ``gtheta``
    unless these are empty.

    ``x`` is ``(T, d)``, ``grid`` an :class:`ABGrid`. Residual ``r_i`` predicts ``x[i+1]`` from the
    ``s_i = min(order, i + 1)`` most recent values of ``f``.
    """
    times, h, order, beta = grid
    want_gx = gx.shape[0] > 0
    want_gtheta = gtheta.shape[0] > 0
    n, d = x.shape
    k = theta.shape[0]
    f = np.empty((n, d))
    for m in range(n - 1):
        call(rhs, x[m], times[m], theta, f[m])
    # w[m] = sum over residuals using f_m of h_i beta_j (2 r_i): the weight of f_m in dE/df_m.
    w = np.zeros((n, d))
    r = np.empty(d)
    total = 0.0
    for i in range(n - 1):
        s = order if order < i + 1 else i + 1
        for a in range(d):
            acc = x[i + 1, a] - x[i, a]
            for j in range(s):
                acc -= h[i] * beta[s - 1, j] * f[i - j, a]
            r[a] = acc
            total += acc * acc
        if want_gx or want_gtheta:
            for a in range(d):
                two_r = 2.0 * r[a]
                if want_gx:
                    gx[i + 1, a] += two_r
                    gx[i, a] -= two_r
                for j in range(s):
                    w[i - j, a] += h[i] * beta[s - 1, j] * two_r
    if want_gx or want_gtheta:
        jac = np.empty((d, d))
        jp = np.empty((d, k))
        for m in range(n - 1):
            if want_gx:
                call(jac_y, x[m], times[m], theta, jac)
                for b in range(d):
                    acc = 0.0
                    for a in range(d):
                        acc += jac[a, b] * w[m, a]
                    gx[m, b] -= acc
            if want_gtheta and k > 0:
                call(jac_p, x[m], times[m], theta, jp)
                for c in range(k):
                    acc = 0.0
                    for a in range(d):
                        acc += jp[a, c] * w[m, a]
                    gtheta[c] -= acc
    return total


_PRED_SIG = nb.void(FN, nb.float64[::1], nb.float64[::1], _AB_GRID_T, nb.float64[:, ::1])


@compile_on_first_use(_PRED_SIG, **JIT)
def _ab_predict_kernel(rhs, x1, theta, grid, out):  # pragma: no cover - numba
    times, h, order, beta = grid
    n, d = out.shape
    f = np.empty((n, d))
    for a in range(d):
        out[0, a] = x1[a]
    for i in range(n - 1):
        call(rhs, out[i], times[i], theta, f[i])
        s = order if order < i + 1 else i + 1
        for a in range(d):
            acc = out[i, a]
            for j in range(s):
                acc += h[i] * beta[s - 1, j] * f[i - j, a]
            out[i + 1, a] = acc


# ----------------------------------------------------------------------------- Python API
def _validate_order(order) -> int:
    order = as_positive_int(order, "order")
    if order > MAX_ORDER:
        raise ValueError(f"order must be between 1 and {MAX_ORDER}, got {order}")
    return order


def _validate_grid(times: np.ndarray, order: int) -> np.ndarray:
    h = np.diff(times)
    if order > 1 and h.size and not np.allclose(h, h[0], rtol=1e-8, atol=0.0):
        raise ValueError("times must be equally spaced for Adams–Bashforth orders > 1")
    return np.ascontiguousarray(h)


class DirectMethodObjective:
    r"""The discretisation objective :math:`E(X, \theta)` of one ODE on one time grid.

    Parameters
    ----------
    ode : pymc_pnode.ODE
        The model.
    times : array_like, shape (T,)
        Strictly increasing grid (equally spaced when ``order > 1``).
    order : int
        Adams–Bashforth steps ``s`` (1 = explicit Euler), at most 5.
    """

    def __init__(self, ode, times, order: int = 3):
        self.ode = ode
        self.order = _validate_order(order)
        self.times = validate_times(times, "times")
        if self.times.size < 2:
            raise ValueError(f"times must contain at least two grid points, got {self.times.size}")
        self.h = _validate_grid(self.times, self.order)
        self.d, self.k = ode.n_states, ode.n_theta
        self.shape = (self.times.size, self.d)
        self.grid = ABGrid(self.times, self.h, self.order, ADAMS_BASHFORTH)
        self._call = functools.partial(discretization_objective.entry_point, *ode.field_addresses)
        self._predict = functools.partial(_ab_predict_kernel.entry_point, ode.rhs.address)
        self._no_gx = np.zeros((0, 0))
        self._no_gt = np.zeros(0)
        self.n_evals = 0

    def _x(self, x) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float64).reshape(self.shape)
        return x

    def _theta(self, theta) -> np.ndarray:
        return np.ascontiguousarray(theta, dtype=np.float64).reshape(self.k)

    def value(self, x, theta) -> float:
        """:math:`E(X, \\theta)`."""
        self.n_evals += 1
        return self._call(self._x(x), self._theta(theta), self.grid, self._no_gx, self._no_gt)

    def value_and_grad_x(self, x, theta) -> tuple[float, np.ndarray]:
        """:math:`E` and :math:`\\partial E/\\partial X` (shape ``(T, d)``)."""
        self.n_evals += 1
        g = np.zeros(self.shape)
        v = self._call(self._x(x), self._theta(theta), self.grid, g, self._no_gt)
        return v, g

    def value_and_grad_theta(self, x, theta) -> tuple[float, np.ndarray]:
        """:math:`E` and :math:`\\partial E/\\partial\\theta` (shape ``(n_theta,)``)."""
        self.n_evals += 1
        g = np.zeros(self.k)
        v = self._call(self._x(x), self._theta(theta), self.grid, self._no_gx, g)
        return v, g

    def predict(self, x1, theta) -> np.ndarray:
        """Predicted states :math:`\\hat X` from :math:`\\hat x_1` by the same discretisation."""
        out = np.empty(self.shape)
        x1 = np.ascontiguousarray(x1, dtype=np.float64).reshape(self.d)
        with np.errstate(all="ignore"):
            self._predict(x1, self._theta(theta), self.grid, out)
        return out


def adams_bashforth_predict(ode, x1, theta, times, order: int = 3) -> np.ndarray:
    """Step the s-step Adams–Bashforth discretisation (with start-up) from ``x1`` over ``times``.

    This is how the direct method forms its predicted states (eq. (5) for Euler, (11) for AB).

    Returns
    -------
    ndarray, shape (len(times), d)
    """
    x1 = ode.validate_y0(x1, "x1")
    theta = ode.validate_theta(theta)
    return DirectMethodObjective(ode, times, order).predict(x1, theta)


def direct_method(
    ode,
    data,
    times,
    *,
    theta0: Sequence[float],
    lam: float = 1.0,
    order: int = 3,
    tol: float = 1e-8,
    max_iter: int = 10000,
    maxcor: int = 100,
    bounds: Sequence[tuple[float | None, float | None]] | None = None,
    inner_maxiter: int = 15000,
    progress: bool = False,
    callback: Callable[[int, np.ndarray, np.ndarray], None] | None = None,
) -> EstimationResult:
    r"""Estimate parameters and filtered states by the direct method (Algorithm 1).

    Parameters
    ----------
    ode : pymc_pnode.ODE
        The model.
    data : array_like, shape (T, d)
        Noisy observations of *every* state at every time (no missing values).
    times : array_like, shape (T,)
        Strictly increasing observation times, equally spaced when ``order > 1``.
    theta0 : array_like, shape (n_theta,)
        Initial parameter guess.
    lam : float
        The single hyperparameter :math:`\lambda \ge 0` of the proximal state step (inverse step
        size). With ``lam=0`` the state step jumps to an exact discrete trajectory (``E = 0``) and
        the method stops after the next parameter step, far from the data (the paper's remark).
    order : int
        Adams–Bashforth steps: 1 = explicit Euler (eq. (3)), 3 = the paper's default AB3; up to 5.
    tol : float
        Stop when the objective after a parameter step decreases by less than ``tol``.
    max_iter : int
        Maximum outer iterations.
    maxcor : int
        L-BFGS memory of both inner solves.
    bounds : sequence of (low, high), optional
        Box for the parameters in the parameter step.
    inner_maxiter : int
        Iteration limit of each inner L-BFGS-B solve.
    progress : bool
        Show a tqdm progress bar over outer iterations.
    callback : callable, optional
        ``callback(n, theta, X)`` after every outer iteration ``n`` (e.g. to record the prediction
        error per iteration, as in the paper's Fig. 2). ``theta`` and ``X`` are copies.

    Returns
    -------
    EstimationResult
        ``theta`` = :math:`\theta^*`, ``y0`` = :math:`x^*_1`, ``objective`` = :math:`E(X^*, \theta^*)`.
        ``extra`` holds ``filtered_states`` (:math:`X^*`), ``predicted_states`` (:math:`\hat X`),
        ``objective_history`` (after each parameter step), ``lam`` and ``order``.

    Raises
    ------
    ValueError
        For invalid input (partial observations, missing values, uneven grid for AB orders > 1, ...).
    """
    start = time.perf_counter()
    t_arr = np.asarray(times, dtype=np.float64)
    t_first = float(t_arr.min()) if t_arr.size and np.all(np.isfinite(t_arr)) else None
    # The grid need not start at ode.t0: the method never integrates from t0.
    obs = validate_observations(ode, data, times, t0=t_first, allow_missing=False)
    if not obs.identity:  # pragma: no cover - obs_matrix is not an argument here
        raise ValueError("the direct method needs every state observed")
    try:
        lam = float(lam)
    except (TypeError, ValueError):
        raise ValueError(f"lam must be a non-negative number, got {lam!r}") from None
    if not (np.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam must be a non-negative finite number, got {lam!r}")
    tol = as_positive_float(tol, "tol")
    max_iter = as_positive_int(max_iter, "max_iter")
    maxcor = as_positive_int(maxcor, "maxcor")
    inner_maxiter = as_positive_int(inner_maxiter, "inner_maxiter")
    theta0 = ode.validate_theta(theta0, "theta0")
    if obs.times.size < 3:
        raise ValueError("the direct method needs at least 3 time points")
    pb = validate_bounds(bounds, ode.n_theta, "bounds")
    for i, (lo, hi) in enumerate(pb):
        if not lo <= theta0[i] <= hi:
            raise ValueError(f"theta0[{i}] = {theta0[i]} lies outside bounds ({lo}, {hi})")
    theta_bounds = [(None if not np.isfinite(lo) else lo, None if not np.isfinite(hi) else hi)
                    for lo, hi in pb]
    objective = DirectMethodObjective(ode, obs.times, order)
    shape = objective.shape

    x = np.array(obs.data)  # X*(0) = Y
    theta = theta0.copy()
    history: list[float] = []
    converged = False
    message = f"maximum number of iterations ({max_iter}) reached"
    lbfgs = {"maxcor": maxcor, "maxiter": inner_maxiter}

    def theta_fun(th, xc):
        v, g = objective.value_and_grad_theta(xc, th)
        if not np.isfinite(v):
            return 1e300, np.zeros_like(g)
        return v, g

    def x_fun(flat, th, x_prev):
        xc = flat.reshape(shape)
        v, g = objective.value_and_grad_x(xc, th)
        diff = xc - x_prev
        v += lam * float(np.sum(diff * diff))
        g += 2.0 * lam * diff
        if not np.isfinite(v):
            return 1e300, np.zeros(flat.size)
        return v, g.ravel()

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=max_iter, desc="direct method", leave=False)
    n = 0
    prev = np.inf
    try:
        with np.errstate(all="ignore"):
            for n in range(1, max_iter + 1):
                # (7)/(13a): parameter step, warm-started.
                rt = minimize(theta_fun, theta, args=(x,), jac=True, method="L-BFGS-B",
                              bounds=theta_bounds, options=lbfgs)
                theta = np.array(rt.x)
                obj = float(objective.value(x, theta))
                history.append(obj)
                if not np.isfinite(obj):
                    message = f"non-finite objective at iteration {n} (parameter step diverged)"
                    break
                if n > 1 and prev - obj < tol:
                    converged = True
                    message = (f"objective decrease {prev - obj:.3g} below tol={tol:g} "
                               f"after {n} iterations")
                    break
                prev = obj
                # (8)/(13b): proximal state step, warm-started at X*(n-1).
                rx = minimize(x_fun, x.ravel(), args=(theta, x), jac=True, method="L-BFGS-B",
                              options=lbfgs)
                x_new = rx.x.reshape(shape)
                if not np.all(np.isfinite(x_new)):
                    message = f"non-finite states at iteration {n} (state step diverged)"
                    break
                x = np.ascontiguousarray(x_new)
                if callback is not None:
                    callback(n, theta.copy(), x.copy())
                if bar is not None:
                    bar.update(1)
                    if n % 10 == 0:
                        bar.set_postfix(E=f"{obj:.3g}")
    finally:
        if bar is not None:
            bar.close()

    final = float(objective.value(x, theta))
    predicted = objective.predict(x[0], theta)
    return EstimationResult(
        theta=theta, y0=x[0].copy(), objective=final, n_iterations=n,
        wall_time=time.perf_counter() - start, converged=converged, message=message,
        method=f"direct_method[AB{order}]" if order > 1 else "direct_method[Euler]",
        objective_name="discretisation residual E(X*, theta*)",
        n_function_evals=objective.n_evals, n_ode_solves=0,
        extra={
            "filtered_states": x, "predicted_states": predicted, "times": obs.times,
            "objective_history": np.array(history), "lam": lam, "order": order,
        },
    )
