"""Fenrir marginal likelihood kernel with an exact reverse-mode gradient (Tronarp, Bosch & Hennig, 2022).

1. The ODE filter's forward pass (:func:`~.odefilter.forward_pass`) runs over a grid that contains every
   observation time, keeping its predictions; the diffusion is fixed or calibrated (globally, or per step
   in a second pass, :func:`~.odefilter.refilter`).
2. A Kalman filter runs *backwards in time* on the backward-kernel representation of the filter
   posterior (:func:`~.smoother.backward_step`), conditioning on the data
   (:func:`~.data_update.data_update_sqrt`); the prediction-error decomposition gives one log-likelihood
   term per observation time (Tronarp, Bosch & Hennig, 2022, eq. 14–17).

Values use square-root (QR) forms throughout. The gradient of ``cotangent · terms`` is one reverse
sweep: the adjoint of the backward Kalman filter runs forward in time and deposits adjoints on the
ODE filter's posterior means and covariances (:func:`_data_filter_adjoint`); the ODE filter's adjoint
then runs backward (:func:`_filter_adjoint`). Adjoints are carried for *covariances*, computed from the
stored square roots, so no QR factor is differentiated (its derivative needs an invertible R; the
posterior after a noiseless ODE update is singular).

(A forward-only alternative, ``log p(y | z) = log p(y, z) − log p(z)`` with two forward filters, is
cheaper but cancels catastrophically when ``κ`` is small: both evidences grow like ``1/κ``.)
"""

from __future__ import annotations

import functools
import math
from collections import namedtuple

import numba as nb
import numpy as np

from pymc_pnode._callbacks import FN, call
from pymc_pnode._jit import COMPILE_LOCK, INLINE_JIT, slp_vectorization
from pymc_pnode.filtering.calibration import (
    KAPPA_CONSTANT,
    KAPPA_ESTIMATE,
    KAPPA_FLOOR,
    KAPPA_ROUNDING,
    FloorCotangents,
    FloorInputs,
    diffusion_source,
    global_kappa,
    local_error_work,
    local_kappa_adjoint,
    quadrature_defect,
    rounding_floored_kappas,
    rounding_kappa,
    rounding_kappa_adjoint,
)
from pymc_pnode.filtering.data_update import (
    ObservationModel,
    data_update_adjoint,
    data_update_sqrt,
    data_update_work,
    observation_model,
    state_observation_model,
)
from pymc_pnode.filtering.linalg import all_finite, matmul_tn
from pymc_pnode.filtering.odefilter import (
    DIFFUSION_FIXED,
    DIFFUSION_GLOBAL,
    DIFFUSION_LOCAL,
    Diffusion,
    ForwardRun,
    forward_pass,
    interval_roots,
    refilter,
    rescale_roots,
)
from pymc_pnode.filtering.predict import predict_adjoint
from pymc_pnode.filtering.smoother import (
    backward_adjoint_work,
    backward_step,
    backward_step_adjoint,
    backward_work,
)
from pymc_pnode.filtering.stepping import (
    STATUS_MAX_STEPS,
    STATUS_NONFINITE,
    STATUS_SUCCESS,
    STEPPING_T,
    Stepping,
    initial_step_size,
)
from pymc_pnode.filtering.structure import (
    DENSE,
    UpdatePrimal,
    block_adjoint_work,
    block_gram,
    block_prediction_adjoint,
    block_update_adjoint,
    gather_state,
    root_shape,
    scatter_state,
)
from pymc_pnode.filtering.update import (
    Cotangent,
    FieldDerivatives,
    GaussianObservation,
    LinearisationCotangents,
    UpdateAdjointOut,
    VectorField,
    f_scale,
    f_scale_adjoint,
    f_scale_size,
    f_scales_of_steps,
    linearisation_adjoint_work,
    linearise_adjoint,
    ode_observation_matrix,
    update_adjoint,
    update_adjoint_work,
)

# The ODE's generated functions the kernel calls (addresses of C callbacks, :mod:`pymc_pnode._callbacks`): f, its
# Jacobians, the contracted second derivatives (:attr:`pymc_pnode.ODE.hess_contract`), the Taylor coefficients of
# the exact initialisation and their vector–Jacobian product, and the bound T(f) of f's rounding with its
# vector–Jacobian product (:attr:`pymc_pnode.ODE.term_scale`; 0 unless an EK0 calibrates local diffusions).
FenrirFunctions = namedtuple("FenrirFunctions", ["rhs", "jac_y", "jac_p", "hess_contract", "taylor", "taylor_vjp",
                                                 "term_scale", "term_scale_vjp"])
_FENRIR_FUNCTIONS_T = nb.types.NamedUniTuple(FN, 8, FenrirFunctions)  # (typeof of a homogeneous namedtuple)
# Everything else the kernel takes. ``stops`` are the grid (fixed steps) or the stops the error-controlled
# steps must hit; ``stop_obs[j]`` is the data row observed at ``stops[j]`` (or -1). ``control.h0`` is
# ignored (the kernel chooses the first step). ``end_cotangent`` (length d) is a cotangent on the solution
# mean at the last stop, added to ``cotangent · terms`` (a later segment restarted from that mean depends on it).
# ``sweep_budget``: bytes a dense evaluation may store (:func:`stored_bytes_per_point`) before it runs checkpointed.
FenrirArguments = namedtuple(
    "FenrirArguments",
    ["y0", "theta", "rq", "ek1", "kappa", "diffusion_mode", "control", "stops", "stop_obs", "data", "cmat", "sigma",
     "sigma_dir", "n_sigma", "want_grad", "cotangent", "end_cotangent", "sweep_budget"],
)
# The kernel's answer when a dense evaluation would store more than ``sweep_budget``: run the checkpointed kernel.
STATUS_CHECKPOINTS = 100
# The backward Kalman filter's states before and after the data at each grid point, and its gains.
DataFilterRun = namedtuple("DataFilterRun", ["m_pre", "r_pre", "m_post", "r_post", "gs"])
# What the data filter's adjoint leaves for the ODE filter's: its deposits on (μ_n, Σ_n), each step's κ̄
# share, the predicted covariances Σ⁻_n it formed from their roots and (``rounding[0]``) the largest rounding
# bound of its updates (:func:`~.update.congruence_rounding`).
Deposits = namedtuple("Deposits", ["mean", "cov", "kbar_step", "sig_pred", "rounding"])
KBAR_ADD, KBAR_STORE, KBAR_LOCAL, KBAR_NONE = 0, 1, 2, 3  # what a reverse sweep does with each step's κ̄


