"""Small dense linear algebra for the square-root filters, written for numba without allocations.

Square roots are *right* roots: ``Σ = R^T R``. ``tria`` triangularises a stacked square root by
Householder reflections (only ``R`` of ``M = QR`` is needed), which keeps every covariance positive
semi-definite by construction.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

_JIT = dict(cache=True, error_model="numpy", nogil=True)


@nb.njit(**_JIT)
def tria_inplace(m: np.ndarray, rows: int, cols: int) -> None:
    """Overwrite ``m[:rows, :cols]`` by the ``R`` factor of its QR decomposition.

    After the call the leading ``min(rows, cols)`` rows hold an upper-trapezoidal ``R`` with
    ``R^T R = M^T M``; the remaining rows are zero.
    """
    steps = min(rows, cols)
    for k in range(steps):
        norm2 = 0.0
        for i in range(k, rows):
            norm2 += m[i, k] * m[i, k]
        if norm2 == 0.0:
            continue
        norm = math.sqrt(norm2)
        x0 = m[k, k]
        alpha = -norm if x0 >= 0.0 else norm
        v0 = x0 - alpha
        # Householder vector v = [v0, m[k+1:, k]]; vnorm2 = v^T v.
        vnorm2 = norm2 - x0 * x0 + v0 * v0
        if vnorm2 == 0.0:
            continue
        scale = 2.0 / vnorm2
        for j in range(k + 1, cols):
            s = v0 * m[k, j]
            for i in range(k + 1, rows):
                s += m[i, k] * m[i, j]
            s *= scale
            m[k, j] -= s * v0
            for i in range(k + 1, rows):
                m[i, j] -= s * m[i, k]
        m[k, k] = alpha
        for i in range(k + 1, rows):
            m[i, k] = 0.0


@nb.njit(**_JIT)
def solve_lower_from_upper_t(r: np.ndarray, n: int, b: np.ndarray, out: np.ndarray) -> None:
    """Solve ``R^T x = b`` for upper-triangular ``R = r[:n, :n]`` (forward substitution)."""
    for i in range(n):
        s = b[i]
        for k in range(i):
            s -= r[k, i] * out[k]
        out[i] = s / r[i, i]


@nb.njit(**_JIT)
def solve_upper(r: np.ndarray, n: int, b: np.ndarray, out: np.ndarray) -> None:
    """Solve ``R x = b`` for upper-triangular ``R = r[:n, :n]`` (back substitution)."""
    for i in range(n - 1, -1, -1):
        s = b[i]
        for k in range(i + 1, n):
            s -= r[i, k] * out[k]
        out[i] = s / r[i, i]


@nb.njit(**_JIT)
def cholesky_inplace(a: np.ndarray, n: int) -> bool:
    """Lower Cholesky factor of ``a[:n, :n]`` in place; False if not positive definite."""
    for j in range(n):
        s = a[j, j]
        for k in range(j):
            s -= a[j, k] * a[j, k]
        if not s > 0.0:
            return False
        ljj = math.sqrt(s)
        a[j, j] = ljj
        for i in range(j + 1, n):
            s = a[i, j]
            for k in range(j):
                s -= a[i, k] * a[j, k]
            a[i, j] = s / ljj
        for i in range(j):
            a[i, j] = 0.0
    return True


@nb.njit(**_JIT)
def all_finite(a: np.ndarray) -> bool:
    for x in a.flat:
        if not math.isfinite(x):
            return False
    return True


@nb.njit(**_JIT)
def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out = a @ b`` without allocation (small dense matrices)."""
    n, k = a.shape
    m = b.shape[1]
    for i in range(n):
        for j in range(m):
            out[i, j] = 0.0
        for p in range(k):
            aip = a[i, p]
            if aip != 0.0:
                for j in range(m):
                    out[i, j] += aip * b[p, j]


@nb.njit(**_JIT)
def matmul_nt(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out = a @ b.T`` without allocation."""
    n, k = a.shape
    m = b.shape[0]
    for i in range(n):
        for j in range(m):
            s = 0.0
            for p in range(k):
                s += a[i, p] * b[j, p]
            out[i, j] = s


@nb.njit(**_JIT)
def sandwich(b: np.ndarray, x: np.ndarray, work: np.ndarray, out: np.ndarray) -> None:
    """``out = b @ x @ b.T`` (``work`` receives ``b @ x``)."""
    matmul(b, x, work)
    matmul_nt(work, b, out)
