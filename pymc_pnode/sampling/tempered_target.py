"""Tempered log-densities of the replicas.

The model log-density is split into the prior term ``V = model.varlogp`` and
the data term ``D = model.datalogp`` (observed variables and potentials).
Replica ``k`` targets

* ``V(x; s_k) + beta_k * D(x; s_k)``  (``tempering="likelihood"``, default), or
* ``beta_k * (V(x; s_k) + D(x; s_k))``  (``tempering="posterior"``),

where ``s_k`` are the replica's values of the laddered shared variables.  One
PyTensor function returning ``V``, ``D`` (and optionally their gradients) is
compiled once, with every laddered shared variable turned into an explicit
input so that each replica can pass its own value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt
from pymc.model import Model
from pymc.pytensorf import (
    compile as compile_pymc,
)
from pymc.pytensorf import (
    join_nonshared_inputs,
    make_shared_replacements,
    rewrite_pregrad,
)
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.replace import clone_replace
from pytensor.graph.traversal import graph_inputs

__all__ = ["TEMPERING_MODES", "LogDensityTerms", "ReplicaState", "TemperedTarget"]

TEMPERING_MODES = ("likelihood", "posterior")

# Errors a log-density evaluation may raise at a pathological proposal; they are
# treated as a zero density (rejection) instead of killing the chain.
_NUMERICAL_ERRORS = (ArithmeticError, ValueError, np.linalg.LinAlgError)


@dataclass
class ReplicaState:
    """Position of one replica and its cached log-density terms.

    Attributes
    ----------
    x : numpy.ndarray
        Raveled position in the sampler's (transformed) space.
    var_logp : float
        Prior term ``V(x)``; ``-inf`` if any term was non-finite.
    data_logp : float
        Data term ``D(x)``; ``-inf`` if non-finite.
    var_grad, data_grad : numpy.ndarray or None
        Gradients of ``V`` and ``D`` (only when gradients were compiled).
    """

    x: np.ndarray
    var_logp: float
    data_logp: float
    var_grad: np.ndarray | None = None
    data_grad: np.ndarray | None = None

    @property
    def finite(self) -> bool:
        """Whether both terms are finite (the state has positive density)."""
        return math.isfinite(self.var_logp) and math.isfinite(self.data_logp)


class LogDensityTerms:
    """Compiled evaluator of the prior and data log-density terms.

    Parameters
    ----------
    model : pymc.Model
        The model.
    vars : sequence of TensorVariable
        Continuous value variables sampled by parallel tempering.  All other
        value variables become shared inputs whose values are set by the step
        method from the current point.
    ladder_shared : sequence of SharedVariable
        Shared variables that differ between replicas; they become explicit
        inputs of the compiled function, in this order.
    initial_point : dict
        A model point, used for shapes.
    compute_grads : bool
        Also compile the gradients of both terms w.r.t. the raveled ``vars``.
    compile_kwargs : dict, optional
        Passed to :func:`pymc.pytensorf.compile`.

    Raises
    ------
    ValueError
        If a laddered shared variable does not influence the log-density.
    """

    def __init__(
        self,
        model: Model,
        vars: Sequence[pt.TensorVariable],
        ladder_shared: Sequence[SharedVariable],
        initial_point: dict[str, np.ndarray],
        compute_grads: bool,
        compile_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.compute_grads = bool(compute_grads)
        self.extra_shared = make_shared_replacements(initial_point, vars, model)

        var_term = model.varlogp
        data_term = pt.as_tensor_variable(model.datalogp)
        outputs = [var_term, data_term]
        if self.compute_grads:
            for term in (var_term, data_term):
                grads = pytensor.grad(
                    rewrite_pregrad(term), list(vars), disconnected_inputs="ignore"
                )
                outputs.append(pt.concatenate([pt.as_tensor_variable(g).ravel() for g in grads]))

        outputs, flat_input = join_nonshared_inputs(
            point=initial_point, outputs=outputs, inputs=list(vars), shared_inputs=self.extra_shared
        )
        flat_input.name = "pt_replica_position"

        present = set(graph_inputs(outputs))
        ladder_inputs = []
        for shared in ladder_shared:
            if shared not in present:
                raise ValueError(
                    f"Shared variable {shared.name or shared!r} of shared_ladder does not enter "
                    "the model's log-density, so laddering it would have no effect."
                )
            ladder_inputs.append(shared.type(name=f"{shared.name or 'shared'}_replica_value"))
        if ladder_inputs:
            outputs = clone_replace(outputs, replace=dict(zip(ladder_shared, ladder_inputs)))

        self.ladder_dtypes = tuple(inp.type.dtype for inp in ladder_inputs)
        self.ndim = int(sum(np.asarray(initial_point[v.name]).size for v in vars))
        self.dtype = flat_input.type.dtype
        kwargs = dict(compile_kwargs or {})
        self._fn = compile_pymc([flat_input, *ladder_inputs], outputs, **kwargs)
        self._fn.trust_input = True

    def evaluate(
        self, x: np.ndarray, shared_values: Sequence[np.ndarray], safe: bool = True
    ) -> ReplicaState:
        """Evaluate the terms at ``x`` for one replica's shared values.

        Parameters
        ----------
        x : numpy.ndarray
            Raveled position.
        shared_values : sequence of numpy.ndarray
            Values for the laddered shared variables (already cast to their dtypes).
        safe : bool, default True
            Turn numerical exceptions into a ``-inf`` state instead of raising.

        Returns
        -------
        ReplicaState
            Non-finite values (and non-finite gradients) are mapped to
            ``var_logp = data_logp = -inf`` so the state is always rejected.
        """
        x = np.asarray(x, dtype=self.dtype)
        try:
            out = self._fn(x, *shared_values)
        except _NUMERICAL_ERRORS:
            if not safe:
                raise
            return ReplicaState(x, -np.inf, -np.inf)
        var_logp = float(out[0])
        data_logp = float(out[1])
        var_grad = data_grad = None
        valid = math.isfinite(var_logp) and math.isfinite(data_logp)
        if self.compute_grads:
            var_grad = np.array(out[2], dtype=np.float64)
            data_grad = np.array(out[3], dtype=np.float64)
            valid = valid and bool(np.isfinite(var_grad).all() and np.isfinite(data_grad).all())
        if not valid:
            return ReplicaState(x, -np.inf, -np.inf, var_grad, data_grad)
        return ReplicaState(x, var_logp, data_logp, var_grad, data_grad)


class TemperedTarget:
    """The tempered density of one replica.

    Parameters
    ----------
    terms : LogDensityTerms
        Compiled evaluator.
    beta : float
        Inverse temperature in ``(0, 1]``.
    shared_values : tuple of numpy.ndarray
        This replica's values of the laddered shared variables.
    tempering : {"likelihood", "posterior"}
        Whether ``beta`` multiplies only the data term or the whole density.
    """

    def __init__(
        self,
        terms: LogDensityTerms,
        beta: float,
        shared_values: tuple[np.ndarray, ...],
        tempering: str = "likelihood",
    ) -> None:
        self.terms = terms
        self.beta = float(beta)
        self.shared_values = shared_values
        self.temper_prior = tempering == "posterior"

    @property
    def has_grad(self) -> bool:
        """Whether :meth:`grad` is available."""
        return self.terms.compute_grads

    def logp(self, state: ReplicaState) -> float:
        """Tempered log-density of a state evaluated with this replica's shared values."""
        if not state.finite:
            return -np.inf
        if self.temper_prior:
            return self.beta * (state.var_logp + state.data_logp)
        return state.var_logp + self.beta * state.data_logp

    def grad(self, state: ReplicaState) -> np.ndarray:
        """Gradient of :meth:`logp` (requires compiled gradients)."""
        if state.var_grad is None or state.data_grad is None:
            raise RuntimeError("Gradients were not compiled for this parallel tempering sampler.")
        if self.temper_prior:
            return self.beta * (state.var_grad + state.data_grad)
        return state.var_grad + self.beta * state.data_grad

    def evaluate(self, x: np.ndarray) -> ReplicaState:
        """Evaluate the model terms at ``x`` with this replica's shared values."""
        return self.terms.evaluate(x, self.shared_values)
