"""The proposal of Algorithm 2: a random walk for the parameters, fresh innovations for the solution.

Shared by the PyMC step :class:`~pymc_pnode.ChkrebtiiMetropolis` and the parallel-tempering move
:class:`~pymc_pnode.chkrebtii.tempering.ChkrebtiiReplicaMove`. Entries of the raveled position
flagged as innovations are redrawn from their ``N(0, 1)`` prior (an independence proposal: a new
realisation of the probabilistic solution), the others move by ``scale * L eps``. During tuning the
scale and, optionally, ``L L^T`` adapt as the package's other random walks do
(:class:`~pymc_pnode.sampling.adaptation.WindowedAdaptation`: dual averaging of the scale towards
``target_accept``, the covariance of the parameter draws of doubling windows).
"""

from __future__ import annotations

import numpy as np

from pymc_pnode.sampling.adaptation import WindowedAdaptation

__all__ = ["Algorithm2Proposal"]


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
        Re-estimate the proposal covariance during tuning (first window: 100 steps, then doubling;
        shrunk towards its diagonal, so the parameters' scales do not matter), after which the scale
        restarts at ``2.38 / sqrt(dim)``.
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
        self.target_accept = float(target_accept)
        self.adapt_covariance = bool(adapt_covariance)
        self._adaptation = WindowedAdaptation(nt, float(scaling), self.target_accept,
                                              adapt_metric=self.adapt_covariance, shrink="diagonal")
        self._scaling = float(scaling)

    @property
    def scaling(self) -> float:
        """Current scale multiplying ``L``."""
        return self._scaling

    @scaling.setter
    def scaling(self, value: float) -> None:
        """Set the scale and restart its adaptation there."""
        self._scaling = float(value)
        self._adaptation.restart(self._scaling)

    def reset_tuning(self) -> None:
        """Restart the window schedule and the scale's averaging at the current scale (keeps the covariance)."""
        self._adaptation.reset_windows()
        self._adaptation.restart(self._scaling)

    def stop_tuning(self) -> None:
        """Fix the scale at its dual-averaged value."""
        self._scaling = self._adaptation.final_step

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
        covariance = self._adaptation.update(accept_prob, np.asarray(x)[~self.innovation_mask])
        if covariance is not None:
            try:
                self.chol = np.linalg.cholesky(covariance)
            except np.linalg.LinAlgError:
                pass  # keep the previous proposal shape
            else:
                self._adaptation.restart(2.38 / np.sqrt(self.n_theta))
        self._scaling = self._adaptation.step