def _fenrir_signature(structure: str) -> tuple:
    """The kernel's signature: the :data:`FenrirFunctions`, the :data:`FenrirArguments` and the zero initial
    root, 2-d (dense) or 3-d (block structures, :mod:`.structure`)."""
    arguments = nb.types.NamedTuple(
        [nb.float64[::1], nb.float64[::1], nb.float64[:, ::1], nb.boolean, nb.float64, nb.int64, STEPPING_T,
         nb.float64[::1], nb.int64[::1], nb.float64[:, ::1], nb.float64[:, ::1], nb.float64[::1], nb.int64[::1],
         nb.int64, nb.boolean, nb.float64[::1], nb.float64[::1], nb.float64],
        FenrirArguments,
    )
    root = nb.float64[:, ::1] if structure == DENSE else nb.float64[:, :, ::1]
    return (_FENRIR_FUNCTIONS_T, arguments, root)


@nb.njit(inline="always", **INLINE_JIT)
def _data_filter(run: ForwardRun, obs_at: np.ndarray, model: ObservationModel, rq: np.ndarray, q: int, d: int,
                 terms: np.ndarray, keep: bool, start: tuple[np.ndarray, np.ndarray, bool]
                 ) -> tuple[DataFilterRun, bool, np.ndarray, np.ndarray]:
    """The backward Kalman filter on the data: ``terms[i]`` = log p(data[i] | later data); False if not finite.

    ``start = (mean, root, update_first)``: the filter's state at the run's last point before its data (the ODE
    filter's last state for a whole run); ``update_first`` says whether the data at the run's first point are
    conditioned on here (a checkpointed sweep's interval leaves them to the interval below, which ends there).
    Returns the store (``keep``), whether it stayed finite and the state at the first point (before its data
    unless ``update_first``).

    (Here and below the bundles are unpacked before the loops: numba counts a reference at every read of
    a tuple member, which in the loops cost ≈ 20 % of the evaluation.)
    """
    dd = (q + 1) * d
    _, _, mu, r, _, r_pred, _, _, steps, _, _, _ = run
    n_seen = model.n_seen
    n_pts = mu.shape[0]
    n_store = n_pts if keep else 1
    store = DataFilterRun(np.empty((n_store, dd)), np.empty((n_store, dd, dd)), np.empty((n_store, dd)),
                          np.empty((n_store, dd, dd)), np.empty((n_store, dd, dd)))
    m_pre, r_pre, m_post, r_post, gs = store
    start_mean, start_root, update_first = start
    mean = start_mean.copy()
    root = start_root.copy()
    upd_work = data_update_work(dd, model.data.shape[1])
    work = backward_work(dd)
    gt = work.gt
    for n in range(n_pts - 1, -1, -1):
        if keep:
            m_pre[n] = mean
            r_pre[n] = root
        i = obs_at[n]
        if i >= 0 and n_seen[i] > 0 and (n > 0 or update_first):
            terms[i] = data_update_sqrt(model, i, mean, root, upd_work)
        if keep:
            m_post[n] = mean
            r_post[n] = root
        if n == 0:
            break
        backward_step(mu[n - 1], r[n - 1], r_pred[n], steps[n], rq, q, d, mean, root, work)
        if keep:
            g = gs[n]
            for i in range(dd):
                for j in range(dd):
                    g[i, j] = gt[j, i]
        if not (all_finite(mean) and all_finite(root)):
            return store, False, mean, root
    return store, all_finite(terms), mean, root


@nb.njit(inline="always", **INLINE_JIT)
def _data_filter_adjoint(
    run: ForwardRun, store: DataFilterRun, obs_at: np.ndarray, model: ObservationModel, cotangent: np.ndarray,
    rq: np.ndarray, q: int, d: int, grad_sigma: np.ndarray, carry: tuple[Cotangent, bool, bool],
) -> tuple[Deposits, bool, Cotangent]:
    """Adjoint of :func:`_data_filter` (forward in time): the deposits on the ODE filter's ``(μ_n, Σ_n)``.

    ``carry = (start, update_first, deposit_last)``: the adjoint of the data filter's state at the run's first
    point (zero for a whole run), whether the data there were conditioned on in this run (see
    :func:`_data_filter`), and whether the adjoint reached at the last point is deposited on the ODE filter's
    last state (a whole run, or a checkpointed sweep's last interval) or only returned, with the deposits, for
    the next interval.
    """
    dd = (q + 1) * d
    _, _, _, _, mu_pred, r_pred, _, _, steps, _, _, _ = run
    m_pre, r_pre, m_post, r_post, gs = store
    n_seen = model.n_seen
    n_pts = mu_pred.shape[0]
    m = model.data.shape[1]
    dep = Deposits(np.zeros((n_pts, dd)), np.zeros((n_pts, dd, dd)), np.zeros(n_pts), np.empty((n_pts, dd, dd)),
                   np.zeros(1))
    inj_mu, inj_sig, kbar_step, sig_pred, _ = dep
    start, update_first, deposit_last = carry
    bar = Cotangent(start.mean.copy(), start.cov.copy())
    mbar, sbar = bar
    sig_pre = np.empty((dd, dd))
    sig_next = np.empty((dd, dd))
    obs = GaussianObservation(np.zeros((m, dd)), np.zeros(m), np.empty(m), m)
    out = UpdateAdjointOut(np.empty(m), np.empty(m), np.zeros((m, dd)), np.zeros(1))
    upd_work = update_adjoint_work(dd, m)
    work = backward_adjoint_work(dd)
    gbar, ymat, sig, _, vec_a, vec_b = work
    mean_diff = np.empty(dd)
    for n in range(n_pts):
        i = obs_at[n]
        if i >= 0 and n_seen[i] > 0 and (n > 0 or update_first):
            matmul_tn(r_pre[n], r_pre[n], sig_pre)
            if not data_update_adjoint(model, i, m_pre[n], sig_pre, cotangent[i], bar, obs, out, upd_work,
                                       grad_sigma):
                return dep, False, bar
        if n == n_pts - 1:
            if deposit_last:
                inj_mu[n] += mbar
                inj_sig[n] += sbar
            break
        # backward step n+1 → n
        sig_pred_n, inj_mu_n, inj_sig_n, step = sig_pred[n + 1], inj_mu[n], inj_sig[n], steps[n + 1]
        matmul_tn(r_pred[n + 1], r_pred[n + 1], sig_pred_n)
        matmul_tn(r_post[n + 1], r_post[n + 1], sig_next)
        sig_next -= sig_pred_n
        for j in range(dd):
            mean_diff[j] = m_post[n + 1, j] - mu_pred[n + 1, j]
        backward_step_adjoint(gs[n + 1], r_pred[n + 1], mean_diff, sig_next, step, q, d, bar,
                              Cotangent(inj_mu_n, inj_sig_n), work)
        # ... and the part through the filter's prediction μ⁻ = A μ, Σ⁻ = A Σ Aᵀ + κ Q
        kbar_step[n + 1] = predict_adjoint(step, rq, q, d, vec_a, sig, gbar, vec_b, ymat)
        inj_mu_n += vec_b
        inj_sig_n += ymat
    dep.rounding[0] = out.rounding[0]
    return dep, True, bar


