"""MLE/MAP estimation of PyMC models in transformed space, and diffusion tempering for Fenrir.

Diffusion tempering (Beck et al., 2024) re-reads the Fenrir diffusion ``κ`` as an optimisation
hyperparameter: starting from a huge ``κ`` (the PN posterior interpolates the data, the loss is
smooth) it is decreased on a schedule, each stage warm-started at the previous optimum, so the
optimiser avoids the local optima of the sharp small-``κ`` landscape.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pymc as pm
import pytensor
import scipy.optimize
from pytensor.compile.sharedvalue import SharedVariable
from tqdm.auto import tqdm

from pymc_pnode._lbfgs import minimize_with_restarts
from pymc_pnode.estimation import EstimationResult

__all__ = ["FitResult", "TemperingResult", "diffusion_tempering", "fit", "tempering_schedule"]


@dataclass(kw_only=True, repr=False)  # the common repr of EstimationResult, not every array
class FitResult(EstimationResult):
    """Result of :func:`fit`: an :class:`~pymc_pnode.estimation.EstimationResult` of a PyMC model.

    ``theta`` holds the model's free variables flattened in model order (labels in ``theta_names``,
    e.g. ``"sigma"``, ``"theta[2]"``); ``y0`` is ``None``; ``method`` is ``"map"`` or ``"mle"``;
    ``n_function_evals`` counts evaluations of the objective with its gradient. ``result["name"]``
    gives a variable of ``point``.

    Attributes
    ----------
    point : dict
        Estimate in the model's constrained space: every free variable and deterministic, by name.
    history : list of float
        The objective after each optimiser iteration.
    """

    point: dict
    history: list = field(default_factory=list)

    @classmethod
    def from_point(cls, model: pm.Model, point: dict, **fields) -> FitResult:
        """A result whose ``theta`` and ``theta_names`` are the free variables of ``model`` in ``point``."""
        values, names = [], []
        for rv in model.free_RVs:
            value = np.asarray(point[rv.name], dtype=np.float64)
            values.append(value.reshape(-1))
            names += [rv.name] if value.ndim == 0 else [
                f"{rv.name}[{', '.join(map(str, index))}]" for index in np.ndindex(value.shape)]
        theta = np.concatenate(values) if values else np.zeros(0)
        return cls(theta=theta, y0=None, theta_names=names, point=point, **fields)

    @property
    def n_evaluations(self) -> int:
        """Alias of ``n_function_evals``."""
        return self.n_function_evals

    def estimates(self) -> dict[str, np.ndarray]:
        return dict(self.point)

    def _coords(self) -> dict[str, list[str]]:
        # the model's variables, not the flattened theta, are the estimates: a variable named "theta" has
        # its own shape, which theta_names (all free variables) does not label
        return {}

    def __getitem__(self, name: str):
        return self.point[name]


_OBJECTIVE_NAMES = {"map": "log-posterior density (no Jacobian terms)", "mle": "log-likelihood"}


class _EarlyStop(Exception):
    pass


class _Objective:
    """Objective and exact gradient of a PyMC model on its flattened unconstrained values."""

    def __init__(self, model: pm.Model, kind: str):
        if kind == "map":
            target = model.logp(jacobian=False)
        elif kind == "mle":
            target = model.datalogp
        else:
            raise ValueError(f"objective must be 'map' or 'mle', got {kind!r}")
        self.value_vars = list(model.continuous_value_vars)
        if len(self.value_vars) != len(model.value_vars):
            raise ValueError("fit needs a model whose free variables are all continuous")
        grads = pytensor.grad(target, self.value_vars)
        self._fn = model.compile_fn([target, *grads], inputs=self.value_vars, point_fn=False)
        ip = model.initial_point()
        self.shapes = [np.shape(ip[v.name]) for v in self.value_vars]
        self.sizes = [int(np.prod(s)) for s in self.shapes]

    def unravel(self, x: np.ndarray) -> list[np.ndarray]:
        out, offset = [], 0
        for shape, size in zip(self.shapes, self.sizes):
            out.append(x[offset : offset + size].reshape(shape))
            offset += size
        return out

    def __call__(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        value, *grads = self._fn(*self.unravel(x))
        return float(value), np.concatenate([np.ravel(g) for g in grads])


def fit(
    model: pm.Model | None = None,
    *,
    objective: str = "map",
    start: dict | None = None,
    method: str = "L-BFGS-B",
    maxiter: int = 1000,
    tol: float | None = None,
    early_stop: float | None = None,
) -> FitResult:
    """Maximise the log-likelihood (``"mle"``) or log-posterior (``"map"``) of a PyMC model.

    Optimisation runs in the unconstrained space of PyMC's value transforms (log for positive
    variables, ...), with the model's exact gradients; the density is evaluated without the
    transforms' Jacobian terms, so the estimate is the mode in the original parametrisation.

    Parameters
    ----------
    model : pymc.Model, optional
        The model (default: the model context).
    objective : {"map", "mle"}
        ``"mle"`` maximises only the likelihood terms (``model.datalogp``).
    start : dict, optional
        Starting values by variable name (constrained space); default: the model's initial point.
    method : str
        A gradient-based :func:`scipy.optimize.minimize` method.
    maxiter : int
        Maximum number of iterations.
    tol : float, optional
        Tolerance passed to scipy.
    early_stop : float, optional
        Stop when the objective changed by less than this in each of 3 consecutive iterations
        (the early-stopping rule of diffusion tempering, "OURS+").

    Returns
    -------
    FitResult
    """
    model = pm.modelcontext(model)
    fn = _Objective(model, objective)
    ip = model.initial_point()
    if start:
        for name, value in start.items():
            rv = model[name]
            transform = model.rvs_to_transforms.get(rv)
            value_var = model.rvs_to_values[rv]
            value = np.asarray(value, dtype=float)
            if transform is not None:
                value = transform.forward(value, *rv.owner.inputs).eval()
            ip[value_var.name] = value
    x0 = np.concatenate([np.ravel(ip[v.name]) for v in fn.value_vars]).astype(float)
    history: list[float] = []
    state = {"x": x0, "evaluations": 0, "last": (None, None)}

    def fun(x):
        logp, dlogp = fn(x)
        state["evaluations"] += 1
        state["last"] = (np.array(x), -float(logp))
        return -float(logp), -np.asarray(dlogp, dtype=float)

    def callback(xk):
        state["x"] = np.array(xk)
        last_x, last_value = state["last"]
        # the optimiser has usually just evaluated its new iterate: do not evaluate it again
        history.append(-(last_value if last_x is not None and np.array_equal(last_x, xk) else fun(xk)[0]))
        if early_stop is not None and len(history) >= 4:
            if np.all(np.abs(np.diff(history[-4:])) < early_stop):
                raise _EarlyStop

    t0 = time.perf_counter()
    try:
        if method == "L-BFGS-B":
            # restarts after line-search stalls (diverging solves, huge |f|); see pymc_pnode._lbfgs
            options = {} if tol is None else {"ftol": tol, "gtol": tol}
            res = minimize_with_restarts(fun, x0, is_stationary=_stationary, maxiter=maxiter,
                                         callback=callback, **options)
            x, nit, ok = res.x, res.nit, res.stationary
            msg = res.message + (f"; {res.restarts} restart(s) after line-search stalls" if res.restarts else "")
        else:
            def finite(x):
                value, grad = fun(x)
                return (value, grad) if np.isfinite(value) else (np.inf, np.zeros_like(x))

            res = scipy.optimize.minimize(finite, x0, jac=True, method=method, tol=tol,
                                          options={"maxiter": maxiter}, callback=callback)
            x, nit, ok, msg = res.x, res.nit, bool(res.success), str(res.message)
    except _EarlyStop:
        x, nit = state["x"], len(history)
        ok, msg = True, "early stopping: objective changes below threshold"
    elapsed = time.perf_counter() - t0
    value = -fun(x)[0]
    return FitResult.from_point(
        model, _constrained_point(model, fn, x), objective=value, n_iterations=nit, wall_time=elapsed,
        converged=ok, message=msg, method=objective, objective_name=_OBJECTIVE_NAMES[objective],
        n_function_evals=state["evaluations"], history=history)


def _stationary(x: np.ndarray, f: float, g: np.ndarray) -> bool:
    """Relative gradient ``max_i |g_i| max(1, |x_i|) / max(1, |f|)`` below 1e-5."""
    return float(np.max(np.abs(g) * np.maximum(1.0, np.abs(x)), initial=0.0)) <= 1e-5 * max(1.0, abs(f))


def _constrained_point(model: pm.Model, fn: _Objective, x: np.ndarray) -> dict:
    # unobserved_value_vars are the free variables in their original (constrained) space, written
    # in terms of the transformed value variables; RVs themselves would compile to random draws.
    outs = model.unobserved_value_vars
    get = model.compile_fn(outs, inputs=fn.value_vars, on_unused_input="ignore", point_fn=False)
    values = get(*fn.unravel(x))
    names = {rv.name for rv in model.free_RVs} | {d.name for d in model.deterministics}
    return {v.name: np.asarray(val) for v, val in zip(outs, values) if v.name in names}


def tempering_schedule(kind: str = "linear") -> np.ndarray:
    """Diffusion schedules of Beck et al. (2024) (values of the variance multiplier ``κ``).

    ``"linear"``: ``10^(20 - i)``, i = 0..20 (diffusion-tempering paper); ``"exponential"``:
    ``10^(20 exp(-i/5))``, i = 0..20 (its App. A8.1 variant); ``"thesis"``: ``e^(40 - i)``,
    i = 0..40 (thesis §10.6).
    """
    if kind == "linear":
        return 10.0 ** (20.0 - np.arange(21))
    if kind == "exponential":
        return 10.0 ** (20.0 * np.exp(-np.arange(21) / 5.0))
    if kind == "thesis":
        return np.exp(40.0 - np.arange(41))
    raise ValueError(f"schedule must be 'linear', 'exponential' or 'thesis', got {kind!r}")


@dataclass(kw_only=True, repr=False)  # the common repr of EstimationResult, not every array
class TemperingResult(FitResult):
    """Result of :func:`diffusion_tempering`: a :class:`FitResult` at the final estimate (``point``: the
    last stage's, or the last finite stage's if the final objective was not finite), with the
    iterations and evaluations of all stages summed, and one :class:`FitResult` per stage.

    Attributes
    ----------
    schedule : ndarray
        The diffusions of the stages.
    stages : list of FitResult
    """

    schedule: np.ndarray
    stages: list


def diffusion_tempering(
    model: pm.Model | None = None,
    *,
    diffusion: SharedVariable,
    schedule: str | Sequence[float] = "linear",
    objective: str = "mle",
    start: dict | None = None,
    early_stopping: bool = False,
    early_stop_threshold: float = 0.1,
    maxiter: int = 1000,
    progressbar: bool = True,
) -> TemperingResult:
    """Diffusion tempering (Beck et al., 2024): optimise while decreasing the Fenrir diffusion.

    Parameters
    ----------
    model : pymc.Model, optional
        A model whose Fenrir term(s) use ``diffusion`` (a ``pytensor.shared`` scalar) as ``κ``.
    diffusion : pytensor shared variable
        The diffusion; its value is set to each stage of the schedule and left at the last one.
    schedule : {"linear", "exponential", "thesis"} or sequence of float
        Decreasing diffusion values (see :func:`tempering_schedule`).
    objective : {"mle", "map"}
    start : dict, optional
        Starting point (constrained values by name).
    early_stopping : bool
        "OURS+": in all but the last stage, stop when the objective changes by less than
        ``early_stop_threshold`` across 3 consecutive iterations.
    maxiter : int
        Maximum iterations per stage.
    progressbar : bool

    Returns
    -------
    TemperingResult
    """
    model = pm.modelcontext(model)
    if not isinstance(diffusion, SharedVariable):
        raise ValueError("diffusion must be a pytensor shared variable used as the Fenrir diffusion")
    values = tempering_schedule(schedule) if isinstance(schedule, str) else np.asarray(schedule, float)
    if values.ndim != 1 or values.size < 1 or np.any(values <= 0) or np.any(np.diff(values) > 0):
        raise ValueError("schedule must be a non-increasing sequence of positive diffusions")
    stages: list[FitResult] = []
    point = dict(start) if start else None
    finite_stage = False
    t0 = time.perf_counter()
    bar = tqdm(values, desc="diffusion tempering", disable=not progressbar)
    for i, kappa in enumerate(bar):
        diffusion.set_value(np.asarray(kappa, dtype=diffusion.dtype))
        last = i == values.size - 1
        result = fit(model, objective=objective, start=point, maxiter=maxiter,
                     early_stop=None if (last or not early_stopping) else early_stop_threshold)
        if np.isfinite(result.objective):
            point, finite_stage = result.point, True
        stages.append(result)
        bar.set_postfix(kappa=f"{kappa:.1e}", objective=f"{result.objective:.2f}")
    final_stage = stages[-1]
    # the last finite stage's estimate; if no stage was finite, the final stage's point
    return TemperingResult.from_point(
        model, point if finite_stage else final_stage.point, objective=final_stage.objective,
        n_iterations=sum(r.n_iterations for r in stages), wall_time=time.perf_counter() - t0,
        converged=final_stage.converged, message=final_stage.message, method="diffusion_tempering",
        objective_name=final_stage.objective_name, n_function_evals=sum(r.n_function_evals for r in stages),
        history=[r.objective for r in stages], schedule=values, stages=stages)
