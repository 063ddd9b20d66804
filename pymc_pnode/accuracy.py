"""Accuracy bookkeeping of ODE-filter likelihoods: counts per evaluation and :class:`AccuracyWarning`.

A likelihood evaluated with a fixed step is only as accurate as the step is fine for the parameter
values the sampler visits. Every evaluation computes the filter's own local error estimate
(:func:`pymc_pnode.filtering.calibration.local_error`); :class:`SolverDiagnostics` counts what happened
and warns, once per likelihood and process, when the step is too coarse.

Derivatives computed through covariance congruences can be rounding noise where the filter's gain is huge
(near unstable invariant sets): :func:`needs_rounding_check` and :func:`reproducible` decide when such
derivatives are refused, which is counted and warned about with either kind of step. Derivatives computed at a
solution that sits exactly at an equilibrium of the vector field, where error control and the local diffusion have
no information, are counted and warned about too (``n_equilibrium_gradient``).

Counts made in other processes (the chains of ``pm.sample(cores>1)``) reach the process that built the
model through small spool files: a copy of the counts that arrives in another process (pickled, or
inherited by a fork) starts from zero at its first count and writes its own counts to
``<tempdir>/pymc_pnode_counts/<key>.<pid>.json`` (at most every 0.5 s, and when the process exits);
:meth:`SolverDiagnostics.merged` adds them up. When counts are sent to other processes, a watcher thread
in the sending process waits for those processes to finish (the end of sampling) and then warns there,
with the totals, if a fixed step missed the tolerances in them or a gradient was refused: the user sees the
warning in their own session, not only in the workers' stderr.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import glob
import json
import math
import multiprocessing.util
import os
import tempfile
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_SPOOL_DIR = os.path.join(tempfile.gettempdir(), "pymc_pnode_counts")
_FLUSH_INTERVAL = 0.5  # seconds between a worker's spool-file updates
_COUNTS = ("n_evaluations", "n_steps", "n_rejected", "n_over_tolerance", "n_failed", "n_unreliable_gradient",
           "n_tightened", "n_tightening_failed", "n_equilibrium_gradient", "n_failed_draws", "n_calibration_gap")
_SHARED_KEYS: set[str] = set()  # keys of counts shared with other processes by this one
_WATCH_POLL = 0.5  # seconds between the watcher's looks at the spool files
_WATCH_GRACE = 120.0  # a watcher whose processes write no counts within this time stops
_WATCHED: set[str] = set()  # keys with a running watcher
_WATCH_LOCK = threading.Lock()
_LIVE: "weakref.WeakValueDictionary[str, SolverDiagnostics]" = weakref.WeakValueDictionary()

# The rounding check of derivatives computed through covariance congruences (Fenrir's reverse sweep, the forward
# tangents of pn.probabilistic_solution). Their kernels bound, per update, how much the rounding errors that a
# congruence's input carries can change its result (:func:`pymc_pnode.filtering.update.congruence_rounding`).
# Above ROUNDING_CHECK the derivatives are computed again with their seed (cotangent, or initial tangents)
# times RESCALE: they are linear in it, their rounding errors are not, so their difference estimates the rounding
# error. If it exceeds REPRODUCIBILITY (0.1 % of the largest component) the derivatives are rounding noise and the
# evaluation is refused.
ROUNDING_CHECK = 1e-10
RESCALE = 0.7
REPRODUCIBILITY = 1e-3

# An error-controlled solution that fails the quadrature check (a defect above 1 that the steps' error estimates did
# not see) or whose atol does not resolve y0 is solved again at these tighter tolerances in turn, ``(rtol / a,
# atol / b)``, until one passes. The failures measured come from states far below atol that grow
# (benchmarks/results/quadrature_check.md), hence the larger factor on atol.
TIGHTER_TOLERANCES = ((10.0, 1e3), (100.0, 1e6))

# A Fenrir likelihood with the global diffusion is checked against the same likelihood with the local diffusions
# (the default, within 0.0024 nats of the exact likelihood where the global one was 3.3e3 nats off;
# benchmarks/results/fenrir_defaults.md): a difference above this many nats is counted and warned. A nat is a
# likelihood ratio of e, which moves a posterior.
GLOBAL_CALIBRATION_GAP = 1.0


def _before_fork() -> None:
    # pm.sample(cores>1) forks its chains on Linux: the children inherit the counts without pickling.
    for diagnostics in list(_LIVE.values()):
        if os.getpid() == diagnostics._owner_pid:
            diagnostics._share()


os.register_at_fork(before=_before_fork)


def _spool_files(key: str) -> list[str]:
    """The spool files of the counts ``key``, one per process that wrote them."""
    return glob.glob(os.path.join(_SPOOL_DIR, f"{key}.*.json"))


@atexit.register
def _remove_spool_files() -> None:
    for key in _SHARED_KEYS:
        for path in _spool_files(key):
            with contextlib.suppress(OSError):
                os.remove(path)

__all__ = ["AccuracyWarning", "SolverDiagnostics"]


def _spool_writers(key: str, since: float) -> set[int]:
    """Process ids whose spool files of ``key`` were written at or after ``since`` (a ``time.time()``)."""
    pids = set()
    for path in _spool_files(key):
        with contextlib.suppress(OSError, ValueError):
            if os.path.getmtime(path) >= since - 1.0:
                pids.add(int(path.rsplit(".", 2)[1]))
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def needs_rounding_check(bound: float) -> bool:
    """Whether a kernel's rounding bound asks for the reproducibility check (above :data:`ROUNDING_CHECK`)."""
    return bound > ROUNDING_CHECK


