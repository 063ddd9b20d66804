"""Backward kernels of the filter posterior, RTS smoothing, joint samples and dense output, with the adjoint.

The filter posterior on the grid is represented backwards in time (Tronarp, Bosch & Hennig, 2022):
``x_N ~ N(μ_N, Σ_N)`` and ``x_{n-1} | x_n ~ N(G_n x_n + d_n, Λ_n)`` with the gain
``G_n = Σ_{n-1} Aᵀ (Σ⁻_n)⁻¹`` from two triangular solves with the predicted root, and the kernel
covariance in Joseph form ``Λ_n = (I − G A) Σ_{n-1} (I − G A)ᵀ + κ G Q Gᵀ`` (one QR of a stacked root,
Bosch, 2024, PhD thesis). :func:`backward_step` pushes a distribution through a kernel in one QR (the
Fenrir likelihood's backward Kalman filter); :func:`backward_step_adjoint` is its adjoint on covariances
(with :func:`~.predict.predict_adjoint` for the part through the filter's prediction).
"""

from __future__ import annotations

from collections import namedtuple

import numba as nb
import numpy as np

from pymc_pnode._jit import INLINE_JIT, vectorised_entry_point
from pymc_pnode.filtering.linalg import (
    copy_transposed,
    matmul,
    matmul_part,
    matmul_tn,
    solve_gram_inplace,
    tria_cols_inplace,
)
from pymc_pnode.filtering.predict import predict_root
from pymc_pnode.filtering.prior import apply_transition, fill_root_transition_t, new_step
from pymc_pnode.filtering.update import Cotangent

# x_{n-1} | x_n ~ N(g x_n + dvec, lamᵀ lam)
BackwardKernel = namedtuple("BackwardKernel", ["g", "dvec", "lam"])
# Work arrays of the backward operations: Gᵀ (gt), (R Aᵀ)ᵀ (wt), a (D, D) block, the stacked root
# (transposed, with the QR's work vector as its last row) and a vector.
BackwardWork = namedtuple("BackwardWork", ["gt", "wt", "blk", "stack", "vec"])
BackwardAdjointWork = namedtuple("BackwardAdjointWork", ["gbar", "ymat", "sig", "pg", "vec_a", "vec_b"])


@nb.njit(**INLINE_JIT)
def backward_work(dd: int) -> BackwardWork:
    """Work arrays of the backward operations for states of length ``dd``."""
    return BackwardWork(np.empty((dd, dd)), np.empty((dd, dd)), np.empty((dd, dd)), np.empty((dd + 1, 3 * dd)),
                        np.empty(dd))


@nb.njit(**INLINE_JIT)
def backward_adjoint_work(dd: int) -> BackwardAdjointWork:
    """Work arrays of :func:`backward_step_adjoint`."""
    return BackwardAdjointWork(np.empty((dd, dd)), np.empty((dd, dd)), np.empty((dd, dd)), np.empty((dd, dd)),
                               np.empty(dd), np.empty(dd))


@nb.njit(**INLINE_JIT)
def backward_gain(
    r_prev: np.ndarray, r_pred: np.ndarray, step: np.ndarray, q: int, d: int, wt: np.ndarray, gt: np.ndarray
) -> None:
    """``gt = Gᵀ = (Σ⁻)⁻¹ A Σ`` for ``Σ = r_prevᵀ r_prev``, ``Σ⁻ = r_predᵀ r_pred``; ``wt = (R Aᵀ)ᵀ``."""
    fill_root_transition_t(r_prev, step, q, d, wt)
    matmul(wt, r_prev, gt)  # A Σ = (R Aᵀ)ᵀ R
    solve_gram_inplace(r_pred, (q + 1) * d, gt)


