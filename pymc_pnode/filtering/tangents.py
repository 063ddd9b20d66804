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

from pymc_pnode._callbacks import FN, call
from pymc_pnode._jit import INLINE_JIT, compile_on_first_use, readonly
from pymc_pnode.filtering.calibration import (
    KAPPA_CONSTANT,
    KAPPA_ESTIMATE,
    KAPPA_ROUNDING,
    FloorCotangents,
    FloorInputs,
    diffusion_source,
    local_error_work,
    local_kappa_adjoint,
    rounding_kappa,
    rounding_kappa_adjoint,
)
from pymc_pnode.filtering.linalg import matmul, matmul_nt, matmul_part, matmul_tn, solve_gram_inplace
from pymc_pnode.filtering.predict import predict_root
from pymc_pnode.filtering.prior import add_noise, apply_transition, congruence, set_step, transition_matrix
from pymc_pnode.filtering.smoother import backward_gain, backward_work
from pymc_pnode.filtering.update import (
    congruence_rounding,
    f_scale,
    f_scale_adjoint,
    f_scale_size,
    linearisation_adjoint_work,
    scaled_gain_sq,
    scaled_norm_sq,
    state_scales,
)

__all__ = ["SmoothedRun", "StepTangents", "StoredRun", "block_filter_tangents", "filter_tangents", "smoothing_tangents",
           "stored_run"]

_R1 = nb.types.Array(nb.float64, 1, "C", readonly=True)
_R2 = nb.types.Array(nb.float64, 2, "C", readonly=True)
_R3 = nb.types.Array(nb.float64, 3, "C", readonly=True)
_RI1 = nb.types.Array(nb.int64, 1, "C", readonly=True)

StoredRun = namedtuple("StoredRun", ["grid", "mu", "r", "kappa", "out_index"])
StoredRun.__doc__ = """A filter run as :func:`filter_tangents` reads it (read-only arrays): the grid (``N + 1``), means
``(N + 1, D)``, upper roots ``r`` (``Σ_n = r_nᵀ r_n``), the diffusion ``kappa[n]`` of the step that ended at
``grid[n]``, and the indices of the steps whose marginals are reported."""
StepTangents = namedtuple("StepTangents", ["dmu", "dsig", "dkappa"])
StepTangents.__doc__ = """Tangents of the filter's means ``dmu`` (``(K, D, P)``), covariances ``dsig``
(``(K, P, D, D)``) and diffusions ``dkappa`` (``(K, P)``, of the step that ended at each point: zero unless the
diffusion is local) at the grid points ``0 .. K - 1``. :func:`filter_tangents` reads the initial mean's tangent
from ``dmu[0]`` and, when ``K`` is the number of grid points, fills in every step (the smoother needs them);
with ``K = 1`` it keeps none."""
SmoothedRun = namedtuple("SmoothedRun", ["mu", "r"])
SmoothedRun.__doc__ = """The smoothing posterior on the grid (read-only): means ``(N + 1, D)`` and upper roots
``(N + 1, D, D)``."""


def stored_run(grid: np.ndarray, mu: np.ndarray, r: np.ndarray, kappa: np.ndarray, out_index: np.ndarray) -> StoredRun:
    """A :class:`StoredRun` of read-only copies (or views) of a filter run's arrays, as the kernels take them."""
    return StoredRun(readonly(grid), readonly(mu), readonly(r), readonly(kappa), readonly(out_index, np.int64))


_STORED_RUN_T = nb.types.NamedTuple([_R1, _R2, _R3, _R1, _RI1], StoredRun)
_STEP_TANGENTS_T = nb.types.NamedTuple([nb.float64[:, :, ::1], nb.float64[:, :, :, ::1], nb.float64[:, ::1]],
                                       StepTangents)
_SMOOTHED_RUN_T = nb.types.NamedTuple([_R2, _R3], SmoothedRun)
# The vector field as the tangent kernels need it: f and its first and second derivatives (addresses of C
# callbacks, :mod:`pymc_pnode._callbacks`; the second derivatives are not called by the EK0: 0 will do), the
# parameters and EK1 (else EK0). The second derivatives are the full tensors ``ODE.hess_yy``/``hess_yp`` for
# the dense kernel and their rows ``∂²f_i/∂y_i∂(y, θ)`` (``ODE.hess_rows_y``/``hess_rows_p``) for the block one.
# ``term_scale`` and ``term_scale_vjp``: the EK0's bound T(f) for the rounding floor (:attr:`pymc_pnode.ODE.term_scale`;
# 0 where unused).
# ``theta_scale`` multiplies what the θ directions add at every step themselves (∂f/∂θ, ∂²f/∂y∂θ, the floor's
# ∂T(f)/∂θ): with it equal to the scale of the initial tangents' θ columns, the tangents are linear in the directions,
# which the rounding check of pymc_pnode.accuracy (the tangents again with every direction times RESCALE) relies on.
TangentField = namedtuple("TangentField", ["rhs", "jac_y", "jac_p", "hess_y", "hess_p", "term_scale", "term_scale_vjp",
                                           "theta", "ek1", "theta_scale"])
_TANGENT_FIELD_T = nb.types.NamedTuple([FN, FN, FN, FN, FN, FN, FN, nb.float64[::1], nb.boolean, nb.float64],
                                       TangentField)
