"""Gauss–Markov priors for ODE filters: the q-times integrated Wiener process IWP(q).

State ordering is derivative-major: ``x = [y, y', ..., y^(q)]`` with each block of length ``d``, so
``A(h) = Ǎ(h) ⊗ I_d`` and ``Q(h) = Q̌(h) ⊗ I_d``. Transitions are used in the preconditioned form of
Krämer & Hennig (2024): ``A(h) = T(h) Ā T(h)^{-1}`` and ``Q(h) = T(h) Q̄ T(h)`` with
step-independent ``Ā``, ``Q̄`` and a diagonal ``T(h)``, so ``Q(h)^{1/2} = Q̄^{1/2} T(h)`` is formed by
scaling an exactly factorised constant matrix, without cancellation for small steps or high order.
"""

from __future__ import annotations

from fractions import Fraction
from math import comb, factorial

import numpy as np

__all__ = ["IWP", "MAX_ORDER"]

MAX_ORDER = 12


def _exact_right_cholesky(q: int) -> np.ndarray:
    """Upper-triangular ``R`` with ``Q̄ = R^T R`` for ``Q̄_ij = 1/(2q+1-i-j)``.

    ``Q̄`` is a Hilbert-like matrix (condition number ~1e12 at q = 8), so the LDL^T factorisation is
    done in exact rational arithmetic and only the final square roots are rounded.
    """
    n = q + 1
    a = [[Fraction(1, 2 * q + 1 - i - j) for j in range(n)] for i in range(n)]
    lower = [[Fraction(0)] * n for _ in range(n)]
    diag = [Fraction(0)] * n
    for j in range(n):
        diag[j] = a[j][j] - sum(lower[j][k] ** 2 * diag[k] for k in range(j))
        lower[j][j] = Fraction(1)
        for i in range(j + 1, n):
            lower[i][j] = (a[i][j] - sum(lower[i][k] * lower[j][k] * diag[k] for k in range(j))) / diag[j]
    r = np.zeros((n, n))
    for j in range(n):
        s = float(diag[j]) ** 0.5
        for i in range(j, n):
            r[j, i] = s * float(lower[i][j])
    return r


class IWP:
    """The q-times integrated Wiener process prior, ``q = order``.

    Parameters
    ----------
    order : int
        Number of modelled derivatives ``q`` (``1 <= q <= 12``).

    Attributes
    ----------
    A_bar : ndarray, shape (q+1, q+1)
        Step-independent preconditioned transition, ``Ā_ij = binom(q-i, q-j)`` for ``j >= i``.
    Q_bar : ndarray, shape (q+1, q+1)
        Step-independent preconditioned diffusion, ``Q̄_ij = 1/(2q+1-i-j)``.
    Q_bar_sqrt : ndarray, shape (q+1, q+1)
        Upper-triangular right square root, ``Q̄ = Q_bar_sqrt.T @ Q_bar_sqrt``.
    """

    def __init__(self, order: int):
        if isinstance(order, bool) or int(order) != order or not 1 <= order <= MAX_ORDER:
            raise ValueError(f"order (q) must be an integer in [1, {MAX_ORDER}], got {order!r}")
        self.order = q = int(order)
        n = q + 1
        self.A_bar = np.array(
            [[comb(q - i, q - j) if j >= i else 0 for j in range(n)] for i in range(n)], dtype=float
        )
        self.Q_bar = np.array([[1.0 / (2 * q + 1 - i - j) for j in range(n)] for i in range(n)])
        self.Q_bar_sqrt = _exact_right_cholesky(q)

    def preconditioner(self, h: float) -> np.ndarray:
        """Diagonal of ``T(h)``: ``sqrt(h) h^(q-i) / (q-i)!`` for ``i = 0..q``."""
        q = self.order
        return np.array([np.sqrt(h) * h ** (q - i) / factorial(q - i) for i in range(q + 1)])

    def transition(self, h: float) -> tuple[np.ndarray, np.ndarray]:
        """One-dimensional transition ``(Ǎ(h), Q̌(h))`` for step ``h`` (unit diffusion)."""
        t = self.preconditioner(h)
        a = t[:, None] * self.A_bar / t[None, :]
        qm = t[:, None] * self.Q_bar * t[None, :]
        return a, qm

    def drift(self) -> np.ndarray:
        """Drift matrix ``F̌`` of the SDE ``dx = F̌ x dt + e_q dW`` (one dimension)."""
        return np.eye(self.order + 1, k=1)

    def __repr__(self) -> str:
        return f"IWP(order={self.order})"
