"""Backward kernels, RTS smoothing, joint posterior samples and dense output for ODE filters.

The filter posterior on the grid is represented backwards in time (Tronarp, Bosch & Hennig, 2022):
``x_N ~ N(μ_N, Σ_N)`` and ``x_{n-1} | x_n ~ N(G_n x_n + d_n, Λ_n)``. One QR of
``[[R_{n-1} A^T, R_{n-1}], [√κ Q^{1/2}, 0]]`` gives the predicted root (R11), ``G_n^T = R11^{-1} R12``
and ``Λ_n^{1/2} = R22`` (Bosch, 2024, PhD thesis).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from pymc_pnode.filtering.linalg import JIT, copy_transposed, solve_upper, tria_cols_inplace
from pymc_pnode.filtering.odefilter import (
    apply_transition,
    fill_predict_stack,
    preconditioner,
    predict_root,
    transition_coefficients,
)


@nb.njit(**JIT)
def backward_kernel(
    mu: np.ndarray,
    r: np.ndarray,
    h: float,
    kappa: float,
    q: int,
    d: int,
    rq: np.ndarray,
    g: np.ndarray,
    dvec: np.ndarray,
    lam: np.ndarray,
    r_pred: np.ndarray,
) -> None:
    """Kernel ``x(t) | x(t + h) ~ N(G x + dvec, lam^T lam)`` from the distribution ``N(mu, r^T r)``.

    ``r_pred`` receives the (invertible) root of the predicted covariance at ``t + h``.
    """
    dd = (q + 1) * d
    a = np.empty(q + 1)
    tvec = np.empty(q + 1)
    transition_coefficients(h, q, a)
    preconditioner(h, q, tvec)
    # the stack [[R Aᵀ, R], [√κ Q^{1/2}, 0]], transposed (mt[c] is its column c)
    mt = np.empty((2 * dd + 1, 2 * dd))
    fill_predict_stack(r, a, tvec, math.sqrt(kappa), rq, q, d, mt)
    for j in range(dd):
        for i in range(dd):
            mt[dd + j, i] = r[i, j]
            mt[dd + j, dd + i] = 0.0
    tria_cols_inplace(mt, 2 * dd, 2 * dd, mt[2 * dd])
    copy_transposed(mt, dd, r_pred, 0)
    sol = np.empty(dd)
    for j in range(dd):
        solve_upper(r_pred, dd, mt[dd + j, :dd], sol)  # column j of G^T
        for i in range(dd):
            g[j, i] = sol[i]
    mu_pred = np.empty(dd)
    apply_transition(a, q, d, mu, mu_pred)
    for i in range(dd):
        s = mu[i]
        for j in range(dd):
            s -= g[i, j] * mu_pred[j]
        dvec[i] = s
        for j in range(dd):
            lam[i, j] = mt[dd + j, dd + i]


@nb.njit(**JIT)
def push_through_kernel(
    g: np.ndarray, dvec: np.ndarray, lam: np.ndarray, mu: np.ndarray, r: np.ndarray, mu_out: np.ndarray,
    r_out: np.ndarray,
) -> None:
    """Marginal of ``G x + dvec + noise(lam)`` for ``x ~ N(mu, r^T r)``."""
    dd = mu.shape[0]
    mt = np.empty((dd + 1, 2 * dd))  # the stack [r Gᵀ; lam], transposed, and the QR's work vector
    for i in range(dd):
        s = dvec[i]
        for j in range(dd):
            s += g[i, j] * mu[j]
        mu_out[i] = s
    for col in range(dd):
        for row in range(dd):
            s = 0.0
            for k in range(dd):
                s += r[row, k] * g[col, k]
            mt[col, row] = s
            mt[col, dd + row] = lam[row, col]
    tria_cols_inplace(mt, 2 * dd, dd, mt[dd])
    copy_transposed(mt, dd, r_out, 0)


@nb.njit(**JIT)
def smooth(ts, mus, rs, kappas, q: int, d: int, rq: np.ndarray):
    """RTS smoothing through backward kernels. Returns smoothed means/roots and the kernels."""
    n_pts, dd = mus.shape
    gs = np.zeros((n_pts, dd, dd))
    ds = np.zeros((n_pts, dd))
    lams = np.zeros((n_pts, dd, dd))
    mus_s = np.empty_like(mus)
    rs_s = np.empty_like(rs)
    r_pred = np.empty((dd, dd))
    mus_s[n_pts - 1] = mus[n_pts - 1]
    rs_s[n_pts - 1] = rs[n_pts - 1]
    for n in range(n_pts - 1, 0, -1):
        backward_kernel(
            mus[n - 1], rs[n - 1], ts[n] - ts[n - 1], kappas[n], q, d, rq, gs[n], ds[n], lams[n], r_pred
        )
        push_through_kernel(gs[n], ds[n], lams[n], mus_s[n], rs_s[n], mus_s[n - 1], rs_s[n - 1])
    return mus_s, rs_s, gs, ds, lams


@nb.njit(**JIT)
def sample_backward(mu_last, r_last, gs, ds, lams, z):
    """Joint samples of the grid states, ``z`` standard normal of shape ``(n, N, D)``."""
    n_samples, n_pts, dd = z.shape
    out = np.empty((n_samples, n_pts, dd))
    for s in range(n_samples):
        for i in range(dd):
            v = mu_last[i]
            for k in range(dd):
                v += r_last[k, i] * z[s, n_pts - 1, k]
            out[s, n_pts - 1, i] = v
        for n in range(n_pts - 1, 0, -1):
            for i in range(dd):
                v = ds[n, i]
                for j in range(dd):
                    v += gs[n, i, j] * out[s, n, j]
                for k in range(dd):
                    v += lams[n, k, i] * z[s, n - 1, k]
                out[s, n - 1, i] = v
    return out


@nb.njit(**JIT)
def interpolate(t, ts, mus, rs, kappas, mus_s, rs_s, q: int, d: int, rq: np.ndarray, mu_out, r_out):
    """Smoothed posterior at an arbitrary time ``t`` inside the grid (Bosch, 2024, PhD thesis)."""
    n = np.searchsorted(ts, t)
    if n < ts.shape[0] and ts[n] == t:
        mu_out[:] = mus_s[n]
        r_out[:, :] = rs_s[n]
        return
    dd = (q + 1) * d
    h1 = t - ts[n - 1]
    h2 = ts[n] - t
    a = np.empty(q + 1)
    tvec = np.empty(q + 1)
    transition_coefficients(h1, q, a)
    preconditioner(h1, q, tvec)
    # Filter prediction from t_{n-1} to t ...
    mu_t = np.empty(dd)
    apply_transition(a, q, d, mus[n - 1], mu_t)
    r_t = np.empty((dd, dd))
    predict_root(rs[n - 1], a, tvec, math.sqrt(kappas[n]), rq, q, d, np.empty((dd + 1, 2 * dd)), r_t)
    # ... then condition on the smoothed state at t_n through the kernel x(t) | x(t_n).
    g = np.empty((dd, dd))
    dvec = np.empty(dd)
    lam = np.empty((dd, dd))
    backward_kernel(mu_t, r_t, h2, kappas[n], q, d, rq, g, dvec, lam, np.empty((dd, dd)))
    push_through_kernel(g, dvec, lam, mus_s[n], rs_s[n], mu_out, r_out)
