"""Fenrir: the PN-approximated marginal likelihood as a PyTensor Op and a PyMC likelihood block."""

from __future__ import annotations

import dataclasses
import math
import warnings
import weakref
from collections import namedtuple
from dataclasses import dataclass
from functools import cached_property

import numba as nb
import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pytensor.gradient import grad_not_implemented
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.graph.rewriting.basic import node_rewriter
from pytensor.graph.traversal import ancestors
from pytensor.tensor.rewriting.basic import register_specialize

from pymc_pnode._jit import register_numba
from pymc_pnode.accuracy import (
    GLOBAL_CALIBRATION_GAP,
    RESCALE,
    AccuracyWarning,
    SolverDiagnostics,
    needs_rounding_check,
    reproducible,
    solve_to_tolerance,
    uninformed_derivatives,
)
from pymc_pnode.discontinuities import declared_restarts, restart_state, split_times
from pymc_pnode.filtering.fenrir import STATUS_CHECKPOINTS, FenrirArguments, FenrirFunctions, fenrir_kernel
from pymc_pnode.filtering.odefilter import DIFFUSION_FIXED, DIFFUSION_GLOBAL, DIFFUSION_LOCAL
from pymc_pnode.filtering.stepping import STATUS_MESSAGES, STATUS_SUCCESS, Stepping
from pymc_pnode.filtering.structure import DENSE, STRUCTURES, initial_root
from pymc_pnode.ode import ODE
from pymc_pnode.solve import (
    DIFFUSION_ARGUMENTS,
    ODEFilter,
    fixed_grid,
    solve,
    stop_reason,
    validate_filter,
    validate_ode,
)
from pymc_pnode.validation import (
    as_float_array,
    as_positive_float,
    as_positive_int,
    validate_discontinuities,
    validate_obs_matrix,
    validate_state_selection,
    validate_step,
    validate_times,
)

__all__ = ["Fenrir", "FenrirProblem", "StepControl", "fenrir_diagnostics", "fenrir_loglik"]


DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-6
DEFAULT_MAX_STEPS = 20_000
# Bytes a dense model's evaluation may store (its forward run, and a gradient's data phase) before it keeps roots only
# at checkpoints and recomputes the rest in intervals (``memory_budget`` of pn.Fenrir and pn.fenrir_loglik).
DEFAULT_MEMORY_BUDGET = 2.0**30
# Closest allowed stops (t0, observation times and discontinuities), relative to the time span: a step ~1e-8 of
# the span after one ~1e-2 makes the filter's covariances ill-conditioned (likelihoods off by hundreds of nats).
MIN_RELATIVE_GAP = 1e-6


@dataclass(frozen=True, eq=False)
class Segment:
    """A stretch of the time span without a declared discontinuity: the kernel's stops (error control) or fixed
    grid, and the data row observed at each entry (-1 for none)."""

    grid: np.ndarray
    obs_at: np.ndarray


def build_segments(
    t0: float, times: np.ndarray, discontinuities: np.ndarray, step: float | None
) -> tuple[Segment, ...]:
    """The segments of ``[t0, times[-1]]`` between the ``discontinuities`` (:mod:`pymc_pnode.discontinuities`).

    Each segment's stops are its start, its observation times (one at a jump observed at the segment's end) and its
    end; a fixed ``step`` fills them with :func:`~pymc_pnode.solve.fixed_grid`.
    """
    segments = []
    for start, end, rows, at in split_times(t0, float(times[-1]), discontinuities, times):
        stops = np.union1d([start, end], at)
        if step is None:
            grid = stops
        else:
            if stops.size == 1:  # a single observation at t0: one step past it keeps the kernel's shape
                stops = np.array([t0, t0 + step])
            grid = fixed_grid(stops, step)
        obs_at = np.full(grid.size, -1, dtype=np.int64)
        obs_at[np.searchsorted(grid, at)] = rows
        segments.append(Segment(np.ascontiguousarray(grid), obs_at))
    return tuple(segments)


@dataclass(frozen=True)
class StepControl:
    """How a Fenrir likelihood chooses its solver grid.

    ``step=None``: every evaluation chooses its grid with the filter's local error estimate and a PI
    controller at ``rtol``/``atol`` (at most ``max_steps`` steps), landing on every observation time.
    A fixed ``step``: a fixed grid refined to contain the observation times, whose local errors are
    checked against ``rtol``/``atol`` at every evaluation (:class:`~pymc_pnode.AccuracyWarning`).
    """

    step: float | None = None
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL
    max_steps: int = DEFAULT_MAX_STEPS

    def __post_init__(self):
        if self.step is not None:
            as_positive_float(self.step, "step (or None for error control)")
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float, np.floating)) and 0 < value < 1):
                raise ValueError(f"{name} must be a number in (0, 1), got {value!r}")
        as_positive_int(self.max_steps, "max_steps")

    @property
    def adaptive(self) -> bool:
        return self.step is None


# One kernel call over a segment: its terms (zero outside the segment's observations), gradient, success, the kernel's
# info array, solver grid and solution mean at the end, the failure message and whether the gradient was rounding noise.
SegmentResult = namedtuple("SegmentResult", ["terms", "grad", "ok", "info", "grid", "y_end", "failure", "unreliable"])


