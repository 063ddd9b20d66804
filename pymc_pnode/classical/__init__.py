"""Classical estimators built on fixed-step solvers with exact discrete adjoints.

- :mod:`~pymc_pnode.classical.rk`: Euler, Heun, midpoint, RK4 and Störmer–Verlet solvers, their
  discrete adjoints, and the differentiable PyTensor expression :func:`rk_solve`.
- :mod:`~pymc_pnode.classical.isotonic`: the closed-form isotonic weight update of Matsuda & Miyatake.
- :mod:`~pymc_pnode.classical.irls`: the IRLS estimator :func:`irls_fit` (and its fixed-weight baseline).
- :mod:`~pymc_pnode.classical.profile`: profile-likelihood confidence intervals for IRLS fits.
"""

from pymc_pnode.classical.irls import IRLSHistory, IRLSResult, PerturbedSolverWeights, irls_fit
from pymc_pnode.classical.isotonic import isotonic_weights, weight_objective
from pymc_pnode.classical.profile import CHI2_1_95, ProfileIntervals, profile_intervals
from pymc_pnode.classical.rk import METHODS, FixedStepSolver, rk_solve

__all__ = [
    "CHI2_1_95",
    "METHODS",
    "FixedStepSolver",
    "IRLSHistory",
    "IRLSResult",
    "PerturbedSolverWeights",
    "ProfileIntervals",
    "irls_fit",
    "isotonic_weights",
    "profile_intervals",
    "rk_solve",
    "weight_objective",
]
