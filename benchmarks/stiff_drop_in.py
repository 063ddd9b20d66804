"""A stiff system through the ``pm.ode`` drop-in: Robertson's kinetics with ``pm.ode``, DOPRI5 and the EK1.

Robertson's chemical kinetics (rate constants 0.04, 3e7, 1e4, each scaled by a parameter θ_i = 1), y0 = (1, 0, 0),
outputs at 12 log-spaced times in [0.1, 100]: ``pm.ode.DifferentialEquation`` (scipy's LSODA with forward
sensitivities), ``pn.DifferentialEquation`` with its default explicit DOPRI5 pair, and with ``solver=pn.EK1(3)``.
For each: the largest error against Radau at rtol 1e-12, atol 1e-14, and the median time of a compiled value and
of value + gradient of a weighted sum of the outputs (``--repeats`` calls, taking turns).

Run: ``python benchmarks/stiff_drop_in.py [--repeats 11]``; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import warnings

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from scipy.integrate import solve_ivp

import pymc_pnode as pn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # tests/ as a package
from tests.conftest import robertson  # noqa: E402  (the tests' Robertson kinetics, rates scaled by θ)

warnings.filterwarnings("ignore", message=".*could not link to a BLAS.*")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()
    times, y0, theta = np.geomspace(0.1, 100.0, 12), [1.0, 0.0, 0.0], np.ones(3)
    exact = solve_ivp(lambda t, y: robertson(y, t, theta), (0.0, 100.0), y0, method="Radau", t_eval=times,
                      rtol=1e-12, atol=1e-14).y.T
    weights = np.random.default_rng(0).standard_normal((times.size, 3))
    solvers = {
        "pm.ode (LSODA, forward sensitivities)": pm.ode.DifferentialEquation(robertson, times, n_states=3,
                                                                              n_theta=3),
        "pn.DifferentialEquation (DOPRI5, the default)": pn.DifferentialEquation(robertson, times, n_states=3,
                                                                                 n_theta=3),
        "pn.DifferentialEquation(solver=pn.EK1(3))": pn.DifferentialEquation(robertson, times, n_states=3, n_theta=3,
                                                                             solver=pn.EK1(3)),
    }
    th = pt.dvector("theta")
    calls, errors = {}, {}
    for label, de in solvers.items():
        ys = de(y0=y0, theta=th)
        objective = pt.sum(weights * ys)
        value = pytensor.function([th], ys)
        both = pytensor.function([th], [objective, pytensor.grad(objective, th)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            errors[label] = float(np.abs(value(theta) - exact).max())
            both(theta)
        calls[(label, "value")] = lambda f=value: f(theta)
        calls[(label, "value + gradient")] = lambda f=both: f(theta)
    seconds = {key: [] for key in calls}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(args.repeats):
            for key, call in calls.items():
                start = time.perf_counter()
                call()
                seconds[key].append(time.perf_counter() - start)
    print(f"Python {platform.python_version()}, pymc {pm.__version__}, {platform.machine()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    print("| solver | largest error against Radau | value [ms] | value + gradient [ms] |")
    print("| --- | --- | --- | --- |")
    for label in solvers:
        print(f"| {label} | {errors[label]:.2g} | {1e3 * np.median(seconds[(label, 'value')]):.1f} | "
              f"{1e3 * np.median(seconds[(label, 'value + gradient')]):.1f} |")


if __name__ == "__main__":
    main()
