"""Helper for ``fenrir_dt_table1.ipynb``: diffusion-tempering paper (Beck et al., ICML 2024), Table 1.

Pendulum (1 parameter) and Lotka-Volterra (2 parameters), notes 002 §10.4-10.5. For every random
initialisation three estimators are run:

* ``fenrir``  -- Fenrir with learned diffusion: the parameters and ``log κ`` are optimised jointly
  (``log κ`` starts at ``log 1e20``, box ``[log 1e-20, log 1e50]``), as in the paper's
  ``*-fenrir-learned_diff`` scripts;
* ``rk``      -- single-shooting least squares with an adaptive Runge-Kutta solver
  (:func:`pymc_pnode.baselines.rk_least_squares`);
* ``ours+``   -- diffusion tempering with early stopping: ``κ = 10^(20-i)``, ``i = 0..20``
  (:func:`pymc_pnode.tempering_schedule` ``"linear"``), each stage warm-started at the previous
  optimum, bumped inside the box if it sits on a bound.

Fenrir terms use :func:`pymc_pnode.fenrir_loglik` (EK1, IWP(3), step 0.01, known observation noise
``σ² = 0.1``), compiled once per process into one PyTensor function returning the log-likelihood and
its exact gradient. Optimisation is box-constrained L-BFGS-B in coordinates normalised to
``[0, 1]`` as in the paper (its eq. 17).
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytensor
import pytensor.tensor as pt
from scipy.integrate import solve_ivp
from scipy.optimize import minimize

import pymc_pnode as pn
from pymc_pnode.baselines import rk_least_squares

OBS_VAR = 0.1  # σ² of the observation noise (known, not learned)
DT_DATA = 0.01
STEP = 0.01  # PN solver step
LOG_KAPPA_BOUNDS = (np.log(1e-20), np.log(1e50))
LOG_KAPPA0 = np.log(1e20)
FAILED = 1e20  # objective value returned for a diverging solve (finite: the line search backtracks)


def _pendulum(y, t, p):
    return [y[1], -9.81 / p[0] * pt.sin(y[0])]


def _pendulum_np(t, y, p):
    return [y[1], -9.81 / p[0] * np.sin(y[0])]


def _lotka_volterra(y, t, p):
    # γ = 3, δ = 1 fixed; θ = (α, β)
    return [p[0] * y[0] - p[1] * y[0] * y[1], 1.0 * y[0] * y[1] - 3.0 * y[1]]


def _lotka_volterra_np(t, y, p):
    return [p[0] * y[0] - p[1] * y[0] * y[1], 1.0 * y[0] * y[1] - 3.0 * y[1]]


PROBLEMS = {
    "PD": dict(
        name="Pendulum", func=_pendulum, func_np=_pendulum_np, y0=np.array([np.pi / 4, 0.0]),
        t_end=10.0, H=np.array([[1.0, 0.0]]), theta_true=np.array([3.0]), names=["l"],
        lb=np.array([0.1]), ub=np.array([10.0]),
    ),
    "LV": dict(
        name="Lotka-Volterra", func=_lotka_volterra, func_np=_lotka_volterra_np,
        y0=np.array([1.0, 1.0]), t_end=20.0, H=np.array([[1.0, 0.0]]),
        theta_true=np.array([1.5, 1.0]), names=["alpha", "beta"],
        lb=np.array([1e-3, 1e-3]), ub=np.array([5.0, 5.0]),
    ),
}


def reference_solution(key: str, theta, times) -> np.ndarray:
    """Accurate solution (Radau, rtol = atol = 1e-12) at ``times``; NaN where the solve fails."""
    spec = PROBLEMS[key]
    sol = solve_ivp(spec["func_np"], (0.0, spec["t_end"]), spec["y0"], method="Radau",
                    t_eval=times, args=(np.asarray(theta, float),), rtol=1e-12, atol=1e-12)
    out = np.full((times.size, spec["y0"].size), np.nan)
    if sol.success:
        out[: sol.y.shape[1]] = sol.y.T
    return out


def make_data(key: str, seed: int = 1234):
    """Data as in the paper's ``generate_data``: noise of variance σ² on the full state, then H."""
    spec = PROBLEMS[key]
    times = np.round(np.arange(0.0, spec["t_end"] + DT_DATA / 2, DT_DATA), 10)
    truth = reference_solution(key, spec["theta_true"], times)
    rng = np.random.default_rng(seed)
    data = (truth + np.sqrt(OBS_VAR) * rng.standard_normal(truth.shape)) @ spec["H"].T
    return times, truth, data


