"""Fenrir marginal likelihood kernel with an exact reverse-mode gradient (Tronarp, Bosch & Hennig, 2022).

1. An EK0/EK1 ODE filter with fixed diffusion ``κ`` and exact initialisation runs forward over a
   grid that contains every observation time.
2. A Kalman filter runs *backwards in time* on the backward-kernel representation of the filter
   posterior, conditioning on the data; the prediction-error decomposition gives one
   log-likelihood term per observation time.

Values use square-root (QR) forms throughout. The gradient of ``cotangent · terms`` is one reverse
sweep: the adjoint of the backward Kalman filter runs forward in time and deposits adjoints on the
ODE filter's posterior means and covariances; the ODE filter's adjoint then runs backward. Adjoints
are carried for *covariances*, computed from the stored square roots, so no QR factor is
differentiated (its derivative needs an invertible R; the posterior after a noiseless ODE update
is singular). The adjoint of a Kalman update is written in Joseph-type form ``Σ̄⁻ = Bᵀ Σ̄⁺ B + …``
with ``B = I − K H``.

(A forward-only alternative, ``log p(y | z) = log p(y, z) − log p(z)`` with two forward filters, is
cheaper but cancels catastrophically when ``κ`` is small: both evidences grow like ``1/κ``.)
"""

from __future__ import annotations

import functools
import math

import numba as nb
import numpy as np

from pymc_pnode._codegen import MAT_FN, TEN2_FN, TEN_FN, VEC_FN
from pymc_pnode.filtering.linalg import (
    JIT,
    all_finite,
    cholesky_inplace,
    copy_transposed,
    matmul,
    matmul_tn,
    slp_vectorization,
    solve_gram_inplace,
    solve_lower,
    tria_cols_inplace,
)
from pymc_pnode.filtering.odefilter import (
    DIFFUSION_FIXED,
    DIFFUSION_GLOBAL,
    DIFFUSION_LOCAL,
    STATUS_DIVERGED,
    STATUS_NONFINITE,
    STATUS_SUCCESS,
    apply_transition,
    control_step,
    fill_root_transition_t,
    fixed_step_failed,
    grow_rows,
    initial_step_size,
    local_defect_covariance,
    local_error,
    local_error_work,
    preconditioner,
    predict_root,
    propose_step,
    quadratic_form_inverse,
    transition_coefficients,
    update_sqrt,
)

_LOG_2PI = math.log(2.0 * math.pi)
# Smallest calibrated diffusion: a field the prior solves exactly (ẑ = 0) would otherwise give κ̂ = 0
# and singular predicted covariances in the backward kernels.
KAPPA_FLOOR = 1e-150


@nb.njit(**JIT)
def _half_logdet_upper(m, n):
    s = 0.0
    for k in range(n):
        s += math.log(abs(m[k, k]))
    return s


@nb.njit(**JIT)
def _data_update_sqrt(mean, root, cmat, idx, mo, yrow, sigma, mm, wv, mean_out, root_out, resid):
    """Condition ``N(mean, rootᵀ root)`` on ``y = C x + N(0, diag σ²)`` (observed rows ``idx[:mo]``).

    Returns the log-density of the observation; ``resid`` receives ``C x̄ − y``.
    """
    dd = mean.shape[0]
    d = cmat.shape[1]
    # mm holds the transposed stack [[root Cᵀ, root], [diag σ, 0]]: mm[j] is its column j
    mm[:, :] = 0.0
    for r in range(mo):
        s = -yrow[idx[r]]
        for c in range(d):
            s += cmat[idx[r], c] * mean[c]
        resid[r] = s
    for r in range(mo):
        col = mm[r]
        for row in range(dd):
            s = 0.0
            for c in range(d):
                s += root[row, c] * cmat[idx[r], c]
            col[row] = s
        col[dd + r] = sigma[idx[r]]
    for c in range(dd):
        col = mm[mo + c]
        for row in range(dd):
            col[row] = root[row, c]
    tria_cols_inplace(mm, dd + mo, mo + dd, mm[mm.shape[0] - 1])
    solve_lower(mm, mo, resid, wv)
    quad = 0.0
    for r in range(mo):
        quad += wv[r] * wv[r]
    for c in range(dd):
        s = 0.0
        for r in range(mo):
            s += mm[mo + c, r] * wv[r]
        mean_out[c] = mean[c] - s
    for row in range(dd):
        for c in range(dd):
            root_out[row, c] = mm[mo + c, mo + row]
    return -0.5 * quad - _half_logdet_upper(mm, mo) - 0.5 * mo * _LOG_2PI


@nb.njit(**JIT)
def _at_x_a(a, q, d, x, work, out):
    """``out = Aᵀ X A`` for the IWP transition ``A = Ã ⊗ I_d`` with ``Ã_ij = a[j − i]`` (j ≥ i)."""
    dd = (q + 1) * d
    for i in range(q + 1):
        for k in range(d):
            for c in range(dd):
                s = 0.0
                for ip in range(i + 1):
                    s += a[i - ip] * x[ip * d + k, c]
                work[i * d + k, c] = s
    for row in range(dd):
        for j in range(q + 1):
            for k in range(d):
                s = 0.0
                for jp in range(j + 1):
                    s += work[row, jp * d + k] * a[j - jp]
                out[row, j * d + k] = s


@nb.njit(**JIT)
def _at_v(a, q, d, v, out):
    """``out = Aᵀ v``."""
    for i in range(q + 1):
        for k in range(d):
            s = 0.0
            for ip in range(i + 1):
                s += a[i - ip] * v[ip * d + k]
            out[i * d + k] = s


@nb.njit(**JIT)
def _noise_inner(x, rq, tvec, q, d):
    """``⟨X, Q(h)⟩`` for the unit-diffusion process noise ``Q = (T Q̄ T) ⊗ I_d``."""
    s = 0.0
    for i in range(q + 1):
        for j in range(q + 1):
            qij = 0.0
            for r in range(q + 1):
                qij += rq[r, i] * rq[r, j]
            qij *= tvec[i] * tvec[j]
            tr = 0.0
            for k in range(d):
                tr += x[i * d + k, j * d + k]
            s += qij * tr
    return s


