r"""Error-controlled Dormand–Prince 5(4) solver with the exact discrete adjoint of the grid it chose.

The embedded pair of Dormand & Prince (1980) (Hairer, Nørsett & Wanner, 1993, §II.5, Table 5.2):
seven stages, the fifth-order solution propagated (local extrapolation), the difference to the
embedded fourth-order solution as the local error estimate, and the last stage reused as the first
of the next step (FSAL). Steps are accepted when the scaled error
:math:`\sqrt{\tfrac1d\sum_i (e_i / (\mathrm{atol} + \mathrm{rtol}\max(|y_{n,i}|, |y_{n+1,i}|)))^2} \le 1`
and chosen by the same controller and landing rule as the ODE filters
(:func:`~pymc_pnode.filtering.stepping.propose_step`, :func:`~pymc_pnode.filtering.stepping.control_step`):
every output time is hit exactly, without sliver steps.

The gradient is that of the discrete map on the chosen grid, the grid held fixed (as in the
discrete adjoints of adaptive solvers): reverse-mode through the six stages that make the
fifth-order solution (its weight on the seventh, FSAL stage is zero), with
:func:`~pymc_pnode.classical.rk.rk_step_adjoint`, the adjoint step shared with the fixed-step solvers.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from pymc_pnode._callbacks import FN, call
from pymc_pnode._jit import JIT, compile_on_first_use
from pymc_pnode.classical.rk import RKField, Tableau, rk_adjoint_work, rk_step_adjoint
from pymc_pnode.filtering.linalg import all_finite
from pymc_pnode.filtering.stepping import (
    STATUS_NONFINITE,
    STATUS_SUCCESS,
    control_step,
    grow_rows,
    initial_step_size,
    propose_step,
)

__all__ = ["DOPRI5", "dopri_backward", "dopri_forward"]


# Butcher tableau of DOPRI5 (Dormand & Prince, 1980); the seventh row of A is the fifth-order b.
_A = np.zeros((7, 7))
_A[1, :1] = [1 / 5]
_A[2, :2] = [3 / 40, 9 / 40]
_A[3, :3] = [44 / 45, -56 / 15, 32 / 9]
_A[4, :4] = [19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729]
_A[5, :5] = [9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656]
_A[6, :6] = [35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84]
_C = np.array([0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0])
_B4 = np.array([5179 / 57600, 0.0, 7571 / 16695, 393 / 640, -92097 / 339200, 187 / 2100, 1 / 40])
#: The seven-stage tableau ``(A, b, c)`` and the error weights ``b - b̂`` (fifth minus fourth order).
DOPRI5 = (_A, np.append(_A[6, :6], 0.0), _C, np.append(_A[6, :6], 0.0) - _B4)
_ERROR_ORDER = 4  # the error estimate is O(h^5): step factors use the exponent 1 / (4 + 1)

_R1 = nb.types.Array(nb.float64, 1, "C", readonly=True)
_R2 = nb.types.Array(nb.float64, 2, "C", readonly=True)
_W1 = nb.float64[::1]

_FORWARD_SIG = (FN, _W1, _R1, nb.float64, _R1, nb.float64, nb.float64, nb.int64)


@compile_on_first_use(_FORWARD_SIG, **JIT)
def dopri_forward(rhs, p, y0, t0, times, rtol, atol, max_steps):
    """Solve from ``t0`` through every time of ``times`` with error-controlled DOPRI5 steps.

    Returns ``(ys, ts, traj, status, n_rejected)``: the states at ``times`` (``(T, d)``), the accepted
    grid ``ts`` (``(N + 1,)``, ``ts[0] = t0``, every output time on it exactly), the states on it
    (``(N + 1, d)``), a status code of :mod:`~pymc_pnode.filtering.odefilter` and the number of
    rejected steps. A failed solve (``max_steps``, a collapsing step, a non-finite field at the
    start) keeps the grid it reached; the rows of ``ys`` it did not reach hold the last accepted state.
    """
    a, b, c, e = DOPRI5
    d = y0.shape[0]
    n_out = times.shape[0]
    ys = np.empty((n_out, d))
    cap = 64
    ts = np.empty(cap)
    traj = np.empty((cap, d))
    x = y0.copy()
    ts[0] = t0
    traj[0] = x
    ks = np.empty((7, d))
    xs = np.empty((7, d))
    xb = np.empty(d)
    fb = np.empty(d)
    call(rhs, x, t0, p, fb)
    ks[0] = fb
    status = STATUS_SUCCESS if all_finite(fb) else STATUS_NONFINITE
    t = t0
    h = initial_step_size(rhs, x, t0, p, rtol, atol)
    err_prev = 1.0
    n = 0
    n_rejected = 0
    k = 0
    while k < n_out and times[k] == t0:
        ys[k] = x
        k += 1
    while k < n_out and status == STATUS_SUCCESS:
        h_try, hit_stop, status = propose_step(t, h, times[k], n, max_steps)
        if status != STATUS_SUCCESS:
            break
        # Stages 2..7 (stage 1 is the last stage of the previous step); the seventh point is the
        # fifth-order solution.
        for st in range(1, 7):
            for m in range(d):
                acc = x[m]
                for j in range(st):
                    acc += h_try * a[st, j] * ks[j, m]
                xs[st, m] = acc
                xb[m] = acc
            call(rhs, xb, t + c[st] * h_try, p, fb)
            ks[st] = fb
        err = 0.0
        for m in range(d):
            est = 0.0
            for st in range(7):
                est += e[st] * ks[st, m]
            scale = atol + rtol * max(abs(x[m]), abs(xs[6, m]))
            err += (h_try * est / scale) ** 2
        err = math.sqrt(err / d)  # NaN or inf for a non-finite stage: the step is rejected
        accepted, h, err_prev = control_step(err, h_try, h, err_prev, hit_stop, _ERROR_ORDER)
        if not accepted:
            n_rejected += 1
            continue
        t = times[k] if hit_stop else t + h_try
        x[:] = xs[6]
        ks[0] = ks[6]
        n += 1
        if n == cap:
            cap *= 2
            ts = grow_rows(ts, cap)
            traj = grow_rows(traj, cap)
        ts[n] = t
        traj[n] = x
        if hit_stop:
            ys[k] = x
            k += 1
    for r in range(k, n_out):
        ys[r] = x
    return ys, ts[: n + 1].copy(), traj[: n + 1].copy(), status, n_rejected


_BACKWARD_SIG = (FN, FN, FN, _W1, _R1, _R2, _R1, _R2)


@compile_on_first_use(_BACKWARD_SIG, **JIT)
def dopri_backward(rhs, jac_y, jac_p, p, ts, traj, times, g_obs):
    """Discrete adjoint on the grid ``ts`` of :func:`dopri_forward`: ``(dL/dy0, dL/dp)`` for ``g_obs = dL/dys``.

    Output times beyond the grid (a failed solve) get no cotangent; a non-finite cotangent gives zero
    gradients.
    """
    a, b, c, _ = DOPRI5
    tableau = Tableau(a[:6, :6], b[:6], c[:6])  # the FSAL stage has weight zero in the propagated solution
    d = traj.shape[1]
    n_theta = p.shape[0]
    lam = np.zeros(d)
    gp = np.zeros(n_theta)
    if not all_finite(g_obs):
        return lam, gp
    work = rk_adjoint_work(6, d, n_theta)
    field = RKField(rhs, jac_y, jac_p, p)
    x = np.empty(d)
    k = times.shape[0] - 1
    last = ts.shape[0] - 1
    while k >= 0 and times[k] > ts[last]:
        k -= 1
    for n in range(last, 0, -1):
        while k >= 0 and times[k] == ts[n]:
            lam += g_obs[k]
            k -= 1
        x[:] = traj[n - 1]
        rk_step_adjoint(field, x, ts[n - 1], ts[n] - ts[n - 1], tableau, lam, gp, work)
    while k >= 0:  # output times at t0
        lam += g_obs[k]
        k -= 1
    return lam, gp

