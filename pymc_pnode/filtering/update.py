"""Linearisation and update of the ODE filters (EK0, EK1), each with its adjoint.

The ODE information ``0 = E1 x − f(E0 x)`` is linearised at the predicted solution ``ξ = E0 μ⁻``:
``H = E1 − L E0`` with ``L = ∂f/∂y(ξ)`` (EK1) or ``L = 0`` (EK0), and residual ``ẑ = E1 μ⁻ − f(ξ)``
(Tronarp, Kersting, Särkkä & Hennig, 2019). The update's value is computed on square roots (one QR,
Bosch, 2024, PhD thesis); :func:`update_adjoint` is the adjoint of a general Gaussian update on
covariances, shared by the ODE update and the Fenrir data update (Tronarp, Bosch & Hennig, 2022).
"""

from __future__ import annotations

import math
from collections import namedtuple

import numba as nb
import numpy as np

from pymc_pnode._callbacks import FN, call
from pymc_pnode._jit import INLINE_JIT
from pymc_pnode.filtering.linalg import cholesky_inplace, matmul_part, matvec, matvec_t, solve_lower, tria_cols_inplace

# The vector field as the forward pass needs it: f, ∂f/∂y (addresses of C callbacks, :mod:`pymc_pnode._callbacks`),
# the bound T(f) of f's rounding error that the EK0's rounding floor reads (:attr:`pymc_pnode.ODE.term_scale`; 0
# where no floor needs it), the parameters and EK1 (else EK0).
VectorField = namedtuple("VectorField", ["rhs", "jac_y", "term_scale", "theta", "ek1"])
VECTOR_FIELD_T = nb.types.NamedTuple([FN, FN, FN, nb.float64[::1], nb.boolean], VectorField)
# The derivatives only the adjoints need: ∂f/∂θ, the second derivatives contracted with a weight matrix
# (:attr:`pymc_pnode.ODE.hess_contract`) and the vector–Jacobian product of T(f) (0 where unused).
FieldDerivatives = namedtuple("FieldDerivatives", ["jac_p", "hess_contract", "term_scale_vjp"])
# Scratch of one linearisation: ξ, f(ξ) and ∂f/∂y(ξ) (zeros for EK0).
LinearisationWork = namedtuple("LinearisationWork", ["xi", "fx", "jac"])
# A linear Gaussian observation of the state: rows ``H[:rows]``, noise variances, residual ``r = H μ⁻ + c``.
GaussianObservation = namedtuple("GaussianObservation", ["hm", "noise_var", "resid", "rows"])
# Adjoints of a Gaussian's mean and covariance.
Cotangent = namedtuple("Cotangent", ["mean", "cov"])
# What :func:`update_adjoint` returns besides the cotangent: adjoints of the residual, of the noise
# variances (diagonal of S̄) and of H; ``rounding[0]`` keeps the largest bound on the relative rounding error of Σ̄⁻
# (:func:`congruence_rounding`) over the updates it has served.
UpdateAdjointOut = namedtuple("UpdateAdjointOut", ["rbar", "sdiag", "hbar", "rounding"])
UpdateAdjointWork = namedtuple("UpdateAdjointWork", ["wk", "wm", "wv"])
# Cotangents reaching one linearisation: of the residual ẑ through the update (rbar) and through the local
# diffusion (zbar), of H (hbar) and of L through the local diffusion (jbar).
LinearisationCotangents = namedtuple("LinearisationCotangents", ["rbar", "hbar", "zbar", "jbar"])
LinearisationAdjointWork = namedtuple("LinearisationAdjointWork", ["lbar", "xbar", "jp", "hy", "hp", "jtrue"])


@nb.njit(**INLINE_JIT)
def linearisation_work(d: int) -> LinearisationWork:
    """Scratch arrays of :func:`linearise` for ``d`` states."""
    return LinearisationWork(np.empty(d), np.empty(d), np.zeros((d, d)))


@nb.njit(**INLINE_JIT)
def update_adjoint_work(dd: int, rows: int) -> UpdateAdjointWork:
    """Work arrays of :func:`update_adjoint` for states of length ``dd`` and up to ``rows`` observed rows."""
    return UpdateAdjointWork(np.empty((4, dd, rows)), np.empty((4, rows, rows)), np.empty((4, max(dd, rows))))


