"""Validation of the arguments the baseline estimators share (data, times, observation model)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pymc_pnode.validation import validate_data, validate_noise, validate_obs_matrix, validate_times


@dataclass
class Observations:
    """Validated observation model ``data[i] ≈ H y(times[i])`` with per-output noise scales.

    ``mask`` is ``False`` where ``data`` is NaN (missing); ``weights = mask / sigma**2``.
    """

    data: np.ndarray  # (n, n_obs), NaN replaced by 0
    times: np.ndarray  # (n,)
    H: np.ndarray  # (n_obs, d)
    sigma: np.ndarray  # (n_obs,)
    mask: np.ndarray  # (n, n_obs) bool
    weights: np.ndarray  # (n, n_obs)
    t0: float
    identity: bool  # H is the d x d identity

    @property
    def n_obs(self) -> int:
        return self.H.shape[0]

    def residuals(self, y: np.ndarray) -> np.ndarray:
        """Weighted residuals ``(H y_i - data_i) / sigma`` (zero where missing), shape (n, n_obs)."""
        r = (y @ self.H.T - self.data) / self.sigma
        return np.where(self.mask, r, 0.0)


def validate_observations(
    ode, data, times, *, t0=None, obs_matrix=None, obs_sigma=1.0, allow_missing: bool = True
) -> Observations:
    """Check shapes and values of the observation arguments; ``ValueError`` naming the argument."""
    d = ode.n_states
    t0 = float(ode.t0 if t0 is None else t0)
    if not np.isfinite(t0):
        raise ValueError(f"t0 must be finite, got {t0}")
    H = validate_obs_matrix(obs_matrix, d)
    n_obs = H.shape[0]
    times = validate_times(times, "times", start=t0)
    y = validate_data(data, times.size, n_obs, allow_missing=allow_missing)
    mask = ~np.isnan(y)
    sigma = validate_noise(obs_sigma, n_obs)
    weights = mask / sigma**2
    identity = H.shape == (d, d) and np.array_equal(H, np.eye(d))
    return Observations(np.where(mask, y, 0.0), times, H, sigma, mask, weights, t0, identity)