_TANGENTS_SIG = (_TANGENT_FIELD_T, _STORED_RUN_T, _STEP_TANGENTS_T, _R2, nb.boolean)


# The vector field and its first and second derivatives at one point (work arrays of :func:`evaluate_field`).
FieldValues = namedtuple("FieldValues", ["xi", "fx", "jac", "jp", "hyy", "hyp"])


@nb.njit(**INLINE_JIT)
def field_values(d: int, n_theta: int, hess_shapes: tuple) -> FieldValues:
    """Work arrays of :func:`evaluate_field` for ``d`` states and ``n_theta`` parameters; ``hess_shapes`` are the
    shapes of the second derivatives the field's ``hess_y`` and ``hess_p`` write."""
    return FieldValues(np.empty(d), np.empty(d), np.empty((d, d)), np.empty((d, n_theta)), np.empty(hess_shapes[0]),
                       np.empty(hess_shapes[1]))


@nb.njit(**INLINE_JIT)
def evaluate_field(field: TangentField, t: float, mu_pred: np.ndarray, out: FieldValues) -> None:
    """``f``, ``∂f/∂y``, ``∂f/∂θ`` (and for the EK1 the second derivatives) at ``ξ = E0 μ⁻``, into ``out``; the
    derivatives in ``θ`` times ``field.theta_scale``."""
    xi, p = out.xi, field.theta
    for k in range(xi.shape[0]):
        xi[k] = mu_pred[k]
    call(field.rhs, xi, t, p, out.fx)
    call(field.jac_y, xi, t, p, out.jac)
    call(field.jac_p, xi, t, p, out.jp)
    if field.ek1:  # (the EK0 does not call the second derivatives)
        call(field.hess_y, xi, t, p, out.hyy)
        call(field.hess_p, xi, t, p, out.hyp)
    if field.theta_scale != 1.0:
        _scale_in_place(out.jp.reshape(-1), field.theta_scale)
        if field.ek1:
            _scale_in_place(out.hyp.reshape(-1), field.theta_scale)


@nb.njit(**INLINE_JIT)
def _scale_in_place(values: np.ndarray, factor: float) -> None:
    for i in range(values.shape[0]):
        values[i] *= factor


@nb.njit(**INLINE_JIT)
def floor_scale_work(field: TangentField, d: int, local: bool):
    """The rounding floor's ``T(f)`` and its cotangent (length 0 unless an EK0 calibrates local diffusions,
    :func:`~.update.f_scale_size`), the floor's derivative in ``θ`` through ``T(f)`` and the work of
    :func:`~.update.f_scale_adjoint`."""
    size = f_scale_size(field, d) if local else 0
    k = field.theta.shape[0]
    return np.empty(size), np.empty(size), np.zeros(k), linearisation_adjoint_work(d, k)


@nb.njit(**INLINE_JIT)
def record_initial_outputs(out_index: np.ndarray, dmu: np.ndarray, d: int, dmean: np.ndarray) -> int:
    """The initial mean's tangent at the output steps at grid point 0 (its covariance is 0); the next output."""
    k_out = 0
    while k_out < out_index.shape[0] and out_index[k_out] == 0:
        for k in range(d):
            dmean[k_out, k] = dmu[k]
        k_out += 1
    return k_out


@nb.njit(**INLINE_JIT)
def finish_step(n: int, steps, out_index: np.ndarray, k_out: int, dmu: np.ndarray, dsig: np.ndarray,
                dkappa: np.ndarray, dmean: np.ndarray, dvar: np.ndarray) -> int:
    """After the update at grid point ``n``: keep the tangents in ``steps`` if it has room, and record those of
    ``E0 μ`` and of the variances at the output steps at ``n``; returns the next output. ``dsig`` is dense
    ``(P, D, D)`` or per block ``(P, n_blocks, q + 1, q + 1)`` (the rank decides, at compile time)."""
    if steps.dmu.shape[0] > 1:
        steps.dmu[n] = dmu
        steps.dsig[n] = dsig
        steps.dkappa[n] = dkappa
    d = dmean.shape[1]
    while k_out < out_index.shape[0] and out_index[k_out] == n:
        for j in range(dmean.shape[2]):
            for k in range(d):
                dmean[k_out, k, j] = dmu[k, j]
                if dsig.ndim == 3:
                    dvar[k_out, k, j] = dsig[j, k, k]
                else:
                    dvar[k_out, k, j] = dsig[j, k if dsig.shape[1] > 1 else 0, 0, 0]
        k_out += 1
    return k_out


# One Kalman update with its linearisation, as the tangents read it: Σ⁻, H, Σ⁻Hᵀ, K = Σ⁻HᵀS⁻¹, S⁻¹, B = I − KH,
# Σ = BΣ⁻Bᵀ, the residual ẑ and S⁻¹ẑ; for the rounding bound (:func:`~.update.congruence_rounding`) the inverse
# predicted standard deviations (the weights of a tangent's scaled norm) and ‖K H‖² in those coordinates.
LinearisedUpdate = namedtuple("LinearisedUpdate", ["sig_pred", "h", "ph", "gain", "s_inv", "b", "sig_post", "z",
                                                   "s_inv_z", "inv_scale", "gain_sq"])


