"""The IWP(q) prior's transitions inside the compiled filters, each with its adjoint beside it.

The prior ``x = [y, y', ..., y^(q)]`` (derivative-major, blocks of ``d``) has the transition
``A(h) = Ǎ(h) ⊗ I_d`` with ``Ǎ_ij = h^(j-i) / (j-i)!`` and the process noise
``κ Q(h) = κ (T(h) Q̄ T(h)) ⊗ I_d`` in the preconditioned form of Krämer & Hennig (2024):
``T(h)_i = sqrt(h) h^(q-i) / (q-i)!`` and ``Q̄ = R̄ᵀ R̄`` constant (``rq`` = ``R̄``, the exact root of
:class:`pymc_pnode.priors.IWP`); the
kernels never form the Kronecker products.

One step of the prior travels as one small array ``step`` of shape ``(3, q + 1)``: row 0 the coefficients
``a_k = h^k / k!`` of ``Ǎ(h)``, row 1 the preconditioner ``T(h)``, and ``step[2, 0] = √κ``. (An array, not
a named tuple of arrays: numba counts a reference for every array read out of a tuple, which in the
per-step kernels cost ≈ 20 % of the Fenrir likelihood, measured.)
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from pymc_pnode._jit import INLINE_JIT


@nb.njit(**INLINE_JIT)
def set_step(h: float, kappa: float, q: int, step: np.ndarray) -> None:
    """Write the step array of step ``h`` and diffusion ``kappa`` (see the module docstring): ``a_k = h^k / k!``
    and ``T(h)_k = sqrt(h) h^(q-k) / (q-k)!``."""
    sq = math.sqrt(h)
    c = 1.0
    for k in range(q + 1):
        step[0, k] = c
        c *= h / (k + 1.0)
        step[1, k] = sq * h ** (q - k) / math.gamma(q - k + 1.0)
        step[2, k] = 0.0
    step[2, 0] = math.sqrt(kappa)


@nb.njit(**INLINE_JIT)
def new_step(h: float, kappa: float, q: int) -> np.ndarray:
    """A new step array of step ``h`` and diffusion ``kappa``."""
    step = np.empty((3, q + 1))
    set_step(h, kappa, q, step)
    return step


@nb.njit(**INLINE_JIT)
def apply_transition(step: np.ndarray, q: int, d: int, mu: np.ndarray, out: np.ndarray) -> None:
    """``out = A(h) mu``."""
    for i in range(q + 1):
        for k in range(d):
            s = 0.0
            for j in range(i, q + 1):
                s += step[0, j - i] * mu[j * d + k]
            out[i * d + k] = s


@nb.njit(**INLINE_JIT)
def apply_transition_t(step: np.ndarray, q: int, d: int, v: np.ndarray, out: np.ndarray) -> None:
    """``out = A(h)ᵀ v``: the adjoint of :func:`apply_transition`."""
    for i in range(q + 1):
        for k in range(d):
            s = 0.0
            for ip in range(i + 1):
                s += step[0, i - ip] * v[ip * d + k]
            out[i * d + k] = s


@nb.njit(**INLINE_JIT)
def congruence(step: np.ndarray, q: int, d: int, x: np.ndarray, work: np.ndarray, out: np.ndarray) -> None:
    """``out = A(h) X A(h)ᵀ`` in ``O(q D²)``: ``A(h)`` acts on each state's ``q + 1`` derivatives
    (``A[i d + k, j d + k] = a_(j-i)`` for ``j ≥ i``). ``work`` (``(D, D)``) holds ``A(h) X`` on exit."""
    dd = (q + 1) * d
    for i in range(q + 1):
        for k in range(d):
            for c in range(dd):
                s = 0.0
                for j in range(i, q + 1):
                    s += step[0, j - i] * x[j * d + k, c]
                work[i * d + k, c] = s
    for row in range(dd):
        for i in range(q + 1):
            for k in range(d):
                s = 0.0
                for j in range(i, q + 1):
                    s += work[row, j * d + k] * step[0, j - i]
                out[row, i * d + k] = s


@nb.njit(**INLINE_JIT)
def congruence_t(step: np.ndarray, q: int, d: int, x: np.ndarray, work: np.ndarray, out: np.ndarray) -> None:
    """``out = A(h)ᵀ X A(h)``: the adjoint of ``Σ ↦ A Σ Aᵀ`` (``work`` is ``(D, D)``)."""
    dd = (q + 1) * d
    for i in range(q + 1):
        for k in range(d):
            for c in range(dd):
                s = 0.0
                for ip in range(i + 1):
                    s += step[0, i - ip] * x[ip * d + k, c]
                work[i * d + k, c] = s
    for row in range(dd):
        for j in range(q + 1):
            for k in range(d):
                s = 0.0
                for jp in range(j + 1):
                    s += work[row, jp * d + k] * step[0, j - jp]
                out[row, j * d + k] = s


@nb.njit(**INLINE_JIT)
def fill_root_transition_t(r: np.ndarray, step: np.ndarray, q: int, d: int, out: np.ndarray) -> None:
    """``out[:D, :D] = (r A^T)^T = A r^T``: the square root ``r A^T`` of ``A Σ A^T``, transposed."""
    dd = (q + 1) * d
    for i in range(q + 1):
        for k in range(d):
            col = out[i * d + k]
            for row in range(dd):
                s = 0.0
                for j in range(i, q + 1):
                    s += step[0, j - i] * r[row, j * d + k]
                col[row] = s


@nb.njit(**INLINE_JIT)
def noise_inner(x: np.ndarray, step: np.ndarray, rq: np.ndarray, q: int, d: int) -> float:
    """``⟨X, Q(h)⟩`` for the unit-diffusion noise: the adjoint of ``κ`` in ``κ Q(h)`` given ``X = Σ̄⁻``."""
    s = 0.0
    for i in range(q + 1):
        for j in range(q + 1):
            qij = 0.0
            for r in range(q + 1):
                qij += rq[r, i] * rq[r, j]
            qij *= step[1, i] * step[1, j]
            tr = 0.0
            for k in range(d):
                tr += x[i * d + k, j * d + k]
            s += qij * tr
    return s


@nb.njit(**INLINE_JIT)
def transition_matrix(step: np.ndarray, q: int, d: int, out: np.ndarray) -> None:
    """``out = A(h)`` as a dense ``(D, D)`` matrix, for the smoother's tangents (the filters never form it)."""
    out[:, :] = 0.0
    for i in range(q + 1):
        for j in range(i, q + 1):
            for k in range(d):
                out[i * d + k, j * d + k] = step[0, j - i]


@nb.njit(**INLINE_JIT)
def add_noise(step: np.ndarray, rq: np.ndarray, q: int, d: int, kappa: float, out: np.ndarray) -> None:
    """``out += κ Q(h)`` on a dense ``(D, D)`` covariance (``Q(h)`` at unit diffusion, nonzero on each state's
    derivatives only), for the forward-mode tangents (the filters add the noise to square roots)."""
    for i in range(q + 1):
        for j in range(q + 1):
            qbar_ij = 0.0
            for r in range(q + 1):
                qbar_ij += rq[r, i] * rq[r, j]
            q_ij = step[1, i] * qbar_ij * step[1, j]
            for k in range(d):
                out[i * d + k, j * d + k] += kappa * q_ij
