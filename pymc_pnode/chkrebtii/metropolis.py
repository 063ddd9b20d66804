"""Chkrebtii et al.'s Algorithm 2 as a PyMC step method.

Each iteration proposes ``theta' = theta + scale * L eps`` (a Gaussian random walk in PyMC's
unconstrained space, for any parameters, including ``alpha`` and ``lam``) together with fresh
innovations ``z' ~ N(0, I)`` of every Chkrebtii layer, i.e. a new realisation of the probabilistic
solution ``u' | theta'`` simulated by Algorithm 1. Because ``z'`` comes from its prior, the
innovations' density cancels against the proposal density and the log acceptance ratio is::

    [log p(y | u', theta') + log pi(theta')] - [log p(y | u, theta) + log pi(theta)]

the ratio of the paper (the intractable solution density ``p(u | theta, Psi)`` never appears). On
rejection the current realisation is kept. Variables not handled by this step (observation noise,
...) can be sampled by NUTS in a compound step; the proposal and its adaptation are in
:mod:`pymc_pnode.chkrebtii.proposal`.
"""

from __future__ import annotations

from dataclasses import field

import numpy as np
import pymc as pm
from pymc.blocking import RaveledVars
from pymc.pytensorf import compile as compile_pymc
from pymc.pytensorf import join_nonshared_inputs, make_shared_replacements
from pymc.step_methods.arraystep import ArrayStepShared
from pymc.step_methods.compound import Competence, StepMethodState
from pymc.step_methods.state import dataclass_state
from pymc.util import get_value_vars_from_user_vars

from pymc_pnode.chkrebtii.layer import INNOVATIONS_TAG
from pymc_pnode.chkrebtii.proposal import Algorithm2Proposal
from pymc_pnode.sampling.acceptance import metropolis_accept

__all__ = ["ChkrebtiiMetropolis", "innovation_variables"]


def innovation_variables(model, innovations=None) -> list:
    """Value variables of the Chkrebtii layers' innovations (default: all of them in ``model``)."""
    if innovations is None:
        rvs = [rv for rv in model.free_RVs if getattr(rv.tag, INNOVATIONS_TAG, False)]
    else:
        rvs = list(innovations) if isinstance(innovations, (list, tuple)) else [innovations]
    if not rvs:
        raise ValueError("the model has no Chkrebtii innovations (create a ChkrebtiiSolution first)")
    return get_value_vars_from_user_vars(rvs, model)


@dataclass_state
class ChkrebtiiMetropolisState(StepMethodState):
    """Sampling state of :class:`ChkrebtiiMetropolis` (for PyMC's checkpointing)."""

    proposal: Algorithm2Proposal
    tune: bool
    n_theta: int = field(metadata={"frozen": True})


