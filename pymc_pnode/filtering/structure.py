"""State-space structures of the ODE filters: dense, block-diagonal and isotropic covariances.

The IWP prior is ``A(h) ⊗ I_d`` and ``Q(h) ⊗ I_d`` (:mod:`.prior`), so when the ODE information is
linearised with a diagonal ``L`` the filter's covariance stays block-diagonal over the states: ``d``
independent ``(q+1) × (q+1)`` blocks, one per state (the diagonal EK1 of Krämer, Bosch, Schmidt &
Hennig, 2022, "Probabilistic ODE solutions in millions of dimensions"). With ``L = 0`` (EK0) every block
sees the same prior and the same scalar observation ``E1``, so all blocks stay equal: one shared
``(q+1) × (q+1)`` root, ``Σ = P ⊗ I_d`` (the isotropic or Kronecker EK0, ibid.). The means stay coupled
through the vector field.

A structure is told by the rank of the filter's root at one time point: ``(D, D)`` is dense;
``(n_blocks, q+1, q+1)`` is block-diagonal with one block per state (``n_blocks = d``) or one shared block
(``n_blocks = 1``, isotropic). The operations of one filter step — :func:`predict_roots`,
:func:`update_roots`, :func:`step_error` — are overloaded on that rank, so the stepping loop of
:func:`~.odefilter.forward_pass` is written once for every structure, and each block operation is the
dense operation with ``d = 1`` applied block by block. Means stay derivative-major vectors of length
``D = (q+1) d`` in every structure.
"""

from __future__ import annotations

import math
from collections import namedtuple

import numba as nb
import numpy as np
from numba.core.extending import overload

from pymc_pnode._jit import INLINE_JIT, OVERLOAD_JIT
from pymc_pnode.filtering.calibration import (
    LocalErrorWork,
    local_defect_covariance,
    local_error,
    local_error_work,
    local_kappa_adjoint,
    scaled_error,
)
from pymc_pnode.filtering.linalg import matmul_tn, solve_lower
from pymc_pnode.filtering.predict import predict_adjoint, predict_root
from pymc_pnode.filtering.prior import apply_transition_t, congruence_t, noise_inner
from pymc_pnode.filtering.update import (
    Cotangent,
    GaussianObservation,
    LinearisationCotangents,
    UpdateAdjointOut,
    ode_observation_matrix,
    update_adjoint,
    update_adjoint_work,
    update_sqrt,
)

DENSE = "dense"
DIAGONAL = "diagonal"
ISOTROPIC = "isotropic"
STRUCTURES = (DENSE, DIAGONAL, ISOTROPIC)



def initial_root(structure: str, q: int, d: int) -> np.ndarray:
    """The zero root (``Σ₀ = 0``, exact initialisation) of a filter with ``structure``, ``d`` states, order ``q``."""
    if structure == DENSE:
        return np.zeros(((q + 1) * d, (q + 1) * d))
    n_blocks = d if structure == DIAGONAL else 1
    return np.zeros((n_blocks, q + 1, q + 1))


@nb.njit(**INLINE_JIT)
def block_rows(r_row: np.ndarray, q: int) -> tuple[int, int]:
    """``(size, rows)`` of one covariance block of a root ``r_row`` at one time point: the block's
    state length and the number of ODE-information rows it observes (``(D, d)`` dense, ``(q+1, 1)``
    block-diagonal)."""
    size = r_row.shape[-1]
    return size, size // (q + 1)


@nb.njit(**INLINE_JIT)
def gather_state(mu: np.ndarray, q: int, d: int, i: int, out: np.ndarray) -> None:
    """``out = (y_i, y_i', …, y_i^(q))``: state ``i``'s block of a derivative-major mean."""
    for j in range(q + 1):
        out[j] = mu[j * d + i]


@nb.njit(**INLINE_JIT)
def scatter_state(block: np.ndarray, q: int, d: int, i: int, mu: np.ndarray) -> None:
    """The inverse of :func:`gather_state`: write state ``i``'s block into a derivative-major mean."""
    for j in range(q + 1):
        mu[j * d + i] = block[j]


def predict_roots(r, step, rq, q, d, mt, r_out):
    """Root of ``A Σ Aᵀ + κ Q(h)`` (into ``r_out``) for the root ``r`` of any structure (``mt``: the work of
    :func:`~.predict.predict_root` for one block)."""
    raise NotImplementedError("compiled code only")


