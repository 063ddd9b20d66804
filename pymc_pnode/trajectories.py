"""Probabilistic numerical trajectories for posterior draws (mean and bands of the state)."""

from __future__ import annotations

import warnings

import numpy as np
import xarray as xr
from tqdm.auto import tqdm

from pymc_pnode.accuracy import AccuracyWarning
from pymc_pnode.filtering.structure import STRUCTURES
from pymc_pnode.ode import ODE
from pymc_pnode.solve import (
    SOLVE_ATOL,
    SOLVE_MAX_STEPS,
    SOLVE_RTOL,
    ODEFilter,
    accuracy_problem,
    solve_without_warnings,
    validate_filter,
)

__all__ = ["posterior_trajectories"]


def _draws(posterior: xr.Dataset, value, name: str, shape: tuple[int, ...], n: int) -> np.ndarray:
    """``value`` per draw, shape ``(n,) + shape``.

    ``value`` is a posterior variable (by name), a constant, or a list mixing names of scalar
    posterior variables and numbers (one per entry of the vector); ``None`` means "no entries".
    """
    if value is None:
        value = np.zeros(0)
    if isinstance(value, (list, tuple)) and any(isinstance(v, str) for v in value):
        if len(value) != int(np.prod(shape)):
            raise ValueError(f"{name} must have {int(np.prod(shape))} entries, got {len(value)}")
        columns = [_draws(posterior, v, f"{name}[{i}]", (), n) for i, v in enumerate(value)]
        return np.stack(columns, axis=-1).reshape((n,) + shape)
    if isinstance(value, str):
        if value not in posterior:
            raise ValueError(f"{name}={value!r} is not a variable of the posterior")
        arr = posterior[value].stack(sample=("chain", "draw")).transpose("sample", ...).values
        if arr[0].size != int(np.prod(shape)):
            raise ValueError(f"{name}={value!r} has {arr[0].size} entries per draw, expected shape {shape}")
        return arr.reshape((arr.shape[0],) + shape)
    arr = np.asarray(value, dtype=np.float64)
    if arr.size != int(np.prod(shape)):
        raise ValueError(f"{name} must have shape {shape}, got {arr.shape}")
    return np.broadcast_to(arr.reshape(shape), (n,) + shape)


def posterior_trajectories(
    idata,
    ode: ODE,
    *,
    y0,
    theta,
    t_span: tuple[float, float],
    diffusion: str | float | None = None,
    solver: ODEFilter | None = None,
    step: float | None = None,
    times=None,
    n_points: int = 200,
    max_draws: int | None = 100,
    rng=None,
    progressbar: bool = True,
    discontinuities=None,
    jumps=None,
) -> xr.Dataset:
    """PN mean and standard deviation of the state on a fine grid, one solve per posterior draw.

    Parameters
    ----------
    idata : arviz.InferenceData
        Result of ``pm.sample`` (uses its ``posterior`` group).
    ode : ODE
    y0, theta : str, array_like, list or None
        The name of a vector posterior variable, a constant used for every draw, or a list with one
        entry per component mixing names of scalar posterior variables and numbers (e.g.
        ``["a", 0.2, "c"]``); ``theta=None`` for an ODE without parameters.
    t_span : tuple of float
        Interval to solve on.
    diffusion : str, float or None
        A posterior variable name, a fixed value, ``"calibrated"`` or ``"local"``; default: that of
        :func:`~pymc_pnode.solve` (local with adaptive steps, global with a fixed ``step``).
    solver : EK0 or EK1, default ``EK1(order=3)``
    step : float, optional
        Fixed step (default: adaptive).
    times : array_like, optional
        Output times (default: ``n_points`` equidistant points in ``t_span``).
    max_draws : int, optional
        Use at most this many randomly chosen draws.
    rng : seed or Generator, optional
    progressbar : bool
    discontinuities : array_like, optional
        Times at which the vector field jumps in ``t``, as in :func:`~pymc_pnode.solve`.
    jumps : str or array_like, optional
        The state's jumps at the ``discontinuities`` (shape ``(len(discontinuities), n_states)``, as in
        :func:`~pymc_pnode.solve`): numbers, or the name of a posterior variable with that many entries per draw
        (a random dose).

    Returns
    -------
    xarray.Dataset
        ``mean`` and ``std`` with dims ``("sample", "time", "state")`` plus ``success`` per draw. Draws whose
        solution misses the tolerances (a fixed step too coarse, or means that fail the quadrature check; see
        :func:`~pymc_pnode.solve`) are counted, and one :class:`~pymc_pnode.AccuracyWarning` says how many.
    """
    post = idata.posterior
    n_total = post.sizes["chain"] * post.sizes["draw"]
    rng = np.random.default_rng(rng)
    pick = np.arange(n_total)
    if max_draws is not None and n_total > max_draws:
        pick = np.sort(rng.choice(n_total, size=max_draws, replace=False))
    y0s = _draws(post, y0, "y0", (ode.n_states,), n_total)[pick]
    thetas = _draws(post, theta, "theta", (ode.n_theta,), n_total)[pick]
    if isinstance(diffusion, str) and diffusion in post:
        kappas = _draws(post, diffusion, "diffusion", (), n_total)[pick]
    else:
        kappas = [diffusion] * pick.size
    jump_draws = [None] * pick.size
    if jumps is not None:
        if discontinuities is None:
            raise ValueError("jumps needs discontinuities=[...]: the times at which the state jumps")
        jump_draws = _draws(post, jumps, "jumps", (np.atleast_1d(discontinuities).size, ode.n_states), n_total)[pick]
    times = np.linspace(*t_span, n_points) if times is None else np.asarray(times, dtype=float)
    solver = validate_filter(solver, STRUCTURES, "posterior_trajectories")
    mean = np.full((pick.size, times.size, ode.n_states), np.nan)
    std = np.full_like(mean, np.nan)
    ok = np.zeros(pick.size, dtype=bool)
    problems = []
    for i in tqdm(range(pick.size), desc="PN trajectories", disable=not progressbar):
        sol = solve_without_warnings(ode, y0s[i], thetas[i], t_span, solver=solver, step=step, save_at=times,
                                     diffusion=kappas[i] if not isinstance(kappas[i], np.ndarray) else float(kappas[i]),
                                     discontinuities=discontinuities, jumps=jump_draws[i], rtol=SOLVE_RTOL,
                                     atol=SOLVE_ATOL, smooth=True, max_steps=SOLVE_MAX_STEPS)
        ok[i] = sol.success
        if sol.success:
            mean[i], std[i] = sol.mean, sol.std
            problems += [problem] if (problem := accuracy_problem(sol, y0s[i], step, SOLVE_RTOL, SOLVE_ATOL)) else []
    if problems:  # one warning for all draws, not one per draw
        warnings.warn(f"pn.posterior_trajectories: the solution misses the tolerances at {len(problems)} of "
                      f"{pick.size} draws; at the first of them, {problems[0]}", AccuracyWarning, stacklevel=2)
    coords = {"sample": pick, "time": times, "state": np.arange(ode.n_states)}
    return xr.Dataset(
        {
            "mean": (("sample", "time", "state"), mean),
            "std": (("sample", "time", "state"), std),
            "success": (("sample",), ok),
        },
        coords=coords,
    )