@nb.njit(inline="always", **INLINE_JIT)
def _dense_data_phase(run: ForwardRun, obs_at: np.ndarray, args: FenrirArguments, rq: np.ndarray, q: int, d: int,
                      terms: np.ndarray, grad_sigma: np.ndarray) -> tuple[Deposits, bool]:
    """The backward Kalman filter on the data (``terms``) and, with ``args.want_grad``, its adjoint: the
    deposits on the ODE filter's ``(μ_n, Σ_n)`` (noise-scale adjoints added to ``grad_sigma``). Returns
    ``(deposits, ok)``; ``ok`` is False if a value is not finite or an update singular. Dense roots.
    """
    dd = (q + 1) * d
    model = observation_model(args.data, args.cmat, args.sigma, args.sigma_dir)
    last = run.mu.shape[0] - 1
    store, finite, _, _ = _data_filter(run, obs_at, model, rq, q, d, terms, args.want_grad,
                                       (run.mu[last], run.r[last], True))
    if not (finite and args.want_grad):
        empty = Deposits(np.zeros((0, dd)), np.zeros((0, dd, dd)), np.zeros(0), np.zeros((0, dd, dd)), np.zeros(1))
        return empty, finite
    no_carry = (Cotangent(np.zeros(dd), np.zeros((dd, dd))), True, True)
    dep, finite, _ = _data_filter_adjoint(run, store, obs_at, model, args.cotangent, rq, q, d, grad_sigma, no_carry)
    return dep, finite


@nb.njit(inline="always", **INLINE_JIT)
def _block_data_phase(run: ForwardRun, obs_at: np.ndarray, args: FenrirArguments, rq: np.ndarray, q: int, d: int,
                      terms: np.ndarray, grad_sigma: np.ndarray) -> tuple[Deposits, bool]:
    """:func:`_dense_data_phase` for block-diagonal (or isotropic) roots: the posterior is a product over the
    states given the means, so each state runs the dense data filter on its own block with the observation rows
    that select it.
    """
    grid, stop, mu, r, mu_pred, r_pred, lin, zhat, steps, kappa, local_kappa, _ = run
    n_pts, n_blocks = r.shape[0], r.shape[1]
    q1 = q + 1
    want = args.want_grad
    kept = n_pts if want else 0
    dep = Deposits(np.zeros((kept, q1 * d)), np.zeros((kept,) + r.shape[1:]), np.zeros(n_pts),
                   np.empty((kept,) + r.shape[1:]), np.zeros(1))
    for n in range(1, kept):
        block_gram(r_pred[n], dep.sig_pred[n])
    mu1, mu_pred1 = np.empty((n_pts, q1)), np.empty((n_pts, q1))
    terms1 = np.empty(args.data.shape[0])
    for i in range(d):
        model, m_i = state_observation_model(args.data, args.cmat, args.sigma, args.sigma_dir, i)
        if m_i == 0:
            continue
        b = i if n_blocks > 1 else 0
        for n in range(n_pts):
            gather_state(mu[n], q, d, i, mu1[n])
            gather_state(mu_pred[n], q, d, i, mu_pred1[n])
        run1 = ForwardRun(grid, stop, mu1, np.ascontiguousarray(r[:, b]), mu_pred1,
                          np.ascontiguousarray(r_pred[:, b]), lin, zhat, steps, kappa, local_kappa, 0)
        terms1[:] = 0.0
        store, finite, _, _ = _data_filter(run1, obs_at, model, rq, q, 1, terms1, want,
                                           (mu1[n_pts - 1], run1.r[n_pts - 1], True))
        if not finite:
            return dep, False
        terms += terms1
        if want:
            no_carry = (Cotangent(np.zeros(q1), np.zeros((q1, q1))), True, True)
            dep1, finite, _ = _data_filter_adjoint(run1, store, obs_at, model, args.cotangent, rq, q, 1, grad_sigma,
                                                   no_carry)
            if not finite:
                return dep, False
            for n in range(n_pts):
                scatter_state(dep1.mean[n], q, d, i, dep.mean[n])
                dep.cov[n, b] += dep1.cov[n]
                dep.kbar_step[n] += dep1.kbar_step[n]
            dep.rounding[0] = max(dep.rounding[0], dep1.rounding[0])
    return dep, True


