"""Classical baseline estimators for comparison with the probabilistic-numerical methods.

- :func:`rk_least_squares`: single-shooting least squares with an adaptive scipy solver (implicit
  methods for stiff problems) and exact forward-sensitivity gradients, L-BFGS-B in a box/log space.
- :func:`multiple_shooting`: multiple shooting with nodes at the observation times, scalarised
  continuity constraints and adjoint gradients (Aydogmus & Tor), or the classical vector
  constraints with forward sensitivities; SQP by scipy's SLSQP.
- :func:`direct_method`: alternating minimisation over filtered states and parameters of an
  Adams–Bashforth discretisation residual (Raziperchikolaei & Bhat).

All return an :class:`EstimationResult`; :func:`results_table` puts several side by side.
"""

from pymc_pnode.baselines.direct_method import (
    DirectMethodObjective,
    adams_bashforth_predict,
    direct_method,
)
from pymc_pnode.baselines.least_squares import least_squares_objective, rk_least_squares
from pymc_pnode.baselines.multiple_shooting import (
    MultipleShootingProblem,
    multiple_shooting,
    shooting_trajectories,
)
from pymc_pnode.baselines.sensitivities import ODESolution, adjoint_gradient, integrate
from pymc_pnode.estimation import EstimationResult, results_table

__all__ = [
    "DirectMethodObjective",
    "EstimationResult",
    "MultipleShootingProblem",
    "ODESolution",
    "adams_bashforth_predict",
    "adjoint_gradient",
    "direct_method",
    "integrate",
    "least_squares_objective",
    "multiple_shooting",
    "results_table",
    "rk_least_squares",
    "shooting_trajectories",
]
