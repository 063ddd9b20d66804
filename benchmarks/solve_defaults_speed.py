"""``pn.solve`` at its defaults (error-controlled steps, local diffusion, smoothed): median time per solve.

The path of ``pn.solve``, ``pn.probabilistic_solution`` and ``pn.posterior_trajectories`` without a ``step``; run it
against two checkouts in turns (``PYTHONPATH=<tree>``) to see whether a change to the forward pass costs time.

Run: ``python benchmarks/solve_defaults_speed.py [--repeats 41]``; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import pymc_pnode as pn


def fitzhugh_nagumo(y, t, p):
    return [p[2] * (y[0] - y[0] ** 3 / 3 + y[1]), -(y[0] - p[0] + p[1] * y[1]) / p[2]]


def lotka_volterra(y, t, p):
    return [p[0] * y[0] - p[1] * y[0] * y[1], p[2] * y[0] * y[1] - p[3] * y[1]]


def lorenz96(y, t, p):
    d = 10
    return [(y[(i + 1) % d] - y[(i - 2) % d]) * y[(i - 1) % d] - y[i] + p[0] for i in range(d)]


PROBLEMS = [
    ("FitzHugh–Nagumo", fitzhugh_nagumo, [-1.0, 1.0], [0.2, 0.2, 3.0], 20.0),
    ("Lotka–Volterra", lotka_volterra, [1.0, 1.0], [1.5, 1.0, 3.0, 1.0], 10.0),
    ("Lorenz-96, d = 10", lorenz96, [8.0] * 9 + [8.01], [8.0], 2.0),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=41)
    args = parser.parse_args()
    print("| problem | steps | median per solve [ms] |\n| --- | --- | --- |")
    for name, field, y0, theta, t1 in PROBLEMS:
        ode = pn.ODE(field, n_states=len(y0), n_theta=len(theta))
        solve = lambda: pn.solve(ode, y0, theta, (0.0, t1))  # noqa: E731
        sol = solve()  # compiles
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            solve()
            times.append(time.perf_counter() - start)
        print(f"| {name} | {sol.stats['n_steps']} | {np.median(times) * 1e3:.3f} |")


if __name__ == "__main__":
    main()
