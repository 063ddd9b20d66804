"""Diffusion calibration and the local error estimate of the ODE filters, with the adjoint of the local κ.

Global: the quasi-MLE ``κ̂ = Σ_n ẑ_nᵀ S_n⁻¹ ẑ_n / (N d)`` of a filter run at unit diffusion (Tronarp et al.,
2019, Prop. 4; Bosch, Hennig & Tronarp, 2021, eq. 16). Local: per step
``κ_n = ẑ_nᵀ (H_n Q(h_n) H_nᵀ)⁻¹ ẑ_n / d`` under an error-free previous step (Schober et al., 2019;
Bosch et al., 2021, eq. 21), which also gives the step's error estimate (Bosch et al., 2021, eq. 27). A local
diffusion is used no smaller than the one a residual of rounding errors alone would give (:func:`rounding_kappa`),
and differentiated as the one it used.
"""

from __future__ import annotations

import math
from collections import namedtuple

import numba as nb
import numpy as np

from pymc_pnode._jit import INLINE_JIT
from pymc_pnode.filtering.linalg import cholesky_inplace

# Smallest calibrated diffusion: a field the prior solves exactly (ẑ = 0) would otherwise give κ̂ = 0
# and singular predicted covariances in the backward kernels.
KAPPA_FLOOR = 1e-150
# Unit roundoff of float64: the scale of one rounding error in a residual's terms (:func:`rounding_kappa`).
MACHINE_EPSILON = 2.220446049250313e-16

LocalErrorWork = namedtuple("LocalErrorWork", ["hqh_root", "hqh", "chol", "tmp"])


@nb.njit(**INLINE_JIT)
def local_error_work(q: int, d: int) -> LocalErrorWork:
    """Work arrays of :func:`local_error` for IWP order ``q`` and ``d`` states."""
    return LocalErrorWork(np.empty(((q + 1) * d, d)), np.empty((d, d)), np.empty((d, d)), np.empty(d))


@nb.njit(**INLINE_JIT)
def floored_kappa(kappa: float) -> float:
    """A calibrated diffusion as the filters use it: at least :data:`KAPPA_FLOOR` (NaN also floors)."""
    return kappa if math.isfinite(kappa) and kappa > KAPPA_FLOOR else KAPPA_FLOOR


@nb.njit(**INLINE_JIT)
def _rounding_terms(step: np.ndarray, rq: np.ndarray, q: int, k: int, lin: np.ndarray, dense: bool,
                    ) -> tuple[float, float, float]:
    """State ``k``'s unit-diffusion defect variance ``c_kk`` (:func:`local_defect_covariance`), its derivative in
    ``L_kk`` and ``u = Σ_i (rq[i, 0] T_0)²``, whose ``2 u L_ka`` is its derivative in an off-diagonal ``L_ka``."""
    t0, t1 = step[1, 0], step[1, 1]
    d = lin.shape[0]
    jkk = lin[k, k] if dense else lin[k, 0]
    off = 0.0  # Σ_{a≠k} L_ka²: the E0 columns of the other states
    if dense:
        for a in range(d):
            if a != k:
                off += lin[k, a] * lin[k, a]
    c_kk = dc_dj = u = 0.0  # c_kk: Σ over the rows (i, a) of the root of H Q Hᵀ, column k
    for i in range(q + 1):
        e0 = rq[i, 0] * t0
        diagonal = rq[i, 1] * t1 - e0 * jkk
        c_kk += diagonal * diagonal + e0 * e0 * off
        dc_dj -= 2.0 * diagonal * e0
        u += e0 * e0
    return c_kk, dc_dj, u


# What the rounding floor of one step reads: its prior coefficients ``step``, ``L`` (``lin``), ``ẑ``, ``μ⁻`` and,
# for the EK0 (no Jacobian), ``T(f)`` at ``ξ = E0 μ⁻`` (``f_scale``, :attr:`pymc_pnode.ODE.term_scale`; else
# length 0).
FloorInputs = namedtuple("FloorInputs", ["step", "lin", "zhat", "mu_pred", "f_scale"])
# Cotangents :func:`rounding_kappa_adjoint` writes: of ``ẑ``, ``L`` and ``T(f)``; it adds those of ``μ⁻``.
FloorCotangents = namedtuple("FloorCotangents", ["zbar", "jbar", "mbar_pred", "f_scale_bar"])