@dataclass(frozen=True, eq=False)
class FenrirProblem:
    """Everything about a Fenrir likelihood that is fixed at model-build time.

    Built by :func:`fenrir_loglik` and :func:`Fenrir` from validated user input. ``segments`` split the
    time span at the declared discontinuities of the vector field (one segment without them); each holds
    the fixed grid (or, with error control, the stops: its start, the observation times and its end) and
    the observation at each grid point. ``diffusion_mode``: a fixed diffusion (an input of the Op) or one
    calibrated at every evaluation (``odefilter.DIFFUSION_*``). ``diagnostics`` counts this process's
    evaluations. The state may jump at each discontinuity (``jumps``, an input of the Op: one row per
    discontinuity, zeros unless declared).
    """

    ode: ODE
    solver: ODEFilter
    times: np.ndarray
    segments: tuple[Segment, ...]
    obs_matrix: np.ndarray
    missing: np.ndarray
    n_sigma: int
    control: StepControl
    diffusion_mode: int
    diagnostics: SolverDiagnostics
    discontinuities: np.ndarray = dataclasses.field(default_factory=lambda: np.empty(0))
    memory_budget: float = DEFAULT_MEMORY_BUDGET

    @classmethod
    def build(cls, ode, times, data_shape, obs_matrix, n_sigma, solver, control, diffusion_mode, label="Fenrir",
              discontinuities=None, memory_budget=DEFAULT_MEMORY_BUDGET):
        ode = validate_ode(ode)
        solver = validate_filter(solver, STRUCTURES, "the Fenrir likelihood")
        times = validate_times(times, "times", start=ode.t0)
        if control.step is not None and times[-1] > ode.t0:  # (a single observation at t0 takes any step)
            validate_step(control.step, float(times[-1]) - ode.t0)
        d = ode.n_states
        cmat = validate_obs_matrix(obs_matrix, d)
        if solver.structure != DENSE:
            validate_state_selection(cmat, solver.structure)
        n_obs, m = data_shape
        if n_obs != times.size:
            raise ValueError(f"data has {n_obs} rows but times has {times.size} entries")
        if m != cmat.shape[0]:
            raise ValueError(f"data has {m} columns but obs_matrix has {cmat.shape[0]} rows")
        if n_sigma not in (1, m):
            raise ValueError(f"obs_sigma must be a scalar or have length {m}, got length {n_sigma}")
        disc = validate_discontinuities(discontinuities, ode.t0, float(times[-1]))
        stops = np.union1d(np.union1d([ode.t0], times), disc)
        gaps = np.diff(stops)
        if gaps.size and gaps.min() < MIN_RELATIVE_GAP * (stops[-1] - stops[0]):
            i = int(np.argmin(gaps))
            raise ValueError(f"times (with t0={ode.t0} and the discontinuities) has two entries only {gaps[i]:.3g} "
                             f"apart ({float(stops[i])!r} and {float(stops[i + 1])!r}), less than "
                             f"{MIN_RELATIVE_GAP:g} of the time span: the ODE filter cannot step between them "
                             f"accurately; merge or average such observations")
        budget = as_positive_float(memory_budget, "memory_budget")
        segments = build_segments(ode.t0, times, disc, control.step)
        diagnostics = SolverDiagnostics.for_filter(label, control.step, solver)
        return cls(ode, solver, times, segments, np.ascontiguousarray(cmat),
                   np.zeros(data_shape, dtype=bool), n_sigma, control, int(diffusion_mode), diagnostics, disc, budget)

    def with_missing(self, missing: np.ndarray) -> "FenrirProblem":
        return dataclasses.replace(self, missing=missing)

    @property
    def step(self) -> float | None:
        return self.control.step

    @property
    def t_end(self) -> float:
        """The last time the solver reaches."""
        return float(self.segments[-1].grid[-1])

    @property
    def n_jumps(self) -> int:
        """Rows of the ``jumps`` input: one per discontinuity."""
        return self.discontinuities.size

    @property
    def n_directions(self) -> int:
        """Length of the flat gradient: ``(y0, θ, noise scales, κ, jumps)``; the kernel's ends before the jumps."""
        return self.ode.n_states * (1 + self.n_jumps) + self.ode.n_theta + self.n_sigma + 1

    @property
    def kernel(self):
        """The compiled Fenrir kernel for this problem's sizes (see :func:`fenrir_kernel`)."""
        return fenrir_kernel(self.solver.order, self.ode.n_states, self.solver.structure)

    @property
    def checkpointed_kernel(self):
        """The kernel whose dense reverse sweep runs in intervals (asked for when the sweep exceeds the budget)."""
        return fenrir_kernel(self.solver.order, self.ode.n_states, self.solver.structure, checkpointed=True)

    def _run_kernel(self, args: FenrirArguments):
        """The kernel's outputs and the kernel that produced them: the checkpointed one when the default one says
        that the evaluation would store more than :attr:`memory_budget` (with error control, the steps that fit in
        it are stepped twice)."""
        functions = self.kernel_functions(args.diffusion_mode)
        out = self.kernel(functions, args, self.initial_root)
        if int(out[3][4]) != STATUS_CHECKPOINTS:
            return out, self.kernel
        return self.checkpointed_kernel(functions, args, self.initial_root), self.checkpointed_kernel

    @cached_property
    def stepping(self) -> Stepping:
        """The kernel's stepping rule for this problem (the kernel chooses the first adaptive step itself)."""
        control = self.control
        return Stepping(bool(control.adaptive), 0.0, float(control.rtol), float(control.atol),
                        int(control.max_steps), True)

    @cached_property
    def initial_root(self) -> np.ndarray:
        """The zero initial root of the kernel's filter: its shape is the state-space structure."""
        return initial_root(self.solver.structure, self.solver.order, self.ode.n_states)

    @property
    def functions(self) -> FenrirFunctions:
        """The ODE's generated functions the Fenrir kernel calls, for this problem's IWP order and diffusion (not
        cached: the addresses belong to this process, and a problem may be pickled to another)."""
        return self.kernel_functions(self.diffusion_mode)

    def kernel_functions(self, diffusion_mode: int) -> FenrirFunctions:
        """:attr:`functions` for a kernel call in ``diffusion_mode`` (an EK0 with local diffusions also needs the
        bound of f's rounding)."""
        ode, order = self.ode, self.solver.order
        scale = ode.term_scale_addresses(not self.solver.ek1 and diffusion_mode == DIFFUSION_LOCAL)
        return FenrirFunctions(*ode.field_addresses, ode.hess_contract.address,
                               ode.taylor_coefficients(order).address, ode.taylor_vjp(order).address, *scale)

    def evaluate(self, y0, theta, data, sigma, kappa, jumps=None, cotangent=None, diagnostics=None, warn=True):
        """Per-observation terms and, given ``cotangent``, the gradient of ``cotangent · terms``.

        The gradient is the flat vector over ``(y0, θ, noise scales, κ, jumps)`` (``jumps``: the state's jump at
        each discontinuity, ``n_jumps × n_states`` numbers in any shape; default zeros). Terms are ``-inf`` (and
        the gradient zero) when the solve fails (non-finite values, a diverging fixed step,
        ``max_steps`` reached), an input is invalid or the asked-for gradient is rounding noise
        (:mod:`pymc_pnode.accuracy`); every evaluation is counted in ``diagnostics`` (default
        :attr:`diagnostics`), which warns unless ``warn`` is False.
        """
        return self._evaluate(y0, theta, data, sigma, kappa, jumps, cotangent, diagnostics, warn)[:2]

    def solver_grid(self, y0, theta, data, sigma, kappa=1.0, jumps=None) -> np.ndarray:
        """The solver grid of one evaluation at these inputs (the error-controlled grid without a fixed step).

        Empty when the solve fails.
        """
        terms, _, grid = self._evaluate(y0, theta, data, sigma, kappa, jumps, None, SolverDiagnostics(), False)
        return grid.copy() if np.isfinite(terms).all() else np.empty(0)

    def _gradient_reproducible(self, kernel, arguments: FenrirArguments, grad: np.ndarray) -> bool:
        """Whether the reverse sweep's gradient survives other rounding errors: the sweep again (by ``kernel``) with
        rescaled cotangents (:func:`~pymc_pnode.accuracy.reproducible`)."""
        again = arguments._replace(cotangent=arguments.cotangent * RESCALE,
                                   end_cotangent=arguments.end_cotangent * RESCALE)
        _, grad2, ok, _, _, _ = kernel(self.kernel_functions(arguments.diffusion_mode), again, self.initial_root)
        return bool(ok) and reproducible([grad], [grad2])

    def _segment(self, arguments: FenrirArguments, segment: Segment, y_start: np.ndarray, want_grad: bool,
                 end_cotangent: np.ndarray) -> SegmentResult:
        """One kernel call over ``segment`` from the solution value ``y_start`` at its start."""
        args = arguments._replace(y0=y_start, stops=segment.grid, stop_obs=segment.obs_at, want_grad=want_grad,
                                  end_cotangent=end_cotangent)
        (terms, grad, ok, info, grid, y_end), kernel = self._run_kernel(args)
        failure = ""
        if int(info[4]) != STATUS_SUCCESS:  # a failed forward pass returns its grid up to where it stopped
            failure = STATUS_MESSAGES[int(info[4])] + (f", at t = {grid[-1]:.6g}" if grid.size > 1 else "")
        unreliable = False
        if ok and want_grad and needs_rounding_check(info[5]):
            ok = self._gradient_reproducible(kernel, args, grad)
            unreliable = not ok
        return SegmentResult(terms, grad, bool(ok), info, grid, y_end, failure, unreliable)

    def _solved(self, results: list[SegmentResult]) -> bool:
        """Whether every segment was solved (and its gradient, if asked for, is not rounding noise)."""
        return len(results) == len(self.segments) and all(r.ok for r in results)

    def _segments(self, arguments: FenrirArguments, jumps: np.ndarray, want_grad: bool) -> list[SegmentResult]:
        """Every segment in turn, each restarted from the solution mean where the previous one ended plus the
        state's jump there (the filter's derivative states restart from the vector field beyond the discontinuity,
        its covariance from zero). With the gradient, the segments before the last run twice: forward for their
        end values, then backward in time with the cotangent that the next segment puts on its starting value
        (its gradient with respect to its ``y0``, which is also the gradient with respect to the jump). Stops at
        the first failing segment."""
        d = self.ode.n_states
        no_cotangent = np.zeros(d)
        starts, results = [arguments.y0], []
        for i, segment in enumerate(self.segments):
            last = i == len(self.segments) - 1
            result = self._segment(arguments, segment, starts[-1], want_grad and last, no_cotangent)
            results.append(result)
            if not result.ok:
                return results
            starts.append(np.ascontiguousarray(restart_state(result.y_end, jumps, i)))
        if want_grad:
            for i in range(len(self.segments) - 2, -1, -1):
                end_cotangent = np.ascontiguousarray(results[i + 1].grad[:d])
                results[i] = self._segment(arguments, self.segments[i], starts[i], True, end_cotangent)
                if not results[i].ok:
                    return results[: i + 1]
        return results

    def _evaluate(self, y0, theta, data, sigma, kappa, jumps, cotangent, diagnostics, warn):
        """:meth:`evaluate`, and the solver grid."""
        ode = self.ode
        data = np.array(data, dtype=np.float64, order="C", copy=True)
        data[self.missing] = np.nan
        sigma = np.asarray(sigma, dtype=np.float64).reshape(-1)
        sigma_dir = np.zeros(data.shape[1], dtype=np.int64) if sigma.size == 1 else np.arange(data.shape[1])
        sigma_full = np.ascontiguousarray(sigma[sigma_dir])
        kappa = float(kappa)
        # writable C arrays: the kernel's signature (inputs of compiled graphs can be read-only)
        y0 = np.require(y0, np.float64, ["C", "W"])
        theta = np.require(theta, np.float64, ["C", "W"])
        if y0.shape != (ode.n_states,) or theta.shape != (ode.n_theta,):
            raise ValueError(f"y0 and theta must have shapes ({ode.n_states},) and ({ode.n_theta},), "
                             f"got {y0.shape} and {theta.shape}")
        jump_shape = (self.n_jumps, ode.n_states)
        jumps = np.zeros(jump_shape) if jumps is None else np.asarray(jumps, dtype=np.float64)
        if jumps.size != self.n_jumps * ode.n_states:
            raise ValueError(f"jumps must have shape {jump_shape}, got {jumps.shape}")
        jumps = jumps.reshape(jump_shape)
        want_grad = cotangent is not None
        cot = np.require(cotangent, np.float64, ["C", "W"]).reshape(-1) if want_grad else np.zeros(0)
        ok = (kappa > 0 and np.all(sigma_full > 0) and np.all(np.isfinite(y0)) and np.all(np.isfinite(theta))
              and np.all(np.isfinite(jumps)))
        n_steps = n_rejected = 0
        max_err = math.nan
        unreliable = tightened = equilibrium = False
        failure = cut_short = ""
        calibration_gap = 0.0
        grid = self.segments[0].grid[:1]
        if ok:
            first = self.segments[0]
            arguments = FenrirArguments(
                y0, theta, self.solver.prior.Q_bar_sqrt, self.solver.ek1, kappa, self.diffusion_mode, self.stepping,
                first.grid, first.obs_at, data, self.obs_matrix, sigma_full, sigma_dir, self.n_sigma, want_grad, cot,
                np.zeros(ode.n_states), float(self.memory_budget),
            )

            arguments_of = {}  # id(attempt): its arguments

            def solve(rtol: float, atol: float):
                attempt_arguments = arguments._replace(control=self.stepping._replace(rtol=rtol, atol=atol))
                attempt = self._segments(attempt_arguments, jumps, want_grad)
                arguments_of[id(attempt)] = attempt_arguments
                return attempt, self._solved(attempt), _accuracy(attempt)

            # error control whose solution fails the quadrature check, or whose atol does not resolve y0, is solved
            # again at tighter tolerances
            results, max_err, tried, cut_short = solve_to_tolerance(
                solve, y0, self.control.rtol, self.control.atol, self.control.adaptive, _failure)
            tightened = len(tried) > 1
            n_steps, n_rejected = map(sum, zip(*(_step_counts(attempt) for attempt in tried)))
            ok = self._solved(results)
            terms = sum(r.terms for r in results)
            grad = results[0].grad.copy()  # the y0 part is the first segment's; θ, σ and κ add up
            for r in results[1:]:
                grad[ode.n_states:] += r.grad[ode.n_states:]
            # a jump adds to the next segment's starting value: its gradient is that segment's y0 part
            grad = np.concatenate([grad] + [r.grad[:ode.n_states] for r in results[1:]])
            grid = np.concatenate([r.grid for r in results])
            failure = _failure(results)
            unreliable = any(r.unreliable for r in results)
            equilibrium = want_grad and ok and uninformed_derivatives(
                int(sum(r.info[7] for r in results)), self.control.adaptive, self.diffusion_mode == DIFFUSION_LOCAL)
            if ok and self.diffusion_mode == DIFFUSION_GLOBAL:
                calibration_gap = self._global_calibration_gap(arguments_of[id(results)], jumps, terms)
        (self.diagnostics if diagnostics is None else diagnostics).record(
            n_steps, n_rejected, max_err, failed=not ok, warn=warn, unreliable_gradient=unreliable, failure=failure,
            tightened=tightened, equilibrium_gradient=equilibrium, tightening_failure=cut_short,
            calibration_gap=calibration_gap)
        if not ok:
            terms = np.full(data.shape[0], -np.inf)
            grad = np.zeros(self.n_directions)
        return terms, grad, grid

    def _global_calibration_gap(self, arguments: FenrirArguments, jumps: np.ndarray, terms: np.ndarray) -> float:
        """How far (nats) the log-likelihood ``terms`` computed with the global diffusion is from the one with the
        local diffusions on the same kind of grid (the same tolerances or fixed step; value only), ``inf`` if that
        solve fails. One scalar κ̂ must cover the fast and the slow phases of a solution: where they differ (a
        relaxation oscillator) the slow phases get a numerical variance orders of magnitude above their error and
        the global value drifts from the exact one by thousands of nats, while the local one stays within the
        tolerance (``docs/fenrir.md``, "Calibrated diffusion")."""
        local = self._segments(arguments._replace(diffusion_mode=DIFFUSION_LOCAL), jumps, False)
        if not self._solved(local):
            return math.inf
        return abs(float(np.sum(terms)) - float(sum(np.sum(r.terms) for r in local)))


