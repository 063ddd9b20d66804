"""The forward pass of the square-root EK0/EK1 ODE filter, over fixed or error-controlled steps.

One loop serves ``pn.solve`` (:func:`run_filter`) and the Fenrir likelihood: predict (:mod:`.predict`),
linearise and update (:mod:`.update`), estimate the local error and diffusion (:mod:`.calibration`), choose
or check the step (:mod:`.stepping`). The vector field and its Jacobian arrive as addresses of C
callbacks (:mod:`pymc_pnode._callbacks`), so one compiled kernel serves every ODE. Layout: derivative-major
states of length ``D = (q+1) d``, right square roots ``Σ = R^T R`` (Bosch, 2024, PhD thesis).
"""

from __future__ import annotations

import math
from collections import namedtuple

import numba as nb
import numpy as np

from pymc_pnode._callbacks import call
from pymc_pnode._jit import INLINE_JIT, compile_on_first_use
from pymc_pnode.filtering.calibration import (
    FloorInputs,
    at_equilibrium,
    floored_kappa,
    local_error,
    local_error_work,
    rounding_kappa,
)
from pymc_pnode.filtering.linalg import all_finite
from pymc_pnode.filtering.prior import apply_transition, set_step
from pymc_pnode.filtering.stepping import (
    JUMP_KAPPA_RATIO,
    STATUS_DIVERGED,
    STATUS_JUMP_IN_T,
    STATUS_NONFINITE,
    STATUS_SUCCESS,
    STEPPING_T,
    Stepping,
    control_step,
    fixed_step_failed,
    grow_rows,
    jumps_in_t,
    propose_step,
)
from pymc_pnode.filtering.structure import block_local_error, block_rows, predict_roots, root_shape, update_roots
from pymc_pnode.filtering.update import (
    VECTOR_FIELD_T,
    VectorField,
    f_scale,
    f_scale_size,
    linearisation_work,
    linearise,
)

DIFFUSION_FIXED = 0
DIFFUSION_GLOBAL = 1
DIFFUSION_LOCAL = 2

# The diffusion a forward pass uses: ``kappa`` on every step, or (mode LOCAL) each step's own local
# quasi-MLE. Global calibration runs at ``kappa = 1`` and rescales afterwards (:func:`rescale_roots`).
Diffusion = namedtuple("Diffusion", ["mode", "kappa"])

# A forward pass on its grid (index n: the state at grid[n], or the step that ended there): ``stop[n]``
# is the index of the stop that grid[n] lands on (-1 between stops); filtered and predicted means and
# roots; the linearisation L ((d, d), or its diagonal (d, 1) with block roots) and residual ẑ; the prior's step
# arrays (:mod:`.prior`); the diffusion used and the local diffusion estimate (floored). Predictions,
# linearisations and coefficients have one row unless the pass keeps them (the adjoints need them; ``pn.solve``
# does not). ``root_stride`` 0: ``r`` (and ``r_pred``, if kept) has a row for every point; k ≥ 1: a thin run for a
# checkpointed sweep, ``r[j]`` is the root at grid point ``j k`` and no predicted root is kept
# (:func:`interval_roots` recomputes the others).
ForwardRun = namedtuple(
    "ForwardRun",
    ["grid", "stop", "mu", "r", "mu_pred", "r_pred", "lin", "zhat", "step", "kappa", "local_kappa", "root_stride"],
)
# Accepted and rejected steps, vector-field evaluations, status code (``stepping.STATUS_*``), the sum of
# ẑᵀ S⁻¹ ẑ (global calibration), the largest scaled local error of an accepted step (0 if not estimated) and the
# accepted steps exactly at an equilibrium of the field (:func:`~.calibration.at_equilibrium`).
ForwardStats = namedtuple("ForwardStats", ["n_steps", "n_rejected", "n_f_evals", "status", "stat_sum", "max_error",
                                           "n_at_equilibrium"])
