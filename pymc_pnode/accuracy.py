"""Accuracy bookkeeping of ODE-filter likelihoods: counts per evaluation and :class:`AccuracyWarning`.

A likelihood evaluated with a fixed step is only as accurate as the step is fine for the parameter
values the sampler visits. Every evaluation computes the filter's own local error estimate
(:func:`pymc_pnode.filtering.odefilter.local_error`); :class:`SolverDiagnostics` counts what happened
and warns, once per likelihood and process, when the step is too coarse.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

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