@nb.njit(**INLINE_JIT)
def linearisation_adjoint_work(d: int, k: int) -> LinearisationAdjointWork:
    """Work arrays of :func:`linearise_adjoint` for ``d`` states and ``k`` parameters."""
    return LinearisationAdjointWork(np.empty((d, d)), np.empty(d), np.zeros((d, k)), np.zeros(d), np.zeros(k),
                                    np.zeros((d, d)))


@nb.njit(**INLINE_JIT)
def linearise(
    field: VectorField, t: float, mu_pred: np.ndarray, d: int, xi: np.ndarray, fx: np.ndarray, jac: np.ndarray,
    lin: np.ndarray, zhat: np.ndarray,
) -> None:
    """``L`` (into ``lin``) and ``ẑ = E1 μ⁻ − f(ξ)`` (into ``zhat``) at ``ξ = E0 μ⁻`` (scratch ``xi``, ``fx`` = f(ξ),
    ``jac``: zeros for EK0). ``lin`` is ``(d, d)``, or ``(d, 1)`` for a block-diagonal filter, which keeps
    only the diagonal ``L_ii`` (in ``lin[i, 0]``; :mod:`.structure`)."""
    rhs, jac_y, _, theta, ek1 = field
    for c in range(d):
        xi[c] = mu_pred[c]
    call(rhs, xi, t, theta, fx)
    if ek1:
        call(jac_y, xi, t, theta, jac)
    if lin.shape[1] == d:
        for r in range(d):  # grown rows are uninitialised: write the zeros of EK0 too
            for c in range(d):
                lin[r, c] = jac[r, c]
    else:
        for r in range(d):
            lin[r, 0] = jac[r, r]
    for c in range(d):
        zhat[c] = mu_pred[d + c] - fx[c]


@nb.njit(**INLINE_JIT)
def f_scale_size(field: VectorField, d: int) -> int:
    """Length of a step's ``T(f)`` for the rounding floor (:class:`~.calibration.FloorInputs`): ``d`` for an EK0
    given :attr:`pymc_pnode.ODE.term_scale`, else 0 (the EK1 reads its Jacobian)."""
    return d if not field.ek1 and field.term_scale != 0 else 0


@nb.njit(**INLINE_JIT)
def f_scale(field: VectorField, t: float, xi: np.ndarray, out: np.ndarray) -> None:
    """``T(f)`` at ``ξ`` into ``out`` (nothing when ``out`` has length 0: :func:`f_scale_size`)."""
    if out.shape[0] > 0:
        call(field.term_scale, xi, t, field.theta, out)


@nb.njit(**INLINE_JIT)
def f_scales_of_steps(field: VectorField, grid: np.ndarray, mu_pred: np.ndarray, d: int) -> np.ndarray:
    """:func:`f_scale` of every step of a kept run (row ``n``: at ``grid[n]`` and ``E0 μ⁻_n``; row 0 unused):
    ``(n, d)``, or ``(n, 0)`` when the floor reads no ``T(f)``."""
    scales = np.zeros((grid.shape[0], f_scale_size(field, d)))
    if scales.shape[1] > 0:
        xi = np.empty(d)
        for n in range(1, grid.shape[0]):
            for c in range(d):
                xi[c] = mu_pred[n, c]
            f_scale(field, grid[n], xi, scales[n])
    return scales


@nb.njit(**INLINE_JIT)
def f_scale_adjoint(
    field: VectorField, derivs: FieldDerivatives, t: float, xi: np.ndarray, f_scale_bar: np.ndarray,
    mbar_pred: np.ndarray, grad_theta: np.ndarray, work: LinearisationAdjointWork,
) -> None:
    """Adds the cotangent ``f_scale_bar`` of :func:`f_scale`' ``T(f)`` to those of ``E0 μ⁻`` (``mbar_pred``)
    and of ``θ`` (``grad_theta``)."""
    if f_scale_bar.shape[0] == 0:
        return
    call(derivs.term_scale_vjp, xi, t, field.theta, f_scale_bar, work.hy, work.hp)
    for e in range(xi.shape[0]):
        mbar_pred[e] += work.hy[e]
    for j in range(grad_theta.shape[0]):
        grad_theta[j] += work.hp[j]


@nb.njit(**INLINE_JIT)
def ode_observation_matrix(lin: np.ndarray, d: int, hm: np.ndarray) -> None:
    """``hm[:d] = H = E1 − L E0`` (the other columns zero)."""
    hm[:, :] = 0.0
    for r in range(d):
        hm[r, d + r] = 1.0
        for c in range(d):
            hm[r, c] = -lin[r, c]


