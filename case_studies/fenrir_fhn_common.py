"""Shared helper for the FitzHugh-Nagumo Fenrir case studies (``fenrir_fhn_*.ipynb``,
``fenrir_tempering_vs_joint.ipynb``).

Setting of the thesis of N. Bosch, §10.4 and §10.6 (notes 002 §9.4, §10.3):
``ẏ1 = c (y1 - y1³/3 + y2)``, ``ẏ2 = -(y1 - a - b y2) / c``, truth ``a = b = 0.2``, ``c = 3``,
``y(0) = (-1, 1)``; the first component is observed at ``t = 1, 1.1, ...`` with noise variance 0.01.

The estimators work on the unconstrained vector ``u = (log a, log b, log c, y0_1, y0_2, log κ)``;
the objective is :func:`pymc_pnode.fenrir_loglik` (EK1, IWP(3), fixed step) compiled once into a
PyTensor function returning the value and its exact gradient.
"""

from __future__ import annotations

import time

import numpy as np
import pytensor
import pytensor.tensor as pt
from scipy.integrate import solve_ivp
from scipy.optimize import minimize

import pymc_pnode as pn

THETA_TRUE = np.array([0.2, 0.2, 3.0])
Y0_TRUE = np.array([-1.0, 1.0])
OBS_SIGMA = 0.1  # noise standard deviation (variance 0.01), known
PARAM_NAMES = ["a", "b", "c", "y0_1", "y0_2", "log_kappa"]
FAILED = 1e300  # loss returned for a diverging solve: finite, so L-BFGS-B's line search backtracks


def fhn(y, t, p):
    a, b, c = p[0], p[1], p[2]
    return [c * (y[0] - y[0] ** 3 / 3 + y[1]), -(y[0] - a - b * y[1]) / c]


def fhn_np(t, y, a, b, c):
    return [c * (y[0] - y[0] ** 3 / 3 + y[1]), -(y[0] - a - b * y[1]) / c]


ODE = pn.ODE(fhn, n_states=2, n_theta=3)


def reference(theta, y0, times):
    """Accurate solution (Radau, rtol = atol = 1e-12) at ``times``, shape (len(times), 2)."""
    sol = solve_ivp(fhn_np, (0.0, float(times[-1])), y0, method="Radau", t_eval=times,
                    args=tuple(theta), rtol=1e-12, atol=1e-12)
    out = np.full((times.size, 2), np.nan)
    out[: sol.y.shape[1]] = sol.y.T
    return out


def make_data(t_last: float = 20.0, spacing: float = 0.1, t_first: float = 1.0, seed: int = 42):
    """Observation times ``t_first, t_first + spacing, ..., t_last``; ``y1`` plus N(0, 0.01) noise."""
    n = int(round((t_last - t_first) / spacing)) + 1
    times = np.round(t_first + spacing * np.arange(n), 10)
    truth = reference(THETA_TRUE, Y0_TRUE, times)
    rng = np.random.default_rng(seed)
    data = truth[:, :1] + OBS_SIGMA * rng.standard_normal((n, 1))
    return times, truth, data


def pack(theta, y0, log_kappa, log_theta: bool = True):
    theta = np.log(theta) if log_theta else np.asarray(theta, float)
    return np.concatenate([theta, y0, [log_kappa]])


def unpack(u, log_theta: bool = True):
    u = np.asarray(u, float)
    return (np.exp(u[:3]) if log_theta else u[:3]), u[3:5], float(u[5])


class FenrirObjective:
    """Fenrir log-likelihood of ``u`` and its exact gradient (one compiled PyTensor function)."""

    def __init__(self, times, data, step: float = 0.01, order: int = 3, log_theta: bool = True):
        self.times, self.data, self.step = times, data, step
        self.log_theta = log_theta
        u = pt.vector("u")
        theta = pt.exp(u[:3]) if log_theta else u[:3]
        ll = pn.fenrir_loglik(ODE, u[3:5], theta, times, data, obs_matrix=[[1.0, 0.0]],
                              obs_sigma=OBS_SIGMA, diffusion=pt.exp(u[5]),
                              solver=pn.EK1(order=order), step=step)
        self._fn = pytensor.function([u], [ll, pytensor.grad(ll, u)])
        self.n_evals = 0
        self.n_failed = 0

    def __call__(self, u):
        self.n_evals += 1
        ll, g = self._fn(np.asarray(u, float))
        if not np.isfinite(ll):
            self.n_failed += 1
        return float(ll), np.asarray(g)


class _Stop(Exception):
    pass


