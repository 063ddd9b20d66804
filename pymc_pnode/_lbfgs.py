"""L-BFGS-B with restarts after line-search stalls (used by :func:`pymc_pnode.fit` and the RK
least-squares baseline).

ODE objectives have infeasible regions: a trial point whose solve diverges has no finite value.
Such points are given a huge finite value and a zero gradient, so that L-BFGS-B's line search
backtracks. The line search then often stalls and scipy stops with a "relative reduction" or
"ABNORMAL" message at a point that is not stationary; the same happens when ``|f|`` is huge and the
first trial step (``x0 - ∇f``: one unit long for unbounded variables, projected onto the box when every variable
is boxed) is cut back to a tiny one. We restart from the last accepted point: at full
scale after a run that improved the objective without meeting infeasible points, otherwise in
coordinates scaled by a further 1/10 (a ten times shorter first step), up to ``max_restarts`` times.
Restarted runs use ``ftol = 0``: a restart discards the quasi-Newton memory, so its first iteration is
a steepest-descent step, which in an ill-conditioned valley reduces ``f`` by less than ``ftol |f|``;
with the caller's ``ftol`` every restart would stop after that one iteration, short of stationarity.
Without the ``ftol`` test a restarted run goes on until scipy's projected-gradient test, a failed line
search or ``maxiter`` ends it.
Fixed-step solves past a finite-time blow-up return huge *finite* values; a trial value
``BLOW_UP_FACTOR`` times worse than the run's starting point therefore counts as infeasible too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.optimize import minimize

FAILED_VALUE = 1e300
# A trial value this many times worse than the run's starting point counts as infeasible when choosing the
# next restart's step scale (fixed-step solves past a finite-time blow-up return huge finite values).
BLOW_UP_FACTOR = 1e8


@dataclass
class RestartedMinimum:
    x: np.ndarray
    fun: float
    jac: np.ndarray
    nit: int
    nfev: int
    restarts: int
    n_failed: int
    message: str
    success: bool  # scipy's flag for the last run
    stationary: bool


def minimize_with_restarts(
    fun: Callable[[np.ndarray], tuple[float, np.ndarray]],
    x0: np.ndarray,
    *,
    is_stationary: Callable[[np.ndarray, float, np.ndarray], bool],
    bounds: list | None = None,
    maxiter: int = 1000,
    gtol: float = 1e-5,
    ftol: float = 2.220446049250313e-09,
    max_restarts: int = 10,
    callback: Callable[[np.ndarray], None] | None = None,
) -> RestartedMinimum:
    """Minimise ``fun`` (returning value and gradient) by L-BFGS-B with restarts.

    A non-finite value (or one of at least ``FAILED_VALUE``) marks an infeasible point.
    ``is_stationary(x, f, g)`` decides whether a stop is final; ``bounds`` are ``(lo, hi)`` pairs with
    ``None`` for no bound; ``callback(x)`` is called after every iteration with the current point (an
    exception raised there propagates).
    """
    x0 = np.asarray(x0, dtype=np.float64)
    n = x0.size
    bounds = bounds or [(None, None)] * n
    lo = np.array([-np.inf if b[0] is None else b[0] for b in bounds], dtype=np.float64)
    hi = np.array([np.inf if b[1] is None else b[1] for b in bounds], dtype=np.float64)
    counts = {"failed": 0}

    def feasible(x):
        value, grad = fun(x)
        if not np.isfinite(value) or value >= FAILED_VALUE:
            counts["failed"] += 1
            return FAILED_VALUE, np.zeros(n)
        if value > f + BLOW_UP_FACTOR * (1.0 + abs(f)):
            counts["failed"] += 1  # finite, but a solve past a blow-up: steps this long are too long
        return float(value), np.asarray(grad, dtype=np.float64)

    f = np.inf  # the value at the last accepted point (where each run starts), once there is one
    x, (f, g) = x0.copy(), feasible(x0)
    nit = nfev = restarts = 0
    scale, message, success = 1.0, "", False
    while True:
        failed_before = counts["failed"]
        ref, sc = x.copy(), scale

        def scaled(v, ref=ref, sc=sc):
            value, grad = feasible(ref + sc * v)
            return value, sc * grad

        cb = None if callback is None else (lambda v, ref=ref, sc=sc: callback(ref + sc * v))
        vb = [(None if not np.isfinite(a) else (a - r) / sc, None if not np.isfinite(b) else (b - r) / sc)
              for a, b, r in zip(lo, hi, ref)]
        res = minimize(scaled, np.zeros(n), jac=True, method="L-BFGS-B", bounds=vb, callback=cb,
                       options={"maxiter": max(maxiter - nit, 1), "gtol": gtol * sc,
                                "ftol": ftol if restarts == 0 else 0.0,
                                "maxcor": 20})
        nit += int(res.nit)
        nfev += int(res.nfev)
        message, success = str(res.message), bool(res.success)
        improved = float(res.fun) < f
        if float(res.fun) <= f:
            x, f, g = np.clip(ref + sc * res.x, lo, hi), float(res.fun), np.asarray(res.jac) / sc
        stationary = f != FAILED_VALUE and bool(is_stationary(x, f, g))
        if stationary or restarts >= max_restarts or nit >= maxiter:
            break
        # a run that met infeasible points or made no progress is retried with a ten times shorter first step
        scale = sc * 0.1 if counts["failed"] > failed_before or not improved else 1.0
        restarts += 1
    return RestartedMinimum(x, f, g, nit, nfev, restarts, counts["failed"], message, success, stationary)