def _step_counts(results: list[SegmentResult]) -> tuple[int, int]:
    """Accepted and rejected steps of a solve, over its segments."""
    return tuple(int(sum(r.info[j] for r in results)) for j in (2, 3))


def _failure(results: list[SegmentResult]) -> str:
    """Why a solve failed and where (its first failed segment's account), ``""`` if it did not."""
    return next((r.failure for r in results if r.failure), "")


def _accuracy(results: list[SegmentResult]) -> float:
    """The largest scaled local error estimate or quadrature defect over the segments (≤ 1: within tolerance)."""
    return max(max(r.info[0], r.info[6]) for r in results)


def _fenrir_inputs(y0, theta, data, sigma, kappa, jumps):
    return [pt.as_tensor_variable(x, dtype="float64") for x in (y0, theta, data, sigma, kappa, jumps)]


class FenrirOp(Op):
    """Per-observation Fenrir log-likelihood terms; the gradient is exact (reverse mode)."""

    __props__ = ("problem",)

    def __init__(self, problem: FenrirProblem):
        self.problem = problem

    def make_node(self, y0, theta, data, sigma, kappa, jumps):
        return Apply(self, _fenrir_inputs(y0, theta, data, sigma, kappa, jumps), [pt.vector(dtype="float64")])

    def perform(self, node, inputs, output_storage):
        output_storage[0][0] = self.problem.evaluate(*inputs)[0]

    def infer_shape(self, fgraph, node, shapes):
        return [(shapes[2][0],)]

    def L_op(self, inputs, outputs, output_grads):
        y0, theta, data, sigma, kappa, jumps = inputs
        vjp = FenrirVJPOp(self.problem)(y0, theta, data, sigma, kappa, jumps, output_grads[0])[1]
        d, k, s = self.problem.ode.n_states, self.problem.ode.n_theta, self.problem.n_sigma
        g_sigma = vjp[d + k : d + k + s]
        return [
            vjp[:d],
            vjp[d : d + k],
            grad_not_implemented(self, 2, data, "Fenrir has no gradient with respect to the data"),
            g_sigma.reshape(sigma.shape) if sigma.ndim else g_sigma[0],
            vjp[d + k + s],
            vjp[d + k + s + 1:].reshape(jumps.shape),
        ]

    def __str__(self) -> str:
        return "FenrirOp"


