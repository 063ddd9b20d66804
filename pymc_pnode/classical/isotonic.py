r"""The closed-form weight update of Matsuda & Miyatake (2021, §3.2 and Appendix A).

For fixed residuals :math:`r_{k,j}` the weights minimise, separately for every observed component j,

.. math::

    \sum_{k=1}^K \bigl(-\log w_{k,j} + w_{k,j}\, r_{k,j}^2\bigr)
    \quad\text{subject to}\quad 0 < w_{K,j} \le \dots \le w_{1,j} \le 1/\gamma_j^2 .

The solution is the least-squares isotonic (non-decreasing) regression :math:`v_{\cdot,j}` of the
squared residuals (pool-adjacent-violators), clipped from below at the noise variance:
:math:`w_{k,j} = 1/\max(v_{k,j}, \gamma_j^2)`. The fitted discretisation-error variances are
:math:`\sigma^2_{k,j} = 1/w_{k,j} - \gamma_j^2`.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import isotonic_regression

__all__ = ["isotonic_weights", "weight_objective"]


def isotonic_weights(residuals: np.ndarray, noise_var: np.ndarray) -> np.ndarray:
    """Optimal non-increasing weights for given residuals (the update (3.10) of the paper).

    Parameters
    ----------
    residuals : ndarray, shape (K, J)
        Residuals :math:`y_{k,j} - H_j \\tilde x_k` in time order.
    noise_var : ndarray, shape (J,)
        Observation-noise variances :math:`\\gamma_j^2 > 0` (or lower bounds on them): the
        weights never exceed :math:`1/\\gamma_j^2`.

    Returns
    -------
    ndarray, shape (K, J)
        Weights :math:`w_{k,j}`, non-increasing in k for every j.

    Raises
    ------
    ValueError
        On shape mismatch, non-finite residuals or non-positive noise variances.
    """
    r = np.asarray(residuals, dtype=np.float64)
    if r.ndim == 1:
        r = r[:, None]
    if r.ndim != 2:
        raise ValueError(f"residuals must have shape (K, J), got {np.shape(residuals)}")
    gamma2 = np.asarray(noise_var, dtype=np.float64).reshape(-1)
    if gamma2.size == 1:
        gamma2 = np.full(r.shape[1], gamma2[0])
    if gamma2.shape != (r.shape[1],):
        raise ValueError(f"noise_var must have {r.shape[1]} entries, got {gamma2.size}")
    if not np.all(np.isfinite(r)):
        raise ValueError("residuals must be finite")
    if not np.all(gamma2 > 0.0):
        raise ValueError(f"noise_var must be positive, got {gamma2}")
    w = np.empty_like(r)
    for j in range(r.shape[1]):
        v = isotonic_regression(r[:, j] ** 2, increasing=True).x
        # Clipping the unconstrained-from-above solution is optimal (Theorem A.1 of the paper).
        w[:, j] = 1.0 / np.maximum(v, gamma2[j])
    return w


def weight_objective(weights: np.ndarray, residuals: np.ndarray) -> float:
    r"""The IRLS objective :math:`g = \sum_{k,j} (-\log w_{k,j} + w_{k,j} r_{k,j}^2)`.

    Equals :math:`-2 \log L - K J \log(2\pi)` for the heteroscedastic Gaussian likelihood with
    variances :math:`1/w_{k,j}`.
    """
    w = np.asarray(weights, dtype=np.float64)
    r = np.asarray(residuals, dtype=np.float64).reshape(w.shape)
    return float(np.sum(-np.log(w) + w * r * r))
