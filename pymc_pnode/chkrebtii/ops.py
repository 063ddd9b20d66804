"""PyTensor Ops of the Chkrebtii layer: covariance structure (exact ``lam``-tangent) and recursion.

* :class:`CovarianceStructureOp` maps the length-scales to the covariance structure of
  :mod:`pymc_pnode.chkrebtii.structure` (at ``alpha = 1``). Its gradient contracts the output
  cotangents with forward-mode ``lam``-tangents computed by :class:`CovarianceTangentOp`; with a
  constant ``lam`` PyTensor constant-folds the whole structure at compile time.
* :class:`RecursionOp` is the nonlinear recursion (step-ahead draws, interrogations, final draw),
  with the reverse-mode gradient :class:`RecursionGradOp` with respect to ``y0``, ``theta``, the
  innovations and the structure arrays.

``alpha`` enters between the two in PyTensor: every weight is ``alpha``-free and every standard
deviation scales as ``alpha^{-1/2}`` (``alpha`` only scales the prior covariance of Algorithm 1 of
Chkrebtii et al., 2016).
"""

from __future__ import annotations

import numba as nb
import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

from pymc_pnode._jit import as_readonly, readonly, register_numba
from pymc_pnode.chkrebtii.problem import Discretisation, field_spec
from pymc_pnode.chkrebtii.recursion import Innovations, Setting, backward, forward
from pymc_pnode.chkrebtii.structure import Weights, covariance_structure, stacked_structure

__all__ = ["CovarianceStructureOp", "CovarianceTangentOp", "RecursionGradOp", "RecursionOp"]

_STRUCT_NDIMS = (3, 2, 3, 2, 3, 3)  # lb, ginf, gn, sd, hh, lt




class _StructureOpBase(Op):
    """An Op of the length-scales ``lam`` (C,) for a fixed :class:`Discretisation`."""

    __props__ = ("disc",)

    def __init__(self, disc: Discretisation):
        self.disc = disc

    def _apply(self, lam, with_bandwidth: bool) -> Apply:
        """The node: the six weight arrays of :class:`Weights` (and the bandwidths)."""
        lam = pt.as_tensor_variable(lam).astype("float64")
        if lam.ndim != 1:
            raise ValueError(f"lam must be a 1-d tensor here, got ndim={lam.ndim}")
        outs = [pt.tensor(dtype="float64", shape=(None,) * nd) for nd in _STRUCT_NDIMS]
        if with_bandwidth:
            outs.append(pt.tensor(dtype="int64", shape=(None,)))
        return Apply(self, [lam], outs)


class CovarianceStructureOp(_StructureOpBase):
    """``lam (C,) -> (lb, ginf, gn, sd, hh, lt, w)`` for a fixed :class:`Discretisation`."""

    def make_node(self, lam):
        return self._apply(lam, True)

    def perform(self, node, inputs, output_storage):
        st = covariance_structure(self.disc, inputs[0])
        for store, arr in zip(output_storage, (*st.weights, st.w)):
            store[0] = arr

    def L_op(self, inputs, outputs, output_grads):
        (lam,) = inputs
        tangents = CovarianceTangentOp(self.disc)(lam)
        total = pt.zeros_like(lam)
        for g, t in zip(output_grads[:6], tangents):
            if isinstance(g.type, DisconnectedType):
                continue
            total = total + (g * t).reshape((t.shape[0], -1)).sum(axis=1)
        return [total]

    def connection_pattern(self, node):
        return [[True] * 6 + [False]]


class CovarianceTangentOp(_StructureOpBase):
    """``lam -> d(lb, ginf, gn, sd, hh, lt)/d lam`` (component ``c`` with respect to ``lam[c]``)."""

    def make_node(self, lam):
        return self._apply(lam, False)

    def perform(self, node, inputs, output_storage):
        st = covariance_structure(self.disc, inputs[0], tangent=True)
        for store, arr in zip(output_storage, st.tangents):
            store[0] = arr

    def grad(self, inputs, output_grads):
        raise NotImplementedError("second derivatives with respect to lam are not implemented")


