"""``pn.solve``'s calibration: global against local diffusion, with adaptive and with fixed steps.

Six two-state ODEs (FitzHugh–Nagumo, Van der Pol μ = 5, Lotka–Volterra, Brusselator, SIR, pendulum) and the stiff
three-state Robertson kinetics, EK1(3), the smoothing posterior at 50 times (equidistant; log-spaced from 1e-3 for
Robertson). For each setting: the largest absolute error against Radau at
rtol 1e-12 and the median and 95 % quantile of ``|error| / std`` over times and states (calibrated: about 0.67 and
2; much larger is over-confident, much smaller under-confident), the number of steps and the largest scaled
local error estimate (with a fixed step, above 1 warns). This chose ``pn.solve``'s
default diffusion (local with adaptive steps, global with a fixed step; Bosch, Hennig & Tronarp, 2021, §6.2).

Run: ``python benchmarks/solve_calibration.py [--check-cost]``; prints Markdown tables for ``docs/benchmarks.md``
(``--check-cost`` also times fixed-step solves with the local-error check off and on, taking turns).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
import warnings

import numpy as np
import pytensor.tensor as pt
from scipy.integrate import solve_ivp

import pymc_pnode as pn

warnings.filterwarnings("ignore", message="PyTensor could not link to a BLAS")
warnings.filterwarnings("ignore", category=pn.AccuracyWarning)  # the table reports the check (max_error)


def fitzhugh_nagumo(y, t, p):
    return [p[2] * (y[0] - y[0] ** 3 / 3 + y[1]), -(y[0] - p[0] + p[1] * y[1]) / p[2]]


def van_der_pol(y, t, p):
    return [y[1], p[0] * (1 - y[0] ** 2) * y[1] - y[0]]


def lotka_volterra(y, t, p):
    return [p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]]


def brusselator(y, t, p):
    return [p[0] - (p[1] + 1) * y[0] + y[0] ** 2 * y[1], p[1] * y[0] - y[0] ** 2 * y[1]]


def sir(y, t, p):
    return [-p[0] * y[0] * y[1], p[0] * y[0] * y[1] - p[1] * y[1]]


def pendulum(y, t, p, sin=pt.sin):
    return [y[1], -p[0] * sin(y[0])]


def robertson(y, t, p):
    return [-p[0] * y[0] + p[1] * y[1] * y[2], p[0] * y[0] - p[1] * y[1] * y[2] - p[2] * y[1] ** 2, p[2] * y[1] ** 2]


# name: (field, field for scipy, y0, θ, end time)
PROBLEMS = {
    "FitzHugh–Nagumo": (fitzhugh_nagumo, fitzhugh_nagumo, [-1.0, 1.0], [0.2, 0.2, 3.0], 20.0),
    "Van der Pol (μ = 5)": (van_der_pol, van_der_pol, [2.0, 0.0], [5.0], 20.0),
    "Lotka–Volterra": (lotka_volterra, lotka_volterra, [1.0, 1.0], [1.5, 1.0, 3.0, 1.0], 15.0),
    "Brusselator": (brusselator, brusselator, [1.0, 1.0], [1.0, 3.0], 20.0),
    "SIR": (sir, sir, [0.99, 0.01], [3.0, 1.0], 10.0),
    "pendulum": (pendulum, lambda y, t, p: pendulum(y, t, p, np.sin), [2.5, 0.0], [4.0], 15.0),
    "Robertson (stiff; log-spaced times)": (robertson, robertson, [1.0, 0.0, 0.0], [0.04, 1e4, 3e7], 40.0),
}
SETTINGS = {"adaptive": [dict(rtol=r, atol=r * 1e-2) for r in (1e-3, 1e-4, 1e-6)],
            "fixed": [dict(step=h) for h in (0.05, 0.01, 0.002)]}


def table(kind: str) -> list[str]:
    rows = [f"| ODE | {'rtol (atol = rtol/100)' if kind == 'adaptive' else 'step'} | diffusion | max error | "
            "median \\|e\\|/sd | 95 % \\|e\\|/sd | steps | largest scaled local error estimate |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, (field, np_field, y0, theta, t1) in PROBLEMS.items():
        ode = pn.ODE(field, n_states=len(y0), n_theta=len(theta))
        times = np.geomspace(1e-3, t1, 50) if name.startswith("Robertson") else np.linspace(t1 / 50, t1, 50)
        ref = solve_ivp(lambda t, y: np.array(np_field(y, t, theta), dtype=float), (0.0, t1), y0, method="Radau",
                        rtol=1e-12, atol=1e-13, t_eval=times).y.T
        for setting in SETTINGS[kind]:
            for diffusion in ("calibrated", "local"):
                sol = pn.solve(ode, y0, theta, (0.0, t1), save_at=times, diffusion=diffusion, **setting)
                err = np.abs(sol.mean - ref)
                z = err / sol.std
                label = f"{setting['rtol']:.0e}" if kind == "adaptive" else f"{setting['step']}"
                rows.append(f"| {name} | {label} | {diffusion} | {err.max():.1e} | {np.median(z):.2f} | "
                            f"{np.quantile(z, 0.95):.1f} | {sol.stats['n_steps']} | {sol.stats['max_error']:.2g} |")
    return rows


def check_cost(rounds: int = 6, repeats: int = 15) -> list[str]:
    """Milliseconds per fixed-step ``pn.solve`` (FitzHugh–Nagumo on [0, 20]) with the local-error check off and on,
    taking turns in this process (median over rounds of the median of ``repeats`` solves)."""
    solve_module = sys.modules["pymc_pnode.solve"]
    checked = solve_module.Stepping
    unchecked = lambda *args: checked(*args[:-1], False)  # noqa: E731  (report_error off)
    ode = pn.ODE(fitzhugh_nagumo, n_states=2, n_theta=3)
    times: dict = {}
    try:
        for _ in range(rounds):
            for label, stepping in (("off", unchecked), ("on", checked)):
                solve_module.Stepping = stepping
                for step in (0.05, 0.01):
                    for smooth in (False, True):
                        runs = []
                        for _ in range(repeats):
                            start = time.perf_counter()
                            pn.solve(ode, [-1.0, 1.0], [0.2, 0.2, 3.0], (0.0, 20.0), step=step, smooth=smooth)
                            runs.append(time.perf_counter() - start)
                        times.setdefault((step, smooth, label), []).append(np.median(runs))
    finally:
        solve_module.Stepping = checked
    rows = ["| step | smoothed | check off [ms] | check on [ms] |", "| --- | --- | --- | --- |"]
    for step in (0.05, 0.01):
        for smooth in (False, True):
            off, on = (1e3 * np.median(times[(step, smooth, label)]) for label in ("off", "on"))
            rows.append(f"| {step} | {smooth} | {off:.3f} | {on:.3f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check-cost", action="store_true", help="also time the fixed-step check, off and on")
    args = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}, numpy {np.__version__}, pymc_pnode {pn.__version__}\n")
    for kind in SETTINGS:
        print(f"**{kind} steps**\n")
        print("\n".join(table(kind)) + "\n")
    if args.check_cost:
        print("**cost of the fixed-step check**\n")
        print("\n".join(check_cost()) + "\n")


if __name__ == "__main__":
    main()