def maximise(obj: FenrirObjective, u0, *, free=None, ftol=1e-12, gtol=1e-6, maxiter=2000,
             f_abstol=None, early_stop=None, max_restarts=10, method="L-BFGS-B", lower=None):
    """Maximise the Fenrir log-likelihood over the coordinates ``free`` of ``u`` (L-BFGS-B,
    exact gradients; unbounded unless ``lower`` gives a lower bound per coordinate of ``u``,
    ``-inf`` for none); the others stay at ``u0``.

    A diverging solve gives a large finite loss. L-BFGS-B's line search then collapses to the
    current point and stops; as in :func:`pymc_pnode.baselines.rk_least_squares`, the optimiser is
    restarted from the last accepted point in coordinates scaled by 1/10 (a ten times shorter first
    step), and at full scale again once a restart ran without failures.
    ``f_abstol``: stop when one iteration changes the log-likelihood by at most this;
    ``early_stop``: stop when it changed by less than this in each of 3 consecutive iterations
    (the "OURS+" rule). Returns a dict with ``u``, ``loglik``, ``iterations``, ``evaluations``,
    ``restarts``, ``path`` (the iterates) and ``message``.
    """
    u0 = np.asarray(u0, float)
    free = np.arange(u0.size) if free is None else np.asarray(free)
    history, path, last = [], [u0.copy()], {"x": None, "f": None, "g": None}
    n0, t0 = obj.n_evals, time.perf_counter()

    def full(x):
        u = u0.copy()
        u[free] = x
        return u

    def loss(x):
        ll, g = obj(full(x))
        ok = np.isfinite(ll)
        value, grad = (-ll, -g[free]) if ok else (FAILED, np.zeros(x.size))
        last["x"], last["f"], last["g"] = np.array(x), value, grad
        if not history:
            history.append(value)
        return value, grad

    x, nit, restarts, scale, message = u0[free].copy(), 0, 0, 1.0, ""
    while True:
        ref, sc = x.copy(), scale
        failed_before = obj.n_failed

        def scaled(v, ref=ref, sc=sc):
            value, grad = loss(ref + sc * v)
            return value, sc * grad

        def callback(vk, ref=ref, sc=sc):
            xk = ref + sc * vk
            moved = not np.array_equal(full(xk), path[-1])
            path.append(full(xk))
            if f_abstol is None and early_stop is None or not moved:
                # no step (failed line search, e.g. into a diverging solve): no tolerance test,
                # L-BFGS-B and the restart logic below decide
                return
            same = last["x"] is not None and np.array_equal(last["x"], xk)
            history.append(last["f"] if same else loss(xk)[0])
            change = np.abs(np.diff(history))
            if f_abstol is not None and change[-1] <= f_abstol:
                raise _Stop("f_abstol")
            if early_stop is not None and change.size >= 3 and np.all(change[-3:] < early_stop):
                raise _Stop("early stopping")

        try:
            if method == "L-BFGS-B":
                options = dict(ftol=ftol, gtol=gtol * sc, maxiter=maxiter - nit, maxcor=20)
            else:  # BFGS: strong-Wolfe line search, gradient-norm test only
                options = dict(gtol=gtol * sc, maxiter=maxiter - nit)
            bounds = None
            if lower is not None and method == "L-BFGS-B":
                lo = (np.asarray(lower, float)[free] - ref) / sc
                bounds = [(v if np.isfinite(v) else None, None) for v in lo]
            res = minimize(scaled, np.zeros_like(ref), jac=True, method=method, callback=callback,
                           options=options, bounds=bounds)
            x, message = ref + sc * res.x, str(res.message)
            nit += int(res.nit)
        except _Stop as stop:
            x, message = path[-1][free], str(stop)
            nit = len(path) - 1
            break
        grad = loss(x)[1] if not (last["x"] is not None and np.array_equal(last["x"], x)) else last["g"]
        stationary = np.max(np.abs(grad)) <= gtol * max(1.0, abs(last["f"]))
        if stationary or restarts >= max_restarts or nit >= maxiter:
            break
        if obj.n_failed > failed_before:
            scale = sc * 0.1
        elif sc < 1.0:
            scale = 1.0
        else:
            break
        restarts += 1
    u = full(x)
    same = last["x"] is not None and np.array_equal(last["x"], x)
    value = -last["f"] if same else obj(u)[0]
    return dict(u=u, loglik=float(value), iterations=nit, evaluations=obj.n_evals - n0,
                restarts=restarts, path=np.array(path), message=message,
                wall=time.perf_counter() - t0)


def tempering(obj: FenrirObjective, u0, schedule, *, early_stopping=True, progress=None,
              full_stages=False, lower=None):
    """Diffusion tempering (notes 002 §10.2) over ``log κ``: for each κ of ``schedule`` maximise
    over ``(a, b, c, y0)`` (or their logs, see :class:`FenrirObjective`) with κ fixed,
    warm-started at the previous optimum.

    Intermediate stages stop at absolute/relative tolerances 1e-6/1e-3 (notes 002 §10.2) and, when
    ``early_stopping`` ("OURS+"), once the log-likelihood changed by less than 0.1 in each of 3
    consecutive iterations; the last stage runs to full tolerance. ``full_stages``: every stage
    runs to full tolerance (the thesis' Algorithm 10.2, each stage "to convergence").
    ``lower``: lower bounds per coordinate of ``u`` (see :func:`maximise`).
    """
    u = np.asarray(u0, float).copy()
    stages = []
    for i, kappa in enumerate(schedule):
        u[5] = np.log(kappa)
        last = i == len(schedule) - 1
        if last or full_stages:
            r = maximise(obj, u, free=np.arange(5), ftol=1e-12, gtol=1e-6, lower=lower)
        else:  # intermediate stages: abstol 1e-6, reltol 1e-3 (+ the OURS+ early stop)
            r = maximise(obj, u, free=np.arange(5), ftol=1e-3, gtol=1e-6, f_abstol=1e-6,
                         early_stop=0.1 if early_stopping else None, lower=lower)
        if np.isfinite(r["loglik"]) and r["loglik"] > -FAILED / 2:
            u = r["u"]
        stages.append(dict(kappa=kappa, u=u.copy(), loglik=r["loglik"], iterations=r["iterations"],
                           evaluations=r["evaluations"], message=r["message"]))
        if progress is not None:
            progress.update(1)
            ll = r["loglik"]
            progress.set_postfix(log_kappa=f"{np.log(kappa):.0f}",
                                 loglik=f"{ll:.1f}" if ll > -FAILED / 2 else "solve failed")
    return u, stages


def hessian(obj: FenrirObjective, u, h=1e-4):
    """Hessian of the log-likelihood at ``u`` by central differences of the exact gradient."""
    n = len(u)
    H = np.empty((n, n))
    for i in range(n):
        e = np.zeros(n)
        e[i] = h
        H[:, i] = (obj(u + e)[1] - obj(u - e)[1]) / (2 * h)
    return 0.5 * (H + H.T)