# Work arrays of one filter step: the prediction stack, the update stack and a vector.
StepWork = namedtuple("StepWork", ["m_pred", "m_upd", "w"])


@nb.njit(**INLINE_JIT)
def step_work(size: int, rows: int) -> StepWork:
    """Work arrays of one prediction (its stack) and update (its stack and a vector) of one covariance block
    of state length ``size`` observing ``rows`` ODE-information rows (:func:`~.structure.block_rows`)."""
    return StepWork(np.empty((size + 1, 2 * size)), np.empty((rows + size + 1, size)), np.empty(rows))


@nb.njit(**INLINE_JIT)
def update_finite(stat: float, mu: np.ndarray, r: np.ndarray) -> bool:
    """Whether an update (its statistic ``ẑᵀ S⁻¹ ẑ``, mean and root) stayed finite."""
    return math.isfinite(stat) and all_finite(mu) and all_finite(r)


@nb.njit(**INLINE_JIT)
def allocate_run(cap: int, q: int, d: int, keep: bool, r0: np.ndarray, root_slots: int) -> ForwardRun:
    """An uninitialised :data:`ForwardRun` with room for ``cap`` grid points (one kept row unless ``keep``),
    its roots shaped like ``r0`` (the structure, :mod:`.structure`); ``root_slots > 0``: a thin run (see
    :func:`forward_pass`) with room for ``min(cap, root_slots)`` roots and one predicted root."""
    dd = (q + 1) * d
    kept = cap if keep else 1
    thin = root_slots > 0
    shape = root_shape(r0, q, d)
    return ForwardRun(
        np.empty(cap), np.empty(cap, dtype=np.int64), np.empty((cap, dd)),
        np.zeros((min(cap, root_slots) if thin else cap,) + shape),
        np.empty((kept, dd)), np.empty((1 if thin else kept,) + shape), np.zeros((kept, d, d if r0.ndim == 2 else 1)),
        np.empty((kept, d)),
        np.zeros((kept, 3, q + 1)), np.empty(cap), np.empty(cap), 1 if thin else 0,
    )


@nb.njit(inline="always", **INLINE_JIT)
def _grow_run(run: ForwardRun, cap: int, keep: bool, root_slots: int) -> ForwardRun:
    grid, stop = grow_rows(run.grid, cap), grow_rows(run.stop, cap)
    mu, r, r_pred = grow_rows(run.mu, cap), run.r, run.r_pred
    if root_slots == 0:
        r = grow_rows(run.r, cap)
        if keep:
            r_pred = grow_rows(run.r_pred, cap)
    elif r.shape[0] < root_slots:
        r = grow_rows(run.r, min(cap, root_slots))
    kappa, local_kappa = grow_rows(run.kappa, cap), grow_rows(run.local_kappa, cap)
    if not keep:
        return ForwardRun(grid, stop, mu, r, run.mu_pred, r_pred, run.lin, run.zhat, run.step, kappa,
                          local_kappa, run.root_stride)
    return ForwardRun(grid, stop, mu, r, grow_rows(run.mu_pred, cap), r_pred, grow_rows(run.lin, cap),
                      grow_rows(run.zhat, cap), grow_rows(run.step, cap), kappa, local_kappa, run.root_stride)


@nb.njit(**INLINE_JIT)
def _truncate_run(run: ForwardRun, n_pts: int, keep: bool, root_stride: int) -> ForwardRun:
    kept = n_pts if keep else 1
    n_roots, n_pred = n_pts, kept
    if root_stride > 0:
        n_roots, n_pred = (n_pts - 1) // root_stride + 1, 1
    return ForwardRun(run.grid[:n_pts], run.stop[:n_pts], run.mu[:n_pts], run.r[:n_roots], run.mu_pred[:kept],
                      run.r_pred[:n_pred], run.lin[:kept], run.zhat[:kept], run.step[:kept], run.kappa[:n_pts],
                      run.local_kappa[:n_pts], root_stride)