class FenrirVJPOp(Op):
    """``(terms, gᵀ ∂terms/∂(y0, θ, σ, κ, jumps))``: the terms and one flat vector–Jacobian product.

    The terms come for free with the reverse sweep; :func:`_share_fenrir_forward_pass` lets the
    value node of the same inputs use them, so a compiled logp-and-gradient runs the solver once.
    """

    __props__ = ("problem",)

    def __init__(self, problem: FenrirProblem):
        self.problem = problem

    def make_node(self, y0, theta, data, sigma, kappa, jumps, cotangent):
        inputs = _fenrir_inputs(y0, theta, data, sigma, kappa, jumps)
        inputs.append(pt.as_tensor_variable(cotangent, dtype="float64"))
        return Apply(self, inputs, [pt.vector(dtype="float64"), pt.vector(dtype="float64")])

    def perform(self, node, inputs, output_storage):
        terms, vjp = self.problem.evaluate(*inputs[:6], cotangent=inputs[6])
        output_storage[0][0] = terms
        output_storage[1][0] = vjp

    def infer_shape(self, fgraph, node, shapes):
        return [(shapes[2][0],), (self.problem.n_directions,)]

    def __str__(self) -> str:
        return "FenrirVJPOp"


# Under nutpie / mode="NUMBA" the kernel runs through FenrirProblem.evaluate in object mode: the accuracy
# counts and warnings keep working, and no compiled graph gets its own copy of the kernel.
register_numba(FenrirOp, lambda op: lambda *inputs: op.problem.evaluate(*inputs)[0],
               object_mode_outputs=nb.float64[::1])
