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
:func:`update_roots` — branch on that rank; as it is a compile-time constant of an argument, numba prunes
the other branch, so the stepping loop of :func:`~.odefilter.forward_pass` is written once for every
structure. Each block operation is the dense operation with ``d = 1`` applied block by block. Means stay
derivative-major vectors of length ``D = (q+1) d`` in every structure. The block operations of the reverse
sweep (:func:`block_update_adjoint`, :func:`block_prediction_adjoint`) serve
:func:`~.fenrir._block_filter_adjoint`; the dense sweep keeps its own loop (see there).
"""

from __future__ import annotations

import math
from collections import namedtuple

import numba as nb
import numpy as np

from pymc_pnode._jit import INLINE_JIT
from pymc_pnode.filtering.calibration import (
    LocalErrorWork,
    local_defect_covariance,
    local_error_work,
    local_kappa_adjoint,
    scaled_error,
)
from pymc_pnode.filtering.linalg import matmul_tn, solve_lower
from pymc_pnode.filtering.predict import predict_root
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
def block_rows(r_row: np.ndarray, q: int, d: int) -> tuple[int, int]:
    """``(size, rows)`` of one covariance block of a root ``r_row`` at one time point: the block's
    state length and the number of ODE-information rows it observes (``(D, d)`` dense, ``(q+1, 1)``
    block-diagonal)."""
    if r_row.ndim == 2:
        return (q + 1) * d, d
    return q + 1, 1


@nb.njit(**INLINE_JIT)
def root_shape(r_row: np.ndarray, q: int, d: int):
    """The shape of a root at one time point with the structure of ``r_row``, from ``q`` and ``d`` (not read from
    ``r_row``: in the kernels specialised on ``(q, d)`` the shapes of the arrays allocated with it stay
    compile-time constants, which LLVM needs to unroll the small loops)."""
    if r_row.ndim == 2:
        return ((q + 1) * d, (q + 1) * d)
    return (r_row.shape[0], q + 1, q + 1)


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


@nb.njit(**INLINE_JIT)
def predict_roots(
    r: np.ndarray, step: np.ndarray, rq: np.ndarray, q: int, d: int, mt: np.ndarray, r_out: np.ndarray
) -> None:
    """Root of ``A Σ Aᵀ + κ Q(h)`` (into ``r_out``) for the root ``r`` of any structure (``mt``: the work of
    :func:`~.predict.predict_root` for one block)."""
    if r.ndim == 2:
        predict_root(r, step, rq, q, d, mt, r_out)
    else:
        for b in range(r.shape[0]):
            predict_root(r[b], step, rq, q, 1, mt, r_out[b])


@nb.njit(**INLINE_JIT)
def update_roots(
    r_pred: np.ndarray, mu_pred: np.ndarray, lin: np.ndarray, zhat: np.ndarray, q: int, d: int, m: np.ndarray,
    w: np.ndarray, mu_out: np.ndarray, r_out: np.ndarray,
) -> float:
    """The ODE update of :func:`~.update.update_sqrt` for the root of any structure; returns ``ẑᵀ S⁻¹ ẑ``.

    Block-diagonal: state ``i`` is updated on its own block with the scalar observation
    ``E1 − L_ii E0`` (``lin`` holds the diagonal, ``L_ii = lin[i, 0]``). Isotropic (one block, ``L = 0``):
    the shared block is updated once and every state's mean moves with the same gain. ``m`` and ``w`` are the work of
    ``update_sqrt`` for one block (sizes from :func:`block_rows`).
    """
    if r_pred.ndim == 2:
        return update_sqrt(r_pred, mu_pred, lin, zhat, q, d, m, w, mu_out, r_out)
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
# The block operations of the reverse sweep (:func:`~.fenrir._block_filter_adjoint`; the dense sweep has its own).
# The primal quantities of one ODE update that its adjoint reads besides the predicted covariance: the updated
# root, the predicted mean, linearisation, residual and the step array.
UpdatePrimal = namedtuple("UpdatePrimal", ["r_post", "mu_pred", "lin", "zhat", "step"])
# Work of :func:`block_update_adjoint`: the observation matrix and noise of one state, its updated covariance,
# the update adjoint's outputs and work, the local-error work, the cotangents it leaves for the linearisation,
# one state's slices (L_ii, ẑ_i, μ⁻_i, μ̄_i, Σ̄_b, ẑ̄_i, L̄_ii) and Σ̄⁻ of every block.
BlockAdjointWork = namedtuple("BlockAdjointWork", ["hm", "noise_var", "sig_post", "out", "upd", "err", "cot", "lin1",
                                                   "z1", "mu1", "mbar1", "sbar1", "zbar1", "jbar1", "acc"])


@nb.njit(**INLINE_JIT)
def block_gram(r: np.ndarray, out: np.ndarray) -> None:
    """``out[b] = r[b]ᵀ r[b]`` for every block of a block root."""
    for b in range(r.shape[0]):
        matmul_tn(r[b], r[b], out[b])


@nb.njit(**INLINE_JIT)
def block_adjoint_work(r_row: np.ndarray, q: int, d: int) -> BlockAdjointWork:
    """Work arrays of :func:`block_update_adjoint` for a block root ``r_row`` at one time point."""
    q1 = q + 1
    cot = LinearisationCotangents(np.zeros(d), np.zeros((d, d)), np.zeros(d), np.zeros((d, d)))
    return BlockAdjointWork(np.zeros((1, q1)), np.zeros(1), np.empty((q1, q1)),
                            UpdateAdjointOut(np.empty(1), np.empty(1), np.zeros((1, q1)), np.zeros(1)),
                            update_adjoint_work(q1, 1),
                            local_error_work(q, 1), cot, np.zeros((1, 1)), np.empty(1), np.empty(q1), np.empty(q1),
                            np.empty((q1, q1)), np.zeros(1), np.zeros((1, 1)), np.empty(root_shape(r_row, q, d)))


@nb.njit(**INLINE_JIT)
def block_update_adjoint(
    sig_pred: np.ndarray, primal: UpdatePrimal, rq: np.ndarray, dims: tuple[int, int, bool],
    weights: tuple[float, float], bar: Cotangent, work: BlockAdjointWork,
) -> bool:
    """Adjoint of one block ODE update (:func:`update_roots`) and of the step's local diffusion.

    ``sig_pred`` holds the predicted covariance blocks, ``primal`` (:data:`UpdatePrimal`) the rest of the
    update's primal values, ``dims = (q, d, ek1)``; ``weights = (w_stat, κ̄_n)``: the weight of ``ẑᵀS⁻¹ẑ`` and
    the adjoint of the step's local diffusion (0: none). ``bar`` goes from the adjoints of ``(μ⁺, Σ⁺)`` to
    those of ``(μ⁻, Σ⁻)``; ``work.cot`` receives the cotangents of the linearisation
    (:func:`~.update.linearise_adjoint` with ``diagonal``). Each state is the dense update adjoint with
    ``d = 1`` on its block; an isotropic run's shared block collects every state's share. Returns False if
    an update is singular.
    """
    r_post, mu_pred, lin, zhat, step = primal
    q, d, ek1 = dims
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


@nb.njit(**INLINE_JIT)
def block_prediction_adjoint(
    step: np.ndarray, rq: np.ndarray, q: int, d: int, mbar_pred: np.ndarray, sbar_pred: np.ndarray, work: np.ndarray,
    mbar: np.ndarray, sbar: np.ndarray,
) -> float:
    """:func:`~.predict.predict_adjoint` for block roots (``work`` shaped like one); returns ``κ̄``."""
    apply_transition_t(step, q, d, mbar_pred, mbar)
    kbar = 0.0
    for b in range(sbar_pred.shape[0]):
        congruence_t(step, q, 1, sbar_pred[b], work[b], sbar[b])
        kbar += noise_inner(sbar_pred[b], step, rq, q, 1)
    return kbar
