"""Algorithm 2 inside parallel tempering: a within-replica move for ``ParallelTempering``.

Chkrebtii et al. sample multimodal posteriors (JAK-STAT, Lane-Emden) with parallel tempering whose
within-chain moves re-simulate the solution with every parameter proposal. This move does that for
one replica: random walk on the parameters, fresh ``N(0, 1)`` innovations for the Chkrebtii layers,
accepted with the replica's tempered density corrected by the innovations' proposal density (which
cancels their prior exactly under likelihood tempering, giving the paper's ratio).
"""

from __future__ import annotations

import copy

import numpy as np
import pymc as pm
from pymc.util import get_value_vars_from_user_vars

from pymc_pnode.chkrebtii.metropolis import innovation_variables
from pymc_pnode.chkrebtii.proposal import Algorithm2Proposal
from pymc_pnode.sampling.acceptance import metropolis_accept
from pymc_pnode.sampling.moves import ReplicaMove

__all__ = ["ChkrebtiiReplicaMove"]


class ChkrebtiiReplicaMove(ReplicaMove):
    """Algorithm-2 move of one parallel-tempering replica.

    Parameters
    ----------
    vars : list of random variables, optional
        Exactly the ``vars`` given to ``ParallelTempering`` (default: all continuous free
        variables, its default too); they must include the layers' innovations.
    innovations : list of random variables, optional
        Innovation variables to redraw (default: all Chkrebtii innovations in the model).
    S, scaling, target_accept, adapt_covariance :
        See :class:`~pymc_pnode.chkrebtii.proposal.Algorithm2Proposal`.
    model : pymc.Model, optional
        Defaults to the context model.

    Examples
    --------
    >>> move = ChkrebtiiReplicaMove()                                     # doctest: +SKIP
    >>> step = pn.sampling.ParallelTempering(n_replicas=6, move=move)     # doctest: +SKIP
    """

    requires_grad = False

    def __init__(self, vars=None, *, innovations=None, S=None, scaling: float = 0.1,
                 target_accept: float | None = None, adapt_covariance: bool = True, model=None):
        model = pm.modelcontext(model)
        point = model.initial_point()
        value_vars = (list(model.continuous_value_vars) if vars is None
                      else get_value_vars_from_user_vars(vars, model))
        innov = set(innovation_variables(model, innovations))
        mask = np.concatenate([np.full(np.size(point[v.name]), v in innov, dtype=bool)
                               for v in value_vars])
        self._template = Algorithm2Proposal(mask, S=S, scaling=scaling,
                                            target_accept=target_accept,
                                            adapt_covariance=adapt_covariance)
        self.proposal = copy.deepcopy(self._template)
        self.tuning = True

    def setup(self, ndim: int, beta: float) -> None:
        """Check the dimension; hot replicas start with a wider random walk (``beta^{-1/2}``, at most 10x)."""
        if ndim != self._template.innovation_mask.size:
            raise ValueError(
                f"ChkrebtiiReplicaMove was built for {self._template.innovation_mask.size} entries "
                f"but the replica has {ndim}; pass the same vars as to ParallelTempering"
            )
        self.proposal = copy.deepcopy(self._template)
        self.proposal.scaling *= min(float(beta) ** -0.5, 10.0)

    def step(self, state, target, rng: np.random.Generator, tune: bool):
        """One Algorithm-2 update of the replica (see :meth:`ReplicaMove.step`)."""
        x_new, log_q = self.proposal.propose(state.x, rng)
        proposal = target.evaluate(x_new)
        log_ratio = target.logp(proposal) - target.logp(state) - log_q
        accepted, accept_prob = metropolis_accept(log_ratio, rng)
        new_state = proposal if accepted else state
        if tune:
            self.proposal.adapt(accept_prob, new_state.x)
        return new_state, accept_prob

    def stop_tuning(self) -> None:
        """Fix the scale at its dual-averaged value."""
        self.proposal.stop_tuning()

    @property
    def scale(self) -> float:
        """Current random-walk scale."""
        return self.proposal.scaling