@nb.njit(**INLINE_JIT)
def _rounding_scale(k: int, x: FloorInputs, d: int, dense: bool) -> float:
    """``s_k = |E1 μ⁻_k| + |f_k| + Σ_a |L_ka ξ_a|`` (``ξ = E0 μ⁻``; only ``a = k`` for a diagonal ``lin``), or with
    ``T(f_k)`` in place of the last term when ``x.f_scale`` is given (the EK0): the scale whose rounding error
    ``ε s_k`` a computed residual ``ẑ_k = E1 μ⁻_k − f_k`` cannot resolve. The last term is the scale of ``f``'s own
    terms near an equilibrium, where they cancel: ``f = L ξ`` is a sum of such terms for a linear field, and a
    rounding error of ``ξ`` alone moves ``f`` by ``ε Σ_a |L_ka ξ_a|``; ``ε T(f_k)`` bounds the rounding error of the
    whole computed ``f_k`` (:mod:`pymc_pnode._rounding_bound`)."""
    mu_pred, lin = x.mu_pred, x.lin
    dy = mu_pred[d + k]
    s = abs(dy) + abs(dy - x.zhat[k])
    if x.f_scale.shape[0] > 0:
        s += x.f_scale[k]
    elif dense:
        for a in range(d):
            s += abs(lin[k, a] * mu_pred[a])
    else:
        s += abs(lin[k, 0] * mu_pred[k])
    return s


@nb.njit(**INLINE_JIT)
def rounding_kappa(x: FloorInputs, rq: np.ndarray, q: int, d: int) -> float:
    """The local diffusion that a residual made of rounding alone would give, ``ρ = Σ_k (ε s_k)² / c_kk / d``:
    ``ε`` times the scale ``s_k = |E1 μ⁻_k| + |f_k| + Σ_a |L_ka ξ_a|`` of the terms of ``ẑ_k = E1 μ⁻_k − f_k``
    (:func:`_rounding_scale`; the EK0 bounds the last term's part by ``T(f_k)``), ``c_kk`` the unit-diffusion defect
    variance of :func:`local_defect_covariance` (``x.lin``: the Jacobian ``(d, d)`` or its diagonal ``(d, 1)``;
    zeros for the EK0).

    A local diffusion below it is rounding noise, and so is its derivative. Where the prior represents the solution
    exactly (a polynomial, e.g. free fall) the residuals are 0 on one step and 1e-14 on the next, and diffusion
    ratios of 1e120 between neighbouring steps made the backward kernels singular (a Fenrir value 10³² nats off,
    measured). Within rounding of an equilibrium (logistic growth from ``K (1 + 1e-15)``) ``f`` is the rounding
    error of its cancelling terms, and the residuals' derivatives, ≈ 1e15 times their size, gave Fenrir gradients
    of 1e11 where the derivative is 0.45 (measured; the ``|L ξ|`` and ``T(f)`` terms). The filters use
    ``max(κ_n, ρ_n)`` and differentiate whichever they used (:func:`diffusion_source`)."""
    dense = x.lin.shape[1] == d  # (d = 1: both layouts agree)
    acc = 0.0
    for k in range(d):
        c_kk = _rounding_terms(x.step, rq, q, k, x.lin, dense)[0]
        noise = MACHINE_EPSILON * _rounding_scale(k, x, d, dense)
        if c_kk > 0.0:
            acc += noise * noise / c_kk
    return acc / d


