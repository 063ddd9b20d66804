"""Fenrir at its defaults on thirteen ODEs and boxes of their own: value and gradient against the exact likelihood's.

Seven small models — Michaelis–Menten with product decay, the Brusselator, a damped pendulum with its angle
observed, SIR with the infected fraction observed, Van der Pol with μ from 0.5 to 5, Gompertz growth with one state,
Lotka–Volterra with four parameters (Van der Pol and Lotka–Volterra also appear in the defaults' accuracy tests,
with other settings; the Brusselator and SIR are checked by ``tests/test_fenrir_defaults.py`` too) — and six added
on 2026-12-08 with other state dimensions and kinds: Lorenz-63 over three time units, Robertson's stiff kinetics
(exact reference by Radau, ``REFERENCE_METHOD``), SEIR with four states, a damped oscillator driven in ``t``,
logistic growth from 10 to 10⁴ and a six-state repressilator with its Hill exponent as a parameter;
each with data simulated at its true parameters. At random points of
a box around them (log-uniform, the factors in ``PROBLEMS``) the default ``pn.fenrir_loglik`` (error control,
local calibrated diffusion; no step, no diffusion given) and its gradient are compared with the exact Gaussian
log-likelihood around a DOP853 solution (rtol = atol = 1e-12) and that likelihood's central differences (spacing
1e-6 θ). The two do not have to agree to rounding — Fenrir's value is the PN approximation at the tolerances asked
for, and its gradient is the exact gradient of that value on the grid the evaluation chose — but a point whose
value or gradient is more than 1 % off without a ``pn.AccuracyWarning`` would be silently wrong, and is marked.
A last column compares the gradient with central differences of Fenrir's own value (spacing 1e-7 θ): the
controller's step sizes are continuous functions of θ, so the value's derivative also has the grid's motion in it,
which the gradient leaves out by design (the grid is treated as fixed, as discrete adjoints of adaptive solvers do).

Run: ``python benchmarks/gradient_audit.py [--points 12] [--seed 1] [problem ...]``; output in
``benchmarks/results/gradient_audit.md``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
from scipy.integrate import solve_ivp

import pymc_pnode as pn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # tests/ as a package
from tests.test_fenrir_defaults import brusselator, sir  # noqa: E402  (the vector fields the tests use too)
from tests.test_fenrir_defaults import relaxation_oscillator as van_der_pol  # noqa: E402

warnings.filterwarnings("ignore", message="PyTensor could not link to a BLAS")


def michaelis_menten(y, t, p):
    rate = p[0] * y[0] / (p[1] + y[0])
    return [-rate, rate - p[2] * y[1]]


def pendulum(y, t, p):
    return [y[1], -p[0] * np.sin(y[0]) - p[1] * y[1]]


def gompertz(y, t, p):
    return [p[0] * y[0] * np.log(p[1] / y[0])]


def lotka_volterra(y, t, p):
    return [p[0] * y[0] - p[1] * y[0] * y[1], p[2] * y[0] * y[1] - p[3] * y[1]]


def lorenz(y, t, p):
    return [p[0] * (y[1] - y[0]), y[0] * (p[1] - y[2]) - y[1], y[0] * y[1] - p[2] * y[2]]


def robertson(y, t, p):
    # Robertson's chemical kinetics: rate constants 0.04, 3e7, 1e4, a classic stiff problem.
    return [-p[0] * y[0] + p[2] * y[1] * y[2], p[0] * y[0] - p[2] * y[1] * y[2] - p[1] * y[1] ** 2,
            p[1] * y[1] ** 2]


def seir(y, t, p):
    infections = p[0] * y[0] * y[2]
    return [-infections, infections - p[1] * y[1], p[1] * y[1] - p[2] * y[2], p[2] * y[2]]


def forced_oscillator(y, t, p):
    # A damped oscillator driven at angular frequency p[2]: the vector field depends on t.
    return [y[1], -p[0] * y[0] - p[1] * y[1] + np.cos(p[2] * t)]


def logistic(y, t, p):
    # Growth to a carrying capacity p[1] of 10⁴ from 10: states far above atol, a relative scale of 10³.
    return [p[0] * y[0] * (1 - y[0] / p[1])]


def repressilator(y, t, p):
    # Three genes repressing each other in a cycle (mRNA y[0:3], protein y[3:6]), Hill exponent p[2].
    alpha, beta, hill = p[0], p[1], p[2]
    return [-y[0] + alpha / (1 + y[5] ** hill) + 0.5, -y[1] + alpha / (1 + y[3] ** hill) + 0.5,
            -y[2] + alpha / (1 + y[4] ** hill) + 0.5, -beta * (y[3] - y[0]), -beta * (y[4] - y[1]),
            -beta * (y[5] - y[2])]


# name: (f, y0, true θ, box factors (low, high), observation times, observed states, noise sd)
PROBLEMS = {
    "Michaelis–Menten": (michaelis_menten, [5.0, 0.0], [1.0, 2.0, 0.3], (0.3, 3.0), np.linspace(0.5, 10, 15),
                         [0, 1], 0.1),
    "Brusselator": (brusselator, [1.0, 1.0], [1.0, 3.0], (0.5, 1.5), np.linspace(0.5, 15, 20), [0, 1], 0.2),
    "pendulum": (pendulum, [1.0, 0.0], [4.0, 0.2], (0.5, 2.0), np.linspace(0.25, 8, 20), [0], 0.05),
    "SIR": (sir, [0.99, 0.01], [0.5, 0.1], (0.5, 2.0), np.linspace(2, 60, 20), [1], 0.02),
    "Van der Pol": (van_der_pol, [2.0, 0.0], [2.0], (0.25, 2.5), np.linspace(0.5, 15, 25), [0], 0.1),
    "Gompertz": (gompertz, [0.5], [0.5, 10.0], (0.5, 2.0), np.linspace(1, 15, 12), [0], 0.2),
    "Lotka–Volterra (4 parameters)": (lotka_volterra, [1.0, 1.0], [1.5, 1.0, 1.0, 3.0], (0.6, 1.6),
                                      np.linspace(0.5, 10, 20), [0, 1], 0.15),
    "Lorenz": (lorenz, [1.0, 1.0, 1.0], [10.0, 28.0, 8.0 / 3.0], (0.8, 1.25), np.linspace(0.1, 3, 30), [0], 1.0),
    "Robertson (stiff)": (robertson, [1.0, 0.0, 0.0], [0.04, 3e7, 1e4], (0.5, 2.0), np.geomspace(0.1, 100, 20),
                          [0, 2], 0.01),
    "SEIR": (seir, [0.99, 0.0, 0.01, 0.0], [0.8, 0.3, 0.2], (0.7, 1.4), np.linspace(2, 80, 25), [2], 0.01),
    "forced oscillator": (forced_oscillator, [0.0, 0.0], [2.0, 0.3, 1.2], (0.7, 1.4), np.linspace(0.5, 20, 30),
                          [0], 0.05),
    "logistic, 10 to 10⁴": (logistic, [10.0], [0.5, 1e4], (0.7, 1.4), np.linspace(1, 30, 20), [0], 100.0),
    "repressilator (6 states)": (repressilator, [1.0, 2.0, 3.0, 1.0, 2.0, 3.0], [50.0, 2.0, 2.0], (0.7, 1.4),
                                 np.linspace(1, 40, 30), [3, 4, 5], 2.0),
}


# The reference solver where DOP853 would need millions of steps (implicit, at the same tolerances).
REFERENCE_METHOD = {"Robertson (stiff)": "Radau"}


def reference_solution(f, y0, theta, times, method="DOP853"):
    return solve_ivp(lambda t, y: f(y, t, theta), (0.0, times[-1]), y0, t_eval=times, method=method,
                     rtol=1e-12, atol=1e-12)


def exact_loglik(f, y0, theta, times, data, rows, sd, method="DOP853") -> float:
    solution = reference_solution(f, y0, theta, times, method)
    if not solution.success:
        return -np.inf
    residual = data - solution.y[rows].T
    return float(-0.5 * np.sum(residual**2) / sd**2 - residual.size * np.log(np.sqrt(2 * np.pi) * sd))


def relative_central_differences(function, x: np.ndarray, spacing: float) -> np.ndarray:
    """Central differences of a scalar function, each coordinate shifted by ``spacing`` times its value."""
    differences = np.empty_like(x)
    for j in range(x.size):
        shift = np.zeros_like(x)
        shift[j] = spacing * x[j]
        differences[j] = (function(x + shift) - function(x - shift)) / (2 * shift[j])
    return differences


def audit(name: str, n_points: int, rng: np.random.Generator, details: list[str]) -> str:
    f, y0, theta, (low, high), times, rows, sd = PROBLEMS[name]
    y0, theta = np.asarray(y0), np.asarray(theta)
    method = REFERENCE_METHOD.get(name, "DOP853")
    data = reference_solution(f, y0, theta, times, method).y[rows].T
    data = data + sd * rng.standard_normal(data.shape)
    ode = pn.ODE(f, n_states=y0.size, n_theta=theta.size)
    theta_var = pt.dvector("theta")
    loglik = pn.fenrir_loglik(ode, y0, theta_var, times, data, obs_matrix=np.eye(y0.size)[rows], obs_sigma=sd)
    function = pytensor.function([theta_var], [loglik, pytensor.grad(loglik, theta_var)])
    start = time.perf_counter()
    function(theta)
    first_call = time.perf_counter() - start
    value_errors, gradient_errors, grid_motions, warned, silent = [], [], [], 0, 0
    for _ in range(n_points):
        point = theta * np.exp(rng.uniform(np.log(low), np.log(high), theta.size))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value, gradient = function(point)
        flagged = any(issubclass(w.category, pn.AccuracyWarning) for w in caught)
        warned += flagged
        exact = exact_loglik(f, y0, point, times, data, rows, sd, method)
        exact_grad = relative_central_differences(
            lambda th: exact_loglik(f, y0, th, times, data, rows, sd, method), point, 1e-6)
        own_difference = relative_central_differences(lambda th: function(th)[0], point, 1e-7)
        grid_motion = np.linalg.norm(gradient - own_difference) / max(1.0, np.linalg.norm(own_difference))
        grid_motions.append(grid_motion)
        value_error = abs(value - exact) / max(1.0, abs(exact))
        gradient_error = np.linalg.norm(gradient - exact_grad) / max(1.0, np.linalg.norm(exact_grad))
        value_errors.append(value_error)
        gradient_errors.append(gradient_error)
        is_silent = max(value_error, gradient_error) > 1e-2 and not flagged
        silent += is_silent
        details.append(f"| {name} | {np.array2string(point, precision=4)} | {value:.6g} | {exact:.6g} | "
                       f"{value_error:.1e} | {gradient_error:.1e} | {np.linalg.norm(exact_grad):.3g} | "
                       f"{'yes' if flagged else 'no'}{' **silent**' if is_silent else ''} | {grid_motion:.1e} |")
    return (f"| {name} | {theta.size} | {n_points} | {max(value_errors):.1e} | {np.median(gradient_errors):.1e} | "
            f"{max(gradient_errors):.1e} | {warned} | {silent} | "
            f"{np.median(grid_motions):.1e} / {max(grid_motions):.1e} | {first_call:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", nargs="*", help=f"default: all of {', '.join(PROBLEMS)}")
    parser.add_argument("--points", type=int, default=12)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    unknown = set(args.problems) - set(PROBLEMS)
    if unknown:
        parser.error(f"unknown problems {sorted(unknown)}")
    rng = np.random.default_rng(args.seed)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=pn.__path__[0]).stdout.strip()
    print(f"pymc_pnode {pn.__version__} (git {commit or '?'}), {args.points} points per problem, seed {args.seed}\n")
    print("| problem | parameters | points | worst value rel. error | median gradient rel. error | "
          "worst gradient rel. error | warned | silently > 1 % off | "
          "gradient vs own value's difference (median / worst) | compile + first call (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    details: list[str] = []
    for name in args.problems or PROBLEMS:
        print(audit(name, args.points, rng, details), flush=True)
    print("\nPer point (relative errors: |value − exact| / max(1, |exact|), ‖g − g_exact‖ / max(1, ‖g_exact‖)):\n")
    print("| problem | θ | Fenrir value | exact | value rel. error | gradient rel. error | ‖g_exact‖ | warned | "
          "gradient vs own value's difference |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(details))


if __name__ == "__main__":
    main()