@nb.njit(inline="always", **INLINE_JIT)
def keep_thin_root(r: np.ndarray, root: np.ndarray, n: int, stride: int, root_slots: int) -> int:
    """Keep grid point ``n``'s ``root`` in the rows ``r`` of a thin run if ``n`` is a multiple of ``stride``; when
    the ``root_slots`` rows are full, every other row is dropped first and the stride doubles. Returns the stride."""
    if n % stride == 0:
        j = n // stride
        if j == root_slots:
            half = root_slots // 2
            for i in range(1, half):
                r[i] = r[2 * i]
            stride *= 2
            j = half
        r[j] = root
    return stride


@nb.njit(inline="always", **INLINE_JIT)
def step_roots(r: np.ndarray, r_pred: np.ndarray, ring: np.ndarray, thin: bool, n: int, s: int):
    """Views of the roots of the step from grid point ``n`` to ``n + 1``: the previous root, the new one and the
    predicted one. A thin run keeps its last two roots in ``ring`` and one predicted root; a full run has the rows
    ``n`` and ``n + 1`` of ``r`` and the row ``s`` of ``r_pred`` (``n + 1``, or 0 when predictions are not kept)."""
    if thin:
        return ring[n & 1], ring[(n + 1) & 1], r_pred[0]
    return r[n], r[n + 1], r_pred[s]


