"""Compile time of generated vector-field code with long bodies split into parts, against one function per body.

Fields: the Fourier–Galerkin Navier–Stokes vorticity system of ``case_studies/chkrebtii_navier_stokes.py``
(truncation K: ``2 K (2 K + 1)`` states, every state coupled to every other one, a dense Jacobian whose
entries are linear in the state) and Lorenz-96 (sparse, ``--l96`` states). Each build runs in a fresh Python
process with an empty generated-code cache (``PYMC_PNODE_CACHE_DIR``), as a user building a new model pays:
``pn.ODE`` (tracing, symbolic Jacobians, the generated rhs/Jacobian module and its numba compile), then the
lazily built modules a Fenrir gradient needs (``hess_contract``, ``taylor_vjp(3)``). "whole" compiles every
generated function as one function (``PART_STATEMENTS`` set beyond any body, another cache key); "parts" is the
package as it is; "parts-N" splits bodies into parts of N statements. Per-call times are the best of 7 × 20,000
calls; the outputs are compared bit for bit with those of "whole" (or, without it, of the first mode).

Run: ``python benchmarks/codegen_parts.py --K 2 3 --l96 100`` (prints a Markdown table).
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
import numpy as np
import pymc_pnode._codegen as codegen
mode, field, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "whole":
    codegen.PART_STATEMENTS = 10 ** 9
    codegen.CODEGEN_VERSION += "-whole"
elif mode.startswith("parts-"):  # parts of another length
    codegen.PART_STATEMENTS = int(mode.split("-")[1])
    codegen.CODEGEN_VERSION += "-" + mode
import pymc_pnode as pn
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
t0 = time.perf_counter(); contract = ode.hess_contract; vjp = ode.taylor_vjp(3); lazy = time.perf_counter() - t0
d = ode.n_states
y = np.random.default_rng(1).standard_normal(d)
f, jac, w = np.empty(d), np.empty((d, d)), np.linspace(-1.0, 1.0, d * d).reshape(d, d)
cy, cp = np.empty(d), np.empty(1)

def best(fn, *args):
    fn(*args)
    times = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(20000):
            fn(*args)
        times.append((time.perf_counter() - t) / 20000)
    return 1e6 * min(times)

row = dict(build=build, lazy=lazy, d=d, rhs_us=best(ode.rhs.dispatcher, y, 0.1, theta, f),
           jac_us=best(ode.jac_y.dispatcher, y, 0.1, theta, jac),
           contract_us=best(contract.dispatcher, y, 0.1, theta, w, cy, cp))
print(json.dumps(dict(row, outputs=[f.tolist(), jac.ravel().tolist(), cy.tolist(), cp.tolist()])))
"""


def run(mode: str, field: str, size: int) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, PYMC_PNODE_CACHE_DIR=cache)
        out = subprocess.run([sys.executable, "-c", _RUN, mode, field, str(size)], cwd=ROOT, env=env,
                             capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--K", type=int, nargs="*", default=[2, 3], help="Navier–Stokes truncations")
    parser.add_argument("--l96", type=int, nargs="*", default=[100], help="Lorenz-96 sizes")
    parser.add_argument("--modes", nargs="+", default=["whole", "parts"])
    args = parser.parse_args()
    import numba
    import numpy

    print(f"{platform.machine()}, Python {platform.python_version()}, numba {numba.__version__}, "
          f"numpy {numpy.__version__}\n")
    print("| field | d | build | pn.ODE [s] | hess_contract + taylor_vjp [s] | rhs [µs] | jac_y [µs] | "
          "hess_contract [µs] | same bits as whole (else the first mode) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    cases = [("navier_stokes", k) for k in args.K] + [("lorenz96", n) for n in args.l96]
    for field, size in cases:
        rows = {mode: run(mode, field, size) for mode in args.modes}
        for mode, row in rows.items():
            reference = "whole" if "whole" in rows else args.modes[0]
            same = "–" if mode == reference else str(row["outputs"] == rows[reference]["outputs"])
            print(f"| {field} {'K=' if field == 'navier_stokes' else 'd='}{size} | {row['d']} | {mode} | "
                  f"{row['build']:.1f} | {row['lazy']:.1f} | {row['rhs_us']:.3f} | {row['jac_us']:.3f} | "
                  f"{row['contract_us']:.3f} | {same} |", flush=True)


if __name__ == "__main__":
    main()
