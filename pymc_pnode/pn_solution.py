"""The ODE filter's mean and standard deviation at given times as differentiable PyTensor tensors.

:func:`probabilistic_solution` lets any PyMC likelihood use the numerical uncertainty of an ODE filter
(e.g. a lognormal or Gaussian observation variance inflated by the solver's variance). Values are those of
:func:`pymc_pnode.solve` with ``smooth=False`` at the same settings; gradients with respect to ``y0`` and
``theta`` are exact for the grid each solve chose (forward-mode tangents,
:func:`pymc_pnode.filtering.tangents.filter_tangents`), including the dependence of the calibrated
diffusion on the parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba as nb
import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

from pymc_pnode._jit import readonly, register_object_mode
from pymc_pnode.differential_equation import flag_failed_solve
from pymc_pnode.filtering.tangents import StoredRun, filter_tangents
from pymc_pnode.likelihoods.fenrir import StepControl
from pymc_pnode.ode import ODE
from pymc_pnode.solve import ODEFilter, solve, validate_filter, validate_ode
from pymc_pnode.validation import validate_times

__all__ = ["PNSolutionProblem", "probabilistic_solution"]


@dataclass(frozen=True, eq=False)
class PNSolutionProblem:
    """One ODE filter solve per evaluation, reporting its marginals at ``times`` and their tangents.

    Attributes mirror the arguments of :func:`probabilistic_solution`; ``diffusion`` is ``None`` for the
    calibrated (global quasi-maximum-likelihood) diffusion.
    """

    ode: ODE
    times: np.ndarray
    solver: ODEFilter
    step: float | None
    rtol: float
    atol: float
    max_steps: int
    diffusion: float | None

    @property
    def n_directions(self) -> int:
        return self.ode.n_states + self.ode.n_theta

    def evaluate(self, y0: np.ndarray, theta: np.ndarray):
        """``(mean, std, jac_mean, jac_std, log_ok)``; the Jacobians are ``(T, d, d + n_theta)``.

        A failed solve gives ``log_ok = [-inf]``, the last marginals it reached (the initial state if
        none) in place of the missing ones and zero Jacobians.
        """
        ode, q, d = self.ode, self.solver.order, self.ode.n_states
        n_out, n_dir = self.times.size, self.n_directions
        # writable copies of the right sizes (the generated functions take writable arrays)
        y0 = np.array(y0, dtype=np.float64).reshape(d)
        theta = np.array(theta, dtype=np.float64).reshape(ode.n_theta)
        sol = solve(ode, y0, theta, (ode.t0, float(self.times[-1])), solver=self.solver, step=self.step,
                    rtol=self.rtol, atol=self.atol, save_at=self.times, smooth=False, max_steps=self.max_steps,
                    diffusion="calibrated" if self.diffusion is None else self.diffusion)
        mean, std = np.zeros((n_out, d)), np.zeros((n_out, d))
        jac_mean, jac_std = np.zeros((n_out, d, n_dir)), np.zeros((n_out, d, n_dir))
        if not sol.success:
            reached = sol.mean.shape[0]
            mean[:reached], std[:reached] = sol.mean, sol.std
            mean[reached:] = sol.mean[-1] if reached else y0
            std[reached:] = sol.std[-1] if reached else 0.0
            return mean, std, jac_mean, jac_std, np.array([-np.inf])
        taylor_jac = ode.taylor_functions(q)[1]
        dy, dp = np.empty((q + 1, d, d)), np.empty((q + 1, d, ode.n_theta))
        taylor_jac(y0, ode.t0, theta, dy, dp)
        dmu0 = np.concatenate([dy, dp], axis=2).reshape((q + 1) * d, n_dir)
        run = StoredRun(readonly(sol.run.grid), readonly(sol.run.mu), readonly(sol.run.r), readonly(sol.run.kappa),
                        readonly(sol.out_index, np.int64))
        dmean, dvar, dstat = filter_tangents(  # (EK0 does not call the second derivatives)
            ode.rhs, ode.jac_y, ode.jac_p, ode.hess_yy, ode.hess_yp, theta, run, readonly(dmu0),
            readonly(self.solver.prior.Q_bar_sqrt), self.solver.ek1,
        )
        mean, std = sol.mean, sol.std
        var = std**2
        if self.diffusion is None:
            # σ² = Σ ẑᵀS⁻¹ẑ / (N d) scales every covariance: d var = (d var)|σ² + var dσ²/σ².
            dvar = dvar + var[:, :, None] * (dstat / (sol.stats["n_steps"] * d))[None, None, :]
        positive = std > 0.0
        jac_std[positive] = dvar[positive] / (2.0 * std[positive])[:, None]
        return mean, std, dmean, jac_std, np.array([0.0])


class PNSolutionOp(Op):
    """``(y0, theta) -> (mean, std, jac_mean, jac_std, log_ok)`` of a :class:`PNSolutionProblem`.

    The gradient contracts the cotangents of ``mean`` and ``std`` with the Jacobians (forward-mode
    tangents computed with the values); the Jacobian outputs themselves are not differentiable.
    """

    __props__ = ("problem",)

    def __init__(self, problem: PNSolutionProblem):
        self.problem = problem

    def make_node(self, y0, theta):
        n_out, d, n_dir = self.problem.times.size, self.problem.ode.n_states, self.problem.n_directions
        outputs = [pt.tensor(dtype="float64", shape=(n_out, d)), pt.tensor(dtype="float64", shape=(n_out, d)),
                   pt.tensor(dtype="float64", shape=(n_out, d, n_dir)),
                   pt.tensor(dtype="float64", shape=(n_out, d, n_dir)), pt.tensor(dtype="float64", shape=(1,))]
        return Apply(self, [pt.as_tensor_variable(y0), pt.as_tensor_variable(theta)], outputs)

    def perform(self, node, inputs, output_storage):
        for storage, value in zip(output_storage, self.problem.evaluate(*inputs)):
            storage[0] = value

    def connection_pattern(self, node):
        return [[True, True, False, False, False], [True, True, False, False, False]]

    def L_op(self, inputs, outputs, output_grads):
        total = pt.zeros(self.problem.n_directions)
        for g, jac in zip(output_grads[:2], outputs[2:4]):
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
register_object_mode(
    PNSolutionOp,
    nb.types.Tuple((nb.float64[:, ::1], nb.float64[:, ::1], nb.float64[:, :, ::1], nb.float64[:, :, ::1],
                    nb.float64[::1])),
    _pn_solution_run,
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
    name: str = "pn_solution",
) -> tuple[pt.TensorVariable, pt.TensorVariable]:
    r"""The ODE filter's marginal mean and standard deviation of ``y(t)`` at ``times``, as tensors.

    The same numbers as ``pn.solve(ode, y0, theta, (ode.t0, times[-1]), save_at=times, smooth=False, ...)``
    (``.mean`` and ``.std``): the filtering marginals of an EK0/EK1 ODE filter (Tronarp et al., 2019) at
    the output times, with the diffusion calibrated by quasi-maximum likelihood over the solve (Bosch,
    Hennig & Tronarp, 2021) unless fixed. Gradients with respect to ``y0`` and ``theta`` are exact for
    the grid the solve chose and include the calibrated diffusion's dependence on them.

    Use the standard deviation to account for the numerical error in any likelihood, e.g. with Gaussian
    noise ``y ~ N(mean, σ² + std²)``, or with lognormal noise ``log y ~ N(log mean, σ² + (std / mean)²)``
    (the delta method: the solver's error on the log scale has standard deviation ≈ ``std / mean``).
    For count data use :func:`~pymc_pnode.ChkrebtiiSolution`, whose sampled solutions feed any likelihood.

    Parameters
    ----------
    ode : ODE
    y0, theta : array_like or TensorVariable
        Initial state at ``ode.t0`` and parameters (random variables allowed).
    times : array_like
        Strictly increasing output times, ``times[0] >= ode.t0``, ``times[-1] > ode.t0``.
    solver : EK0 or EK1, default ``EK1(order=3)``
    step : float, optional
        A fixed step (the grid contains every output time); default: error-controlled steps.
    rtol, atol, max_steps
        As in :func:`pymc_pnode.solve`.
    diffusion : float, optional
        A fixed diffusion; default: calibrated per solve.
    name : str
        Prefix of the potential that flags failed solves inside a model (``"<name>_failed"``: ``-inf``
        when the solve fails, 0 otherwise); outside a model a failed solve gives NaN.

    Returns
    -------
    mean, std : TensorVariable
        Shape ``(len(times), n_states)`` each.
    """
    ode = validate_ode(ode)
    solver = validate_filter(solver, user="pn.probabilistic_solution")
    times = validate_times(times, "times", start=ode.t0)
    if times[-1] <= ode.t0:
        raise ValueError(f"times must reach beyond the ODE's t0={ode.t0}")
    fixed = isinstance(diffusion, (int, float)) and not isinstance(diffusion, bool)
    if diffusion is not None and not (fixed and diffusion > 0 and math.isfinite(diffusion)):
        raise ValueError(f"diffusion must be a positive number or None (calibrated), got {diffusion!r}")
    control = StepControl(step, rtol, atol, max_steps)  # validates them now, naming the argument
    if step is not None and step > times[-1] - ode.t0:
        raise ValueError(f"step must not exceed the time span times[-1] - t0 = {times[-1] - ode.t0!r}, got {step!r}")
    problem = PNSolutionProblem(ode, times, solver, control.step, control.rtol, control.atol, int(control.max_steps),
                                None if diffusion is None else float(diffusion))
    y0_t, theta_t = ode.y0_tensor(y0), ode.theta_tensor(theta)
    mean, std, _, _, log_ok = PNSolutionOp(problem)(y0_t, theta_t)
    mean, std = flag_failed_solve(name, log_ok, mean, std)
    return mean, std
