"""``solve``: probabilistic numerical solution of an ODE initial value problem with an ODE filter."""

from __future__ import annotations

import math
import warnings
from collections import namedtuple
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import ClassVar

import numpy as np

from pymc_pnode._jit import readonly
from pymc_pnode.accuracy import AccuracyWarning, suggested_step, unresolved_start
from pymc_pnode.discontinuities import declared_restarts, restart_state, segment_of, split_times
from pymc_pnode.filtering.calibration import global_kappa, quadrature_defect
from pymc_pnode.filtering.odefilter import (
    DIFFUSION_FIXED,
    DIFFUSION_GLOBAL,
    DIFFUSION_LOCAL,
    Diffusion,
    ForwardRun,
    ForwardStats,
    allocate_run,
    run_block_filter,
    run_filter,
)
from pymc_pnode.filtering.smoother import BackwardKernel, interpolate, sample_backward, smooth
from pymc_pnode.filtering.stepping import (
    STATUS_MESSAGES,
    STATUS_NONFINITE,
    STATUS_SUCCESS,
    Stepping,
    initial_step_size,
)
from pymc_pnode.filtering.structure import DENSE, DIAGONAL, ISOTROPIC, STRUCTURES, initial_root
from pymc_pnode.filtering.tangents import SmoothedRun, StepTangents, smoothing_tangents, stored_run
from pymc_pnode.filtering.update import VectorField
from pymc_pnode.ode import ODE
from pymc_pnode.priors import IWP
from pymc_pnode.validation import (
    as_positive_int,
    validate_step,
    validate_t_span,
    validate_times,
)

__all__ = ["EK0", "EK1", "ODEFilter", "PiecewiseSolution", "ProbabilisticSolution", "solve", "validate_filter",
           "validate_ode"]

# Defaults of pn.solve (also of pn.posterior_trajectories, which solves once per draw).
SOLVE_RTOL, SOLVE_ATOL, SOLVE_MAX_STEPS = 1e-6, 1e-9, 100_000


# One independent group of states of a solve: the states, their filter run and their smoothing posterior.
SmoothingGroup = namedtuple("SmoothingGroup", ["states", "run", "smoothed"])


@lru_cache(maxsize=None)
def _iwp(order: int) -> IWP:
    # The exact rational factorisation of Q̄ costs milliseconds: build each order once.
    return IWP(order)


@dataclass(frozen=True)
class ODEFilter:
    """An extended Kalman ODE filter with the IWP(``order``) prior: :class:`EK0` or :class:`EK1`.

    ``structure`` selects the state-space model's covariance (:mod:`pymc_pnode.filtering.structure`):
    ``"dense"`` (the default), ``"diagonal"`` (one ``(q+1) × (q+1)`` block per state; cost linear in the
    number of states) or, for the EK0, ``"isotropic"`` (one block shared by all states).
    """

    order: int = 3
    structure: str = DENSE
    ek1: bool = field(default=True, init=False, repr=False)
    structures: ClassVar[tuple[str, ...]] = STRUCTURES

    def __post_init__(self):
        IWP(self.order)  # validates the order with a clear ValueError
        if self.structure not in self.structures:
            hint = (" (an isotropic covariance needs the EK0's zero linearisation: use "
                    f"EK1({self.order}, structure='diagonal') or EK0({self.order}, structure='isotropic'))"
                    if self.structure == ISOTROPIC else "")
            raise ValueError(f"structure must be one of {self.structures} for {type(self).__name__}, "
                             f"got {self.structure!r}{hint}")

    @property
    def prior(self) -> IWP:
        return _iwp(self.order)


@dataclass(frozen=True)
class EK1(ODEFilter):
    """First-order extended Kalman ODE filter (linearises with the Jacobian of the vector field).

    Semi-implicit and A-stable; the default solver. ``order`` is the number ``q`` of derivatives
    of the IWP(q) prior. ``structure="diagonal"`` linearises with the diagonal of the Jacobian only and
    keeps one covariance block per state (Krämer, Bosch, Schmidt & Hennig, 2022): its cost grows
    linearly with the number of states, at the price of ignoring the Jacobian's couplings in the
    covariances (the means still see the full vector field).
    """

    ek1: bool = field(default=True, init=False, repr=False)
    structures: ClassVar[tuple[str, ...]] = (DENSE, DIAGONAL)


@dataclass(frozen=True)
class EK0(ODEFilter):
    """Zeroth-order extended Kalman ODE filter (no Jacobian; explicit, not A-stable).

    Its stability interval shrinks quickly with the order: with fixed steps prefer ``order <= 3``
    or small steps (``y' = -y`` with ``order=5`` diverges at step 0.05), or use :class:`EK1`.
    ``structure="isotropic"`` keeps one covariance block shared by all states (``Σ = P ⊗ I_d``; Krämer
    et al., 2022), exactly the dense EK0's covariance at a cost linear in the number of states.
    """

    ek1: bool = field(default=False, init=False, repr=False)