@nb.njit(**INLINE_JIT)
def rounding_kappa_adjoint(kbar: float, x: FloorInputs, rq: np.ndarray, q: int, d: int, cot: FloorCotangents,
                           ) -> None:
    """Adjoint of :func:`rounding_kappa` for the cotangent ``kbar`` of ``ρ``: writes ``ẑ̄``, ``L̄`` (``(d, d)``; only its
    diagonal for a diagonal ``lin``) and the cotangent of ``T(f)`` (when ``x.f_scale`` is given) into ``cot``, and adds
    the cotangents of ``E0 μ⁻`` and ``E1 μ⁻`` to ``cot.mbar_pred[:2d]`` (the predicted mean's; ``T(f)``'s own path
    through ``ξ`` and ``θ`` is the caller's: :func:`~.update.f_scale_adjoint`).

    With ``ρ = Σ_k ε² s_k² / c_kk / d`` (:func:`_rounding_scale`): ``∂ρ/∂s_k = 2 ε² s_k / c_kk / d``,
    ``∂ρ/∂c_kk = −ε² s_k² / c_kk² / d``, and ``c_kk`` depends on row ``k`` of ``L`` (:func:`_rounding_terms`).
    """
    step, lin, zhat, mu_pred, f_scale = x
    zbar, jbar, mbar_pred, f_scale_bar = cot
    dense = lin.shape[1] == d
    with_scale = f_scale.shape[0] > 0
    scale = kbar * MACHINE_EPSILON * MACHINE_EPSILON / d
    jbar[:, :] = 0.0
    for k in range(d):
        zbar[k] = 0.0
        if with_scale:
            f_scale_bar[k] = 0.0
        c_kk, dc_dj, u = _rounding_terms(step, rq, q, k, lin, dense)
        if not c_kk > 0.0:
            continue
        dy = mu_pred[d + k]
        f = dy - zhat[k]
        s = _rounding_scale(k, x, d, dense)
        ds = 2.0 * scale * s / c_kk
        dc = -scale * s * s / (c_kk * c_kk)
        mbar_pred[d + k] += ds * (np.sign(dy) + np.sign(f))
        zbar[k] = -ds * np.sign(f)
        jbar[k, k] = dc * dc_dj
        if dense:
            for a in range(d):
                if a != k:
                    jbar[k, a] = dc * 2.0 * u * lin[k, a]
        if with_scale:
            f_scale_bar[k] = ds
        elif dense:
            for a in range(d):
                jbar[k, a] += ds * np.sign(lin[k, a]) * abs(mu_pred[a])  # the |L_ka ξ_a| terms of s_k
                mbar_pred[a] += ds * abs(lin[k, a]) * np.sign(mu_pred[a])
        else:
            jbar[k, k] += ds * np.sign(lin[k, 0]) * abs(mu_pred[k])
            mbar_pred[k] += ds * abs(lin[k, 0]) * np.sign(mu_pred[k])


# What a step's diffusion is, for the derivatives: its own local estimate (differentiated with
# :func:`local_kappa_adjoint`), the rounding floor (:func:`rounding_kappa_adjoint`) or the constant KAPPA_FLOOR.
KAPPA_ESTIMATE, KAPPA_ROUNDING, KAPPA_CONSTANT = 0, 1, 2


@nb.njit(**INLINE_JIT)
def diffusion_source(kappa: float, rounding: float) -> int:
    """Which of :data:`KAPPA_ESTIMATE`, :data:`KAPPA_ROUNDING` or :data:`KAPPA_CONSTANT` a step's diffusion is, from
    its local estimate (or the diffusion used, ``max(estimate, rounding, KAPPA_FLOOR)``) and its
    :func:`rounding_kappa` recomputed (a margin of 1e-9: a tangent recomputes its steps from the grid, so its
    rounding diffusion may differ from the forward pass's in the last bits)."""
    if kappa > max(KAPPA_FLOOR, rounding) * (1.0 + 1e-9):
        return KAPPA_ESTIMATE
    return KAPPA_ROUNDING if rounding > KAPPA_FLOOR else KAPPA_CONSTANT


@nb.njit(**INLINE_JIT)
def rounding_floored_kappas(run, f_scales: np.ndarray, rq: np.ndarray, q: int, d: int) -> np.ndarray:
    """The local diffusions of a kept unit-diffusion ``run`` (:data:`~.odefilter.ForwardRun`), each at least its
    :func:`rounding_kappa`, for the second pass of local calibration (Fenrir); ``f_scales``: every step's ``T(f)``
    (:func:`~.update.f_scale`; ``(n, 0)`` without)."""
    kappas = run.local_kappa.copy()
    for n in range(1, kappas.shape[0]):
        floor = rounding_kappa(FloorInputs(run.step[n], run.lin[n], run.zhat[n], run.mu_pred[n], f_scales[n]), rq, q, d)
        kappas[n] = max(kappas[n], floor)
    return kappas


@nb.njit(**INLINE_JIT)
def at_equilibrium(zhat: np.ndarray, mu_pred: np.ndarray, d: int) -> bool:
    """Whether a step's prediction sits exactly at an equilibrium of the field: its ODE residual ``ẑ`` and its
    derivative state ``E1 μ⁻`` (hence ``f``) exactly zero. Its error estimate and local diffusion are then zero
    (floored), whatever the solution's sensitivity to its inputs, so a grid and diffusions chosen there say nothing
    about nearby inputs. (A solution that the prior represents exactly, a polynomial, also has zero residuals, but
    nonzero derivatives: it is not at rest.)"""
    for k in range(d):
        if zhat[k] != 0.0 or mu_pred[d + k] != 0.0:
            return False
    return True