register_numba(FenrirVJPOp, lambda op: op.problem.evaluate, object_mode_outputs=nb.types.UniTuple(nb.float64[::1], 2))


@register_specialize
@node_rewriter([FenrirOp])
def _share_fenrir_forward_pass(fgraph, node):
    """Use the terms of a ``FenrirVJPOp`` with the same inputs instead of solving again.

    Skipped when the cotangent itself depends on the terms (that would make a cycle).
    """
    for client, _ in fgraph.clients[node.inputs[2]]:
        op = getattr(client, "op", None)
        if not (isinstance(op, FenrirVJPOp) and op.problem is node.op.problem):
            continue
        if not all(a is b for a, b in zip(client.inputs[:6], node.inputs)):
            continue
        if node.outputs[0] in set(ancestors([client.inputs[6]])):
            continue
        return [client.outputs[0]]
    return None


def _validate_positive_constant(value, name: str):
    """Raise at build time when a constant (non-symbolic) value is not positive."""
    if isinstance(value, (int, float, np.ndarray, list, tuple)):
        arr = np.asarray(value, dtype=np.float64)
        if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
            raise ValueError(f"{name} must be positive and finite, got {value!r}")


_CALIBRATIONS = {None: DIFFUSION_LOCAL, "local": DIFFUSION_LOCAL, "global": DIFFUSION_GLOBAL}


def diffusion_mode(diffusion) -> int:
    """``DIFFUSION_LOCAL`` for ``None``/``"local"``, ``DIFFUSION_GLOBAL`` for ``"global"``, else fixed."""
    if diffusion is None or isinstance(diffusion, str):
        if diffusion not in _CALIBRATIONS:
            raise ValueError(f"diffusion must be None, 'local', 'global', a positive number or a random variable, "
                             f"got {diffusion!r}")
        return _CALIBRATIONS[diffusion]
    return DIFFUSION_FIXED


def _prepare(ode, times, data, obs_matrix, obs_sigma, diffusion, solver, control, label, jumps=None,
             **problem_options):
    """The problem, the data with missing values as 0, and the Op's σ, κ and jumps inputs (jumps ``None`` unless
    declared; then zeros of shape ``(n_jumps, d)`` are the Op's input)."""
    _validate_positive_constant(obs_sigma, "obs_sigma")
    mode = diffusion_mode(diffusion)
    if mode == DIFFUSION_FIXED:
        _validate_positive_constant(diffusion, "diffusion")
    sigma = pt.as_tensor_variable(obs_sigma, dtype="float64")
    if sigma.ndim > 1:
        raise ValueError("obs_sigma must be a scalar or a vector")
    arr = as_float_array(data, "data")
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise ValueError(f"data must have shape (len(times), n_observed), got {np.shape(data)}")
    n_sigma = 1 if sigma.ndim == 0 else sigma.type.shape[0]
    if n_sigma is None:
        # e.g. a random variable declared with dims: one scale per observed component
        n_sigma = arr.shape[1]
        sigma = pt.specify_shape(sigma, (n_sigma,))
    problem = FenrirProblem.build(ode, times, arr.shape, obs_matrix, n_sigma, solver, control, mode, label=label,
                                  **problem_options)
    missing = np.isnan(arr)
    if np.all(missing):
        raise ValueError("data contains no observed (non-NaN) values")
    if np.any(np.isinf(arr)):
        raise ValueError("data must be finite or NaN (missing); it contains ±inf")
    # A calibrated diffusion is computed by the kernel; the Op's κ input is then an unused placeholder.
    kappa = pt.as_tensor_variable(diffusion if mode == DIFFUSION_FIXED else 1.0, dtype="float64")
    if jumps is not None:  # (the discontinuities themselves were validated with the problem)
        jumps = declared_restarts(problem_options.get("discontinuities"), jumps, ode.t0, float(problem.times[-1]),
                                  problem.ode.n_states)[1]
    return problem.with_missing(missing), np.where(missing, 0.0, arr), sigma, kappa, jumps


