"""The proposal of Algorithm 2: a random walk for the parameters, fresh innovations for the solution.

Shared by the PyMC step :class:`~pymc_pnode.ChkrebtiiMetropolis` and the parallel-tempering move
:class:`~pymc_pnode.chkrebtii.tempering.ChkrebtiiReplicaMove`. Entries of the raveled position
flagged as innovations are redrawn from their ``N(0, 1)`` prior (an independence proposal: a new
realisation of the probabilistic solution), the others move by ``scale * L eps``. During tuning the
scale follows a Robbins-Monro recursion on its logarithm towards ``target_accept`` and, optionally,
``L L^T`` is re-estimated from the parameter draws at the end of doubling windows.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Algorithm2Proposal", "metropolis_accept"]


class Algorithm2Proposal:
    """Random walk on ``~innovation_mask`` entries, prior redraw of the ``innovation_mask`` entries.

    Parameters
    ----------
    innovation_mask : numpy.ndarray of bool
        Which entries of the raveled position are standard-normal innovations.
    S : array_like, optional
        Proposal standard deviations (vector) or covariance (matrix) of the parameters.
    scaling : float, default 0.1
        Initial scale multiplying ``S``.
    target_accept : float, optional
        Default 0.44 for one parameter, else 0.234.
    adapt_covariance : bool, default True
        Re-estimate the proposal covariance during tuning (first window: 100 steps, then doubling),
        after which the scale restarts at ``2.38 / sqrt(dim)``.
    """

    def __init__(self, innovation_mask, S=None, scaling: float = 0.1,
                 target_accept: float | None = None, adapt_covariance: bool = True):
        mask = np.asarray(innovation_mask, dtype=bool).reshape(-1)
        self.innovation_mask = mask
        self.n_theta = int((~mask).sum())
        if self.n_theta == 0:
            raise ValueError("Algorithm 2 needs at least one parameter besides the innovations")
        if not mask.any():
            raise ValueError("no Chkrebtii innovations among the sampled variables")
        if not (np.isfinite(scaling) and scaling > 0.0):
            raise ValueError(f"scaling must be positive, got {scaling!r}")
        if target_accept is None:
            target_accept = 0.44 if self.n_theta == 1 else 0.234
        if not 0.0 < target_accept < 1.0:
            raise ValueError(f"target_accept must lie in (0, 1), got {target_accept!r}")
        nt = self.n_theta
        if S is None:
            chol = np.eye(nt)
        else:
            S = np.asarray(S, dtype=np.float64)
            if S.ndim == 1 and S.size == nt:
                chol = np.diag(S)
            elif S.shape == (nt, nt):
                chol = np.linalg.cholesky(S)
            else:
                raise ValueError(f"S must have shape ({nt},) or ({nt}, {nt}), got {S.shape}")
        self.chol = chol
        self.scaling = float(scaling)
        self.target_accept = float(target_accept)
        self.adapt_covariance = bool(adapt_covariance)
        self.reset_tuning()

    def reset_tuning(self) -> None:
        """Restart the adaptation schedule (not the current scale and covariance)."""
        self.n_tune_steps = 0
        self.window_len = 100
        self.window_end = 100
        self._reset_moments()

    def _reset_moments(self) -> None:
        self.cov_n = 0
        self.cov_mean = np.zeros(self.n_theta)
        self.cov_m2 = np.zeros((self.n_theta, self.n_theta))

    def propose(self, x: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, float]:
        """A proposal and ``log N(z') - log N(z)`` of its innovations (the independence-proposal term)."""
        mask = self.innovation_mask
        new = np.array(x, dtype=np.float64, copy=True)
        new[~mask] = x[~mask] + self.scaling * (self.chol @ rng.standard_normal(self.n_theta))
        z_new = rng.standard_normal(int(mask.sum()))
        log_q = -0.5 * (float(z_new @ z_new) - float(x[mask] @ x[mask]))
        new[mask] = z_new
        return new, log_q

    def adapt(self, accept_prob: float, x: np.ndarray) -> None:
        """One tuning update after a step that ended at ``x`` with acceptance probability ``accept_prob``."""
        self.n_tune_steps += 1
        gain = (self.n_tune_steps + 10.0) ** -0.6
        self.scaling *= float(np.exp(gain * (accept_prob - self.target_accept) / self.target_accept))
        if not self.adapt_covariance:
            return
        theta = np.asarray(x)[~self.innovation_mask]
        self.cov_n += 1
        delta = theta - self.cov_mean
        self.cov_mean += delta / self.cov_n
        self.cov_m2 += np.outer(delta, theta - self.cov_mean)
        if self.n_tune_steps < self.window_end:
            return
        n, nt = self.cov_n, self.n_theta
        if n > 2 * nt + 2:
            cov = self.cov_m2 / (n - 1)
            # Shrink towards the diagonal (few draws) and keep it positive definite.
            cov = (n / (n + 5.0)) * cov + (5.0 / (n + 5.0)) * np.diag(np.diag(cov))
            cov += 1e-10 * max(float(np.max(np.diag(cov))), 1e-300) * np.eye(nt)
            try:
                self.chol = np.linalg.cholesky(cov)
                self.scaling = 2.38 / np.sqrt(nt)
            except np.linalg.LinAlgError:
                pass  # keep the previous proposal shape
        self.window_len *= 2
        self.window_end = self.n_tune_steps + self.window_len
        self._reset_moments()


def metropolis_accept(log_ratio: float, rng: np.random.Generator) -> tuple[bool, float]:
    """Accept with probability ``min(1, exp(log_ratio))`` (NaN counts as ``-inf``)."""
    if not log_ratio > -np.inf:
        return False, 0.0
    prob = float(np.exp(min(0.0, log_ratio)))
    return bool(np.log(rng.uniform()) < log_ratio), prob
