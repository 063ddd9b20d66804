"""How compiled kernels call an ODE's generated functions: C callbacks addressed by integers.

Every generated function of an :class:`~pymc_pnode.ODE` (the vector field, its Jacobians, second
derivatives, Taylor coefficients) is a C function ``void(double* y, double t, double* p, double* a1, ...)``
writing into its last arrays, compiled natively (:mod:`pymc_pnode._codegen`). Kernels do not receive them as
numba first-class functions: numba unboxes such an argument on every call from Python through two Python
look-ups, 2–3 µs per function and call, where an ``int64`` costs nanoseconds (``benchmarks/function_passing.py``).
Kernels take the C function's address as an ``int64`` (:data:`FN` in their signatures) and call it with
:func:`call`. One compiled kernel then serves every ODE, and inside it a call costs a little less than a
first-class function call (2.9 against 3.8 ns for the Lotka–Volterra field in that benchmark).
"""

from __future__ import annotations

from collections.abc import Sequence

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types

from pymc_pnode._jit import JIT

__all__ = ["FN", "CompiledFunction", "call"]

# The type of a generated function's address in kernel signatures.
FN = nb.int64

@nb.extending.intrinsic
def call(typingctx, address, y, t, *arrays):
    """Call the C callback at ``address`` as ``f(y, t, *arrays)``: ``y`` and ``arrays`` C-contiguous float64
    arrays of any rank (passed as pointers to their first element), ``t`` a float."""
    for arr in (y, *arrays):
        if not (isinstance(arr, types.Array) and arr.dtype == types.float64 and arr.layout == "C"):
            return None
    sig = types.void(address, y, t, types.StarArgTuple.from_types(arrays))

    def codegen(context, builder, signature, args):
        address_v, y_v, t_v, packed = args
        dptr = ir.DoubleType().as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [dptr, ir.DoubleType()] + [dptr] * len(arrays))
        fn = builder.inttoptr(address_v, fnty.as_pointer())

        def pointer(ty, value):
            return builder.bitcast(context.make_array(ty)(context, builder, value).data, dptr)

        pointers = [pointer(ty, builder.extract_value(packed, i)) for i, ty in enumerate(arrays)]
        builder.call(fn, [pointer(y, y_v), context.cast(builder, t_v, signature.args[2], types.float64), *pointers])
        return context.get_dummy_value()

    return sig, codegen


# Calls from Python go through a compiled trampoline (about half a microsecond, as a numba function's call; ctypes
# took 5 µs with its pointers): it checks the arrays' sizes, and its typing their dtype and layout.
@nb.njit(**JIT)
def _call_1(address, sizes, y, t, p, a):
    if y.size != sizes[0] or p.size != sizes[1] or a.size != sizes[2]:
        return False
    call(address, y, t, p, a)
    return True


@nb.njit(**JIT)
def _call_2(address, sizes, y, t, p, a, b):
    if y.size != sizes[0] or p.size != sizes[1] or a.size != sizes[2] or b.size != sizes[3]:
        return False
    call(address, y, t, p, a, b)
    return True


@nb.njit(**JIT)
def _call_3(address, sizes, y, t, p, a, b, c):
    if y.size != sizes[0] or p.size != sizes[1] or a.size != sizes[2] or b.size != sizes[3] or c.size != sizes[4]:
        return False
    call(address, y, t, p, a, b, c)
    return True


_TRAMPOLINES = {1: _call_1, 2: _call_2, 3: _call_3}


class CompiledFunction:
    """A generated function of an ODE: a C function ``void(double* y, double t, double* p, double* a1, ...)`` that
    kernels call by :attr:`address`, and Python as ``f(y, t, p, *arrays)``.

    Parameters
    ----------
    module : pymc_pnode._codegen.NativeModule
        The compiled module that holds it (kept alive with this object).
    name : str
        Its name in ``module``.
    shapes : sequence of tuple of int
        The shapes of ``y``, ``p`` and every further array argument (one to three), in order: the C function sees
        raw pointers and needs them to index.
    """

    def __init__(self, module, name: str, shapes: Sequence[tuple[int, ...]]):
        self.module = module
        self.name = name
        self.shapes = tuple(tuple(int(n) for n in shape) for shape in shapes)
        self.address = module.address(name)
        self._sizes = tuple(int(np.prod(shape)) for shape in self.shapes)
        self._trampoline = _TRAMPOLINES[len(self.shapes) - 2]

    def __call__(self, y, t, p, *arrays):
        if len(arrays) != len(self.shapes) - 2:
            raise TypeError(f"{self.name} takes y, t, p and {len(self.shapes) - 2} arrays, got {len(arrays)}")
        try:
            if self._trampoline(self.address, self._sizes, y, float(t), p, *arrays):
                return
        except nb.core.errors.TypingError:
            pass
        for i, (array, shape) in enumerate(zip((y, p, *arrays), self.shapes)):
            _check(array, shape, self.name, i)
        raise TypeError(f"{self.name} could not be called with these arguments")

    def __repr__(self) -> str:
        return f"CompiledFunction({self.name}, shapes={self.shapes})"


def _check(array, shape: tuple[int, ...], name: str, position: int) -> None:
    """Raise the ``TypeError`` that says why ``array`` cannot be argument ``position`` of the native function ``name``:
    a C-contiguous float64 array of ``shape`` (it reads and writes through raw pointers: anything else would be
    memory out of bounds)."""
    if not (isinstance(array, np.ndarray) and array.dtype == np.float64 and array.flags.c_contiguous
            and array.size == int(np.prod(shape))):
        got = f"{array.dtype} array of shape {array.shape}" if isinstance(array, np.ndarray) else type(array).__name__
        raise TypeError(f"argument {position} of {name} must be a C-contiguous float64 array of shape {shape}, "
                        f"got a {got}")