@overload(predict_roots, jit_options=OVERLOAD_JIT)
def _predict_roots(r, step, rq, q, d, mt, r_out):
    if r.ndim == 2:
        def dense(r, step, rq, q, d, mt, r_out):
            predict_root(r, step, rq, q, d, mt, r_out)
        return dense

    def blocks(r, step, rq, q, d, mt, r_out):
        for b in range(r.shape[0]):
            predict_root(r[b], step, rq, q, 1, mt, r_out[b])
    return blocks


def update_roots(r_pred, mu_pred, lin, zhat, q, d, m, w, mu_out, r_out):
    """The ODE update of :func:`~.update.update_sqrt` for the root of any structure; returns ``ẑᵀ S⁻¹ ẑ``.

    Block-diagonal: state ``i`` is updated on its own block with the scalar observation
    ``E1 − L_ii E0`` (``lin`` holds the diagonal, ``L_ii = lin[i, 0]``). Isotropic (one block, ``L = 0``):
    the shared block is updated once and every state's mean moves with the same gain. ``m`` and ``w`` are the work of
    ``update_sqrt`` for one block (sizes from :func:`block_rows`).
    """
    raise NotImplementedError("compiled code only")


@overload(update_roots, jit_options=OVERLOAD_JIT)
def _update_roots(r_pred, mu_pred, lin, zhat, q, d, m, w, mu_out, r_out):
    if r_pred.ndim == 2:
        def dense(r_pred, mu_pred, lin, zhat, q, d, m, w, mu_out, r_out):
            return update_sqrt(r_pred, mu_pred, lin, zhat, q, d, m, w, mu_out, r_out)
        return dense

    def blocks(r_pred, mu_pred, lin, zhat, q, d, m, w, mu_out, r_out):
        n_blocks = r_pred.shape[0]
        q1 = q + 1
        block_mu, block_out = np.empty(q1), np.empty(q1)
        lin_i, z_i = np.zeros((1, 1)), np.empty(1)
        stat = 0.0
        for i in range(d):
            gather_state(mu_pred, q, d, i, block_mu)
            z_i[0] = zhat[i]
            if n_blocks > 1 or i == 0:
                b = i if n_blocks > 1 else 0
                lin_i[0, 0] = lin[i, 0]
                stat += update_sqrt(r_pred[b], block_mu, lin_i, z_i, q, 1, m, w, block_out, r_out[b])
            else:
                # The shared block's QR is in m (update_sqrt's layout): the gain acts as K ẑ_i = m[1:, 0] w_i.
                solve_lower(m, 1, z_i, w)
                stat += w[0] * w[0]
                for col in range(q1):
                    block_out[col] = block_mu[col] - m[1 + col, 0] * w[0]
            scatter_state(block_out, q, d, i, mu_out)
        return stat
    return blocks


def step_error(r_row, step, rq, q, d, jac, zhat, y_prev, y_new, scale, work):
    """:func:`~.calibration.local_error` for a filter whose root at one time point is ``r_row`` (the
    structure's linearisation: ``jac[i, 0] = L_ii`` when block-diagonal); returns ``(E, σ̂²)``."""
    raise NotImplementedError("compiled code only")


@overload(step_error, jit_options=OVERLOAD_JIT)
def _step_error(r_row, step, rq, q, d, jac, zhat, y_prev, y_new, scale, work):
    if r_row.ndim == 2:
        def dense(r_row, step, rq, q, d, jac, zhat, y_prev, y_new, scale, work):
            return local_error(step, rq, q, d, jac, zhat, y_prev, y_new, scale, work)
        return dense

    def blocks(r_row, step, rq, q, d, jac, zhat, y_prev, y_new, scale, work):
        return block_local_error(step, rq, q, d, jac, zhat, y_prev, y_new, scale, work)
    return blocks


@nb.njit(**INLINE_JIT)
def block_local_error(
    step: np.ndarray, rq: np.ndarray, q: int, d: int, jac: np.ndarray, zhat: np.ndarray, y_prev: np.ndarray,
    y_new: np.ndarray, scale: tuple[float, float, float], work: LocalErrorWork,
) -> tuple[float, float]:
    """The local error estimate and diffusion of :func:`~.calibration.local_error` for a block-diagonal
    linearisation (``H Q Hᵀ`` diagonal, each entry from ``L_ii`` alone; ``work`` for one state)."""
    hqh_root, hqh, _, _ = work
    jac_i = np.zeros((1, 1))
    variance = np.empty(d)
    quad = 0.0
    for i in range(d):
        if i == 0 or jac[i, 0] != jac_i[0, 0]:  # EK0 and equal diagonals share one defect variance
            jac_i[0, 0] = jac[i, 0]
            local_defect_covariance(step, rq, q, 1, jac_i, hqh_root, hqh)
        variance[i] = hqh[0, 0]
        if not (hqh[0, 0] > 0.0):
            return math.inf, math.inf
        quad += zhat[i] * zhat[i] / hqh[0, 0]
    local_kappa = quad / d
    if not math.isfinite(local_kappa):
        return math.inf, math.inf
    return scaled_error(local_kappa, variance, y_prev, y_new, scale), local_kappa