def random_starts(key: str, n: int, seed: int = 2024) -> np.ndarray:
    """Initial parameters drawn uniformly from the box (the paper's uniform prior)."""
    spec = PROBLEMS[key]
    rng = np.random.default_rng(seed)
    return spec["lb"] + (spec["ub"] - spec["lb"]) * rng.random((n, spec["lb"].size))


# --------------------------------------------------------------------------------------------
# one compiled Fenrir objective per (process, problem)
_CACHE: dict = {}


class FenrirObjective:
    """``log p(data | θ, κ)`` and its exact gradient w.r.t. ``(θ, log κ)`` (one compiled function)."""

    def __init__(self, key: str, seed: int = 1234):
        spec = PROBLEMS[key]
        self.key, self.spec = key, spec
        self.ode = pn.ODE(spec["func"], n_states=2, n_theta=spec["lb"].size)
        self.times, self.truth, self.data = make_data(key, seed)
        theta = pt.vector("theta")
        log_kappa = pt.scalar("log_kappa")
        ll = pn.fenrir_loglik(self.ode, spec["y0"], theta, self.times, self.data,
                              obs_matrix=spec["H"], obs_sigma=np.sqrt(OBS_VAR),
                              diffusion=pt.exp(log_kappa), solver=pn.EK1(order=3), step=STEP)
        g_theta, g_logk = pytensor.grad(ll, [theta, log_kappa])
        self._fn = pytensor.function([theta, log_kappa], [ll, g_theta, g_logk])
        self.n_evals = 0
        self.n_linalg_errors = 0

    def __call__(self, theta, log_kappa):
        self.n_evals += 1
        try:
            ll, g_theta, g_logk = self._fn(np.asarray(theta, float), float(log_kappa))
        except np.linalg.LinAlgError:
            # Workaround (package bug, reported): for exploding solutions the gradient pass of the
            # Fenrir kernel raises LinAlgError (singular S in its forward tangent pass) instead of
            # returning -inf; treat the point as a diverging solve.
            self.n_linalg_errors += 1
            return -np.inf, np.zeros(len(theta)), 0.0
        return float(ll), np.asarray(g_theta), float(g_logk)


def objective(key: str) -> FenrirObjective:
    if (key, os.getpid()) not in _CACHE:
        _CACHE[(key, os.getpid())] = FenrirObjective(key)
    return _CACHE[(key, os.getpid())]


class _Stop(Exception):
    pass


def _lbfgsb(fun, x0, *, ftol, gtol, maxiter, f_abstol=None, early_stop=None):
    """Box-constrained L-BFGS-B on [0, 1]^n. Returns (x, loss, iterations).

    ``ftol`` is scipy's relative-reduction test (Optim.jl's ``f_reltol``); ``f_abstol`` stops when
    one iteration changes the loss by at most that much (Optim.jl's ``f_abstol``); ``early_stop``
    is the "OURS+" rule: stop when the loss changed by less than it in each of 3 consecutive
    iterations.
    """
    history, state = [], {"x": np.array(x0, float), "nit": 0}
    last = {"x": None, "f": None}

    def recorded(x):
        value, grad = fun(x)
        last["x"], last["f"] = np.array(x), value
        if not history:  # scipy evaluates the starting point first
            history.append(value)
        return value, grad

    def callback(xk):
        state["x"] = np.array(xk)
        state["nit"] += 1
        if f_abstol is None and early_stop is None:
            return
        # L-BFGS-B calls back at its last evaluated point: reuse that value (no extra solve)
        same = last["x"] is not None and np.array_equal(last["x"], xk)
        history.append(last["f"] if same else fun(xk)[0])
        change = np.abs(np.diff(history))
        if f_abstol is not None and change[-1] <= f_abstol:
            raise _Stop
        if early_stop is not None and change.size >= 3 and np.all(change[-3:] < early_stop):
            raise _Stop

    try:
        res = minimize(recorded, x0, jac=True, method="L-BFGS-B", bounds=[(0.0, 1.0)] * len(x0),
                       callback=callback, options=dict(ftol=ftol, gtol=gtol, maxiter=maxiter))
        return res.x, float(res.fun), int(res.nit)
    except _Stop:
        same = last["x"] is not None and np.array_equal(last["x"], state["x"])
        return state["x"], float(last["f"] if same else fun(state["x"])[0]), state["nit"]