@nb.njit(inline="always", **INLINE_JIT)
def linearise_adjoint(
    field: VectorField, derivs: FieldDerivatives, t: float, xi: np.ndarray, lin: np.ndarray, layout: tuple[int, bool],
    cot: LinearisationCotangents, mbar_pred: np.ndarray, grad_theta: np.ndarray, work: LinearisationAdjointWork,
) -> None:
    """Adjoint of :func:`linearise` through ``H = E1 − L E0`` and ``c = −f(ξ) + L ξ`` (so that ``r = H μ⁻ + c = ẑ``).

    ``layout = (d, diagonal)``, as :func:`~.structure.block_update_adjoint`'s ``(q, d, ek1)``: an explicit ``d``
    stays a compile-time constant in the kernels compiled per ``(q, d)`` (``docs/architecture.md``), which
    ``xi.shape[0]`` would not be.

    ``cot.rbar`` is the adjoint of ``c``, ``cot.hbar`` of ``H``; ``cot.zbar`` and ``cot.jbar`` those of ``ẑ``
    and ``L`` through the local diffusion. Adds the adjoints of ``μ⁻`` (through ``ξ`` and ``E1 μ⁻``) to
    ``mbar_pred`` and those of ``θ`` to ``grad_theta``. EK1's ``L = J(ξ)`` brings the second derivatives;
    with ``diagonal`` (the block-diagonal EK1, :mod:`.structure`; ``lin[i, 0] = L_ii``) ``L = diag J(ξ)``,
    whose off-diagonal part of ``J`` no longer cancels in ``∂c/∂ξ = −J + L``.
    """
    d, diagonal = layout
    k = grad_theta.shape[0]
    _, jac_y, _, theta, ek1 = field
    rbar, hbar, zbar, jbar = cot
    lbar, xbar, jp, hy, hp, jtrue = work
    for c in range(d):
        mbar_pred[d + c] += zbar[c]
    call(derivs.jac_p, xi, t, theta, jp)
    for j in range(k):
        s = 0.0
        for c in range(d):
            s -= jp[c, j] * (rbar[c] + zbar[c])
        grad_theta[j] += s
    if ek1 and diagonal:
        lbar[:, :] = 0.0
        for r in range(d):
            lbar[r, r] = -hbar[r, r] + rbar[r] * xi[r] + jbar[r, r]
        call(derivs.hess_contract, xi, t, theta, lbar, hy, hp)
        call(jac_y, xi, t, theta, jtrue)
        for e in range(d):
            s = hy[e] + lin[e, 0] * rbar[e]
            for c in range(d):
                s -= jtrue[c, e] * (rbar[c] + zbar[c])
            xbar[e] = s
        for j in range(k):
            grad_theta[j] += hp[j]
    elif ek1:
        for r in range(d):
            for c in range(d):
                lbar[r, c] = -hbar[r, c] + rbar[r] * xi[c] + jbar[r, c]
        call(derivs.hess_contract, xi, t, theta, lbar, hy, hp)
        for e in range(d):
            s = hy[e]
            for r in range(d):
                s -= lin[r, e] * zbar[r]
            xbar[e] = s
        for j in range(k):
            grad_theta[j] += hp[j]
    else:
        call(jac_y, xi, t, theta, jtrue)
        for e in range(d):
            s = 0.0
            for c in range(d):
                s -= jtrue[c, e] * (rbar[c] + zbar[c])
            xbar[e] = s
    for e in range(d):
        mbar_pred[e] += xbar[e]


