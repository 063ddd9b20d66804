"""Adaptive random-walk Metropolis move for one replica."""

from __future__ import annotations

import numpy as np
import scipy.linalg

from pymc_pnode.sampling.acceptance import metropolis_accept
from pymc_pnode.sampling.adaptation import WindowedAdaptation
from pymc_pnode.sampling.moves import AdaptiveMove
from pymc_pnode.sampling.tempered_target import ReplicaState, TemperedTarget

__all__ = ["RandomWalkMetropolis"]


class RandomWalkMetropolis(AdaptiveMove):
    """Gaussian random-walk Metropolis with adaptive scale and covariance.

    Proposals are ``x' = x + scale * L z`` with ``z ~ N(0, I)`` and ``L`` the
    Cholesky factor of the proposal covariance.  During tuning the scale is
    adapted by dual averaging towards ``target_accept`` and, if
    ``adapt_covariance``, ``L L^T`` is re-estimated from the replica's states
    at the end of doubling windows (100, 200, 400, ... iterations), after which
    the scale restarts from ``2.38 / sqrt(d)`` (Roberts & Rosenthal 2001).

    Parameters
    ----------
    target_accept : float, optional
        Target acceptance probability.  Defaults to 0.44 in one dimension and
        0.234 otherwise.
    initial_scale : float, optional
        Starting scale.  Defaults to ``2.38 / sqrt(d)`` multiplied by
        ``min(beta ** -0.5, 10)``, since hot replicas are wider.
    adapt_covariance : bool, default True
        Estimate a full proposal covariance during tuning.
    first_window : int, default 100
        Length of the first covariance-estimation window.
    """

    def __init__(
        self,
        target_accept: float | None = None,
        initial_scale: float | None = None,
        adapt_covariance: bool = True,
        first_window: int = 100,
    ) -> None:
        if target_accept is not None and not 0.0 < target_accept < 1.0:
            raise ValueError(f"target_accept must lie in (0, 1), got {target_accept!r}.")
        if initial_scale is not None and not initial_scale > 0.0:
            raise ValueError(f"initial_scale must be positive, got {initial_scale!r}.")
        self.target_accept = target_accept
        self.initial_scale = initial_scale
        self.adapt_covariance = bool(adapt_covariance)
        self.first_window = int(first_window)
        self.ndim = 0
        self.chol: np.ndarray | None = None

    def setup(self, ndim: int, beta: float) -> None:
        """Size the proposal for a ``ndim``-dimensional replica at ``beta``."""
        self.ndim = int(ndim)
        if self.target_accept is None:
            self.target_accept = 0.44 if ndim == 1 else 0.234
        self._optimal_scale = 2.38 / np.sqrt(ndim)
        scale = self.initial_scale
        if scale is None:
            scale = self._optimal_scale * min(beta**-0.5, 10.0)
        self.start_adaptation(WindowedAdaptation(ndim, scale, self.target_accept, adapt_metric=self.adapt_covariance,
                                                  first_window=self.first_window), scale)
        self.chol = None

    def transition(self, state: ReplicaState, target: TemperedTarget, rng: np.random.Generator,
                    size: float) -> tuple[ReplicaState, float]:
        """One Metropolis update of the replica with proposal scale ``size``."""
        noise = rng.standard_normal(self.ndim)
        if self.chol is not None:
            noise = self.chol @ noise
        proposal = target.evaluate(state.x + size * noise)
        log_ratio = target.logp(proposal) - target.logp(state)
        accepted, accept_prob = metropolis_accept(log_ratio, rng)
        return (proposal if accepted else state), accept_prob

    def use_metric(self, covariance: np.ndarray) -> None:
        """The window's covariance becomes the proposal shape (unless it is not positive definite)."""
        try:
            self.chol = scipy.linalg.cholesky(covariance, lower=True)
        except np.linalg.LinAlgError:
            return  # keep the previous proposal shape; the next window may do better
        # A new metric invalidates the tuned scale; restart near the optimum.
        self._adaptation.restart(self._optimal_scale)
