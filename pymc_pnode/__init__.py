"""pymc_pnode: probabilistic numerical ODE solvers as PyMC model terms.

Core: :class:`ODE`, :func:`solve` with the ODE filters :class:`EK0` and :class:`EK1`, and
:class:`ProbabilisticSolution`. Likelihoods: :func:`Fenrir` / :func:`fenrir_loglik`; optimisation:
:func:`fit`, :func:`diffusion_tempering`; sampling: :class:`ParallelTempering`.

Feature modules are imported on first attribute access: each compiles its numba kernels (or loads
them from the disk cache) only when it is used, which keeps ``import pymc_pnode`` fast.
"""

from __future__ import annotations

import importlib

from pymc_pnode import _numba_cache  # noqa: F401  (first: numba's cache keyed on all our sources)
from pymc_pnode._memory import tune_allocator
from pymc_pnode.ode import ODE
from pymc_pnode.priors import IWP
from pymc_pnode.solve import EK0, EK1, PiecewiseSolution, ProbabilisticSolution, solve

tune_allocator()  # freed run arrays stay in the heap for the next evaluation (see pymc_pnode._memory)

__version__ = "0.1.0"

_LAZY = {
    "Fenrir": "pymc_pnode.likelihoods.fenrir",
    "fenrir_loglik": "pymc_pnode.likelihoods.fenrir",
    "fenrir_diagnostics": "pymc_pnode.likelihoods.fenrir",
    "AccuracyWarning": "pymc_pnode.accuracy",
    "SolverDiagnostics": "pymc_pnode.accuracy",
    "fit": "pymc_pnode.optimize",
    "diffusion_tempering": "pymc_pnode.optimize",
    "tempering_schedule": "pymc_pnode.optimize",
    "EstimationResult": "pymc_pnode.estimation",
    "results_table": "pymc_pnode.estimation",
    "posterior_trajectories": "pymc_pnode.trajectories",
    "ParallelTempering": "pymc_pnode.sampling",
    "sample_pt": "pymc_pnode.sampling",
    "rk_solve": "pymc_pnode.classical",
    "DifferentialEquation": "pymc_pnode.differential_equation",
    "probabilistic_solution": "pymc_pnode.pn_solution",
    "irls_fit": "pymc_pnode.classical",
    "PerturbedSolverWeights": "pymc_pnode.classical",
    "profile_intervals": "pymc_pnode.classical",
    "DiscretizationErrorNormal": "pymc_pnode.likelihoods.discretization",
    "chkrebtii_sample": "pymc_pnode.chkrebtii",
    "chkrebtii_covariance": "pymc_pnode.chkrebtii",
    "ChkrebtiiSolution": "pymc_pnode.chkrebtii",
    "ChkrebtiiMetropolis": "pymc_pnode.chkrebtii",
    "DelayODE": "pymc_pnode.chkrebtii",
    "ChkrebtiiReplicaMove": "pymc_pnode.chkrebtii",
}

_SUBPACKAGES = {"baselines", "classical", "chkrebtii", "sampling", "likelihoods", "studies"}

__all__ = ["EK0", "EK1", "IWP", "ODE", "PiecewiseSolution", "ProbabilisticSolution", "solve", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"pymc_pnode.{name}")
    raise AttributeError(f"module 'pymc_pnode' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public API (not the module's own imports, such as ``importlib``)."""
    return sorted({*__all__, *_SUBPACKAGES, "__version__"})