@nb.njit(**INLINE_JIT)
def fill_kernel_noise_stack(
    r_prev: np.ndarray, step: np.ndarray, rq: np.ndarray, q: int, d: int, gt: np.ndarray, wt: np.ndarray,
    blk: np.ndarray, stack: np.ndarray, row0: int,
) -> None:
    """Rows ``row0 .. row0 + 2D`` of the stacked root (held transposed in ``stack``): the Joseph-form root
    ``[R (I − G A)ᵀ; √κ (Q̄^{1/2} T ⊗ I) Gᵀ]`` of the kernel covariance ``Λ``, after :func:`backward_gain`.

    The products work on whole rows (no serial chain per entry), which made the backward step ≈ 1.6×
    faster than row-by-row dot products.
    """
    dd = (q + 1) * d
    sqrt_kappa = step[2, 0]
    matmul_tn(wt, gt, blk)  # R Aᵀ Gᵀ
    for i in range(dd):
        for j in range(dd):
            stack[j, row0 + i] = r_prev[i, j] - blk[i, j]
    for i in range(q + 1):
        for k in range(d):
            bi = blk[i * d + k]
            for j in range(dd):
                bi[j] = 0.0
            for jj in range(q + 1):
                c = sqrt_kappa * rq[i, jj] * step[1, jj]
                gk = gt[jj * d + k]
                for j in range(dd):
                    bi[j] += c * gk[j]
    copy_transposed(blk, dd, stack, row0 + dd)


@nb.njit(**INLINE_JIT)
def backward_kernel(
    mu: np.ndarray, r: np.ndarray, step: np.ndarray, rq: np.ndarray, q: int, d: int, r_pred: np.ndarray,
    out: BackwardKernel, work: BackwardWork,
) -> None:
    """Kernel ``x(t) | x(t + h) ~ N(G x + dvec, lam^T lam)`` of the filter distribution ``N(mu, r^T r)`` at ``t``.

    ``r_pred`` receives the (invertible) root of the predicted covariance at ``t + h``.
    """
    g, dvec, lam = out
    gt, wt, blk, stack, vec = work
    dd = (q + 1) * d
    predict_root(r, step, rq, q, d, stack, r_pred)
    backward_gain(r, r_pred, step, q, d, wt, gt)
    copy_transposed(gt, dd, g, 0)
    apply_transition(step, q, d, mu, vec)
    for i in range(dd):
        s = mu[i]
        for j in range(dd):
            s -= g[i, j] * vec[j]
        dvec[i] = s
    fill_kernel_noise_stack(r, step, rq, q, d, gt, wt, blk, stack, 0)
    tria_cols_inplace(stack, 2 * dd, dd, stack[dd])
    copy_transposed(stack, dd, lam, 0)


@nb.njit(**INLINE_JIT)
def backward_step(
    mu_prev: np.ndarray, r_prev: np.ndarray, r_pred: np.ndarray, step: np.ndarray, rq: np.ndarray, q: int, d: int,
    mean: np.ndarray, root: np.ndarray, work: BackwardWork,
) -> None:
    """Push ``N(mean, rootᵀ root)`` at ``t_n`` (in place) through the backward kernel of the filter posterior.

    The filter had ``N(mu_prev, r_prevᵀ r_prev)`` at ``t_{n−1}`` and predicted ``N(A mu_prev, r_predᵀ r_pred)``
    at ``t_n``. One QR of the ``3D × D`` stack ``[root Gᵀ; R (I − G A)ᵀ; √κ Q^{1/2} Gᵀ]`` gives the new root
    (``Gᵀ`` stays in ``work.gt``).
    """
    gt, wt, blk, stack, vec = work
    dd = (q + 1) * d
    backward_gain(r_prev, r_pred, step, q, d, wt, gt)
    apply_transition(step, q, d, mu_prev, vec)  # the filter's predicted mean
    for j in range(dd):
        vec[j] = mean[j] - vec[j]
    for i in range(dd):
        mean[i] = mu_prev[i]
    for j in range(dd):
        dj = vec[j]
        gj = gt[j]
        for i in range(dd):
            mean[i] += gj[i] * dj
    matmul(root, gt, blk)
    copy_transposed(blk, dd, stack, 0)
    fill_kernel_noise_stack(r_prev, step, rq, q, d, gt, wt, blk, stack, dd)
    tria_cols_inplace(stack, 3 * dd, dd, stack[dd])
    copy_transposed(stack, dd, root, 0)


