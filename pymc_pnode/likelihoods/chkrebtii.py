"""Chkrebtii et al.'s probabilistic solution layer (re-exported from :mod:`pymc_pnode.chkrebtii`).

The implementation lives in the :mod:`pymc_pnode.chkrebtii` subpackage, one concept per module;
this module keeps the ``likelihoods`` layout of the design brief.
"""

from pymc_pnode import chkrebtii as _chkrebtii
from pymc_pnode.chkrebtii import *  # noqa: F403 - the subpackage's public names, listed once there

__all__ = list(_chkrebtii.__all__)
