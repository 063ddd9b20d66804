"""Step-size selection and the failure tests of the ODE filters' stepping loop.

Adaptive steps: the local error estimate of :func:`~pymc_pnode.filtering.calibration.local_error`, a PI
controller (Gustafsson et al., 1988) and a landing rule that hits every output time without slivers.
Fixed steps: :func:`fixed_step_failed`, the filter's own divergence test. The DOPRI5 solver of
:mod:`pymc_pnode.classical.dopri` uses the same controller and landing rule.
"""

from __future__ import annotations

import math
from collections import namedtuple

import numba as nb
import numpy as np

from pymc_pnode._callbacks import call
from pymc_pnode._jit import INLINE_JIT

STATUS_SUCCESS = 0
STATUS_NONFINITE = 1
STATUS_STEP_TOO_SMALL = 2
STATUS_MAX_STEPS = 3
STATUS_DIVERGED = 4
STATUS_JUMP_IN_T = 5
STATUS_MESSAGES = {
    STATUS_SUCCESS: "success",
    STATUS_NONFINITE: "non-finite values in the filter state (the solve diverged)",
    STATUS_STEP_TOO_SMALL: "step size became too small (the problem may be stiff or singular)",
    STATUS_MAX_STEPS: "maximum number of steps reached",
    STATUS_DIVERGED: (
        "a fixed step's error indicators reached the size of the solution (relative error >= 1): "
        "the solve diverged; use a smaller step, EK1, or adaptive steps"
    ),
    STATUS_JUMP_IN_T: (
        "the filter's smooth prior cannot step across a jump of the vector field in t (a switched input, a dose?; "
        "declare its time in discontinuities=[...] of pn.solve, pn.Fenrir, pn.fenrir_loglik or "
        "pn.probabilistic_solution) just after the "
        "last step"
    ),
}
# A step whose local diffusion estimate is this many times that of the step before is checked for a jump of the
# vector field in t (:func:`jumps_in_t`). Measured (pn.solve, local diffusion): consecutive ratios reach 1e5.5
# on smooth problems (Van der Pol up to μ = 100, Lorenz, Robertson, Hodgkin-Huxley under a constant input, rtol
# 1e-4 and 1e-7) and 1e22-1e37 at switched inputs, where the controller has shrunk the step to ~1e-5 of the others
# (benchmarks/jump_detection.py).
JUMP_KAPPA_RATIO = 1e12

# How a forward pass steps: error-controlled (``adaptive``, first trial step ``h0``) or over a fixed grid,
# the tolerances of the local error estimate, the step budget, and whether fixed steps estimate (and
# report) their local error too.
Stepping = namedtuple("Stepping", ["adaptive", "h0", "rtol", "atol", "max_steps", "report_error"])
STEPPING_T = nb.types.NamedTuple([nb.boolean, nb.float64, nb.float64, nb.float64, nb.int64, nb.boolean], Stepping)



@nb.njit(**INLINE_JIT)
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


@nb.njit(**INLINE_JIT)
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


@nb.njit(**INLINE_JIT)
def rejected_step_factor(err: float, q: int) -> float:
    """Step shrink factor after a rejected step (Bosch et al., 2021, eq. 30; at most 5× shorter)."""
    if not math.isfinite(err):
        return 0.2
    return max(0.2, 0.9 * err ** (-1.0 / (q + 1.0)))


@nb.njit(**INLINE_JIT)
def accepted_step_factor(err: float, err_prev: float, q: int) -> tuple[float, float]:
    """PI step factor after an accepted step (Gustafsson et al., 1988; β = (0.7, 0.4)/(q+1)).

    Returns ``(factor, err)`` where ``err`` (floored at 1e-10) is the ``err_prev`` of the next step.
    """
    e_c = max(err, 1e-10)
    fac = 0.9 * e_c ** (-0.7 / (q + 1.0)) * err_prev ** (0.4 / (q + 1.0))
    return min(10.0, max(0.2, fac)), e_c


@nb.njit(**INLINE_JIT)
def initial_step_size(rhs: int, y0: np.ndarray, t0: float, p: np.ndarray, rtol: float, atol: float) -> float:
    """Step-size guess from the scale of ``y0`` and ``f(y0)`` (Hairer, Nørsett & Wanner, 1993, §II.4)."""
    d = y0.shape[0]
    f0 = np.empty(d)
    call(rhs, y0, t0, p, f0)
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


@nb.njit(**INLINE_JIT)
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


@nb.njit(**INLINE_JIT)
def jumps_in_t(rhs, theta: np.ndarray, y: np.ndarray, zhat: np.ndarray, t_new: float, t_before: np.ndarray,
               d: int, work: tuple[np.ndarray, np.ndarray]) -> tuple[bool, int]:
    """Whether the residual ``zhat = E1 μ⁻ − f(y, t_new)`` of a step comes from a jump of the vector field in ``t``.

    With ``y = E0 μ⁻`` held fixed, the field is evaluated at ``t_new`` and at the earlier grid times ``t_before``:
    if the residual against ``f(y, t_k)`` instead is at most half of it for some ``t_k``, the residual is due to an
    explicit change of ``f`` between two times a few (collapsed) steps apart, not to the solution's curvature.
    Called only for a step whose local diffusion jumped by :data:`JUMP_KAPPA_RATIO` over the previous one, so
    smooth fields with a fast explicit time dependence are not tested. Returns the verdict and the number of
    evaluations of ``f``.
    """
    f_new, f_old = work
    call(rhs, y, t_new, theta, f_new)
    z2 = 0.0
    for k in range(d):
        z2 += zhat[k] * zhat[k]
    n_f = 1
    for t_k in t_before:
        call(rhs, y, t_k, theta, f_old)
        n_f += 1
        r2 = 0.0
        for k in range(d):
            r = zhat[k] + f_new[k] - f_old[k]  # the residual E1 μ⁻ − f(y, t_k)
            r2 += r * r
        if r2 <= 0.25 * z2:
            return True, n_f
    return False, n_f


@nb.njit(**INLINE_JIT)
def grow_rows(arr: np.ndarray, cap: int) -> np.ndarray:
    """A copy of ``arr`` with room for ``cap`` rows (the first ``len(arr)`` rows copied)."""
    out = np.empty((cap,) + arr.shape[1:], dtype=arr.dtype)
    # as flat vectors (both C-contiguous, rows leading): numba compiles an n-d slice assignment into much more code
    out.reshape(-1)[: arr.size] = arr.reshape(-1)
    return out