@nb.njit(**INLINE_JIT)
def backward_step_adjoint(
    g: np.ndarray, r_pred: np.ndarray, mean_diff: np.ndarray, cov_diff: np.ndarray, step: np.ndarray, q: int, d: int,
    bar: Cotangent, inj: Cotangent, work: BackwardAdjointWork,
) -> None:
    """Adjoint of one backward step ``m = μ + G (m⁺ − μ⁻)``, ``P = Σ + G (P⁺ − Σ⁻) Gᵀ``.

    ``G = Σ Aᵀ (Σ⁻)⁻¹`` with ``Σ⁻ = r_predᵀ r_pred``; ``mean_diff = m⁺ − μ⁻`` and ``cov_diff = P⁺ − Σ⁻``. On entry
    ``bar`` holds the adjoints of ``(m, P)``; on exit those of ``(m⁺, P⁺)``. The direct adjoints with respect
    to the filter's ``(μ, Σ)`` are added to ``inj``; those of the prediction ``(μ⁻, Σ⁻)`` are left in
    ``work.vec_a`` and ``work.sig``, for :func:`~.predict.predict_adjoint`.
    """
    dd = g.shape[0]
    mbar, sbar = bar
    inj_mu, inj_sig = inj
    gbar, ymat, sig, pg, tmp_a, tmp_b = work
    # Ḡ = m̄ (m⁺ − μ⁻)ᵀ + 2 P̄ G (P⁺ − Σ⁻); P̄ G is kept in pg for Gᵀ P̄ G below
    matmul(sbar, g, pg)
    matmul(pg, cov_diff, gbar)
    for i in range(dd):
        for j in range(dd):
            gbar[i, j] = mbar[i] * mean_diff[j] + 2.0 * gbar[i, j]
    # ymat = Yᵀ = (Σ⁻)⁻¹ Ḡᵀ, i.e. Y = Ḡ (Σ⁻)⁻¹
    copy_transposed(gbar, dd, ymat, 0)
    solve_gram_inplace(r_pred, dd, ymat)
    # P̄⁺ = Gᵀ P̄ G (into gbar); Σ̄⁻ (into sig) = −Gᵀ P̄ G − sym(Gᵀ Y), and sym(Gᵀ Y) = sym(Yᵀ G)
    matmul_tn(g, pg, gbar)
    matmul(ymat, g, sig)
    for i in range(dd):
        for j in range(i, dd):
            p = 0.5 * (gbar[i, j] + gbar[j, i])
            s = 0.5 * (sig[i, j] + sig[j, i])
            gbar[i, j] = p
            gbar[j, i] = p
            sig[i, j] = -p - s
            sig[j, i] = -p - s
    # Σ̄ += P̄ + sym(Y A), where row (i, k) of (Y A)ᵀ = Aᵀ Yᵀ is Σ_{i' ≤ i} a[i − i'] Yᵀ[(i', k)]
    for i in range(dd):
        for j in range(dd):
            inj_sig[i, j] += sbar[i, j]
    for i in range(q + 1):
        for k in range(d):
            for row in range(dd):
                tmp_b[row] = 0.0
            for ip in range(i + 1):
                c = 0.5 * step[0, i - ip]
                yr = ymat[ip * d + k]
                for row in range(dd):
                    tmp_b[row] += c * yr[row]
            col = i * d + k
            for row in range(dd):
                inj_sig[row, col] += tmp_b[row]
                inj_sig[col, row] += tmp_b[row]
    # μ̄ += m̄; m̄⁺ = Gᵀ m̄; μ̄⁻ = −Gᵀ m̄
    for j in range(dd):
        tmp_a[j] = 0.0
    for k in range(dd):
        c = mbar[k]
        gk = g[k]
        for j in range(dd):
            tmp_a[j] += c * gk[j]
    for j in range(dd):
        inj_mu[j] += mbar[j]
        mbar[j] = tmp_a[j]
        tmp_a[j] = -tmp_a[j]
    sbar[:, :] = gbar