@nb.njit(inline="always", **INLINE_JIT)
def _filter_adjoint(
    field: VectorField, derivs: FieldDerivatives, run: ForwardRun, rq: np.ndarray, q: int, d: int,
    start: Cotangent, deposits: Deposits, weights: tuple[float, int], grad: np.ndarray,
) -> tuple[Cotangent, bool, float]:
    """One reverse sweep of the ODE filter ``run`` (backward in time), to the adjoint of its initial mean.

    The sweep starts from ``start`` (adjoints of the last ``(μ, Σ)``) and adds ``deposits`` (when it has
    rows, with the predicted covariances they bring) at every earlier step. ``weights = (w_stat, kbar_mode)``:
    ``w_stat`` weighs ``ẑᵀS⁻¹ẑ`` (global calibration's second sweep); ``kbar_mode`` says what becomes of each
    step's diffusion adjoint ``κ̄``: added to the κ entry of ``grad`` (``KBAR_ADD``), added to
    ``deposits.kbar_step`` (``KBAR_STORE``: local calibration, first sweep, after the data filter's share),
    used to differentiate each step's local ``κ_n`` (``KBAR_LOCAL``: second sweep, on the unit-diffusion
    run) or nothing (``KBAR_NONE``). Adds the adjoints of ``θ`` to ``grad``; False if an update is singular.
    """
    dd = (q + 1) * d
    grid, _, _, r, mu_pred, r_pred, lin, zhat, steps, _, local_kappa, _ = run
    inj_mu, inj_sig, kbar_step, sig_pred_dep, _ = deposits
    n_pts = grid.shape[0]
    k = field.theta.shape[0]
    w_stat, kbar_mode = weights
    kdir = grad.shape[0] - 1
    inject = inj_mu.shape[0] == n_pts
    grad_theta = grad[d:d + k]
    bar = Cotangent(start.mean.copy(), start.cov.copy())
    mbar, sbar = bar
    hm, noise_var = np.zeros((d, dd)), np.zeros(d)
    out = UpdateAdjointOut(np.empty(d), np.empty(d), np.zeros((d, dd)), np.zeros(1))
    upd_work = update_adjoint_work(dd, d)
    lin_work = linearisation_adjoint_work(d, k)
    err_work = local_error_work(q, d)
    zbar, jbar = np.zeros(d), np.zeros((d, d))
    cot = LinearisationCotangents(out.rbar, out.hbar, zbar, jbar)
    scale = np.empty(f_scale_size(field, d) if kbar_mode == KBAR_LOCAL else 0)
    floor_cot = FloorCotangents(zbar, jbar, mbar, np.empty(scale.shape[0]))
    sig_pred = np.empty((dd, dd))
    sig_post = np.empty((dd, dd))
    work = np.empty((dd, dd))
    mbar_prev = np.empty(dd)
    xi = np.empty(d)
    for n in range(n_pts - 1, 0, -1):
        t = grid[n]
        for c in range(d):
            xi[c] = mu_pred[n, c]
        ode_observation_matrix(lin[n], d, hm)
        if field.ek1:
            matmul_tn(r[n], r[n], sig_post)
        if inject:
            sig_pred[:, :] = sig_pred_dep[n]
        else:
            matmul_tn(r_pred[n], r_pred[n], sig_pred)
        if not update_adjoint(GaussianObservation(hm, noise_var, zhat[n], d), sig_pred, sig_post, mu_pred[n],
                              (w_stat, 0.0), bar, field.ek1, out, upd_work):
            return bar, False, out.rounding[0]
        step = steps[n]
        zbar[:] = 0.0
        jbar[:, :] = 0.0
        if kbar_mode == KBAR_LOCAL:
            # The second pass's κ_n = max(ẑᵀ(H Q Hᵀ)⁻¹ẑ / d, ρ_n) with ẑ, L of this (unit-diffusion) run: ẑ̄ and L̄ of
            # whichever it was join the linearisation's adjoint (ρ_n's path through E1 μ⁻ joins μ̄⁻ directly).
            f_scale(field, t, xi, scale)
            floor = FloorInputs(step, lin[n], zhat[n], mu_pred[n], scale)
            source = diffusion_source(local_kappa[n], rounding_kappa(floor, rq, q, d))
            if source == KAPPA_ESTIMATE:
                local_kappa_adjoint(kbar_step[n], step, rq, q, d, lin[n], zhat[n], err_work, zbar, jbar)
            elif source == KAPPA_ROUNDING:
                rounding_kappa_adjoint(kbar_step[n], floor, rq, q, d, floor_cot)
                f_scale_adjoint(field, derivs, t, xi, floor_cot.f_scale_bar, mbar, grad_theta, lin_work)
        linearise_adjoint(field, derivs, t, xi, lin[n], (d, False), cot, mbar, grad_theta, lin_work)
        # Prediction μ⁻ = A μ, Σ⁻ = A Σ Aᵀ + κ Q(h), then the deposits of the data filter on (μ, Σ)_{n−1}.
        kbar_n = predict_adjoint(step, rq, q, d, mbar, sbar, work, mbar_prev, sig_pred)
        if kbar_mode == KBAR_ADD:
            grad[kdir] += kbar_n
        elif kbar_mode == KBAR_STORE:
            kbar_step[n] += kbar_n
        mbar[:] = mbar_prev
        sbar[:, :] = sig_pred
        if inject:
            mbar += inj_mu[n - 1]
            sbar += inj_sig[n - 1]
    return bar, True, out.rounding[0]


@nb.njit(inline="always", **INLINE_JIT)
def _block_filter_adjoint(
    field: VectorField, derivs: FieldDerivatives, run: ForwardRun, rq: np.ndarray, q: int, d: int,
    start: Cotangent, deposits: Deposits, weights: tuple[float, int], grad: np.ndarray,
) -> tuple[Cotangent, bool, float]:
    """:func:`_filter_adjoint` for block-diagonal and isotropic runs (:mod:`.structure`).

    The dense sweep keeps its own loop: written through these block operations (bundled work and primal
    values, a call per operation) the dense FitzHugh–Nagumo logp + gradient was 16 % slower (measured).
    """
    dd = (q + 1) * d
    grid, _, _, r, mu_pred, r_pred, lin, zhat, steps, _, local_kappa, _ = run
    inj_mu, inj_sig, kbar_step, sig_pred_dep, _ = deposits
    n_pts = grid.shape[0]
    k = field.theta.shape[0]
    w_stat, kbar_mode = weights
    kdir = grad.shape[0] - 1
    inject = inj_mu.shape[0] == n_pts
    grad_theta = grad[d:d + k]
    bar = Cotangent(start.mean.copy(), start.cov.copy())
    mbar, sbar = bar
    work = block_adjoint_work(r[0], q, d)
    lin_work = linearisation_adjoint_work(d, k)
    shape = root_shape(r[0], q, d)
    sig_pred, sig_prev, congruence_work = np.empty(shape), np.empty(shape), np.empty(shape)
    mbar_prev = np.empty(dd)
    xi = np.empty(d)
    scale = np.empty(f_scale_size(field, d) if kbar_mode == KBAR_LOCAL else 0)
    scale_bar = np.empty(scale.shape[0])
    for n in range(n_pts - 1, 0, -1):
        t = grid[n]
        for c in range(d):
            xi[c] = mu_pred[n, c]
        if inject:
            sig_pred[:] = sig_pred_dep[n]
        else:
            block_gram(r_pred[n], sig_pred)
        step = steps[n]
        # κ_n = max(ẑᵀ(H Q Hᵀ)⁻¹ẑ / d, ρ_n) with ẑ, L of this (unit-diffusion) run, as in _filter_adjoint
        source = KAPPA_CONSTANT
        f_scale(field, t, xi, scale)
        floor = FloorInputs(step, lin[n], zhat[n], mu_pred[n], scale)
        if kbar_mode == KBAR_LOCAL:
            source = diffusion_source(local_kappa[n], rounding_kappa(floor, rq, q, d))
        kbar_local = kbar_step[n] if source == KAPPA_ESTIMATE else 0.0
        primal = UpdatePrimal(r[n], mu_pred[n], lin[n], zhat[n], step)
        if not block_update_adjoint(sig_pred, primal, rq, (q, d, field.ek1), (w_stat, kbar_local), bar, work):
            return bar, False, work.out.rounding[0]
        if source == KAPPA_ROUNDING:
            rounding_kappa_adjoint(kbar_step[n], floor, rq, q, d,
                                   FloorCotangents(work.cot.zbar, work.cot.jbar, mbar, scale_bar))
            f_scale_adjoint(field, derivs, t, xi, scale_bar, mbar, grad_theta, lin_work)
        linearise_adjoint(field, derivs, t, xi, lin[n], (d, True), work.cot, mbar, grad_theta, lin_work)  # L = diag J
        # Prediction μ⁻ = A μ, Σ⁻ = A Σ Aᵀ + κ Q(h), then the deposits of the data filter on (μ, Σ)_{n−1}.
        kbar_n = block_prediction_adjoint(step, rq, q, d, mbar, sbar, congruence_work, mbar_prev, sig_prev)
        if kbar_mode == KBAR_ADD:
            grad[kdir] += kbar_n
        elif kbar_mode == KBAR_STORE:
            kbar_step[n] += kbar_n
        mbar[:] = mbar_prev
        sbar[:] = sig_prev
        if inject:
            mbar += inj_mu[n - 1]
            sbar += inj_sig[n - 1]
    return bar, True, work.out.rounding[0]


