"""Error-controlled Fenrir where a tighter re-solve fails: the six-parameter Hodgkin–Huxley model at the truth.

The model, data and stimulus switches of ``case_studies/fenrir_dt_table1.ipynb`` (``"HH6"``: the paper's HH_1 row with
six parameters, seven states, V observed, 10,001 observations on [0, 100] ms). ``pn.fenrir_loglik`` at its
defaults, with the switches declared, and at other ``rtol``, ``atol`` and ``max_steps``: the value against the
exact Gaussian log-likelihood of the true trajectory, the diagnostics (re-solves, failed re-solves and why) and the
warning. A re-solve at tighter tolerances that runs out of ``max_steps`` keeps the looser solution; the warning says
so (``docs/fenrir.md``, "The quadrature check"). A ``pn.solve`` table shows the steps and the largest quadrature
defect of the one-pass solver at the same tolerances (``pn.solve`` does not re-solve).

Run: ``python benchmarks/resolve_failures.py`` (about a minute with warm caches).
"""

from __future__ import annotations

import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt
from scipy.stats import norm

import pymc_pnode as pn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "case_studies"))
import fenrir_dt_table1 as table1  # noqa: E402 (the case study's Hodgkin–Huxley problems and data)

# Fenrir's settings besides the defaults (rtol 1e-4, atol 1e-6, max_steps 20,000)
CASES = (dict(), dict(rtol=1e-5), dict(rtol=1e-6), dict(rtol=1e-6, atol=1e-9), dict(max_steps=100_000),
         dict(rtol=1e-6, max_steps=100_000))
# pn.solve's (rtol, atol)
SOLVE_TOLERANCES = ((1e-4, 1e-6), (1e-5, 1e-6), (1e-6, 1e-6), (1e-6, 1e-9), (1e-7, 1e-9))


def main() -> None:
    spec = table1.PROBLEMS["HH6"]
    times, truth, data = table1.data("HH6")
    ode = pn.ODE(spec["func"], n_states=spec["y0"].size, n_theta=spec["lb"].size)
    sigma = np.sqrt(table1.OBS_VAR)
    exact = norm.logpdf(data, truth @ spec["H"].T, sigma).sum()
    print(f"# HH6 at the truth, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, "
          f"pymc_pnode from {Path(pn.__file__).parent}")
    print(f"exact log-likelihood {exact:.4f}\n")
    print("| settings | Fenrir value | error (nats) | seconds | re-solved | re-solve failed | max defect | why |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    theta = pt.dvector("theta")
    warned = []
    for settings in CASES:
        loglik = pn.fenrir_loglik(ode, spec["y0"], theta, times, data, obs_matrix=spec["H"], obs_sigma=sigma,
                                  solver=pn.EK1(order=3), discontinuities=table1.HH_JUMPS, **settings)
        value_fn = pytensor.function([theta], loglik)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            start = time.perf_counter()
            value = float(value_fn(spec["theta_true"]))
            seconds = time.perf_counter() - start
        messages = [str(w.message) for w in caught if issubclass(w.category, pn.AccuracyWarning)]
        warned.extend(messages)
        diagnostics = loglik.owner.inputs[0].owner.op.problem.diagnostics  # Sum(FenrirOp(...))
        label = ", ".join(f"{k}={v:g}" for k, v in settings.items()) or "defaults"
        print(f"| {label} | {value:.4f} | {value - exact:.3g} | "
              f"{seconds:.1f} | {diagnostics.n_tightened} | {diagnostics.n_tightening_failed} | "
              f"{diagnostics.max_error:.3g} | {diagnostics.last_tightening_failure or '–'} |")
    print("\nwarnings:")
    for message in warned:
        print(f"- {message}")

    print("\n`pn.solve` (one pass, local diffusion, no re-solve), the same switches:\n")
    print("| rtol | atol | steps | rejected | success | max local error | max quadrature defect |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for rtol, atol in SOLVE_TOLERANCES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", pn.AccuracyWarning)
            sol = pn.solve(ode, spec["y0"], spec["theta_true"], (0.0, float(times[-1])), solver=pn.EK1(3), rtol=rtol,
                           atol=atol, discontinuities=table1.HH_JUMPS, max_steps=20_000)
        stats = sol.stats
        print(f"| {rtol:g} | {atol:g} | {stats['n_steps']} | {stats['n_rejected']} | {sol.success} | "
              f"{stats['max_error']:.3g} | {stats['max_defect']:.3g} |")


if __name__ == "__main__":
    main()
