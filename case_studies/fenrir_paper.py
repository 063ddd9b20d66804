"""The experiments of the Fenrir paper (Tronarp, Bosch & Hennig, ICML 2022, §5 and App. C), notes
002 §9.5. Used by ``fenrir_paper.ipynb``.

Four experiments, each run as in the authors' published scripts (``nathanaelbosch/fenrir-experiments``;
where their code and the paper's text disagree the code is followed, because it produced the
published figures -- the notebook lists every such difference):

* ``lv_low``, ``lv_high``, ``fhn_low``, ``fhn_high`` (§5.1): initial values, parameters,
  observation noise and diffusion estimated from fully observed noisy states; Fenrir against RK
  least squares from the same start; metric the trajectory RMSE (Def. C.1).
* ``model_selection`` (§5.2): the four Lotka--Volterra candidate models ``M11, M10, M01, M00``
  fitted by Fenrir to the same data set; the correct model should have the lowest NLL.
* ``seir`` (§5.3): a partially observed SEIR model (only I and R observed, from day 30).
* ``pendulum`` (§5.4, Figs. 6 and 8): the pendulum length recovered from the authors' 161 starting values
  ``L0 = 10^(-2 : 0.025 : 2)`` with the initial value known; Fenrir (noise and
  diffusion first, then jointly) against RK least squares; ``pendulum_k30``: Fenrir again with the
  starting diffusion ``κ² = 1e30`` of the authors' Fig. 6 script.
* ``<study>_ip``: the Fenrir fits of a study again, same data and starts, with the interior-point
  optimiser (:func:`_interior_point`).
* ``<study>_guard`` (§5.1): the L-BFGS-B Fenrir fits again with the package's rounding guard, which
  was added after the studies above ran (gradients that are rounding noise are refused).

§5.1 and §5.3 start from the same random start for Fenrir and RK (the authors' rules, see
:func:`_start`); data sets and starts are seeded by ``(2022, run)``.

Fenrir terms use :func:`pymc_pnode.fenrir_loglik` (EK1 at the authors' fixed step; the observation
noise ``σ²`` and the diffusion ``κ²`` estimated in log space); its value and exact gradient are one
compiled PyTensor function per process and problem, the data a shared variable. RK uses
:func:`pymc_pnode.baselines.rk_least_squares` (scipy ``solve_ivp`` with forward sensitivities).
Both optimise with scipy's box-constrained L-BFGS-B, restarted after line-search stalls; the
``_ip`` studies use an emulation of what the authors ran (Optim.jl's L-BFGS inside GalacticOptim's
Fminbox, from ``fenrir_dt_table1.py``).

Command line (results are cached, one row per run, in ``results/fenrir_paper_<study>.csv``; a
second call resumes)::

    python fenrir_paper.py --studies lv_low lv_high fhn_low fhn_high pendulum pendulum_k30 \
        --runs 100 --processes 2
    python fenrir_paper.py --studies model_selection seir model_selection_ip seir_ip --runs 100 --processes 2
    python fenrir_paper.py --studies lv_low_ip lv_high_ip fhn_low_ip fhn_high_ip --runs 100 --processes 2
    python fenrir_paper.py --studies lv_low_guard lv_high_guard fhn_low_guard fhn_high_guard --processes 2
    python fenrir_paper.py --published /path/to/fenrir-experiments   # the authors' result files
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import time
import warnings
from multiprocessing import Pool

import numpy as np
import pandas as pd
import pytensor
import pytensor.tensor as pt
from fenrir_dt_table1 import _fminbox
from pytensor.graph.replace import graph_replace
from pytensor.graph.traversal import ancestors

import pymc_pnode as pn
from pymc_pnode._lbfgs import minimize_with_restarts
from pymc_pnode.baselines import rk_least_squares
from pymc_pnode.baselines.sensitivities import integrate

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
PUBLISHED_CSV = os.path.join(RESULTS, "fenrir_paper_published.csv")
FAILED = 1e20  # objective of a diverging solve (finite: the line search backtracks)


# ----------------------------------------------------------------------------------------------
# the vector fields (PyTensor for pymc_pnode, NumPy for the reference solutions)
def lotka_volterra(y, t, p, m=np):
    # θ = (α, β, δ, γ) as in the authors' code: ẏ1 = α y1 − β y1 y2, ẏ2 = −δ y2 + γ y1 y2
    return [p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]]


def lv_wrong_first(y, t, p, m=np):  # eq. (57a) with the correct second equation: M01
    return [p[0] * y[0] ** 2 - p[1] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]]


def lv_wrong_second(y, t, p, m=np):  # the correct first equation with eq. (57b): M10
    return [p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + 0.0 * p[3]]


def lv_both_wrong(y, t, p, m=np):  # M00
    return [p[0] * y[0] ** 2 - p[1] * y[1], -p[2] * y[1] + 0.0 * p[3]]


def fitzhugh_nagumo(y, t, p, m=np):
    # θ = (a, b, c); ẏ2 = −(y1 − a + b y2)/c as in the authors' code (the paper's eq. 56b has −b)
    return [p[2] * (y[0] - y[0] ** 3 / 3 + y[1]), -(y[0] - p[0] + p[1] * y[1]) / p[2]]


def seir(y, t, p, m=np):
    # θ = (β_E, γ, λ); β_I = 0 as in the paper
    s, e, i, _ = y[0], y[1], y[2], y[3]
    return [-p[0] * s * e, p[0] * s * e - p[1] * e, p[1] * e - p[2] * i, p[2] * i]


def pendulum(y, t, p, m=np):
    return [y[1], -9.81 / p[0] * m.sin(y[0])]


def _pt_field(func):
    return lambda y, t, p: func(y, t, p, m=pt)


# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Study:
    """One experiment of App. C: problem, data, Fenrir settings and bounds."""

    func: object
    theta_true: tuple
    y0_true: tuple
    times: np.ndarray
    noise_var: float
    order: int  # IWP order q
    step: float  # Fenrir's fixed step (the grid also contains every observation time)
    theta_bounds: tuple  # (low, high) for every parameter
    y0_bounds: tuple | None  # (low, high) for every initial-value component; None: not estimated
    log_sigma2_bounds: tuple
    log_kappa2_bounds: tuple
    maxiter: int  # L-BFGS iterations of the joint optimisation
    noise_first: bool = False  # optimise (σ², κ²) alone first (200 iterations), then jointly
    obs_matrix: np.ndarray | None = None
    y0_map: str = "full"  # "full": y0 estimated directly; "seir": y0(E0, I0) of eq. (60)
    rk_method: str = "RK45"
    rk_tol: tuple = (1e-6, 1e-8)  # (rtol, atol) of the RK baseline
    kappa2_start: float | None = None  # None: calibrated on the data (:func:`initial_diffusion`)

    @property
    def n_states(self) -> int:
        return len(self.y0_true)

    @property
    def H(self) -> np.ndarray:
        return np.eye(self.n_states) if self.obs_matrix is None else self.obs_matrix


_LOG = np.log
STUDIES = {
    **{f"lv_{level}": Study(
        lotka_volterra, (2.0, 1.0, 4.0, 1.0), (5.0, 3.0), np.round(np.arange(0.0, 2.0001, 0.1), 10), var,
        order=5, step=5e-3, theta_bounds=((0.0, 100.0),) * 4, y0_bounds=((0.0, 100.0),) * 2,
        log_sigma2_bounds=(_LOG(1e-4), _LOG(1e2)), log_kappa2_bounds=(_LOG(1e-20), _LOG(1e50)),
        maxiter=400, noise_first=True)
        for level, var in (("low", 0.1 ** 2), ("high", 0.5 ** 2))},
    **{f"fhn_{level}": Study(
        fitzhugh_nagumo, (0.2, 0.2, 3.0), (-1.0, 1.0), np.linspace(0.0, 10.0, 20), var,
        order=3, step=5e-2, theta_bounds=((0.0, 100.0),) * 3, y0_bounds=((-100.0, 100.0),) * 2,
        log_sigma2_bounds=(_LOG(1e-4), _LOG(1e2)), log_kappa2_bounds=(_LOG(1e-20), _LOG(1e50)),
        maxiter=400, rk_method="Radau")
        for level, var in (("low", 0.005), ("high", 0.05))},
    "seir": Study(
        seir, (0.5, 1 / 5, 1 / 21), (1 - 4e-5 - 1e-5, 4e-5, 1e-5, 0.0), np.arange(30.0, 100.5, 1.0), 5e-4,
        order=5, step=0.2, theta_bounds=((0.0, 1.0),) * 3, y0_bounds=((0.0, 1.0),) * 2,
        log_sigma2_bounds=(_LOG(1e-6), _LOG(1e2)), log_kappa2_bounds=(_LOG(1e-20), _LOG(1e20)),
        maxiter=1000, obs_matrix=np.array([[0.0, 0, 1, 0], [0, 0, 0, 1]]), y0_map="seir"),
    "pendulum": Study(
        pendulum, (1.0,), (0.0, np.pi / 2), np.round(np.arange(0.0, 10.0001, 0.01), 10), 0.1,
        order=5, step=0.01, theta_bounds=((0.0, 100.0),), y0_bounds=None,
        log_sigma2_bounds=(_LOG(1e-8), _LOG(1e4)), log_kappa2_bounds=(_LOG(1e-20), _LOG(1e50)),
        maxiter=200, noise_first=True, obs_matrix=np.array([[0.0, 1.0]]), rk_tol=(1e-3, 1e-6),
        ),
}
# Fig. 6 / the authors' figure-6 script start the diffusion at κ² = 1e30 instead (only Fenrir)
STUDIES["pendulum_k30"] = dataclasses.replace(STUDIES["pendulum"], kappa2_start=1e30)
# §5.2: Lotka–Volterra data (low noise), four candidate models, step 1e-2, IWP(5), 200 iterations
MODELS = {"M11": lotka_volterra, "M10": lv_wrong_second, "M01": lv_wrong_first, "M00": lv_both_wrong}
MODEL_SELECTION = Study(
    lotka_volterra, (2.0, 1.0, 4.0, 1.0), (5.0, 3.0), STUDIES["lv_low"].times, 0.1 ** 2,
    order=5, step=1e-2, theta_bounds=((0.0, 100.0),) * 4, y0_bounds=((0.0, 100.0),) * 2,
    log_sigma2_bounds=(_LOG(1e-8), _LOG(1e3)), log_kappa2_bounds=(_LOG(1e-20), _LOG(1e50)),
    maxiter=200)
# the authors' 161 starting lengths 10^(-2 : 0.025 : 2); rounded so that the last is 100, not 100 + 8e-13
# (outside the box)
PENDULUM_STARTS = np.round(10.0 ** (np.arange(161) * 0.025 - 2.0), 10)


# ----------------------------------------------------------------------------------------------
def study_ode(study: Study, func=None) -> pn.ODE:
    """The study's (or ``func``'s) vector field as a :class:`pymc_pnode.ODE`, built once per process."""
    return _ode_of(func or study.func, study.n_states, len(study.theta_true))


@functools.lru_cache(maxsize=None)
def _ode_of(func, n_states: int, n_theta: int) -> pn.ODE:
    return pn.ODE(_pt_field(func), n_states=n_states, n_theta=n_theta)


def trajectory(study: Study, y0, theta, times=None) -> np.ndarray:
    """Accurate solution (LSODA, rtol = atol = 1e-10) at ``times``; NaN where the solve fails or
    needs more than 200,000 field evaluations (extreme estimates, e.g. FitzHugh--Nagumo with ``c``
    near 0, are that stiff)."""
    times = study.times if times is None else times
    sol = integrate(study_ode(study), y0, theta, times, t0=0.0, method="LSODA", rtol=1e-10, atol=1e-10,
                    max_nfev=200_000)
    return sol.y if sol.success else np.full((times.size, study.n_states), np.nan)


def make_data(study: Study, rng: np.random.Generator) -> np.ndarray:
    """Noisy observations ``H y(t_i) + N(0, σ² I)`` of the true trajectory."""
    clean = trajectory(study, study.y0_true, study.theta_true) @ study.H.T
    return clean + np.sqrt(study.noise_var) * rng.standard_normal(clean.shape)


def trmse(study: Study, y0, theta) -> float:
    """Trajectory RMSE (Def. C.1) over all states at the observation times; inf if the solve fails."""
    err = trajectory(study, y0, theta) - trajectory(study, study.y0_true, study.theta_true)
    value = float(np.sqrt(np.mean(np.sum(err ** 2, axis=1))))
    return value if np.isfinite(value) else np.inf


def initial_diffusion(study: Study, data: np.ndarray, order: int = 3) -> float:
    """Starting value of ``κ²``: the diffusion calibrated on the data alone, as the authors'
    ``get_initial_diff`` does -- a Kalman filter with an IWP(``order``) prior of unit diffusion
    (mean 0, covariance ``10⁴ I``) conditioned noise-free on each observation in turn, returning
    the mean over observation times of ``rᵀ S⁻¹ r`` (quasi-MLE of the diffusion, Tronarp et al.,
    2019, Prop. 4, without the division by the observation dimension). At small steps the
    noise-free conditioning is ill-conditioned (Lotka--Volterra, step 0.1: ~3 % from the dense
    computation); the value is only a starting point."""
    d, iwp = study.n_states, pn.IWP(order)
    n = order + 1
    e0 = np.zeros((1, n))
    e0[0, 0] = 1.0
    H = study.H @ np.kron(np.eye(d), e0)  # state ordered state by state, derivatives inside
    mean, cov = np.zeros(d * n), 1e4 * np.eye(d * n)
    total, t_prev = 0.0, 0.0
    for t, u in zip(study.times, data):
        h = t - t_prev
        if h > 0:
            a, q = iwp.transition(h)
            A, Q = np.kron(np.eye(d), a), np.kron(np.eye(d), q)
            mean, cov = A @ mean, A @ cov @ A.T + Q
        r = H @ mean - u
        S = H @ cov @ H.T
        K = np.linalg.solve(S, H @ cov).T
        total += float(r @ np.linalg.solve(S, r))
        mean, cov = mean - K @ r, cov - K @ S @ K.T
        cov = 0.5 * (cov + cov.T)
        t_prev = t
    return total / study.times.size


# ----------------------------------------------------------------------------------------------
class FenrirObjective:
    """Negative Fenrir log-likelihood and its exact gradient in ``x = (y0 part, θ, log σ², log κ²)``.

    One compiled function per process and (study, model); the data are a shared variable, set by
    :meth:`set_data` for every run.
    """

    def __init__(self, study: Study, func=None):
        self.study = study
        k = len(study.theta_true)
        self.ode = study_ode(study, func)
        self.n_y0 = 0 if study.y0_bounds is None else len(study.y0_bounds)
        x = pt.vector("x")
        y0 = self.y0_of(x[: self.n_y0], pt)
        theta = x[self.n_y0: self.n_y0 + k]
        placeholder = np.zeros((study.times.size, study.H.shape[0]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", pn.AccuracyWarning)
            ll = pn.fenrir_loglik(self.ode, y0, theta, study.times, placeholder, obs_matrix=study.H,
                                  obs_sigma=pt.exp(0.5 * x[-2]), diffusion=pt.exp(x[-1]),
                                  solver=pn.EK1(order=study.order), step=study.step)
        grad = pytensor.grad(ll, x)
        const = [v for v in ancestors([ll, grad]) if isinstance(v, pt.TensorConstant)
                 and v.type.ndim == 2 and v.data.shape == placeholder.shape]
        if len(const) != 1:
            raise RuntimeError("could not find the data input of the Fenrir graph")
        self.data = pytensor.shared(placeholder, name="data")
        self._fn = pytensor.function([x], graph_replace([ll, grad], {const[0]: self.data}))
        self.n_evals = 0
        # the likelihood's counts: evaluations refused by the package's rounding guard (docs/fenrir.md)
        self.diagnostics = next(node.op.problem.diagnostics for node in self._fn.maker.fgraph.apply_nodes
                                if hasattr(node.op, "problem"))

    def y0_of(self, z, m=np):
        """The initial state from its estimated part (``z`` empty: the true, known initial value)."""
        if self.n_y0 == 0:
            return m.as_tensor_variable(np.asarray(self.study.y0_true)) if m is pt else np.asarray(self.study.y0_true)
        if self.study.y0_map == "seir":  # eq. (60): y0 = (1 − E0 − I0, E0, I0, 0)
            e0, i0 = z[0], z[1]
            return pt.stack([1.0 - e0 - i0, e0, i0, 0.0 * e0]) if m is pt else np.array([1 - e0 - i0, e0, i0, 0.0])
        return z

    def set_data(self, data: np.ndarray) -> None:
        self.data.set_value(np.asarray(data, float))

    def __call__(self, x):
        self.n_evals += 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", pn.AccuracyWarning)
            ll, g = self._fn(np.asarray(x, float))
        if not np.isfinite(ll):
            return FAILED, np.zeros_like(x)
        return -float(ll), -np.asarray(g)


_OBJECTIVES: dict = {}


def objective(key: str, study: Study, func=None) -> FenrirObjective:
    if (key, os.getpid()) not in _OBJECTIVES:
        _OBJECTIVES[(key, os.getpid())] = FenrirObjective(study, func)
    return _OBJECTIVES[(key, os.getpid())]


def _lbfgsb(fun, x0, bounds, maxiter):
    """L-BFGS-B in the box, restarted where a line search stalls on a diverging solve (the package's
    :func:`~pymc_pnode._lbfgs.minimize_with_restarts`, as in :func:`pymc_pnode.fit`); stops at a
    point whose projected gradient is below 1e-8."""
    lo, hi = np.transpose(bounds)

    def stationary(x, f, g):  # Optim.jl's default g_tol: projected gradient below 1e-8
        return float(np.max(np.abs(x - np.clip(x - g, lo, hi)), initial=0.0)) <= 1e-8

    res = minimize_with_restarts(fun, np.clip(x0, lo, hi), is_stationary=stationary, bounds=list(bounds),
                                 maxiter=maxiter, gtol=1e-8, ftol=1e-12)
    return res.x, float(res.fun), int(res.nit)


def _interior_point(fun, x0, bounds, maxiter):
    """The interior-point emulation of Optim.jl's ``Fminbox(LBFGS(linesearch=BackTracking()))`` of
    ``fenrir_dt_table1.py`` (what the authors' GalacticOptim calls run), in box-normalised
    coordinates; its iterates never touch the box."""
    lo, hi = np.transpose(bounds)

    def normalised(z):
        value, grad = fun(lo + (hi - lo) * z)
        return value, grad * (hi - lo)

    z, value, nit = _fminbox(normalised, (np.asarray(x0, float) - lo) / (hi - lo), f_reltol=1e-6, f_abstol=1e-9,
                             maxiter=maxiter)
    return lo + (hi - lo) * z, value, nit


OPTIMIZERS = {"Fenrir": _lbfgsb, "Fenrir-IP": _interior_point}


def fit_fenrir(obj: FenrirObjective, data, y0_start, theta_start, optimize=_lbfgsb, trace: list | None = None) -> dict:
    """Fenrir's estimate from one start: σ² = 1, κ² from :func:`initial_diffusion`; when the study
    says so, ``(σ², κ²)`` are optimised alone first (200 iterations), then everything jointly. With ``trace``,
    every evaluation's phase (1: noise first, 2: joint), full argument and objective value are appended to it
    (the paper's Fig. 7)."""
    study = obj.study
    obj.set_data(data)
    n0, t0, refused0 = obj.n_evals, time.perf_counter(), obj.diagnostics.n_unreliable_gradient
    kappa2 = initial_diffusion(study, data) if study.kappa2_start is None else study.kappa2_start
    noise = np.array([0.0, np.log(kappa2)])
    noise = np.clip(noise, *np.transpose([study.log_sigma2_bounds, study.log_kappa2_bounds]))
    head = np.concatenate([np.asarray(y0_start, float)[: obj.n_y0], theta_start])
    bounds = list(study.y0_bounds or ()) + list(study.theta_bounds)
    noise_bounds = [study.log_sigma2_bounds, study.log_kappa2_bounds]
    def evaluate(x, phase=2):
        value_grad = obj(x)
        if trace is not None:
            trace.append((phase, np.array(x, dtype=float), value_grad[0]))
        return value_grad

    nit = 0
    if study.noise_first:
        noise, _, nit = optimize(lambda z: _restrict(evaluate(np.concatenate([head, z]), 1), head.size), noise,
                                 noise_bounds, 200)
    x, nll, nit2 = optimize(evaluate, np.concatenate([head, noise]), bounds + noise_bounds, study.maxiter)
    y0 = obj.y0_of(x[: obj.n_y0])
    theta = x[obj.n_y0: -2]
    return dict(y0=list(y0), theta=list(theta), sigma2=float(np.exp(x[-2])), kappa2=float(np.exp(x[-1])),
                nll=nll, iterations=nit + nit2, evaluations=obj.n_evals - n0,
                refused=obj.diagnostics.n_unreliable_gradient - refused0, seconds=time.perf_counter() - t0)


def _restrict(value_grad, k):
    value, grad = value_grad
    return value, grad[k:]


def fit_rk(study: Study, data, y0_start, theta_start) -> dict:
    """RK least squares (the authors' loss ``Σ ‖H y(t) − u(t)‖²``) from the same start."""
    t0 = time.perf_counter()
    rtol, atol = study.rk_tol
    ode = study_ode(study)
    if study.y0_map == "seir":
        x, sse = _seir_least_squares(ode, study, data, np.concatenate([y0_start, theta_start]))
        return dict(y0=list(x_to_seir_y0(x)), theta=list(x[2:]), nll=sse, iterations=-1, evaluations=-1,
                    seconds=time.perf_counter() - t0)
    fit_y0 = study.y0_bounds is not None
    res = rk_least_squares(ode, data, study.times, theta0=np.asarray(theta_start, float),
                           y0=np.asarray(y0_start if fit_y0 else study.y0_true, float), fit_y0=fit_y0, t0=0.0,
                           obs_matrix=study.H, obs_sigma=1.0, method=study.rk_method, rtol=rtol, atol=atol,
                           bounds=list(study.theta_bounds), y0_bounds=list(study.y0_bounds) if fit_y0 else None,
                           maxiter=1000)
    y0 = res.y0 if fit_y0 else study.y0_true
    return dict(y0=list(y0), theta=list(res.theta), nll=float(res.objective), iterations=res.n_iterations,
                evaluations=res.n_function_evals, seconds=time.perf_counter() - t0)


def x_to_seir_y0(x):
    return np.array([1.0 - x[0] - x[1], x[0], x[1], 0.0])


_SEIR_DY0 = np.array([[-1.0, -1.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])  # ∂y0/∂(E0, I0)


def _seir_least_squares(ode, study: Study, data, x0):
    """RK least squares in ``(E0, I0, β_E, γ, λ)`` (the authors' parameterisation, eq. 60)."""
    rtol, atol = study.rk_tol

    def fun(x):
        sol = integrate(ode, x_to_seir_y0(x), x[2:], study.times, t0=0.0, wrt_y0=True, wrt_theta=True,
                        method=study.rk_method, rtol=rtol, atol=atol)
        if not sol.success:
            return FAILED, np.zeros_like(x)
        r = sol.y @ study.H.T - data
        jac_y0 = np.einsum("md,tde,ek->tmk", study.H, sol.dy_dy0, _SEIR_DY0)
        jac_th = np.einsum("md,tdk->tmk", study.H, sol.dy_dtheta)
        grad = 2 * np.concatenate([np.einsum("tm,tmk->k", r, jac_y0), np.einsum("tm,tmk->k", r, jac_th)])
        return float(np.sum(r ** 2)), grad

    x, sse, _ = _lbfgsb(fun, x0, list(study.y0_bounds) + list(study.theta_bounds), 1000)
    return x, sse


# ----------------------------------------------------------------------------------------------
# one run of each study: a data set, a random start, the estimators; returns result rows
def _start(study: Study, data, rng):
    """The authors' starts: θ ~ |N(0, 1)| (SEIR: U(0, 1)), y0 at its clamped first observation
    (SEIR: E0, I0 ~ |N(0, 10⁻⁴)|)."""
    if study.y0_map == "seir":
        return np.abs(1e-2 * rng.standard_normal(2)), rng.random(3)
    y0 = np.clip(data[0], *np.transpose(study.y0_bounds))
    return y0, np.abs(rng.standard_normal(len(study.theta_true)))


def run_accuracy(key: str, run: int, methods=("Fenrir", "RK"), seed: int = 2022) -> list[dict]:
    """One run of §5.1 or §5.3: Fenrir (``"Fenrir"``, ``"Fenrir-IP"``) and RK from the same start on
    the same data."""
    study = STUDIES[key]
    rng = np.random.default_rng([seed, run])
    data = make_data(study, rng)
    y0_start, theta_start = _start(study, data, rng)
    rows = []
    for method in methods:
        if method == "RK":
            out = fit_rk(study, data, y0_start, theta_start)
        else:
            out = fit_fenrir(objective(key, study), data, y0_start, theta_start, OPTIMIZERS[method])
        rows.append(dict(study=key, run=run, method=method, trmse=trmse(study, out["y0"], out["theta"]),
                         **_flatten(out)))
    return rows


def run_model_selection(run: int, optimizer: str = "Fenrir", seed: int = 2022) -> list[dict]:
    """One run of §5.2: the four models fitted by Fenrir to one data set, from one start
    (``optimizer``: a key of :data:`OPTIMIZERS`)."""
    study = MODEL_SELECTION
    rng = np.random.default_rng([seed, run])
    data = make_data(study, rng)
    y0_start, theta_start = _start(study, data, rng)
    rows = []
    for name, func in MODELS.items():
        out = fit_fenrir(objective(f"model_{name}", study, func), data, y0_start, theta_start, OPTIMIZERS[optimizer])
        rows.append(dict(study="model_selection", run=run, method=name, optimizer=optimizer, **_flatten(out)))
    return rows


def run_pendulum(run: int, key: str = "pendulum", seed: int = 2022) -> list[dict]:
    """One starting length of §5.4 / Fig. 8 (one data set for all starts, y0 known); RK only for
    ``key = "pendulum"`` (it does not depend on the diffusion's start)."""
    study = STUDIES[key]
    data = make_data(study, np.random.default_rng([seed, 0]))
    L0 = np.array([PENDULUM_STARTS[run]])
    fits = {"Fenrir": lambda: fit_fenrir(objective(key, study), data, (), L0)}
    if key == "pendulum":
        fits["RK"] = lambda: fit_rk(study, data, (), L0)
    return [dict(study=key, run=run, method=method, L0=float(L0[0]), **_flatten(fit())) for method, fit in fits.items()]


def _flatten(out: dict) -> dict:
    flat = {}
    for key, value in out.items():
        if isinstance(value, list):
            flat.update({f"{key}_{i}": float(v) for i, v in enumerate(value)})
        else:
            flat[key] = value
    return flat


# "<study>_ip": the Fenrir fits of a study again with the interior-point optimiser (same data and starts);
# "<study>_guard": its L-BFGS-B Fenrir fits again with the package's rounding guard (added after these studies ran:
# gradients that are rounding noise are refused, docs/fenrir.md)
RUNNERS = {"model_selection": run_model_selection, "pendulum": run_pendulum,
           "pendulum_k30": lambda run: run_pendulum(run, "pendulum_k30"),
           "model_selection_ip": lambda run: run_model_selection(run, "Fenrir-IP"),
           **{f"{key}_ip": (lambda run, key=key: run_accuracy(key, run, ("Fenrir-IP",)))
              for key in ("lv_low", "lv_high", "fhn_low", "fhn_high", "seir")},
           **{f"{key}_guard": (lambda run, key=key: run_accuracy(key, run, ("Fenrir",)))
              for key in ("lv_low", "lv_high", "fhn_low", "fhn_high")}}


def _task(args):
    key, run = args
    warnings.simplefilter("ignore", pn.AccuracyWarning)
    runner = RUNNERS.get(key)
    return run_accuracy(key, run) if runner is None else runner(run)


def results_path(key: str) -> str:
    return os.path.join(RESULTS, f"fenrir_paper_{key}.csv")


def load(key: str) -> pd.DataFrame:
    path = results_path(key)
    return pd.read_csv(path) if os.path.exists(path) else pd.DataFrame()


def run_study(key: str, n_runs: int, processes: int = 1) -> pd.DataFrame:
    """Run (or resume) a study; rows are appended to its CSV as runs finish."""
    n_runs = PENDULUM_STARTS.size if key.startswith("pendulum") else n_runs
    done = set(load(key).get("run", pd.Series(dtype=int)).tolist())
    todo = [(key, r) for r in range(n_runs) if r not in done]
    os.makedirs(RESULTS, exist_ok=True)
    with Pool(processes) as pool:
        for i, rows in enumerate(pool.imap_unordered(_task, todo)):
            # rewritten whole (small files): rows of a newer version may carry more columns
            pd.concat([load(key), pd.DataFrame(rows)], ignore_index=True).to_csv(results_path(key), index=False)
            print(f"[{key}] {i + 1}/{len(todo)} run {rows[0]['run']}", flush=True)
    return load(key)


# ----------------------------------------------------------------------------------------------
# the authors' published results (nathanaelbosch/fenrir-experiments, commit e7b69d9)
_PUBLISHED_FILES = {
    **{(f"{p}_{lvl}", m): f"experiments/1/results/{p}_{lvl}noise_{f}_withiv.txt"
       for p in ("lv", "fhn") for lvl in ("low", "high") for m, f in (("Fenrir", "fenrir"), ("RK", "classic"),
                                                                     ("ODIN", "odin"))},
    ("seir", "Fenrir"): "experiments/3/results/seir_fenrir.csv",
    ("seir", "RK"): "experiments/3/results/seir_classic.csv",
    ("pendulum", "Fenrir"): "experiments/4/results/fenrir_df.csv",
    ("pendulum", "RK"): "experiments/4/results/rk_df.csv",
}


def published_summary(repo: str) -> pd.DataFrame:
    """Per-run metrics of the authors' published estimates, computed as ours are (tRMSE from their
    ``(y0, θ)``; SEIR absolute parameter errors; pendulum final lengths; model-selection NLLs)."""
    rows = []
    for (key, method), rel in _PUBLISHED_FILES.items():
        study = STUDIES[key]
        path = os.path.join(repo, rel)
        if key == "pendulum":
            frame = pd.read_csv(path).dropna(subset=["popt"])  # the RK file also has unfitted starts
            rows += [dict(study=key, method=method, run=i, L0=r.p0, theta_0=r.popt) for i, r in
                     enumerate(frame.itertuples())]
            continue
        values = np.loadtxt(path, delimiter=",", ndmin=2)
        d = study.n_states
        for i, v in enumerate(values):
            y0, theta = v[:d], v[d:]
            rows.append(dict(study=key, method=method, run=i, trmse=trmse(study, y0, theta),
                             **{f"y0_{j}": y for j, y in enumerate(y0)},
                             **{f"theta_{j}": t for j, t in enumerate(theta)}))
    with open(os.path.join(repo, "experiments/2/results.txt")) as f:
        names = {"M1": "M11", "M2": "M10", "M3": "M01", "M4": "M00"}
        for line in f:
            label, *values = line.strip().split(",")
            rows += [dict(study="model_selection", method=names[label], run=i, nll=float(v))
                     for i, v in enumerate(values)]
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--studies", nargs="+", default=[], choices=sorted({*STUDIES, *RUNNERS}))
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--published", metavar="REPO", help="summarise the authors' result files")
    args = parser.parse_args(argv)
    if args.published:
        published_summary(args.published).to_csv(PUBLISHED_CSV, index=False)
        print("wrote", PUBLISHED_CSV)
    for key in args.studies:
        t0 = time.time()
        run_study(key, args.runs, args.processes)
        print(f"[{key}] done in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
