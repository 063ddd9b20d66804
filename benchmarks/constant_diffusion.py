"""Fenrir with error control and a constant diffusion: the value against the exact likelihood, and what warns.

With ``diffusion=κ`` given and no ``step``, the steps are still chosen by the error estimate, which uses each
step's own calibrated diffusion, while the filter runs with ``κ Q(h)`` on every step (one pass, no calibration).
The likelihood then carries the numerical variance of ``κ``: where ``κ`` is far above the calibrated scale, that
variance flattens the likelihood (which diffusion tempering relies on) and it departs from the exact one by design.
This script measures, on the three parameter boxes of ``tests/test_fenrir_defaults.py`` (relaxation oscillator,
finite-time blow-up, partially observed predator–prey), each evaluation's error against the exact Gaussian
log-likelihood around a DOP853 solution (rtol = atol = 1e-12) for the calibrated default and constant diffusions
from 1e-6 to 1e6, and whether a ``pn.AccuracyWarning`` was issued. An evaluation more than max(2 nats, 1 %) off
and not warned is marked "silent" (the test criterion of the defaults).

Run: ``python benchmarks/constant_diffusion.py [--diffusions 1e-6 1 1e3 1e6]``; output in
``benchmarks/results/constant_diffusion.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
from scipy.stats import norm

import pymc_pnode as pn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # tests/ as a package
from tests.test_fenrir_defaults import CASES, _reference  # noqa: E402  (the boxes and references of the tests)

warnings.filterwarnings("ignore", message=".*could not link to a BLAS.*")


def evaluate_box(name: str, diffusion: float | None) -> list[tuple]:
    """Per point of the case's box: (θ, Fenrir value, exact value, |error|, warned)."""
    func, n_theta, y0, times, truth, sd, box = CASES[name]
    y0 = np.array(y0)
    data = _reference(func, y0, np.array(truth), times)[:, :1] + sd * np.random.default_rng(0).standard_normal(
        (times.size, 1))
    theta = pt.vector("theta")
    loglik = pn.fenrir_loglik(pn.ODE(func, n_states=2, n_theta=n_theta), y0, theta, times, data,
                              obs_matrix=[[1.0, 0.0]], obs_sigma=sd, diffusion=diffusion)
    function = pytensor.function([theta], loglik)
    rows = []
    for point in map(np.array, box):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = float(function(point))
        warned = any(issubclass(w.category, pn.AccuracyWarning) for w in caught)
        reference = _reference(func, y0, point, times)
        exact = -np.inf if reference is None else float(norm.logpdf(data[:, 0], reference[:, 0], sd).sum())
        error = 0.0 if value == exact else abs(value - exact)  # inf: finite where no solution exists, or -inf
        rows.append((point, value, exact, error, warned))
    return rows


def is_silent(value: float, exact: float, warned: bool) -> bool:
    """Finite, not warned, and more than max(2 nats, 1 %) off the exact value or finite where no solution exists
    (``-inf`` is a refusal, not a silent error)."""
    if warned or value == -np.inf:
        return False
    return not np.isfinite(exact) or not np.isfinite(value) or abs(value - exact) > max(2.0, 0.01 * abs(exact))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--diffusions", nargs="+", type=float, default=[1e-6, 1.0, 1e3, 1e6])
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=pn.__path__[0]).stdout.strip()
    print(f"pymc_pnode {pn.__version__} (git {commit or '?'}); Python {platform.python_version()}, "
          f"{platform.machine()}, {os.cpu_count()} cores\n")
    print("| ODE | diffusion | points | max abs. error [nats] | max rel. error | warned | silent (> max(2, 1 %), "
          "not warned) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    details = []
    for name in CASES:
        for diffusion in [None, *args.diffusions]:
            rows = evaluate_box(name, diffusion)
            label = "calibrated (default)" if diffusion is None else f"{diffusion:g}"
            finite = [(err, abs(exact)) for _, _, exact, err, _ in rows if np.isfinite(exact)]
            silent = sum(is_silent(value, exact, warned) for _, value, exact, _, warned in rows)
            print(f"| {name} | {label} | {len(rows)} | {max(e for e, _ in finite):.3g} | "
                  f"{max(e / a for e, a in finite):.2g} | {sum(r[4] for r in rows)} | {silent} |", flush=True)
            details += [f"| {name} | {label} | {np.array2string(p, precision=3)} | {v:.6g} | {x:.6g} | {e:.3g} | "
                        f"{'yes' if w else 'no'} |" for p, v, x, e, w in rows]
    print("\nPer point:\n\n| ODE | diffusion | θ | Fenrir | exact | abs. error | warned |\n| --- | --- | --- | --- | "
          "--- | --- | --- |")
    print("\n".join(details))


if __name__ == "__main__":
    main()