def _bump(x, tol=1e-4):
    """Move coordinates that sit on a bound of [0, 1] a little inside (``bump_if_near_bounds``)."""
    x = np.array(x, float)
    x[x < tol] += tol
    x[x > 1 - tol] -= tol
    return x


def run_fenrir_learned(key: str, theta0) -> dict:
    """Fenrir with the diffusion learned jointly with θ (the paper's FENRIR rows)."""
    spec, obj = PROBLEMS[key], objective(key)
    lb = np.append(spec["lb"], LOG_KAPPA_BOUNDS[0])
    ub = np.append(spec["ub"], LOG_KAPPA_BOUNDS[1])
    n0 = obj.n_evals

    def fun(x):
        z = lb + (ub - lb) * x
        ll, g, gk = obj(z[:-1], z[-1])
        if not np.isfinite(ll):
            return FAILED, np.zeros_like(x)
        return -ll, -np.append(g, gk) * (ub - lb)

    x0 = (np.append(theta0, LOG_KAPPA0) - lb) / (ub - lb)
    # Optim.jl settings of the paper's get_optprob: abstol 1e-9, reltol 1e-6 (g_tol 1e-8 default)
    x, loss, nit = _lbfgsb(fun, x0, ftol=1e-6, gtol=1e-8, maxiter=1000)
    z = lb + (ub - lb) * x
    return dict(theta=z[:-1], log_kappa=z[-1], loss=loss, iterations=nit, evaluations=obj.n_evals - n0)


def run_tempering(key: str, theta0, early_stopping: bool = True) -> dict:
    """Diffusion tempering, κ = 10^(20-i), i = 0..20, warm starts; ``early_stopping`` = OURS+."""
    spec, obj = PROBLEMS[key], objective(key)
    lb, ub = spec["lb"], spec["ub"]
    x = (np.asarray(theta0, float) - lb) / (ub - lb)
    schedule = pn.tempering_schedule("linear")
    nit_total, n0 = 0, obj.n_evals
    loss = np.nan
    for i, kappa in enumerate(schedule):
        last = i == schedule.size - 1
        log_kappa = np.log(kappa)

        def fun(xx, log_kappa=log_kappa):
            ll, g, _ = obj(lb + (ub - lb) * xx, log_kappa)
            if not np.isfinite(ll):
                return FAILED, np.zeros_like(xx)
            return -ll, -g * (ub - lb)

        if last:  # the last stage runs to full tolerance (abstol 1e-9, reltol 1e-6)
            x_new, loss_new, nit = _lbfgsb(fun, _bump(x), ftol=1e-6, gtol=1e-8, maxiter=1000)
        else:  # intermediate stages: abstol 1e-6, reltol 1e-3; OURS+ adds the early stop
            x_new, loss_new, nit = _lbfgsb(fun, _bump(x), ftol=1e-3, gtol=1e-8, maxiter=1000,
                                           f_abstol=1e-6, early_stop=0.1 if early_stopping else None)
        nit_total += nit
        if loss_new < FAILED:  # keep the previous point if the stage diverged
            x, loss = x_new, loss_new
    return dict(theta=lb + (ub - lb) * x, log_kappa=np.log(schedule[-1]), loss=loss,
                iterations=nit_total, evaluations=obj.n_evals - n0)


