"""The prediction step of the square-root ODE filter and its adjoint.

``μ⁻ = A μ`` and ``Σ⁻ = A Σ Aᵀ + κ Q(h)`` for one step of the prior (a step array, :mod:`.prior`).
The value is computed on right square roots (one QR of a stacked root, Bosch, 2024, PhD thesis); the
adjoint works on covariances, as every adjoint of the package (no QR factor is differentiated).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from pymc_pnode._jit import INLINE_JIT
from pymc_pnode.filtering.linalg import copy_transposed, tria_cols_inplace
from pymc_pnode.filtering.prior import (
    apply_transition_t,
    congruence_t,
    fill_root_transition_t,
    noise_inner,
)


@nb.njit(**INLINE_JIT)
def fill_predict_stack(r: np.ndarray, step: np.ndarray, rq: np.ndarray, q: int, d: int, mt: np.ndarray) -> None:
    """``mt[:D, :2D]`` = the stack ``[r A^T; √κ (Q̄^{1/2} T(h)) ⊗ I_d]``, transposed.

    Row ``c`` of ``mt`` is column ``c`` of the stack (the layout of :func:`tria_cols_inplace`); the
    stack is a square root of ``A Σ A^T + κ Q(h)`` for ``Σ = r^T r`` (``step``: see :mod:`.prior`).
    """
    dd = (q + 1) * d
    sqrt_kappa = step[2, 0]
    fill_root_transition_t(r, step, q, d, mt)
    for i in range(q + 1):
        for k in range(d):
            col = mt[i * d + k]
            for row in range(dd, 2 * dd):
                col[row] = 0.0
            for j in range(q + 1):
                col[dd + j * d + k] = sqrt_kappa * rq[j, i] * step[1, i]


@nb.njit(**INLINE_JIT)
def predict_root(
    r: np.ndarray, step: np.ndarray, rq: np.ndarray, q: int, d: int, mt: np.ndarray, r_out: np.ndarray
) -> None:
    """``r_out`` = upper-triangular root of ``A Σ A^T + κ Q(h)`` for ``Σ = r^T r``.

    One QR of the stack of :func:`fill_predict_stack` (``mt`` is ``(D + 1, 2D)`` work space; its
    last row is the QR's work vector).
    """
    dd = (q + 1) * d
    fill_predict_stack(r, step, rq, q, d, mt)
    tria_cols_inplace(mt, 2 * dd, dd, mt[dd])
    copy_transposed(mt, dd, r_out, 0)


@nb.njit(**INLINE_JIT)
def predict_adjoint(
    step: np.ndarray, rq: np.ndarray, q: int, d: int, mbar_pred: np.ndarray, sbar_pred: np.ndarray,
    work: np.ndarray, mbar: np.ndarray, sbar: np.ndarray,
) -> float:
    """Adjoint of the prediction: ``μ̄ = Aᵀ μ̄⁻``, ``Σ̄ = Aᵀ Σ̄⁻ A``; returns ``κ̄ = ⟨Σ̄⁻, Q(h)⟩``.

    ``work`` is ``(D, D)``; ``mbar``, ``sbar`` receive the adjoints of the previous ``(μ, Σ)``.
    """
    apply_transition_t(step, q, d, mbar_pred, mbar)
    congruence_t(step, q, d, sbar_pred, work, sbar)
    return noise_inner(sbar_pred, step, rq, q, d)