@nb.njit(**INLINE_JIT)
def global_kappa(stat_sum: float, n_steps: int, d: int) -> float:
    """The global quasi-MLE ``κ̂ = Σ ẑᵀ S⁻¹ ẑ / (N d)`` of a unit-diffusion run (1 without steps, NaN if not finite)."""
    if n_steps == 0:
        return 1.0
    kappa = stat_sum / (n_steps * d)
    return max(kappa, KAPPA_FLOOR) if math.isfinite(kappa) else math.nan


@nb.njit(**INLINE_JIT)
def local_defect_covariance(
    step: np.ndarray, rq: np.ndarray, q: int, d: int, jac: np.ndarray, bq: np.ndarray, c: np.ndarray
) -> None:
    """``c = H Q(h) H^T`` at unit diffusion, ``H = E1 - J E0`` (error-free previous step); ``bq`` = its root."""
    dd = (q + 1) * d
    t0, t1 = step[1, 0], step[1, 1]
    for i in range(q + 1):
        for a in range(d):
            row = i * d + a
            for k in range(d):
                v = rq[i, 1] * t1 if a == k else 0.0
                bq[row, k] = v - rq[i, 0] * t0 * jac[k, a]
    for k in range(d):
        for l in range(d):
            s = 0.0
            for row in range(dd):
                s += bq[row, k] * bq[row, l]
            c[k, l] = s


@nb.njit(**INLINE_JIT)
def quadratic_form_inverse(c: np.ndarray, z: np.ndarray, d: int, work: np.ndarray, tmp: np.ndarray) -> float:
    """``z^T C^{-1} z`` by Cholesky; ``inf`` when ``C`` is not positive definite."""
    for i in range(d):
        for j in range(d):
            work[i, j] = c[i, j]
    if not cholesky_inplace(work, d):
        return math.inf
    s = 0.0
    for i in range(d):
        v = z[i]
        for k in range(i):
            v -= work[i, k] * tmp[k]
        tmp[i] = v / work[i, i]
        s += tmp[i] * tmp[i]
    return s


@nb.njit(**INLINE_JIT)
def local_error(
    step: np.ndarray, rq: np.ndarray, q: int, d: int, jac: np.ndarray, zhat: np.ndarray, y_prev: np.ndarray,
    y_new: np.ndarray, scale: tuple[float, float, float], work: LocalErrorWork,
) -> tuple[float, float]:
    """Scaled local error estimate of one ODE-filter step and the local diffusion estimate.

    The local diffusion is the quasi-MLE ``σ̂² = ẑᵀ (H Q(h) Hᵀ)⁻¹ ẑ / d`` under an error-free previous
    step (Schober et al., 2019; Bosch, Hennig & Tronarp, 2021, eq. 21). The error estimate is the
    standard deviation of the defect, ``e = h σ̂ diag(H Q(h) Hᵀ)^{1/2}`` (Bosch et al., 2021, eq. 27;
    the factor ``h`` as in ProbNumDiffEq.jl), measured in the mixed norm of Hairer, Nørsett & Wanner
    (1993, §II.4): ``E = ‖e / (atol + rtol max(|y_prev|, |y_new|))‖_rms`` with ``scale = (h, rtol, atol)``.
    A step with ``E ≤ 1`` meets the tolerances. Returns ``(E, σ̂²)``; both are ``inf`` when ``H Q Hᵀ`` is
    singular.
    """
    hqh_root, hqh, chol, tmp = work
    local_defect_covariance(step, rq, q, d, jac, hqh_root, hqh)
    local_kappa = quadratic_form_inverse(hqh, zhat, d, chol, tmp) / d
    if not math.isfinite(local_kappa):
        return math.inf, math.inf
    # The norm of scaled_error, inline: through the vector of variances this step was 5 % slower (pn.solve, FHN).
    h, rtol, atol = scale
    acc = 0.0
    for k in range(d):
        e = h * math.sqrt(max(local_kappa * hqh[k, k], 0.0))
        sc = atol + rtol * max(abs(y_prev[k]), abs(y_new[k]))
        acc += (e / sc) ** 2
    return math.sqrt(acc / d), local_kappa


@nb.njit(**INLINE_JIT)
def scaled_error(
    local_kappa: float, variances: np.ndarray, y_prev: np.ndarray, y_new: np.ndarray, scale: tuple[float, float, float]
) -> float:
    """``‖h √(σ̂² v) / (atol + rtol max(|y_prev|, |y_new|))‖_rms`` for the unit-diffusion defect variances ``v`` of the
    states (the error norm of :func:`local_error`; ``scale = (h, rtol, atol)``)."""
    h, rtol, atol = scale
    d = variances.shape[0]
    acc = 0.0
    for k in range(d):
        e = h * math.sqrt(max(local_kappa * variances[k], 0.0))
        sc = atol + rtol * max(abs(y_prev[k]), abs(y_new[k]))
        acc += (e / sc) ** 2
    return math.sqrt(acc / d)