def _no_jumps(problem: FenrirProblem) -> np.ndarray:
    """The Op's ``jumps`` input when none are declared: zeros, one row per discontinuity."""
    return np.zeros((problem.n_jumps, problem.ode.n_states))


def fenrir_loglik(
    ode: ODE,
    y0,
    theta,
    times,
    data,
    *,
    obs_matrix=None,
    obs_sigma,
    diffusion=None,
    solver: ODEFilter | None = None,
    step: float | None = None,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    max_steps: int = DEFAULT_MAX_STEPS,
    discontinuities=None,
    jumps=None,
    memory_budget: float = DEFAULT_MEMORY_BUDGET,
    pointwise: bool = False,
):
    r"""The Fenrir PN-approximated marginal log-likelihood as a PyTensor expression.

    Computes :math:`\log p(u_{1:M} \mid y_0, \theta, \kappa, \sigma)` (Tronarp, Bosch & Hennig,
    2022, eq. 15 and App. B.1): an ODE filter with diffusion ``κ`` (the variance multiplier of the
    prior's ``Q(h)``, as ``diffusion_var`` in Fenrir.jl) steps through every observation time, and a
    backward-in-time Kalman filter on its posterior conditions on the data
    ``u_i = H y(t_i) + N(0, diag(σ²))``.

    By default the solver grid is chosen at every evaluation by the filter's local error estimate
    and a PI step-size controller (Bosch, Hennig & Tronarp, 2021, §4), and the diffusion is the
    quasi-maximum-likelihood estimate from the ODE residuals of that solve (Tronarp et al., 2019,
    Prop. 4). The gradient is exact for the grid the evaluation chose (the grid is held fixed, as
    in discrete adjoints of adaptive solvers) and includes the dependence of the calibrated
    diffusion on the parameters.

    Parameters
    ----------
    ode : ODE
        The differential equation; ``y0`` is its state at ``ode.t0``.
    y0, theta : array_like or TensorVariable
        Initial state (d,) and parameters (n_theta,); may be PyMC random variables.
    times : array_like, shape (T,)
        Strictly increasing observation times, not before ``ode.t0``.
    data : array_like, shape (T, m)
        Observations; NaN marks a missing value (skipped).
    obs_matrix : array_like, shape (m, d), optional
        Observation matrix ``H`` (default: identity, all states observed).
    obs_sigma : float, vector of length m, or TensorVariable
        Observation noise standard deviation (scalar or per observed component).
    diffusion : float, TensorVariable, "local" or "global", optional
        The diffusion ``κ > 0``. Default (``None`` or ``"local"``): calibrated at every step of every
        evaluation (local quasi-MLE, from a first pass at unit diffusion; see docs/fenrir.md);
        ``"global"``: one quasi-MLE per evaluation (Tronarp et al., 2019, Prop. 4), checked at every evaluation
        against the value with local diffusions (an :class:`~pymc_pnode.AccuracyWarning` when they differ by
        more than :data:`~pymc_pnode.accuracy.GLOBAL_CALIBRATION_GAP` nats; the check costs a value-only
        evaluation).
    solver : EK0 or EK1, default ``EK1(order=3)``
    step : float, optional
        A fixed solver step (the grid is refined to contain every observation time). Default: the
        step is error-controlled. A fixed step is checked at every evaluation with the filter's
        local error estimate against ``rtol``/``atol``; when it misses them a
        :class:`~pymc_pnode.AccuracyWarning` says so (counts in :func:`~pymc_pnode.fenrir_diagnostics`).
    rtol, atol : float
        Relative and absolute tolerances of the local error (defaults 1e-4 and 1e-6).
    max_steps : int
        Step cap of an error-controlled solve (default 20,000); a solve that needs more returns
        ``-inf``.
    discontinuities : array_like, optional
        Times at which the vector field jumps in ``t`` (a switched stimulus, a dose): the filter restarts
        at each (:mod:`pymc_pnode.discontinuities`), and the gradient runs through the restarts. Without
        them an error-controlled solve stops at such a jump (``-inf``, with a warning that says where).
        The numerical variance at a restart is not carried over (with error control it is of the order
        of the tolerance). Times outside ``(t0, times[-1])`` are ignored.
    jumps : array_like or TensorVariable, shape (len(discontinuities), n_states), optional
        Jumps of the state at the ``discontinuities`` (a bolus dose, a harvest; may be random): the segment after
        ``discontinuities[j]`` starts from the mean where the one before ended plus ``jumps[j]``,
        ``y(t_j⁺) = y(t_j⁻) + jumps[j]``; a state that does not jump has a zero column. The times must then be
        strictly increasing and after ``t0`` (those at or after ``times[-1]`` are dropped with their rows); an
        observation at a jump time is of the state just before the jump. The gradient includes ``jumps``.
    memory_budget : float, default 2**30
        Bytes that an evaluation of a dense model (``structure="dense"``) may store: per grid point, two ``D×D``
        matrices of the forward pass (four with the local diffusion) and, for a gradient, five of the data phase
        (``D = d (q + 1)``). One that would need more is checkpointed: the forward pass keeps its roots only at
        checkpoints (about an eighth of the budget; every other one is dropped when they fill) and the kernel
        recomputes them, with the data filter's store, interval by interval when a pass reaches the interval (the
        same numbers to rounding; roots are recomputed up to four times, the data filter runs three times and its
        adjoint twice). It then holds about half the budget, plus one interval. Block-diagonal and isotropic
        structures store ``O(d q²)`` per point and never need it.
    pointwise : bool, default False
        Return the vector of per-observation-time terms (prediction-error decomposition) instead
        of their sum.

    Returns
    -------
    TensorVariable
        Scalar log-likelihood (or the (T,) terms). ``-inf`` when the solve fails: non-finite values, a
        fixed step that diverges, an error-controlled solve that reaches ``max_steps`` or whose step
        collapses; also, with its gradient, where that gradient is rounding noise (a huge filter gain, e.g.
        near an unstable invariant set: counted and warned, see docs/fenrir.md).
    """
    control = StepControl(step, rtol, atol, max_steps)
    problem, filled, sigma, kappa, jumps = _prepare(ode, times, data, obs_matrix, obs_sigma, diffusion, solver,
                                                    control, "fenrir_loglik", jumps, discontinuities=discontinuities,
                                                    memory_budget=memory_budget)
    terms = FenrirOp(problem)(ode.y0_tensor(y0), ode.theta_tensor(theta), pt.as_tensor_variable(filled), sigma,
                              kappa, _no_jumps(problem) if jumps is None else jumps)
    return terms if pointwise else terms.sum()