@nb.njit(**INLINE_JIT)
def condition_stack(
    stack: np.ndarray, rows: int, m: int, residual: np.ndarray, w: np.ndarray, mean_pred: np.ndarray,
    mean_out: np.ndarray, root_out: np.ndarray,
) -> float:
    """The end of every square-root update (the ODE's and the data's): one QR of the stacked roots.

    ``stack`` holds, transposed (its row ``k`` is column ``k``), the ``rows × (m + D)`` stack
    ``[[R⁻ Hᵀ, R⁻], [N, 0]]`` of the predicted root ``R⁻`` and, below it, the noise's root ``N`` (none in
    the ODE update, where ``rows = D``), and one more row of work space after ``m + D`` columns. The QR
    gives ``R11`` (``R11ᵀ R11 = S``), ``R12 = R11⁻ᵀ H Σ⁻`` and the posterior root ``R22``: ``mean_out =
    mean_pred − R12ᵀ R11⁻ᵀ residual`` (``K residual``; ``mean_out`` may be ``mean_pred``) and ``root_out =
    R22``, zero below its rows.
    Returns ``residualᵀ S⁻¹ residual``; ``stack[:m, :m]`` keeps ``R11ᵀ`` and ``w`` (length ``≥ m``) keeps
    ``R11⁻ᵀ residual``.
    """
    dd = root_out.shape[0]
    tria_cols_inplace(stack, rows, m + dd, stack[m + dd])
    solve_lower(stack, m, residual, w)
    quad = 0.0
    for k in range(m):
        quad += w[k] * w[k]
    for col in range(dd):
        s = 0.0
        for k in range(m):
            s += stack[m + col, k] * w[k]
        mean_out[col] = mean_pred[col] - s
    for row in range(dd):
        for col in range(dd):
            root_out[row, col] = stack[m + col, m + row] if m + row < rows else 0.0
    return quad


@nb.njit(**INLINE_JIT)
def update_sqrt(
    r_pred: np.ndarray, mu_pred: np.ndarray, lin: np.ndarray, zhat: np.ndarray, q: int, d: int, m: np.ndarray,
    w: np.ndarray, mu_out: np.ndarray, r_out: np.ndarray,
) -> float:
    """Condition on the zero defect ``E1 x - f(E0 x) = 0`` linearised with ``H = E1 - L E0``.

    One QR of ``[R⁻ H^T | R⁻]`` (:func:`condition_stack`) yields ``S^{1/2}`` (R11), the gain
    ``K = R12^T R11^{-T}`` and the posterior square root (R22). ``m`` is ``(d + D + 1, D)`` work space (the
    stack, transposed, and the QR's work vector), ``w`` of length ``≥ d``.
    Returns ``ẑ^T S^{-1} ẑ`` (the calibration statistic).
    """
    dd = (q + 1) * d
    # m holds the transposed stack: m[k] = column k of [R⁻ Hᵀ | R⁻]
    for k in range(d):
        for row in range(dd):
            s = r_pred[row, d + k]
            for l in range(d):
                s -= r_pred[row, l] * lin[k, l]
            m[k, row] = s
    for col in range(dd):
        for row in range(dd):
            m[d + col, row] = r_pred[row, col]
    return condition_stack(m, dd, d, zhat, w, mu_pred, mu_out, r_out)


@nb.njit(**INLINE_JIT)
def spd_inverse(s: np.ndarray, n: int, inv: np.ndarray, work: np.ndarray) -> bool:
    """``inv[:n, :n] = s[:n, :n]⁻¹`` by Cholesky; False if not positive definite."""
    for i in range(n):
        for j in range(n):
            work[i, j] = s[i, j]
    if not cholesky_inplace(work, n):
        return False
    # inv = L⁻ᵀ L⁻¹, column by column
    for col in range(n):
        for i in range(n):
            v = 1.0 if i == col else 0.0
            for k in range(i):
                v -= work[i, k] * inv[k, col]
            inv[i, col] = v / work[i, i]
        for i in range(n - 1, -1, -1):
            v = inv[i, col]
            for k in range(i + 1, n):
                v -= work[k, i] * inv[k, col]
            inv[i, col] = v / work[i, i]
    return True


@nb.njit(**INLINE_JIT)
def congruence_rounding(gain_sq: float, norm_in_sq: float, norm_out_sq: float) -> float:
    """How much float64 rounding can change the result of a congruence with ``Φ = I − K H``, relative to it.

    The update's covariance adjoint ``Σ̄⁻ = Φᵀ Σ̄⁺ Φ + …`` and the covariance tangent ``dΣ = Φ dΣ⁻ Φᵀ + …`` both
    apply it. Its input arrives with relative errors of about ``ε`` (the rounding of the steps before it); a
    perturbation ``δ`` becomes ``Φᵀ δ Φ``, so ``ε ‖Φ‖² ‖in‖ / ‖out‖`` bounds the relative change of the result to
    first order, with ``‖Φ‖ ≤ 1 + ‖K H‖``. Large where the result cancels: a huge gain (an unstable mode that the
    ODE measurement barely sees) and an input that the exact congruence nearly annihilates. Norms are Frobenius
    norms in coordinates that scale every state by its predicted standard deviation (rounding is blind to such
    scalings; unscaled, ``‖K H‖`` mostly measures the units of the derivatives): ``gain_sq`` from
    :func:`scaled_gain_sq`, the squared norms of input and output as :func:`scaled_norm_sq`. Returns 0 for a
    zero input.
    """
    if norm_in_sq == 0.0:
        return 0.0
    if norm_out_sq == 0.0:
        return math.inf
    return 2.220446049250313e-16 * (1.0 + math.sqrt(gain_sq)) ** 2 * math.sqrt(norm_in_sq / norm_out_sq)