class _RecursionBase(Op):
    """Shared set-up: the vector-field adapter is rebuilt lazily (compiled functions do not pickle)."""

    __props__ = ("ode", "disc", "draw", "cmap")

    def __init__(self, ode, disc: Discretisation, draw: bool, cmap: tuple):
        self.ode = ode
        self.disc = disc
        self.draw = bool(draw)
        self.cmap = tuple(int(c) for c in cmap)
        self._spec = None
        self._setting = None

    @property
    def spec(self):
        if self._spec is None:
            self._spec = field_spec(self.ode, self.disc.grid)
        return self._spec

    @property
    def setting(self) -> Setting:
        """The recursion's :class:`~pymc_pnode.chkrebtii.recursion.Setting` without the bandwidths (an input)."""
        if self._setting is None:
            self._setting = self.spec.setting(np.zeros(0, np.int64), self.cmap, self.disc.grid, self.draw)
        return self._setting

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_spec"] = state["_setting"] = None
        return state

    @staticmethod
    def _inputs(values) -> list:
        """``(y0, theta, z, zt, lb, ginf, gn, sd, hh, lt, w)`` as tensors of the recursion's dtypes and ranks."""
        names = ("y0", "theta", "z", "zt", *Weights._fields)
        ndims = (1, 1, 2, 2, 3, 2, 3, 2, 3, 3)
        f64 = [pt.as_tensor_variable(x).astype("float64") for x in values[:10]]
        for var, nd, nm in zip(f64, ndims, names):
            if var.ndim != nd:
                raise ValueError(f"{nm} must have ndim={nd}, got {var.ndim}")
        return [*f64, pt.as_tensor_variable(values[10]).astype("int64")]

    def _kernel_args(self, inputs) -> tuple:
        """The recursion's arguments after its six functions: ``(setting, weights, innovations)``."""
        arrays = [readonly(x) for x in inputs[:10]]
        setting = Setting(readonly(inputs[10], np.int64), *self.setting[1:])  # (faster than _replace)
        return setting, Weights(*arrays[4:]), Innovations(*arrays[:4])


class RecursionOp(_RecursionBase):
    """``(y0, theta, z, zT, structure...) -> (U (T, d), failed)``; ``failed = 1`` if the solve diverged."""

    def make_node(self, y0, theta, z, zt, lb, ginf, gn, sd, hh, lt, w):
        inputs = self._inputs((y0, theta, z, zt, lb, ginf, gn, sd, hh, lt, w))
        outs = [pt.matrix(dtype="float64"), pt.scalar(dtype="float64")]
        return Apply(self, inputs, outs)

    def perform(self, node, inputs, output_storage):
        out, _, _, _, _, status = forward.entry_point(*self.spec.functions, *self._kernel_args(inputs))
        output_storage[0][0] = out
        output_storage[1][0] = np.asarray(float(status != 0))

    def infer_shape(self, fgraph, node, shapes):
        return [(len(self.disc.times), node.inputs[0].shape[0]), ()]

    def L_op(self, inputs, outputs, output_grads):
        ubar = output_grads[0]
        if isinstance(ubar.type, DisconnectedType):
            ubar = pt.zeros_like(outputs[0])
        grads = RecursionGradOp(self.ode, self.disc, self.draw, self.cmap)(*inputs, ubar)
        return [*grads, DisconnectedType()()]

    def connection_pattern(self, node):
        return [[True, False]] * 10 + [[False, False]]


class RecursionGradOp(_RecursionBase):
    """Cotangents of ``(y0, theta, z, zT, lb, ginf, gn, sd, hh, lt)`` given the output cotangent."""

    def make_node(self, y0, theta, z, zt, lb, ginf, gn, sd, hh, lt, w, ubar):
        inputs = self._inputs((y0, theta, z, zt, lb, ginf, gn, sd, hh, lt, w))
        inputs.append(pt.as_tensor_variable(ubar).astype("float64"))
        outs = [x.type() for x in inputs[:10]]
        return Apply(self, inputs, outs)

    def perform(self, node, inputs, output_storage):
        y0b, thb, zb, ztb, weights_bar = backward.entry_point(*self.spec.functions,
                                                              *self._kernel_args(inputs[:-1]), readonly(inputs[-1]))
        for store, g in zip(output_storage, (y0b, thb, zb, ztb, *weights_bar)):
            store[0] = g

    def infer_shape(self, fgraph, node, shapes):
        return list(shapes[:10])

    def grad(self, inputs, output_grads):
        raise NotImplementedError("second derivatives of the Chkrebtii recursion are not implemented")


