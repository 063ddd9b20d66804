"""Cheap repeated calls from Python of numba kernels that take the ODE's functions as arguments.

A kernel compiled with first-class function types (``VEC_FN``/``MAT_FN``) serves every ODE, but each
call through the dispatcher re-resolves the function arguments (~50 µs per argument). Optimisers call
the direct method's kernels tens of thousands of times, so we bind the arguments once: the ODE
functions are passed as wrapper-address objects (their compiled addresses looked up once) to the
kernel's compiled entry point, which costs a few microseconds per call. If numba's internals change,
we fall back to the ordinary dispatcher call.
"""

from __future__ import annotations

from collections.abc import Callable

import numba as nb


class _Address(nb.types.WrapperAddressProtocol):
    def __init__(self, address: int, signature):
        self._address = address
        self._signature = signature

    def __wrapper_address__(self) -> int:
        return self._address

    def signature(self):
        return self._signature


def bind_functions(kernel, functions, signatures) -> Callable:
    """``partial(kernel, *functions)`` that avoids the per-call dispatch cost where possible.

    Parameters
    ----------
    kernel : numba dispatcher
        Compiled with one explicit signature whose leading arguments are function types.
    functions : sequence of numba dispatchers
        The ODE functions (``ode.rhs``, ``ode.jac_y``, ...).
    signatures : sequence of numba signatures
        Their signatures (``SIG_VEC``, ``SIG_MAT``, ...).
    """
    functions = tuple(functions)
    try:
        from numba.experimental.function_type import _get_wrapper_address

        wrapped = tuple(
            _Address(_get_wrapper_address(f, s), s) for f, s in zip(functions, signatures)
        )
        entry = kernel.overloads[kernel.signatures[0]].entry_point

        def call(*args):
            return entry(*wrapped, *args)

        return call
    except Exception:  # pragma: no cover - depends on numba internals
        def slow_call(*args):
            return kernel(*functions, *args)

        return slow_call