def checkpoint_interval(n_pts: int) -> int:
    """Grid steps per interval of a checkpointed sweep of ``n_pts`` grid points when its run keeps every root:
    about ``√(0.4 n_pts)``, which minimises what the sweep holds at once (one interval's store and deposits, five
    ``D×D`` matrices per point, and two at every interval bound)."""
    return max(1, int(round(math.sqrt(0.4 * n_pts))))


checkpoint_interval_jit = nb.njit(**INLINE_JIT)(checkpoint_interval)


@nb.njit(**INLINE_JIT)
def stored_bytes_per_point(q: int, d: int, local: bool, want_grad: bool) -> float:
    """Bytes that a dense evaluation without checkpoints stores per grid point: the forward run (its root and
    predicted root, means, linearisation, coefficients; twice with the local diffusion's second pass) and, for a
    gradient, the data phase's store and deposits (five ``D×D`` matrices)."""
    dd = (q + 1) * d
    run = 2.0 * dd * dd + 2.0 * dd + d * d + d + 3.0 * (q + 1) + 4.0
    data = 5.0 * dd * dd + 3.0 * dd + 1.0 if want_grad else 0.0
    return 8.0 * ((2.0 if local else 1.0) * run + data)


@nb.njit(**INLINE_JIT)
def checkpoint_slots(budget: float, dd: int, n_pts: int, runs: int) -> int:
    """Root rows of each of the ``runs`` thin forward runs of a checkpointed sweep (``root_slots`` of
    :func:`~.odefilter.forward_pass`) over ``n_pts`` grid points (0: not known in advance, error control). The sweep
    holds the kept roots, the data filter's state and adjoint at each interval bound and one interval's seven
    ``D×D`` matrices per point: about ``√(7 N / (runs + 2))`` kept roots minimise that, whatever the budget (fewer
    would lengthen the intervals), and the rows (of which a thin run keeps more than half) are 1.5 times as many.
    When ``N`` is not known: an eighth of the ``B = budget / (8 D²)`` ``D×D`` matrices the budget holds. Even, at
    least 4."""
    if n_pts > 0:
        return max(4, 2 * int(math.ceil(0.75 * math.sqrt(7.0 * n_pts / (runs + 2)))))
    return max(4, 2 * int(min(budget / (128.0 * dd * dd), 1e9)))


@nb.njit(**INLINE_JIT)
def _interval_bounds(n_pts: int, stride: int) -> np.ndarray:
    """The bounds of a checkpointed sweep's intervals over a thin run of ``n_pts`` points: multiples of its root
    ``stride`` (where it kept a root), :func:`checkpoint_interval` apart or the nearest multiple of the stride, and
    the last point."""
    width = stride * max(1, int(round(checkpoint_interval_jit(n_pts) / stride)))
    n_int = (n_pts - 2) // width + 1
    bounds = np.empty(n_int + 1, dtype=np.int64)
    for s in range(n_int):
        bounds[s] = s * width
    bounds[n_int] = n_pts - 1
    return bounds


# The checkpointed sweep calls each phase at several places: there they are outlined, one compiled copy each,
# rather than inlined at every call site (fewer copies for numba and LLVM to compile; a kernel compiled only when a
# model needs it does not need the last percent of speed).
_OUTLINED_JIT = dict(INLINE_JIT, forceinline=False)


@nb.njit(**_OUTLINED_JIT)
def _interval(run, a, b, rq, q, d):
    return interval_roots(run, a, b, rq, q, d)


@nb.njit(**_OUTLINED_JIT)
def _interval_data_filter(run, obs_at, model, rq, q, d, terms, keep, start):
    return _data_filter(run, obs_at, model, rq, q, d, terms, keep, start)


@nb.njit(**_OUTLINED_JIT)
def _interval_data_adjoint(run, store, obs_at, model, cotangent, rq, q, d, grad_sigma, carry):
    return _data_filter_adjoint(run, store, obs_at, model, cotangent, rq, q, d, grad_sigma, carry)


@nb.njit(**_OUTLINED_JIT)
def _interval_filter_adjoint(field, derivs, run, rq, q, d, start, deposits, weights, grad):
    return _filter_adjoint(field, derivs, run, rq, q, d, start, deposits, weights, grad)


