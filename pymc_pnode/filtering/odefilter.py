"""Square-root EK0/EK1 ODE filter: the forward pass over fixed or adaptive steps.

One compiled kernel serves every ODE: the vector field and its Jacobian arrive as numba first-class
functions (see ``pymc_pnode._codegen``). Layout: derivative-major states of length ``D = (q+1) d``,
right square roots ``Σ = R^T R`` (Bosch, 2024, PhD thesis).
"""

from __future__ import annotations

import math
from collections import namedtuple

import numba as nb
import numpy as np

from pymc_pnode._codegen import MAT_FN, VEC_FN
from pymc_pnode.filtering.linalg import (
    JIT,
    all_finite,
    cholesky_inplace,
    compile_on_first_use,
    copy_transposed,
    solve_lower,
    tria_cols_inplace,
)

DIFFUSION_FIXED = 0
DIFFUSION_GLOBAL = 1
DIFFUSION_LOCAL = 2

STATUS_SUCCESS = 0
STATUS_NONFINITE = 1
STATUS_STEP_TOO_SMALL = 2
STATUS_MAX_STEPS = 3
STATUS_DIVERGED = 4
STATUS_MESSAGES = {
    STATUS_SUCCESS: "success",
    STATUS_NONFINITE: "non-finite values in the filter state (the solve diverged)",
    STATUS_STEP_TOO_SMALL: "step size became too small (the problem may be stiff or singular)",
    STATUS_MAX_STEPS: "maximum number of steps reached",
    STATUS_DIVERGED: (
        "a fixed step's error indicators reached the size of the solution (relative error >= 1): "
        "the solve diverged; use a smaller step, EK1, or adaptive steps"
    ),
}


@nb.njit(**JIT)
def preconditioner(h: float, q: int, out: np.ndarray) -> None:
    """``T(h)_i = sqrt(h) h^(q-i) / (q-i)!`` for ``i = 0..q``."""
    sq = math.sqrt(h)
    for i in range(q + 1):
        k = q - i
        out[i] = sq * h**k / math.gamma(k + 1.0)


@nb.njit(**JIT)
def transition_coefficients(h: float, q: int, out: np.ndarray) -> None:
    """``out[k] = h^k / k!``: the IWP transition is ``A_ij = out[j - i]`` for ``j >= i``."""
    c = 1.0
    for k in range(q + 1):
        out[k] = c
        c *= h / (k + 1.0)


@nb.njit(**JIT)
def apply_transition(a: np.ndarray, q: int, d: int, mu: np.ndarray, out: np.ndarray) -> None:
    """``out = A(h) mu`` with the coefficients ``a`` of :func:`transition_coefficients`."""
    for i in range(q + 1):
        for k in range(d):
            s = 0.0
            for j in range(i, q + 1):
                s += a[j - i] * mu[j * d + k]
            out[i * d + k] = s


@nb.njit(**JIT)
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


@nb.njit(**JIT)
def fill_predict_stack(
    r: np.ndarray, a: np.ndarray, t: np.ndarray, scale: float, rq: np.ndarray, q: int, d: int, mt: np.ndarray
) -> None:
    """``mt[:D, :2D]`` = the stack ``[r A^T; scale (Q̄^{1/2} T(h)) ⊗ I_d]``, transposed.

    Row ``c`` of ``mt`` is column ``c`` of the stack (the layout of :func:`tria_cols_inplace`); the
    stack is a square root of ``A Σ A^T + scale² Q(h)`` for ``Σ = r^T r``.
    """
    dd = (q + 1) * d
    fill_root_transition_t(r, a, q, d, mt)
    for i in range(q + 1):
        for k in range(d):
            col = mt[i * d + k]
            for row in range(dd, 2 * dd):
                col[row] = 0.0
            for j in range(q + 1):
                col[dd + j * d + k] = scale * rq[j, i] * t[i]


@nb.njit(**JIT)
def predict_root(
    r: np.ndarray, a: np.ndarray, t: np.ndarray, scale: float, rq: np.ndarray, q: int, d: int,
    mt: np.ndarray, r_out: np.ndarray,
) -> None:
    """``r_out`` = upper-triangular root of ``A Σ A^T + scale² Q(h)`` for ``Σ = r^T r``.

    One QR of the stack of :func:`fill_predict_stack` (``mt`` is ``(D + 1, 2D)`` work space; its
    last row is the QR's work vector).
    """
    dd = (q + 1) * d
    fill_predict_stack(r, a, t, scale, rq, q, d, mt)
    tria_cols_inplace(mt, 2 * dd, dd, mt[dd])
    copy_transposed(mt, dd, r_out, 0)