def reproducible(derivatives, rescaled) -> bool:
    """Whether derivatives computed with their seed times :data:`RESCALE` (``rescaled``, a list of arrays) equal
    ``RESCALE`` times the first ones (``derivatives``) to :data:`REPRODUCIBILITY`, relative to the largest entry."""
    for first, second in zip(derivatives, rescaled):
        first, second = np.asarray(first), np.asarray(second) / RESCALE
        if first.size == 0:
            continue
        if not np.all(np.isfinite(second)):
            return False
        if np.max(np.abs(second - first)) > REPRODUCIBILITY * np.max(np.abs(first)):
            return False
    return True


def tighter_tolerances(rtol: float, atol: float) -> list[tuple[float, float]]:
    """The ``(rtol, atol)`` to try in turn when a solution at ``rtol``/``atol`` fails the quadrature check or does
    not resolve ``y0`` (:data:`TIGHTER_TOLERANCES`)."""
    return [(rtol / a, atol / b) for a, b in TIGHTER_TOLERANCES]


def solve_to_tolerance(solve: Callable[[float, float], tuple[Any, bool, float]], y0: np.ndarray, rtol: float,
                       atol: float, adaptive: bool = True,
                       why_failed: Callable[[Any], str] = lambda solution: "") -> tuple[Any, float, list, str]:
    """Solve from ``y0`` at ``rtol``/``atol`` and, with error control, again at each of :func:`tighter_tolerances`
    in turn while the accepted solution is over the tolerance.

    ``solve(rtol, atol)`` returns ``(solution, solved, accuracy)`` (accuracy ≤ 1: within tolerance); with error
    control the accuracy also counts a start that ``atol`` does not resolve (:func:`unresolved_start`). A tighter
    solve that fails (e.g. at ``max_steps``) says nothing about the accepted solution, which is kept. Returns the
    accepted solution, its accuracy, every solution computed (for their costs) and, if a tighter solve failed, its
    tolerances and why (``why_failed(solution)`` describes a failed solve), else ``""``.
    """

    def attempt(rtol: float, atol: float):
        solution, solved, accuracy = solve(rtol, atol)
        return solution, solved, max(accuracy, unresolved_start(y0, atol)) if adaptive else accuracy

    solution, solved, accuracy = attempt(rtol, atol)
    tried, cut_short = [solution], ""
    for tighter_rtol, tighter_atol in tighter_tolerances(rtol, atol) if adaptive else ():
        if not (solved and accuracy > 1.0):
            break
        again, solved, again_accuracy = attempt(tighter_rtol, tighter_atol)
        tried.append(again)
        if not solved:
            cut_short = f"rtol {tighter_rtol:g}, atol {tighter_atol:g}: {why_failed(again)}"
            break
        solution, accuracy = again, again_accuracy
    return solution, accuracy, tried, cut_short


