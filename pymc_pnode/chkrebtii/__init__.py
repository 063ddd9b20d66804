"""Chkrebtii et al. (2016)'s probabilistic ODE solution as a PyMC layer.

Modules, one concept each:

* :mod:`~pymc_pnode.chkrebtii.kernels` -- closed-form integrated covariance kernels;
* :mod:`~pymc_pnode.chkrebtii.structure` -- the covariance algebra of Algorithm 1 (O(N) for the
  uniform kernel) with exact length-scale tangents;
* :mod:`~pymc_pnode.chkrebtii.recursion` -- the nonlinear recursion and its adjoint (numba);
* :mod:`~pymc_pnode.chkrebtii.delay` -- :class:`DelayODE` (constant delay, history, forcing);
* :mod:`~pymc_pnode.chkrebtii.problem` -- settings validation shared by sampler and layer;
* :mod:`~pymc_pnode.chkrebtii.sampler` -- :func:`chkrebtii_sample` (Algorithm 1 draws);
* :mod:`~pymc_pnode.chkrebtii.ops` -- PyTensor Ops with gradients and numba dispatch;
* :mod:`~pymc_pnode.chkrebtii.layer` -- :func:`ChkrebtiiSolution` (PyMC model block);
* :mod:`~pymc_pnode.chkrebtii.proposal` -- the Algorithm-2 proposal and its adaptation;
* :mod:`~pymc_pnode.chkrebtii.metropolis` -- :class:`ChkrebtiiMetropolis` (Algorithm 2);
* :mod:`~pymc_pnode.chkrebtii.tempering` -- :class:`ChkrebtiiReplicaMove` (Algorithm 2 within
  parallel tempering).
"""

from pymc_pnode.chkrebtii.delay import DelayODE
from pymc_pnode.chkrebtii.layer import ChkrebtiiSolution
from pymc_pnode.chkrebtii.metropolis import ChkrebtiiMetropolis
from pymc_pnode.chkrebtii.sampler import chkrebtii_covariance, chkrebtii_sample
from pymc_pnode.chkrebtii.tempering import ChkrebtiiReplicaMove

__all__ = [
    "ChkrebtiiMetropolis",
    "ChkrebtiiReplicaMove",
    "ChkrebtiiSolution",
    "DelayODE",
    "chkrebtii_covariance",
    "chkrebtii_sample",
]