@nb.njit(**JIT)
def local_defect_covariance(
    rq: np.ndarray, t: np.ndarray, jac: np.ndarray, q: int, d: int, bq: np.ndarray, c: np.ndarray
) -> None:
    """``c = H Q(h) H^T`` at unit diffusion, ``H = E1 - J E0`` (error-free previous step)."""
    dd = (q + 1) * d
    for i in range(q + 1):
        for a in range(d):
            row = i * d + a
            for k in range(d):
                v = rq[i, 1] * t[1] if a == k else 0.0
                bq[row, k] = v - rq[i, 0] * t[0] * jac[k, a]
    for k in range(d):
        for l in range(d):
            s = 0.0
            for row in range(dd):
                s += bq[row, k] * bq[row, l]
            c[k, l] = s


@nb.njit(**JIT)
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


LocalErrorWork = namedtuple("LocalErrorWork", ["hqh_root", "hqh", "chol", "tmp"])


@nb.njit(**JIT)
def local_error_work(q: int, d: int) -> LocalErrorWork:
    """Work arrays of :func:`local_error` for IWP order ``q`` and ``d`` states."""
    return LocalErrorWork(np.empty(((q + 1) * d, d)), np.empty((d, d)), np.empty((d, d)), np.empty(d))


@nb.njit(**JIT)
def local_error(
    rq: np.ndarray, tvec: np.ndarray, jac: np.ndarray, zhat: np.ndarray, h: float, y_prev: np.ndarray,
    y_new: np.ndarray, rtol: float, atol: float, q: int, d: int, work: LocalErrorWork,
) -> tuple[float, float]:
    """Scaled local error estimate of one ODE-filter step and the local diffusion estimate.

    The local diffusion is the quasi-MLE ``σ̂² = ẑᵀ (H Q(h) Hᵀ)⁻¹ ẑ / d`` under an error-free previous
    step (Schober et al., 2019; Bosch, Hennig & Tronarp, 2021, eq. 21). The error estimate is the
    standard deviation of the defect, ``e = h σ̂ diag(H Q(h) Hᵀ)^{1/2}`` (Bosch et al., 2021, eq. 27;
    the factor ``h`` as in ProbNumDiffEq.jl), measured in the mixed norm of Hairer, Nørsett & Wanner
    (1993, §II.4): ``E = ‖e / (atol + rtol max(|y_prev|, |y_new|))‖_rms``. A step with ``E ≤ 1`` meets
    the tolerances. Returns ``(E, σ̂²)``; both are ``inf`` when ``H Q Hᵀ`` is singular.
    """
    local_defect_covariance(rq, tvec, jac, q, d, work.hqh_root, work.hqh)
    local_kappa = quadratic_form_inverse(work.hqh, zhat, d, work.chol, work.tmp) / d
    if not math.isfinite(local_kappa):
        return math.inf, math.inf
    acc = 0.0
    for k in range(d):
        e = h * math.sqrt(max(local_kappa * work.hqh[k, k], 0.0))
        sc = atol + rtol * max(abs(y_prev[k]), abs(y_new[k]))
        acc += (e / sc) ** 2
    return math.sqrt(acc / d), local_kappa


@nb.njit(**JIT)
def propose_step(t: float, h: float, target: float, n_steps: int, max_steps: int) -> tuple[float, bool, int]:
    """The next trial step from ``t`` with proposal ``h``, shortened to land exactly on ``target``.

    When ``h`` would stop short of ``target`` by less than ``h``, the remaining distance is split into
    two equal steps: a sliver of a step before a stop (1e-8, say) makes the filter's covariances
    ill-conditioned and its likelihood wrong.

    Returns ``(h_try, hit_stop, status)``; ``status`` is ``STATUS_MAX_STEPS`` after ``max_steps``
    accepted steps and ``STATUS_STEP_TOO_SMALL`` when the step has collapsed to rounding level.
    A fixed grid is walked with ``h = inf`` (every step lands on the next grid point).
    """
    remaining = target - t
    hit_stop = h >= remaining - 1e-12 * max(1.0, abs(target))
    h_try = remaining if hit_stop else min(h, 0.5 * remaining)
    if n_steps >= max_steps:
        return h_try, hit_stop, STATUS_MAX_STEPS
    if not (h_try > 1e-14 * max(1.0, abs(t))):
        return h_try, hit_stop, STATUS_STEP_TOO_SMALL
    return h_try, hit_stop, STATUS_SUCCESS