@nb.njit(**JIT)
def _local_kappa_adjoint(kbar, rq, tvec, lin, zhat, q, d, work, zbar, jbar):
    """Adjoint of the local diffusion ``κ = ẑᵀ C⁻¹ ẑ / d``, ``C = H Q(h) Hᵀ``, ``H = E1 − L E0``.

    With ``β = C⁻¹ ẑ``: ``ẑ̄ = 2 κ̄ β / d`` and, through ``C̄ = −κ̄ ββᵀ / d`` and ``H̄ = 2 C̄ H Q``,
    ``L̄ = (2 κ̄ / d) β βᵀ (Hᵀ… )`` restricted to the ``E0`` columns. Writes ``zbar`` (d) and ``jbar``
    (d, d); ``work`` is a :class:`~pymc_pnode.filtering.odefilter.LocalErrorWork`.
    """
    local_defect_covariance(rq, tvec, lin, q, d, work.hqh_root, work.hqh)
    # Cholesky factor L of C in work.chol and L⁻¹ ẑ in work.tmp; then β = L⁻ᵀ (L⁻¹ ẑ) in place.
    chol = work.chol
    beta = work.tmp
    if not math.isfinite(quadratic_form_inverse(work.hqh, zhat, d, chol, beta)):
        zbar[:] = 0.0
        jbar[:, :] = 0.0
        return
    for i in range(d - 1, -1, -1):
        v = beta[i]
        for k in range(i + 1, d):
            v -= chol[k, i] * beta[k]
        beta[i] = v / chol[i, i]
    scale = 2.0 * kbar / d
    for k in range(d):
        zbar[k] = scale * beta[k]
    # (Hᵀ-root)ᵀ M restricted to E0: u[l, a] = Σ_i B[(i, a), l] rq[i, 0] T_0, with B = M Hᵀ.
    for a in range(d):
        s = 0.0
        for l in range(d):
            u = 0.0
            for i in range(q + 1):
                u += work.hqh_root[i * d + a, l] * rq[i, 0]
            s += beta[l] * u * tvec[0]
        for k in range(d):
            jbar[k, a] = scale * beta[k] * s


@nb.njit(**JIT)
def _predict_and_linearise(rhs, jac_y, ek1, theta, t, a, q, d, mu_prev, mu_pred, xi, fx, jac, lin, zhat):
    """Predicted mean ``μ⁻ = A μ`` and the EK0/EK1 linearisation at ``ξ = E0 μ⁻``: ``L`` (``lin``) and the
    residual ``ẑ = E1 μ⁻ − f(ξ)``. ``jac`` keeps zeros for EK0."""
    apply_transition(a, q, d, mu_prev, mu_pred)
    for c in range(d):
        xi[c] = mu_pred[c]
    rhs(xi, t, theta, fx)
    if ek1:
        jac_y(xi, t, theta, jac)
    for r_ in range(d):  # grown rows are uninitialised: write the zeros of EK0 too
        for c in range(d):
            lin[r_, c] = jac[r_, c]
    for c in range(d):
        zhat[c] = mu_pred[d + c] - fx[c]


@nb.njit(**JIT)
def _spd_inverse(s, n, inv, work):
    """``inv[:n, :n] = s[:n, :n]⁻¹`` by Cholesky; False if not positive definite."""
    for i in range(n):
        for j in range(n):
            work[i, j] = s[i, j]
    if not cholesky_inplace(work, n):
        return False
    # inv = L⁻ᵀ L⁻¹, column by column
    for col in range(n):
        for i in range(n):
            v = 1.0 if i == col else 0.0
            for k in range(i):
                v -= work[i, k] * inv[k, col]
            inv[i, col] = v / work[i, i]
        for i in range(n - 1, -1, -1):
            v = inv[i, col]
            for k in range(i + 1, n):
                v -= work[k, i] * inv[k, col]
            inv[i, col] = v / work[i, i]
    return True