@nb.njit(**INLINE_JIT)
def linearised_update(sig_pred: np.ndarray, h: np.ndarray, z: np.ndarray) -> LinearisedUpdate:
    """The update of ``N(μ⁻, Σ⁻)`` on ``H x = ẑ``-type information (noise-free), in dense form."""
    ph = sig_pred @ h.T
    s_inv = np.linalg.inv(h @ ph)
    gain = ph @ s_inv
    b = np.eye(sig_pred.shape[0]) - gain @ h
    scale, inv_scale = np.empty(sig_pred.shape[0]), np.zeros(sig_pred.shape[0])
    state_scales(sig_pred, scale)
    for a in range(scale.shape[0]):
        if scale[a] > 0.0:
            inv_scale[a] = 1.0 / scale[a]
    return LinearisedUpdate(sig_pred, h, ph, gain, s_inv, b, b @ sig_pred @ b.T, z, s_inv @ z, inv_scale,
                            scaled_gain_sq(gain, h, h.shape[0], scale))


# Work arrays of :func:`update_tangent` for a state of size D observed through m rows; the caller writes the
# tangents of the predicted mean and covariance into ``dmu_pred`` and ``dsig_pred``. ``rounding[0]`` keeps the
# largest rounding bound of the covariance tangents' congruences (:func:`~.update.congruence_rounding`).
TangentWork = namedtuple("TangentWork", ["dmu_pred", "dsig_pred", "dph", "ds", "dgain", "dh_sig", "bx", "rounding"])


@nb.njit(**INLINE_JIT)
def tangent_work(dd: int, m: int) -> TangentWork:
    """:class:`TangentWork` for ``D = dd`` states and ``m`` observation rows."""
    return TangentWork(np.empty(dd), np.empty((dd, dd)), np.empty((dd, m)), np.empty((m, m)), np.empty((dd, m)),
                       np.empty((m, dd)), np.empty((dd, dd)), np.zeros(1))


@nb.njit(**INLINE_JIT)
def update_tangent(update: LinearisedUpdate, dh: np.ndarray, dz: np.ndarray, work: TangentWork, dmu: np.ndarray,
                   dsig: np.ndarray) -> float:
    """Tangents ``dμ``, ``dΣ`` (written into ``dmu``, ``dsig``) of one update given those of ``μ⁻`` and ``Σ⁻``
    (``work.dmu_pred``, ``work.dsig_pred``), ``H`` (``dh``) and ``ẑ`` (``dz``); returns ``d(ẑᵀS⁻¹ẑ)``.

    Σ in Joseph form ``B Σ⁻ Bᵀ``: stationary in ``K``, so ``dK`` drops out, and ``B`` projects out the rounding
    errors of ``dΣ⁻`` in the directions the update pins (the plain form's ``dΣ⁻ − d(K S Kᵀ)`` lets them grow
    exponentially along an EK1 solve). No allocation: products with ``m``-row factors are loops, and ``K dH Σ``
    is ``K (dH Σ)`` (``O(m D²)``). The congruence's rounding bound joins ``work.rounding``.
    """
    sig_pred, h, ph, gain, s_inv, b, sig_post, z, s_inv_z, inv_scale, gain_sq = update
    dmu_pred, dsig_pred, dph, ds, dgain, dh_sig, bx, rounding = work
    dd, m = ph.shape
    for a in range(dd):  # dPH = dΣ⁻ Hᵀ + Σ⁻ dHᵀ
        for i in range(m):
            v = 0.0
            for c in range(dd):
                v += dsig_pred[a, c] * h[i, c] + sig_pred[a, c] * dh[i, c]
            dph[a, i] = v
    for i in range(m):  # dS = dH PH + H dPH
        for j in range(m):
            v = 0.0
            for c in range(dd):
                v += dh[i, c] * ph[c, j] + h[i, c] * dph[c, j]
            ds[i, j] = v
    for a in range(dd):  # dK = (dPH − K dS) S⁻¹ (dPH overwritten row by row)
        for i in range(m):
            v = dph[a, i]
            for j in range(m):
                v -= gain[a, j] * ds[j, i]
            dph[a, i] = v
    matmul_part(dph, s_inv, dd, m, m, dgain)
    for a in range(dd):  # dμ = dμ⁻ − dK ẑ − K dẑ
        v = dmu_pred[a]
        for i in range(m):
            v -= dgain[a, i] * z[i] + gain[a, i] * dz[i]
        dmu[a] = v
    matmul_part(dh, sig_post, m, dd, dd, dh_sig)
    matmul(b, dsig_pred, bx)  # dΣ = B dΣ⁻ Bᵀ − K dH Σ − (K dH Σ)ᵀ
    matmul_nt(bx, b, dsig)
    norm_out = 0.0  # ‖T⁻¹ dΣ T⁻¹‖², for the rounding bound
    for a in range(dd):
        for c in range(dd):
            v = 0.0
            for i in range(m):
                v += gain[a, i] * dh_sig[i, c] + gain[c, i] * dh_sig[i, a]
            dsig[a, c] -= v
            v = inv_scale[a] * dsig[a, c] * inv_scale[c]
            norm_out += v * v
    rounding[0] = max(rounding[0], congruence_rounding(gain_sq, scaled_norm_sq(dsig_pred, inv_scale), norm_out))
    lin, quad = 0.0, 0.0
    for i in range(m):
        lin += s_inv_z[i] * dz[i]
        for j in range(m):
            quad += s_inv_z[i] * ds[i, j] * s_inv_z[j]
    return 2.0 * lin - quad


