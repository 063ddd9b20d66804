"""Closed-form integrated covariance kernels of Chkrebtii et al.'s solution prior (Chkrebtii et al., 2016, §2).

The derivative has a stationary prior covariance ``C_t(a, b) = c phi(a - b) / alpha``; the state is
``u(t) = u(t0) + int_{t0}^t u_t``. With ``Phi1' = phi`` and ``Phi2' = Phi1`` (``Phi1(0) = Phi2(0) = 0``)
and times measured from ``t0``:

* ``kt(a, b) = c phi(a - b)``                                   derivative covariance,
* ``kx(a, b) = c [Phi1(b) - Phi1(b - a)]``                      ``cov(u(a), u_t(b))``,
* ``kc(a, b) = c [Phi2(a) + Phi2(b) - Phi2(a - b)]``            state covariance,

all at ``alpha = 1`` (every covariance is proportional to ``1 / alpha``). Each function returns the
value and its derivative with respect to the length-scale ``lam``, which the covariance structure
propagates as a forward-mode tangent to give exact gradients in ``lam``.

Kernels: ``UNIFORM`` (``R_lam`` the indicator of ``(t - lam, t + lam)``: ``c phi(d) = (2 lam - |d|)_+``)
and ``SQUARED_EXPONENTIAL`` (``R_lam = exp(-d^2 / 2 lam^2)``: ``c phi(d) = sqrt(pi) lam exp(-d^2/4lam^2)``).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from pymc_pnode._jit import JIT

__all__ = [
    "KERNELS",
    "SQUARED_EXPONENTIAL",
    "UNIFORM",
    "kc",
    "kernel_code",
    "kt",
    "kx",
    "kx_far",
    "prior_covariances",
]

UNIFORM = 0
SQUARED_EXPONENTIAL = 1
KERNELS = {"uniform": UNIFORM, "squared_exponential": SQUARED_EXPONENTIAL}

_SQRT_PI = math.sqrt(math.pi)


def kernel_code(kernel: str) -> int:
    """Integer code of a kernel name; ``ValueError`` for unknown names."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {sorted(KERNELS)}, got {kernel!r}")
    return KERNELS[kernel]


@nb.njit(**JIT)
def _phi(d: float, lam: float, kind: int) -> tuple[float, float]:
    """``c phi(d)`` and its ``lam``-derivative."""
    if kind == UNIFORM:
        if abs(d) < 2.0 * lam:
            return 2.0 * lam - abs(d), 2.0
        return 0.0, 0.0
    q = d * d / (4.0 * lam * lam)
    e = math.exp(-q)
    return _SQRT_PI * lam * e, _SQRT_PI * e * (1.0 + 2.0 * q)


@nb.njit(**JIT)
def _phi1(d: float, lam: float, kind: int) -> tuple[float, float]:
    """``c Phi1(d)`` (odd) and its ``lam``-derivative."""
    if kind == UNIFORM:
        a = abs(d)
        sgn = 1.0 if d > 0.0 else (-1.0 if d < 0.0 else 0.0)
        if a <= 2.0 * lam:
            return sgn * (2.0 * lam * a - 0.5 * a * a), sgn * 2.0 * a
        return sgn * 2.0 * lam * lam, sgn * 4.0 * lam
    x = d / (2.0 * lam)
    er = math.erf(x)
    return math.pi * lam * lam * er, 2.0 * math.pi * lam * er - _SQRT_PI * d * math.exp(-x * x)


@nb.njit(**JIT)
def _phi2(d: float, lam: float, kind: int) -> tuple[float, float]:
    """``c Phi2(d)`` (even) and its ``lam``-derivative."""
    a = abs(d)
    if kind == UNIFORM:
        if a <= 2.0 * lam:
            return lam * a * a - a * a * a / 6.0, a * a
        return 2.0 * lam * lam * a - 4.0 / 3.0 * lam**3, 4.0 * lam * a - 4.0 * lam * lam
    x = a / (2.0 * lam)
    er = math.erf(x)
    em1 = math.expm1(-x * x)
    val = math.pi * lam * lam * a * er + 2.0 * _SQRT_PI * lam**3 * em1
    der = 2.0 * math.pi * lam * a * er + 6.0 * _SQRT_PI * lam * lam * em1
    return val, der


@nb.njit(**JIT)
def kt(a: float, b: float, lam: float, kind: int) -> tuple[float, float]:
    """Derivative covariance ``cov(u_t(a), u_t(b))`` at ``alpha = 1`` and its ``lam``-derivative."""
    return _phi(a - b, lam, kind)


@nb.njit(**JIT)
def kx(a: float, b: float, lam: float, kind: int) -> tuple[float, float]:
    """``cov(u(a), u_t(b))`` at ``alpha = 1`` (times from ``t0``) and its ``lam``-derivative."""
    p1, d1 = _phi1(b, lam, kind)
    p2, d2 = _phi1(b - a, lam, kind)
    return p1 - p2, d1 - d2


@nb.njit(**JIT)
def kx_far(b: float, lam: float, kind: int) -> tuple[float, float]:
    """``kx(a, b)`` as ``a - b -> infinity`` (exact for the uniform kernel once ``a - b >= 2 lam``)."""
    p1, d1 = _phi1(b, lam, kind)
    if kind == UNIFORM:
        return p1 + 2.0 * lam * lam, d1 + 4.0 * lam
    return p1 + math.pi * lam * lam, d1 + 2.0 * math.pi * lam


@nb.njit(**JIT)
def kc(a: float, b: float, lam: float, kind: int) -> tuple[float, float]:
    """``cov(u(a), u(b))`` at ``alpha = 1`` (times from ``t0``) and its ``lam``-derivative."""
    pa, da = _phi2(a, lam, kind)
    pb, db = _phi2(b, lam, kind)
    pab, dab = _phi2(a - b, lam, kind)
    return pa + pb - pab, da + db - dab


def prior_covariances(
    kernel: str, lam: float, alpha: float, deriv_times, state_times
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Dense prior blocks of the joint prior (Chkrebtii et al., 2016, eq. 5), times measured from ``t0``.

    Returns ``(Ct, X, C)`` with ``Ct[i, j] = cov(u_t(a_i), u_t(a_j))``, ``X[k, i] = cov(u(b_k),
    u_t(a_i))`` and ``C[k, l] = cov(u(b_k), u(b_l))`` for ``a = deriv_times``, ``b = state_times``.
    A convenience for plots and checks; the solver itself never forms these matrices densely for
    the uniform kernel.
    """
    kind = kernel_code(kernel)
    a = np.asarray(deriv_times, dtype=np.float64).reshape(-1)
    b = np.asarray(state_times, dtype=np.float64).reshape(-1)
    ct = np.array([[kt(x, y, lam, kind)[0] for y in a] for x in a]).reshape(a.size, a.size)
    xx = np.array([[kx(x, y, lam, kind)[0] for y in a] for x in b]).reshape(b.size, a.size)
    cc = np.array([[kc(x, y, lam, kind)[0] for y in b] for x in b]).reshape(b.size, b.size)
    return ct / alpha, xx / alpha, cc / alpha