# Under the numba backend (the default linker, and nutpie) the recursion Ops compile into the graph function,
# where the vector field's callback addresses are compile-time constants.
def _structure_function(op, tangent: bool):
    from pytensor.link.numba.dispatch.basic import numba_njit

    nn, span, times, kind, noise, jitter = op.disc.structure_arguments()

    @numba_njit
    def chkrebtii_structure(lam):
        return stacked_structure(nn, span, times, as_readonly(np.ascontiguousarray(lam)), kind, noise, jitter,
                                 tangent)

    return chkrebtii_structure


def _structure_values(op):
    structure = _structure_function(op, False)

    def chkrebtii_structure_values(lam):  # one output per Op output
        v, w, _ = structure(lam)
        return v.lb, v.ginf, v.gn, v.sd, v.hh, v.lt, w

    return chkrebtii_structure_values


def _structure_tangent(op):
    structure = _structure_function(op, True)

    def chkrebtii_structure_tangent(lam):
        _, _, t = structure(lam)
        return t.lb, t.ginf, t.gn, t.sd, t.hh, t.lt

    return chkrebtii_structure_tangent


@nb.njit(inline="always")
def _bundles(fixed, inputs):
    """The recursion's bundles from the Op's inputs inside the compiled graph (its arrays typed read-only)."""
    y0, theta, z, zt, lb, ginf, gn, sd, hh, lt, w = inputs
    _, cmap, grid, draw, lag_mode, tau_index, tau_fixed, forcing = fixed
    setting = Setting(as_readonly(np.ascontiguousarray(w)), cmap, grid, draw, lag_mode, tau_index, tau_fixed,
                      forcing)
    c = np.ascontiguousarray
    weights = Weights(as_readonly(c(lb)), as_readonly(c(ginf)), as_readonly(c(gn)), as_readonly(c(sd)),
                      as_readonly(c(hh)), as_readonly(c(lt)))
    innovations = Innovations(as_readonly(c(y0)), as_readonly(c(theta)), as_readonly(c(z)), as_readonly(c(zt)))
    return setting, weights, innovations


def _recursion(op):
    (rhs, jac_y, jac_p, hist, hist_jp, hist_dt), fixed = op.spec.functions, op.setting

    def chkrebtii_recursion(y0, theta, z, zt, lb, ginf, gn, sd, hh, lt, w):  # the Op's inputs
        setting, weights, innovations = _bundles(fixed, (y0, theta, z, zt, lb, ginf, gn, sd, hh, lt, w))
        out, _, _, _, _, status = forward(rhs, jac_y, jac_p, hist, hist_jp, hist_dt, setting, weights, innovations)
        return out, np.asarray(1.0 if status != 0 else 0.0)

    return chkrebtii_recursion


def _recursion_grad(op):
    (rhs, jac_y, jac_p, hist, hist_jp, hist_dt), fixed = op.spec.functions, op.setting

    def chkrebtii_recursion_grad(y0, theta, z, zt, lb, ginf, gn, sd, hh, lt, w, ubar):  # the Op's inputs
        setting, weights, innovations = _bundles(fixed, (y0, theta, z, zt, lb, ginf, gn, sd, hh, lt, w))
        y0b, thb, zb, ztb, wb = backward(rhs, jac_y, jac_p, hist, hist_jp, hist_dt, setting, weights, innovations,
                                        as_readonly(np.ascontiguousarray(ubar)))
        return y0b, thb, zb, ztb, wb.lb, wb.ginf, wb.gn, wb.sd, wb.hh, wb.lt

    return chkrebtii_recursion_grad


register_numba(CovarianceStructureOp, _structure_values)
register_numba(CovarianceTangentOp, _structure_tangent)
register_numba(RecursionOp, _recursion)
register_numba(RecursionGradOp, _recursion_grad)