@compile_on_first_use(_TANGENTS_SIG, **INLINE_JIT)
def filter_tangents(vector_field, run, steps, rq, local):
    """Tangents of the filter means and covariances at the steps ``run.out_index`` of a stored run.

    Parameters: the :class:`TangentField` (the vector field, its first and second derivatives, the parameters
    and EK1 or EK0); the :class:`StoredRun`; the :class:`StepTangents` (``steps.dmu[0]`` the tangent of the
    initial mean; filled at every step if it has room); the root ``rq`` of ``Q̄`` (``(q + 1, q + 1)``: it sets
    the IWP order ``q``, and ``D = (q + 1) d`` the number of states); ``local``: the run's diffusions are the
    local ones, each step's ``κ_n = ẑ_nᵀ C_n⁻¹ ẑ_n / d`` from its own residual (:func:`~.calibration.local_error`),
    whose tangent ``dκ_n = ∂κ/∂ẑ · dẑ + ∂κ/∂L · dL`` (:func:`~.calibration.local_kappa_adjoint` with a unit
    cotangent) adds ``dκ_n Q(h)`` to ``dΣ⁻`` (zero where ``κ_n`` was floored); else they are constants.

    Returns ``(dmean, dvar, dstat, rounding)``: the tangents of ``E0 μ`` (``(K, d, P)``) and of the variances
    ``diag(E0 Σ E0ᵀ)`` (``(K, d, P)``) at the output steps, the tangent (``(P,)``) of the calibration
    statistic ``Σ_n ẑᵀ S⁻¹ ẑ`` (its value is the run's own ``stat_sum``) and the largest rounding bound of the
    covariance tangents (:func:`~.update.congruence_rounding`; :mod:`pymc_pnode.accuracy` checks it).
    """
    ts, mus, rs, kappas, out_index = run
    p, ek1 = vector_field.theta, vector_field.ek1
    q = rq.shape[0] - 1
    dd = mus.shape[1]
    d = dd // (q + 1)
    n_dir = steps.dmu.shape[2]
    n_out = out_index.shape[0]
    dmean = np.zeros((n_out, d, n_dir))
    dvar = np.zeros((n_out, d, n_dir))
    dstat = np.zeros(n_dir)
    dmu = steps.dmu[0].copy()  # (D, P)
    dsig = np.zeros((n_dir, dd, dd))
    sig, sig_pred, transition_work = np.empty((dd, dd)), np.empty((dd, dd)), np.empty((dd, dd))
    mu_pred, dmu_col, new_dmu = np.empty(dd), np.empty(dd), np.empty(dd)
    z, dz = np.empty(d), np.empty(d)
    step = np.empty((3, q + 1))
    field = field_values(d, p.shape[0], ((d, d, d), (d, d, p.shape[0])))
    fx, jac, jp, hyy, hyp = field.fx, field.jac, field.jp, field.hyy, field.hyp
    h_mat = np.zeros((d, dd))
    dh = np.zeros((d, dd))
    work = tangent_work(dd, d)
    dmu_pred, dsig_pred = work.dmu_pred, work.dsig_pred
    lin = jac if ek1 else np.zeros((d, d))  # L of the local diffusion's H = E1 − L E0 (zero for the EK0)
    kappa_zbar, kappa_jbar, kappa_work = np.empty(d), np.empty((d, d)), local_error_work(q, d)
    kappa_mbar = np.zeros(dd)  # ∂ρ/∂μ⁻ of the rounding floor (rounding_kappa_adjoint)
    scale, scale_bar, kappa_pbar, scale_work = floor_scale_work(vector_field, d, local)
    floor = FloorInputs(step, lin, z, mu_pred, scale)
    dkappa = np.zeros(n_dir)
    k_out = record_initial_outputs(out_index, dmu, d, dmean)
    for n in range(ts.shape[0] - 1):
        t_new = ts[n + 1]
        set_step(ts[n + 1] - ts[n], 1.0, q, step)
        matmul_tn(rs[n], rs[n], sig)
        congruence(step, q, d, sig, transition_work, sig_pred)
        add_noise(step, rq, q, d, kappas[n + 1], sig_pred)
        apply_transition(step, q, d, mus[n], mu_pred)
        evaluate_field(vector_field, t_new, mu_pred, field)
        for k in range(d):
            z[k] = mu_pred[d + k] - fx[k]
            for c in range(dd):
                h_mat[k, c] = 0.0
            h_mat[k, d + k] = 1.0
            if ek1:
                for c in range(d):
                    h_mat[k, c] = -jac[k, c]
        update = linearised_update(sig_pred, h_mat, z)
        source = KAPPA_CONSTANT
        if local:  # κ_n = max(its estimate, ρ_n): the tangent of whichever it was
            f_scale(vector_field, t_new, field.xi, scale)
            source = diffusion_source(kappas[n + 1], rounding_kappa(floor, rq, q, d))
        kappa_mbar[:] = 0.0
        kappa_pbar[:] = 0.0
        if source == KAPPA_ESTIMATE:
            local_kappa_adjoint(1.0, step, rq, q, d, lin, z, kappa_work, kappa_zbar, kappa_jbar)
        elif source == KAPPA_ROUNDING:
            rounding_kappa_adjoint(1.0, floor, rq, q, d, FloorCotangents(kappa_zbar, kappa_jbar, kappa_mbar, scale_bar))
            f_scale_adjoint(vector_field, vector_field, t_new, field.xi, scale_bar, kappa_mbar, kappa_pbar, scale_work)
        varies = source != KAPPA_CONSTANT
        dkappa[:] = 0.0
        for j in range(n_dir):
            for c in range(dd):
                dmu_col[c] = dmu[c, j]
            apply_transition(step, q, d, dmu_col, dmu_pred)
            congruence(step, q, d, dsig[j], transition_work, dsig_pred)
            for k in range(d):  # dẑ = E1 dμ⁻ − J E0 dμ⁻ − ∂f/∂θ_j
                v = dmu_pred[d + k]
                for c in range(d):
                    v -= jac[k, c] * dmu_pred[c]
                if j >= d:
                    v -= jp[k, j - d]
                dz[k] = v
            if ek1:  # dH = −dJ = −(∂²f/∂y² dξ + ∂²f/∂y∂θ_j)
                for k in range(d):
                    for c in range(d):
                        v = 0.0
                        for m in range(d):
                            v += hyy[k, c, m] * dmu_pred[m]
                        if j >= d:
                            v += hyp[k, c, j - d]
                        dh[k, c] = -v
            if varies:  # dκ = ∂κ/∂ẑ · dẑ + ∂κ/∂L · dL (+ ∂ρ/∂(E0, E1 μ⁻) · dμ⁻), with dL = −dH on the E0 columns
                v = 0.0
                for k in range(d):
                    v += kappa_zbar[k] * dz[k] + kappa_mbar[k] * dmu_pred[k] + kappa_mbar[d + k] * dmu_pred[d + k]
                    if ek1:
                        for c in range(d):
                            v -= kappa_jbar[k, c] * dh[k, c]
                if j >= d:  # T(f)'s own dependence on θ (the EK0's floor)
                    v += vector_field.theta_scale * kappa_pbar[j - d]
                dkappa[j] = v
                add_noise(step, rq, q, d, v, dsig_pred)
            dstat[j] += update_tangent(update, dh, dz, work, new_dmu, dsig[j])
            for c in range(dd):
                dmu[c, j] = new_dmu[c]
        k_out = finish_step(n + 1, steps, out_index, k_out, dmu, dsig, dkappa, dmean, dvar)
    return dmean, dvar, dstat, work.rounding[0]


