r"""Forward-mode tangents of the ODE filter's marginals along a stored run.

:func:`~pymc_pnode.filtering.odefilter.run_filter` computes the filter in square-root form and stores the
means and roots of every step. :func:`filter_tangents` differentiates that run with respect to the
initial state and the parameters, on the grid the run chose (held fixed), carrying for each of the
``P = d + n_theta`` directions the tangents of the mean and of the covariance through one predict and
one update per step (the EK0/EK1 filter of Tronarp, Kersting, Särkkä & Hennig, 2019, differentiated by hand):

.. math::

    Σ^- = A Σ A^\top + κ Q,\quad S = H Σ^- H^\top,\quad K = Σ^- H^\top S^{-1},\quad
    μ = μ^- - K \hat z,\quad Σ = (I - K H) Σ^- (I - K H)^\top,

with ``H = E1 - J E0`` (EK1; ``E1`` for EK0), ``\hat z = E1 μ^- - f(E0 μ^-)`` and ``J = ∂f/∂y`` at
``E0 μ^-``. The tangents of ``J`` need the second derivatives of ``f``; the initial mean's tangent is
the Jacobian of the exact Taylor coefficients. Values (``μ``, ``Σ``) are read from the stored run, so
the tangents are exact derivatives of the numbers the square-root filter returned. Covariance
tangents are carried as matrices (no square root is differentiated), as in the Fenrir adjoint.
"""

from __future__ import annotations

from collections import namedtuple

import numba as nb
import numpy as np

from pymc_pnode._codegen import MAT_FN, TEN_FN, VEC_FN
from pymc_pnode._jit import INLINE_JIT, compile_on_first_use
from pymc_pnode.filtering.prior import preconditioner, transition_coefficients

__all__ = ["StoredRun", "filter_tangents"]

_R1 = nb.types.Array(nb.float64, 1, "C", readonly=True)
_R2 = nb.types.Array(nb.float64, 2, "C", readonly=True)
_R3 = nb.types.Array(nb.float64, 3, "C", readonly=True)
_RI1 = nb.types.Array(nb.int64, 1, "C", readonly=True)

StoredRun = namedtuple("StoredRun", ["grid", "mu", "r", "kappa", "out_index"])
StoredRun.__doc__ = """A filter run as :func:`filter_tangents` reads it (read-only arrays): the grid (``N + 1``), means
``(N + 1, D)``, upper roots ``r`` (``Σ_n = r_nᵀ r_n``), the diffusion ``kappa[n]`` of the step that ended at
``grid[n]``, and the indices of the steps whose marginals are reported."""
_STORED_RUN_T = nb.types.NamedTuple([_R1, _R2, _R3, _R1, _RI1], StoredRun)
_TANGENTS_SIG = (VEC_FN, MAT_FN, MAT_FN, TEN_FN, TEN_FN, nb.float64[::1], _STORED_RUN_T, _R2, _R2, nb.boolean)


