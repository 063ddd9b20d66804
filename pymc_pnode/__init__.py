"""pymc_pnode: probabilistic numerical ODE solvers as PyMC model terms.

Public API: :class:`ODE`, :func:`solve` with the ODE filters :class:`EK0` and :class:`EK1`, and
:class:`ProbabilisticSolution`.
"""

from pymc_pnode.likelihoods.fenrir import Fenrir, fenrir_loglik
from pymc_pnode.ode import ODE
from pymc_pnode.optimize import diffusion_tempering, fit, tempering_schedule
from pymc_pnode.priors import IWP
from pymc_pnode.sampling import ParallelTempering, sample_pt
from pymc_pnode.solve import EK0, EK1, ProbabilisticSolution, solve
from pymc_pnode.trajectories import posterior_trajectories

__version__ = "0.1.0"

__all__ = [
    "EK0",
    "EK1",
    "IWP",
    "ODE",
    "Fenrir",
    "ParallelTempering",
    "ProbabilisticSolution",
    "diffusion_tempering",
    "fenrir_loglik",
    "fit",
    "posterior_trajectories",
    "sample_pt",
    "solve",
    "tempering_schedule",
]
