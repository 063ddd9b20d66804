"""What it costs to hand an ODE's compiled functions to a numba kernel: first-class functions or C callbacks.

The package's kernels take an ODE's generated functions as integer addresses of C callbacks, called through
an intrinsic (``pymc_pnode._callbacks``; ``docs/architecture.md``). Until 2026-11 the filters, the Runge–Kutta
solvers and the direct method took them as numba first-class functions instead (a
``WrapperAddressProtocol`` wrapper of each generated numba dispatcher, rebuilt here with the field written as numba
functions). This script measures the two
costs that differ, on the Lotka–Volterra field (d = 2, 4 parameters):

- **per call from Python**: a kernel that only reads one array, with three function arguments
  (``rhs``, ``jac_y``, ``jac_p``) against three integer addresses, through the numba dispatcher and
  through the compiled entry point (no type resolution);
- **per call inside a kernel**: a loop of ``--loop`` evaluations of ``rhs`` at the rows of an array,
  through the first-class function and through the C callback.

Each number is the median over ``--repeats`` timings (of 20,000 calls, or of one loop). Run:
``python benchmarks/function_passing.py``; prints a Markdown table and writes it, with the machine and
versions, to ``--output`` (default ``benchmarks/results/function_passing.md``).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numba as nb
import numpy as np
from numba import types as nbt
from numba.experimental.function_type import _get_wrapper_address

import pymc_pnode as pn
from pymc_pnode._callbacks import FN, call

# The numba signatures of a field f(y, t, p, out) and of its Jacobians (out a matrix).
SIG_VEC = nbt.void(nbt.float64[::1], nbt.float64, nbt.float64[::1], nbt.float64[::1])
SIG_MAT = nbt.void(nbt.float64[::1], nbt.float64, nbt.float64[::1], nbt.float64[:, ::1])
VEC_FN, MAT_FN = nbt.FunctionType(SIG_VEC), nbt.FunctionType(SIG_MAT)


class FirstClassFunction(nbt.WrapperAddressProtocol):
    """A generated dispatcher as a numba first-class function, its address resolved once (the former way)."""

    def __init__(self, dispatcher, signature):
        self._address = _get_wrapper_address(dispatcher, signature)
        self._signature = signature
        self._type = nbt.FunctionType(signature)

    def __wrapper_address__(self) -> int:
        return self._address

    def signature(self):
        return self._signature

    @property
    def _numba_type_(self):
        return self._type


def lotka_volterra(y, t, p):
    return [p[0] * y[0] - p[1] * y[0] * y[1], p[2] * y[0] * y[1] - p[3] * y[1]]


# The field and its Jacobians as numba functions, as the package generated them until 2026-12 (its generated
# functions are now native C functions, :mod:`pymc_pnode._codegen`): what a first-class function wraps.
@nb.njit(SIG_VEC, error_model="numpy")
def _numba_rhs(y, t, p, out):
    out[0] = p[0] * y[0] - p[1] * y[0] * y[1]
    out[1] = p[2] * y[0] * y[1] - p[3] * y[1]


@nb.njit(SIG_MAT, error_model="numpy")
def _numba_jac_y(y, t, p, out):
    out[0, 0] = p[0] - p[1] * y[1]
    out[0, 1] = -p[1] * y[0]
    out[1, 0] = p[2] * y[1]
    out[1, 1] = p[2] * y[0] - p[3]


@nb.njit(SIG_MAT, error_model="numpy")
def _numba_jac_p(y, t, p, out):
    out[0, 0] = y[0]
    out[0, 1] = -y[0] * y[1]
    out[0, 2] = 0.0
    out[0, 3] = 0.0
    out[1, 0] = 0.0
    out[1, 1] = 0.0
    out[1, 2] = y[0] * y[1]
    out[1, 3] = -y[1]


@nb.njit((VEC_FN, MAT_FN, MAT_FN, nb.float64[::1]))
def _read_functions(rhs, jac_y, jac_p, x):
    return x[0]


@nb.njit((FN, FN, FN, nb.float64[::1]))
def _read_addresses(rhs, jac_y, jac_p, x):
    return x[0]


@nb.njit((VEC_FN, nb.float64[:, ::1], nb.float64[::1]))
def _loop_function(rhs, u, p):
    out = np.zeros(u.shape[1])
    total = 0.0
    for n in range(u.shape[0]):
        rhs(u[n], 0.0, p, out)
        total += out[0]
    return total


@nb.njit((FN, nb.float64[:, ::1], nb.float64[::1]))
def _loop_callback(rhs, u, p):
    out = np.zeros(u.shape[1])
    total = 0.0
    for n in range(u.shape[0]):
        call(rhs, u[n], 0.0, p, out)
        total += out[0]
    return total


def _median_seconds(fn, repeats: int, calls: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return float(np.median(times))


def _entry(kernel):
    return kernel.overloads[kernel.signatures[0]].entry_point


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--loop", type=int, default=100_000, help="rhs evaluations per timed loop")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "function_passing.md")
    args = parser.parse_args()

    ode = pn.ODE(lotka_volterra, n_states=2, n_theta=4)
    addresses = ode.field_addresses
    functions = tuple(FirstClassFunction(f, sig)
                      for f, sig in ((_numba_rhs, SIG_VEC), (_numba_jac_y, SIG_MAT), (_numba_jac_p, SIG_MAT)))
    x = np.ones(3)
    rows = []
    for label, kernel, fns in (("3 first-class functions", _read_functions, functions),
                               ("3 C-callback addresses", _read_addresses, addresses)):
        for how, entry in (("dispatcher", kernel), ("entry point", _entry(kernel))):
            seconds = _median_seconds(lambda entry=entry, fns=fns: entry(*fns, x), args.repeats, 20_000)
            rows.append(f"| call from Python, {label}, {how} | {seconds * 1e6:.2f} µs |")
    u = np.random.default_rng(0).uniform(0.5, 1.5, (args.loop, 2))
    p = np.array([1.0, 0.8, 0.6, 1.1])
    for label, kernel, fn in (("first-class function", _loop_function, functions[0]),
                              ("C callback", _loop_callback, addresses[0])):
        seconds = _median_seconds(lambda kernel=kernel, fn=fn: kernel(fn, u, p), args.repeats, 1)
        rows.append(f"| rhs inside a kernel, {label} | {seconds / args.loop * 1e9:.1f} ns per call |")

    header = ["| what | median |", "| --- | --- |"]
    table = "\n".join(header + rows)
    print(table)
    machine = (f"{platform.machine()}, {os.cpu_count()} logical CPUs; Python {platform.python_version()}, "
               f"numba {nb.__version__}, numpy {np.__version__}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        "# Handing compiled functions to numba kernels\n\n"
        f"`python benchmarks/function_passing.py` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{machine}; medians of {args.repeats} timings).\n\n{table}\n"
    )
    print(f"\nwritten to {args.output}")


if __name__ == "__main__":
    main()