@compile_on_first_use(_TANGENTS_SIG, **INLINE_JIT)
def filter_tangents(rhs, jac_y, jac_p, hess_yy, hess_yp, p, run, dmu0, rq, ek1):
    """Tangents of the filter means and covariances at the steps ``run.out_index`` of a stored run.

    Parameters: the vector field and its first and second derivatives; the parameters ``p``; the
    :class:`StoredRun`; ``dmu0`` (``(D, P)``) the tangent of the initial mean; the root ``rq`` of ``Q̄``
    (``(q + 1, q + 1)``: it sets the IWP order ``q``, and ``D = (q + 1) d`` the number of states); EK1 or EK0.

    Returns ``(dmean, dvar, dstat)``: the tangents of ``E0 μ`` (``(K, d, P)``) and of the variances
    ``diag(E0 Σ E0ᵀ)`` (``(K, d, P)``) at the output steps, and the tangent (``(P,)``) of the calibration
    statistic ``Σ_n ẑᵀ S⁻¹ ẑ`` (its value is the run's own ``stat_sum``).
    """
    ts, mus, rs, kappas, out_index = run
    q = rq.shape[0] - 1
    dd = mus.shape[1]
    d = dd // (q + 1)
    n_dir = dmu0.shape[1]
    n_out = out_index.shape[0]
    dmean = np.zeros((n_out, d, n_dir))
    dvar = np.zeros((n_out, d, n_dir))
    dstat = np.zeros(n_dir)
    qbar = rq.T @ rq
    dmu = np.ascontiguousarray(dmu0).copy()  # (D, P)
    dsig = np.zeros((n_dir, dd, dd))
    a_mat = np.zeros((dd, dd))
    q_mat = np.zeros((dd, dd))
    coef = np.empty(q + 1)
    tvec = np.empty(q + 1)
    xi = np.empty(d)
    fx = np.empty(d)
    jac = np.empty((d, d))
    jp = np.empty((d, p.shape[0]))
    hyy = np.empty((d, d, d))
    hyp = np.empty((d, d, p.shape[0]))
    h_mat = np.zeros((d, dd))
    dh = np.zeros((d, dd))
    k_out = 0
    while k_out < n_out and out_index[k_out] == 0:
        for j in range(n_dir):
            for k in range(d):
                dmean[k_out, k, j] = dmu[k, j]
        k_out += 1
    for n in range(ts.shape[0] - 1):
        h = ts[n + 1] - ts[n]
        t_new = ts[n + 1]
        transition_coefficients(h, q, coef)
        preconditioner(h, q, tvec)
        for i in range(q + 1):
            for jj in range(q + 1):
                for k in range(d):
                    a_mat[i * d + k, jj * d + k] = coef[jj - i] if jj >= i else 0.0
                    q_mat[i * d + k, jj * d + k] = tvec[i] * qbar[i, jj] * tvec[jj]
        sig = rs[n].T @ rs[n]
        sig_pred = a_mat @ sig @ a_mat.T + kappas[n + 1] * q_mat
        mu_pred = a_mat @ mus[n]
        for k in range(d):
            xi[k] = mu_pred[k]
        rhs(xi, t_new, p, fx)
        jac_y(xi, t_new, p, jac)
        jac_p(xi, t_new, p, jp)
        if ek1:
            hess_yy(xi, t_new, p, hyy)
            hess_yp(xi, t_new, p, hyp)
        z = mu_pred[d:2 * d] - fx
        for k in range(d):
            for c in range(dd):
                h_mat[k, c] = 0.0
            h_mat[k, d + k] = 1.0
            if ek1:
                for c in range(d):
                    h_mat[k, c] = -jac[k, c]
        ph = sig_pred @ h_mat.T  # Σ⁻ Hᵀ
        s_mat = h_mat @ ph
        s_inv = np.linalg.inv(s_mat)
        gain = ph @ s_inv
        s_inv_z = s_inv @ z
        b_mat = np.eye(dd) - gain @ h_mat
        sig_post = b_mat @ sig_pred @ b_mat.T
        for j in range(n_dir):
            dmu_pred = a_mat @ np.ascontiguousarray(dmu[:, j])
            dsig_pred = a_mat @ dsig[j] @ a_mat.T
            dxi = dmu_pred[:d]
            dz = dmu_pred[d:2 * d] - jac @ dxi
            if j >= d:
                dz -= jp[:, j - d]
            if ek1:
                for k in range(d):
                    for c in range(d):
                        v = 0.0
                        for m in range(d):
                            v += hyy[k, c, m] * dxi[m]
                        if j >= d:
                            v += hyp[k, c, j - d]
                        dh[k, c] = -v
            dph = dsig_pred @ h_mat.T + sig_pred @ dh.T
            ds = dh @ ph + h_mat @ dph
            dgain = (dph - gain @ ds) @ s_inv
            new_dmu = dmu_pred - dgain @ z - gain @ dz
            # Joseph form Σ = B Σ⁻ Bᵀ, B = I - K H: stationary in K, so dK drops out, and B projects out
            # the rounding errors of dΣ⁻ in the directions the update pins (the plain form's
            # dΣ⁻ - d(K S Kᵀ) lets them grow exponentially along an EK1 solve).
            kdh_sig = gain @ dh @ sig_post
            dsig[j] = b_mat @ dsig_pred @ b_mat.T - kdh_sig - kdh_sig.T
            for c in range(dd):
                dmu[c, j] = new_dmu[c]
            dstat[j] += 2.0 * (s_inv_z @ dz) - s_inv_z @ (ds @ s_inv_z)
        while k_out < n_out and out_index[k_out] == n + 1:
            for j in range(n_dir):
                for k in range(d):
                    dmean[k_out, k, j] = dmu[k, j]
                    dvar[k_out, k, j] = dsig[j, k, k]
            k_out += 1
    return dmean, dvar, dstat