def _predictive_draw(problem: FenrirProblem, y0, theta, sigma, kappa, jumps, rng, size):
    """Data drawn from the Fenrir generative model: a PN posterior trajectory plus noise (``jumps``: the state's
    jumps at the discontinuities, any shape with ``n_jumps × n_states`` entries, or ``None``).

    ``size`` is the batch shape ``(..., T)``; every leading index gets its own trajectory. A failed solve gives NaN,
    counted in ``problem.diagnostics.n_failed_draws`` and warned.
    """
    ode = problem.ode
    rng = np.random.default_rng(rng)
    # PyMC broadcasts the parameters with leading unit dims over the time batch: drop them.
    y0 = np.asarray(y0, dtype=np.float64).reshape(ode.n_states)
    theta = np.asarray(theta, dtype=np.float64).reshape(ode.n_theta)
    kappa = np.asarray(kappa, dtype=np.float64).reshape(())
    if jumps is not None:
        jumps = np.asarray(jumps, dtype=np.float64).reshape(problem.n_jumps, ode.n_states)
    n_obs, m = problem.missing.shape
    batch = (n_obs,) if size is None else tuple(np.atleast_1d(size))
    n = int(np.prod(batch[:-1])) if len(batch) > 1 else 1
    span = problem.t_end - ode.t0
    control = problem.control
    # The likelihood's grid: steps of at most problem.step, or the same error control (and the same restarts).
    step = None if control.adaptive else min(control.step, span)
    sol = solve(ode, y0, theta, (ode.t0, problem.t_end), solver=problem.solver, step=step,
                rtol=control.rtol, atol=control.atol, max_steps=control.max_steps, save_at=problem.times,
                diffusion=DIFFUSION_ARGUMENTS.get(problem.diffusion_mode, float(kappa)),
                discontinuities=problem.discontinuities, jumps=jumps)
    if not sol.success:  # no data without a solution: NaN, counted and warned
        problem.diagnostics.record_failed_draw(stop_reason(sol))
        return np.full(batch + (m,), np.nan)
    traj = sol.sample(n, rng=rng)  # (n, T, d)
    sigma = np.broadcast_to(np.asarray(sigma, dtype=np.float64).reshape(-1), (m,))
    out = traj @ problem.obs_matrix.T + rng.standard_normal((n, n_obs, m)) * sigma
    return out.reshape(batch + (m,))


def Fenrir(
    name: str,
    ode: ODE,
    *,
    y0,
    theta,
    times,
    observed,
    obs_matrix=None,
    obs_sigma,
    diffusion=None,
    solver: ODEFilter | None = None,
    step: float | None = None,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    max_steps: int = DEFAULT_MAX_STEPS,
    discontinuities=None,
    jumps=None,
    memory_budget: float = DEFAULT_MEMORY_BUDGET,
    check_accuracy: bool = True,
    dims=None,
):
    """Register the Fenrir likelihood of ``observed`` in the active PyMC model.

    Creates an observed variable ``name`` of shape ``(len(times), n_observed)`` whose
    log-probability is the Fenrir marginal likelihood (see :func:`fenrir_loglik`), one term per
    observation time, so ``pm.compute_log_likelihood`` and ``arviz.loo`` work. Prior and posterior
    predictive draws sample a trajectory from the probabilistic numerical solution and add
    observation noise (a draw at parameter values without a solution over ``times``, e.g. past a blow-up, is NaN,
    counted in ``n_failed_draws`` of :func:`fenrir_diagnostics` and warned). Missing values (NaN) are skipped by the
    likelihood; they are stored as 0 in the observed data of the model.

    Parameters
    ----------
    name : str
        Name of the observed variable.
    ode, y0, theta, times, obs_matrix, obs_sigma, diffusion, solver, step, rtol, atol, max_steps, discontinuities
    jumps, memory_budget
        As in :func:`fenrir_loglik`; ``y0``, ``theta``, ``obs_sigma``, ``diffusion`` and ``jumps`` may be
        random variables of the model.
    check_accuracy : bool, default True
        With a fixed ``step`` or ``diffusion="global"``: evaluate the likelihood at the model's initial point and
        at 20 prior draws now, and warn (:class:`~pymc_pnode.AccuracyWarning`) when the step misses the
        tolerances there, or the global diffusion's value is more than
        :data:`~pymc_pnode.accuracy.GLOBAL_CALIBRATION_GAP` nats from the local diffusions'. Every later
        evaluation is checked too, in the process that runs it; chains sampled in worker processes
        (``pm.sample(cores>1)``) are reported in this process with their totals once the workers have exited.
    observed : array_like, shape (T, m)
        The data.
    dims : tuple of str, optional
        Dims of the observed variable, e.g. ``("time", "observable")``.

    Returns
    -------
    TensorVariable
        The observed variable.
    """
    control = StepControl(step, rtol, atol, max_steps)
    problem, filled, sigma, kappa, jumps = _prepare(ode, times, observed, obs_matrix, obs_sigma, diffusion, solver,
                                                    control, f"Fenrir {name!r}", jumps,
                                                    discontinuities=discontinuities, memory_budget=memory_budget)
    y0, theta = ode.y0_tensor(y0), ode.theta_tensor(theta)
    sigma_vec = sigma if sigma.ndim == 1 else sigma[None]
    op = FenrirOp(problem)

    d, k, n_sigma, n_jumps = ode.n_states, ode.n_theta, problem.n_sigma, problem.n_jumps
    # declared jumps are a (flattened) parameter of the distribution, so that random ones are replaced by values
    jump_parameters = [] if jumps is None else [jumps.reshape((n_jumps * d,))]

    def logp(value, y0, theta, sigma, kappa, *jump_values):
        # PyMC may hand the parameters over with broadcast leading unit dims: drop them.
        y0, theta = y0.reshape((d,)), theta.reshape((k,))
        sigma, kappa = sigma.reshape((n_sigma,)), kappa.reshape(())
        jumps_in = jump_values[0].reshape((n_jumps, d)) if jump_values else _no_jumps(problem)
        return op(y0, theta, value, sigma if n_sigma > 1 else sigma[0], kappa, jumps_in)

    def random(y0, theta, sigma, kappa, *jump_values, rng=None, size=None):
        return _predictive_draw(problem, y0, theta, sigma, kappa, jump_values[0] if jump_values else None, rng, size)

    observed_rv = pm.CustomDist(
        name,
        y0,
        theta,
        sigma_vec,
        kappa,
        *jump_parameters,
        logp=logp,
        random=random,
        signature=f"(d),(k),(s),(){',(j)' * bool(jump_parameters)}->({filled.shape[1]})",
        observed=filled,
        shape=filled.shape,
        dims=dims,
    )
    model = pm.modelcontext(None)
    _DIAGNOSTICS.setdefault(model, {})[name] = problem.diagnostics
    if check_accuracy and (not control.adaptive or problem.diffusion_mode == DIFFUSION_GLOBAL):
        _check_accuracy_before_sampling(model, problem, filled, [y0, theta, sigma, kappa, *jump_parameters])
    return observed_rv


