"""The ODE filter's mean and standard deviation at given times (and their covariance across times) as
differentiable PyTensor tensors.

:func:`probabilistic_solution` lets any PyMC likelihood use the numerical uncertainty of an ODE filter
(e.g. a lognormal or Gaussian observation variance inflated by the solver's variance). Values are those of
:func:`pymc_pnode.solve` at the same settings; gradients with respect to ``y0`` and ``theta`` are exact for
the grid each solve chose (forward-mode tangents, :func:`pymc_pnode.filtering.tangents.filter_tangents` and
:func:`~pymc_pnode.filtering.tangents.smoothing_tangents`), including the dependence of the calibrated
diffusion on the parameters.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass, field

import numba as nb
import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.tensor.linalg import block_diag

from pymc_pnode._jit import readonly, register_numba
from pymc_pnode.accuracy import (
    RESCALE,
    SolverDiagnostics,
    needs_rounding_check,
    reproducible,
    solve_to_tolerance,
    uninformed_derivatives,
)
from pymc_pnode.differential_equation import flag_failed_solve
from pymc_pnode.discontinuities import declared_restarts, restart_state, split_times
from pymc_pnode.filtering.odefilter import DIFFUSION_GLOBAL, DIFFUSION_LOCAL
from pymc_pnode.filtering.structure import STRUCTURES
from pymc_pnode.filtering.tangents import (
    StepTangents,
    TangentField,
    block_filter_tangents,
    filter_tangents,
    stored_run,
)
from pymc_pnode.likelihoods.fenrir import StepControl
from pymc_pnode.ode import ODE
from pymc_pnode.solve import (
    DIFFUSION_ARGUMENTS,
    ODEFilter,
    solve_diffusion_mode,
    solve_without_warnings,
    stop_reason,
    validate_filter,
    validate_ode,
)
from pymc_pnode.validation import validate_step, validate_times

__all__ = ["PNSolutionProblem", "probabilistic_solution", "solution_segments", "solution_tensors"]


Evaluation = namedtuple("Evaluation", ["mean", "std", "cov", "jac_mean", "jac_std", "jac_cov", "log_ok"])
Evaluation.__doc__ = """One evaluation of a :class:`PNSolutionProblem`: ``mean`` and ``std`` ``(T, d)``, the covariance
across times ``cov`` (``(T d, T d)``, time-major; ``(0, 0)`` unless asked for), their Jacobians with respect to
``(y0, theta)`` (trailing axis of length ``d + n_theta``) and ``log_ok`` (``[0]``, or ``[-inf]`` for a failed
solve)."""


@dataclass(frozen=True, eq=False)
class PNSolutionProblem:
    """One ODE filter solve per evaluation, reporting its marginals at ``times`` and their tangents.

    Attributes mirror the arguments of :func:`probabilistic_solution`; ``diffusion`` is ``"local"`` (calibrated at
    each step), ``"calibrated"`` (one global quasi-maximum-likelihood estimate per solve) or a fixed value.
    ``diagnostics`` counts the evaluations (failed solves, and Jacobians refused as rounding noise, which warn).
    """

    ode: ODE
    times: np.ndarray
    solver: ODEFilter
    step: float | None
    rtol: float
    atol: float
    max_steps: int
    diffusion: str | float
    smooth: bool = False
    joint_cov: bool = False
    t_start: float | None = None  # where the solve starts (default ``ode.t0``; a segment after a discontinuity)
    diagnostics: SolverDiagnostics | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.diagnostics is None:  # a fixed step is checked against the tolerances at every evaluation
            object.__setattr__(self, "diagnostics", SolverDiagnostics.for_filter("probabilistic_solution", self.step,
                                                                                 self.solver))

    @property
    def start(self) -> float:
        """The time of ``y0`` (``ode.t0`` unless the problem is a segment that restarts after a jump)."""
        return self.ode.t0 if self.t_start is None else self.t_start

    @property
    def n_directions(self) -> int:
        return self.ode.n_states + self.ode.n_theta

    @property
    def n_cov(self) -> int:
        """Side of the covariance across times (0 unless it is asked for)."""
        return self.times.size * self.ode.n_states if self.joint_cov else 0

    def evaluate(self, y0: np.ndarray, theta: np.ndarray) -> Evaluation:
        """Values and Jacobians of one solve.

        A failed solve gives ``log_ok = [-inf]``, the last marginals it reached (the initial state if
        none) in place of the missing ones, an identity covariance across times and zero Jacobians. So does a
        solve whose Jacobians are rounding noise (:mod:`pymc_pnode.accuracy`: where the filter's gain is huge,
        e.g. near an unstable invariant set); it is counted in :attr:`diagnostics` and warns once. Jacobians at a
        solution that sits exactly at an equilibrium of the field, with error control or the local diffusion, are
        returned but counted and warned about (``n_equilibrium_gradient``).
        """
        ode, q, d = self.ode, self.solver.order, self.ode.n_states
        # writable copies of the right sizes (the generated functions take writable arrays)
        y0 = np.array(y0, dtype=np.float64).reshape(d)
        theta = np.array(theta, dtype=np.float64).reshape(ode.n_theta)
        if not (np.all(np.isfinite(y0)) and np.all(np.isfinite(theta))):  # e.g. exp overflow of a sampler's proposal
            self.diagnostics.record(0, 0, 0.0, failed=True, failure="non-finite y0 or theta")
            return self._failed(None, np.zeros(d))

        def solve(rtol: float, atol: float):
            sol = solve_without_warnings(ode, y0, theta, (self.start, float(self.times[-1])), solver=self.solver,
                                         step=self.step, rtol=rtol, atol=atol, save_at=self.times,
                                         smooth=self.smooth, max_steps=self.max_steps, diffusion=self.diffusion)
            return sol, sol.success, max(sol.stats["max_error"], sol.stats["max_defect"])

        # a solution that fails the quadrature check, or whose atol does not resolve y0, is solved again tighter
        sol, accuracy, tried, cut_short = solve_to_tolerance(solve, y0, self.rtol, self.atol, self.step is None,
                                                             stop_reason)
        n_steps, n_rejected = (sum(attempt.stats[name] for attempt in tried) for name in ("n_steps", "n_rejected"))
        if not sol.success:
            self.diagnostics.record(n_steps, n_rejected, 0.0, failed=True, failure=stop_reason(sol))
            return self._failed(sol, y0)
        taylor_jac = ode.taylor_functions(q)[1]
        dy, dp = np.empty((q + 1, d, d)), np.empty((q + 1, d, ode.n_theta))
        taylor_jac(y0, self.start, theta, dy, dp)
        seeds = np.concatenate([dy, dp], axis=2).reshape((q + 1) * d, self.n_directions)
        jac_mean, jac_std, cov, jac_cov, rounding = self._jacobians(sol, theta, seeds)
        refused = False
        if needs_rounding_check(rounding):
            again = self._jacobians(sol, theta, seeds * RESCALE, RESCALE)
            refused = not reproducible((jac_mean, jac_std, jac_cov), (again[0], again[1], again[3]))
        local = solve_diffusion_mode(self.diffusion, self.step is None)[0] == DIFFUSION_LOCAL
        equilibrium = not refused and uninformed_derivatives(sol.stats["n_at_equilibrium"], self.step is None, local)
        self.diagnostics.record(n_steps, n_rejected, accuracy, failed=refused, unreliable_gradient=refused,
                                tightened=len(tried) > 1, equilibrium_gradient=equilibrium,
                                tightening_failure=cut_short)
        if refused:
            return self._failed(sol, y0)
        return Evaluation(sol.mean, sol.std, cov.reshape(self.n_cov, self.n_cov), jac_mean, jac_std,
                          jac_cov.reshape(self.n_cov, self.n_cov, self.n_directions), np.array([0.0]))

    def _jacobians(self, sol, theta: np.ndarray, seeds: np.ndarray, scale: float = 1.0):
        """Jacobians of the solve ``sol`` from the initial mean's tangents ``seeds`` ``(D, P)``: ``(jac_mean,
        jac_std, cov, jac_cov, rounding)`` (``cov`` the covariance across times, ``rounding`` the tangents'
        largest rounding bound). ``scale``: every direction times it (the seeds come scaled; the θ directions'
        own terms at each step are scaled by the kernel), for the rounding check."""
        ode, d = self.ode, self.ode.n_states
        n_out, n_dir = self.times.size, self.n_directions
        run = stored_run(sol.run.grid, sol.run.mu, sol.run.r, sol.run.kappa, sol.out_index)
        n_kept, dd = (run.grid.size if self.smooth else 1), run.mu.shape[1]
        steps = StepTangents(np.zeros((n_kept, dd, n_dir)), np.zeros((n_kept, n_dir) + run.r.shape[1:]),
                             np.zeros((n_kept, n_dir)))
        steps.dmu[0] = seeds
        ek1, dense = self.solver.ek1, run.r.ndim == 3
        tangents = filter_tangents if dense else block_filter_tangents
        if not ek1:
            hess_y = hess_p = 0  # the EK0 calls no second derivatives
        elif dense:
            hess_y, hess_p = ode.hess_yy.address, ode.hess_yp.address
        else:  # the block-diagonal EK1 needs the rows ∂²f_i/∂y_i∂(y, θ) only
            hess_y, hess_p = ode.hess_rows_y.address, ode.hess_rows_p.address
        mode = solve_diffusion_mode(self.diffusion, self.step is None)[0]
        term_scale = ode.term_scale_addresses(not ek1 and mode == DIFFUSION_LOCAL)
        field = TangentField(*ode.field_addresses, hess_y, hess_p, *term_scale, theta, ek1, scale)
        dmean, dvar, dstat, rounding = tangents(field, run, steps, readonly(self.solver.prior.Q_bar_sqrt),
                                                mode == DIFFUSION_LOCAL)
        cov, dcov = np.zeros((n_out, d, 0, d)), np.zeros((n_out, d, 0, d, n_dir))
        if self.smooth:
            dmean, dvar, cov, dcov = sol.smoothing_tangents(steps, self.joint_cov)
        var = sol.std**2
        if mode == DIFFUSION_GLOBAL:
            # σ² = Σ ẑᵀS⁻¹ẑ / (N d) scales every covariance: dΣ = (dΣ)|σ² + Σ dσ²/σ² (dstat is dσ²/σ² · N d).
            relative = dstat / (sol.stats["n_steps"] * d)
            dvar = dvar + var[:, :, None] * relative
            dcov = dcov + cov[..., None] * relative
        jac_std = np.zeros((n_out, d, n_dir))
        positive = sol.std > 0.0
        jac_std[positive] = dvar[positive] / (2.0 * sol.std[positive])[:, None]
        return dmean, jac_std, cov, dcov, rounding

    def _failed(self, sol, y0: np.ndarray) -> Evaluation:
        """The :class:`Evaluation` of a refused solve: the marginals it reached (``y0`` without a solve, ``sol``
        ``None``), zero Jacobians, ``log_ok = -inf``."""
        n_out, d, n_dir, n_cov = self.times.size, self.ode.n_states, self.n_directions, self.n_cov
        mean, std = np.zeros((n_out, d)), np.zeros((n_out, d))
        reached = 0 if sol is None else min(sol.mean.shape[0], n_out)
        mean[reached:] = y0
        if reached:
            mean[:reached], std[:reached] = sol.mean[:reached], sol.std[:reached]
            mean[reached:], std[reached:] = sol.mean[reached - 1], sol.std[reached - 1]
        return Evaluation(mean, std, np.eye(n_cov), np.zeros((n_out, d, n_dir)), np.zeros((n_out, d, n_dir)),
                          np.zeros((n_cov, n_cov, n_dir)), np.array([-np.inf]))


class PNSolutionOp(Op):
    """``(y0, theta) -> Evaluation`` of a :class:`PNSolutionProblem` (seven outputs).

    The gradient contracts the cotangents of ``mean``, ``std`` and ``cov`` with their Jacobians (forward-mode
    tangents computed with the values); the Jacobian outputs themselves are not differentiable.
    """

    __props__ = ("problem",)

    def __init__(self, problem: PNSolutionProblem):
        self.problem = problem

    def make_node(self, y0, theta):
        n_out, d, n_dir = self.problem.times.size, self.problem.ode.n_states, self.problem.n_directions
        n_cov = self.problem.n_cov
        shapes = [(n_out, d), (n_out, d), (n_cov, n_cov), (n_out, d, n_dir), (n_out, d, n_dir), (n_cov, n_cov, n_dir),
                  (1,)]
        outputs = [pt.tensor(dtype="float64", shape=shape) for shape in shapes]
        return Apply(self, [pt.as_tensor_variable(y0), pt.as_tensor_variable(theta)], outputs)

    def perform(self, node, inputs, output_storage):
        for storage, value in zip(output_storage, self.problem.evaluate(*inputs)):
            storage[0] = value

    def connection_pattern(self, node):
        return [[True, True, True, False, False, False, False]] * 2

    def L_op(self, inputs, outputs, output_grads):
        total = pt.zeros(self.problem.n_directions)
        for g, jac in zip(output_grads[:3], outputs[3:6]):
            if not isinstance(g.type, DisconnectedType):
                total = total + pt.tensordot(g, jac, axes=[[0, 1], [0, 1]])
        d = self.problem.ode.n_states
        return [total[:d], total[d:]]


def _pn_solution_run(op):
    problem = op.problem

    def run(y0, theta):
        return tuple(np.ascontiguousarray(x) for x in problem.evaluate(y0, theta))

    return run


# Under nutpie / mode="NUMBA" the solve runs in object mode.
register_numba(
    PNSolutionOp,
    _pn_solution_run,
    object_mode_outputs=nb.types.Tuple((nb.float64[:, ::1], nb.float64[:, ::1], nb.float64[:, ::1],
                                        nb.float64[:, :, ::1], nb.float64[:, :, ::1], nb.float64[:, :, ::1],
                                        nb.float64[::1])),
)


def probabilistic_solution(
    ode: ODE,
    y0,
    theta,
    times,
    *,
    solver: ODEFilter | None = None,
    step: float | None = None,
    rtol: float = 1e-6,
    atol: float = 1e-9,
    max_steps: int = 100_000,
    diffusion: float | None = None,
    smooth: bool = False,
    joint_cov: bool = False,
    discontinuities=None,
    jumps=None,
    name: str = "pn_solution",
) -> tuple[pt.TensorVariable, ...]:
    r"""The ODE filter's mean and standard deviation of ``y(t)`` at ``times`` (and their covariance across
    times), as tensors.

    The same numbers as ``pn.solve(ode, y0, theta, (ode.t0, times[-1]), save_at=times, smooth=smooth, ...)``
    (``.mean``, ``.std`` and ``.joint_cov()``): the marginals of an EK0/EK1 ODE filter (Tronarp et al., 2019)
    at the output times — filtering marginals by default, the smoothing posterior (Rauch–Tung–Striebel through
    the filter's backward kernels) with ``smooth=True`` — with the diffusion calibrated by quasi-maximum
    likelihood, per step or over the solve (Bosch, Hennig & Tronarp, 2021), unless fixed. Gradients with respect
    to ``y0`` and ``theta`` are exact for the grid the solve chose and include the calibrated diffusion's
    dependence on them (forward-mode tangents of the filter and, with ``smooth=True``, of the smoother).

    Use the standard deviation to account for the numerical error in any likelihood, e.g. with Gaussian
    noise ``y ~ N(mean, σ² + std²)``, or with lognormal noise ``log y ~ N(log mean, σ² + (std / mean)²)``
    (the delta method: the solver's error on the log scale has standard deviation ≈ ``std / mean``).
    The numerical errors at different times are correlated; ``joint_cov=True`` gives their covariance, for
    a Gaussian likelihood ``y.ravel() ~ N(mean.ravel(), σ² I + cov)``. For count data use
    :func:`~pymc_pnode.ChkrebtiiSolution`, whose sampled solutions feed any likelihood.

    Parameters
    ----------
    ode : ODE
    y0, theta : array_like or TensorVariable
        Initial state at ``ode.t0`` and parameters (random variables allowed).
    times : array_like
        Strictly increasing output times, ``times[0] >= ode.t0``, ``times[-1] > ode.t0``.
    solver : EK0 or EK1, default ``EK1(order=3)``
        Any structure (dense, ``"diagonal"``, ``"isotropic"``); the gradients of the dense EK1 evaluate the
        vector field's full Hessian (``d³`` numbers per step), those of the block-diagonal EK1 its rows
        ``∂²f_i/∂y_i∂(y, θ)`` (``d (d + n_θ)``), the EK0's none.
    step : float, optional
        A fixed step (the grid contains every output time); default: error-controlled steps.
    rtol, atol, max_steps
        As in :func:`pymc_pnode.solve`. A fixed ``step`` is checked against ``rtol``/``atol`` at every evaluation:
        where it misses them an :class:`~pymc_pnode.AccuracyWarning` says so once, with a suggested step (counts
        in the problem's ``diagnostics``).
    diffusion : {"local", "calibrated"}, float or None
        As in :func:`pymc_pnode.solve`: ``"local"`` calibrates each step's diffusion from its own residual
        (Schober et al., 2019; Bosch, Hennig & Tronarp, 2021, eq. 21), ``"calibrated"`` one global
        quasi-maximum-likelihood scalar per solve (Tronarp et al., 2019, Prop. 4), a number fixes it. Default
        (``None``): local with error-controlled steps, global with a fixed ``step``. The gradients include the
        calibrated diffusion's dependence on ``y0`` and ``theta`` in both modes. With error-controlled steps the
        global scalar can be over-confident on stiff oscillations (Van der Pol, μ = 5, rtol 1e-3: errors of up to
        125 standard deviations, the local diffusion's within 0.6; ``benchmarks/solve_calibration.py``).
    smooth : bool, default False
        Report the smoothing posterior (conditioned on the whole solve) instead of the filtering marginals
        (conditioned on the steps up to each time). The smoother's gradients store the filter's tangents at
        every step: ``(N + 1) (d + n_theta) D²`` numbers for ``N`` steps and ``D = d (q + 1)`` (dense), ``d (q + 1)²``
        in place of ``D²`` for the block-diagonal structure.
    joint_cov : bool, default False
        Also return the covariance of the solution across ``times`` (requires ``smooth=True``: the joint
        distribution is the smoothing posterior's).
    discontinuities : array_like, optional
        Times in ``(t0, times[-1])`` where the vector field jumps in ``t`` (a switched input, an infusion
        started or stopped): the solve ends just before each and restarts just after it from the mean solution
        there, with zero covariance (:mod:`pymc_pnode.discontinuities`; the same numbers as
        :func:`pymc_pnode.solve` with these ``discontinuities``). The segments' numerical errors are then
        independent: ``cov`` is block-diagonal over them, and the numerical variance at a restart is not
        carried over (it is of the order of the tolerance under error control). The gradients run through the
        restarts. Without it an error-controlled solve stops at an undeclared jump (the likelihood is ``-inf``
        with a warning that names the time).
    jumps : array_like or TensorVariable, shape (len(discontinuities), n_states), optional
        Jumps of the state at the ``discontinuities`` (a bolus dose; may be random): each segment after the first
        starts from the mean where the previous one ended plus its row, ``y(t_j⁺) = y(t_j⁻) + jumps[j]``, as in
        :func:`pymc_pnode.solve`; the gradients include ``jumps``. An output at a jump time is the state just
        before the jump.
    name : str
        Prefix of the potential that flags failed solves inside a model (``"<name>_failed"``: ``-inf``
        when the solve fails, 0 otherwise); outside a model a failed solve gives NaN.

    Returns
    -------
    mean, std : TensorVariable
        Shape ``(len(times), n_states)`` each.
    cov : TensorVariable
        Only with ``joint_cov=True``: shape ``(len(times) * n_states,) * 2``, ordered as ``mean.ravel()``
        (time-major): ``cov[a * d + i, b * d + j] = Cov(y_i(t_a), y_j(t_b))``.
    """
    ode = validate_ode(ode)
    solver = validate_filter(solver, STRUCTURES, user="pn.probabilistic_solution")
    times = validate_times(times, "times", start=ode.t0)
    if times[-1] <= ode.t0:
        raise ValueError(f"times must reach beyond the ODE's t0={ode.t0}")
    mode, kappa = solve_diffusion_mode(diffusion, step is None)  # ValueErrors that name diffusion
    for flag, value in (("smooth", smooth), ("joint_cov", joint_cov)):
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{flag} must be True or False, got {value!r}")
    if joint_cov and not smooth:
        raise ValueError("joint_cov=True needs smooth=True: the covariance across times is the smoothing posterior's")
    control = StepControl(step, rtol, atol, max_steps)  # validates them now, naming the argument
    if step is not None:
        validate_step(step, float(times[-1]) - ode.t0)
    disc, jumps = declared_restarts(discontinuities, jumps, ode.t0, float(times[-1]), ode.n_states)
    settings = dict(solver=solver, rtol=control.rtol, atol=control.atol, max_steps=int(control.max_steps),
                    diffusion=DIFFUSION_ARGUMENTS.get(mode, kappa),
                    smooth=bool(smooth), joint_cov=bool(joint_cov))
    segments = solution_segments(ode, times, disc, control.step, **settings)
    mean, std, cov, log_ok = solution_tensors(segments, ode.y0_tensor(y0), ode.theta_tensor(theta), jumps)
    outputs = flag_failed_solve(name, log_ok, mean, std, *([cov] if joint_cov else []))
    return tuple(outputs)


# One solve between restarts: its problem and the rows of its outputs that are output times of the whole solution.
SolutionSegment = namedtuple("SolutionSegment", ["problem", "keep"])


def solution_segments(ode: ODE, times: np.ndarray, discontinuities: np.ndarray, step: float | None,
                      **settings) -> list[SolutionSegment]:
    """The :class:`PNSolutionProblem` of each segment between the restarts at ``discontinuities`` (validated):
    each solves to its end (the next starts from the mean there) and reports its own output times. ``settings``:
    the other fields of :class:`PNSolutionProblem` (a shared ``diagnostics`` among them, or one per segment)."""
    segments = []
    for start, end, _, at in split_times(ode.t0, float(times[-1]), discontinuities, times):
        seg_times = np.union1d(at, [end])
        seg_step = None if step is None else min(step, end - start)
        problem = PNSolutionProblem(ode, seg_times, step=seg_step,
                                    t_start=None if discontinuities.size == 0 else start, **settings)
        segments.append(SolutionSegment(problem, np.searchsorted(seg_times, at)))
    return segments


def solution_tensors(segments: list[SolutionSegment], y_start, theta, jumps):
    """``(mean, std, cov, log_ok)`` of the segments' solves from ``y_start`` (tensors; ``cov`` None unless the
    problems ask for it), each segment restarting from the previous one's last mean plus its row of ``jumps``."""
    n_states, joint_cov = segments[0].problem.ode.n_states, segments[0].problem.joint_cov
    means, stds, covs, log_ok = [], [], [], None
    for s, (problem, keep) in enumerate(segments):
        seg_mean, seg_std, seg_cov, *_, seg_ok = PNSolutionOp(problem)(y_start, theta)
        log_ok = seg_ok if log_ok is None else log_ok + seg_ok
        y_start = restart_state(seg_mean[-1], jumps, s)
        if keep.size < problem.times.size:  # the segment's end is not an output time
            rows = (keep[:, None] * n_states + np.arange(n_states)).ravel()
            seg_mean, seg_std = seg_mean[keep], seg_std[keep]
            seg_cov = seg_cov[rows][:, rows] if joint_cov else seg_cov
        means.append(seg_mean)
        stds.append(seg_std)
        covs.append(seg_cov)
    if len(segments) == 1:
        return means[0], stds[0], covs[0] if joint_cov else None, log_ok
    # independent segments (each restarts with zero covariance): block-diagonal across them
    return pt.concatenate(means), pt.concatenate(stds), block_diag(*covs) if joint_cov else None, log_ok