_R4 = nb.types.Array(nb.float64, 4, "C", readonly=True)
_STORED_BLOCK_RUN_T = nb.types.NamedTuple([_R1, _R2, _R4, _R1, _RI1], StoredRun)
_BLOCK_STEP_TANGENTS_T = nb.types.NamedTuple([nb.float64[:, :, ::1], nb.float64[:, :, :, :, ::1], nb.float64[:, ::1]],
                                             StepTangents)
_BLOCK_TANGENTS_SIG = (_TANGENT_FIELD_T, _STORED_BLOCK_RUN_T, _BLOCK_STEP_TANGENTS_T, _R2, nb.boolean)


@compile_on_first_use(_BLOCK_TANGENTS_SIG, **INLINE_JIT)
def block_filter_tangents(vector_field, run, steps, rq, local):
    """:func:`filter_tangents` for the block-diagonal and isotropic structures (:mod:`.structure`).

    ``run.r`` holds one ``(q + 1, q + 1)`` root per state (``(N + 1, d, q + 1, q + 1)``) or one shared root
    (``(N + 1, 1, q + 1, q + 1)``); ``steps.dsig`` is ``(K, P, n_blocks, q + 1, q + 1)``. State ``i`` is
    updated on its block with the scalar observation ``E1 − L_ii E0`` (``L_ii = ∂f_i/∂y_i`` for the EK1, 0 for
    the EK0), so the tangent of ``L_ii`` needs only the Hessian's rows ``∂²f_i/∂y_i∂(y, θ)`` (``d (d + n_θ)``
    numbers per step, ``vector_field.hess_y``/``hess_p`` = ``ODE.hess_rows_y``/``hess_rows_p``); the means stay
    coupled through ``f``. The local diffusion ``κ_n = Σ_i ẑ_i² / c_ii / d`` (:func:`~.structure.block_local_error`)
    is differentiated state by state. Same returns.
    """
    ts, mus, rs, kappas, out_index = run
    p, ek1 = vector_field.theta, vector_field.ek1
    q = rq.shape[0] - 1
    q1 = q + 1
    dd = mus.shape[1]
    d = dd // q1
    n_blocks = rs.shape[1]
    n_dir = steps.dmu.shape[2]
    n_out = out_index.shape[0]
    dmean = np.zeros((n_out, d, n_dir))
    dvar = np.zeros((n_out, d, n_dir))
    dstat = np.zeros(n_dir)
    dmu = steps.dmu[0].copy()
    dsig = np.zeros((n_dir, n_blocks, q1, q1))
    new_dsig = np.zeros((n_dir, n_blocks, q1, q1))
    unused_dsig = np.empty((q1, q1))
    new_dmu = np.empty((dd, n_dir))
    sig, sig_pred, transition_work = np.empty((q1, q1)), np.empty((q1, q1)), np.empty((q1, q1))
    step = np.empty((3, q1))
    mu_pred = np.empty(dd)
    dmu_pred = np.empty((dd, n_dir))
    dmu_col, pred_col = np.empty(dd), np.empty(dd)
    field = field_values(d, p.shape[0], ((d, d), (d, p.shape[0])))  # rows ∂²f_i/∂y_i∂(y, θ)
    fx, jac, jp, hyy, hyp = field.fx, field.jac, field.jp, field.hyy, field.hyp
    h_row = np.zeros((1, q1))
    dh = np.zeros((1, q1))
    z = np.empty(1)
    dz = np.empty(1)
    dz_all, dl_all = np.empty((d, n_dir)), np.empty((d, n_dir))  # dẑ_i and dL_ii in each direction
    lin1, kappa_zbar, kappa_jbar, kappa_work = np.zeros((1, 1)), np.empty(1), np.empty((1, 1)), local_error_work(q, 1)
    # every ẑ_i and L_ii, and the adjoint of the rounding floor ρ_n in them and in μ⁻ (rounding_kappa_adjoint)
    z_all, lin_diag, kappa_mbar = np.empty(d), np.zeros((d, 1)), np.zeros(dd)
    scale, scale_bar, kappa_pbar, scale_work = floor_scale_work(vector_field, d, local)
    floor = FloorInputs(step, lin_diag, z_all, mu_pred, scale)
    zbar_all, jbar_all = np.empty(d), np.empty((d, d))
    dkappa = np.zeros(n_dir)
    block_new = np.empty(q1)
    work = tangent_work(q1, 1)
    block_dmu, block_dsig_pred = work.dmu_pred, work.dsig_pred
    k_out = record_initial_outputs(out_index, dmu, d, dmean)
    for n in range(ts.shape[0] - 1):
        t_new = ts[n + 1]
        set_step(ts[n + 1] - ts[n], 1.0, q, step)
        apply_transition(step, q, d, mus[n], mu_pred)
        for j in range(n_dir):
            for k in range(dd):
                dmu_col[k] = dmu[k, j]
            apply_transition(step, q, d, dmu_col, pred_col)
            for k in range(dd):
                dmu_pred[k, j] = pred_col[k]
        evaluate_field(vector_field, t_new, mu_pred, field)
        for i in range(d):  # dẑ_i = E1 dμ⁻_i − J_i E0 dμ⁻ − ∂f_i/∂θ_j, dL_ii = ∂²f_i/∂y_i∂y dξ + ∂²f_i/∂y_i∂θ_j
            for j in range(n_dir):
                v = dmu_pred[d + i, j]
                w = 0.0
                for m in range(d):
                    v -= jac[i, m] * dmu_pred[m, j]
                    if ek1:
                        w += hyy[i, m] * dmu_pred[m, j]
                if j >= d:
                    v -= jp[i, j - d]
                    if ek1:
                        w += hyp[i, j - d]
                dz_all[i, j] = v
                dl_all[i, j] = w
        kappa = kappas[n + 1]
        dkappa[:] = 0.0
        source = KAPPA_CONSTANT
        if local:  # κ_n = max(its estimate, ρ_n): the tangent of whichever it was
            for i in range(d):
                z_all[i] = mu_pred[d + i] - fx[i]
                lin_diag[i, 0] = jac[i, i] if ek1 else 0.0
            f_scale(vector_field, t_new, field.xi, scale)
            source = diffusion_source(kappa, rounding_kappa(floor, rq, q, d))
        if source == KAPPA_ROUNDING:  # dρ = Σ_i ∂ρ/∂(ẑ_i, L_ii, E0 μ⁻_i, E1 μ⁻_i) · (dẑ_i, dL_ii, E0 dμ⁻_i, E1 dμ⁻_i)
            kappa_mbar[:] = 0.0
            kappa_pbar[:] = 0.0
            rounding_kappa_adjoint(1.0, floor, rq, q, d, FloorCotangents(zbar_all, jbar_all, kappa_mbar, scale_bar))
            f_scale_adjoint(vector_field, vector_field, t_new, field.xi, scale_bar, kappa_mbar, kappa_pbar, scale_work)
            for i in range(d):
                for j in range(n_dir):
                    dkappa[j] += (zbar_all[i] * dz_all[i, j] + jbar_all[i, i] * dl_all[i, j]
                                  + kappa_mbar[i] * dmu_pred[i, j] + kappa_mbar[d + i] * dmu_pred[d + i, j])
            for j in range(d, n_dir):  # T(f)'s own dependence on θ (the EK0's floor)
                dkappa[j] += vector_field.theta_scale * kappa_pbar[j - d]
        elif source == KAPPA_ESTIMATE:  # dκ = Σ_i ∂(ẑ_i² / c_ii / d)/∂(ẑ_i, L_ii) · (dẑ_i, dL_ii)
            for i in range(d):
                lin1[0, 0] = lin_diag[i, 0]
                z[0] = z_all[i]
                local_kappa_adjoint(1.0 / d, step, rq, q, 1, lin1, z, kappa_work, kappa_zbar, kappa_jbar)
                for j in range(n_dir):
                    dkappa[j] += kappa_zbar[0] * dz_all[i, j] + kappa_jbar[0, 0] * dl_all[i, j]
        for i in range(d):
            b = i if n_blocks > 1 else 0
            matmul_tn(rs[n, b], rs[n, b], sig)
            congruence(step, q, 1, sig, transition_work, sig_pred)
            add_noise(step, rq, q, 1, kappa, sig_pred)
            h_row[0, 0] = -jac[i, i] if ek1 else 0.0
            h_row[0, 1] = 1.0
            z[0] = mu_pred[d + i] - fx[i]
            update = linearised_update(sig_pred, h_row, z)
            for j in range(n_dir):
                for k in range(q1):
                    block_dmu[k] = dmu_pred[k * d + i, j]
                congruence(step, q, 1, dsig[j, b], transition_work, block_dsig_pred)
                add_noise(step, rq, q, 1, dkappa[j], block_dsig_pred)
                dz[0] = dz_all[i, j]
                dh[0, 0] = -dl_all[i, j]
                # (a shared isotropic block is updated once, by state 0)
                out = new_dsig[j, b] if b == i else unused_dsig
                dstat[j] += update_tangent(update, dh, dz, work, block_new, out)
                for k in range(q1):
                    new_dmu[k * d + i, j] = block_new[k]
        dmu[:, :] = new_dmu
        dsig, new_dsig = new_dsig, dsig  # every block of new_dsig was written
        k_out = finish_step(n + 1, steps, out_index, k_out, dmu, dsig, dkappa, dmean, dvar)
    return dmean, dvar, dstat, work.rounding[0]