def validate_filter(solver, structures: tuple[str, ...] = (DENSE,), user: str = "this function") -> ODEFilter:
    """``solver``, or the default ``EK1(order=3)`` for None; a ``ValueError`` unless it is an EK0 or EK1 whose
    structure is one of ``structures`` (those that ``user`` supports)."""
    solver = EK1(order=3) if solver is None else solver
    if not isinstance(solver, ODEFilter):
        raise ValueError(f"solver must be EK0(...) or EK1(...), got {solver!r}")
    if solver.structure not in structures:
        raise ValueError(f"solver: {user} supports the structures {structures}, got {solver!r}; "
                         f"use {type(solver).__name__}({solver.order}) (dense)")
    return solver


def validate_ode(ode) -> ODE:
    """``ode`` when it is a :class:`pymc_pnode.ODE`; a ``ValueError`` otherwise."""
    if not isinstance(ode, ODE):
        raise ValueError(f"ode must be a pymc_pnode.ODE, got {type(ode).__name__}")
    return ode


_DIFFUSIONS = {
    "calibrated": DIFFUSION_GLOBAL,
    "global": DIFFUSION_GLOBAL,
    "local": DIFFUSION_LOCAL,
    "time_varying": DIFFUSION_LOCAL,
    "dynamic": DIFFUSION_LOCAL,
}


# The ``diffusion`` argument of :func:`solve` that selects each calibrated mode (for callers that hold a mode).
DIFFUSION_ARGUMENTS = {DIFFUSION_LOCAL: "local", DIFFUSION_GLOBAL: "calibrated"}


def solve_diffusion_mode(diffusion, adaptive: bool) -> tuple[int, float]:
    """``(mode, κ)`` of ``pn.solve``'s ``diffusion``; ``None`` is local with adaptive steps, global with a fixed one."""
    if diffusion is None:
        return (DIFFUSION_LOCAL if adaptive else DIFFUSION_GLOBAL), 1.0
    if isinstance(diffusion, str) and diffusion in _DIFFUSIONS:
        return _DIFFUSIONS[diffusion], 1.0
    try:  # a number; not a flag, a name we do not know or an object that is no number
        value = None if isinstance(diffusion, (str, bool, np.bool_)) else float(diffusion)
    except (TypeError, ValueError):
        value = None
    if value is None:
        raise ValueError(f"diffusion must be a positive number or one of {sorted(_DIFFUSIONS)}, got {diffusion!r}")
    if not (value > 0.0 and math.isfinite(value)):
        raise ValueError(f"diffusion must be positive and finite, got {diffusion!r}")
    return DIFFUSION_FIXED, value


def fixed_grid(stops: np.ndarray, step: float) -> np.ndarray:
    """Grid with steps of at most ``step`` that contains every entry of ``stops`` exactly."""
    pieces = [stops[:1]]
    for a, b in zip(stops[:-1], stops[1:]):
        n = max(1, math.ceil((b - a) / step - 1e-9))
        inner = a + (b - a) * np.arange(1, n + 1) / n
        inner[-1] = b
        pieces.append(inner)
    return np.concatenate(pieces)


