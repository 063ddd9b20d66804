"""A drop-in for :class:`pymc.ode.DifferentialEquation`: error-controlled solutions as PyTensor tensors.

``pm.ode.DifferentialEquation`` solves with scipy's ``odeint`` and differentiates by forward
sensitivities, in Python, at every evaluation. :class:`DifferentialEquation` has the same call
signature and returns the same ``(len(times), n_states)`` tensor, solved by the compiled
error-controlled Dormand–Prince 5(4) pair of :mod:`pymc_pnode.classical.dopri` with the exact discrete
adjoint of the grid it chose. A solve that fails (a finite-time blow-up, ``max_steps``) makes the
model's log-density ``-inf`` through a potential instead of raising or handing NaN to the sampler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numba as nb
import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType, grad_not_implemented
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

from pymc_pnode._jit import register_numba
from pymc_pnode.accuracy import SolverDiagnostics, solve_to_tolerance
from pymc_pnode.classical.dopri import dopri_backward, dopri_forward
from pymc_pnode.discontinuities import declared_restarts, restart_state, split_times
from pymc_pnode.filtering.stepping import STATUS_MESSAGES, STATUS_SUCCESS
from pymc_pnode.likelihoods.fenrir import StepControl
from pymc_pnode.ode import ODE
from pymc_pnode.validation import validate_discontinuities, validate_times

__all__ = ["DifferentialEquation", "DopriSolver", "flag_failed_solve"]

DEFAULT_RTOL = 1e-6
DEFAULT_ATOL = 1e-8
DEFAULT_MAX_STEPS = 100_000
STIFF_ADVICE = ("If the ODE is stiff (fast decaying modes: chemical kinetics, say), an explicit pair needs a step "
                "below its stability limit all the way: pn.DifferentialEquation(..., solver=pn.EK1()) solves it with "
                "the A-stable EK1 filter instead.")


class DopriSolver:
    """Error-controlled DOPRI5 solves of ``ode`` at fixed output ``times``, with their discrete adjoint.

    Parameters
    ----------
    ode : ODE
        The differential equation.
    times : array_like
        Strictly increasing output times, ``times[0] >= t_start``.
    control : StepControl
        ``rtol``, ``atol`` and ``max_steps`` (its ``step`` must be ``None``).
    label : str
        Name used in the accuracy counts.
    t_start : float, optional
        Where the solves start (default ``ode.t0``; a segment after a restart).
    diagnostics : SolverDiagnostics, optional
        Counts to share with other solvers (the segments of one solution); default: its own.

    Attributes
    ----------
    diagnostics : SolverDiagnostics
        Steps, rejected steps and failed solves over the evaluations run through :meth:`forward`
        (this process and, by spool files, worker processes). A solve from a ``y0`` with a nonzero entry below
        ``atol`` (a state the tolerances do not resolve) is run again at tighter tolerances
        (:func:`~pymc_pnode.accuracy.solve_to_tolerance`, counted in ``n_tightened``); one that stays below the
        tightest ``atol`` tried is counted over the tolerance and warned.
    """

    def __init__(self, ode: ODE, times, control: StepControl, label: str = "DifferentialEquation",
                 t_start: float | None = None, diagnostics: SolverDiagnostics | None = None):
        if not control.adaptive:
            raise ValueError("DopriSolver chooses its own steps: control.step must be None")
        self.ode = ode
        self.t_start = ode.t0 if t_start is None else float(t_start)
        self.times = validate_times(times, "times", start=self.t_start)
        self.control = control
        self.diagnostics = SolverDiagnostics(label, None, 5, max_steps_advice=STIFF_ADVICE) if diagnostics is None \
            else diagnostics

    def forward(self, y0, theta):
        """``(ys, ts, traj, log_ok)`` for numeric ``y0`` and ``theta`` of the right sizes; counts the evaluation.

        ``log_ok`` is ``[0.0]`` for a solve that reached every output time and ``[-inf]`` otherwise
        (the rows of ``ys`` it did not reach then hold the last state it did reach).
        """
        c = self.control
        y0, theta = _vector(y0, self.ode.n_states), _vector(theta, self.ode.n_theta)

        def solve(rtol: float, atol: float):
            run = dopri_forward(self.ode.rhs.address, theta.copy(), y0, self.t_start, self.times, rtol, atol,
                                c.max_steps)
            return run, run[3] == STATUS_SUCCESS, 0.0  # (no error measure beyond the steps' own)

        # a nonzero entry of y0 below atol (a state the tolerances do not resolve) is solved again tighter
        accepted, accuracy, tried, cut_short = solve_to_tolerance(solve, y0, c.rtol, c.atol, why_failed=_failure)
        ys, ts, traj, status, _ = accepted
        failed = status != STATUS_SUCCESS
        self.diagnostics.record(sum(run[1].size - 1 for run in tried), sum(run[4] for run in tried), accuracy, failed,
                                failure=_failure(accepted) if failed else "", tightened=len(tried) > 1,
                                tightening_failure=cut_short)
        return ys, ts, traj, np.array([-np.inf if failed else 0.0])

    def backward(self, theta, ts, traj, g_ys):
        """``(dL/dy0, dL/dtheta)`` for the cotangent ``g_ys = dL/dys`` on the grid ``ts``."""
        ts, traj, g_ys = (np.ascontiguousarray(x, dtype=np.float64) for x in (ts, traj, g_ys))
        theta = _vector(theta, self.ode.n_theta).copy()  # the generated functions take writable parameters
        return dopri_backward(*self.ode.field_addresses, theta, ts, traj, self.times, g_ys)

    def solve(self, y0, theta=None) -> np.ndarray:
        """States at ``times``, shape ``(len(times), n_states)``; ``ValueError`` if the solve fails."""
        y0, theta = self.ode.validate_y0(y0), self.ode.validate_theta(theta)
        ys, ts, _, log_ok = self.forward(y0, theta)
        if log_ok[0] != 0.0:
            raise ValueError(f"the solve failed at t={ts[-1]:g} before reaching times[-1]={self.times[-1]:g}")
        return ys

    # Ops use the solver as a prop: solvers of the same problem give mergeable nodes.
    def _key(self):
        return (self.ode, self.t_start, self.times.tobytes(), self.control)

    def __eq__(self, other):
        return isinstance(other, DopriSolver) and other._key() == self._key()

    def __hash__(self):
        return hash((id(self.ode), self.t_start, self.times.tobytes(), self.control))

    def __repr__(self):
        c = self.control
        return f"DopriSolver({self.ode!r}, n_times={self.times.size}, rtol={c.rtol:g}, atol={c.atol:g})"


def _failure(run) -> str:
    """Why a forward run ``(ys, ts, traj, status, n_rejected)`` failed and where."""
    return f"{STATUS_MESSAGES[int(run[3])]}, at t = {run[1][-1]:.6g}"


def _vector(x, size: int) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float64).reshape(size)


class DopriSolveOp(Op):
    """``(y0, theta) -> (ys, ts, traj, log_ok)`` by a :class:`DopriSolver`; gradients by its adjoint.

    ``ts`` and ``traj`` (the grid and the states on it) feed the adjoint Op; ``log_ok`` (``[0]`` or
    ``[-inf]``) is piecewise constant, so its gradient is zero.
    """

    __props__ = ("solver",)

    def __init__(self, solver: DopriSolver):
        self.solver = solver

    def make_node(self, y0, theta):
        s = self.solver
        outputs = [
            pt.tensor(dtype="float64", shape=(s.times.size, s.ode.n_states)),
            pt.tensor(dtype="float64", shape=(None,)),
            pt.tensor(dtype="float64", shape=(None, s.ode.n_states)),
            pt.tensor(dtype="float64", shape=(1,)),
        ]
        return Apply(self, [pt.as_tensor_variable(y0), pt.as_tensor_variable(theta)], outputs)

    def perform(self, node, inputs, output_storage):
        for storage, value in zip(output_storage, self.solver.forward(*inputs)):
            storage[0] = value

    def L_op(self, inputs, outputs, output_grads):
        g_ys, g_ts, g_traj, _ = output_grads
        if not (isinstance(g_ts.type, DisconnectedType) and isinstance(g_traj.type, DisconnectedType)):
            raise NotImplementedError("gradients through the solver grid and its states are not supported")
        if isinstance(g_ys.type, DisconnectedType):
            return [pt.zeros_like(inputs[0]), pt.zeros_like(inputs[1])]
        return DopriAdjointOp(self.solver)(inputs[1], outputs[1], outputs[2], g_ys)

    def connection_pattern(self, node):
        return [[True, False, True, False], [True, False, True, False]]


class DopriAdjointOp(Op):
    """``(theta, ts, traj, g_ys) -> (dL/dy0, dL/dtheta)``: the discrete adjoint of :class:`DopriSolveOp`."""

    __props__ = ("solver",)

    def __init__(self, solver: DopriSolver):
        self.solver = solver

    def make_node(self, theta, ts, traj, g_ys):
        s = self.solver
        inputs = [pt.as_tensor_variable(theta), pt.as_tensor_variable(ts), pt.as_tensor_variable(traj),
                  pt.cast(pt.as_tensor_variable(g_ys), "float64")]
        outputs = [pt.tensor(dtype="float64", shape=(s.ode.n_states,)),
                   pt.tensor(dtype="float64", shape=(s.ode.n_theta,))]
        return Apply(self, inputs, outputs)

    def perform(self, node, inputs, output_storage):
        output_storage[0][0], output_storage[1][0] = self.solver.backward(*inputs)

    def L_op(self, inputs, outputs, output_grads):
        return [grad_not_implemented(self, i, x) for i, x in enumerate(inputs)]


# Under nutpie / mode="NUMBA" the solver runs in object mode, so compiling the graph does not compile the
# kernels into it again (see docs/benchmarks.md) and the evaluations are counted in DopriSolver.diagnostics.
register_numba(DopriSolveOp, lambda op: op.solver.forward,
               object_mode_outputs=nb.types.Tuple((nb.float64[:, ::1], nb.float64[::1], nb.float64[:, ::1],
                                                   nb.float64[::1])))
register_numba(DopriAdjointOp, lambda op: op.solver.backward, object_mode_outputs=nb.types.UniTuple(nb.float64[::1], 2))


class DifferentialEquation:
    r"""The ODE solution at ``times`` as a differentiable tensor: :class:`pymc.ode.DifferentialEquation`'s API.

    Replace ``pm.ode.DifferentialEquation`` by ``pn.DifferentialEquation`` and keep the rest of the
    model. Solves use the error-controlled Dormand–Prince 5(4) pair (Dormand & Prince, 1980; Hairer,
    Nørsett & Wanner, 1993, §II.5), compiled with numba; gradients are the exact discrete adjoint of
    the grid each solve chose (the grid held fixed). Inside a model, a solve that fails (the solution
    blows up before ``times[-1]``, the step collapses, or ``max_steps`` is reached) makes the model's
    log-density ``-inf`` through a potential named ``"<name>_failed"`` (zero otherwise), so a sampler
    rejects the point instead of seeing NaN or an exception. Outside a model, a failed solve is NaN.

    Parameters
    ----------
    func : callable or ODE
        ``func(y, t, p)`` returning the ``n_states`` derivatives, written with PyTensor operations (the
        function given to ``pm.ode.DifferentialEquation`` works unchanged), or an :class:`ODE`.
    times : array_like
        Strictly increasing output times, ``times[0] >= t0``.
    n_states, n_theta : int
        Numbers of states and parameters (taken from ``func`` when it is an :class:`ODE`).
    t0 : float, default 0
        Initial time.
    rtol, atol : float, default 1e-6, 1e-8
        Tolerances of the local error per step (mixed absolute/relative, as in ``solve_ivp``).
    max_steps : int, default 100,000
        Step cap of one solve; a solve that needs more fails.
    name : str, default "ode"
        Prefix of the potential that flags failed solves.
    discontinuities : array_like, optional
        Times at which the solution restarts (:mod:`pymc_pnode.discontinuities`): where the state jumps (a bolus
        dose; its sizes are the ``jumps`` of the call) or the vector field does. Each segment is solved on its own,
        from the solution where the previous one ended plus its jump; an output at such a time is the state before
        the jump, and the gradients run through the restarts. (A jump of the vector field in ``t`` needs no
        declaration here: the Runge–Kutta steps shrink around it, as ``case_studies/fenrir_infusion.ipynb`` uses.)
    solver : EK1 or EK0, optional
        An EK1 for stiff systems, which ``pm.ode`` solves with LSODA and an explicit pair only with prohibitively small
        steps: the mean of this ODE filter (error-controlled at ``rtol``/``atol``, its local diffusion; the EK1 is
        A-stable; Kersting, Sullivan & Hennig, 2020, and Bosch, Hennig & Tronarp, 2021, §4) instead of DOPRI5, with
        exact forward-mode derivatives on the grid it chose (:func:`pymc_pnode.probabilistic_solution`'s ``mean``;
        its standard deviation is left out). ``None`` (default): DOPRI5.

    Examples
    --------
    >>> def sir(y, t, p):  # doctest: +SKIP
    ...     beta, gamma = p[0], p[1]
    ...     return [-beta * y[0] * y[1], beta * y[0] * y[1] - gamma * y[1]]
    >>> times = np.arange(0.25, 5, 0.25)  # doctest: +SKIP
    >>> sir_model = pn.DifferentialEquation(sir, times=times, n_states=2, n_theta=2, t0=0)  # doctest: +SKIP
    >>> with pm.Model():  # doctest: +SKIP
    ...     beta = pm.LogNormal("beta", 0, 1)
    ...     gamma = pm.LogNormal("gamma", 0, 1)
    ...     solution = sir_model(y0=[0.99, 0.01], theta=[beta, gamma])
    ...     pm.LogNormal("Y", mu=pm.math.log(solution), sigma=0.25, observed=data)
    """

    def __init__(
        self,
        func: Callable | ODE,
        times: Sequence[float] | np.ndarray,
        *,
        n_states: int | None = None,
        n_theta: int | None = None,
        t0: float = 0.0,
        rtol: float = DEFAULT_RTOL,
        atol: float = DEFAULT_ATOL,
        max_steps: int = DEFAULT_MAX_STEPS,
        name: str = "ode",
        discontinuities=None,
        solver=None,
    ):
        if isinstance(func, ODE):
            for arg, value, expected in (("n_states", n_states, func.n_states), ("n_theta", n_theta, func.n_theta)):
                if value is not None and value != expected:
                    raise ValueError(f"{arg}={value} does not match the ODE's {arg}={expected}")
            if float(t0) not in (0.0, func.t0):
                raise ValueError(f"t0={t0} does not match the ODE's t0={func.t0}")
            ode = func
        else:
            if n_states is None or n_theta is None:
                raise ValueError("n_states and n_theta are required when func is a function")
            ode = ODE(func, n_states, n_theta, t0)
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        self.ode = ode
        self.n_states, self.n_theta = ode.n_states, ode.n_theta
        self.name = name
        control = StepControl(None, rtol, atol, max_steps)
        self.solver = DopriSolver(ode, times, control, label=f"{name} (DOPRI5)")
        # Segments between the restarts: each its own solver (sharing the counts) over its outputs and its end,
        # and the rows of those outputs that are ``times``.
        self.discontinuities = validate_discontinuities(discontinuities, ode.t0, float(self.times[-1]))
        self._discontinuities_argument = discontinuities
        self.segments = []
        self.filter_segments = None  # with ``solver``: the ODE filter's solves (pn_solution.SolutionSegment)
        if solver is not None:
            from pymc_pnode.filtering.structure import STRUCTURES
            from pymc_pnode.pn_solution import solution_segments  # (pn_solution imports this module)
            from pymc_pnode.solve import validate_filter

            solver = validate_filter(solver, STRUCTURES, user="pn.DifferentialEquation")
            diagnostics = SolverDiagnostics.for_filter(f"{name} ({type(solver).__name__}({solver.order}))", None,
                                                       solver)
            self.filter_segments = solution_segments(
                ode, self.times, self.discontinuities, None, solver=solver, rtol=control.rtol, atol=control.atol,
                max_steps=int(control.max_steps), diffusion="local", diagnostics=diagnostics)
        elif self.discontinuities.size:
            for start, end, _, at in split_times(ode.t0, float(self.times[-1]), self.discontinuities, self.times):
                seg_times = np.union1d(at, [end])
                solver = DopriSolver(ode, seg_times, control, t_start=start, diagnostics=self.solver.diagnostics)
                self.segments.append((solver, np.searchsorted(seg_times, at)))

    @property
    def times(self) -> np.ndarray:
        return self.solver.times

    @property
    def diagnostics(self) -> SolverDiagnostics:
        """Steps, rejected steps and failed solves so far (a snapshot over this and worker processes)."""
        if self.filter_segments is not None:
            return self.filter_segments[0].problem.diagnostics.merged()
        return self.solver.diagnostics.merged()

    def __call__(self, y0, theta=None, return_sens: bool = False, jumps=None) -> pt.TensorVariable:
        """The states at ``times``, shape ``(len(times), n_states)``.

        Parameters
        ----------
        y0 : array_like, TensorVariable or list of them
            Initial state at ``t0`` (random variables allowed).
        theta : array_like, TensorVariable or list of them
            Parameters (random variables allowed); omit when ``n_theta == 0``.
        return_sens : bool
            Not supported (``pm.ode`` returned forward sensitivities; gradients here come from the adjoint).
        jumps : array_like or TensorVariable, shape (len(discontinuities), n_states), optional
            The state's jump at each of the ``discontinuities`` (a bolus dose; may be random):
            ``y(t_j⁺) = y(t_j⁻) + jumps[j]``, as in :func:`pymc_pnode.solve`.
        """
        if return_sens:
            raise ValueError("return_sens=True is not supported: gradients come from the discrete adjoint")
        y_start, theta = self.ode.y0_tensor(y0), self.ode.theta_tensor(theta)
        if jumps is not None:
            jumps = declared_restarts(self._discontinuities_argument, jumps, self.ode.t0, float(self.times[-1]),
                                      self.ode.n_states)[1]
        if self.filter_segments is not None:
            from pymc_pnode.pn_solution import solution_tensors

            mean, _, _, log_ok = solution_tensors(self.filter_segments, y_start, theta, jumps)
            return flag_failed_solve(self.name, log_ok, mean)[0]
        if not self.segments:
            ys, _, _, log_ok = DopriSolveOp(self.solver)(y_start, theta)
            return flag_failed_solve(self.name, log_ok, ys)[0]
        parts, log_ok = [], 0.0
        for s, (solver, keep) in enumerate(self.segments):
            ys, _, _, seg_ok = DopriSolveOp(solver)(y_start, theta)
            log_ok = log_ok + seg_ok
            y_start = restart_state(ys[-1], jumps, s)
            parts.append(ys[keep])
        return flag_failed_solve(self.name, log_ok, pt.concatenate(parts))[0]


def flag_failed_solve(name: str, log_ok: pt.TensorVariable, *outputs: pt.TensorVariable) -> list[pt.TensorVariable]:
    """Make a failed solve (``log_ok = [-inf]``) visible: a ``-inf`` potential in a model, NaN outside one.

    Inside a model, ``pm.Potential("<name>_failed", log_ok[0])`` (with a numeric suffix if the name is
    taken) and the outputs unchanged: the solver's placeholders for a failed solve are finite, so the
    model's log-density is ``-inf``, not NaN. Outside a model nothing can carry the flag: the outputs
    become NaN.
    """
    model = pm.Model.get_context(error_if_none=False)
    if model is None:
        return [pt.switch(pt.eq(log_ok[0], 0.0), out, np.nan) for out in outputs]
    base, k = f"{name}_failed", 1
    potential = base
    while potential in model.named_vars:
        potential = f"{base}_{k}"
        k += 1
    pm.Potential(potential, log_ok[0])
    return list(outputs)