_SMOOTHING_SIG = (_STORED_RUN_T, _SMOOTHED_RUN_T, _STEP_TANGENTS_T, _R2, nb.boolean)


@compile_on_first_use(_SMOOTHING_SIG, **INLINE_JIT)
def smoothing_tangents(run, smoothed, steps, rq, joint):
    r"""Tangents of the smoothing posterior at the steps ``run.out_index``, and its covariance across them.

    The smoother runs backwards through the kernels ``x_n | x_{n+1} ~ N(G x_{n+1} + c, Λ)`` of the filter
    posterior (Rauch, Tung & Striebel, 1965; in this form Tronarp, Bosch & Hennig, 2022):

    .. math::

        G = Σ_n Aᵀ (Σ^-_{n+1})^{-1},\quad μ^s_n = μ_n + G (μ^s_{n+1} - A μ_n),\quad
        Σ^s_n = B Σ_n Bᵀ + κ G Q Gᵀ + G Σ^s_{n+1} Gᵀ,\quad B = I - G A,

    and ``Cov(x_n, x_m) = G Cov(x_{n+1}, x_m)`` for ``n < m``. Differentiated with the filter's tangents
    ``steps`` (:func:`filter_tangents` with every step kept): ``dG = (dΣ_n Aᵀ - G dΣ^-)(Σ^-)^{-1}`` by two
    triangular solves with the predicted root, and ``Λ`` is stationary in ``G`` (it is the minimum over
    ``G`` of the Joseph form), so ``dΛ = B dΣ_n Bᵀ + dκ G Q Gᵀ`` (``dΣ⁻`` gains ``dκ Q`` too; ``dκ = 0`` unless the
    diffusion is local, ``steps.dkappa``).

    Returns ``(dmean, dvar, cov, dcov)``: the tangents (``(K, d, P)``) of ``E0 μ^s`` and ``diag(E0 Σ^s E0ᵀ)`` at
    the ``K`` output steps; if ``joint``, the covariance ``cov[a, :, b, :] = Cov(E0 x_a, E0 x_b)`` of the
    solution across the output steps (``(K, d, K, d)``) and its tangent (``(K, d, K, d, P)``), else empty.
    """
    ts, mus, rs, kappas, out_index = run
    q = rq.shape[0] - 1
    dd = mus.shape[1]
    d = dd // (q + 1)
    n_dir = steps.dmu.shape[2]
    n_out = out_index.shape[0]
    n_joint = n_out if joint else 0
    dmean = np.zeros((n_out, d, n_dir))
    dvar = np.zeros((n_out, d, n_dir))
    cov = np.zeros((n_joint, d, n_joint, d))
    dcov = np.zeros((n_joint, d, n_joint, d, n_dir))
    # Cov(x_n, E0 x_m) (D × d) and its tangents for the output steps m >= n reached so far
    cross = np.zeros((n_joint, dd, d))
    dcross = np.zeros((n_joint, n_dir, dd, d))
    a_mat = np.zeros((dd, dd))
    r_pred = np.zeros((dd, dd))
    work = backward_work(dd)
    step = np.empty((3, q + 1))
    g, b_mat, sig_s, sig_s_gt = np.empty((dd, dd)), np.empty((dd, dd)), np.empty((dd, dd)), np.empty((dd, dd))
    a_dsig, dsig_pred, dgt, dg, prod = (np.empty((dd, dd)), np.empty((dd, dd)), np.empty((dd, dd)), np.empty((dd, dd)),
                                        np.empty((dd, dd)))
    noise, gqg = np.empty((dd, dd)), np.empty((dd, dd))
    resid, innov, dmu_col = np.empty(dd), np.empty(dd), np.empty(dd)
    cross_new, cross_prod = np.empty((dd, d)), np.empty((dd, d))
    last = ts.shape[0] - 1
    dmu_s = steps.dmu[last].copy()
    dsig_s = steps.dsig[last].copy()
    new_dmu = np.empty((dd, n_dir))
    new_dsig = np.empty((n_dir, dd, dd))
    k_out = n_out - 1
    for n in range(last, -1, -1):
        matmul_tn(smoothed.r[n], smoothed.r[n], sig_s)
        while k_out >= 0 and out_index[k_out] == n:
            for k in range(d):
                for j in range(n_dir):
                    dmean[k_out, k, j] = dmu_s[k, j]
                    dvar[k_out, k, j] = dsig_s[j, k, k]
            if joint:
                for b in range(k_out + 1, n_out):
                    for k in range(d):
                        for c in range(d):
                            cov[k_out, k, b, c] = cross[b, k, c]
                            cov[b, c, k_out, k] = cross[b, k, c]
                            for j in range(n_dir):
                                dcov[k_out, k, b, c, j] = dcross[b, j, k, c]
                                dcov[b, c, k_out, k, j] = dcross[b, j, k, c]
                for k in range(dd):
                    for c in range(d):
                        cross[k_out, k, c] = sig_s[k, c]
                        for j in range(n_dir):
                            dcross[k_out, j, k, c] = dsig_s[j, k, c]
                for k in range(d):
                    for c in range(d):
                        cov[k_out, k, k_out, c] = sig_s[k, c]
                        for j in range(n_dir):
                            dcov[k_out, k, k_out, c, j] = dsig_s[j, k, c]
            k_out -= 1
        if n == 0:
            break
        # the kernel of the step from grid point n - 1 to n
        set_step(ts[n] - ts[n - 1], kappas[n], q, step)
        transition_matrix(step, q, d, a_mat)
        predict_root(rs[n - 1], step, rq, q, d, work.stack, r_pred)
        backward_gain(rs[n - 1], r_pred, step, q, d, work.wt, work.gt)
        gt = work.gt
        for a in range(dd):
            for c in range(dd):
                g[a, c] = gt[c, a]
        matmul(g, a_mat, b_mat)  # B = I − G A
        for a in range(dd):
            for c in range(dd):
                b_mat[a, c] = (1.0 if a == c else 0.0) - b_mat[a, c]
        apply_transition(step, q, d, mus[n - 1], resid)
        for a in range(dd):
            resid[a] = smoothed.mu[n, a] - resid[a]
        matmul(sig_s, gt, sig_s_gt)
        dkappa = steps.dkappa[n]
        local = False
        for j in range(n_dir):
            local = local or dkappa[j] != 0.0
        if local:  # G Q Gᵀ at unit diffusion
            noise[:, :] = 0.0
            add_noise(step, rq, q, d, 1.0, noise)
            matmul(g, noise, prod)
            matmul_nt(prod, g, gqg)
        for j in range(n_dir):
            dsig_f = steps.dsig[n - 1, j]
            # dGᵀ = (Σ⁻)⁻¹ (A dΣ_n − dΣ⁻ Gᵀ), dΣ⁻ = A dΣ_n Aᵀ + dκ Q (congruence leaves A dΣ_n in a_dsig)
            congruence(step, q, d, dsig_f, a_dsig, dsig_pred)
            if local:
                add_noise(step, rq, q, d, dkappa[j], dsig_pred)
            matmul(dsig_pred, gt, prod)
            for a in range(dd):
                for c in range(dd):
                    dgt[a, c] = a_dsig[a, c] - prod[a, c]
            solve_gram_inplace(r_pred, dd, dgt)
            for a in range(dd):
                for c in range(dd):
                    dg[a, c] = dgt[c, a]
            # dμˢ_n = dμ_n + dG (μˢ_{n+1} − A μ_n) + G (dμˢ_{n+1} − A dμ_n)
            for a in range(dd):
                dmu_col[a] = steps.dmu[n - 1, a, j]
            apply_transition(step, q, d, dmu_col, innov)
            for a in range(dd):
                innov[a] = dmu_s[a, j] - innov[a]
            for a in range(dd):
                v = steps.dmu[n - 1, a, j]
                for c in range(dd):
                    v += dg[a, c] * resid[c] + g[a, c] * innov[c]
                new_dmu[a, j] = v
            # dΣˢ_n = B dΣ_n Bᵀ + dκ G Q Gᵀ + dG Σˢ Gᵀ + (dG Σˢ Gᵀ)ᵀ + G dΣˢ_{n+1} Gᵀ
            out = new_dsig[j]
            matmul(b_mat, dsig_f, prod)
            matmul_nt(prod, b_mat, out)
            matmul(g, dsig_s[j], prod)
            matmul(prod, gt, dgt)
            matmul(dg, sig_s_gt, prod)
            for a in range(dd):
                for c in range(dd):
                    out[a, c] += prod[a, c] + prod[c, a] + dgt[a, c]
            if local:
                for a in range(dd):
                    for c in range(dd):
                        out[a, c] += dkappa[j] * gqg[a, c]
            for b in range(k_out + 1, n_joint):  # dCov(x_n, ·) = dG Cov(x_{n+1}, ·) + G dCov(x_{n+1}, ·)
                matmul(dg, cross[b], cross_new)
                matmul(g, dcross[b, j], cross_prod)
                for a in range(dd):
                    for c in range(d):
                        dcross[b, j, a, c] = cross_new[a, c] + cross_prod[a, c]
        for b in range(k_out + 1, n_joint):
            matmul(g, cross[b], cross_new)
            cross[b] = cross_new
        dmu_s, new_dmu = new_dmu, dmu_s
        dsig_s, new_dsig = new_dsig, dsig_s
    return dmean, dvar, cov, dcov