def _tighter_tolerances_tried(n_cut_short: int = 0, latest: str = "") -> str:
    """How far the re-solves of :func:`solve_to_tolerance` go (``n_cut_short`` of them stopped by a failed re-solve,
    ``latest`` the last such failure), for warnings."""
    if not TIGHTER_TOLERANCES:
        return ""
    rtol_factor, atol_factor = TIGHTER_TOLERANCES[-1]
    latest = f" (the latest at {latest})" if latest else ""
    cut_short = (f", except at {n_cut_short} where a tighter re-solve failed and the looser solution was kept{latest}"
                 if n_cut_short else "")
    return (f", also at the tighter tolerances tried automatically (down to rtol / {rtol_factor:g} and atol / "
            f"{atol_factor:g}){cut_short}")


def unresolved_start(y0: np.ndarray, atol: float) -> float:
    """``atol / |y0_i|`` for the smallest nonzero entry of ``y0`` (0 if none): above 1, error control at ``atol``
    does not resolve that state, and if it grows (an epidemic from a seed far below atol) every solver's error
    estimates, and the quadrature check, can miss what its loss does to the solution
    (benchmarks/results/quadrature_check.md: every value more than 1 nat off that the check alone missed there
    started below atol)."""
    nonzero = np.abs(y0[y0 != 0.0])
    return float(atol / nonzero.min()) if nonzero.size else 0.0


def uninformed_derivatives(n_at_equilibrium: int, adaptive: bool, local_diffusion: bool) -> bool:
    """Whether derivatives of a solve were computed where its steps or diffusions had no information: some step
    sat exactly at an equilibrium of the field (``n_at_equilibrium``: ODE residual and derivative zero) and the step
    sizes (``adaptive``) or the diffusions (``local_diffusion``) came from those residuals. (With a fixed step and a
    fixed or global diffusion nothing depends on them: there the derivatives are those of nearby inputs.)"""
    return n_at_equilibrium > 0 and (adaptive or local_diffusion)


class AccuracyWarning(UserWarning):
    """A likelihood was evaluated where its numerical solution misses the requested tolerance."""


def suggested_step(step: float, max_error: float, order: int) -> float | None:
    """A fixed step that the largest scaled local error ``max_error`` of ``step`` suggests would meet the
    tolerances, ``step · min(1, 0.9 E^{-1/(q+1)})`` (Hairer, Nørsett & Wanner, 1993, §II.4); None if ``E ≤ 1``."""
    if not (max_error > 1.0):
        return None
    if not math.isfinite(max_error):
        return step / 10.0
    return step * min(1.0, 0.9 * max_error ** (-1.0 / (order + 1.0)))