@nb.njit(**JIT)
def control_step(
    err: float, h_try: float, h: float, err_prev: float, hit_stop: bool, q: int
) -> tuple[bool, float, float]:
    """Accept a trial step of length ``h_try`` (proposal ``h``) with scaled error ``err`` or reject it.

    Returns ``(accepted, next proposal, err_prev)``. A step shortened to land on an output time does
    not shrink the next proposal.
    """
    if not (err <= 1.0):
        return False, h_try * rejected_step_factor(err, q), err_prev
    fac, err_prev = accepted_step_factor(err, err_prev, q)
    h_next = h_try * fac
    return True, (max(h_next, h) if hit_stop else h_next), err_prev


@nb.njit(**JIT)
def rejected_step_factor(err: float, q: int) -> float:
    """Step shrink factor after a rejected step (Bosch et al., 2021, eq. 30; at most 5× shorter)."""
    if not math.isfinite(err):
        return 0.2
    return max(0.2, 0.9 * err ** (-1.0 / (q + 1.0)))


@nb.njit(**JIT)
def accepted_step_factor(err: float, err_prev: float, q: int) -> tuple[float, float]:
    """PI step factor after an accepted step (Gustafsson et al., 1988; β = (0.7, 0.4)/(q+1)).

    Returns ``(factor, err)`` where ``err`` (floored at 1e-10) is the ``err_prev`` of the next step.
    """
    e_c = max(err, 1e-10)
    fac = 0.9 * e_c ** (-0.7 / (q + 1.0)) * err_prev ** (0.4 / (q + 1.0))
    return min(10.0, max(0.2, fac)), e_c


@nb.njit(**JIT)
def initial_step_size(rhs: VEC_FN, y0: np.ndarray, t0: float, p: np.ndarray, rtol: float, atol: float) -> float:
    """Step-size guess from the scale of ``y0`` and ``f(y0)`` (Hairer, Nørsett & Wanner, 1993, §II.4)."""
    d = y0.shape[0]
    f0 = np.empty(d)
    rhs(y0, t0, p, f0)
    d0 = 0.0
    d1 = 0.0
    for k in range(d):
        sc = atol + rtol * abs(y0[k])
        d0 += (y0[k] / sc) ** 2
        d1 += (f0[k] / sc) ** 2
    d0 = math.sqrt(d0 / d)
    d1 = math.sqrt(d1 / d)
    if d0 < 1e-5 or d1 < 1e-5 or not math.isfinite(d1):
        return 1e-6
    return 0.01 * d0 / d1


@nb.njit(**JIT)
def fixed_step_failed(
    h: float, mu_prev: np.ndarray, mu_pred: np.ndarray, mu_post: np.ndarray, f_post: np.ndarray, d: int
) -> bool:
    """Whether a step's own error indicators are as large as the solution: the failure test of fixed steps.

    Fixed-step solves have no error controller, so a solve across a singularity or beyond the
    stability region returns large but finite numbers unless each step is checked. Two indicators of
    the error of the step from ``t_{n-1}`` to ``t_n = t_{n-1} + h`` are computed from quantities
    the filter already has:

    * the correction ``c = ‖E0 (μ_n - μ⁻_n)‖₂`` that the ODE information makes to the extrapolated
      solution (the predictor–corrector difference of Milne's device; Lambert, 1991, ch. 4): a
      linear instability (EK0 beyond its stability region, EK1 transients on stiff steps) makes the
      prediction and the update disagree;
    * the residual of the computed solution integrated over the step,
      ``r = h ‖E1 μ_n - f(E0 μ_n, t_n)‖₂`` (defect control, Enright, 1989; the residual of the ODE
      filter's posterior mean, Krämer & Hennig, 2021): after a blow-up of a nonlinear field the
      posterior derivative no longer matches the vector field at the posterior solution, even
      when the linearised update looks consistent.

    The step fails when ``max(c, r) > max(‖y_{n-1}‖₂, ‖y_n‖₂)``, i.e. when either indicator says
    that the step's relative error is at least one (the scaled error of Hairer, Nørsett & Wanner,
    1993, §II.4, with ``Atol = 0``, ``Rtol = 1``, in the Euclidean norm), or when any of them is not
    finite. The norm over all states keeps a component that passes through zero from triggering
    the test; a zero error on a zero solution is not a failure. Both indicators vanish as
    ``h → 0``, and for an affine vector field the EK1 residual is zero, so on a problem the step
    resolves the test does not fire: it flags numbers that no longer approximate the solution,
    not mere inaccuracy (a bounded but inaccurate solution passes; only error control detects that).

    Parameters
    ----------
    h : float
        Step size ``t_n - t_{n-1}``.
    mu_prev, mu_pred, mu_post : ndarray, shape ((q+1) d,)
        Filter mean at ``t_{n-1}``, predicted mean at ``t_n`` and updated mean at ``t_n``
        (derivative-major: ``y`` in the first ``d`` entries, ``y'`` in the next ``d``).
    f_post : ndarray, shape (d,)
        The vector field at the updated solution, ``f(E0 μ_n, t_n)`` (one extra evaluation).
    d : int
        Number of states.

    Returns
    -------
    bool
        ``True`` when the step failed and the solve must stop before ``t_n``.
    """
    c2 = 0.0
    r2 = 0.0
    a2 = 0.0
    b2 = 0.0
    for k in range(d):
        dc = mu_post[k] - mu_pred[k]
        dr = h * (mu_post[d + k] - f_post[k])
        c2 += dc * dc
        r2 += dr * dr
        a2 += mu_prev[k] * mu_prev[k]
        b2 += mu_post[k] * mu_post[k]
    if not (math.isfinite(c2) and math.isfinite(r2)):
        return True
    return max(c2, r2) > max(a2, b2)