class ChkrebtiiMetropolis(ArrayStepShared):
    """Algorithm 2 of Chkrebtii et al. (2016): Metropolis with a fresh probabilistic solve per proposal.

    Parameters
    ----------
    vars : list of random variables
        Parameters to update by random walk (e.g. ``theta``, ``alpha``, ``lam``, an unknown initial
        value). Innovations of Chkrebtii layers are always refreshed, never random-walked.
    innovations : list of random variables, optional
        The layers' innovation variables to redraw; default: all of them in the model.
    S, scaling, target_accept, adapt_covariance :
        Proposal settings, see :class:`~pymc_pnode.chkrebtii.proposal.Algorithm2Proposal`
        (defaults: identity ``S``, ``scaling=0.1``, acceptance target 0.44 / 0.234, covariance
        adaptation on).
    tune : bool, default True
        Adapt during PyMC's tuning phase.
    model : pymc.Model, optional
        Defaults to the context model.
    rng : RandomGenerator, optional
        Random source.
    initial_point, compile_kwargs, blocked :
        As for PyMC's step methods.

    Raises
    ------
    ValueError
        If the model has no Chkrebtii innovations, ``vars`` holds only innovations or discrete
        variables, or the proposal settings are invalid.
    """

    name = "chkrebtii_metropolis"
    default_blocked = True
    stats_dtypes_shapes = {
        "accept": (np.float64, []),
        "accepted": (np.float64, []),
        "scaling": (np.float64, []),
        "diverged": (bool, []),
    }
    _state_class = ChkrebtiiMetropolisState

    def __init__(
        self,
        vars=None,
        *,
        innovations=None,
        S=None,
        scaling: float = 0.1,
        tune: bool = True,
        target_accept: float | None = None,
        adapt_covariance: bool = True,
        model=None,
        rng=None,
        initial_point=None,
        compile_kwargs: dict | None = None,
        blocked: bool = True,
    ):
        model = pm.modelcontext(model)
        if initial_point is None:
            initial_point = model.initial_point()
        innov_values = innovation_variables(model, innovations)
        innov_rvs = [model.values_to_rvs[v] for v in innov_values]
        if vars is None:
            vars = [v for v in model.value_vars if v not in innov_values]
        else:
            vars = [v for v in get_value_vars_from_user_vars(vars, model) if v not in innov_values]
        if not vars:
            raise ValueError("vars must contain at least one parameter besides the innovations")
        for v in vars:
            if v.dtype in pm.discrete_types:
                raise ValueError(f"ChkrebtiiMetropolis needs continuous variables, {v.name} is discrete")
        self.n_theta = int(sum(np.size(initial_point[v.name]) for v in vars))
        self.n_innov = int(sum(np.size(initial_point[v.name]) for v in innov_values))
        mask = np.r_[np.zeros(self.n_theta, bool), np.ones(self.n_innov, bool)]
        self.proposal = Algorithm2Proposal(mask, S=S, scaling=scaling, target_accept=target_accept,
                                           adapt_covariance=adapt_covariance)
        self.tune = bool(tune)

        all_vars = [*vars, *innov_values]
        # Target without the innovations' prior: it cancels with their independence proposal.
        target = model.logp() - model.logp(vars=innov_rvs)
        shared = make_shared_replacements(initial_point, all_vars, model)
        [out], inarray = join_nonshared_inputs(initial_point, [target], all_vars, shared)
        self.logp_fn = compile_pymc([inarray], out, **(compile_kwargs or {}))
        self.logp_fn.trust_input = True
        self._last = None  # (position, log target) when no other variables can change it
        super().__init__(all_vars, shared, blocked=blocked, rng=rng)

    @property
    def scaling(self) -> float:
        """Current proposal scale."""
        return self.proposal.scaling

    def _log_target(self, q: np.ndarray) -> float:
        try:
            val = float(self.logp_fn(q))
        except (ArithmeticError, ValueError, np.linalg.LinAlgError):
            return -np.inf
        return val if np.isfinite(val) else -np.inf

    def astep(self, q0: RaveledVars) -> tuple[RaveledVars, list[dict]]:
        q0d = q0.data
        # Without other sampled variables the current log target is the one computed last step.
        if not self.shared and self._last is not None and np.array_equal(self._last[0], q0d):
            logp0 = self._last[1]
        else:
            logp0 = self._log_target(q0d)
        q, _ = self.proposal.propose(q0d, self.rng)
        logp1 = self._log_target(q)
        accepted, accept_prob = metropolis_accept(logp1 - logp0 if np.isfinite(logp1) else -np.inf,
                                                  self.rng)
        new, logp_new = (q, logp1) if accepted else (q0d, logp0)
        self._last = (new, logp_new)
        if self.tune:
            self.proposal.adapt(accept_prob, new)
        stats = {
            "accept": accept_prob,
            "accepted": float(accepted),
            "scaling": self.proposal.scaling,
            "diverged": not np.isfinite(logp1),
        }
        return RaveledVars(new, q0.point_map_info), [stats]

    def stop_tuning(self) -> None:
        """End of tuning: the scale is fixed at its dual-averaged value."""
        super().stop_tuning()
        self.proposal.stop_tuning()

    def reset_tuning(self) -> None:
        """Restart the adaptation schedule (PyMC calls this between chains)."""
        self.proposal.reset_tuning()
        self._last = None

    @staticmethod
    def competence(var, has_grad):
        # Only used when requested explicitly.
        return Competence.INCOMPATIBLE