@nb.njit(**INLINE_JIT)
def push_through_kernel(kernel: BackwardKernel, mu: np.ndarray, r: np.ndarray, mu_out: np.ndarray,
                        r_out: np.ndarray) -> None:
    """Marginal of ``G x + dvec + noise(lam)`` for ``x ~ N(mu, r^T r)``."""
    g, dvec, lam = kernel
    dd = mu.shape[0]
    mt = np.empty((dd + 1, 2 * dd))  # the stack [r Gᵀ; lam], transposed, and the QR's work vector
    for i in range(dd):
        s = dvec[i]
        for j in range(dd):
            s += g[i, j] * mu[j]
        mu_out[i] = s
    matmul_part(g, r.T, dd, dd, dd, mt)  # mt[:dd, :dd] = G rᵀ = (r Gᵀ)ᵀ
    for col in range(dd):
        for row in range(dd):
            mt[col, dd + row] = lam[row, col]
    tria_cols_inplace(mt, 2 * dd, dd, mt[dd])
    copy_transposed(mt, dd, r_out, 0)


@vectorised_entry_point
def smooth(ts, mus, rs, kappas, q: int, d: int, rq: np.ndarray):
    """RTS smoothing through backward kernels. Returns smoothed means and roots and the kernels ``(gs, ds, lams)``."""
    n_pts, dd = mus.shape
    gs, ds, lams = np.zeros((n_pts, dd, dd)), np.zeros((n_pts, dd)), np.zeros((n_pts, dd, dd))
    mus_s = np.empty_like(mus)
    rs_s = np.empty_like(rs)
    r_pred = np.empty((dd, dd))
    work = backward_work(dd)
    mus_s[n_pts - 1] = mus[n_pts - 1]
    rs_s[n_pts - 1] = rs[n_pts - 1]
    for n in range(n_pts - 1, 0, -1):
        kernel = BackwardKernel(gs[n], ds[n], lams[n])
        backward_kernel(mus[n - 1], rs[n - 1], new_step(ts[n] - ts[n - 1], kappas[n], q), rq, q, d, r_pred, kernel,
                        work)
        push_through_kernel(kernel, mus_s[n], rs_s[n], mus_s[n - 1], rs_s[n - 1])
    return mus_s, rs_s, BackwardKernel(gs, ds, lams)


@vectorised_entry_point
def sample_backward(mu_last, r_last, kernels: BackwardKernel, z):
    """Joint samples of the grid states, ``z`` standard normal of shape ``(n, N, D)``."""
    gs, ds, lams = kernels
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


@vectorised_entry_point
def interpolate(t, ts, mus, rs, kappas, smoothed, rq: np.ndarray, q: int, d: int, out):
    """Smoothed posterior ``out = (mean, root)`` at a time ``t`` inside the grid (Bosch, 2024, PhD thesis).

    ``smoothed = (means, roots)`` on the grid.
    """
    mus_s, rs_s = smoothed
    mu_out, r_out = out
    n = np.searchsorted(ts, t)
    if n < ts.shape[0] and ts[n] == t:
        mu_out[:] = mus_s[n]
        r_out[:, :] = rs_s[n]
        return
    dd = (q + 1) * d
    work = backward_work(dd)
    # Filter prediction from t_{n-1} to t ...
    step = new_step(t - ts[n - 1], kappas[n], q)
    mu_t = np.empty(dd)
    apply_transition(step, q, d, mus[n - 1], mu_t)
    r_t = np.empty((dd, dd))
    predict_root(rs[n - 1], step, rq, q, d, work.stack, r_t)
    # ... then condition on the smoothed state at t_n through the kernel x(t) | x(t_n).
    kernel = BackwardKernel(np.empty((dd, dd)), np.empty(dd), np.empty((dd, dd)))
    backward_kernel(mu_t, r_t, new_step(ts[n] - t, kappas[n], q), rq, q, d, np.empty((dd, dd)), kernel, work)
    push_through_kernel(kernel, mus_s[n], rs_s[n], mu_out, r_out)