def run_rk(key: str, theta0) -> dict:
    """RK least squares (adaptive DOP853, exact forward-sensitivity gradients, L-BFGS-B in the box)."""
    spec, obj = PROBLEMS[key], objective(key)
    res = rk_least_squares(
        obj.ode, obj.data, obj.times, theta0=np.asarray(theta0, float), y0=spec["y0"], fit_y0=False,
        obs_matrix=spec["H"], obs_sigma=np.sqrt(OBS_VAR), method="DOP853", rtol=1e-8, atol=1e-10,
        bounds=list(zip(spec["lb"], spec["ub"])),
    )
    return dict(theta=res.theta, log_kappa=np.nan, loss=res.objective, iterations=res.n_iterations,
                evaluations=res.n_function_evals, message=res.message)


METHODS = {"FENRIR": run_fenrir_learned, "RK": run_rk, "OURS+": run_tempering}


def metrics(key: str, theta_hat) -> dict:
    """pRMSE (relative, Def. A3.2), CONV (pRMSE < 0.05), N_θ (relative error < 0.1) and tRMSE of
    the observed component on the data grid (Def. A3.1; NaN if the solve at θ̂ fails)."""
    spec, obj = PROBLEMS[key], objective(key)
    theta_hat, theta_true = np.asarray(theta_hat, float), spec["theta_true"]
    rel = (theta_hat - theta_true) / theta_true
    prmse = float(np.sqrt(np.mean(rel**2)))
    est = reference_solution(key, theta_hat, obj.times) @ spec["H"].T
    truth = obj.truth @ spec["H"].T
    trmse = float(np.sqrt(np.sum((est - truth) ** 2) / truth.shape[0]))
    return dict(pRMSE=prmse, CONV=prmse < 0.05, N_theta=int(np.sum(np.abs(rel) < 0.1)), tRMSE=trmse,
                fitted=est[:, 0])


def run_task(task):
    """One (problem, method, start index, θ0) task; returns a flat record (picklable)."""
    key, method, idx, theta0 = task
    t0 = time.perf_counter()
    try:
        out = METHODS[method](key, theta0)
        err = ""
    except Exception as exc:  # a failed run is a result, recorded with its error
        out = dict(theta=np.full(len(theta0), np.nan), log_kappa=np.nan, loss=np.nan,
                   iterations=0, evaluations=0)
        err = repr(exc)
    rec = dict(problem=key, method=method, start=idx, theta0=np.asarray(theta0, float),
               wall=time.perf_counter() - t0, error=err, **out)
    if np.all(np.isfinite(rec["theta"])):
        rec.update(metrics(key, rec["theta"]))
    else:
        rec.update(pRMSE=np.nan, CONV=False, N_theta=0, tRMSE=np.nan, fitted=None)
    rec["linalg_errors"] = objective(key).n_linalg_errors
    return rec


def run_budgeted(key: str, starts, methods, budget_s: float, processes: int = 2, progress=None):
    """Run every method from every start in a process pool until ``budget_s`` seconds have
    passed; returns the records of the starts for which all methods finished (in start order)."""
    import multiprocessing as mp

    tasks = [(key, m, i, s) for i, s in enumerate(starts) for m in methods]
    records, deadline = [], time.perf_counter() + budget_s
    pool = mp.get_context("spawn").Pool(processes)
    try:
        results = pool.imap(run_task, tasks)  # in order; the workers run ahead in parallel
        for _ in tasks:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                break
            try:
                records.append(results.next(timeout=remaining))
            except mp.TimeoutError:
                break
            if progress is not None:
                progress.update(1)
    finally:
        pool.terminate()
        pool.join()
    done = {}
    for r in records:
        done.setdefault(r["start"], []).append(r)
    return [r for i in sorted(done) if len(done[i]) == len(methods) for r in done[i]]
