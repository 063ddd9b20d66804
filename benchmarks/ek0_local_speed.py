"""The EK0 with local diffusions: what the rounding floor's bound ``T(f)`` costs (run against two trees in turns).

Where an EK0 calibrates local diffusions, each step's rounding floor also evaluates the generated bound ``T(f)`` of
``f``'s rounding (:attr:`pymc_pnode.ODE.term_scale`): in the forward pass, the second pass and the reverse sweep of
Fenrir, in ``pn.solve``'s one-pass filter. This times exactly those paths: Fenrir log-likelihood + gradient at the
defaults (error control, local diffusion) and at a fixed step with ``diffusion="local"``, and ``pn.solve`` at its
defaults, with the dense EK0(3) on FitzHugh–Nagumo (y1 observed at 1.0, 1.1, …, 20.0, sd 0.1) and the isotropic
EK0(3) on Lorenz-96 (every state observed at 0.1, 0.2, …, 2.0, sd 0.5; d = 20 and 100). Medians over ``--repeats``
calls after a warm-up.

Run: ``PYTHONPATH=<tree> python benchmarks/ek0_local_speed.py [--repeats 21]``; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import subprocess
import time
import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
from scipy.integrate import solve_ivp

import pymc_pnode as pn

warnings.filterwarnings("ignore", message="PyTensor could not link to a BLAS")
warnings.filterwarnings("ignore", category=pn.AccuracyWarning)


def fitzhugh_nagumo(y, t, p):
    return [p[2] * (y[0] - y[0] ** 3 / 3 + y[1]), -(y[0] - p[0] + p[1] * y[1]) / p[2]]


def lorenz96(d):
    def field(y, t, p):
        return [(y[(i + 1) % d] - y[(i - 2) % d]) * y[(i - 1) % d] - y[i] + p[0] for i in range(d)]

    return field


def _problem(name: str):
    """(ODE, y0, θ, times, data, observation matrix, σ, solver, fixed step)."""
    rng = np.random.default_rng(0)
    if name == "FitzHugh–Nagumo, EK0(3)":
        ode, y0, theta = pn.ODE(fitzhugh_nagumo, 2, 3), np.array([-1.0, 1.0]), np.array([0.2, 0.2, 3.0])
        times, sigma, obs, step = np.round(np.arange(1.0, 20.0001, 0.1), 10), 0.1, [[1.0, 0.0]], 0.01
        solver = pn.EK0(3)
    else:
        d = int(name.split("d = ")[1].split(",")[0])
        ode, theta = pn.ODE(lorenz96(d), d, 1), np.array([8.0])
        y0 = 8.0 + rng.uniform(-1.0, 1.0, d)
        times, sigma, obs, step = np.round(np.arange(1, 21) * 0.1, 10), 0.5, np.eye(d), 0.005
        solver = pn.EK0(3, structure="isotropic")
    exact = solve_ivp(lambda t, y: ode.f(y, t, theta), (0.0, times[-1]), y0, t_eval=times, method="DOP853",
                      rtol=1e-12, atol=1e-12).y.T
    clean = exact @ np.asarray(obs, dtype=float).T
    data = clean + sigma * rng.standard_normal(clean.shape)
    return ode, y0, theta, times, data, obs, sigma, solver, step


def _median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=pn.__path__[0]).stdout.strip()
    print(f"pymc_pnode from {pn.__path__[0]} (git {commit or '?'}), medians of {args.repeats} calls\n")
    print("| problem | Fenrir defaults, logp+grad | Fenrir fixed step, local κ, logp+grad | pn.solve defaults |")
    print("| --- | --- | --- | --- |")
    for name in ("FitzHugh–Nagumo, EK0(3)", "Lorenz-96 d = 20, isotropic EK0(3)",
                 "Lorenz-96 d = 100, isotropic EK0(3)"):
        ode, y0, theta, times, data, obs, sigma, solver, step = _problem(name)
        x = pt.dvector("x")
        d, k = ode.n_states, ode.n_theta
        cells = []
        for kwargs in ({}, dict(step=step, diffusion="local")):
            ll = pn.fenrir_loglik(ode, x[:d], x[d:d + k], times, data, obs_matrix=obs, obs_sigma=sigma,
                                  solver=solver, **kwargs)
            fn = pytensor.function([x], [ll, pytensor.grad(ll, x)])
            point = np.concatenate([y0, theta])
            value = float(fn(point)[0])
            cells.append(f"{_median_ms(lambda: fn(point), args.repeats):.2f} ms (logp {value:.4f})")
        sol = pn.solve(ode, y0, theta, (0.0, float(times[-1])), solver=solver, save_at=times)
        solve_ms = _median_ms(lambda: pn.solve(ode, y0, theta, (0.0, float(times[-1])), solver=solver,
                                               save_at=times), args.repeats)
        cells.append(f"{solve_ms:.2f} ms ({sol.stats['n_steps']} steps)")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
