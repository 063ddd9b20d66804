"""Fenrir marginal likelihood kernel with exact forward-mode gradients (notes 002 §9.2–9.3).

1. An EK0/EK1 ODE filter with fixed diffusion ``κ`` and exact initialisation runs forward over a
   grid that contains every observation time.
2. A Kalman filter runs *backwards in time* on the backward-kernel representation of the filter
   posterior, conditioning on the data; the prediction-error decomposition gives one
   log-likelihood term per observation time.

Values use square-root (QR) forms throughout. Tangents for the handful of inputs
(``y0``, ``θ``, noise scales, ``κ``) are propagated in covariance form, computed from the stable
square-root values; this avoids differentiating QR (whose R-factor derivative needs an invertible R,
while the filter posterior after a noiseless update is singular; DESIGN.md).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from pymc_pnode._codegen import MAT_FN, TEN2_FN, TEN_FN, VEC_FN
from pymc_pnode.filtering.linalg import (
    all_finite,
    matmul,
    matmul_nt,
    sandwich,
    solve_lower_from_upper_t,
    tria_inplace,
)
from pymc_pnode.filtering.odefilter import (
    apply_transition,
    fill_process_noise,
    fill_transition_rows,
    preconditioner,
    transition_coefficients,
    update_sqrt,
)
from pymc_pnode.filtering.smoother import backward_kernel

_JIT = dict(cache=True, error_model="numpy", nogil=True)
_LOG_2PI = math.log(2.0 * math.pi)


@nb.njit(**_JIT)
def _transition_matrices(h, q, d, rq):
    """Dense ``A(h)`` and unit-diffusion ``Q(h)`` (derivative-major, ``⊗ I_d``)."""
    dd = (q + 1) * d
    a = np.empty(q + 1)
    tvec = np.empty(q + 1)
    transition_coefficients(h, q, a)
    preconditioner(h, q, tvec)
    amat = np.zeros((dd, dd))
    qmat = np.zeros((dd, dd))
    for i in range(q + 1):
        for j in range(q + 1):
            s = 0.0
            for r in range(q + 1):
                s += rq[r, i] * rq[r, j]
            s *= tvec[i] * tvec[j]
            for k in range(d):
                if j >= i:
                    amat[i * d + k, j * d + k] = a[j - i]
                qmat[i * d + k, j * d + k] = s
    return amat, qmat


_FENRIR_SIG = (
    VEC_FN, MAT_FN, MAT_FN, TEN_FN, TEN_FN, MAT_FN, TEN2_FN,
    nb.float64[::1], nb.float64[::1], nb.int64, nb.int64, nb.float64[:, ::1], nb.boolean,
    nb.float64, nb.float64[::1], nb.int64[::1], nb.float64[:, ::1], nb.float64[:, ::1],
    nb.float64[::1], nb.int64[::1], nb.int64, nb.boolean,
)


@nb.njit(_FENRIR_SIG, **_JIT)
def fenrir_terms(
    rhs, jac_y, jac_p, hess_yy, hess_yp, taylor, taylor_jac,
    y0, theta, q, d, rq, ek1, kappa, grid, obs_at, data, cmat, sigma, sigma_dir, n_sigma, want_grad,
):
    """Per-observation Fenrir log-likelihood terms and, optionally, their exact Jacobian.

    ``obs_at[n]`` is the data row observed at ``grid[n]`` (or -1); ``data`` rows may contain NaN
    (missing components are skipped); the observation is ``data[i] = cmat @ y(t_i) + noise`` with
    independent noise of standard deviation ``sigma[c]`` per component ``c``, whose tangent
    direction is ``sigma_dir[c]`` (of ``n_sigma``). Tangent directions: ``y0`` (d), ``θ`` (k),
    noise scales (``n_sigma``), ``κ`` (1).

    Returns ``(terms, jac, ok)``; ``ok`` is False when the solve produced non-finite values.
    """
    k = theta.shape[0]
    dd = (q + 1) * d
    n_pts = grid.shape[0]
    n_obs, m = data.shape
    n_dir = d + k + n_sigma + 1
    kdir = n_dir - 1
    terms = np.zeros(n_obs)
    jac = np.zeros((n_obs, n_dir))

    # ---------------------------------------------------------------- initialisation
    coeffs = np.empty((q + 1, d))
    taylor(y0, grid[0], theta, coeffs)
    mus = np.empty((n_pts, dd))
    rs = np.zeros((n_pts, dd, dd))
    mus[0] = coeffs.reshape(dd)
    if not all_finite(mus[0]):
        return terms, jac, False
    n_store = n_pts if want_grad else 1
    dmus = np.zeros((n_store, n_dir, dd))
    dsig = np.zeros((n_store, n_dir, dd, dd))
    if want_grad:
        ty = np.empty((q + 1, d, d))
        tp = np.empty((q + 1, d, k))
        taylor_jac(y0, grid[0], theta, ty, tp)
        for i in range(q + 1):
            for c in range(d):
                for j in range(d):
                    dmus[0, j, i * d + c] = ty[i, c, j]
                for j in range(k):
                    dmus[0, d + j, i * d + c] = tp[i, c, j]

    a = np.empty(q + 1)
    tvec = np.empty(q + 1)
    mu_p = np.empty(dd)
    m_pred = np.empty((2 * dd, dd))
    m_upd = np.empty((dd, d + dd))
    fx = np.empty(d)
    jlin = np.zeros((d, d))
    jtrue = np.zeros((d, d))
    jp = np.zeros((d, k))
    hyy = np.zeros((d, d, d))
    hyp = np.zeros((d, d, k))
    zhat = np.empty(d)
    w = np.empty(d)
    hmat = np.zeros((d, dd))
    dh = np.zeros((d, dd))
    sig_p = np.empty((dd, dd))
    sig_post = np.empty((dd, dd))
    u = np.empty((dd, d))
    gain = np.empty((dd, d))
    proj = np.empty((dd, dd))
    work = np.empty((dd, dd))
    dsp = np.empty((dd, dd))
    du = np.empty((dd, d))
    ds = np.empty((d, d))
    work_dd = np.empty((dd, d))
    work_dd2 = np.empty((dd, d))
    work_d = np.empty((d, d))
    dgain = np.empty((dd, d))
    work_dh = np.empty((d, dd))
    cross = np.empty((dd, dd))

    # ---------------------------------------------------------------- forward ODE filter
    last_h = -1.0
    amat, qmat = _transition_matrices(1.0, q, d, rq)
    for n in range(1, n_pts):
        h = grid[n] - grid[n - 1]
        t = grid[n]
        transition_coefficients(h, q, a)
        preconditioner(h, q, tvec)
        apply_transition(a, q, d, mus[n - 1], mu_p)
        fill_transition_rows(rs[n - 1], a, q, d, m_pred, 0, 0)
        fill_process_noise(rq, tvec, math.sqrt(kappa), q, d, m_pred, dd, 0)
        tria_inplace(m_pred, 2 * dd, dd)
        r_pred = np.ascontiguousarray(m_pred[:dd, :dd])
        xi = np.ascontiguousarray(mu_p[:d])
        rhs(xi, t, theta, fx)
        if ek1 or want_grad:
            jac_y(xi, t, theta, jtrue)
        if ek1:
            jlin[:, :] = jtrue
        for c in range(d):
            zhat[c] = mu_p[d + c] - fx[c]
        update_sqrt(r_pred, mu_p, jlin, zhat, q, d, m_upd, w, mus[n], rs[n])
        if not (all_finite(mus[n]) and all_finite(rs[n])):
            return terms, jac, False
        if not want_grad:
            continue
        if h != last_h:  # fixed grids repeat the same step: reuse A(h), Q(h)
            if h != last_h:
                amat, qmat = _transition_matrices(h, q, d, rq)
                last_h = h
            last_h = h
        jac_p(xi, t, theta, jp)
        if ek1:
            hess_yy(xi, t, theta, hyy)
            hess_yp(xi, t, theta, hyp)
        hmat[:, :] = 0.0
        for c in range(d):
            hmat[c, d + c] = 1.0
            for e in range(d):
                hmat[c, e] = -jlin[c, e]
        matmul(r_pred.T.copy(), r_pred, sig_p)
        matmul(rs[n].T.copy(), rs[n], sig_post)
        matmul_nt(sig_p, hmat, u)
        s_inv = np.linalg.inv(hmat @ u)
        matmul(u, s_inv, gain)
        matmul(gain, hmat, proj)
        for r in range(dd):
            for c in range(dd):
                proj[r, c] = (1.0 if r == c else 0.0) - proj[r, c]
        for j in range(n_dir):
            dmu_p = amat @ dmus[n - 1, j]
            sandwich(amat, dsig[n - 1, j], work, dsp)
            if j == kdir:
                dsp += qmat
            dxi = dmu_p[:d]
            df = jtrue @ dxi
            if d <= j < d + k:
                df += jp[:, j - d]
            dh[:, :] = 0.0
            if ek1:
                for r in range(d):
                    for c in range(d):
                        v = 0.0
                        for e in range(d):
                            v += hyy[r, c, e] * dxi[e]
                        if d <= j < d + k:
                            v += hyp[r, c, j - d]
                        dh[r, c] = -v
            # du = dΣ⁻ H^T + Σ⁻ dH^T; ds = dH U + H du; dK = (du - K ds) S^{-1}
            matmul_nt(dsp, hmat, du)
            matmul_nt(sig_p, dh, work_dd)
            du += work_dd
            matmul(dh, u, ds)
            matmul(hmat, du, work_d)
            ds += work_d
            matmul(gain, ds, work_dd)
            work_dd2[:, :] = du - work_dd
            matmul(work_dd2, s_inv, dgain)
            dz = dmu_p[d : 2 * d] - df
            dmus[n, j] = dmu_p - dgain @ zhat - gain @ dz
            # Joseph-type form dΣ = B dΣ⁻ B^T - Σ dH^T K^T - K dH Σ (B = I - KH): keeps the tangent in
            # the subspace of the singular posterior; the plain difference form is unstable.
            matmul(dh, sig_post, work_dh)
            matmul(gain, work_dh, cross)
            sandwich(proj, dsp, work, dsig[n, j])
            for r in range(dd):
                for c in range(dd):
                    dsig[n, j, r, c] -= cross[r, c] + cross[c, r]

    # ---------------------------------------------------------------- backward Kalman filter on data
    mean = mus[n_pts - 1].copy()
    root = rs[n_pts - 1].copy()
    dmean = dmus[n_pts - 1].copy() if want_grad else dmus[0]
    dcov = dsig[n_pts - 1].copy() if want_grad else dsig[0]
    g = np.empty((dd, dd))
    dvec = np.empty(dd)
    lam = np.empty((dd, dd))
    r_predn = np.empty((dd, dd))
    bproj = np.empty((dd, dd))
    gqg = np.empty((dd, dd))
    gp = np.empty((dd, dd))
    gq = np.empty((dd, dd))
    work2 = np.empty((dd, dd))
    dlam = np.empty((dd, dd))
    dg = np.empty((dd, dd))
    idx = np.empty(m, dtype=np.int64)
    for n in range(n_pts - 1, -1, -1):
        i = obs_at[n]
        if i >= 0:
            mo = 0
            for c in range(m):
                if not math.isnan(data[i, c]):
                    idx[mo] = c
                    mo += 1
            if mo > 0:
                csub = np.zeros((mo, dd))
                resid = np.empty(mo)
                for r in range(mo):
                    s = data[i, idx[r]]
                    for c in range(d):
                        csub[r, c] = cmat[idx[r], c]
                        s -= cmat[idx[r], c] * mean[c]
                    resid[r] = s
                mm = np.zeros((dd + mo, mo + dd))
                pc_t = root @ csub.T
                for r in range(dd):
                    for c in range(mo):
                        mm[r, c] = pc_t[r, c]
                    for c in range(dd):
                        mm[r, mo + c] = root[r, c]
                for r in range(mo):
                    mm[dd + r, r] = sigma[idx[r]]
                tria_inplace(mm, dd + mo, mo + dd)
                wv = np.empty(mo)
                solve_lower_from_upper_t(mm, mo, resid, wv)
                quad = 0.0
                logdet = 0.0
                for r in range(mo):
                    quad += wv[r] * wv[r]
                    logdet += 2.0 * math.log(abs(mm[r, r]))
                terms[i] = -0.5 * (quad + logdet + mo * _LOG_2PI)
                r11 = np.ascontiguousarray(mm[:mo, :mo])
                r12 = np.ascontiguousarray(mm[:mo, mo:])
                if want_grad:
                    pcov = root.T @ root
                    smat = r11.T @ r11
                    s_inv = np.linalg.inv(smat)
                    gain = r12.T @ np.linalg.inv(r11).T
                    proj = np.eye(dd) - gain @ csub
                    alpha = s_inv @ resid
                    for j in range(n_dir):
                        ds = csub @ dcov[j] @ csub.T
                        jsig = j - d - k
                        if 0 <= jsig < n_sigma:
                            for r in range(mo):
                                if sigma_dir[idx[r]] == jsig:
                                    ds[r, r] += 2.0 * sigma[idx[r]]
                        dr = -(csub @ dmean[j])
                        jac[i, j] = -0.5 * (
                            2.0 * (alpha @ dr) - alpha @ ds @ alpha + np.sum(s_inv * ds.T)
                        )
                        dgain = (dcov[j] @ csub.T - gain @ ds) @ s_inv
                        dmean[j] = dmean[j] + dgain @ resid + gain @ dr
                        # Joseph form: d(B P B^T + K R K^T) = B dP B^T + K dR K^T at the optimal K.
                        dnoise = ds - csub @ dcov[j] @ csub.T
                        dcov[j] = proj @ dcov[j] @ proj.T + gain @ dnoise @ gain.T
                for c in range(dd):
                    s = 0.0
                    for r in range(mo):
                        s += r12[r, c] * wv[r]
                    mean[c] += s
                for r in range(dd):
                    for c in range(dd):
                        root[r, c] = mm[mo + r, mo + c]
        if n == 0:
            break
        h = grid[n] - grid[n - 1]
        backward_kernel(mus[n - 1], rs[n - 1], h, kappa, q, d, rq, g, dvec, lam, r_predn)
        new_mean = g @ mean + dvec
        stack = np.empty((2 * dd, dd))
        stack[:dd] = root @ g.T
        stack[dd:] = lam
        tria_inplace(stack, 2 * dd, dd)
        if want_grad:
            amat, qmat = _transition_matrices(h, q, d, rq)
            mu_prev_p = amat @ mus[n - 1]
            rinv = np.linalg.inv(r_predn)
            p_inv = rinv @ rinv.T
            pcov = root.T @ root
            matmul(g, amat, bproj)
            for r in range(dd):
                for c in range(dd):
                    bproj[r, c] = (1.0 if r == c else 0.0) - bproj[r, c]
            sandwich(g, qmat, work, gqg)
            matmul(g, pcov, gp)
            matmul(g, qmat, gq)
            for j in range(n_dir):
                # Joseph form of the backward kernel, Λ = (I - GA) Σ (I - GA)^T + κ G Q G^T:
                # its derivative needs no dG, and dG = [(I - GA) dΣ A^T - dκ G Q] P^{-1}.
                matmul(bproj, dsig[n - 1, j], work)
                matmul_nt(work, amat, work2)
                matmul_nt(work, bproj, dlam)
                if j == kdir:
                    work2 -= gq
                    dlam += gqg
                matmul(work2, p_inv, dg)
                dmu_p = amat @ dmus[n - 1, j]
                ddv = dmus[n - 1, j] - dg @ mu_prev_p - g @ dmu_p
                new_dmean = dg @ mean + g @ dmean[j] + ddv
                # dP' = dG P G^T + G P dG^T + G dP G^T + dΛ
                matmul_nt(dg, gp, work)
                sandwich(g, dcov[j], work2, dcov[j])
                for r in range(dd):
                    for c in range(dd):
                        dcov[j, r, c] += work[r, c] + work[c, r] + dlam[r, c]
                dmean[j] = new_dmean
        mean[:] = new_mean
        root[:, :] = stack[:dd]
    for i in range(n_obs):
        if not math.isfinite(terms[i]):
            return terms, jac, False
    if want_grad and not all_finite(jac):
        return terms, jac, False
    return terms, jac, True