@dataclass
class SolverDiagnostics:
    """Counts over the evaluations of one ODE-filter likelihood in this process.

    Attributes
    ----------
    n_evaluations : int
        Solves run (values and gradients alike).
    n_steps, n_rejected : int
        Accepted and rejected solver steps, summed over evaluations (``n_rejected`` is zero for fixed
        steps).
    n_over_tolerance : int
        Evaluations that miss ``rtol``/``atol`` somewhere on the grid: a fixed step whose largest scaled local
        error estimate exceeds 1, or (either kind of step) a solution whose means disagree with their own
        derivative states by more than the tolerances over some step
        (:func:`~pymc_pnode.filtering.calibration.quadrature_defect`: a failure that the local error estimate
        does not see, e.g. a state far below ``atol`` that grows) — with error control, even at the tighter
        tolerances tried automatically (``n_tightened``), and also when a nonzero entry of ``y0`` stays below
        their ``atol`` (:func:`unresolved_start`). Warns (once).
    n_tightened : int
        Error-controlled evaluations solved again at tighter tolerances (:func:`tighter_tolerances`) because the
        first solution failed the quadrature check or its ``atol`` did not resolve ``y0``; those that then passed
        are not over the tolerance and do not warn (they cost more: their steps are in ``n_steps``).
    n_tightening_failed : int
        Evaluations (among ``n_over_tolerance``) whose tighter re-solve failed — most often at ``max_steps``, which
        the tighter tolerances need more of — so that the looser solution over the tolerance was kept; why is in
        ``last_tightening_failure`` and in the warning.
    n_failed : int
        Evaluations that returned ``-inf``: non-finite values, a diverging fixed step, ``max_steps``
        reached or a collapsing adaptive step. Fixed-step failures warn too (once), as inside a sampler
        they only show as divergences; error-controlled solves fail where the ODE has no solution over
        the data's time span (a blow-up), where ``-inf`` is the right value, so they warn (once) only
        while no evaluation has succeeded yet: then the likelihood is ``-inf`` wherever it was tried,
        and the warning says why (``last_failure``).
    last_failure : str
        Why the latest failed solve stopped and where (e.g. "step size became too small ... at t = 10").
    last_tightening_failure : str
        The tolerances of the latest tighter re-solve that failed, why and where (``n_tightening_failed``).
    n_unreliable_gradient : int
        Evaluations (among ``n_failed``) refused (``-inf``) because their derivatives were rounding noise: the
        kernel's rounding bound was large and the derivatives changed when recomputed with other rounding
        errors (:func:`reproducible`; ``docs/fenrir.md``, "Gradients on strongly unstable invariant sets").
        Warns with either kind of step. (A Fenrir value computed without its gradient is not checked.)
    n_equilibrium_gradient : int
        Evaluations whose derivatives were computed at a solution that sat exactly at an equilibrium of the vector
        field over some step — every ODE residual and derivative exactly zero
        (:func:`~pymc_pnode.filtering.calibration.at_equilibrium`; e.g. logistic growth from ``y0 = 0``) —
        with error-controlled steps or the local diffusion. There the step-size controller and the local diffusion
        have no information, so the grid and diffusions, and the derivatives exact for them, can be far from those
        at any nearby input (logistic growth: −594 against the value's central difference −36,462;
        ``docs/fenrir.md``, "Known failures"). The value is accurate; the evaluation is not refused (a sampler's
        next point is almost surely off the equilibrium). Warns (once), with either kind of step.
    n_calibration_gap : int
        Evaluations with the global diffusion (``diffusion="global"``) whose log-likelihood differs from the one with
        the local diffusions by more than :data:`GLOBAL_CALIBRATION_GAP` nats (each such evaluation also computes
        the local value): one scalar diffusion for fast and slow phases makes the numerical variance of the slow ones
        far too large (``docs/fenrir.md``, "Calibrated diffusion"). Warns (once).
    max_calibration_gap : float
        The largest such difference seen (nats); ``inf`` when the check's own solve with local diffusions failed.
    n_failed_draws : int
        Predictive draws (``pm.sample_prior_predictive``, ``pm.sample_posterior_predictive``) whose solve failed —
        no solution over the data's time span (a blow-up) or the solver gave up — and which are therefore NaN.
        Not among ``n_evaluations``. Warns (once).
    max_error : float
        Largest scaled local error estimate or quadrature defect seen (``≤ 1`` means within tolerance).
    suggested_step : float or None
        For fixed steps: a step that the error estimates suggest would meet the tolerances at every
        parameter value seen, ``step · min(1, 0.9 E_max^{-1/(q+1)})`` (the step-size rule of Hairer,
        Nørsett & Wanner, 1993, §II.4).
    """

    label: str = "likelihood"
    step: float | None = None
    order: int = 3
    n_evaluations: int = 0
    n_steps: int = 0
    n_rejected: int = 0
    n_over_tolerance: int = 0
    n_failed: int = 0
    n_unreliable_gradient: int = 0
    n_tightened: int = 0
    n_tightening_failed: int = 0
    n_equilibrium_gradient: int = 0
    n_failed_draws: int = 0
    n_calibration_gap: int = 0
    max_error: float = 0.0
    max_calibration_gap: float = 0.0
    last_failure: str = ""
    last_tightening_failure: str = ""
    # what to try when a solve runs out of max_steps besides raising it (e.g. an implicit solver for a stiff ODE)
    max_steps_advice: str = field(default="", repr=False)

    _warned: bool = field(default=False, repr=False)
    _warned_gradient: bool = field(default=False, repr=False)
    _warned_equilibrium: bool = field(default=False, repr=False)
    _warned_draws: bool = field(default=False, repr=False)
    _warned_calibration: bool = field(default=False, repr=False)
    key: str = field(default_factory=lambda: uuid.uuid4().hex, repr=False)
    _owner_pid: int = field(default_factory=os.getpid, repr=False)
    _counting_pid: int = field(default_factory=os.getpid, repr=False)  # the process these counts are from
    _last_flush: float = field(default=0.0, repr=False)
    _reported: tuple = field(default=(0, 0, 0, 0, 0), repr=False)

    def __post_init__(self) -> None:
        _LIVE.setdefault(self.key, self)  # the fork hook shares these with the children (copies keep the key)

    @classmethod
    def for_filter(cls, label: str, step: float | None, solver) -> "SolverDiagnostics":
        """Counts of an ODE filter's solves: an EK0 that runs out of steps is advised the EK1 (stiff ODEs)."""
        advice = "" if solver.ek1 else (
            "If the ODE is stiff (fast decaying modes), the EK0 needs a step below its stability limit all the way: "
            "the EK1 (solver=pn.EK1(...)) is A-stable.")
        return cls(label, step, solver.order, max_steps_advice=advice)

    def __getstate__(self) -> dict:
        if os.getpid() == self._owner_pid:
            self._share()
        return self.__dict__.copy()

    def _share(self) -> None:
        """Copies of these counts are going to other processes (pickled, or inherited by a fork)."""
        _SHARED_KEYS.add(self.key)  # copies elsewhere may write spool files: remove them at exit
        with _WATCH_LOCK:
            if self.key in _WATCHED:
                return
            _WATCHED.add(self.key)
        threading.Thread(target=self._report_when_workers_finish, args=(time.time(),), daemon=True,
                         name=f"pymc_pnode-watch-{self.label}").start()

    def _count_here(self) -> None:
        """Before a count: a copy that has reached another process starts counting there."""
        if os.getpid() != self._counting_pid:
            self._count_in_this_process()

    def _count_in_this_process(self) -> None:
        """A copy in a new process (unpickled or forked) starts from zero and writes its spool file at exit."""
        for name in _COUNTS:
            setattr(self, name, 0)
        self.max_error = self.max_calibration_gap = 0.0
        self.last_tightening_failure = ""
        self._last_flush = 0.0
        self._counting_pid = os.getpid()
        multiprocessing.util.Finalize(None, self.flush, exitpriority=10)

    def _report_when_workers_finish(self, since: float) -> None:
        """Watcher thread: once the processes that wrote counts have exited, warn here with the totals."""
        try:
            seen: set[int] = set()
            started = time.monotonic()
            while True:
                time.sleep(_WATCH_POLL)
                seen |= _spool_writers(self.key, since)
                if seen:
                    threading.current_thread().reporting = True  # a report is due: see tests/conftest.py
                    if not any(_alive(pid) for pid in seen):
                        break
                elif time.monotonic() - started > _WATCH_GRACE:  # e.g. a fork that never used these counts
                    return
            total = self.merged()
            counts = total._warning_counts()
            if any(new > old for new, old in zip(counts, self._reported)):
                self._reported = counts
                warnings.warn("after sampling in other processes: " + total.message(), AccuracyWarning,
                              stacklevel=1)
        finally:
            with _WATCH_LOCK:
                _WATCHED.discard(self.key)

    def flush(self) -> None:
        """Write this process's counts to its spool file (copies in other processes only)."""
        if os.getpid() == self._owner_pid or self.n_evaluations == 0:
            return
        os.makedirs(_SPOOL_DIR, exist_ok=True)
        path = os.path.join(_SPOOL_DIR, f"{self.key}.{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({name: getattr(self, name) for name in (*_COUNTS, "max_error", "max_calibration_gap",
                                                              "last_failure", "last_tightening_failure")}, f)
        os.replace(path + ".tmp", path)
        self._last_flush = time.monotonic()

    def merged(self) -> "SolverDiagnostics":
        """These counts plus those that copies in other processes have written (a snapshot)."""
        total = dataclasses.replace(self)
        for path in _spool_files(self.key):
            if path.endswith(f".{os.getpid()}.json"):
                continue
            try:
                with open(path) as f:
                    other = json.load(f)
            except (OSError, ValueError):  # being replaced right now; its next version will be read
                continue
            for name in _COUNTS:
                setattr(total, name, getattr(total, name) + int(other[name]))
            total.max_error = max(total.max_error, float(other["max_error"]))
            total.max_calibration_gap = max(total.max_calibration_gap, float(other["max_calibration_gap"]))
            total.last_tightening_failure = total.last_tightening_failure or other.get("last_tightening_failure", "")
            total.last_failure = total.last_failure or other.get("last_failure", "")  # why a worker's solve failed
        return total

    @property
    def suggested_step(self) -> float | None:
        return None if self.step is None else suggested_step(self.step, self.max_error, self.order)

    def _warning_counts(self) -> tuple[int, int, int, int, int]:
        """The counts that warn: a fixed step's misses and failures, refused gradients, gradients at an
        equilibrium (any step) and global diffusions far from the local ones."""
        failed = 0 if self.step is None else self.n_failed  # error control fails only where there is no solution
        return (self.n_over_tolerance, failed, self.n_unreliable_gradient, self.n_equilibrium_gradient,
                self.n_calibration_gap)

    def record(self, n_steps: int, n_rejected: int, max_error: float, failed: bool, warn: bool = True,
               unreliable_gradient: bool = False, failure: str = "", tightened: bool = False,
               equilibrium_gradient: bool = False, tightening_failure: str = "",
               calibration_gap: float = 0.0) -> None:
        """Count one evaluation; warn (if ``warn``) the first time a solution misses the tolerances, the
        first time a gradient is refused (``unreliable_gradient``: a failure of that kind), the first time a
        gradient is computed at an exact equilibrium (``equilibrium_gradient``), the first time a global diffusion's
        value is more than :data:`GLOBAL_CALIBRATION_GAP` nats from the local diffusions' (``calibration_gap``, in
        nats; 0 when not checked), and an error-controlled failure while no evaluation has succeeded. ``failure``
        says why a failed solve stopped; ``tightened``: the evaluation was solved again at tighter tolerances;
        ``tightening_failure``: why a tighter re-solve failed (the looser solution was kept)."""
        self._count_here()
        self.n_evaluations += 1
        self.n_tightened += int(tightened)
        if tightening_failure:
            self.n_tightening_failed += 1
            self.last_tightening_failure = tightening_failure
        self.n_equilibrium_gradient += int(equilibrium_gradient)
        self.n_steps += int(n_steps)
        self.n_rejected += int(n_rejected)
        if os.getpid() != self._owner_pid and time.monotonic() - self._last_flush > _FLUSH_INTERVAL:
            self.flush()
        if equilibrium_gradient and warn and not self._warned_equilibrium:
            self._warned_equilibrium = True
            warnings.warn(self.message(), AccuracyWarning, stacklevel=3)
        if calibration_gap > GLOBAL_CALIBRATION_GAP:
            self.n_calibration_gap += 1
            self.max_calibration_gap = max(self.max_calibration_gap, float(calibration_gap))
            if warn and not self._warned_calibration:
                self._warned_calibration = True
                warnings.warn(self.message(), AccuracyWarning, stacklevel=3)
        if unreliable_gradient:
            self.n_failed += 1
            self.n_unreliable_gradient += 1
            if warn and not self._warned_gradient:
                self._warned_gradient = True
                warnings.warn(self.message(), AccuracyWarning, stacklevel=3)
            return
        if failed:
            self.n_failed += 1
            self.last_failure = failure or self.last_failure
            if self.step is None:  # error control fails only without a solution over the span (or at max_steps)
                if warn and not self._warned and self.n_failed == self.n_evaluations:
                    self._warned = True
                    warnings.warn(self.message(), AccuracyWarning, stacklevel=3)
                return
        else:
            self.max_error = max(self.max_error, float(max_error))
            if max_error <= 1.0:
                return
            self.n_over_tolerance += 1
        if warn and not self._warned:
            self._warned = True
            warnings.warn(self.message(), AccuracyWarning, stacklevel=3)

    def record_failed_draw(self, failure: str) -> None:
        """Count a predictive draw whose solve failed (it is NaN; ``failure`` says why and where); warn the first
        time."""
        self._count_here()
        self.n_failed_draws += 1
        self.last_failure = failure
        if not self._warned_draws:
            self._warned_draws = True
            warnings.warn(self.message(), AccuracyWarning, stacklevel=3)

    def message(self) -> str:
        """What went wrong, with counts (and, for a fixed step, a suggested step)."""
        parts = []
        why = f" (the latest: {self.last_failure})" if self.last_failure else ""
        if self.step is not None and (self.n_over_tolerance or self.n_failed > self.n_unreliable_gradient):
            advice = (f"Use step={self.suggested_step:.3g} or smaller, or step=None for error-controlled steps."
                      if self.suggested_step else "Use a smaller step, or step=None for error-controlled steps.")
            parts.append(
                f"the fixed step {self.step:g} misses the tolerances at {self.n_over_tolerance} and fails (-inf: "
                f"non-finite, diverging or over max_steps) at {self.n_failed - self.n_unreliable_gradient} of "
                f"{self.n_evaluations} evaluations so far{why} (largest scaled local error or quadrature defect "
                f"{self.max_error:.3g}; 1 = at tolerance). Where it misses them the likelihood or solution can be "
                f"far from the exact one. {advice}"
            )
        if self.step is None and self.n_over_tolerance:
            more_steps = (" Raise max_steps, which the tighter re-solves ran out of."
                          if "maximum number of steps" in self.last_tightening_failure else "")
            parts.append(
                f"the error-controlled solution misses the tolerances at {self.n_over_tolerance} of "
                f"{self.n_evaluations} evaluations so far"
                f"{_tighter_tolerances_tried(self.n_tightening_failed, self.last_tightening_failure)}: over some step "
                f"its means disagree with their own derivatives, or a nonzero entry of y0 is below atol, by up to "
                f"{self.max_error:.3g} × the tolerance, which the steps' error estimates do not see (docs/fenrir.md, "
                f"'The quadrature check'). There the likelihood or solution can be far from the exact one "
                f"(thousands of nats where a state far below atol grows, e.g. an epidemic from a small seed). Use an "
                f"atol below the smallest state that matters, or set states that should be zero to exactly 0."
                f"{more_steps}"
            )
        if self.step is None and self.n_failed > self.n_unreliable_gradient:
            advice = "" if "jump of the vector field in t" in (self.last_failure or "") else (
                " That is right where the ODE has no solution over the span; otherwise check y0, theta and max_steps.")
            if "maximum number of steps" in (self.last_failure or "") and self.max_steps_advice:
                advice += " " + self.max_steps_advice
            parts.append(
                f"error-controlled steps failed (-inf) at {self.n_failed - self.n_unreliable_gradient} of "
                f"{self.n_evaluations} evaluations so far{why}.{advice}"
            )
        if self.n_unreliable_gradient:
            parts.append(
                f"{self.n_unreliable_gradient} of {self.n_evaluations} evaluations were refused (-inf) because their "
                f"gradient was rounding noise: computed at two scales, the two disagreed (the filter's covariance "
                f"updates amplify rounding errors there; one known cause is an unstable invariant set of the ODE, see "
                f"docs/fenrir.md, 'Gradients on strongly unstable invariant sets')."
            )
        if self.n_equilibrium_gradient:
            parts.append(
                f"{self.n_equilibrium_gradient} of {self.n_evaluations} evaluations computed derivatives at a solution "
                f"that sits exactly at an equilibrium of the vector field (its ODE residual and derivative zero over "
                f"some step, e.g. a growth model from y0 = 0): there neither the step-size control nor the local "
                f"diffusion has information, and the derivatives can be far from those of the likelihood at any nearby "
                f"point (the value itself is accurate; docs/fenrir.md, 'Known failures'). Start samplers and "
                f"optimisers off exact equilibria (the default jitter of pm.sample does)."
            )
        if self.n_calibration_gap:
            # (infinite where the check's own solve with local diffusions failed: no local value to compare with)
            gap_size = (f"by up to {self.max_calibration_gap:.3g} nats" if math.isfinite(self.max_calibration_gap)
                        else "at least one of them because the check's solve with local diffusions failed")
            parts.append(
                f"with the global diffusion the log-likelihood is more than {GLOBAL_CALIBRATION_GAP:g} nat from the "
                f"one with local diffusions at {self.n_calibration_gap} of {self.n_evaluations} evaluations so far "
                f"({gap_size}): one diffusion for the whole solution makes the "
                f"numerical variance of its slow phases far larger than their error, and the likelihood drifts from "
                f"the exact one (docs/fenrir.md, 'Calibrated diffusion'). Use diffusion=None (local diffusions, the "
                f"default)."
            )
        if self.n_failed_draws:
            parts.append(
                f"{self.n_failed_draws} predictive draw(s) so far have no solution over the data's time span and are "
                f"NaN (the latest: {self.last_failure}): the ODE blows up, or the solver gives up, at those parameter "
                f"values. Count or drop them (np.isnan) before summarising the draws; the total is n_failed_draws of "
                f"pn.fenrir_diagnostics(model)."
            )
        return f"{self.label}: " + " ".join(parts)

    def as_dict(self) -> dict:
        """The counts as a plain dictionary."""
        return {
            "n_evaluations": self.n_evaluations,
            "n_steps": self.n_steps,
            "n_rejected": self.n_rejected,
            "n_over_tolerance": self.n_over_tolerance,
            "n_failed": self.n_failed,
            "n_unreliable_gradient": self.n_unreliable_gradient,
            "n_tightened": self.n_tightened,
            "n_tightening_failed": self.n_tightening_failed,
            "n_equilibrium_gradient": self.n_equilibrium_gradient,
            "n_failed_draws": self.n_failed_draws,
            "n_calibration_gap": self.n_calibration_gap,
            "max_error": self.max_error,
            "max_calibration_gap": self.max_calibration_gap,
            "suggested_step": self.suggested_step,
            "last_failure": self.last_failure,
            "last_tightening_failure": self.last_tightening_failure,
        }