@nb.njit(**JIT)
def _update_adjoint(sp, spost, hm, mo, nv, r, mu_pred, wq, wl, mbar, sbar, want_h, hbar, rbar, sdiag, wk, wm, wv):
    """Adjoint of ``μ⁺ = μ⁻ − K r``, ``Σ⁺ = Σ⁻ − K S Kᵀ`` and ``−½ (wq rᵀS⁻¹r + wl log|S|)``.

    ``wq = wl = w`` is the adjoint of ``w · log N(r; 0, S)`` (up to a constant); ``wq = −2c, wl = 0``
    that of ``c · rᵀS⁻¹r``, the calibration statistic.

    ``S = H Σ⁻ Hᵀ + diag(nv)``, ``K = Σ⁻ Hᵀ S⁻¹``, residual ``r = H μ⁻ + c``. On entry ``mbar``,
    ``sbar`` (symmetric) hold the adjoints of ``μ⁺, Σ⁺``; on exit those of ``μ⁻, Σ⁻``. Outputs:
    ``rbar`` (adjoint of ``r``, i.e. of ``c``), ``sdiag`` (diagonal of ``S̄``, for the noise) and, if
    ``want_h``, ``hbar`` (adjoint of ``H``; needs ``spost = Σ⁺``). Returns False if ``S`` is singular.
    Work arrays: ``wk`` (4, D, m), ``wm`` (4, m, m), ``wv`` (4, max(D, m)).
    """
    dd = sp.shape[0]
    u, kg, t1, mh_t = wk[0], wk[1], wk[2], wk[3]
    smat, sinv, mmat, work = wm[0], wm[1], wm[2], wm[3]
    bm, v, alpha, kr = wv[0], wv[1], wv[2], wv[3]
    # U = Σ⁻ Hᵀ, S = H U + R
    for a_ in range(dd):
        for i in range(mo):
            s = 0.0
            for b in range(dd):
                s += sp[a_, b] * hm[i, b]
            u[a_, i] = s
    for i in range(mo):
        for j in range(mo):
            s = nv[i] if i == j else 0.0
            for b in range(dd):
                s += hm[i, b] * u[b, j]
            smat[i, j] = s
    if not _spd_inverse(smat, mo, sinv, work):
        return False
    for i in range(mo):
        s = 0.0
        for j in range(mo):
            s += sinv[i, j] * r[j]
        alpha[i] = s
    for a_ in range(dd):
        for j in range(mo):
            s = 0.0
            for i in range(mo):
                s += u[a_, i] * sinv[i, j]
            kg[a_, j] = s
    # km = Kᵀ μ̄⁺ (kept in rbar for now), v = Hᵀ α, T1 = Σ̄⁺ K
    for i in range(mo):
        s = 0.0
        for a_ in range(dd):
            s += kg[a_, i] * mbar[a_]
        rbar[i] = s
    for b in range(dd):
        s = 0.0
        for i in range(mo):
            s += hm[i, b] * alpha[i]
        v[b] = s
    for a_ in range(dd):
        for j in range(mo):
            s = 0.0
            for b in range(dd):
                s += sbar[a_, b] * kg[b, j]
            t1[a_, j] = s
    # KᵀΣ̄⁺K and M = ½ w (ααᵀ − S⁻¹) + KᵀΣ̄⁺K; S̄ = M + sym(km αᵀ)
    for i in range(mo):
        for j in range(mo):
            s = 0.0
            for a_ in range(dd):
                s += kg[a_, i] * t1[a_, j]
            mmat[i, j] = 0.5 * (wq * alpha[i] * alpha[j] - wl * sinv[i, j]) + s
    for i in range(mo):
        sdiag[i] = mmat[i, i] + rbar[i] * alpha[i]
    # B^T μ̄⁺ = μ̄⁺ − Hᵀ km
    for b in range(dd):
        s = mbar[b]
        for i in range(mo):
            s -= hm[i, b] * rbar[i]
        bm[b] = s
    if want_h:
        # H̄ = −2 (Σ̄⁺K)ᵀ Σ⁺ − α (Σ⁺ μ̄⁺)ᵀ + (wq ααᵀ − wl S⁻¹) Uᵀ + km (K r)ᵀ + r̄ μ⁻ᵀ, r̄ = −wq α − km
        for a_ in range(dd):
            s = 0.0
            for i in range(mo):
                s += kg[a_, i] * r[i]
            kr[a_] = s
        for b in range(dd):
            s = 0.0
            for c in range(dd):
                s += spost[b, c] * mbar[c]
            work_b = s
            for i in range(mo):
                acc = -alpha[i] * work_b + rbar[i] * kr[b] + (-wq * alpha[i] - rbar[i]) * mu_pred[b]
                s2 = 0.0
                for c in range(dd):
                    s2 += t1[c, i] * spost[c, b]
                acc -= 2.0 * s2
                s3 = 0.0
                for j in range(mo):
                    s3 += (wq * alpha[i] * alpha[j] - wl * sinv[i, j]) * u[b, j]
                acc += s3
                hbar[i, b] = acc
    # Σ̄⁻ = Σ̄⁺ − T1 H − Hᵀ T1ᵀ + Hᵀ M H − ½ (bm vᵀ + v bmᵀ)   (in place, symmetric)
    for b in range(dd):
        for i in range(mo):
            s = 0.0
            for j in range(mo):
                s += mmat[i, j] * hm[j, b]
            mh_t[b, i] = s
    for a_ in range(dd):
        for b in range(a_, dd):
            s = sbar[a_, b] - 0.5 * (bm[a_] * v[b] + v[a_] * bm[b])
            for i in range(mo):
                s += hm[i, a_] * (mh_t[b, i] - t1[b, i]) - t1[a_, i] * hm[i, b]
            sbar[a_, b] = s
            sbar[b, a_] = s
    for b in range(dd):
        mbar[b] = bm[b] - wq * v[b]
    for i in range(mo):
        rbar[i] = -wq * alpha[i] - rbar[i]
    return True


@nb.njit(**JIT)
def _rts_adjoint(g, r_pred, sig_pred, mu_pred, m_next, sig_next, a, q, d, mbar, sbar, inj_mu, inj_sig,
                 gbar, ymat, work, pg, tmp_a, tmp_b):
    """Adjoint of one backward step ``m = μ + G (m⁺ − μ⁻)``, ``P = Σ + G (P⁺ − Σ⁻) Gᵀ``.

    ``G = Σ Aᵀ (Σ⁻)⁻¹`` with ``Σ⁻ = r_predᵀ r_pred = A Σ Aᵀ + κ Q``. On entry ``mbar, sbar`` are the
    adjoints of ``(m, P)``; on exit those of ``(m⁺, P⁺)``. The adjoints with respect to the ODE
    filter's ``(μ, Σ)`` are added to ``inj_mu, inj_sig`` (those through ``μ⁻ = A μ`` and
    ``Σ⁻`` already mapped back by ``A``); ``work`` receives ``Σ̄⁻`` (for the κ adjoint). ``gbar``,
    ``ymat``, ``pg``, ``tmp_a`` and ``tmp_b`` are work space.
    """
    dd = g.shape[0]
    # Ḡ = m̄ (m⁺ − μ⁻)ᵀ + 2 P̄ G (P⁺ − Σ⁻); P̄ G is kept in pg for Gᵀ P̄ G below
    matmul(sbar, g, pg)
    for i in range(dd):
        for j in range(dd):
            work[i, j] = sig_next[i, j] - sig_pred[i, j]
    matmul(pg, work, gbar)
    for i in range(dd):
        for j in range(dd):
            gbar[i, j] = mbar[i] * (m_next[j] - mu_pred[j]) + 2.0 * gbar[i, j]
    # ymat = Yᵀ = (Σ⁻)⁻¹ Ḡᵀ, i.e. Y = Ḡ (Σ⁻)⁻¹
    copy_transposed(gbar, dd, ymat, 0)
    solve_gram_inplace(r_pred, dd, ymat)
    # P̄⁺ = Gᵀ P̄ G (into gbar); Σ̄⁻ (into work) = −Gᵀ P̄ G − sym(Gᵀ Y), and sym(Gᵀ Y) = sym(Yᵀ G)
    matmul_tn(g, pg, gbar)
    matmul(ymat, g, work)
    for i in range(dd):
        for j in range(i, dd):
            p = 0.5 * (gbar[i, j] + gbar[j, i])
            s = 0.5 * (work[i, j] + work[j, i])
            gbar[i, j] = p
            gbar[j, i] = p
            work[i, j] = -p - s
            work[j, i] = -p - s
    # Σ̄ += P̄ + sym(Y A), where row (i, k) of (Y A)ᵀ = Aᵀ Yᵀ is Σ_{i' ≤ i} a[i − i'] Yᵀ[(i', k)]
    for i in range(dd):
        for j in range(dd):
            inj_sig[i, j] += sbar[i, j]
    for i in range(q + 1):
        for k in range(d):
            for row in range(dd):
                tmp_b[row] = 0.0
            for ip in range(i + 1):
                c = 0.5 * a[i - ip]
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
    for j in range(dd):
        mbar[j] = tmp_a[j]
    sbar[:, :] = gbar
    # μ̄⁻ = −Gᵀ m̄ and Σ̄⁻ reach (μ, Σ) through μ⁻ = A μ, Σ⁻ = A Σ Aᵀ + κ Q.
    _at_v(a, q, d, tmp_a, tmp_b)
    for j in range(dd):
        inj_mu[j] -= tmp_b[j]
    _at_x_a(a, q, d, work, gbar, ymat)
    for i in range(dd):
        for j in range(dd):
            inj_sig[i, j] += ymat[i, j]


