"""Validation of the arguments the baseline estimators share (data, times, observation model)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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


def as_positive_float(value, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number, got {value!r}") from None
    if not (np.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return v


def as_positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def validate_observations(
    ode, data, times, *, t0=None, obs_matrix=None, obs_sigma=1.0, allow_missing: bool = True
) -> Observations:
    """Check shapes and values of the observation arguments; ``ValueError`` naming the argument."""
    d = ode.n_states
    t0 = float(ode.t0 if t0 is None else t0)
    if not np.isfinite(t0):
        raise ValueError(f"t0 must be finite, got {t0}")
    if obs_matrix is None:
        H = np.eye(d)
    else:
        H = np.array(obs_matrix, dtype=np.float64)
        if H.ndim == 1:
            H = H[None, :]
        if H.ndim != 2 or H.shape[1] != d or H.shape[0] < 1:
            raise ValueError(f"obs_matrix must have shape (n_obs, {d}), got {np.shape(obs_matrix)}")
        if not np.all(np.isfinite(H)):
            raise ValueError("obs_matrix must be finite")
    n_obs = H.shape[0]
    times = np.array(times, dtype=np.float64).reshape(-1) if np.ndim(times) <= 1 else None
    if times is None:
        raise ValueError("times must be a 1-d array")
    if times.size < 1 or not np.all(np.isfinite(times)):
        raise ValueError("times must be a non-empty array of finite values")
    if np.any(np.diff(times) <= 0):
        raise ValueError("times must be strictly increasing")
    if times[0] < t0:
        raise ValueError(f"times must be >= t0 = {t0}, got times[0] = {times[0]}")
    y = np.array(data, dtype=np.float64)
    if y.ndim == 1 and n_obs == 1:
        y = y[:, None]
    if y.shape != (times.size, n_obs):
        raise ValueError(
            f"data must have shape (len(times), n_obs) = ({times.size}, {n_obs}), got {np.shape(data)}"
        )
    if np.any(np.isinf(y)):
        raise ValueError("data must not contain infinite values")
    mask = ~np.isnan(y)
    if not allow_missing and not np.all(mask):
        raise ValueError("data must not contain NaN (missing values are not supported here)")
    if not np.any(mask):
        raise ValueError("data contains no observed (non-NaN) values")
    sigma = np.array(obs_sigma, dtype=np.float64)
    if sigma.ndim == 0:
        sigma = np.full(n_obs, float(sigma))
    if sigma.shape != (n_obs,) or not np.all(np.isfinite(sigma)) or np.any(sigma <= 0):
        raise ValueError(f"obs_sigma must be a positive scalar or an array of shape ({n_obs},)")
    weights = mask / sigma**2
    identity = H.shape == (d, d) and np.array_equal(H, np.eye(d))
    return Observations(np.where(mask, y, 0.0), times, H, sigma, mask, weights, t0, identity)


def validate_bounds(bounds, n: int, name: str) -> list[tuple[float, float]]:
    """``bounds`` as a list of ``n`` (lo, hi) pairs with ``-inf``/``inf`` for None."""
    if bounds is None:
        return [(-np.inf, np.inf)] * n
    try:
        pairs = [tuple(b) for b in bounds]
    except TypeError:
        raise ValueError(f"{name} must be a sequence of (low, high) pairs") from None
    if len(pairs) != n or any(len(b) != 2 for b in pairs):
        raise ValueError(f"{name} must contain {n} (low, high) pairs, got {len(pairs)}")
    out = []
    for lo, hi in pairs:
        lo = -np.inf if lo is None else float(lo)
        hi = np.inf if hi is None else float(hi)
        if np.isnan(lo) or np.isnan(hi) or lo >= hi:
            raise ValueError(f"{name}: each pair must satisfy low < high, got ({lo}, {hi})")
        out.append((lo, hi))
    return out
