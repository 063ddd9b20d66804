"""Metropolis accept/reject decision robust to non-finite log ratios."""

from __future__ import annotations

import numpy as np

__all__ = ["metropolis_accept"]


def metropolis_accept(log_ratio: float, rng: np.random.Generator) -> tuple[bool, float]:
    """Accept with probability ``min(1, exp(log_ratio))``.

    Parameters
    ----------
    log_ratio : float
        Log Metropolis-Hastings ratio.  NaN (e.g. ``inf - inf`` from two
        zero-density states) and ``-inf`` are always rejected.
    rng : numpy.random.Generator
        Source of the uniform variate.

    Returns
    -------
    accepted : bool
        The decision.
    accept_prob : float
        ``min(1, exp(log_ratio))``, with NaN mapped to 0.
    """
    if np.isnan(log_ratio):
        return False, 0.0
    accept_prob = 1.0 if log_ratio >= 0.0 else float(np.exp(log_ratio))
    # Comparing on the log scale avoids underflow for very negative ratios.
    accepted = bool(log_ratio >= 0.0 or np.log(rng.uniform()) < log_ratio)
    return accepted, accept_prob
