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

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

from pymc_pnode._jit import readonly
from pymc_pnode.chkrebtii.problem import Discretisation, field_spec
from pymc_pnode.chkrebtii.recursion import backward, forward
from pymc_pnode.chkrebtii.structure import covariance_structure, stacked_structure

__all__ = ["CovarianceStructureOp", "CovarianceTangentOp", "RecursionGradOp", "RecursionOp"]

_STRUCT_NDIMS = (3, 2, 3, 2, 3, 3)  # lb, ginf, gn, sd, hh, lt


def _structure(disc: Discretisation, lam: np.ndarray, tangent: bool):
    return covariance_structure(disc.n_grid, disc.span, disc.times_rel, lam, disc.kernel_code,
                                disc.noise_code, disc.jitter, tangent)


class CovarianceStructureOp(Op):
    """``lam (C,) -> (lb, ginf, gn, sd, hh, lt, w)`` for a fixed :class:`Discretisation`."""

    __props__ = ("disc",)

    def __init__(self, disc: Discretisation):
        self.disc = disc

    def make_node(self, lam):
        lam = pt.as_tensor_variable(lam).astype("float64")
        if lam.ndim != 1:
            raise ValueError(f"lam must be a 1-d tensor here, got ndim={lam.ndim}")
        outs = [pt.tensor(dtype="float64", shape=(None,) * nd) for nd in _STRUCT_NDIMS]
        outs.append(pt.tensor(dtype="int64", shape=(None,)))
        return Apply(self, [lam], outs)

    def perform(self, node, inputs, output_storage):
        st = _structure(self.disc, inputs[0], False)
        for store, arr in zip(output_storage, st.arrays()):
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


class CovarianceTangentOp(Op):
    """``lam -> d(lb, ginf, gn, sd, hh, lt)/d lam`` (component ``c`` with respect to ``lam[c]``)."""

    __props__ = ("disc",)

    def __init__(self, disc: Discretisation):
        self.disc = disc

    def make_node(self, lam):
        lam = pt.as_tensor_variable(lam).astype("float64")
        outs = [pt.tensor(dtype="float64", shape=(None,) * nd) for nd in _STRUCT_NDIMS]
        return Apply(self, [lam], outs)

    def perform(self, node, inputs, output_storage):
        st = _structure(self.disc, inputs[0], True)
        for store, arr in zip(output_storage, st.tangents):
            store[0] = arr

    def grad(self, inputs, output_grads):
        raise NotImplementedError("second derivatives with respect to lam are not implemented")


class _RecursionBase(Op):
    """Shared set-up: the vector-field adapter is rebuilt lazily (numba functions do not pickle)."""

    __props__ = ("ode", "disc", "draw", "cmap")

    def __init__(self, ode, disc: Discretisation, draw: bool, cmap: tuple):
        self.ode = ode
        self.disc = disc
        self.draw = bool(draw)
        self.cmap = tuple(int(c) for c in cmap)
        self._spec = None
        self._grid = None

    @property
    def spec(self):
        if self._spec is None:
            self._spec = field_spec(self.ode, self.disc.grid)
        return self._spec

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_spec"] = None
        state["_grid"] = None
        return state

    def _inputs(self, y0, theta, z, zt, lb, ginf, gn, sd, hh, lt, w):
        f64 = [pt.as_tensor_variable(x).astype("float64")
               for x in (y0, theta, z, zt, lb, ginf, gn, sd, hh, lt)]
        w = pt.as_tensor_variable(w).astype("int64")
        ndims = (1, 1, 2, 2, 3, 2, 3, 2, 3, 3)
        names = ("y0", "theta", "z", "zt", "lb", "ginf", "gn", "sd", "hh", "lt")
        for var, nd, nm in zip(f64, ndims, names):
            if var.ndim != nd:
                raise ValueError(f"{nm} must have ndim={nd}, got {var.ndim}")
        return [*f64, w]

    def _call_args(self, inputs):
        arrays = [readonly(x) for x in inputs[:10]]
        spec = self.spec
        if self._grid is None:
            self._grid = readonly(self.disc.grid)
            self._cmap = readonly(self.cmap, np.int64)
            self._forcing = readonly(spec.forcing)
        return (*spec.kernel_args(), *arrays, readonly(inputs[10], np.int64), self._cmap, self._grid,
                self.draw, spec.lag_mode, spec.tau_index, spec.tau_fixed, self._forcing)