# ---------------------------------------------------------------------------------------------- adjoints
# The primal quantities of one ODE update that its adjoint reads: the updated root, the predicted covariance,
# mean, linearisation, residual and the step array.
UpdatePrimal = namedtuple("UpdatePrimal", ["r_post", "sig_pred", "mu_pred", "lin", "zhat", "step"])
# Work of :func:`ode_update_adjoint`: the observation matrix and noise, the updated covariance, the update
# adjoint's outputs and work, the local-error work, and the cotangents it leaves for the linearisation.
DenseAdjointWork = namedtuple("DenseAdjointWork", ["hm", "noise_var", "sig_post", "out", "upd", "err", "cot"])
# The same for one block, plus one state's slices (L_ii, ẑ_i, μ⁻_i, μ̄_i, Σ̄_b, ẑ̄_i, L̄_ii) and Σ̄⁻ of every block.
BlockAdjointWork = namedtuple("BlockAdjointWork", ["hm", "noise_var", "sig_post", "out", "upd", "err", "cot", "lin1",
                                                   "z1", "mu1", "mbar1", "sbar1", "zbar1", "jbar1", "acc"])


def member_type(tuple_type, name: str):
    """The numba type of member ``name`` of a named-tuple type (for the overloads' typing functions)."""
    return tuple_type.types[tuple_type.fields.index(name)]


def gram(r, out):
    """``out = rᵀ r`` for the root of any structure (block by block)."""
    raise NotImplementedError("compiled code only")


@overload(gram, jit_options=OVERLOAD_JIT)
def _gram(r, out):
    if r.ndim == 2:
        def dense(r, out):
            matmul_tn(r, r, out)
        return dense

    def blocks(r, out):
        for b in range(r.shape[0]):
            matmul_tn(r[b], r[b], out[b])
    return blocks


def adjoint_work(r_row, q, d):
    """Work arrays of :func:`ode_update_adjoint` for a filter whose root at one time point is ``r_row``."""
    raise NotImplementedError("compiled code only")


@overload(adjoint_work, jit_options=OVERLOAD_JIT)
def _adjoint_work(r_row, q, d):
    if r_row.ndim == 2:
        def dense(r_row, q, d):
            dd = (q + 1) * d
            out = UpdateAdjointOut(np.empty(d), np.empty(d), np.zeros((d, dd)))
            cot = LinearisationCotangents(out.rbar, out.hbar, np.zeros(d), np.zeros((d, d)))
            return DenseAdjointWork(np.zeros((d, dd)), np.zeros(d), np.empty((dd, dd)), out,
                                    update_adjoint_work(dd, d), local_error_work(q, d), cot)
        return dense

    def blocks(r_row, q, d):
        q1 = q + 1
        cot = LinearisationCotangents(np.zeros(d), np.zeros((d, d)), np.zeros(d), np.zeros((d, d)))
        return BlockAdjointWork(np.zeros((1, q1)), np.zeros(1), np.empty((q1, q1)),
                                UpdateAdjointOut(np.empty(1), np.empty(1), np.zeros((1, q1))),
                                update_adjoint_work(q1, 1), local_error_work(q, 1), cot, np.zeros((1, 1)),
                                np.empty(1), np.empty(q1), np.empty(q1), np.empty((q1, q1)), np.zeros(1),
                                np.zeros((1, 1)), np.empty_like(r_row))
    return blocks


def ode_update_adjoint(primal, rq, q, d, ek1, weights, bar, work):
    """Adjoint of one ODE update (:func:`update_roots`) and of the step's local diffusion, any structure.

    ``primal`` (:data:`UpdatePrimal`); ``weights = (w_stat, κ̄_n)``: the weight of ``ẑᵀS⁻¹ẑ`` and the adjoint
    of the step's local diffusion (0: none). ``bar`` goes from the adjoints of ``(μ⁺, Σ⁺)`` to those of
    ``(μ⁻, Σ⁻)``; ``work.cot`` receives the cotangents of the linearisation
    (:func:`~.update.linearise_adjoint`). Returns False if an update is singular.
    """
    raise NotImplementedError("compiled code only")


