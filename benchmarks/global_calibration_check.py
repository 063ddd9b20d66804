"""The check of Fenrir's global diffusion against its local diffusions: what it flags, and its cost.

1. Flags. The three ODEs and parameter boxes of ``tests/test_fenrir_defaults.py`` (the accuracy table of
   ``benchmarks/fenrir_defaults.py``): for each point with a solution, the exact Gaussian log-likelihood around a
   DOP853 solution (rtol = atol = 1e-12), Fenrir with ``diffusion="global"`` and with the local diffusions (the
   default), both error-controlled at the default tolerances, and which accuracy counts the global evaluation
   raised (``n_calibration_gap``: more than ``GLOBAL_CALIBRATION_GAP`` nats from the local value;
   ``n_over_tolerance``: the quadrature check).
2. Cost on FitzHugh–Nagumo (the problem of ``benchmarks/fenrir_speed.py``): logp + gradient with the global
   diffusion, with the check and with the check switched off (its method replaced by one returning 0, in this
   process only), beside the default; medians over repeated calls taking turns.

Run: ``python benchmarks/global_calibration_check.py [--repeats 41]``; prints Markdown tables.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import warnings

import numpy as np
import pytensor
from scipy.stats import norm

import pymc_pnode as pn
from pymc_pnode.likelihoods.fenrir import FenrirProblem

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # tests/ as a package
sys.path.insert(0, os.path.dirname(__file__))
from fenrir_defaults import loglik_function, reference  # noqa: E402

from tests.test_fenrir_defaults import CASES  # noqa: E402  (the same ODEs and boxes as the tests)

warnings.filterwarnings("ignore", message="PyTensor could not link to a BLAS")
warnings.filterwarnings("ignore", category=pn.AccuracyWarning)  # counted below instead


def _problem_of(function) -> FenrirProblem:
    return [v for v in function.maker.fgraph.toposort() if hasattr(v.op, "problem")][0].op.problem


def flag_table() -> None:
    """Prints the table row by row as the points are evaluated (a run takes minutes)."""
    print("| ODE | θ | global − exact [nats] | local − exact [nats] | flagged (global) |")
    print("| --- | --- | --- | --- | --- |")
    totals = dict(points=0, gap=0, quadrature=0)
    for name, (func, n_theta, y0, times, truth, sd, box) in CASES.items():
        ode = pn.ODE(func, n_states=2, n_theta=n_theta)
        y0 = np.array(y0)
        data = reference(func, y0, np.array(truth), times)[:, :1] + sd * np.random.default_rng(0).standard_normal(
            (times.size, 1))
        glob, _ = loglik_function(ode, y0, times, data, sd, diffusion="global")
        local, _ = loglik_function(ode, y0, times, data, sd)
        counts = _problem_of(glob).diagnostics
        for th in box:
            th = np.array(th, dtype=float)
            ref = reference(func, y0, th, times)
            if ref is None:
                continue
            exact = norm.logpdf(data[:, 0], ref[:, 0], sd).sum()
            before = (counts.n_calibration_gap, counts.n_over_tolerance)
            value_global, value_local = float(glob(th)), float(local(th))
            gap, over = counts.n_calibration_gap - before[0], counts.n_over_tolerance - before[1]
            flags = [label for label, hit in (("calibration gap", gap), ("quadrature check", over)) if hit]
            totals["points"] += 1
            totals["gap"] += gap
            totals["quadrature"] += over
            print(f"| {name} | {th.tolist()} | {value_global - exact:.3g} | {value_local - exact:.3g} | "
                  f"{', '.join(flags) or '–'} |", flush=True)
    print(f"\n{totals['points']} points with a solution; the calibration gap flagged {totals['gap']}, the "
          f"quadrature check {totals['quadrature']}.")


def cost_table(repeats: int) -> list[str]:
    from fenrir_speed import SIGMA, THETA, TIMES, Y0, fhn, simulate_data

    ode = pn.ODE(fhn, n_states=2, n_theta=3)
    data = np.asarray(simulate_data(20240521)).reshape(-1, 1)
    calls = {}
    for label, kwargs in {"defaults (local diffusions)": {}, "global diffusion, checked": dict(diffusion="global"),
                          "global diffusion, check off": dict(diffusion="global")}.items():
        _, both = loglik_function(ode, Y0, TIMES, data, SIGMA, **kwargs)
        if label.endswith("check off"):
            problem = _problem_of(both)
            object.__setattr__(problem, "_global_calibration_gap", lambda *args: 0.0)  # this instance only
        both(THETA)
        calls[label] = lambda both=both: both(THETA)
    times = {label: [] for label in calls}
    for _ in range(repeats):  # taking turns, call by call
        for label, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[label].append(time.perf_counter() - t0)
    rows = [f"FitzHugh–Nagumo, {TIMES.size} observations, logp + gradient, median of {repeats} calls taking turns; "
            f"load average {os.getloadavg()}", "", "| Fenrir | median [ms] | min [ms] |", "| --- | --- | --- |"]
    for label, t in times.items():
        t = np.array(t) * 1e3
        rows.append(f"| {label} | {np.median(t):.2f} | {t.min():.2f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=41)
    args = parser.parse_args()
    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
          f"numpy {np.__version__}, pytensor {pytensor.__version__}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    flag_table()
    print()
    print("\n".join(cost_table(args.repeats)))


if __name__ == "__main__":
    main()