@nb.njit(inline="always", **INLINE_JIT)
def forward_pass(
    field: VectorField, mu0: np.ndarray, r0: np.ndarray, rq: np.ndarray, q: int, d: int, diffusion: Diffusion,
    control: Stepping, stops: np.ndarray, keep: bool, root_slots: int,
) -> tuple[ForwardRun, ForwardStats]:
    """Forward pass of the EK0/EK1 square-root filter from ``N(mu0, 0)`` at ``stops[0]``, with the state-space
    structure of the zero root ``r0`` (:mod:`.structure`).

    Fixed steps (``control.adaptive`` false) walk ``stops`` exactly. Adaptive steps hit every later entry
    of ``stops`` (output times and the end point) exactly, choosing the steps in between with the local
    error estimate and a PI controller (Bosch, Hennig & Tronarp, 2021). Fixed steps have no controller:
    they stop with ``STATUS_DIVERGED`` before the first step that :func:`~.stepping.fixed_step_failed`
    flags (one extra evaluation of ``f`` per step). Adaptive steps stop with ``STATUS_JUMP_IN_T`` before a
    step across a jump of ``f`` in ``t`` (:func:`~.stepping.jumps_in_t`). The local error is estimated on
    every step when the steps are adaptive, the diffusion is local or ``control.report_error`` asks for it.
    With ``keep`` the run keeps every step's predictions, linearisation and prior coefficients. ``root_slots > 0``
    (with ``keep``) makes a thin run for a checkpointed sweep: no predicted roots, and filtered roots only at every
    ``run.root_stride``-th point, in at most ``root_slots`` (even) rows; when they fill, every other one is dropped
    and the stride doubles (:func:`keep_thin_root`), so a run of ``N`` points keeps them at most ``2 N / root_slots``
    apart (more than ``root_slots / 2`` of them once any was dropped).

    Returns the run, cut to its accepted steps (the last state is where a failed solve stopped), and
    its :data:`ForwardStats`.
    """
    n_stops = stops.shape[0]
    adaptive = control.adaptive
    local = diffusion.mode == DIFFUSION_LOCAL
    estimate = adaptive or local or control.report_error
    rhs, theta = field.rhs, field.theta
    cap = n_stops if not adaptive else max(64, 2 * n_stops)
    thin = root_slots > 0
    run = allocate_run(cap, q, d, keep, r0, root_slots)
    # The run's arrays as locals: numba counts a reference at every read of a tuple member, so the loop
    # reads none.
    grid, stop, mu, r, mu_pred, r_pred, lin, zhat, steps, kappa_used, local_kappas, _ = run
    ring = np.zeros((2 if thin else 0,) + root_shape(r0, q, d))  # a thin run's last two roots
    stride = 1
    grid[0] = stops[0]
    stop[0] = 0
    mu[0] = mu0
    kappa_used[0] = 0.0
    local_kappas[0] = 0.0
    xi, f_post, jac = linearisation_work(d)
    scale = np.empty(f_scale_size(field, d) if local else 0)  # the EK0's T(f) for the rounding floor
    jump_work = (np.empty(d), np.empty(d))
    size, rows = block_rows(r0, q, d)
    m_pred, m_upd, w = step_work(size, rows)
    err_work = local_error_work(q, rows)
    tol = (control.rtol, control.atol)
    n = n_rej = 0
    n_f = 0
    stat_sum = 0.0
    max_err = 0.0
    n_at_equilibrium = 0
    status = STATUS_SUCCESS
    t = stops[0]
    next_stop = 1
    h = control.h0 if adaptive else math.inf
    h_coeffs = math.nan  # the step whose prior coefficients are in the (unkept) slot 0
    err_prev = 1e-4
    full = True
    while full:  # the stepping loop; it returns here only to grow the arrays (never reassigned inside it)
        full = False
        while next_stop < n_stops:
            h_try, hit_stop, status = propose_step(t, h, stops[next_stop], n,
                                                   control.max_steps if adaptive else n_stops)
            if status != STATUS_SUCCESS:
                break
            t_new = stops[next_stop] if hit_stop else t + h_try
            if n + 1 >= cap:
                full = True
                break
            p = n + 1  # the slot of the step's results
            s = p if keep else 0  # its slot among the kept arrays
            # one view per row and step (every view is a counted reference)
            step, mu_prev, mu_p = steps[s], mu[n], mu[p]
            mu_pred_p, lin_p, zhat_p = mu_pred[s], lin[s], zhat[s]
            r_prev, r_p, r_pred_p = step_roots(r, r_pred, ring, thin, n, s)
            if keep and n > 0 and h_try == grid[n] - grid[n - 1]:  # equal steps: skip the powers
                step[:2] = steps[n, :2]
            elif keep or h_try != h_coeffs:
                set_step(h_try, 1.0, q, step)
                h_coeffs = h_try
            apply_transition(step, q, d, mu_prev, mu_pred_p)
            linearise(field, t_new, mu_pred_p, d, xi, f_post, jac, lin_p, zhat_p)
            n_f += 1
            err = 0.0
            local_kappa = 1.0
            if estimate:
                if r0.ndim == 2:
                    err, local_kappa = local_error(step, rq, q, d, lin_p, zhat_p, mu_prev, mu_pred_p,
                                                   (h_try, tol[0], tol[1]), err_work)
                else:
                    err, local_kappa = block_local_error(step, rq, q, d, lin_p, zhat_p, mu_prev, mu_pred_p,
                                                         (h_try, tol[0], tol[1]), err_work)
            if adaptive:
                accepted, h, err_prev = control_step(err, h_try, h, err_prev, hit_stop, q)
                if not accepted:
                    n_rej += 1
                    continue
                # A controller can shrink its step until even a jump of f in t passes the tolerance; the filter's
                # derivatives then cannot follow, and the likelihood goes wrong. Stop there (a rare extra check).
                if n > 0 and floored_kappa(local_kappa) > JUMP_KAPPA_RATIO * local_kappas[n]:
                    jump, n_probe = jumps_in_t(rhs, theta, xi, zhat_p, t_new, grid[max(n - 2, 0):n + 1][::-1], d,
                                               jump_work)
                    n_f += n_probe
                    if jump:
                        status = STATUS_JUMP_IN_T
                        break
            local_kappa = floored_kappa(local_kappa)
            kappa = diffusion.kappa
            if local:  # at least the diffusion of a rounding-only residual (the error estimate keeps the estimate)
                f_scale(field, t_new, xi, scale)  # (ξ = E0 μ⁻ since linearise)
                kappa = max(local_kappa, rounding_kappa(FloorInputs(step, lin_p, zhat_p, mu_pred_p, scale), rq, q, d))
            step[2, 0] = math.sqrt(kappa)
            predict_roots(r_prev, step, rq, q, d, m_pred, r_pred_p)
            stat = update_roots(r_pred_p, mu_pred_p, lin_p, zhat_p, q, d, m_upd, w, mu_p, r_p)
            if not update_finite(stat, mu_p, r_p):
                status = STATUS_NONFINITE
                break
            if not adaptive:
                # No controller guards fixed steps: stop at the first step that no longer approximates the
                # solution (one more evaluation of f, at the updated solution).
                for k in range(d):
                    xi[k] = mu_p[k]
                call(rhs, xi, t_new, theta, f_post)
                n_f += 1
                if fixed_step_failed(h_try, mu_prev, mu_pred_p, mu_p, f_post, d):
                    status = STATUS_DIVERGED
                    break
            stat_sum += stat
            max_err = max(max_err, err)
            n_at_equilibrium += at_equilibrium(zhat_p, mu_pred_p, d)
            n = p
            t = t_new
            grid[n] = t_new
            kappa_used[n] = kappa
            local_kappas[n] = local_kappa
            stop[n] = -1
            if hit_stop:
                stop[n] = next_stop
                next_stop += 1
            if thin:
                stride = keep_thin_root(r, r_p, n, stride, root_slots)
        if full:
            cap = min(2 * cap, control.max_steps + 1) if adaptive else 2 * cap  # (no more rows than steps allowed)
            run = _grow_run(run, cap, keep, root_slots)
            grid, stop, mu, r, mu_pred, r_pred, lin, zhat, steps, kappa_used, local_kappas, _ = run
    return (_truncate_run(run, n + 1, keep, stride if thin else 0),
            ForwardStats(n, n_rej, n_f, status, stat_sum, max_err, n_at_equilibrium))


