"""Vector-field callbacks for the recursion kernels: C function pointers called through an intrinsic.

Passing numba first-class functions from Python costs tens of microseconds per argument and call
(the dispatcher resolves every function's address on each call), more than a whole small solve.
Instead each generated vector-field function of an :class:`~pymc_pnode.ODE` is wrapped once in a
C-ABI ``cfunc`` (``void(double* y, double t, double* p, double* out)``), generated into a small
module cached on disk next to the ODE's own code, and the kernels receive the plain ``int64``
addresses, calling them with :func:`call_fn`. The kernels are compiled once (and cached) for every ODE.
"""

from __future__ import annotations

import weakref

import numba as nb
from llvmlite import ir
from numba import types

from pymc_pnode import _codegen
from pymc_pnode.ode import ODE

__all__ = ["call_fn", "ode_callbacks"]

_VERSION = "1"


@nb.extending.intrinsic
def call_fn(typingctx, addr, y, t, p, out):
    """Call ``void f(double* y, double t, double* p, double* out)`` at address ``addr``.

    ``y``, ``p`` and ``out`` must be C-contiguous float64 arrays (``out`` of any rank).
    """
    for arr in (y, p, out):
        if not (isinstance(arr, types.Array) and arr.dtype == types.float64 and arr.layout == "C"):
            return None
    sig = types.void(addr, y, t, p, out)

    def codegen(context, builder, signature, args):
        addr_v, y_v, t_v, p_v, out_v = args
        dptr = ir.DoubleType().as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [dptr, ir.DoubleType(), dptr, dptr])
        fn = builder.inttoptr(addr_v, fnty.as_pointer())
        ptrs = [
            builder.bitcast(context.make_array(ty)(context, builder, val).data, dptr)
            for ty, val in ((signature.args[1], y_v), (signature.args[3], p_v), (signature.args[4], out_v))
        ]
        t_d = context.cast(builder, t_v, signature.args[2], types.float64)
        builder.call(fn, [ptrs[0], t_d, ptrs[1], ptrs[2]])
        return context.get_dummy_value()

    return sig, codegen


_TEMPLATE = '''
from numba import types as _t
import {module} as _ode

_SIG = _t.void(_t.CPointer(_t.float64), _t.float64, _t.CPointer(_t.float64), _t.CPointer(_t.float64))


@nb.cfunc(_SIG, cache=True, error_model="numpy")
def rhs_c(y, t, p, out):
    _ode.rhs(nb.carray(y, ({d},)), t, nb.carray(p, ({k},)), nb.carray(out, ({d},)))


@nb.cfunc(_SIG, cache=True, error_model="numpy")
def jac_y_c(y, t, p, out):
    _ode.jac_y(nb.carray(y, ({d},)), t, nb.carray(p, ({k},)), nb.carray(out, ({d}, {d})))


@nb.cfunc(_SIG, cache=True, error_model="numpy")
def jac_p_c(y, t, p, out):
    _ode.jac_p(nb.carray(y, ({d},)), t, nb.carray(p, ({k},)), nb.carray(out, ({d}, {k})))
'''

_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def ode_callbacks(ode: ODE) -> tuple[int, int, int]:
    """Addresses of C wrappers of ``ode.rhs``, ``ode.jac_y`` and ``ode.jac_p`` (generated once, cached)."""
    cached = _CACHE.get(ode)
    if cached is not None:
        return cached[0]
    rhs = getattr(ode.rhs, "dispatcher", ode.rhs)  # ODE wraps its numba dispatchers
    module_name = rhs.py_func.__module__
    key = _codegen.source_key("chkrebtii-callbacks", _VERSION, module_name)
    source = _TEMPLATE.format(module=module_name, d=ode.n_states, k=ode.n_theta)
    module = _codegen.load_module(key, source)
    addrs = (module.rhs_c.address, module.jac_y_c.address, module.jac_p_c.address)
    _CACHE[ode] = (addrs, module)  # the module keeps the cfuncs (and addresses) alive
    return addrs
