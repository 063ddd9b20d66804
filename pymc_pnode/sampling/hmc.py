"""Hamiltonian Monte Carlo move on a replica's tempered density."""

from __future__ import annotations

import math

import numpy as np

from pymc_pnode.sampling.acceptance import metropolis_accept
from pymc_pnode.sampling.adaptation import WindowedAdaptation
from pymc_pnode.sampling.moves import AdaptiveMove
from pymc_pnode.sampling.tempered_target import ReplicaState, TemperedTarget

__all__ = ["HamiltonianMove"]


class HamiltonianMove(AdaptiveMove):
    """Static-length HMC with dual-averaged step size and diagonal mass matrix.

    Each call draws a momentum ``p ~ N(0, M)``, integrates
    ``n = clip(ceil(path_length / eps), 1, max_steps)`` leapfrog steps with a
    step size jittered by +-10 % (to avoid periodic orbits) and applies a
    Metropolis correction.  A non-finite density or an energy error above
    ``max_energy_error`` along the trajectory ends it early and rejects
    (a "divergence").  During tuning the step size follows dual averaging
    towards ``target_accept`` and the inverse mass matrix is set to the
    replica's marginal variances at the end of doubling windows.

    Parameters
    ----------
    target_accept : float, default 0.65
        Target acceptance probability.
    path_length : float, default 2.0
        Integration time per proposal (in units of the metric).
    max_steps : int, default 100
        Upper bound on the number of leapfrog steps per proposal.
    initial_step_size : float, optional
        Defaults to ``0.25 / d ** 0.25 * min(beta ** -0.5, 10)``.
    adapt_mass : bool, default True
        Adapt a diagonal mass matrix during tuning.
    first_window : int, default 100
        Length of the first mass-matrix estimation window.
    max_energy_error : float, default 1000.0
        Energy error treated as a divergence.
    """

    requires_grad = True

    def __init__(
        self,
        target_accept: float = 0.65,
        path_length: float = 2.0,
        max_steps: int = 100,
        initial_step_size: float | None = None,
        adapt_mass: bool = True,
        first_window: int = 100,
        max_energy_error: float = 1000.0,
    ) -> None:
        if not 0.0 < target_accept < 1.0:
            raise ValueError(f"target_accept must lie in (0, 1), got {target_accept!r}.")
        if not path_length > 0.0:
            raise ValueError(f"path_length must be positive, got {path_length!r}.")
        if int(max_steps) < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps!r}.")
        if initial_step_size is not None and not initial_step_size > 0.0:
            raise ValueError(f"initial_step_size must be positive, got {initial_step_size!r}.")
        self.target_accept = float(target_accept)
        self.path_length = float(path_length)
        self.max_steps = int(max_steps)
        self.initial_step_size = initial_step_size
        self.adapt_mass = bool(adapt_mass)
        self.first_window = int(first_window)
        self.max_energy_error = float(max_energy_error)
        self.ndim = 0

    def setup(self, ndim: int, beta: float) -> None:
        """Size the integrator for a ``ndim``-dimensional replica at ``beta``."""
        self.ndim = int(ndim)
        step = self.initial_step_size
        if step is None:
            step = 0.25 / ndim**0.25 * min(beta**-0.5, 10.0)
        self.start_adaptation(WindowedAdaptation(ndim, step, self.target_accept, adapt_metric=self.adapt_mass,
                                                  diagonal=True, first_window=self.first_window), step)
        self.inv_mass = np.ones(ndim)
        self.n_divergences = 0

    def transition(self, state: ReplicaState, target: TemperedTarget, rng: np.random.Generator,
                    size: float) -> tuple[ReplicaState, float]:
        """One HMC transition of the replica with (unjittered) step size ``size``."""
        eps = size * rng.uniform(0.9, 1.1)
        n_steps = int(np.clip(np.ceil(self.path_length / eps), 1, self.max_steps))

        inv_mass = self.inv_mass
        momentum = rng.standard_normal(self.ndim) / np.sqrt(inv_mass)
        energy0 = -target.logp(state) + 0.5 * np.sum(inv_mass * momentum**2)

        current = state
        x = state.x.copy()
        p = momentum + 0.5 * eps * target.grad(state)
        diverged = False
        for i in range(n_steps):
            x = x + eps * inv_mass * p
            current = target.evaluate(x)
            logp = target.logp(current)
            if not math.isfinite(logp):
                diverged = True
                break
            grad = target.grad(current)
            p = p + (0.5 * eps if i == n_steps - 1 else eps) * grad
            # Stop integrating early once the energy has blown up.
            if -logp + 0.5 * np.sum(inv_mass * p**2) - energy0 > self.max_energy_error:
                diverged = True
                break

        if diverged:
            accepted, accept_prob = False, 0.0
            self.n_divergences += 1
        else:
            energy1 = -target.logp(current) + 0.5 * np.sum(inv_mass * p**2)
            accepted, accept_prob = metropolis_accept(energy0 - energy1, rng)
        return (current if accepted else state), accept_prob

    def use_metric(self, variances: np.ndarray) -> None:
        """The window's marginal variances become the inverse mass matrix."""
        self.inv_mass = variances
        # The step size tuned for the old metric is stale; restart averaging from it.
        self._adaptation.restart(self._adaptation.step)