_DIAGNOSTICS: "weakref.WeakKeyDictionary[pm.Model, dict[str, SolverDiagnostics]]" = weakref.WeakKeyDictionary()
_N_PRIOR_CHECKS = 20


def fenrir_diagnostics(model: pm.Model | None = None) -> dict[str, SolverDiagnostics]:
    """Accuracy counts of every :func:`Fenrir` likelihood of ``model`` (default: the model in context).

    The counts cover the evaluations run in this process (``pm.sample(cores=1)``, nutpie, ``pm.find_MAP``,
    :func:`~pymc_pnode.fit`, compiled functions) and those of chains sampled in other processes
    (``pm.sample(cores>1)``), which report through spool files (see :mod:`pymc_pnode.accuracy`; the last
    half second of a worker's counts arrives when it exits).

    Returns
    -------
    dict
        ``{name: SolverDiagnostics}`` with steps taken, rejected steps, evaluations over the
        tolerance, failed (``-inf``) solves, the largest scaled local error or quadrature defect and a suggested step.
    """
    model = pm.modelcontext(model)
    return {name: counts.merged() for name, counts in _DIAGNOSTICS.get(model, {}).items()}


def _check_accuracy_before_sampling(model, problem: FenrirProblem, filled, parameters) -> None:
    """Warn when a fixed step misses the tolerances, or a global diffusion is far from the local ones, at the
    initial point or at prior draws."""
    values = model.replace_rvs_by_values(parameters)
    at_initial_point = model.compile_fn(values, inputs=model.value_vars, on_unused_input="ignore")
    points = [at_initial_point(model.initial_point())]
    where = "at the initial point"
    try:
        draws = pm.draw(parameters, draws=_N_PRIOR_CHECKS, random_seed=0)
    except NotImplementedError:  # e.g. a Flat prior: nothing to draw from
        draws = None
    if draws is not None:
        points += [[np.asarray(v)[j] for v in draws] for j in range(_N_PRIOR_CHECKS)]
        where += f" and {_N_PRIOR_CHECKS} prior draws"
    probe = SolverDiagnostics.for_filter(problem.diagnostics.label, problem.step, problem.solver)
    for y0, theta, sigma, kappa, *jumps in points:
        problem.evaluate(y0, theta, filled, sigma, kappa, *jumps, diagnostics=probe, warn=False)
    if probe.n_calibration_gap:
        warnings.warn(
            f"{probe.label}: {where}, the log-likelihood with the global diffusion is more than "
            f"{GLOBAL_CALIBRATION_GAP:g} nat from the one with local diffusions in {probe.n_calibration_gap} of "
            f"{probe.n_evaluations} evaluations (by up to {probe.max_calibration_gap:.3g} nats). Use diffusion=None "
            f"(local diffusions, the default).",
            AccuracyWarning,
            stacklevel=3,
        )
    if probe.step is not None and (probe.n_over_tolerance or probe.n_failed):
        warnings.warn(
            f"{probe.label}: {where}, the fixed step "
            f"{probe.step:g} misses the tolerances (rtol={problem.control.rtol:g}, atol={problem.control.atol:g}) "
            f"in {probe.n_over_tolerance} and fails (-inf) in {probe.n_failed} of {probe.n_evaluations} "
            f"evaluations (largest scaled local error or quadrature defect {probe.max_error:.3g}). "
            + (f"Use step={probe.suggested_step:.3g} or smaller, or " if probe.suggested_step else "Use ")
            + "step=None for error-controlled steps.",
            AccuracyWarning,
            stacklevel=3,
        )