@nb.njit(**JIT)
def _backward_step(mu_prev, r_prev, mu_pred, r_pred, a, tvec, sqrt_kappa, rq, q, d, mean, root, g, wt, gt, blk,
                   stack, mean_out):
    """Push ``N(mean, rootᵀ root)`` at ``t_n`` through the backward kernel of the filter posterior.

    The filter had ``N(mu_prev, r_prevᵀ r_prev)`` at ``t_{n−1}`` and predicted
    ``N(mu_pred, r_predᵀ r_pred)`` at ``t_n``. The gain ``G = Σ Aᵀ (Σ⁻)⁻¹`` comes from two triangular
    solves with the stored predicted root; the kernel covariance ``Λ = Σ − G Σ⁻ Gᵀ`` enters in Joseph
    form ``(I − G A) Σ (I − G A)ᵀ + κ G Q Gᵀ``, so one QR of a ``3D × D`` stack gives the new root
    (``G`` is written to ``g``, the new mean to ``mean_out``, the new root to ``root``). ``wt``,
    ``gt`` and ``blk`` are ``(D, D)`` work arrays, ``stack`` is ``(D + 1, 3D)`` (its last row is the
    QR's work vector).

    The products and solves work on whole rows or keep several independent sums (no serial chain
    per entry), which made this step ≈ 1.6× faster than row-by-row triangular solves and dot products.
    """
    dd = (q + 1) * d
    fill_root_transition_t(r_prev, a, q, d, wt)  # wt = (R Aᵀ)ᵀ
    # Gᵀ = (Σ⁻)⁻¹ A Σ with A Σ = wt R and Σ⁻ = r_predᵀ r_pred
    matmul(wt, r_prev, gt)
    solve_gram_inplace(r_pred, dd, gt)
    copy_transposed(gt, dd, g, 0)
    for i in range(dd):
        mean_out[i] = mu_prev[i]
    for j in range(dd):
        dj = mean[j] - mu_pred[j]
        gj = gt[j]
        for i in range(dd):
            mean_out[i] += gj[i] * dj
    # The stack is built transposed (stack[c] is its column c): rows 0..dd hold root Gᵀ, rows dd..2dd
    # R (I − G A)ᵀ = R − w Gᵀ (w = R Aᵀ), rows 2dd..3dd √κ (Q̄^{1/2} T ⊗ I) Gᵀ; each block is formed in blk.
    matmul(root, gt, blk)
    copy_transposed(blk, dd, stack, 0)
    matmul_tn(wt, gt, blk)
    for i in range(dd):
        for j in range(dd):
            stack[j, dd + i] = r_prev[i, j] - blk[i, j]
    for i in range(q + 1):
        for k in range(d):
            bi = blk[i * d + k]
            for j in range(dd):
                bi[j] = 0.0
            for jj in range(q + 1):
                c = sqrt_kappa * rq[i, jj] * tvec[jj]
                gk = gt[jj * d + k]
                for j in range(dd):
                    bi[j] += c * gk[j]
    copy_transposed(blk, dd, stack, 2 * dd)
    tria_cols_inplace(stack, 3 * dd, dd, stack[dd])
    copy_transposed(stack, dd, root, 0)


_FENRIR_SIG = (
    VEC_FN, MAT_FN, MAT_FN, TEN_FN, TEN_FN, MAT_FN, TEN2_FN,
    nb.float64[::1], nb.float64[::1], nb.float64[:, ::1], nb.boolean,
    nb.float64, nb.float64[::1], nb.int64[::1], nb.float64[:, ::1], nb.float64[:, ::1],
    nb.float64[::1], nb.int64[::1], nb.int64, nb.boolean, nb.float64[::1], nb.int64, nb.boolean, nb.float64,
    nb.float64, nb.int64,
)