@nb.njit(**INLINE_JIT)
def state_scales(sig_pred: np.ndarray, scale: np.ndarray) -> None:
    """``scale`` = the predicted standard deviations ``√diag Σ⁻``: the coordinates of :func:`congruence_rounding`."""
    for a in range(sig_pred.shape[0]):
        scale[a] = math.sqrt(max(sig_pred[a, a], 0.0))


@nb.njit(**INLINE_JIT)
def scaled_gain_sq(gain: np.ndarray, hm: np.ndarray, rows: int, scale: np.ndarray) -> float:
    """``Σ_i ‖T⁻¹ K e_i‖² ‖e_iᵀ H T‖²`` (``T = diag(scale)``, ``rows`` rows of ``H``): ``‖K H‖²`` in the scaled
    coordinates for one row, an upper bound up to a factor ``rows`` for more."""
    total = 0.0
    for i in range(rows):
        g = 0.0
        for a in range(gain.shape[0]):
            if scale[a] > 0.0:
                x = gain[a, i] / scale[a]
                g += x * x
        h = 0.0
        for b in range(hm.shape[1]):
            x = hm[i, b] * scale[b]
            h += x * x
        total += g * h
    return total


@nb.njit(**INLINE_JIT)
def scaled_norm_sq(x: np.ndarray, weights: np.ndarray) -> float:
    """``‖W x W‖²`` with ``W = diag(weights)``: a cotangent's norm in the scaled coordinates with ``weights`` the
    scales, a tangent's with their inverses (0 for a state of zero scale)."""
    total = 0.0
    for a in range(x.shape[0]):
        for b in range(x.shape[1]):
            v = weights[a] * x[a, b] * weights[b]
            total += v * v
    return total