@nb.njit(**JIT)
def update_sqrt(
    r_pred: np.ndarray,
    mu_pred: np.ndarray,
    jac: np.ndarray,
    zhat: np.ndarray,
    q: int,
    d: int,
    m: np.ndarray,
    w: np.ndarray,
    mu_out: np.ndarray,
    r_out: np.ndarray,
) -> float:
    """Condition on the zero defect ``E1 x - f(E0 x) = 0`` linearised with ``H = E1 - J E0``.

    One QR of ``[R⁻ H^T | R⁻]`` yields ``S^{1/2}`` (R11), the gain ``K = R12^T R11^{-T}`` and the
    posterior square root (R22). ``m`` is ``(d + D + 1, D)`` work space (the stack, transposed, and
    the QR's work vector).
    Returns ``ẑ^T S^{-1} ẑ`` (the calibration statistic).
    """
    dd = (q + 1) * d
    # m holds the transposed stack: m[k] = column k of [R⁻ Hᵀ | R⁻]
    for k in range(d):
        for row in range(dd):
            s = r_pred[row, d + k]
            for l in range(d):
                s -= r_pred[row, l] * jac[k, l]
            m[k, row] = s
    for col in range(dd):
        for row in range(dd):
            m[d + col, row] = r_pred[row, col]
    tria_cols_inplace(m, dd, d + dd, m[d + dd])
    solve_lower(m, d, zhat, w)
    stat = 0.0
    for k in range(d):
        stat += w[k] * w[k]
    for col in range(dd):
        s = 0.0
        for k in range(d):
            s += m[d + col, k] * w[k]
        mu_out[col] = mu_pred[col] - s
    for row in range(dd):
        for col in range(dd):
            r_out[row, col] = m[d + col, d + row] if row < dd - d else 0.0
    return stat


@nb.njit(**JIT)
def grow_rows(arr: np.ndarray, cap: int) -> np.ndarray:
    """A copy of ``arr`` with room for ``cap`` rows (the first ``len(arr)`` rows copied)."""
    out = np.empty((cap,) + arr.shape[1:], dtype=arr.dtype)
    out[: arr.shape[0]] = arr
    return out


# Explicit signature: the vector field arrives as a first-class function type, so this kernel is
# compiled (and cached on disk) once for every ODE instead of once per ODE — at its first call, not at import.
_RUN_FILTER_SIG = (
    VEC_FN, MAT_FN, nb.float64[::1], nb.float64[::1], nb.int64, nb.int64, nb.float64[:, ::1],
    nb.boolean, nb.int64, nb.float64, nb.boolean, nb.float64[::1], nb.float64, nb.float64,
    nb.float64, nb.int64,
)