class ProbabilisticSolution:
    """Gaussian posterior of an ODE solution computed by an ODE filter.

    Attributes
    ----------
    t : ndarray, shape (T,)
        Output times.
    mean : ndarray, shape (T, d)
        Posterior mean of the solution at ``t``.
    cov : ndarray, shape (T, d, d)
        Posterior covariance at ``t``.
    std : ndarray, shape (T, d)
        Posterior standard deviations.
    stats : dict
        ``n_steps`` (accepted), ``n_rejected``, ``n_f_evals``, ``success``, ``status``,
        ``message``, ``t_final`` (the last time reached), the calibrated ``diffusion`` (the mean over the steps for
        the local one), ``max_error``, the largest scaled local error estimate of a step (1 = at the tolerances),
        and ``max_defect``, the largest scaled disagreement of the means with their own derivatives over a step
        (:func:`~pymc_pnode.filtering.calibration.quadrature_defect`; 1 = at the tolerances), and
        ``n_at_equilibrium``, the steps whose ODE residual and derivative were exactly zero (the solution at an
        equilibrium of the field: there neither the step size nor a local diffusion has information, see
        :func:`~pymc_pnode.filtering.calibration.at_equilibrium`).
    run : ForwardRun
        The filter on its grid (:data:`pymc_pnode.filtering.odefilter.ForwardRun`): ``grid``, filter means
        ``mu`` and right square roots ``r`` of the covariances (``(N, D, D)``, or ``(N, n_blocks, q+1, q+1)`` for
        the ``"diagonal"`` and ``"isotropic"`` structures), and the diffusion ``kappa`` of each step.
    out_index : ndarray
        The grid indices of the output times ``t``.
    """

    def __init__(self, ode: ODE, theta: np.ndarray, solver: ODEFilter, run: ForwardRun, out_index: np.ndarray,
                 stats: dict, smoothed: bool):
        self.ode = ode
        self.theta = theta
        self.solver = solver
        self.stats = stats
        self.run = run
        self.out_index = out_index
        self._smoothed_wanted = smoothed
        self.t = run.grid[out_index]

    @property
    def success(self) -> bool:
        """Whether the solve reached the end of the time span."""
        return bool(self.stats["success"])

    @cached_property
    def _groups(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The run as independent groups of states ``(states, means, roots)``, each a dense filter of its own:
        all states together (dense), or one state per block (block-diagonal and isotropic: the states
        are independent given the means, :mod:`pymc_pnode.filtering.structure`)."""
        run, d = self.run, self.ode.n_states
        if run.r.ndim == 3:
            return [(np.arange(d), run.mu, run.r)]
        n_blocks = run.r.shape[1]
        return [(np.array([i]), np.ascontiguousarray(run.mu[:, i::d]),
                 np.ascontiguousarray(run.r[:, i if n_blocks > 1 else 0])) for i in range(d)]

    @cached_property
    def _smoothing(self) -> list:
        q = self.solver.order
        rq = self.solver.prior.Q_bar_sqrt
        grid, kappa = self.run.grid, self.run.kappa
        out = []
        for states, mus, rs in self._groups:
            if grid.size < 2:
                empty = np.zeros_like(rs)
                out.append((mus, rs, BackwardKernel(empty, np.zeros_like(mus), empty)))
            else:
                out.append(smooth(grid, mus, rs, kappa, q, states.size, rq))
        return out

    def _group_states(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``(states, means, roots)`` of each group at the output times (smoothed or filtered)."""
        idx = self.out_index
        if self._smoothed_wanted:
            return [(states, smoothed[0][idx], smoothed[1][idx])
                    for (states, _, _), smoothed in zip(self._groups, self._smoothing)]
        return [(states, mus[idx], rs[idx]) for states, mus, rs in self._groups]

    @cached_property
    def state_mean(self) -> np.ndarray:
        """Posterior mean of ``(y, y', ..., y^(q))`` at ``t``, shape ``(T, q+1, d)``."""
        q1 = self.solver.order + 1
        out = np.empty((self.t.size, q1, self.ode.n_states))
        for states, mus, _ in self._group_states():
            out[:, :, states] = mus.reshape(mus.shape[0], q1, states.size)
        return out

    @cached_property
    def mean(self) -> np.ndarray:
        return np.ascontiguousarray(self.state_mean[:, 0, :])

    @cached_property
    def cov(self) -> np.ndarray:
        d = self.ode.n_states
        out = np.zeros((self.t.size, d, d))
        for states, _, rs in self._group_states():
            r0 = rs[:, :, : states.size]
            out[:, states[:, None], states[None, :]] = np.einsum("nki,nkj->nij", r0, r0)
        return out

    @cached_property
    def std(self) -> np.ndarray:
        return np.sqrt(np.clip(np.einsum("nii->ni", self.cov), 0.0, None))

    def _smoothing_groups(self) -> list[SmoothingGroup]:
        """The groups of :attr:`_groups` with their filter runs and smoothing posteriors on the whole grid, as the
        kernels of :mod:`~pymc_pnode.filtering.tangents` read them."""
        grid, kappa = self.run.grid, self.run.kappa
        return [SmoothingGroup(states, stored_run(grid, mus, rs, kappa, self.out_index),
                               SmoothedRun(readonly(mus_s), readonly(rs_s)))
                for (states, mus, rs), (mus_s, rs_s, _) in zip(self._groups, self._smoothing)]

    def smoothing_tangents(
        self, steps: StepTangents | None = None, joint: bool = True
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:func:`~pymc_pnode.filtering.tangents.smoothing_tangents` for the whole solve, group by group.

        ``steps`` are the filter's tangents at every grid point (``dsig`` in the shape of the run's roots);
        ``None`` for none. Returns ``(dmean, dvar, cov, dcov)`` assembled over the states: ``(T, d, P)``,
        ``(T, d, P)``, and if ``joint`` the covariance across times ``(T, d, T, d)`` and its tangents
        ``(T, d, T, d, P)`` (else empty).
        """
        d, n_out, q1 = self.ode.n_states, self.t.size, self.solver.order + 1
        n_pts, dd = self.run.mu.shape
        if steps is None:
            steps = StepTangents(np.zeros((n_pts, dd, 0)), np.zeros((n_pts, 0) + self.run.r.shape[1:]),
                                 np.zeros((n_pts, 0)))
        n_dir, n_joint = steps.dmu.shape[2], (n_out if joint else 0)
        dmean, dvar = np.zeros((n_out, d, n_dir)), np.zeros((n_out, d, n_dir))
        cov, dcov = np.zeros((n_joint, d, n_joint, d)), np.zeros((n_joint, d, n_joint, d, n_dir))
        if self.run.grid.size < 2:
            return dmean, dvar, cov, dcov
        rq = readonly(self.solver.prior.Q_bar_sqrt)
        for group in self._smoothing_groups():
            states = group.states
            group_steps = steps
            if self.run.r.ndim == 4:  # one state per group: its rows of the means, its block (or the shared one)
                rows = np.arange(q1) * d + states[0]
                block = states[0] if self.run.r.shape[1] > 1 else 0
                group_steps = StepTangents(np.ascontiguousarray(steps.dmu[:, rows]),
                                           np.ascontiguousarray(steps.dsig[:, :, block]), steps.dkappa)
            g_mean, g_var, g_cov, g_dcov = smoothing_tangents(group.run, group.smoothed, group_steps, rq, joint)
            dmean[:, states], dvar[:, states] = g_mean, g_var
            if joint:
                every = np.arange(n_out)
                block_of_states = np.ix_(every, states, every, states)
                cov[block_of_states], dcov[block_of_states] = g_cov, g_dcov
        return dmean, dvar, cov, dcov

    def joint_cov(self) -> np.ndarray:
        """Covariance of the solution across the output times, shape ``(T, d, T, d)``.

        ``joint_cov()[a, :, b, :] = Cov(y(t_a), y(t_b))`` under the smoothing posterior, the joint Gauss–Markov
        distribution of the solution that :meth:`sample` draws from (its diagonal blocks are :attr:`cov` of a
        smoothed solve). Computed through the backward kernels, ``Cov(x_n, x_m) = G_{n+1} Cov(x_{n+1}, x_m)``.
        """
        return self.smoothing_tangents()[2]

    def sample(self, n: int = 1, rng=None) -> np.ndarray:
        """Joint samples of the solution trajectory at ``t``, shape ``(n, T, d)``.

        Samples are drawn from the full Gauss–Markov posterior (backward kernels), so they are
        correlated in time, not independent marginal draws.
        """
        if int(n) != n or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        rng = np.random.default_rng(rng)
        out = np.empty((int(n), self.t.size, self.ode.n_states))
        for (states, mus, rs), (_, _, kernels) in zip(self._groups, self._smoothing):
            z = rng.standard_normal((int(n),) + mus.shape)
            draws = sample_backward(mus[-1], rs[-1], kernels, z)
            out[:, :, states] = draws[:, self.out_index, : states.size]
        return out

    def interpolate(self, times) -> tuple[np.ndarray, np.ndarray]:
        """Dense output: smoothed mean ``(T', d)`` and covariance ``(T', d, d)`` at any ``times``."""
        run = self.run
        times = validate_times(times, "times", span=(run.grid[0], run.grid[-1]))
        q, d = self.solver.order, self.ode.n_states
        rq = self.solver.prior.Q_bar_sqrt
        mean = np.empty((times.size, d))
        cov = np.zeros((times.size, d, d))
        for (states, mus, rs), smoothed in zip(self._groups, self._smoothing):
            dd = mus.shape[1]
            mu, r = np.empty(dd), np.empty((dd, dd))
            block = np.ix_(states, states)
            for i, t in enumerate(times):
                interpolate(t, run.grid, mus, rs, run.kappa, smoothed[:2], rq, q, states.size, (mu, r))
                mean[i, states] = mu[: states.size]
                cov[i][block] = r[:, : states.size].T @ r[:, : states.size]
        return mean, cov

    def to_xarray(self):
        """The solution as an :class:`xarray.Dataset` with ``mean``, ``std`` and ``cov``."""
        return _as_dataset(self)

    def __repr__(self) -> str:
        s = self.stats
        return (
            f"ProbabilisticSolution({self.solver!r}, T={self.t.size}, steps={s['n_steps']}, "
            f"rejected={s['n_rejected']}, success={s['success']})"
        )


def _as_dataset(solution):
    """A solution's ``mean``, ``std`` and ``cov`` at its times as an :class:`xarray.Dataset`; ``stats`` in attrs."""
    import xarray as xr

    d = solution.ode.n_states
    coords = {"time": solution.t, "state": np.arange(d), "state_": np.arange(d)}
    attrs = {k: (int(v) if isinstance(v, (bool, np.bool_)) else v) for k, v in solution.stats.items()}
    attrs["solver"] = repr(solution.solver)
    return xr.Dataset(
        {
            "mean": (("time", "state"), solution.mean),
            "std": (("time", "state"), solution.std),
            "cov": (("time", "state", "state_"), solution.cov),
        },
        coords=coords,
        attrs=attrs,
    )


class PiecewiseSolution:
    """An ODE filter's solution restarted at declared jumps of the vector field in ``t``
    (:mod:`pymc_pnode.discontinuities`): one :class:`ProbabilisticSolution` per segment.

    Each segment starts from the mean where the previous one ended (plus the state's declared jump there, if any),
    with zero covariance, so the segments are independent: samples are joint within a segment, and
    :meth:`joint_cov` is block-diagonal over the segments.

    Attributes
    ----------
    t, mean, cov, std, state_mean
        As in :class:`ProbabilisticSolution`, over all segments (an output time at a jump is solved just before it).
    stats : dict
        Sums of ``n_steps``, ``n_rejected``, ``n_f_evals`` and ``n_at_equilibrium``; ``success``, ``status`` and
        ``message`` of the first segment that failed (a failed segment ends the solve); ``t_final``; ``diffusion``:
        one per segment; ``max_error`` and ``max_defect``: the largest over the segments.
    pieces : list of tuple
        ``(solution, outputs)`` per segment solved: its :class:`ProbabilisticSolution` and the indices of its
        outputs that are outputs of the whole solve.
    """

    def __init__(self, ode: ODE, solver: "ODEFilter", discontinuities: np.ndarray, t: np.ndarray, pieces: list,
                 complete: bool):
        self.ode = ode
        self.solver = solver
        self.discontinuities = discontinuities
        self.t = t
        self.pieces = pieces
        sols = [sol for sol, _ in pieces]
        failed = next((sol for sol in sols if not sol.success), None)
        summed = ("n_steps", "n_rejected", "n_f_evals", "n_at_equilibrium")
        self.stats = {key: int(sum(sol.stats[key] for sol in sols)) for key in summed}
        self.stats.update({
            "status": int(STATUS_SUCCESS if failed is None else failed.stats["status"]),
            "success": failed is None and complete,
            "message": STATUS_MESSAGES[STATUS_SUCCESS] if failed is None else failed.stats["message"],
            "diffusion": tuple(float(sol.stats["diffusion"]) for sol in sols),
            "t_final": float(sols[-1].stats["t_final"]),
            "max_error": max(float(sol.stats["max_error"]) for sol in sols),
            "max_defect": max(float(sol.stats["max_defect"]) for sol in sols),
        })

    @property
    def success(self) -> bool:
        """Whether the solve reached the end of the time span."""
        return bool(self.stats["success"])

    def _joined(self, name: str) -> np.ndarray:
        return np.concatenate([getattr(sol, name)[outputs] for sol, outputs in self.pieces])

    @cached_property
    def state_mean(self) -> np.ndarray:
        return self._joined("state_mean")

    @cached_property
    def mean(self) -> np.ndarray:
        return self._joined("mean")

    @cached_property
    def cov(self) -> np.ndarray:
        return self._joined("cov")

    @cached_property
    def std(self) -> np.ndarray:
        return self._joined("std")

    def joint_cov(self) -> np.ndarray:
        """Covariance across the output times, ``(T, d, T, d)``: each segment's block, zero between segments."""
        d, n_out = self.ode.n_states, self.t.size
        out = np.zeros((n_out, d, n_out, d))
        first = 0
        for sol, outputs in self.pieces:
            block = slice(first, first + outputs.size)
            out[block, :, block, :] = sol.joint_cov()[np.ix_(outputs, np.arange(d), outputs, np.arange(d))]
            first += outputs.size
        return out

    def sample(self, n: int = 1, rng=None) -> np.ndarray:
        """Samples of the solution at ``t``, shape ``(n, T, d)``: joint within each segment, independent between."""
        rng = np.random.default_rng(rng)
        return np.concatenate([sol.sample(n, rng=rng)[:, outputs] for sol, outputs in self.pieces], axis=1)

    def interpolate(self, times) -> tuple[np.ndarray, np.ndarray]:
        """Dense output (smoothed mean and covariance) at any ``times`` in the segments solved."""
        times = validate_times(times, "times", span=(self.pieces[0][0].run.grid[0], self.pieces[-1][0].run.grid[-1]))
        which = segment_of(times, self.discontinuities)
        mean, cov = np.empty((times.size, self.ode.n_states)), np.empty((times.size, self.ode.n_states,
                                                                          self.ode.n_states))
        for s, (sol, _) in enumerate(self.pieces):
            rows = np.flatnonzero(which == s)
            if rows.size:
                grid = sol.run.grid
                mean[rows], cov[rows] = sol.interpolate(np.clip(times[rows], grid[0], grid[-1]))
        return mean, cov

    def to_xarray(self):
        """The solution as an :class:`xarray.Dataset` with ``mean``, ``std`` and ``cov``."""
        return _as_dataset(self)

    def __repr__(self) -> str:
        s = self.stats
        return (f"PiecewiseSolution({self.solver!r}, segments={len(self.pieces)}, T={self.t.size}, "
                f"steps={s['n_steps']}, rejected={s['n_rejected']}, success={s['success']})")


def _solve_piecewise(ode: ODE, y0: np.ndarray, theta: np.ndarray, t_span: tuple[float, float],
                     discontinuities: np.ndarray, jumps: np.ndarray | None, save_at: np.ndarray | None,
                     options: dict) -> PiecewiseSolution:
    """:func:`solve` segment by segment between the ``discontinuities``, each from the mean where the last ended
    plus the state's jump there (row ``s`` of ``jumps`` before segment ``s + 1``; none without ``jumps``)."""
    pieces, times, y_start = [], [], y0
    bounds = split_times(*t_span, discontinuities, np.empty(0) if save_at is None else save_at)
    for s, (start, end, rows, at) in enumerate(bounds):
        step = options["step"] if options["step"] is None else min(options["step"], end - start)
        if save_at is None:  # every step
            sol = solve_without_warnings(ode, y_start, theta, (start, end), **{**options, "step": step})
            last = s == len(bounds) - 1 or not sol.success  # else the next segment starts where this one ends
            outputs = np.arange(sol.t.size if last else sol.t.size - 1)
            times.append(sol.t[outputs])
        else:
            sol = solve_without_warnings(ode, y_start, theta, (start, end), **{**options, "step": step},
                                         save_at=np.union1d(at, [end]))
            outputs = np.flatnonzero(np.isin(sol.t, at))
            times.append(save_at[rows][: outputs.size])
        pieces.append((sol, outputs))
        if not sol.success:
            break
        y_start = restart_state(np.asarray(sol.mean[-1]), jumps, s)
    return PiecewiseSolution(ode, options["solver"], discontinuities, np.concatenate(times), pieces,
                             len(pieces) == len(bounds))


def solve(
    ode: ODE,
    y0,
    theta,
    t_span,
    *,
    solver: ODEFilter | None = None,
    step: float | None = None,
    rtol: float = SOLVE_RTOL,
    atol: float = SOLVE_ATOL,
    save_at=None,
    diffusion: str | float | None = None,
    smooth: bool = True,
    max_steps: int = SOLVE_MAX_STEPS,
    discontinuities=None,
    jumps=None,
) -> ProbabilisticSolution | PiecewiseSolution:
    """Solve an ODE initial value problem with a square-root ODE filter.

    Parameters
    ----------
    ode : ODE
        The differential equation.
    y0 : array_like, shape (d,)
        Initial state at ``t_span[0]``.
    theta : array_like, shape (n_theta,)
        Parameters.
    t_span : tuple of float
        ``(t0, t1)`` with ``t1 > t0``.
    solver : EK0 or EK1, default ``EK1(order=3)``
        The ODE filter, the order ``q`` of its IWP prior and its state-space ``structure`` (``"dense"``,
        ``"diagonal"``, or for the EK0 ``"isotropic"``: cost linear in the number of states).
    step : float, optional
        Fixed step size (the grid is refined to pass exactly through every ``save_at`` time).
        ``None`` selects adaptive steps controlled by ``rtol`` and ``atol``.
    rtol, atol : float
        Tolerances of the adaptive step-size control.
    save_at : array_like, optional
        Output times (strictly increasing, inside ``t_span``); the solver steps exactly through
        them. Default: every solver step.
    diffusion : {"calibrated", "local"}, float or None
        ``"calibrated"`` (global scalar quasi-MLE, post-hoc rescaling), ``"local"`` (time-varying
        scalar estimate per step) or a fixed positive value multiplying the prior's ``Q(h)``. Default:
        ``"local"`` with adaptive steps, ``"calibrated"`` with a fixed ``step``, the pairing recommended by
        Bosch, Hennig & Tronarp (2021, §6.2) and Bosch (2024, thesis §6.3). With adaptive steps the global
        scalar can be confidently wrong: on Van der Pol (μ = 5) at rtol 1e-3 its mean is off by 1.4 with errors
        up to 125 standard deviations, where the local diffusion's are within 0.6 (``benchmarks/solve_calibration.py``).
    smooth : bool, default True
        Return the smoothing posterior (conditioned on all steps) instead of the filter marginals.
    max_steps : int
        Maximum number of accepted steps for adaptive solves.
    discontinuities : array_like, optional
        Times at which the vector field jumps in ``t`` (a switched input, a dose): the filter ends a segment just
        before each and restarts just after it from the mean solution there (:mod:`pymc_pnode.discontinuities`);
        the result is then a :class:`PiecewiseSolution`. Without them an adaptive solve stops at such a jump
        (``STATUS_JUMP_IN_T``). Times outside ``(t0, t1)`` are ignored.
    jumps : array_like, shape (len(discontinuities), n_states), optional
        Jumps of the state at the ``discontinuities`` (a bolus dose, a harvest): row ``j`` is added to the mean
        where the segment before ``discontinuities[j]`` ended, ``y(t_j⁺) = y(t_j⁻) + jumps[j]``; a state that does
        not jump has a zero column. The times must then be strictly increasing and after ``t0``; an output at a
        jump time is the state just before the jump (:func:`pymc_pnode.discontinuities.declared_restarts`).

    Returns
    -------
    ProbabilisticSolution
        Never raises on a diverging solve: failures are reported in ``stats`` (``success``,
        ``status``, ``message``, ``t_final``) and the solution covers the interval solved so far.
        ``stats["max_error"]`` is the largest scaled local error estimate of an accepted step (1 = at the
        tolerances). A fixed step is checked against ``rtol``/``atol`` too: where it misses them an
        :class:`~pymc_pnode.AccuracyWarning` says so and suggests a step (on Van der Pol, μ = 5, the fixed step
        0.05 gives a mean off by 2.6 with errors of 50 standard deviations; ``benchmarks/solve_calibration.py``).
        With either kind of step the filtered means are also checked against their own derivatives
        (``stats["max_defect"]``, the quadrature check of ``docs/fenrir.md``); where they disagree by more than the
        tolerances an :class:`~pymc_pnode.AccuracyWarning` says so (e.g. ``diffusion="calibrated"`` with
        error-controlled steps, whose means move against their derivatives on SIR, FitzHugh–Nagumo and Van der
        Pol: ``benchmarks/known_failures.py``).
        Adaptive solves fail when the step size collapses or ``max_steps`` is reached; fixed-step
        solves fail at the first step whose predictor–corrector difference or integrated residual
        is as large as the solution itself
        (:func:`~pymc_pnode.filtering.stepping.fixed_step_failed`; one extra evaluation of ``f``
        per step). Both fail on non-finite values.

    Raises
    ------
    ValueError
        For invalid arguments (shapes, times, step, tolerances, order, diffusion).
    """
    sol = solve_without_warnings(ode, y0, theta, t_span, solver=solver, step=step, rtol=rtol, atol=atol,
                                 save_at=save_at, diffusion=diffusion, smooth=smooth, max_steps=max_steps,
                                 discontinuities=discontinuities, jumps=jumps)
    problem = accuracy_problem(sol, y0, step, rtol, atol)
    if problem:
        warnings.warn(f"pn.solve: {problem}", AccuracyWarning, stacklevel=2)
    return sol


def stop_reason(sol: ProbabilisticSolution | PiecewiseSolution) -> str:
    """Why a failed solve stopped, and where (for diagnostics and warnings)."""
    return f"{sol.stats['message']}, at t = {sol.stats['t_final']:.6g}"


def accuracy_problem(sol: ProbabilisticSolution | PiecewiseSolution, y0, step: float | None, rtol: float,
                     atol: float) -> str:
    """What is wrong with the accuracy of a successful solve from ``y0`` (empty if nothing): a fixed step that misses
    the tolerances (its local error estimates), means that disagree with their own derivatives (the quadrature
    check, :func:`~pymc_pnode.filtering.calibration.quadrature_defect`), or error control whose ``atol`` does not
    resolve a nonzero entry of ``y0`` (:func:`~pymc_pnode.accuracy.unresolved_start`)."""
    if not sol.success:
        return ""
    suggestion = None if step is None else suggested_step(step, sol.stats["max_error"], sol.solver.order)
    if suggestion is not None:
        return (f"the fixed step {step:g} misses the tolerances rtol={rtol:g}, atol={atol:g} (largest scaled local "
                f"error estimate {sol.stats['max_error']:.3g}; 1 = at tolerance): the mean can be far from the "
                f"solution and its standard deviations too small. Use step={suggestion:.3g} or smaller, or step=None "
                f"for error-controlled steps.")
    if sol.stats["max_defect"] > 1.0:
        return (f"the filtered means disagree with their own derivatives by up to {sol.stats['max_defect']:.3g} × the "
                f"tolerances rtol={rtol:g}, atol={atol:g} over a step (the quadrature check, docs/fenrir.md), which "
                f"the step's error estimate does not see: the mean can be far from the solution. Use smaller rtol "
                f"and atol, the local diffusion, or a finer fixed step.")
    if step is None and unresolved_start(np.asarray(y0, dtype=float), atol) > 1.0:
        return (f"y0 has a nonzero entry below atol={atol:g} ({np.asarray(y0)!r}): error control does not resolve "
                f"that state, and if it grows the mean can be far from the solution without any error estimate "
                f"seeing it (docs/fenrir.md, 'The quadrature check'). Use an atol below it, or 0 for a state that "
                f"should be zero.")
    return ""


def solve_without_warnings(ode: ODE, y0, theta, t_span, *, solver: ODEFilter | None, step: float | None, rtol: float,
                           atol: float, diffusion: str | float | None, smooth: bool, max_steps: int, save_at=None,
                           discontinuities=None, jumps=None) -> ProbabilisticSolution | PiecewiseSolution:
    """:func:`solve` without its fixed-step warning (for callers that count and report accuracy themselves); the
    settings without defaults, which are :func:`solve`'s."""
    ode = validate_ode(ode)
    solver = validate_filter(solver, STRUCTURES, "pn.solve")
    y0 = ode.validate_y0(y0)
    theta = ode.validate_theta(theta)
    t0, t1 = validate_t_span(t_span)
    adaptive = step is None
    mode, kappa = solve_diffusion_mode(diffusion, adaptive)
    if not adaptive:
        step = validate_step(step, t1 - t0)
    if not (rtol > 0 and atol > 0):  # a fixed step is checked against them too
        raise ValueError(f"rtol and atol must be positive, got rtol={rtol!r}, atol={atol!r}")
    max_steps = as_positive_int(max_steps, "max_steps")
    stops = np.array([t0, t1])
    if save_at is not None:
        save = validate_times(save_at, "save_at", span=(t0, t1))
        stops = np.union1d(stops, save)
    disc, jumps = declared_restarts(discontinuities, jumps, t0, t1, ode.n_states, symbolic=False)
    if disc.size:
        options = dict(solver=solver, step=step, rtol=rtol, atol=atol, diffusion=diffusion, smooth=smooth,
                       max_steps=max_steps)
        return _solve_piecewise(ode, y0, theta, (t0, t1), disc, jumps, None if save_at is None else save, options)
    grid = fixed_grid(stops, step) if not adaptive else stops

    q, d = solver.order, ode.n_states
    prior = solver.prior
    taylor = ode.taylor_coefficients(q)
    coeffs = np.empty((q + 1, d))
    taylor(y0, t0, theta, coeffs)
    mu0 = coeffs.reshape(-1).copy()
    r0 = initial_root(solver.structure, q, d)
    if not np.all(np.isfinite(mu0)):
        run = allocate_run(1, q, d, False, r0, 0)
        run.grid[0], run.mu[0], run.r[0], run.kappa[0] = t0, mu0, 0.0, 0.0
        counts = ForwardStats(0, 0, 0, STATUS_NONFINITE, 0.0, 0.0, 0)
    else:
        h0 = initial_step_size(ode.rhs.address, y0, t0, theta, float(rtol), float(atol)) if adaptive else 0.0
        stepping = Stepping(adaptive, min(h0, t1 - t0), float(rtol), float(atol), max_steps, True)
        kernel = run_filter if solver.structure == DENSE else run_block_filter
        scale = ode.term_scale_addresses(not solver.ek1 and mode == DIFFUSION_LOCAL)[0]
        vector_field = VectorField(ode.rhs.address, ode.jac_y.address, scale, theta, solver.ek1)
        run, counts = kernel(vector_field, mu0, r0, prior.Q_bar_sqrt, Diffusion(mode, kappa), stepping, grid)
    sigma2 = kappa
    if mode == DIFFUSION_GLOBAL:
        sigma2 = global_kappa(counts.stat_sum, counts.n_steps, d)
        run = run._replace(r=run.r * math.sqrt(sigma2), kappa=np.full_like(run.kappa, sigma2))
    elif mode == DIFFUSION_LOCAL:
        sigma2 = float(np.mean(run.kappa[1:])) if run.kappa.size > 1 else 1.0
    # Outputs: every step, or the requested times (always on the grid: the solver steps through them).
    out_index = np.arange(run.grid.size) if save_at is None else np.nonzero(np.isin(run.grid, save))[0]
    stats = {
        "n_steps": int(counts.n_steps),
        "n_rejected": int(counts.n_rejected),
        "n_f_evals": int(counts.n_f_evals),
        "status": int(counts.status),
        "success": counts.status == STATUS_SUCCESS,
        "message": STATUS_MESSAGES[int(counts.status)],
        "diffusion": float(sigma2),
        "t_final": float(run.grid[-1]),
        "max_error": float(counts.max_error),
        "n_at_equilibrium": int(counts.n_at_equilibrium),
        "max_defect": float(quadrature_defect(run.grid, run.mu, q, d, float(rtol), float(atol))),
    }
    return ProbabilisticSolution(ode, theta, solver, run, out_index, stats, smooth)