@functools.lru_cache(maxsize=None)
def fenrir_kernel(q: int, d: int):
    """The Fenrir kernel ``fenrir_terms`` compiled for IWP order ``q`` and ``d`` states.

    The sizes are closure constants, so numba compiles (and caches on disk) one kernel per
    ``(q, d)``: with the helpers inlined (``linalg.JIT``), LLVM sees fixed trip counts in every
    small dense loop, unrolls them and, with ``slp_vectorization``, turns them into vector
    instructions. Compiling a new ``(q, d)`` takes ≈ 35 s once.
    """

    def fenrir_terms(
        rhs, jac_y, jac_p, hess_yy, hess_yp, taylor, taylor_jac,
        y0, theta, rq, ek1, kappa, stops, stop_obs, data, cmat, sigma, sigma_dir, n_sigma, want_grad, cotangent,
        diffusion_mode, adaptive, rtol, atol, max_steps,
    ):
        """Per-observation Fenrir log-likelihood terms and, optionally, a vector–Jacobian product.

        The solver steps from ``stops[0]`` through every entry of ``stops``; ``stop_obs[j]`` is the
        data row observed at ``stops[j]`` (or -1). Without ``adaptive`` the stops are the grid. With
        ``adaptive`` the steps in between are chosen by the local error estimate and the PI
        controller of :func:`~pymc_pnode.filtering.odefilter.run_filter` at ``rtol``/``atol`` (at
        most ``max_steps`` accepted steps); the gradient is that of the computation on the chosen
        grid. ``data`` rows may contain NaN
        (missing components are skipped); the observation is ``data[i] = cmat @ y(t_i) + noise`` with
        independent noise of standard deviation ``sigma[c]`` per component ``c``, which is parameter
        ``sigma_dir[c]`` of ``n_sigma``. With ``want_grad`` the gradient of ``cotangent · terms`` with
        respect to ``(y0, θ, noise scales, κ)`` is returned (reverse mode).

        ``diffusion_mode`` (``odefilter.DIFFUSION_*``): ``FIXED`` uses the argument ``κ``. ``GLOBAL``
        ignores it: the filter runs at unit diffusion, ``κ̂ = Σ_n ẑ_nᵀ S_n⁻¹ ẑ_n / (N d)`` (the global
        quasi-MLE of Tronarp et al., 2019, Prop. 4; Bosch et al., 2021, eq. 16) rescales its
        covariances, and the gradient includes the path through ``κ̂`` (a second adjoint sweep of the
        ODE filter with cotangent ``∂L/∂κ · ∂κ̂/∂stat``). ``LOCAL`` ignores it too: a first pass at unit
        diffusion (which also chooses the grid) gives each step's local quasi-MLE
        ``κ_n = ẑ_nᵀ (H_n Q(h_n) H_nᵀ)⁻¹ ẑ_n / d`` (Schober et al., 2019; Bosch et al., 2021, eq. 21),
        and a second pass runs the filter with ``κ_n Q(h_n)``; the gradient runs through both passes.
        (Estimating κ_n inside the filter it scales makes the likelihood a rough function of θ.)
        In both calibrated modes the κ entry of the gradient is zero.

        Every step's scaled local error estimate (:func:`~pymc_pnode.filtering.odefilter.local_error`
        at ``rtol``, ``atol``) is computed; its maximum over the grid is reported.

        Returns ``(terms, grad, ok, info, grid)`` with the solver grid and ``info = [largest scaled local
        error of an accepted step, κ used, accepted steps, rejected steps, status]`` (status codes of ``odefilter``);
        ``ok`` is False when the solve failed: non-finite values, a fixed step that fails
        :func:`~pymc_pnode.filtering.odefilter.fixed_step_failed`, ``max_steps`` reached or a
        collapsing step.
        """
        k = theta.shape[0]
        dd = (q + 1) * d
        n_obs, m = data.shape
        n_dir = d + k + n_sigma + 1
        terms = np.zeros(n_obs)
        grad = np.zeros(n_dir)
        info = np.zeros(5)
        mmax = max(m, d)
        n_seen = np.zeros(n_obs, dtype=np.int64)
        idx_all = np.zeros((n_obs, m), dtype=np.int64)
        for i in range(n_obs):
            for c in range(m):
                if not math.isnan(data[i, c]):
                    idx_all[i, n_seen[i]] = c
                    n_seen[i] += 1

        # ---------------------------------------------------------------- forward ODE filter
        # Steps land on every stop; with error control the steps in between are chosen by the local
        # error estimate and the PI controller of pn.solve (rejected steps cost no QR).
        n_stops = stops.shape[0]
        cap = n_stops if not adaptive else max(64, 2 * n_stops)
        grid = np.empty(cap)
        obs_at = np.empty(cap, dtype=np.int64)
        mu_pa = np.empty((cap, dd))  # predicted
        r_pa = np.empty((cap, dd, dd))  # every slot written before use (index 0 unused)
        mu_fa = np.empty((cap, dd))  # filtered
        r_fa = np.empty((cap, dd, dd))
        r_fa[0] = 0.0  # exact initialisation: Σ₀ = 0
        lin = np.zeros((cap, d, d))  # linearisation L (J for EK1, 0 for EK0)
        za = np.empty((cap, d))
        # transition and preconditioner coefficients of the step ending at grid[n], for all four sweeps
        a_all = np.empty((cap, q + 1))
        t_all = np.empty((cap, q + 1))
        # the diffusion of the step ending at grid[n] in the filter the data see (local calibration: the κ_n
        # of the unit-diffusion pass, which itself runs at κ = 1)
        kap_all = np.empty(cap)
        grid[0] = stops[0]
        obs_at[0] = stop_obs[0]
        coeffs = np.empty((q + 1, d))
        taylor(y0, stops[0], theta, coeffs)
        for i in range(q + 1):
            for c in range(d):
                mu_fa[0, i * d + c] = coeffs[i, c]
        if not all_finite(mu_fa[0]):
            return terms, grad, False, info, grid[:1]
        m_pred = np.empty((dd + 1, 2 * dd))
        m_upd = np.empty((d + dd + 1, dd))
        wvec = np.empty(max(d, m))
        fx = np.empty(d)
        jac = np.zeros((d, d))
        xi = np.empty(d)
        calibrate = diffusion_mode == DIFFUSION_GLOBAL
        local = diffusion_mode == DIFFUSION_LOCAL
        if diffusion_mode != DIFFUSION_FIXED:
            kappa = 1.0
        stat_sum = 0.0
        err_work = local_error_work(q, d)
        max_err = 0.0
        n_rej = 0
        h = math.inf
        err_prev = 1e-4
        if adaptive:
            h = min(initial_step_size(rhs, y0, stops[0], theta, rtol, atol), stops[n_stops - 1] - stops[0])
        t = stops[0]
        next_stop = 1
        n = 0  # accepted steps; the state at grid[n] is the last one
        while next_stop < n_stops:
            h_try, hit_stop, status = propose_step(t, h, stops[next_stop], n, max_steps)
            if status != STATUS_SUCCESS:
                info[4] = status
                return terms, grad, False, info, grid[:1]
            t_new = stops[next_stop] if hit_stop else t + h_try
            if n + 1 >= cap:
                cap *= 2
                grid, obs_at = grow_rows(grid, cap), grow_rows(obs_at, cap)
                mu_pa, r_pa, mu_fa, r_fa = grow_rows(mu_pa, cap), grow_rows(r_pa, cap), grow_rows(mu_fa, cap), \
                    grow_rows(r_fa, cap)
                lin, za, a_all, t_all = grow_rows(lin, cap), grow_rows(za, cap), grow_rows(a_all, cap), \
                    grow_rows(t_all, cap)
                kap_all = grow_rows(kap_all, cap)
            p = n + 1  # the slot of the step's results
            a = a_all[p]
            tvec = t_all[p]
            if n > 0 and h_try == grid[n] - grid[n - 1]:  # equal steps: skip the powers and factorials
                a[:] = a_all[n]
                tvec[:] = t_all[n]
            else:
                transition_coefficients(h_try, q, a)
                preconditioner(h_try, q, tvec)
            _predict_and_linearise(rhs, jac_y, ek1, theta, t_new, a, q, d, mu_fa[n], mu_pa[p], xi, fx, jac, lin[p],
                                   za[p])
            err, local_kappa = local_error(rq, tvec, lin[p], za[p], h_try, mu_fa[n], mu_pa[p], rtol, atol, q, d,
                                           err_work)
            if adaptive:
                accepted, h, err_prev = control_step(err, h_try, h, err_prev, hit_stop, q)
                if not accepted:
                    n_rej += 1
                    continue
            max_err = max(max_err, err)
            kap_all[p] = kappa
            if local:
                kap_all[p] = local_kappa if math.isfinite(local_kappa) and local_kappa > KAPPA_FLOOR else KAPPA_FLOOR
            predict_root(r_fa[n], a, tvec, math.sqrt(kappa), rq, q, d, m_pred, r_pa[p])
            stat_sum += update_sqrt(r_pa[p], mu_pa[p], lin[p], za[p], q, d, m_upd, wvec, mu_fa[p], r_fa[p])
            if not (all_finite(mu_fa[p]) and all_finite(r_fa[p])):
                info[4] = STATUS_NONFINITE
                return terms, grad, False, info, grid[:1]
            if not adaptive:
                # A fixed step that no longer approximates the solution (past a blow-up, outside the
                # stability region) makes the likelihood -inf instead of a finite wrong number.
                for c in range(d):
                    xi[c] = mu_fa[p, c]
                rhs(xi, t_new, theta, fx)
                if fixed_step_failed(h_try, mu_fa[n], mu_pa[p], mu_fa[p], fx, d):
                    info[4] = STATUS_DIVERGED
                    return terms, grad, False, info, grid[:1]
            n = p
            t = t_new
            grid[n] = t_new
            obs_at[n] = -1
            if hit_stop:
                obs_at[n] = stop_obs[next_stop]
                next_stop += 1
        n_pts = n + 1
        info[2] = n
        info[3] = n_rej
        info[0] = max_err
        if calibrate:
            # Covariances of a filter with Σ₀ = 0 scale with κ and its means do not: rescale post hoc.
            kappa = stat_sum / ((n_pts - 1) * d) if n_pts > 1 else 1.0
            if not math.isfinite(kappa):
                return terms, grad, False, info, grid[:1]
            kappa = max(kappa, KAPPA_FLOOR)
            sqrt_kappa = math.sqrt(kappa)
            for n in range(1, n_pts):
                kap_all[n] = kappa
                for r_ in range(dd):
                    for c in range(dd):
                        r_pa[n, r_, c] *= sqrt_kappa
                        r_fa[n, r_, c] *= sqrt_kappa
        info[1] = kappa
        # Local calibration, second pass: the filter again over the grid with κ_n from the unit-diffusion
        # pass. Computing κ_n inside the filter it scales (one pass) feeds each κ_n back into the next
        # residuals; the likelihood then jumps by ~1e-3 nats under 1e-7 changes of θ and NUTS fails.
        mu_pa1, r_pa1, r_fa1, lin1, za1 = mu_pa, r_pa, r_fa, lin, za
        if local:
            mu_fa1 = mu_fa
            mu_pa, r_pa = np.empty((n_pts, dd)), np.empty((n_pts, dd, dd))
            mu_fa, r_fa = np.empty((n_pts, dd)), np.empty((n_pts, dd, dd))
            lin, za = np.zeros((n_pts, d, d)), np.empty((n_pts, d))
            mu_fa[0] = mu_fa1[0]
            r_fa[0] = 0.0
            for p in range(1, n_pts):
                _predict_and_linearise(rhs, jac_y, ek1, theta, grid[p], a_all[p], q, d, mu_fa[p - 1], mu_pa[p], xi,
                                       fx, jac, lin[p], za[p])
                predict_root(r_fa[p - 1], a_all[p], t_all[p], math.sqrt(kap_all[p]), rq, q, d, m_pred, r_pa[p])
                update_sqrt(r_pa[p], mu_pa[p], lin[p], za[p], q, d, m_upd, wvec, mu_fa[p], r_fa[p])
                if not (all_finite(mu_fa[p]) and all_finite(r_fa[p])):
                    info[4] = STATUS_NONFINITE
                    return terms, grad, False, info, grid[:1]

        # ---------------------------------------------------------------- backward Kalman filter on data
        n_store = n_pts if want_grad else 1
        m_pre = np.empty((n_store, dd))  # before the data at grid[n]
        r_pre = np.empty((n_store, dd, dd))
        m_post = np.empty((n_store, dd))  # after it
        r_post = np.empty((n_store, dd, dd))
        gs = np.empty((n_store, dd, dd))
        mean = mu_fa[n_pts - 1].copy()
        root = r_fa[n_pts - 1].copy()
        mean2 = np.empty(dd)
        root2 = np.empty((dd, dd))
        mm = np.empty((m + dd + 1, dd + m))  # the last row is the QR's work vector
        resid = np.empty(m)
        g = np.empty((dd, dd))
        work_w = np.empty((dd, dd))
        work_gt = np.empty((dd, dd))
        work_blk = np.empty((dd, dd))
        stack = np.empty((dd + 1, 3 * dd))
        for n in range(n_pts - 1, -1, -1):
            if want_grad:
                m_pre[n] = mean
                r_pre[n] = root
            i = obs_at[n]
            if i >= 0 and n_seen[i] > 0:
                terms[i] = _data_update_sqrt(mean, root, cmat, idx_all[i], n_seen[i], data[i], sigma, mm, wvec,
                                             mean2, root2, resid)
                mean[:] = mean2
                root[:, :] = root2
            if want_grad:
                m_post[n] = mean
                r_post[n] = root
            if n == 0:
                break
            a = a_all[n]
            tvec = t_all[n]
            _backward_step(mu_fa[n - 1], r_fa[n - 1], mu_pa[n], r_pa[n], a, tvec, math.sqrt(kap_all[n]), rq, q, d,
                           mean, root,
                           g, work_w, work_gt, work_blk, stack, mean2)
            if want_grad:
                gs[n] = g
            mean[:] = mean2
            if not (all_finite(mean) and all_finite(root)):
                return terms, grad, False, info, grid[:1]
        for i in range(n_obs):
            if not math.isfinite(terms[i]):
                return terms, grad, False, info, grid[:1]
        if not want_grad:
            return terms, grad, True, info, grid[:n_pts]

        # ---------------------------------------------------------------- reverse sweep, part 1:
        # adjoint of the backward Kalman filter (forward in time); deposits on the ODE filter's (μ_n, Σ_n).
        sig_off = d + k
        kdir = n_dir - 1
        kbar_step = np.zeros(n_pts)  # part 1's adjoint of each step's diffusion
        inj_mu = np.zeros((n_pts, dd))
        inj_sig = np.zeros((n_pts, dd, dd))
        mbar = np.zeros(dd)
        sbar = np.zeros((dd, dd))
        sig_pred = np.empty((dd, dd))
        sig_next = np.empty((dd, dd))
        sig_pa = np.empty((n_pts, dd, dd))  # predicted covariances r_paᵀ r_pa, reused by part 2
        hm = np.zeros((mmax, dd))
        nv = np.zeros(mmax)
        rvec = np.empty(mmax)
        rbar = np.empty(mmax)
        sdiag = np.empty(mmax)
        hbar = np.zeros((mmax, dd))
        wk = np.empty((4, dd, mmax))
        wm = np.empty((4, mmax, mmax))
        wv = np.empty((4, max(dd, mmax)))
        gbar = np.empty((dd, dd))
        ymat = np.empty((dd, dd))
        work = np.empty((dd, dd))
        pg = np.empty((dd, dd))
        tmp_a = np.empty(dd)
        tmp_b = np.empty(dd)
        for n in range(n_pts):
            i = obs_at[n]
            if i >= 0 and n_seen[i] > 0:
                mo = n_seen[i]
                matmul_tn(r_pre[n], r_pre[n], sig_pred)
                for r_ in range(mo):
                    c_obs = idx_all[i, r_]
                    for b in range(dd):
                        hm[r_, b] = cmat[c_obs, b] if b < d else 0.0
                    nv[r_] = sigma[c_obs] * sigma[c_obs]
                    v = -data[i, c_obs]
                    for c in range(d):
                        v += cmat[c_obs, c] * m_pre[n, c]
                    rvec[r_] = v
                if not _update_adjoint(sig_pred, sig_next, hm, mo, nv, rvec, m_pre[n], cotangent[i], cotangent[i],
                                       mbar, sbar,
                                       False, hbar, rbar, sdiag, wk, wm, wv):
                    return terms, grad, False, info, grid[:1]
                for r_ in range(mo):
                    c_obs = idx_all[i, r_]
                    grad[sig_off + sigma_dir[c_obs]] += 2.0 * sigma[c_obs] * sdiag[r_]
            if n == n_pts - 1:
                for r_ in range(dd):
                    inj_mu[n, r_] += mbar[r_]
                    for c in range(dd):
                        inj_sig[n, r_, c] += sbar[r_, c]
                break
            # backward step n+1 → n
            a = a_all[n + 1]
            tvec = t_all[n + 1]
            matmul_tn(r_pa[n + 1], r_pa[n + 1], sig_pa[n + 1])
            matmul_tn(r_post[n + 1], r_post[n + 1], sig_next)
            _rts_adjoint(gs[n + 1], r_pa[n + 1], sig_pa[n + 1], mu_pa[n + 1], m_post[n + 1], sig_next, a, q, d, mbar,
                         sbar, inj_mu[n], inj_sig[n], gbar, ymat, work, pg, tmp_a, tmp_b)
            kbar_step[n + 1] = _noise_inner(work, rq, tvec, q, d)
            grad[kdir] += kbar_step[n + 1]

        # ---------------------------------------------------------------- reverse sweep, part 2:
        # adjoint of the ODE filter (backward in time). With global calibration a second sweep carries
        # the path through κ̂ = κ̂₀ Σ ẑᵀS_κ̂₀⁻¹ẑ / (N d): cotangent ∂L/∂κ · κ̂₀ / (N d) on every ẑᵀS⁻¹ẑ.
        # With local calibration the first sweep collects each step's κ̄_n (part 1's share plus
        # ⟨Σ̄⁻_n, Q_n⟩ after the update's adjoint) and the second sweep runs through the unit-diffusion
        # pass, where κ_n(ẑ_n, L_n) was computed.
        sig_post = np.empty((dd, dd))
        cbar = np.empty(d)
        lbar = np.empty((d, d))
        xbar = np.empty(d)
        jp = np.zeros((d, k))
        hyy = np.zeros((d, d, d))
        hyp = np.zeros((d, d, k))
        jtrue = np.zeros((d, d))
        zbar = np.zeros(d)
        jbar = np.zeros((d, d))
        ty = np.empty((q + 1, d, d))
        tp = np.empty((q + 1, d, k))
        for c in range(d):
            nv[c] = 0.0
        w_stat = 0.0
        kbar_local = np.zeros(n_pts)
        sig_cur = np.empty((dd, dd))
        n_sweeps = 2 if n_pts > 1 and ((calibrate and kappa > KAPPA_FLOOR) or local) else 1
        for sweep in range(n_sweeps):
            # the filter this sweep differentiates: the data's, or (local, second sweep) the unit pass
            s_mu_pa, s_r_pa, s_r_fa, s_lin, s_za = mu_pa, r_pa, r_fa, lin, za
            if sweep == 0:
                mbar_a = inj_mu[n_pts - 1].copy()
                sbar_a = inj_sig[n_pts - 1].copy()
            else:
                if calibrate:
                    w_stat = -2.0 * grad[kdir] * kappa / ((n_pts - 1) * d)
                else:
                    s_mu_pa, s_r_pa, s_r_fa, s_lin, s_za = mu_pa1, r_pa1, r_fa1, lin1, za1
                mbar_a = np.zeros(dd)
                sbar_a = np.zeros((dd, dd))
            for n in range(n_pts - 1, 0, -1):
                t = grid[n]
                for c in range(d):
                    xi[c] = s_mu_pa[n, c]
                hm[:, :] = 0.0
                for r_ in range(d):
                    hm[r_, d + r_] = 1.0
                    for c in range(d):
                        hm[r_, c] = -s_lin[n, r_, c]
                if ek1:
                    matmul_tn(s_r_fa[n], s_r_fa[n], sig_post)
                if sweep == 0:
                    sig_cur[:, :] = sig_pa[n]
                else:
                    matmul_tn(s_r_pa[n], s_r_pa[n], sig_cur)
                if not _update_adjoint(sig_cur, sig_post, hm, d, nv, s_za[n], s_mu_pa[n], w_stat, 0.0, mbar_a,
                                       sbar_a, ek1, hbar, rbar, sdiag, wk, wm, wv):
                    return terms, grad, False, info, grid[:1]
                a = a_all[n]
                tvec = t_all[n]
                kbar_n = _noise_inner(sbar_a, rq, tvec, q, d) if sweep == 0 else 0.0
                zbar[:] = 0.0
                jbar[:, :] = 0.0
                if not local:
                    grad[kdir] += kbar_n
                elif sweep == 0:
                    kbar_local[n] = kbar_step[n] + kbar_n
                elif kap_all[n] > KAPPA_FLOOR:
                    # κ_n = ẑᵀ(H Q Hᵀ)⁻¹ẑ / d with ẑ = E1 μ⁻ − f(ξ) of the unit pass: ẑ̄ and L̄ join its
                    # linearisation's adjoint.
                    _local_kappa_adjoint(kbar_local[n], rq, tvec, s_lin[n], s_za[n], q, d, err_work, zbar, jbar)
                # Linearisation: H = E1 − L E0 and c = −f(ξ) + L ξ, with ξ = E0 μ⁻.
                for c in range(d):
                    cbar[c] = rbar[c]
                    mbar_a[d + c] += zbar[c]
                jac_p(xi, t, theta, jp)
                for j in range(k):
                    s = 0.0
                    for c in range(d):
                        s -= jp[c, j] * (cbar[c] + zbar[c])
                    grad[d + j] += s
                if ek1:
                    hess_yy(xi, t, theta, hyy)
                    hess_yp(xi, t, theta, hyp)
                    for r_ in range(d):
                        for c in range(d):
                            lbar[r_, c] = -hbar[r_, c] + cbar[r_] * xi[c] + jbar[r_, c]
                    for e in range(d):
                        s = 0.0
                        for r_ in range(d):
                            s -= s_lin[n, r_, e] * zbar[r_]
                            for c in range(d):
                                s += lbar[r_, c] * hyy[r_, c, e]
                        xbar[e] = s
                    for j in range(k):
                        s = 0.0
                        for r_ in range(d):
                            for c in range(d):
                                s += lbar[r_, c] * hyp[r_, c, j]
                        grad[d + j] += s
                else:
                    jac_y(xi, t, theta, jtrue)
                    for e in range(d):
                        s = 0.0
                        for c in range(d):
                            s -= jtrue[c, e] * (cbar[c] + zbar[c])
                        xbar[e] = s
                for e in range(d):
                    mbar_a[e] += xbar[e]
                # Prediction μ⁻ = A μ, Σ⁻ = A Σ Aᵀ + κ Q(h), then the deposits of part 1 on (μ, Σ)_{n−1}.
                _at_v(a, q, d, mbar_a, tmp_a)
                _at_x_a(a, q, d, sbar_a, work, sig_pred)
                inject = 1.0 if sweep == 0 else 0.0
                for r_ in range(dd):
                    mbar_a[r_] = tmp_a[r_] + inject * inj_mu[n - 1, r_]
                    for c in range(dd):
                        sbar_a[r_, c] = sig_pred[r_, c] + inject * inj_sig[n - 1, r_, c]

            # Initial state: μ₀ = Taylor coefficients of (y0, θ), Σ₀ = 0.
            taylor_jac(y0, grid[0], theta, ty, tp)
            for i in range(q + 1):
                for c in range(d):
                    mb = mbar_a[i * d + c]
                    for j in range(d):
                        grad[j] += mb * ty[i, c, j]
                    for j in range(k):
                        grad[d + j] += mb * tp[i, c, j]
        if diffusion_mode != DIFFUSION_FIXED:
            grad[kdir] = 0.0  # the calibrated diffusion replaces the κ argument
        if not all_finite(grad):
            return terms, grad, False, info, grid[:1]
        return terms, grad, True, info, grid[:n_pts]

    with slp_vectorization():  # compiles now (explicit signature), or loads from the disk cache
        return nb.njit(_FENRIR_SIG, **JIT)(fenrir_terms)
