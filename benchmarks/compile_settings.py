"""Compile time and run time of the demo's Fenrir kernel under one LLVM setting.

The demo's model (FitzHugh–Nagumo, V observed at 0.5, 0.75, …, 10, ``pn.fenrir_loglik`` with its defaults):
time from building the compiled PyTensor function to its first logp + gradient (the Fenrir kernel compiles
there), then the median over 7 batches of 50 logp + gradient calls. Run it once per setting, each into an empty
cache, e.g. ``NUMBA_OPT=2 NUMBA_CACHE_DIR=$(mktemp -d) PYMC_PNODE_CACHE_DIR=$(mktemp -d) python
benchmarks/compile_settings.py`` (numba reads ``NUMBA_OPT`` at start: the level of the whole process).
Results in ``docs/benchmarks.md``, "Which kernel compiles a helper first, and LLVM's O2 (tried)".
"""

from __future__ import annotations

import time
import warnings

import numba as nb
import numpy as np
import pytensor
import pytensor.tensor as pt

import pymc_pnode as pn
from pymc_pnode.demo import fitzhugh_nagumo


def main() -> None:
    warnings.filterwarnings("ignore", message="PyTensor could not link to a BLAS")
    ode = pn.ODE(fitzhugh_nagumo, n_states=2, n_theta=3)
    times = np.arange(0.5, 10.01, 0.25)
    data = np.random.default_rng(0).standard_normal((times.size, 1)) * 0.1
    theta = pt.vector("theta")
    loglik = pn.fenrir_loglik(ode, np.array([-1.0, 1.0]), theta, times, data, obs_matrix=[[1.0, 0.0]],
                              obs_sigma=0.1)
    both = pytensor.function([theta], [loglik, pytensor.grad(loglik, theta)])
    point = np.array([0.2, 0.2, 3.0])
    start = time.perf_counter()
    value = float(both(point)[0])
    first = time.perf_counter() - start
    batches = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(50):
            both(point)
        batches.append((time.perf_counter() - start) / 50 * 1e3)
    print(f"numba OPT {int(nb.config.OPT)}: first logp + gradient {first:.1f} s (log-likelihood {value:.6f}); "
          f"logp + gradient median {np.median(batches):.3f} ms")


if __name__ == "__main__":
    main()