@nb.njit(**INLINE_JIT)
def quadrature_defect(grid: np.ndarray, mu: np.ndarray, q: int, d: int, rtol: float, atol: float) -> float:
    """Largest scaled disagreement of a run's means with their own derivative states.

    Over each step ``h`` the increment ``y_n − y_{n−1}`` of the filtered means should equal its quadrature from
    their derivatives ``y', y'', y'''`` at both ends: the two-point Hermite rule ``h/2 (y'_a + y'_b) + h²/10
    (y''_a − y''_b) + h³/120 (y'''_a + y'''_b)`` (exact for quintic ``y'``) for ``q ≥ 3``, Euler–Maclaurin
    ``h/2 (y'_a + y'_b) + h²/12 (y''_a − y''_b)`` for ``q = 2``, the trapezoidal rule for ``q = 1``: a truncation
    error of higher order than the filter's own. The filter's error estimate, the residual of each prediction,
    does not see a mean that moves against its derivatives (as a uniform-diffusion filter's can, far from the
    scale of its diffusion); this a-posteriori check does. Returns
    ``max_n ‖defect / (atol + rtol max(|y_{n−1}|, |y_n|))‖_rms``.
    """
    worst = 0.0
    for n in range(1, grid.shape[0]):
        h = grid[n] - grid[n - 1]
        acc = 0.0
        for k in range(d):
            a0, b0 = mu[n - 1, k], mu[n, k]
            quad = 0.5 * h * (mu[n - 1, d + k] + mu[n, d + k])
            if q >= 3:
                quad += h * h / 10.0 * (mu[n - 1, 2 * d + k] - mu[n, 2 * d + k])
                quad += h * h * h / 120.0 * (mu[n - 1, 3 * d + k] + mu[n, 3 * d + k])
            elif q == 2:
                quad += h * h / 12.0 * (mu[n - 1, 2 * d + k] - mu[n, 2 * d + k])
            sc = atol + rtol * max(abs(a0), abs(b0))
            acc += ((b0 - a0 - quad) / sc) ** 2
        worst = max(worst, math.sqrt(acc / d))
    return worst


@nb.njit(**INLINE_JIT)
def local_kappa_adjoint(
    kbar: float, step: np.ndarray, rq: np.ndarray, q: int, d: int, lin: np.ndarray, zhat: np.ndarray,
    work: LocalErrorWork, zbar: np.ndarray, jbar: np.ndarray,
) -> None:
    """Adjoint of the local diffusion ``κ = ẑᵀ C⁻¹ ẑ / d``, ``C = H Q(h) Hᵀ``, ``H = E1 − L E0``.

    With ``β = C⁻¹ ẑ``: ``ẑ̄ = 2 κ̄ β / d`` and, through ``C̄ = −κ̄ ββᵀ / d`` and ``H̄ = 2 C̄ H Q``,
    ``L̄ = (2 κ̄ / d) β βᵀ (Hᵀ… )`` restricted to the ``E0`` columns. Writes ``zbar`` (d) and ``jbar``
    (d, d).
    """
    hqh_root, hqh, chol, beta = work
    local_defect_covariance(step, rq, q, d, lin, hqh_root, hqh)
    # Cholesky factor L of C in chol and L⁻¹ ẑ in beta; then β = L⁻ᵀ (L⁻¹ ẑ) in place.
    if not math.isfinite(quadratic_form_inverse(hqh, zhat, d, chol, beta)):
        zbar[:] = 0.0
        jbar[:, :] = 0.0
        return
    for i in range(d - 1, -1, -1):
        v = beta[i]
        for k in range(i + 1, d):
            v -= chol[k, i] * beta[k]
        beta[i] = v / chol[i, i]
    scale = 2.0 * kbar / d
    for k in range(d):
        zbar[k] = scale * beta[k]
    # (Hᵀ-root)ᵀ M restricted to E0: u[l, a] = Σ_i B[(i, a), l] rq[i, 0] T_0, with B = M Hᵀ.
    for a in range(d):
        s = 0.0
        for l in range(d):
            u = 0.0
            for i in range(q + 1):
                u += hqh_root[i * d + a, l] * rq[i, 0]
            s += beta[l] * u * step[1, 0]
        for k in range(d):
            jbar[k, a] = scale * beta[k] * s
