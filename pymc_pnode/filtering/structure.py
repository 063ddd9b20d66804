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

import numba as nb
import numpy as np
from numba.core.extending import overload

from pymc_pnode._jit import INLINE_JIT
from pymc_pnode.filtering.calibration import LocalErrorWork, local_defect_covariance, local_error
from pymc_pnode.filtering.linalg import solve_lower
from pymc_pnode.filtering.predict import predict_root
from pymc_pnode.filtering.update import update_sqrt

DENSE = "dense"
DIAGONAL = "diagonal"
ISOTROPIC = "isotropic"
STRUCTURES = (DENSE, DIAGONAL, ISOTROPIC)

# Options of the overload implementations: those of the filter operations without the disk cache (an
# overload is compiled into its caller, which is cached).
_OVERLOAD_JIT = {key: value for key, value in INLINE_JIT.items() if key != "cache"}


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


@overload(predict_roots, jit_options=_OVERLOAD_JIT)
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
    ``E1 − L_ii E0`` (the diagonal of ``L`` only). Isotropic (one block, ``L = 0``): the shared block is
    updated once and every state's mean moves with the same gain. ``m`` and ``w`` are the work of
    ``update_sqrt`` for one block (sizes from :func:`block_rows`).
    """
    raise NotImplementedError("compiled code only")


@overload(update_roots, jit_options=_OVERLOAD_JIT)
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
                lin_i[0, 0] = lin[i, i]
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
    structure's linearisation: the diagonal of ``jac`` when block-diagonal); returns ``(E, σ̂²)``."""
    raise NotImplementedError("compiled code only")


@overload(step_error, jit_options=_OVERLOAD_JIT)
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
    h, rtol, atol = scale
    hqh_root, hqh, _, _ = work
    jac_i = np.zeros((1, 1))
    variance = np.empty(d)
    quad = 0.0
    for i in range(d):
        if i == 0 or jac[i, i] != jac_i[0, 0]:  # EK0 and equal diagonals share one defect variance
            jac_i[0, 0] = jac[i, i]
            local_defect_covariance(step, rq, q, 1, jac_i, hqh_root, hqh)
        variance[i] = hqh[0, 0]
        if not (hqh[0, 0] > 0.0):
            return math.inf, math.inf
        quad += zhat[i] * zhat[i] / hqh[0, 0]
    local_kappa = quad / d
    if not math.isfinite(local_kappa):
        return math.inf, math.inf
    acc = 0.0
    for i in range(d):
        e = h * math.sqrt(local_kappa * variance[i])
        sc = atol + rtol * max(abs(y_prev[i]), abs(y_new[i]))
        acc += (e / sc) ** 2
    return math.sqrt(acc / d), local_kappa
