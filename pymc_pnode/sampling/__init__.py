"""Samplers for multimodal posteriors: parallel tempering for PyMC models."""

from pymc_pnode.sampling.diffusion_ladder import diffusion_ladder, geometric_diffusions
from pymc_pnode.sampling.hmc import HamiltonianMove
from pymc_pnode.sampling.ladder import geometric_betas
from pymc_pnode.sampling.moves import AdaptiveMove, ReplicaMove
from pymc_pnode.sampling.parallel_tempering import ParallelTempering
from pymc_pnode.sampling.random_walk import RandomWalkMetropolis
from pymc_pnode.sampling.replica_dims import label_replica_dims
from pymc_pnode.sampling.sample_pt import sample_pt
from pymc_pnode.sampling.tempered_target import ReplicaState, TemperedTarget

__all__ = [
    "AdaptiveMove",
    "HamiltonianMove",
    "ParallelTempering",
    "RandomWalkMetropolis",
    "ReplicaMove",
    "ReplicaState",
    "TemperedTarget",
    "diffusion_ladder",
    "geometric_betas",
    "geometric_diffusions",
    "label_replica_dims",
    "sample_pt",
]
