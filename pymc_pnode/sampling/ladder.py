"""Inverse-temperature ladders for parallel tempering.

A ladder is a vector ``betas`` of length ``K`` with ``betas[0] == 1`` (the cold,
target replica) and non-increasing entries in ``(0, 1]``.  This module builds
default ladders, validates user ladders and adapts a ladder during tuning so
that adjacent replicas swap at equal rates.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "DEFAULT_BETA_MIN",
    "DEFAULT_N_REPLICAS",
    "LadderAdapter",
    "geometric_betas",
    "validate_betas",
    "validate_n_replicas",
]

DEFAULT_N_REPLICAS = 8
"""Number of replicas used when neither ``n_replicas`` nor a ladder is given."""

DEFAULT_BETA_MIN = 1e-3
"""Inverse temperature of the hottest replica of the default geometric ladder."""


def geometric_betas(n_replicas: int, beta_min: float = DEFAULT_BETA_MIN) -> np.ndarray:
    """Geometric inverse-temperature ladder ``beta_k = beta_min ** (k / (K - 1))``.

    Parameters
    ----------
    n_replicas : int
        Number of replicas ``K >= 2``.
    beta_min : float, default 1e-3
        Inverse temperature of the hottest replica, in ``(0, 1]``.

    Returns
    -------
    numpy.ndarray
        Float64 array of shape ``(K,)`` with ``betas[0] == 1`` and
        ``betas[-1] == beta_min``.

    Raises
    ------
    ValueError
        If ``n_replicas < 2`` or ``beta_min`` is outside ``(0, 1]``.
    """
    n_replicas = validate_n_replicas(n_replicas)
    beta_min = float(beta_min)
    if not (np.isfinite(beta_min) and 0.0 < beta_min <= 1.0):
        raise ValueError(f"beta_min must lie in (0, 1], got {beta_min!r}.")
    exponents = np.arange(n_replicas, dtype=np.float64) / (n_replicas - 1)
    betas = np.exp(exponents * np.log(beta_min))
    # Pin the end points exactly; exp(log(.)) may be off by one ulp.
    betas[0] = 1.0
    betas[-1] = beta_min
    return betas


def validate_betas(betas: Sequence[float] | np.ndarray) -> np.ndarray:
    """Check a user-given inverse-temperature ladder.

    Parameters
    ----------
    betas : sequence of float
        Candidate ladder.

    Returns
    -------
    numpy.ndarray
        The ladder as a float64 array of shape ``(K,)``.

    Raises
    ------
    ValueError
        If the ladder is not one-dimensional, has fewer than two entries, does
        not start with 1, contains values outside ``(0, 1]`` (including
        non-finite values) or is not non-increasing.
    """
    arr = np.asarray(betas, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"betas must be a one-dimensional sequence, got shape {arr.shape}.")
    validate_n_replicas(arr.size, what="len(betas)")
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0.0) or np.any(arr > 1.0):
        raise ValueError(
            "All inverse temperatures must lie in (0, 1] (temperatures must be positive "
            f"and at least 1); got betas={arr.tolist()}."
        )
    if abs(arr[0] - 1.0) > 1e-12:
        raise ValueError(
            "The first inverse temperature must be 1 (the cold replica whose "
            f"draws are reported); got betas[0]={arr[0]!r}."
        )
    arr = arr.copy()
    arr[0] = 1.0
    if np.any(np.diff(arr) > 0.0):
        raise ValueError(
            f"betas must be non-increasing from the cold to the hot end; got {arr.tolist()}."
        )
    return arr


def validate_n_replicas(n_replicas: int, what: str = "n_replicas") -> int:
    """Check that a replica count is an integer ``>= 2`` and return it as ``int``.

    Raises
    ------
    ValueError
        If it is not an integer or smaller than 2.
    """
    if isinstance(n_replicas, bool) or int(n_replicas) != n_replicas:
        raise ValueError(f"{what} must be an integer, got {n_replicas!r}.")
    n_replicas = int(n_replicas)
    if n_replicas < 2:
        raise ValueError(f"Parallel tempering needs at least 2 replicas; got {what}={n_replicas}.")
    return n_replicas


class LadderAdapter:
    """Adapt an inverse-temperature ladder towards equal adjacent swap rates.

    The ladder is parametrised by the logarithms ``s_j`` of the gaps
    ``log(beta_j) - log(beta_{j+1})``, normalised so that the end points
    ``beta_0 = 1`` and ``beta_{K-1} = beta_min`` stay fixed.  After each swap
    round the log-gaps move by ``kappa_t * (a_j - mean(a))`` where ``a_j`` is a
    smoothed swap acceptance probability of pair ``(j, j+1)``: pairs that swap
    more often than average get a wider gap, pairs that swap less get a
    narrower one (Vousden, Farr & Mandel 2016; Miasojedow, Moulines & Vihola
    2013).  The gain ``kappa_t = rate * decay / (t + decay)`` decays so the
    ladder settles during tuning.

    Parameters
    ----------
    betas : numpy.ndarray
        Strictly decreasing initial ladder with ``betas[0] == 1``.
    rate : float, default 0.1
        Initial adaptation gain ``kappa_0``.
    decay : float, default 100.0
        Number of updates after which the gain has halved.
    smoothing : float, default 0.1
        Weight of the newest observation in the exponential moving average
        of each pair's acceptance probability.
    """

    def __init__(
        self,
        betas: np.ndarray,
        rate: float = 0.1,
        decay: float = 100.0,
        smoothing: float = 0.1,
    ) -> None:
        betas = np.asarray(betas, dtype=np.float64)
        log_betas = np.log(betas)
        gaps = -np.diff(log_betas)
        if betas.size < 2 or np.any(gaps <= 0.0):
            raise ValueError(
                "Ladder adaptation needs a strictly decreasing ladder; got "
                f"betas={betas.tolist()}."
            )
        self.log_beta_min = float(log_betas[-1])
        self.log_gaps = np.log(gaps)
        self.rate = float(rate)
        self.decay = float(decay)
        self.smoothing = float(smoothing)
        self.accept_ema = np.full(gaps.size, np.nan)
        self.n_updates = 0

    def betas(self) -> np.ndarray:
        """Current ladder implied by the log-gap parameters."""
        weights = np.exp(self.log_gaps - self.log_gaps.max())
        fractions = np.cumsum(weights) / weights.sum()
        betas = np.empty(self.log_gaps.size + 1)
        betas[0] = 1.0
        betas[1:] = np.exp(fractions * self.log_beta_min)
        betas[-1] = np.exp(self.log_beta_min)
        return betas

    def update(self, pairs: np.ndarray, accept_probs: np.ndarray) -> np.ndarray:
        """Record one swap round and move the ladder.

        Parameters
        ----------
        pairs : numpy.ndarray
            Lower indices ``j`` of the attempted pairs ``(j, j+1)``.
        accept_probs : numpy.ndarray
            Swap acceptance probabilities of those pairs.

        Returns
        -------
        numpy.ndarray
            The updated ladder.
        """
        for j, prob in zip(pairs, accept_probs):
            old = self.accept_ema[j]
            self.accept_ema[j] = prob if np.isnan(old) else old + self.smoothing * (prob - old)
        # Only move once every pair has been observed, otherwise the mean is biased.
        if np.any(np.isnan(self.accept_ema)):
            return self.betas()
        gain = self.rate * self.decay / (self.n_updates + self.decay)
        self.log_gaps += gain * (self.accept_ema - self.accept_ema.mean())
        self.n_updates += 1
        return self.betas()