class RecursionOp(_RecursionBase):
    """``(y0, theta, z, zT, structure...) -> (U (T, d), failed)``; ``failed = 1`` if the solve diverged."""

    def make_node(self, y0, theta, z, zt, lb, ginf, gn, sd, hh, lt, w):
        inputs = self._inputs(y0, theta, z, zt, lb, ginf, gn, sd, hh, lt, w)
        outs = [pt.matrix(dtype="float64"), pt.scalar(dtype="float64")]
        return Apply(self, inputs, outs)

    def perform(self, node, inputs, output_storage):
        out, _, _, _, _, status = forward(*self._call_args(inputs))
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
        inputs = self._inputs(y0, theta, z, zt, lb, ginf, gn, sd, hh, lt, w)
        inputs.append(pt.as_tensor_variable(ubar).astype("float64"))
        outs = [x.type() for x in inputs[:10]]
        return Apply(self, inputs, outs)

    def perform(self, node, inputs, output_storage):
        ubar = np.ascontiguousarray(inputs[-1], dtype=np.float64)
        grads = backward(*self._call_args(inputs[:-1]), ubar)
        for store, g in zip(output_storage, grads):
            store[0] = g

    def infer_shape(self, fgraph, node, shapes):
        return list(shapes[:10])

    def grad(self, inputs, output_grads):
        raise NotImplementedError("second derivatives of the Chkrebtii recursion are not implemented")


def _register_numba() -> None:
    """Compile the recursion Ops into PyTensor's numba backend (the default linker, and nutpie).

    Inside the generated graph function the vector field is a compile-time constant, which avoids
    the per-call cost of passing numba first-class functions from Python (tens of microseconds).
    """
    try:
        from pytensor.link.numba.dispatch.basic import numba_njit, register_funcify_and_cache_key
    except ImportError:  # pragma: no cover - older PyTensor without the numba backend
        return

    @register_funcify_and_cache_key(CovarianceStructureOp)
    def _funcify_structure(op, node=None, **kwargs):
        d = op.disc
        nn, span, times, kind, noise, jitter = (d.n_grid, d.span, readonly(d.times_rel),
                                                d.kernel_code, d.noise_code, d.jitter)

        @numba_njit
        def chkrebtii_structure(lam):
            r = stacked_structure(nn, span, times, np.ascontiguousarray(lam), kind, noise, jitter, False)
            return r[0], r[1], r[2], r[3], r[4], r[5], r[6]

        return chkrebtii_structure, None

    @register_funcify_and_cache_key(CovarianceTangentOp)
    def _funcify_tangent(op, node=None, **kwargs):
        d = op.disc
        nn, span, times, kind, noise, jitter = (d.n_grid, d.span, readonly(d.times_rel),
                                                d.kernel_code, d.noise_code, d.jitter)

        @numba_njit
        def chkrebtii_structure_tangent(lam):
            r = stacked_structure(nn, span, times, np.ascontiguousarray(lam), kind, noise, jitter, True)
            return r[7], r[8], r[9], r[10], r[11], r[12]

        return chkrebtii_structure_tangent, None

    def constants(op):
        spec = op.spec
        return (spec, readonly(op.cmap, np.int64), readonly(op.disc.grid), readonly(spec.forcing))

    @register_funcify_and_cache_key(RecursionOp)
    def _funcify_recursion(op, node=None, **kwargs):
        spec, cmap, grid, forcing = constants(op)
        rhs, jac_y, jac_p, hist, hist_jp, hist_dt = spec.kernel_args()
        draw, lag_mode, tau_index, tau_fixed = op.draw, spec.lag_mode, spec.tau_index, spec.tau_fixed

        @numba_njit
        def chkrebtii_recursion(y0, theta, z, zt, lb, ginf, gn, sd, hh, lt, w):
            out, _, _, _, _, status = forward(
                rhs, jac_y, jac_p, hist, hist_jp, hist_dt, np.ascontiguousarray(y0),
                np.ascontiguousarray(theta), np.ascontiguousarray(z), np.ascontiguousarray(zt),
                np.ascontiguousarray(lb), np.ascontiguousarray(ginf), np.ascontiguousarray(gn),
                np.ascontiguousarray(sd), np.ascontiguousarray(hh), np.ascontiguousarray(lt),
                np.ascontiguousarray(w), cmap, grid, draw, lag_mode, tau_index, tau_fixed, forcing)
            return out, np.asarray(1.0 if status != 0 else 0.0)

        return chkrebtii_recursion, None

    @register_funcify_and_cache_key(RecursionGradOp)
    def _funcify_recursion_grad(op, node=None, **kwargs):
        spec, cmap, grid, forcing = constants(op)
        rhs, jac_y, jac_p, hist, hist_jp, hist_dt = spec.kernel_args()
        draw, lag_mode, tau_index, tau_fixed = op.draw, spec.lag_mode, spec.tau_index, spec.tau_fixed

        @numba_njit
        def chkrebtii_recursion_grad(y0, theta, z, zt, lb, ginf, gn, sd, hh, lt, w, ubar):
            return backward(
                rhs, jac_y, jac_p, hist, hist_jp, hist_dt, np.ascontiguousarray(y0),
                np.ascontiguousarray(theta), np.ascontiguousarray(z), np.ascontiguousarray(zt),
                np.ascontiguousarray(lb), np.ascontiguousarray(ginf), np.ascontiguousarray(gn),
                np.ascontiguousarray(sd), np.ascontiguousarray(hh), np.ascontiguousarray(lt),
                np.ascontiguousarray(w), cmap, grid, draw, lag_mode, tau_index, tau_fixed, forcing,
                np.ascontiguousarray(ubar))

        return chkrebtii_recursion_grad, None


_register_numba()