@nb.njit(inline="always", **INLINE_JIT)
def refilter(field: VectorField, run: ForwardRun, rq: np.ndarray, q: int, d: int, kappas: np.ndarray) -> tuple[
        ForwardRun, bool]:
    """The filter again over the grid of a kept ``run``, with diffusion ``kappas[n]`` on the step ending at grid[n].

    Returns the new run (same grid and coefficients, thin like ``run``) and whether it stayed finite.
    """
    grid = run.grid
    n_pts = grid.shape[0]
    steps = run.step.copy()
    stride = run.root_stride
    new = ForwardRun(grid, run.stop, np.empty_like(run.mu), np.zeros_like(run.r), np.empty_like(run.mu_pred),
                     np.empty_like(run.r_pred), np.zeros_like(run.lin), np.empty_like(run.zhat), steps, kappas,
                     run.local_kappa, stride)
    _, _, mu, r, mu_pred, r_pred, lin, zhat, _, _, _, _ = new
    mu[0] = run.mu[0]
    ring = np.zeros((2 if stride > 0 else 0,) + run.r.shape[1:])  # a thin run's last two roots
    xi, fx, jac = linearisation_work(d)
    m_pred, m_upd, w = step_work(*block_rows(run.r[0], q, d))
    for p in range(1, n_pts):
        r_prev, r_p, r_pred_p = step_roots(r, r_pred, ring, stride > 0, p - 1, p)
        step = steps[p]
        step[2, 0] = math.sqrt(kappas[p])
        apply_transition(step, q, d, mu[p - 1], mu_pred[p])
        linearise(field, grid[p], mu_pred[p], d, xi, fx, jac, lin[p], zhat[p])
        predict_roots(r_prev, step, rq, q, d, m_pred, r_pred_p)
        stat = update_roots(r_pred_p, mu_pred[p], lin[p], zhat[p], q, d, m_upd, w, mu[p], r_p)
        if not update_finite(stat, mu[p], r_p):
            return new, False
        if stride > 0:
            keep_thin_root(r, r_p, p, stride, r.shape[0])  # (its rows fit: the run's grid made them)
    return new, True


