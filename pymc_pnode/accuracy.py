"""Accuracy bookkeeping of ODE-filter likelihoods: counts per evaluation and :class:`AccuracyWarning`.

A likelihood evaluated with a fixed step is only as accurate as the step is fine for the parameter
values the sampler visits. Every evaluation computes the filter's own local error estimate
(:func:`pymc_pnode.filtering.odefilter.local_error`); :class:`SolverDiagnostics` counts what happened
and warns, once per likelihood and process, when the step is too coarse.

Counts made in other processes (the chains of ``pm.sample(cores>1)``) reach the process that built the
model through small spool files: a copy of the counts that arrives in another process by pickling starts
from zero and writes its own counts to ``<tempdir>/pymc_pnode_counts/<key>.<pid>.json`` (at most every
0.5 s, and when the process exits); :meth:`SolverDiagnostics.merged` adds them up.
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
import time
import uuid
import warnings
from dataclasses import dataclass, field

_SPOOL_DIR = os.path.join(tempfile.gettempdir(), "pymc_pnode_counts")
_FLUSH_INTERVAL = 0.5  # seconds between a worker's spool-file updates
_COUNTS = ("n_evaluations", "n_steps", "n_rejected", "n_over_tolerance", "n_failed")
_SHARED_KEYS: set[str] = set()  # keys of counts pickled by this process


@atexit.register
def _remove_spool_files() -> None:
    for key in _SHARED_KEYS:
        for path in glob.glob(os.path.join(_SPOOL_DIR, f"{key}.*.json")):
            with contextlib.suppress(OSError):
                os.remove(path)

__all__ = ["AccuracyWarning", "SolverDiagnostics"]


class AccuracyWarning(UserWarning):
    """A likelihood was evaluated where its numerical solution misses the requested tolerance."""


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
        Fixed-step evaluations whose largest scaled local error estimate exceeded 1, i.e. whose step
        misses ``rtol``/``atol`` somewhere on the grid.
    n_failed : int
        Evaluations that returned ``-inf``: non-finite values, a diverging fixed step, ``max_steps``
        reached or a collapsing adaptive step. Fixed-step failures warn too (once), as inside a sampler
        they only show as divergences; error-controlled solves fail where the ODE has no solution over
        the data's time span (a blow-up), where ``-inf`` is the right value.
    max_error : float
        Largest scaled local error estimate seen (``≤ 1`` means within tolerance).
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
    max_error: float = 0.0
    _warned: bool = field(default=False, repr=False)
    key: str = field(default_factory=lambda: uuid.uuid4().hex, repr=False)
    _owner_pid: int = field(default_factory=os.getpid, repr=False)
    _last_flush: float = field(default=0.0, repr=False)

    def __getstate__(self) -> dict:
        if os.getpid() == self._owner_pid:
            _SHARED_KEYS.add(self.key)  # copies elsewhere may write spool files: remove them at exit
        return self.__dict__.copy()

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if os.getpid() != self._owner_pid:  # a copy in another process counts from zero, into its spool file
            for name in _COUNTS:
                setattr(self, name, 0)
            self.max_error = 0.0
            self._last_flush = 0.0
            multiprocessing.util.Finalize(None, self.flush, exitpriority=10)

    def flush(self) -> None:
        """Write this process's counts to its spool file (copies in other processes only)."""
        if os.getpid() == self._owner_pid or self.n_evaluations == 0:
            return
        os.makedirs(_SPOOL_DIR, exist_ok=True)
        path = os.path.join(_SPOOL_DIR, f"{self.key}.{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({name: getattr(self, name) for name in (*_COUNTS, "max_error")}, f)
        os.replace(path + ".tmp", path)
        self._last_flush = time.monotonic()

    def merged(self) -> "SolverDiagnostics":
        """These counts plus those that copies in other processes have written (a snapshot)."""
        total = dataclasses.replace(self)
        for path in glob.glob(os.path.join(_SPOOL_DIR, f"{self.key}.*.json")):
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
        return total

    @property
    def suggested_step(self) -> float | None:
        if self.step is None or not (self.max_error > 1.0):
            return None
        if not math.isfinite(self.max_error):
            return self.step / 10.0
        return self.step * min(1.0, 0.9 * self.max_error ** (-1.0 / (self.order + 1.0)))

    def record(self, n_steps: int, n_rejected: int, max_error: float, failed: bool, warn: bool = True) -> None:
        """Count one evaluation; warn (if ``warn``) the first time a fixed step misses the tolerances."""
        self.n_evaluations += 1
        self.n_steps += int(n_steps)
        self.n_rejected += int(n_rejected)
        if os.getpid() != self._owner_pid and time.monotonic() - self._last_flush > _FLUSH_INTERVAL:
            self.flush()
        if failed:
            self.n_failed += 1
            if self.step is None:  # error control fails only without a solution over the span (or at max_steps)
                return
        else:
            self.max_error = max(self.max_error, float(max_error))
            if self.step is None or max_error <= 1.0:
                return
            self.n_over_tolerance += 1
        if warn and not self._warned:
            self._warned = True
            warnings.warn(self.message(), AccuracyWarning, stacklevel=3)

    def message(self) -> str:
        """What went wrong, with counts and a suggested step."""
        advice = (f"Use step={self.suggested_step:.3g} or smaller, or step=None for error-controlled steps."
                  if self.suggested_step else "Use a smaller step, or step=None for error-controlled steps.")
        return (
            f"{self.label}: the fixed step {self.step:g} misses the tolerances at {self.n_over_tolerance} and "
            f"fails (-inf: non-finite, diverging or over max_steps) at {self.n_failed} of {self.n_evaluations} "
            f"evaluations so far "
            f"(largest scaled local error {self.max_error:.3g}; 1 = at tolerance). Where it misses them the "
            f"likelihood can be far from the exact one. {advice}"
        )

    def as_dict(self) -> dict:
        """The counts as a plain dictionary."""
        return {
            "n_evaluations": self.n_evaluations,
            "n_steps": self.n_steps,
            "n_rejected": self.n_rejected,
            "n_over_tolerance": self.n_over_tolerance,
            "n_failed": self.n_failed,
            "max_error": self.max_error,
            "suggested_step": self.suggested_step,
        }