@overload(ode_update_adjoint, jit_options=OVERLOAD_JIT)
def _ode_update_adjoint(primal, rq, q, d, ek1, weights, bar, work):
    if member_type(primal, "sig_pred").ndim == 2:
        def dense(primal, rq, q, d, ek1, weights, bar, work):
            r_post, sig_pred, mu_pred, lin, zhat, step = primal
            w_stat, kbar_local = weights
            hm, sig_post, cot = work.hm, work.sig_post, work.cot
            ode_observation_matrix(lin, d, hm)
            if ek1:
                matmul_tn(r_post, r_post, sig_post)
            if not update_adjoint(GaussianObservation(hm, work.noise_var, zhat, d), sig_pred, sig_post, mu_pred,
                                  (w_stat, 0.0), bar, ek1, work.out, work.upd):
                return False
            cot.zbar[:] = 0.0
            cot.jbar[:, :] = 0.0
            if kbar_local != 0.0:
                local_kappa_adjoint(kbar_local, step, rq, q, d, lin, zhat, work.err, cot.zbar, cot.jbar)
            return True
        return dense

    def blocks(primal, rq, q, d, ek1, weights, bar, work):
        r_post, sig_pred, mu_pred, lin, zhat, step = primal
        w_stat, kbar_local = weights
        mbar, sbar = bar
        hm, sig_post, out, lin1, z1, mu1, mbar1, sbar1, acc = (work.hm, work.sig_post, work.out, work.lin1, work.z1,
                                                               work.mu1, work.mbar1, work.sbar1, work.acc)
        rbar, hbar, zbar, jbar = work.cot
        n_blocks = sbar.shape[0]
        acc[:] = 0.0
        hbar[:, :] = 0.0
        jbar[:, :] = 0.0
        for i in range(d):
            b = i if n_blocks > 1 else 0
            gather_state(mbar, q, d, i, mbar1)
            gather_state(mu_pred, q, d, i, mu1)
            if n_blocks > 1 or i == 0:
                sbar1[:, :] = sbar[b]
            else:  # the shared block's Σ̄⁺ enters once; the other states add their mean paths
                sbar1[:, :] = 0.0
            lin1[0, 0] = lin[i, 0]
            z1[0] = zhat[i]
            ode_observation_matrix(lin1, 1, hm)
            if ek1:
                matmul_tn(r_post[b], r_post[b], sig_post)
            if not update_adjoint(GaussianObservation(hm, work.noise_var, z1, 1), sig_pred[b], sig_post, mu1,
                                  (w_stat, 0.0), Cotangent(mbar1, sbar1), ek1, out, work.upd):
                return False
            scatter_state(mbar1, q, d, i, mbar)
            acc[b] += sbar1
            rbar[i] = out.rbar[0]
            hbar[i, i] = out.hbar[0, 0]
            zbar[i] = 0.0
            if kbar_local != 0.0:
                # κ = Σᵢ ẑᵢ² / cᵢ / d: each state's term is the one-state local diffusion, with adjoint κ̄ / d
                local_kappa_adjoint(kbar_local / d, step, rq, q, 1, lin1, z1, work.err, work.zbar1, work.jbar1)
                zbar[i] = work.zbar1[0]
                jbar[i, i] = work.jbar1[0, 0]
        sbar[:] = acc
        return True
    return blocks


def prediction_adjoint(step, rq, q, d, mbar_pred, sbar_pred, work, mbar, sbar):
    """:func:`~.predict.predict_adjoint` for any structure (``work`` shaped like a root); returns ``κ̄``."""
    raise NotImplementedError("compiled code only")


@overload(prediction_adjoint, jit_options=OVERLOAD_JIT)
def _prediction_adjoint(step, rq, q, d, mbar_pred, sbar_pred, work, mbar, sbar):
    if sbar_pred.ndim == 2:
        def dense(step, rq, q, d, mbar_pred, sbar_pred, work, mbar, sbar):
            return predict_adjoint(step, rq, q, d, mbar_pred, sbar_pred, work, mbar, sbar)
        return dense

    def blocks(step, rq, q, d, mbar_pred, sbar_pred, work, mbar, sbar):
        apply_transition_t(step, q, d, mbar_pred, mbar)
        kbar = 0.0
        for b in range(sbar_pred.shape[0]):
            congruence_t(step, q, 1, sbar_pred[b], work[b], sbar[b])
            kbar += noise_inner(sbar_pred[b], step, rq, q, 1)
        return kbar
    return blocks
