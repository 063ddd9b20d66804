"""The IWP(q) prior's transitions inside the compiled filters, each with its adjoint beside it.

The prior ``x = [y, y', ..., y^(q)]`` (derivative-major, blocks of ``d``) has the transition
``A(h) = Ǎ(h) ⊗ I_d`` with ``Ǎ_ij = h^(j-i) / (j-i)!`` and the process noise
``κ Q(h) = κ (T(h) Q̄ T(h)) ⊗ I_d`` in the preconditioned form of Krämer & Hennig (2024):
``T(h)_i = sqrt(h) h^(q-i) / (q-i)!`` and ``Q̄ = R̄ᵀ R̄`` constant (``rq`` = ``R̄``, the exact root of
:class:`pymc_pnode.priors.IWP`). One step's transition travels as a :data:`StepTransition`; the
kernels never form the Kronecker products.
"""

from __future__ import annotations

import math
from collections import namedtuple

import numba as nb
import numpy as np

from pymc_pnode._jit import INLINE_JIT

# One step of the prior: the coefficients ``a[k] = h^k / k!`` of A(h), the preconditioner ``tvec`` = T(h),
# the diffusion's square root, the root ``rq`` of Q̄, the IWP order q and the number of states d.
StepTransition = namedtuple("StepTransition", ["a", "tvec", "sqrt_kappa", "rq", "q", "d"])


@nb.njit(**INLINE_JIT)
def preconditioner(h: float, q: int, out: np.ndarray) -> None:
    """``T(h)_i = sqrt(h) h^(q-i) / (q-i)!`` for ``i = 0..q``."""
    sq = math.sqrt(h)
    for i in range(q + 1):
        k = q - i
        out[i] = sq * h**k / math.gamma(k + 1.0)


@nb.njit(**INLINE_JIT)
def transition_coefficients(h: float, q: int, out: np.ndarray) -> None:
    """``out[k] = h^k / k!``: the IWP transition is ``A_ij = out[j - i]`` for ``j >= i``."""
    c = 1.0
    for k in range(q + 1):
        out[k] = c
        c *= h / (k + 1.0)


@nb.njit(**INLINE_JIT)
def step_coefficients(h: float, q: int, a: np.ndarray, tvec: np.ndarray) -> None:
    """Both per-step coefficient vectors of the prior: ``a`` of A(h) and ``tvec`` of T(h)."""
    transition_coefficients(h, q, a)
    preconditioner(h, q, tvec)


@nb.njit(**INLINE_JIT)
def apply_transition(a: np.ndarray, q: int, d: int, mu: np.ndarray, out: np.ndarray) -> None:
    """``out = A(h) mu`` with the coefficients ``a`` of :func:`transition_coefficients`."""
    for i in range(q + 1):
        for k in range(d):
            s = 0.0
            for j in range(i, q + 1):
                s += a[j - i] * mu[j * d + k]
            out[i * d + k] = s


@nb.njit(**INLINE_JIT)
def apply_transition_t(a: np.ndarray, q: int, d: int, v: np.ndarray, out: np.ndarray) -> None:
    """``out = A(h)ᵀ v``: the adjoint of :func:`apply_transition`."""
    for i in range(q + 1):
        for k in range(d):
            s = 0.0
            for ip in range(i + 1):
                s += a[i - ip] * v[ip * d + k]
            out[i * d + k] = s


@nb.njit(**INLINE_JIT)
def congruence_t(a: np.ndarray, q: int, d: int, x: np.ndarray, work: np.ndarray, out: np.ndarray) -> None:
    """``out = A(h)ᵀ X A(h)``: the adjoint of ``Σ ↦ A Σ Aᵀ`` (``work`` is ``(D, D)``)."""
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


@nb.njit(**INLINE_JIT)
def fill_root_transition_t(r: np.ndarray, a: np.ndarray, q: int, d: int, out: np.ndarray) -> None:
    """``out[:D, :D] = (r A^T)^T = A r^T``: the square root ``r A^T`` of ``A Σ A^T``, transposed."""
    dd = (q + 1) * d
    for i in range(q + 1):
        for k in range(d):
            col = out[i * d + k]
            for row in range(dd):
                s = 0.0
                for j in range(i, q + 1):
                    s += a[j - i] * r[row, j * d + k]
                col[row] = s


@nb.njit(**INLINE_JIT)
def noise_inner(x: np.ndarray, rq: np.ndarray, tvec: np.ndarray, q: int, d: int) -> float:
    """``⟨X, Q(h)⟩`` for the unit-diffusion noise: the adjoint of ``κ`` in ``κ Q(h)`` given ``X = Σ̄⁻``."""
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
