"""Metropolis accept/reject decision robust to non-finite log ratios."""

from __future__ import annotations

import math

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
    # Plain-float math: this runs several times per iteration and replica.
    log_ratio = float(log_ratio)
    if math.isnan(log_ratio):
        return False, 0.0
    if log_ratio >= 0.0:
        return True, 1.0
    accept_prob = math.exp(log_ratio)  # underflows to 0 only when acceptance is hopeless
    return rng.random() < accept_prob, accept_prob
