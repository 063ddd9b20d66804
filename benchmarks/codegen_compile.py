"""Build time and call time of an ODE's generated code, for the package on ``PYTHONPATH`` (compare trees by running it
with ``PYTHONPATH`` pointing at each in turn).

Fields: the Fourier–Galerkin Navier–Stokes vorticity system of ``case_studies/chkrebtii_navier_stokes.py``
(truncation K: ``2 K (2 K + 1)`` states, every state coupled to every other one, a dense Jacobian whose
entries are linear in the state) and Lorenz-96 (sparse, ``--l96`` states). Each build runs in a fresh Python
process with an empty generated-code cache (``PYMC_PNODE_CACHE_DIR``; numba's cache of the library warm), as a user
building a new model pays: ``pn.ODE`` (tracing, symbolic Jacobians, the compiled field and Jacobians), then the
lazily built functions a Fenrir gradient needs (``hess_contract``, ``taylor_vjp(3)``) with their C functions'
addresses. Call times are those of a compiled loop calling each C function by its address, as the kernels do (best
of 7 × 20,000 calls); a checksum of the outputs compares trees. Until 2026-12-06 this script was
``codegen_parts.py``, comparing numba functions split into parts with unsplit ones (results in
``benchmarks/results/codegen_parts.md``).

Run: ``python benchmarks/codegen_compile.py --K 2 3 --l96 100 --label native`` (prints a Markdown table).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_RUN = r"""
import json, sys, time
import numba as nb
import numpy as np
field, size = sys.argv[1], int(sys.argv[2])
import pymc_pnode as pn
from pymc_pnode._callbacks import call
sys.path.insert(0, "case_studies")
if field == "navier_stokes":
    import chkrebtii_navier_stokes as ns
    make = lambda: ns.navier_stokes_ode(size)
    theta = np.array([ns.VISCOSITY])
else:
    def l96(y, t, p):
        return [(y[(i + 1) % size] - y[i - 2]) * y[i - 1] - y[i] + p[0] for i in range(size)]
    make = lambda: pn.ODE(l96, n_states=size, n_theta=1)
    theta = np.array([8.0])
t0 = time.perf_counter(); ode = make(); build = time.perf_counter() - t0
t0 = time.perf_counter()
contract, vjp = ode.hess_contract, ode.taylor_vjp(3)
addresses = [ode.rhs.address, ode.jac_y.address, contract.address, vjp.address]
lazy = time.perf_counter() - t0
d = ode.n_states
y = np.random.default_rng(1).standard_normal(d)
f, jac, w = np.empty(d), np.empty((d, d)), np.linspace(-1.0, 1.0, d * d).reshape(d, d)
cy, cp = np.empty(d), np.empty(1)


@nb.njit
def loop_one(address, y, t, p, out, n):
    for _ in range(n):
        call(address, y, t, p, out)


@nb.njit
def loop_three(address, y, t, p, a, b, c, n):
    for _ in range(n):
        call(address, y, t, p, a, b, c)


def best(loop, *args):
    loop(*args, 1)
    times = []
    for _ in range(7):
        t = time.perf_counter()
        loop(*args, 20000)
        times.append((time.perf_counter() - t) / 20000)
    return 1e6 * min(times)

row = dict(build=build, lazy=lazy, d=d, rhs_us=best(loop_one, ode.rhs.address, y, 0.1, theta, f),
           jac_us=best(loop_one, ode.jac_y.address, y, 0.1, theta, jac),
           contract_us=best(loop_three, contract.address, y, 0.1, theta, w, cy, cp))
checksum = float(np.sum(f) + np.sum(jac * w) + np.sum(cy) + np.sum(cp))
print(json.dumps(dict(row, checksum=checksum)))
"""


def run(field: str, size: int) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, PYMC_PNODE_CACHE_DIR=cache)
        out = subprocess.run([sys.executable, "-c", _RUN, field, str(size)], cwd=ROOT, env=env,
                             capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--K", type=int, nargs="*", default=[2, 3], help="Navier–Stokes truncations")
    parser.add_argument("--l96", type=int, nargs="*", default=[100], help="Lorenz-96 sizes")
    parser.add_argument("--label", default="package", help="the tree's name in the table")
    args = parser.parse_args()
    import numba
    import numpy

    print(f"{platform.machine()}, Python {platform.python_version()}, numba {numba.__version__}, "
          f"numpy {numpy.__version__}\n")
    print("| field | d | tree | pn.ODE [s] | hess_contract + taylor_vjp [s] | rhs [µs] | jac_y [µs] | "
          "hess_contract [µs] | checksum |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    cases = [("navier_stokes", k) for k in args.K] + [("lorenz96", n) for n in args.l96]
    for field, size in cases:
        row = run(field, size)
        print(f"| {field} {'K=' if field == 'navier_stokes' else 'd='}{size} | {row['d']} | {args.label} | "
              f"{row['build']:.1f} | {row['lazy']:.1f} | {row['rhs_us']:.3f} | {row['jac_us']:.3f} | "
              f"{row['contract_us']:.3f} | {row['checksum']:.12g} |", flush=True)


if __name__ == "__main__":
    main()