@nb.njit(inline="always", **INLINE_JIT)
def update_adjoint(
    obs: GaussianObservation, sp: np.ndarray, spost: np.ndarray, mu_pred: np.ndarray, weights: tuple[float, float],
    bar: Cotangent, want_h: bool, out: UpdateAdjointOut, work: UpdateAdjointWork,
) -> bool:
    """Adjoint of ``μ⁺ = μ⁻ − K r``, ``Σ⁺ = Σ⁻ − K S Kᵀ`` and ``−½ (wq rᵀS⁻¹r + wl log|S|)``.

    ``weights = (wq, wl)``: ``wq = wl = w`` is the adjoint of ``w · log N(r; 0, S)`` (up to a constant);
    ``wq = −2c, wl = 0`` that of ``c · rᵀS⁻¹r``, the calibration statistic.

    ``S = H Σ⁻ Hᵀ + diag(noise_var)``, ``K = Σ⁻ Hᵀ S⁻¹``, residual ``r = H μ⁻ + c`` (``obs``); ``sp`` is
    ``Σ⁻``. On entry ``bar`` (its covariance symmetric) holds the adjoints of ``μ⁺, Σ⁺``; on exit those of
    ``μ⁻, Σ⁻``. Outputs: ``out.rbar`` (adjoint of ``r``, i.e. of ``c``), ``out.sdiag`` (diagonal of ``S̄``,
    for the noise) and, if ``want_h``, ``out.hbar`` (adjoint of ``H``; needs ``spost = Σ⁺``). Returns
    False if ``S`` is singular. Work arrays (:func:`update_adjoint_work`): ``wk`` (4, D, m), ``wm``
    (4, m, m), ``wv`` (4, max(D, m)).
    """
    hm, nv, r, mo = obs
    wq, wl = weights
    mbar, sbar = bar
    rbar, sdiag, hbar, rounding = out
    wk, wm, wv = work
    dd = sp.shape[0]
    u, kg, t1, mh_t = wk[0], wk[1], wk[2], wk[3]
    smat, sinv, mmat, chol = wm[0], wm[1], wm[2], wm[3]
    bm, v, alpha, kr = wv[0], wv[1], wv[2], wv[3]
    # U = Σ⁻ Hᵀ, S = H U + R, α = S⁻¹ r, K = U S⁻¹
    matmul_part(sp, hm.T, dd, dd, mo, u)
    matmul_part(hm, u, mo, dd, mo, smat)
    for i in range(mo):
        smat[i, i] += nv[i]
    if not spd_inverse(smat, mo, sinv, chol):
        return False
    matvec(sinv, r, mo, mo, alpha)
    matmul_part(u, sinv, dd, mo, mo, kg)
    # km = Kᵀ μ̄⁺ (kept in rbar for now), v = Hᵀ α, T1 = Σ̄⁺ K
    matvec_t(kg, mbar, mo, dd, rbar)
    matvec_t(hm, alpha, dd, mo, v)
    matmul_part(sbar, kg, dd, dd, mo, t1)
    # KᵀΣ̄⁺K and M = ½ w (ααᵀ − S⁻¹) + KᵀΣ̄⁺K; S̄ = M + sym(km αᵀ)
    matmul_part(kg.T, t1, mo, dd, mo, mmat)
    for i in range(mo):
        for j in range(mo):
            mmat[i, j] += 0.5 * (wq * alpha[i] * alpha[j] - wl * sinv[i, j])
    for i in range(mo):
        sdiag[i] = mmat[i, i] + rbar[i] * alpha[i]
    # B^T μ̄⁺ = μ̄⁺ − Hᵀ km
    for b in range(dd):
        s = mbar[b]
        for i in range(mo):
            s -= hm[i, b] * rbar[i]
        bm[b] = s
    if want_h:
        # H̄ = −2 (Σ̄⁺K)ᵀ Σ⁺ − α (Σ⁺ μ̄⁺)ᵀ + (wq ααᵀ − wl S⁻¹) Uᵀ + km (K r)ᵀ + r̄ μ⁻ᵀ, r̄ = −wq α − km
        matvec(kg, r, dd, mo, kr)
        for b in range(dd):
            s = 0.0
            for c in range(dd):
                s += spost[b, c] * mbar[c]
            work_b = s
            for i in range(mo):
                acc = -alpha[i] * work_b + rbar[i] * kr[b] + (-wq * alpha[i] - rbar[i]) * mu_pred[b]
                s2 = 0.0
                for c in range(dd):
                    s2 += t1[c, i] * spost[c, b]
                acc -= 2.0 * s2
                s3 = 0.0
                for j in range(mo):
                    s3 += (wq * alpha[i] * alpha[j] - wl * sinv[i, j]) * u[b, j]
                acc += s3
                hbar[i, b] = acc
    # The rounding bound (congruence_rounding) of this update, its norms in the loop below
    scale = kr  # (free here)
    state_scales(sp, scale)
    gain_sq = scaled_gain_sq(kg, hm, mo, scale)
    # Σ̄⁻ = Σ̄⁺ − T1 H − Hᵀ T1ᵀ + Hᵀ M H − ½ (bm vᵀ + v bmᵀ)   (in place, symmetric)
    matmul_part(hm.T, mmat.T, dd, mo, mo, mh_t)  # (M H)ᵀ
    norm_post = norm_pre = 0.0  # ‖T Σ̄⁺ T‖², ‖T Σ̄⁻ T‖² (a cotangent scales with T) in the same pass
    for a_ in range(dd):
        for b in range(a_, dd):
            s = sbar[a_, b] - 0.5 * (bm[a_] * v[b] + v[a_] * bm[b])
            for i in range(mo):
                s += hm[i, a_] * (mh_t[b, i] - t1[b, i]) - t1[a_, i] * hm[i, b]
            weight = (scale[a_] * scale[b]) ** 2 * (1.0 if a_ == b else 2.0)
            norm_post += weight * sbar[a_, b] * sbar[a_, b]
            norm_pre += weight * s * s
            sbar[a_, b] = s
            sbar[b, a_] = s
    rounding[0] = max(rounding[0], congruence_rounding(gain_sq, norm_post, norm_pre))
    for b in range(dd):
        mbar[b] = bm[b] - wq * v[b]
    for i in range(mo):
        rbar[i] = -wq * alpha[i] - rbar[i]
    return True
