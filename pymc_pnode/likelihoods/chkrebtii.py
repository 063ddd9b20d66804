"""Chkrebtii et al.'s probabilistic solution layer (re-exported from :mod:`pymc_pnode.chkrebtii`).

The implementation lives in the :mod:`pymc_pnode.chkrebtii` subpackage, one concept per module;
this module keeps the ``likelihoods`` layout of the design brief.
"""

from pymc_pnode.chkrebtii import (
    ChkrebtiiMetropolis,
    ChkrebtiiReplicaMove,
    ChkrebtiiSolution,
    DelayODE,
    chkrebtii_sample,
)

__all__ = [
    "ChkrebtiiMetropolis",
    "ChkrebtiiReplicaMove",
    "ChkrebtiiSolution",
    "DelayODE",
    "chkrebtii_sample",
]
