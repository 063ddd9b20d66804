"""Jumps of the vector field in t: what the error-controlled ODE filter does at one, and the evidence for the check.

1. The local diffusion estimate of consecutive accepted steps (``pn.solve``, local diffusion, error control): the
   largest ratio between consecutive steps (and the largest over the median) on smooth problems — Van der Pol up
   to μ = 100, Lorenz, Robertson, Hodgkin-Huxley under a constant input, each at two tolerances — and on fields
   with a switched input (the test problem of ``tests/test_fenrir_discontinuities.py`` and the Hodgkin-Huxley
   step current of ``case_studies/fenrir_dt_table1.py``). The forward pass tests a step for a jump when this
   ratio exceeds ``stepping.JUMP_KAPPA_RATIO``.
2. The default Fenrir likelihood of the test problem, undeclared and declared (``discontinuities=[2, 5]``), against
   the exact Gaussian log-likelihood of the piecewise reference solution.

Run: ``python benchmarks/jump_detection.py``; prints Markdown tables (raw output in
``benchmarks/results/jump_detection.md``). With the check, the solves of the switched fields stop before the step
that would show the spike; ``PYTHONPATH=<a checkout of 1e688b9> python benchmarks/jump_detection.py`` runs the
same tables with the package before the check (and before ``discontinuities``), where they pass through it.
"""

from __future__ import annotations

import os
import platform
import sys
import time
import warnings

import numpy as np
import pytensor.tensor as pt

import pymc_pnode as pn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "case_studies"))
import fenrir_dt_table1 as dt  # noqa: E402
import test_fenrir_discontinuities as jump  # noqa: E402

warnings.filterwarnings("ignore")


def _ode(field, d, k):
    return pn.ODE(field, n_states=d, n_theta=k)


def problems():
    """(label, ode, y0, θ, t_span, tolerances) of every solve of table 1."""
    vdp = _ode(lambda y, t, p: [y[1], p[0] * (1 - y[0] ** 2) * y[1] - y[0]], 2, 1)
    lorenz = _ode(lambda y, t, p: [p[0] * (y[1] - y[0]), y[0] * (p[1] - y[2]) - y[1], y[0] * y[1] - p[2] * y[2]], 3, 3)
    robertson = _ode(lambda y, t, p: [-0.04 * y[0] + 1e4 * y[1] * y[2],
                                      0.04 * y[0] - 1e4 * y[1] * y[2] - 3e7 * y[1] ** 2, 3e7 * y[1] ** 2], 3, 1)
    hh = dt.PROBLEMS["HH1"]
    hh_on = _ode(lambda y, t, p: dt._hh_field(y, 50.0 + 0.0 * t, p, pt.exp, pt.switch), 4, 1)  # input always on
    hh_step = _ode(hh["func"], 4, 1)
    switched = _ode(jump._field, 2, 2)
    rows = []
    for rtol in (1e-4, 1e-7):
        tol = (rtol, rtol * 1e-2)
        rows += [(f"Van der Pol μ = {mu:g}", vdp, [2.0, 0.0], [mu], (0.0, 30.0 if mu < 50 else 200.0), tol)
                 for mu in (1.0, 10.0, 30.0, 100.0)]
        rows += [("Lorenz", lorenz, [1.0, 1.0, 1.0], [10.0, 28.0, 8.0 / 3.0], (0.0, 20.0), tol),
                 ("Robertson", robertson, [1.0, 0.0, 0.0], [0.0], (0.0, 100.0), (rtol, rtol * 1e-4)),
                 ("Hodgkin-Huxley, constant input", hh_on, hh["y0"], [25.0], (0.0, 100.0), tol),
                 ("Hodgkin-Huxley, step input at 10, 90 (switched)", hh_step, hh["y0"], [25.0], (0.0, 100.0), tol)]
        rows += [(f"driven chain θ = {th} (switched)", switched, jump.Y0, th, (0.0, 8.0), tol)
                 for th in ([0.7, 3.0], [6.0, 1.0])]
    return rows


def kappa_ratios(sol) -> tuple[float, float, float]:
    """log10 of the largest consecutive ratio and of the largest over the median of the local diffusions, and the
    time of the largest ratio."""
    kappa = np.log10(sol.run.kappa[1:])
    steps = np.diff(kappa)
    i = int(np.argmax(steps))
    return float(steps[i]), float(kappa.max() - np.median(kappa)), float(sol.run.grid[i + 2])


def main() -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, Python "
          f"{platform.python_version()}, numpy {np.__version__}, pymc_pnode at {pn.__file__}\n")
    print("| problem | rtol | steps | log10 max consecutive κ ratio (at t) | log10 max κ / median κ | solve |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, ode, y0, theta, span, (rtol, atol) in problems():
        sol = pn.solve(ode, y0, theta, span, rtol=rtol, atol=atol, diffusion="local")
        ratio, spread, t = kappa_ratios(sol) if sol.run.kappa.size > 3 else (np.nan, np.nan, np.nan)
        print(f"| {label} | {rtol:g} | {sol.stats['n_steps']} | {ratio:.1f} ({t:.5g}) | {spread:.1f} | "
              f"{sol.stats['message'][:60]} |")
    print("\n| θ | exact | Fenrir defaults, undeclared | declared `discontinuities=[2, 5]` |")
    print("| --- | --- | --- | --- |")
    switched = _ode(jump._field, 2, 2)
    for theta in ([0.7, 3.0], [0.2, 0.5], [2.5, 8.0], [6.0, 1.0]):
        values = []
        for disc in (None, [jump.ON, jump.OFF]):
            extra = {} if disc is None else {"discontinuities": disc}
            try:
                ll = pn.fenrir_loglik(switched, jump.Y0, theta, jump.TIMES, jump.DATA, obs_sigma=jump.SIGMA, **extra)
                values.append(f"{float(ll.eval()):.3f}")
            except TypeError:  # a version of the package without the argument
                values.append("(no such argument)")
        print(f"| {theta} | {jump.exact_loglik(np.array(theta)):.3f} | {values[0]} | {values[1]} |")


if __name__ == "__main__":
    main()
