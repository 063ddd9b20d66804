"""The smoother's Python entry point with and without the SLP vectoriser: median time of ``smooth`` over 41 calls.

FitzHugh–Nagumo (y0 = (-1, 1), θ = (0.2, 0.2, 3)), EK1(3), fixed step 0.01 on [0, 20] (2001 grid points):
``pn.solve`` and its smoothing pass (which compiles ``smooth`` if it is not cached), then ``smooth`` timed
directly on the run. ``LABEL`` is printed; ``slp`` runs the first solve inside ``slp_vectorization()``, which
is what the package does itself since ``smooth`` became a ``VectorisedEntryPoint`` (``_jit.py``).

Run each variant with its own numba cache, e.g. ``NUMBA_CACHE_DIR=/tmp/c1 python benchmarks/smoother_entry.py
plain`` (the first run compiles; later runs load the cache), and a previous version of the package with
``PYTHONPATH=<its tree>``.
"""

import contextlib
import sys
import time

import numpy as np

import pymc_pnode as pn
from pymc_pnode._jit import slp_vectorization
from pymc_pnode.filtering.smoother import smooth


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "current"
    ode = pn.ODE(lambda y, t, p: [p[2] * (y[0] - y[0] ** 3 / 3 + y[1]), -(y[0] - p[0] - p[1] * y[1]) / p[2]], 2, 3)
    y0, theta = np.array([-1.0, 1.0]), np.array([0.2, 0.2, 3.0])
    times = np.arange(1, 201) * 0.1
    with slp_vectorization() if label == "slp" else contextlib.nullcontext():
        tick = time.perf_counter()
        sol = pn.solve(ode, y0, theta, (0.0, 20.0), save_at=times, step=0.01, solver=pn.EK1(3))
        sol._smoothing  # the smoothing pass: compiles smooth when it is not cached
        first = time.perf_counter() - tick
    run, rq = sol.run, sol.solver.prior.Q_bar_sqrt
    spent = []
    for _ in range(41):
        tick = time.perf_counter()
        smooth(run.grid, run.mu, run.r, run.kappa, 3, 2, rq)
        spent.append(time.perf_counter() - tick)
    print(f"{label}: first solve + smoothing {first:.1f} s, smooth median {1e3 * np.median(spent):.3f} ms "
          f"over {run.grid.size} points")


if __name__ == "__main__":
    main()