@nb.njit(**INLINE_JIT)
def rescale_roots(run: ForwardRun, kappa: float) -> None:
    """Global calibration: covariances of a filter with ``Σ₀ = 0`` scale with ``κ`` and its means do not, so a
    unit-diffusion run becomes the run at ``κ`` by scaling every root by ``√κ`` (in place; a thin run's
    recomputed roots then follow from its kept ones and the rescaled coefficients, to rounding)."""
    sqrt_kappa = math.sqrt(kappa)
    r, r_pred, steps, kappas = run.r, run.r_pred, run.step, run.kappa
    n_pts = run.grid.shape[0]
    for j in range(1, r.shape[0]):
        r[j] *= sqrt_kappa
    with_predictions = r_pred.shape[0] == n_pts  # (a run for the adjoints)
    with_steps = steps.shape[0] == n_pts
    for n in range(1, n_pts):
        kappas[n] = kappa
        if with_predictions:
            r_pred[n] *= sqrt_kappa
        if with_steps:
            steps[n, 2, 0] = sqrt_kappa


@nb.njit(**INLINE_JIT)
def interval_roots(run: ForwardRun, a: int, b: int, rq: np.ndarray, q: int, d: int) -> ForwardRun:
    """The grid points ``a, ..., b`` of a thin ``run`` (``a`` a multiple of its ``root_stride``) with every root and
    predicted root, recomputed from the root kept at ``a`` with the run's coefficients, predicted means and
    linearisations: the operations of the pass that made the run, on the same inputs (no vector field)."""
    e = b + 1
    roots = np.empty((e - a,) + run.r.shape[1:])
    roots_pred = np.zeros_like(roots)
    roots[0] = run.r[a // run.root_stride]
    steps, mu_pred, lin, zhat = run.step, run.mu_pred, run.lin, run.zhat
    m_pred, m_upd, w = step_work(*block_rows(run.r[0], q, d))
    mu_work = np.empty(run.mu.shape[1])
    for i in range(1, e - a):
        p = a + i
        predict_roots(roots[i - 1], steps[p], rq, q, d, m_pred, roots_pred[i])
        update_roots(roots_pred[i], mu_pred[p], lin[p], zhat[p], q, d, m_upd, w, mu_work, roots[i])
    return ForwardRun(run.grid[a:e], run.stop[a:e], run.mu[a:e], roots, mu_pred[a:e], roots_pred, lin[a:e],
                      zhat[a:e], steps[a:e], run.kappa[a:e], run.local_kappa[a:e], 0)


_DIFFUSION_T = nb.types.NamedTuple([nb.int64, nb.float64], Diffusion)


def _run_filter(field, mu0, r0, rq, diffusion, control, stops):
    """:func:`forward_pass` for ``pn.solve``: IWP order and states from ``rq`` and ``mu0``, the structure from
    the zero root ``r0``, nothing kept.

    Returns ``(run, stats)``.
    """
    q = rq.shape[0] - 1
    d = mu0.shape[0] // (q + 1)
    return forward_pass(field, mu0, r0, rq, q, d, diffusion, control, stops, False, 0)


# Explicit signatures: the vector field arrives as addresses of C callbacks (:mod:`pymc_pnode._callbacks`), so
# each kernel is compiled (and cached on disk) once for every ODE instead of once per ODE — at its first call,
# not at import. One kernel per rank of the root: dense, and block-diagonal or isotropic (:mod:`.structure`).
def _run_filter_signature(root_type):
    return (VECTOR_FIELD_T, nb.float64[::1], root_type, nb.float64[:, ::1], _DIFFUSION_T, STEPPING_T, nb.float64[::1])


run_filter = compile_on_first_use(_run_filter_signature(nb.float64[:, ::1]), **INLINE_JIT)(_run_filter)
run_block_filter = compile_on_first_use(_run_filter_signature(nb.float64[:, :, ::1]), **INLINE_JIT)(_run_filter)