@nb.njit(inline="always", **INLINE_JIT)
def _checkpointed_dense_sweep(
    field: VectorField, derivs: FieldDerivatives, run: ForwardRun, obs_at: np.ndarray, args: FenrirArguments,
    rq: np.ndarray, q: int, d: int, terms: np.ndarray, grad: np.ndarray, kbar_mode: int,
) -> tuple[np.ndarray, Cotangent, bool, float]:
    """:func:`_dense_data_phase` and the first sweep of :func:`_filter_adjoint` (with the gradient) over a thin
    ``run`` (:func:`~.odefilter.forward_pass` with root slots), in the intervals of :func:`_interval_bounds`,
    holding one interval's roots, data-filter store and deposits at a time.

    Three passes over the intervals: the data filter backward, keeping only its state at the bounds (all of a
    value-only evaluation); its adjoint forward (the store of each interval recomputed from its upper bound),
    keeping only its adjoint at the bounds; then, backward, each interval's store and deposits once more and the
    ODE filter's adjoint over it. Each pass recomputes an interval's roots from the root kept at its lower bound
    (:func:`~.odefilter.interval_roots`), the data filter runs three times and its adjoint twice; the numbers are
    those of the stored sweep (every operation repeats on the same inputs, in the same order). Returns each
    step's ``κ̄`` (as the stored sweep leaves it), the adjoint of the initial state, whether it stayed finite and
    the largest rounding bound of the updates.
    """
    dd = (q + 1) * d
    k = args.theta.shape[0]
    kdir = grad.shape[0] - 1
    n_pts = run.grid.shape[0]
    bounds = _interval_bounds(n_pts, run.root_stride)
    n_int = bounds.shape[0] - 1
    model = observation_model(args.data, args.cmat, args.sigma, args.sigma_dir)
    kbar_step = np.zeros(n_pts)
    top = Cotangent(np.zeros(dd), np.zeros((dd, dd)))
    failed = (kbar_step, top, False, 0.0)
    # 1. the data filter, backward: its state at each bound (before the data there)
    state_mean, state_root = np.empty((n_int + 1, dd)), np.empty((n_int + 1, dd, dd))
    for s in range(n_int - 1, -1, -1):
        a, b = bounds[s], bounds[s + 1]
        interval = _interval(run, a, b, rq, q, d)
        if s == n_int - 1:
            state_mean[n_int] = run.mu[n_pts - 1]
            state_root[n_int] = interval.r[b - a]
        _, finite, mean, root = _interval_data_filter(interval, obs_at[a:b + 1], model, rq, q, d, terms, False,
                                                      (state_mean[s + 1], state_root[s + 1], s == 0))
        if not finite:
            return failed
        state_mean[s] = mean
        state_root[s] = root
    if not args.want_grad:
        return kbar_step, top, True, 0.0
    # 2. its adjoint, forward: the adjoint at each bound, each step's κ̄ share and the deposits at the last point
    grad_sigma = grad[d + k:kdir]
    carry_mean, carry_cov = np.zeros((n_int + 1, dd)), np.zeros((n_int + 1, dd, dd))
    rounding = 0.0
    for s in range(n_int):
        a, b = bounds[s], bounds[s + 1]
        interval = _interval(run, a, b, rq, q, d)
        store, finite, _, _ = _interval_data_filter(interval, obs_at[a:b + 1], model, rq, q, d, terms, True,
                                                    (state_mean[s + 1], state_root[s + 1], s == 0))
        if not finite:
            return failed
        dep, finite, bar = _interval_data_adjoint(interval, store, obs_at[a:b + 1], model, args.cotangent, rq, q, d,
                                                  grad_sigma, (Cotangent(carry_mean[s], carry_cov[s]), s == 0,
                                                               s == n_int - 1))
        if not finite:
            return failed
        carry_mean[s + 1] = bar.mean
        carry_cov[s + 1] = bar.cov
        kbar_step[a + 1:b + 1] = dep.kbar_step[1:]
        rounding = max(rounding, dep.rounding[0])
        if s == n_int - 1:
            top = Cotangent(dep.mean[b - a].copy(), dep.cov[b - a].copy())
    for n in range(1, n_pts):
        grad[kdir] += kbar_step[n]
    # 3. the ODE filter's adjoint, backward, each interval's store and deposits recomputed (their σ̄ counted above)
    scratch_sigma = np.zeros(grad_sigma.shape[0])
    top.mean[:d] += args.end_cotangent
    bar = top
    for s in range(n_int - 1, -1, -1):
        a, b = bounds[s], bounds[s + 1]
        interval = _interval(run, a, b, rq, q, d)
        store, _, _, _ = _interval_data_filter(interval, obs_at[a:b + 1], model, rq, q, d, terms, True,
                                               (state_mean[s + 1], state_root[s + 1], s == 0))
        dep, _, _ = _interval_data_adjoint(interval, store, obs_at[a:b + 1], model, args.cotangent, rq, q, d,
                                           scratch_sigma, (Cotangent(carry_mean[s], carry_cov[s]), s == 0,
                                                           s == n_int - 1))
        bar, finite, bound = _interval_filter_adjoint(field, derivs, interval, rq, q, d, bar, dep, (0.0, kbar_mode),
                                                      grad)
        if not finite:
            return failed
        rounding = max(rounding, bound)
        kbar_step[a + 1:b + 1] = dep.kbar_step[1:]
    return kbar_step, bar, True, rounding


@nb.njit(inline="always", **INLINE_JIT)
def _sweep_in_intervals(field: VectorField, derivs: FieldDerivatives, run: ForwardRun, rq: np.ndarray, q: int,
                        d: int, kbar_step: np.ndarray, weights: tuple[float, int], grad: np.ndarray,
                        ) -> tuple[Cotangent, bool, float]:
    """:func:`_filter_adjoint` without deposits (the second sweep of a calibrated diffusion, from a zero
    cotangent) over a thin ``run``, interval by interval, backward (the intervals of
    :func:`_checkpointed_dense_sweep`, their roots recomputed)."""
    dd = (q + 1) * d
    bounds = _interval_bounds(run.grid.shape[0], run.root_stride)
    bar = Cotangent(np.zeros(dd), np.zeros((dd, dd)))
    rounding = 0.0
    for s in range(bounds.shape[0] - 2, -1, -1):
        a, b = bounds[s], bounds[s + 1]
        deposits = Deposits(np.zeros((0, dd)), np.zeros((0, dd, dd)), kbar_step[a:b + 1].copy(),
                            np.zeros((0, dd, dd)), np.zeros(1))
        bar, finite, bound = _interval_filter_adjoint(field, derivs, _interval(run, a, b, rq, q, d), rq, q, d, bar,
                                                      deposits, weights, grad)
        if not finite:
            return bar, False, rounding
        rounding = max(rounding, bound)
    return bar, True, rounding


@nb.njit(inline="always", **INLINE_JIT)
def _initial_state_adjoint(taylor_vjp, args: FenrirArguments, t0: float, mbar: np.ndarray, q: int, d: int,
                           grad: np.ndarray) -> None:
    """Adjoint of the exact initialisation ``μ₀ = Taylor coefficients of (y0, θ)`` (``Σ₀ = 0``)."""
    k = args.theta.shape[0]
    gy = np.empty(d)
    gp = np.empty(k)
    call(taylor_vjp, args.y0, t0, args.theta, np.ascontiguousarray(mbar).reshape((q + 1, d)), gy, gp)
    for j in range(d):
        grad[j] += gy[j]
    for j in range(k):
        grad[d + j] += gp[j]


# Largest number of states with a kernel of its own (see :func:`_fenrir_kernel`); larger systems share one kernel
# per order. At d = 4 the own kernel is 1.36× faster but takes ≈ 100 s to compile; compiling one for d = 5 aborted
# the process inside LLVM ("Instruction does not dominate all uses"; benchmarks/results/scale.md). Checked to
# compile: d = 3, 4 for q = 1…5, d = 2 for q = 4 and the sizes the tests use.
SPECIALISED_MAX_STATES = 4


