"""A running rounding-error bound of a vector field's expression graph, for the EK0's rounding floor.

Near an equilibrium a computed ``f(ξ)`` is the rounding error of terms that cancel, and an ODE residual made of it
says nothing about the solution. The filters' rounding floor of the local diffusion
(:func:`~pymc_pnode.filtering.calibration.rounding_kappa`) needs the scale of those terms. The EK1 takes it from its
Jacobian (``Σ_a |L_ka ξ_a|``); the EK0 has no Jacobian, and computing one per step would cost ``d²``. Instead the
field's graph is walked once, and every scalar operation ``w = g(u_1, …, u_m)`` gets the first-order bound of
running error analysis (Higham, 2002, *Accuracy and Stability of Numerical Algorithms*, §3.3; Wilkinson's
rounding model ``fl(a ∘ b) = (a ∘ b)(1 + δ)``, ``|δ| ≤ ε``):

``T(w) = Σ_i |∂g/∂u_i| T(u_i) + r(w)``, with ``T(y_i) = |y_i|`` (the rounding of the state itself), ``T = 0`` for
the time, the parameters and constants, and ``r(w)`` the operation's own rounding: ``Σ_i |u_i|`` for a sum (it bounds
every partial sum), ``(m − 1) |w|`` for a product of ``m`` factors and ``|w|`` otherwise. Selections (``switch``)
select the bounds; comparisons and other piecewise-constant operations have none. ``ε T(f_k)`` bounds the error
of the computed ``f_k`` to first order. Generated as native code like the field (:attr:`pymc_pnode.ODE.term_scale`),
at the cost of a few evaluations of ``f``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.null_type import NullType

from pymc_pnode._codegen import UnsupportedOperation

__all__ = ["VERSION", "term_magnitudes"]

# Part of the generated module's cache key: changed rules never meet a stale module.
VERSION = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]

_ONE = pt.constant(1.0, dtype="float64")
# Operations whose value is exact or piecewise constant in their inputs: no rounding error to carry.
_PIECEWISE_CONSTANT = {"GT", "GE", "LT", "LE", "EQ", "NEQ", "AND", "OR", "Invert", "IsNan", "IsInf", "Floor", "Ceil",
                       "Sign", "IntDiv", "RoundHalfToEven", "RoundHalfAwayFromZero", "Trunc"}
_PASS_THROUGH = {"Identity", "Cast"}


def _is_zero(var: Variable) -> bool:
    return isinstance(var, Constant) and float(var.data) == 0.0


def _sum(terms: Sequence[Variable]) -> Variable:
    terms = [t for t in terms if not _is_zero(t)]
    if not terms:
        return pt.constant(0.0, dtype="float64")
    return pt.add(*terms) if len(terms) > 1 else terms[0]


def _local_partials(node) -> list[Variable | None]:
    """``∂w/∂u_i`` of one scalar operation (None where it has none: disconnected or not differentiable)."""
    grads = node.op.L_op(node.inputs, node.outputs, [_ONE])
    return [None if isinstance(g.type, (NullType, DisconnectedType)) else g for g in grads]


def _elemwise_bound(node, bounds: dict[Variable, Variable]) -> Variable:
    scalar_op = node.op.scalar_op
    name = type(scalar_op).__name__
    inputs, (out,) = node.inputs, node.outputs
    in_bounds = [bounds[u] for u in inputs]
    if name in _PIECEWISE_CONSTANT:
        return pt.constant(0.0, dtype="float64")
    if name.startswith("Convert") or name in _PASS_THROUGH:
        return in_bounds[0]
    if name == "Second":
        return in_bounds[1]
    if name == "Switch":
        if _is_zero(in_bounds[1]) and _is_zero(in_bounds[2]):
            return in_bounds[1]
        return pt.switch(inputs[0], in_bounds[1], in_bounds[2])
    if name == "Composite":
        raise UnsupportedOperation("a fused composite operation has no rounding bound")
    carried = []
    if any(not _is_zero(b) for b in in_bounds):
        for partial, b in zip(_local_partials(node), in_bounds):
            if partial is not None and not _is_zero(b):
                carried.append(pt.abs(partial) * b)
    if name in ("Add", "Sub"):
        own = [pt.abs(u) for u in inputs if not isinstance(u, Constant) or float(u.data) != 0.0]
    elif name == "Mul":
        own = [pt.abs(out) * float(len(inputs) - 1)]
    elif name == "Neg" or name == "Abs":
        own = []  # exact
    else:
        own = [pt.abs(out)]
    return _sum([*carried, *own])


def term_magnitudes(states: Sequence[Variable], others: Sequence[Variable], outputs: Sequence[Variable],
                    ) -> list[Variable]:
    """Graphs of ``T(f_k)`` (module docstring) for the scalar ``outputs`` of a graph of ``states`` (``T = |y_i|``)
    and ``others`` (time and parameters, ``T = 0``).

    Raises
    ------
    UnsupportedOperation
        For an operation on non-scalar values or a fused composite.
    """
    zero = pt.constant(0.0, dtype="float64")
    bounds: dict[Variable, Variable] = {y: pt.abs(y) for y in states}
    bounds.update({v: zero for v in others})
    fgraph = FunctionGraph([*states, *others], list(outputs), clone=False)
    for node in fgraph.toposort():
        for u in node.inputs:
            if u not in bounds:  # a constant
                bounds[u] = zero
        kind = type(node.op).__name__
        if kind == "Elemwise" and len(node.outputs) == 1 and node.outputs[0].ndim == 0:
            bounds[node.outputs[0]] = _elemwise_bound(node, bounds)
        elif kind in ("DimShuffle", "ScalarFromTensor", "TensorFromScalar") and node.outputs[0].ndim == 0:
            bounds[node.outputs[0]] = bounds[node.inputs[0]]
        else:
            raise UnsupportedOperation(f"operation {node.op} has no scalar rounding bound")
    return [bounds.get(o, zero) for o in outputs]
