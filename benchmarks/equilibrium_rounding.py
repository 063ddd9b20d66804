"""Starts within rounding of an equilibrium: Fenrir gradients against the value's central differences.

Logistic growth ``y' = r y (1 − y / K)`` (r = 0.8, K = 10) observed at t = 1, …, 12 (σ = 0.2, data around K) from
``y0 = K + δ``: at δ = 0 every residual is exactly zero (an exact equilibrium, counted and warned by the package);
for δ of a few ulps ``f(y0)`` is the rounding error of its cancelling terms, and the local diffusions estimated
from such residuals are rounding noise with derivatives ≈ 1e15 times their size. Since the rounding floor of the
local diffusion also counts the scale of those terms (``calibration.rounding_kappa``: ``Σ_a |L_ka ξ_a|`` for the
EK1, the running bound ``T(f_k)`` of f's rounding for the EK0, ``pymc_pnode._rounding_bound``), such steps take the
floor.

For each solver (EK1 dense and diagonal, EK0 dense and isotropic) and each setting (a fixed step 0.25 with the
local diffusion; the defaults: error control, local diffusion) the table gives the gradient in ``y0``, the value's
central difference (spacing 1e-5, where the value is smooth at a fixed step; with error control the grid may
switch inside it), their relative difference and whether a ``pn.AccuracyWarning`` was raised. A second table: the
largest absolute difference between ``pn.probabilistic_solution``'s mean Jacobian in ``y0`` (fixed step 0.25, local
diffusion) and central differences of its means, on a derivative of about 0.45.

Run: ``python benchmarks/equilibrium_rounding.py`` (a few minutes from empty caches); output in
``benchmarks/results/equilibrium_rounding.md``. ``PYTHONPATH=<tree>`` runs it against another checkout.
"""

from __future__ import annotations

import subprocess
import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt

import pymc_pnode as pn
from pymc_pnode.pn_solution import PNSolutionProblem

warnings.filterwarnings("ignore", message="PyTensor could not link to a BLAS")

THETA = np.array([0.8, 10.0])
TIMES = np.linspace(1.0, 12.0, 12)
SIGMA = 0.2
DELTAS = (0.0, 1e-15, 1e-14, 1e-13, 1e-12, 1e-10, 1e-8, 1e-6)
SOLVERS = (pn.EK1(3), pn.EK1(3, structure="diagonal"), pn.EK0(3), pn.EK0(3, structure="isotropic"))
SETTINGS = {"fixed step 0.25, local κ": dict(step=0.25, diffusion="local"), "defaults": {}}


def logistic(y, t, p):
    return [p[0] * y[0] * (1 - y[0] / p[1])]


def main() -> None:
    ode = pn.ODE(logistic, n_states=1, n_theta=2)
    data = THETA[1] + SIGMA * np.random.default_rng(0).standard_normal(TIMES.size)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=pn.__path__[0]).stdout.strip()
    except OSError:
        commit = "?"
    print(f"pymc_pnode from {pn.__path__[0]} (git {commit or '?'})\n")
    print("| solver | setting | y0 − K | value | gradient | central difference | rel. difference | warned |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for solver in SOLVERS:
        for label, kwargs in SETTINGS.items():
            y0 = pt.dvector("y0")
            ll = pn.fenrir_loglik(ode, y0, THETA, TIMES, data, obs_sigma=SIGMA, solver=solver, **kwargs)
            both = pytensor.function([y0], [ll, pytensor.grad(ll, y0)])
            value_fn = pytensor.function([y0], ll)
            for delta in DELTAS:
                start = THETA[1] + delta
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    value, grad = both([start])
                warned = any(issubclass(w.category, pn.AccuracyWarning) for w in caught)
                h = 1e-5
                central = (value_fn([start + h]) - value_fn([start - h])) / (2 * h)
                rel = abs(grad[0] - central) / abs(central)
                print(f"| {solver} | {label} | {delta:g} | {float(value):.10f} | {grad[0]:.6g} | {central:.6g} | "
                      f"{rel:.1e} | {'yes' if warned else 'no'} |", flush=True)

    print("\n| solver | y0 − K | max abs. difference of the mean Jacobian | largest derivative | warned |")
    print("| --- | --- | --- | --- | --- |")
    for solver in SOLVERS[:3]:
        problem = PNSolutionProblem(ode, TIMES, solver, 0.25, 1e-6, 1e-9, 100_000, "local")
        for delta in (1e-15, 1e-14, 1e-13, 1e-8):
            start = np.array([THETA[1] + delta])
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = problem.evaluate(start, THETA)
            warned = any(issubclass(w.category, pn.AccuracyWarning) for w in caught)
            h = 1e-5
            central = (problem.evaluate(start + h, THETA).mean - problem.evaluate(start - h, THETA).mean) / (2 * h)
            print(f"| {solver} | {delta:g} | {np.max(np.abs(out.jac_mean[..., 0] - central)):.2g} | "
                  f"{np.max(np.abs(central)):.4f} | {'yes' if warned else 'no'} |", flush=True)


if __name__ == "__main__":
    main()