def fenrir_kernel(q: int, d: int, structure: str = DENSE, checkpointed: bool = False):
    """The Fenrir kernel for IWP order ``q``, ``d`` states and a state-space ``structure`` (:func:`_fenrir_kernel`:
    a dense filter has its own for ``d <= SPECIALISED_MAX_STATES``, else the kernel of any ``d``; the
    block-diagonal and isotropic structures share one kernel per order), compiled once per process also
    when sampler threads ask at once (:data:`~pymc_pnode._jit.COMPILE_LOCK`). ``checkpointed``: the dense kernel
    for evaluations that would store more than ``FenrirArguments.sweep_budget`` (the default kernel then returns
    :data:`STATUS_CHECKPOINTS`): thin runs, every phase in intervals; compiled only when a model needs it."""
    specialised = structure == DENSE and d <= SPECIALISED_MAX_STATES
    with COMPILE_LOCK:
        return _fenrir_kernel(q, d if specialised else 0, structure if structure == DENSE else "blocks",
                              bool(checkpointed) and structure == DENSE)


@functools.lru_cache(maxsize=None)
def _fenrir_kernel(q: int, n_states: int, structure: str, checkpointed: bool = False):
    """The Fenrir kernel ``fenrir_terms`` compiled for IWP order ``q`` and ``n_states`` states (0: any number),
    dense or with block roots (``structure``).

    The sizes are closure constants, so numba compiles (and caches on disk) one kernel per
    ``(q, n_states)``: with the helpers inlined (``_jit.INLINE_JIT``), LLVM sees fixed trip counts in every
    small dense loop, unrolls them and, with ``slp_vectorization``, turns them into vector
    instructions. Compiling a new ``(q, n_states)`` takes one to two minutes once (86–140 s for ``(3, 2)`` into
    an empty cache on the development machine, 2026-12-07; ``benchmarks/compile_profile.py``). The gain is in small
    systems; a kernel of its own for every larger ``d`` would make each new model size pay that compile
    (``n_states = 0``: ``d`` is read from ``y0`` at run time).
    """

    def fenrir_terms(functions, args, r0):
        """Per-observation Fenrir log-likelihood terms and, optionally, a vector–Jacobian product.

        The solver steps from ``stops[0]`` through every entry of ``args.stops``. Without
        ``control.adaptive`` the stops are the grid. With it the steps in between are chosen by the local
        error estimate and the PI controller of :func:`~pymc_pnode.filtering.odefilter.forward_pass` at
        ``rtol``/``atol`` (at most ``max_steps`` accepted steps); the gradient is that of the computation on
        the chosen grid. ``data`` rows may contain NaN (missing components are skipped); the observation is
        ``data[i] = cmat @ y(t_i) + noise`` with independent noise of standard deviation ``sigma[c]`` per
        component ``c``, which is parameter ``sigma_dir[c]`` of ``n_sigma``. With ``want_grad`` the gradient
        of ``cotangent · terms + end_cotangent · y_end`` with respect to ``(y0, θ, noise scales, κ)`` is
        returned (reverse mode).

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

        Every step's scaled local error estimate is computed; its maximum over the grid is reported.

        Returns ``(terms, grad, ok, info, grid, y_end)`` with the solver grid, the solution mean ``y_end`` at
        the last stop and ``info = [largest scaled local error of an accepted step, κ used, accepted steps,
        rejected steps, status, rounding bound of the reverse sweep, largest scaled quadrature defect of the
        means the likelihood used, steps exactly at an equilibrium]`` (status codes of ``stepping``; the
        defect: :func:`~pymc_pnode.filtering.calibration.quadrature_defect`; the equilibrium:
        :func:`~pymc_pnode.filtering.calibration.at_equilibrium`); ``ok`` is False when the solve failed:
        non-finite values, a fixed step that fails :func:`~pymc_pnode.filtering.stepping.fixed_step_failed`,
        ``max_steps`` reached, a collapsing step or a jump of ``f`` in ``t``.
        """
        rhs, jac_y, jac_p, hess_contract, taylor, taylor_vjp, term_scale, term_scale_vjp = functions
        theta, stops, rq = args.theta, args.stops, args.rq
        d = n_states if n_states > 0 else args.y0.shape[0]
        k = theta.shape[0]
        dd = (q + 1) * d
        n_obs = args.data.shape[0]
        terms = np.zeros(n_obs)
        grad = np.zeros(d + k + args.n_sigma + 1)
        info = np.zeros(8)
        y_end = np.zeros(d)
        field = VectorField(rhs, jac_y, term_scale, theta, args.ek1)

        # ---------------------------------------------------------------- forward ODE filter
        coeffs = np.empty((q + 1, d))
        call(taylor, args.y0, stops[0], theta, coeffs)
        mu0 = coeffs.reshape(dd).copy()
        if not all_finite(mu0):
            return terms, grad, False, info, stops[:1], y_end
        c = args.control
        mode = args.diffusion_mode
        # A dense evaluation that would store more than the budget runs checkpointed (its own kernel, asked for
        # with STATUS_CHECKPOINTS): at once with fixed steps, when the steps reach the budget's number of points
        # with error control (a pass of the steps that fit is wasted).
        max_steps = c.max_steps
        if r0.ndim == 2 and not checkpointed:
            fit = int(min(args.sweep_budget / stored_bytes_per_point(q, d, mode == DIFFUSION_LOCAL, args.want_grad),
                          1e15))
            if not c.adaptive and stops.shape[0] > fit:
                info[4] = STATUS_CHECKPOINTS
                return terms, grad, False, info, stops[:1], y_end
            max_steps = min(max_steps, max(fit - 1, 0))
        h0 = math.inf
        if c.adaptive:
            h0 = min(initial_step_size(rhs, args.y0, stops[0], theta, c.rtol, c.atol), stops[-1] - stops[0])
        control = Stepping(c.adaptive, h0, c.rtol, c.atol, max_steps, True)
        kappa = args.kappa if mode == DIFFUSION_FIXED else 1.0
        root_slots = 0
        if checkpointed:  # thin runs
            root_slots = checkpoint_slots(args.sweep_budget, dd, 0 if c.adaptive else stops.shape[0],
                                          2 if mode == DIFFUSION_LOCAL else 1)
        run, stats = forward_pass(field, mu0, r0, rq, q, d, Diffusion(DIFFUSION_FIXED, kappa),
                                  control, stops, True, root_slots)
        info[0], info[2], info[3], info[4] = stats.max_error, stats.n_steps, stats.n_rejected, stats.status
        info[7] = stats.n_at_equilibrium
        if stats.status != STATUS_SUCCESS:
            if stats.status == STATUS_MAX_STEPS and max_steps < c.max_steps:
                info[4] = STATUS_CHECKPOINTS
            return terms, grad, False, info, run.grid, y_end  # the grid up to where the solve stopped
        n_pts = run.grid.shape[0]
        if mode == DIFFUSION_GLOBAL:
            kappa = global_kappa(stats.stat_sum, n_pts - 1, d)
            if math.isnan(kappa):
                return terms, grad, False, info, stops[:1], y_end
            rescale_roots(run, kappa)
        info[1] = kappa
        # Local calibration, second pass: the filter again over the grid with κ_n from the unit-diffusion
        # pass. Computing κ_n inside the filter it scales (one pass) feeds each κ_n back into the next
        # residuals; the likelihood then jumps by ~1e-3 nats under 1e-7 changes of θ and NUTS fails.
        unit_run = run
        if mode == DIFFUSION_LOCAL:
            scales = f_scales_of_steps(field, unit_run.grid, unit_run.mu_pred, d)
            run, finite = refilter(field, unit_run, rq, q, d, rounding_floored_kappas(unit_run, scales, rq, q, d))
            if not finite:
                info[4] = STATUS_NONFINITE
                return terms, grad, False, info, stops[:1], y_end
        y_end[:] = run.mu[n_pts - 1, :d]
        info[6] = quadrature_defect(run.grid, run.mu, q, d, c.rtol, c.atol)
        obs_at = np.empty(n_pts, dtype=np.int64)
        stop, stop_obs = run.stop, args.stop_obs
        for n in range(n_pts):
            obs_at[n] = stop_obs[stop[n]] if stop[n] >= 0 else -1

        # ---------------------------------------------------------------- backward Kalman filter on data
        # (with the gradient, part 1 of the reverse sweep too: the adjoint of the backward Kalman filter, forward in
        # time, deposits on the ODE filter's (μ_n, Σ_n))
        kdir = grad.shape[0] - 1
        derivs = FieldDerivatives(jac_p, hess_contract, term_scale_vjp)
        first_kbar = KBAR_STORE if mode == DIFFUSION_LOCAL else KBAR_ADD
        first_sweep = 0
        if checkpointed:  # a thin run: every phase interval by interval
            kbar_step, bar, finite, rounding = _checkpointed_dense_sweep(field, derivs, run, obs_at, args, rq, q, d,
                                                                         terms, grad, first_kbar)
            if not finite:
                return terms, grad, False, info, stops[:1], y_end
            if not args.want_grad:
                return terms, grad, True, info, run.grid, y_end
            _initial_state_adjoint(taylor_vjp, args, stops[0], bar.mean, q, d, grad)
            dep = Deposits(np.zeros((0, dd)), np.zeros((0, dd, dd)), kbar_step, np.zeros((0, dd, dd)),
                           np.full(1, rounding))
            first_sweep = 1
        else:
            if r0.ndim == 2:  # the structure (a compile-time branch: r0 is an argument)
                dep, finite = _dense_data_phase(run, obs_at, args, rq, q, d, terms, grad[d + k:kdir])
            else:
                dep, finite = _block_data_phase(run, obs_at, args, rq, q, d, terms, grad[d + k:kdir])
            if not finite:
                return terms, grad, False, info, stops[:1], y_end
            if not args.want_grad:
                return terms, grad, True, info, run.grid, y_end
            for n in range(1, n_pts):
                grad[kdir] += dep.kbar_step[n]

        # ---------------------------------------------------------------- reverse sweep
        info[5] = dep.rounding[0]
        # Part 2: adjoint of the ODE filter (backward in time). With global calibration a second sweep carries
        # the path through κ̂ = κ̂₀ Σ ẑᵀS_κ̂₀⁻¹ẑ / (N d): cotangent ∂L/∂κ · κ̂₀ / (N d) on every ẑᵀS⁻¹ẑ. With
        # local calibration the first sweep collects each step's κ̄_n (part 1's share plus ⟨Σ̄⁻_n, Q_n⟩) and the
        # second sweep runs through the unit-diffusion pass, where κ_n(ẑ_n, L_n) was computed.
        second = n_pts > 1 and ((mode == DIFFUSION_GLOBAL and kappa > KAPPA_FLOOR) or mode == DIFFUSION_LOCAL)
        sweep_run, deposits = run, dep
        start = Cotangent(np.zeros(dd), np.zeros(root_shape(r0, q, d)))
        if first_sweep == 0:
            start = Cotangent(dep.mean[n_pts - 1], dep.cov[n_pts - 1])
            start.mean[:d] += args.end_cotangent
        sweep = (0.0, first_kbar)
        for n_sweep in range(first_sweep, 2 if second else 1):  # one call site: the sweep is inlined once
            if n_sweep == 1:
                shape = root_shape(r0, q, d)
                start = Cotangent(np.zeros(dd), np.zeros(shape))
                deposits = Deposits(np.zeros((0, dd)), np.zeros((0,) + shape), dep.kbar_step, dep.sig_pred,
                                    dep.rounding)
                if mode == DIFFUSION_GLOBAL:
                    sweep = (-2.0 * grad[kdir] * kappa / ((n_pts - 1) * d), KBAR_NONE)
                else:
                    sweep_run, sweep = unit_run, (0.0, KBAR_LOCAL)
            if checkpointed:
                bar, finite, rounding = _sweep_in_intervals(field, derivs, sweep_run, rq, q, d, deposits.kbar_step,
                                                            sweep, grad)
            elif r0.ndim == 2:  # the structure (a compile-time branch: r0 is an argument)
                bar, finite, rounding = _filter_adjoint(field, derivs, sweep_run, rq, q, d, start, deposits, sweep,
                                                        grad)
            else:
                bar, finite, rounding = _block_filter_adjoint(field, derivs, sweep_run, rq, q, d, start, deposits,
                                                              sweep, grad)
            info[5] = max(info[5], rounding)
            if not finite:
                return terms, grad, False, info, stops[:1], y_end
            _initial_state_adjoint(taylor_vjp, args, stops[0], bar.mean, q, d, grad)
        if mode != DIFFUSION_FIXED:
            grad[kdir] = 0.0  # the calibrated diffusion replaces the κ argument
        if not all_finite(grad):
            return terms, grad, False, info, stops[:1], y_end
        return terms, grad, True, info, run.grid, y_end

    with slp_vectorization():  # compiles now (explicit signature), or loads from the disk cache
        return nb.njit(_fenrir_signature(structure), **INLINE_JIT)(fenrir_terms)