@compile_on_first_use(_RUN_FILTER_SIG, **JIT)
def run_filter(
    rhs: VEC_FN,
    jac_y: MAT_FN,
    p: np.ndarray,
    mu0: np.ndarray,
    q: int,
    d: int,
    rq: np.ndarray,
    ek1: bool,
    diffusion_mode: int,
    kappa: float,
    adaptive: bool,
    grid: np.ndarray,
    h0: float,
    rtol: float,
    atol: float,
    max_steps: int,
):
    """Forward pass of the EK0/EK1 square-root filter.

    Fixed steps walk ``grid`` exactly. Adaptive steps start at ``grid[0]`` and hit every later
    entry of ``grid`` (output times and the end point) exactly, choosing steps with the local
    error estimate and a PI controller (Bosch, Hennig & Tronarp, 2021). Fixed steps have no controller: they
    stop with ``STATUS_DIVERGED`` before the first step that :func:`fixed_step_failed` flags (one
    extra evaluation of ``f`` per step, counted in ``n_f_evals``).

    Returns ``(ts, mus, rs, kappas, n_accepted, n_rejected, n_f_evals, status, stat_sum)`` where
    ``kappas[n]`` is the diffusion used on the step that ended at ``ts[n]`` and ``stat_sum`` the sum of
    ``ẑ^T S^{-1} ẑ`` (for global calibration).
    """
    dd = (q + 1) * d
    cap = grid.shape[0] if not adaptive else 256
    ts = np.empty(cap)
    mus = np.empty((cap, dd))
    rs = np.zeros((cap, dd, dd))
    kaps = np.empty(cap)
    ts[0] = grid[0]
    mus[0] = mu0
    kaps[0] = 0.0

    a = np.empty(q + 1)
    tvec = np.empty(q + 1)
    mu_pred = np.empty(dd)
    r_pred = np.empty((dd, dd))
    m_pred = np.empty((dd + 1, 2 * dd))
    m_upd = np.empty((d + dd + 1, dd))
    fx = np.empty(d)
    jac = np.zeros((d, d))
    zhat = np.empty(d)
    w = np.empty(d)
    err_work = local_error_work(q, d)
    err = 0.0
    y_prev = np.empty(d)
    xi = np.empty(d)
    f_post = np.empty(d)

    n = 0
    n_rej = 0
    n_f = 0
    status = STATUS_SUCCESS
    stat_sum = 0.0
    t = grid[0]
    next_stop = 1
    n_stops = grid.shape[0]
    h = h0
    err_prev = 1e-4

    while next_stop < n_stops:
        target = grid[next_stop]
        h_try, hit_stop, status = propose_step(t, h if adaptive else math.inf, target, n,
                                               max_steps if adaptive else n_stops)
        if status != STATUS_SUCCESS:
            break
        t_new = target if hit_stop else t + h_try

        transition_coefficients(h_try, q, a)
        preconditioner(h_try, q, tvec)
        apply_transition(a, q, d, mus[n], mu_pred)
        for k in range(d):
            xi[k] = mu_pred[k]
            y_prev[k] = mus[n, k]
        rhs(xi, t_new, p, fx)
        n_f += 1
        if ek1:
            jac_y(xi, t_new, p, jac)
        for k in range(d):
            zhat[k] = mu_pred[d + k] - fx[k]

        local_kappa = 1.0
        if adaptive or diffusion_mode == DIFFUSION_LOCAL:
            err, local_kappa = local_error(rq, tvec, jac, zhat, h_try, y_prev, xi, rtol, atol, q, d, err_work)
        if adaptive:
            accepted, h, err_prev = control_step(err, h_try, h, err_prev, hit_stop, q)
            if not accepted:
                n_rej += 1
                continue

        if diffusion_mode == DIFFUSION_FIXED:
            kap = kappa
        elif diffusion_mode == DIFFUSION_LOCAL:
            kap = local_kappa if math.isfinite(local_kappa) and local_kappa > 0.0 else 1e-300
        else:
            kap = 1.0

        predict_root(rs[n], a, tvec, math.sqrt(kap), rq, q, d, m_pred, r_pred)

        if n + 1 >= cap:
            cap *= 2
            ts, mus, rs, kaps = grow_rows(ts, cap), grow_rows(mus, cap), grow_rows(rs, cap), grow_rows(kaps, cap)
        stat = update_sqrt(r_pred, mu_pred, jac, zhat, q, d, m_upd, w, mus[n + 1], rs[n + 1])
        if not (math.isfinite(stat) and all_finite(mus[n + 1]) and all_finite(rs[n + 1])):
            status = STATUS_NONFINITE
            break
        if not adaptive:
            # No controller guards fixed steps: stop at the first step that no longer approximates
            # the solution (one more evaluation of f, at the updated solution).
            for k in range(d):
                xi[k] = mus[n + 1, k]
            rhs(xi, t_new, p, f_post)
            n_f += 1
            if fixed_step_failed(h_try, mus[n], mu_pred, mus[n + 1], f_post, d):
                status = STATUS_DIVERGED
                break
        stat_sum += stat
        n += 1
        ts[n] = t_new
        kaps[n] = kap
        t = t_new
        if hit_stop:
            next_stop += 1
    return ts[: n + 1], mus[: n + 1], rs[: n + 1], kaps[: n + 1], n, n_rej, n_f, status, stat_sum
