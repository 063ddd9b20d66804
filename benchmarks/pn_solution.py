"""Cost of ``pn.probabilistic_solution``'s outputs: filtering and smoothed marginals, the covariance across times.

FitzHugh–Nagumo (the benchmark problem of ``docs/benchmarks.md``: y0 = (-1, 1), θ = (0.2, 0.2, 3), EK1(3)), both
states observed at t = 1, 2, …, 20 with Gaussian noise sd 0.1. Value and gradient (w.r.t. y0 and θ, compiled
PyTensor function, default mode) of four Gaussian log-likelihoods at the true parameters:

* ``filter``: ``N(mean, σ² + std²)`` per observation, filtering marginals (``smooth=False``, the default);
* ``smooth``: the same with the smoothing posterior's marginals (``smooth=True``);
* ``joint``: ``N(mean.ravel(), σ² I + cov)`` with the covariance across times (``smooth=True, joint_cov=True``);
* ``fenrir``: ``pn.fenrir_loglik(..., diffusion="global")``, the same number as ``joint`` (tested to 1e-10)
  by a backward Kalman filter.

At a fixed step 0.05 (the diffusion calibrated globally, the default there) and with error control (rtol 1e-6,
atol 1e-9, the defaults of ``probabilistic_solution``) twice: with the global calibration (``diffusion="calibrated"``,
as Fenrir's ``"global"``) and with the default local diffusion of each step (without the ``fenrir`` row: Fenrir's
local diffusion is estimated differently, docs/fenrir.md). Medians over ``--repeats`` calls, the functions of a
setting taking turns.

Run: ``python benchmarks/pn_solution.py [--repeats 50]``; prints a Markdown table.

``--lorenz96 D [D ...]`` instead times the filtering output of the block-diagonal EK1 (``EK1(3, "diagonal")``)
on Lorenz-96 with ``D`` states (F = 8, y0 = F + sin(i), every state observed at t = 0.1, 0.2, …, 1.0, fixed step
0.01): value and gradient of the same Gaussian log-likelihood, and the first call (compiles the model's
generated functions; the library kernels come from the cache).
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt

import pymc_pnode as pn

Y0, THETA, SIGMA = np.array([-1.0, 1.0]), np.array([0.2, 0.2, 3.0]), 0.1
TIMES = np.arange(1.0, 20.5, 1.0)


def fitzhugh_nagumo(y, t, p):
    return [p[2] * (y[0] - y[0] ** 3 / 3 + y[1]), -(y[0] - p[0] + p[1] * y[1]) / p[2]]


def functions(ode, data, step, diffusion):
    """The compiled ``(value, grad_y0, grad_theta)`` functions at one setting (``fenrir`` only with the global
    calibration)."""
    kwargs = dict(step=step) if step is not None else dict(diffusion=diffusion)
    out = {}
    for name in ("filter", "smooth", "joint", "fenrir")[:3 if diffusion == "local" else 4]:
        y0, theta = pt.dvector("y0"), pt.dvector("theta")
        if name == "fenrir":
            value = pn.fenrir_loglik(ode, y0, theta, TIMES, data, obs_sigma=SIGMA, diffusion="global",
                                     rtol=1e-6, atol=1e-9, step=step)
        elif name == "joint":
            mean, _, cov = pn.probabilistic_solution(ode, y0, theta, TIMES, smooth=True, joint_cov=True, **kwargs)
            value = pm.logp(pm.MvNormal.dist(mean.ravel(), cov + SIGMA**2 * np.eye(data.size)), data.ravel())
        else:
            mean, std = pn.probabilistic_solution(ode, y0, theta, TIMES, smooth=name == "smooth", **kwargs)
            value = pm.logp(pm.Normal.dist(mean, pt.sqrt(SIGMA**2 + std**2)), data).sum()
        out[name] = pytensor.function([y0, theta], [value, *pt.grad(value, [y0, theta])])
    return out


def lorenz96(y, t, p):
    d = len(y)
    return [(y[(i + 1) % d] - y[i - 2]) * y[i - 1] - y[i] + p[0] for i in range(d)]


def diagonal_ek1_rows(states: list[int], repeats: int) -> None:
    """The ``--lorenz96`` table: filtering output of the block-diagonal EK1 against the number of states."""
    times = np.round(np.arange(1, 11) * 0.1, 10)
    print("| d | first call (s) | logp+grad (ms) | log-likelihood |")
    print("|---|---|---|---|")
    for d in states:
        ode = pn.ODE(lorenz96, n_states=d, n_theta=1)
        y0_true, theta_true = 8.0 + np.sin(np.arange(d)), np.array([8.0])
        truth = pn.solve(ode, y0_true, theta_true, (0.0, 1.0), save_at=times, step=0.001).mean
        data = truth + SIGMA * np.random.default_rng(0).standard_normal(truth.shape)
        y0, theta = pt.dvector("y0"), pt.dvector("theta")
        mean, std = pn.probabilistic_solution(ode, y0, theta, times, solver=pn.EK1(3, structure="diagonal"),
                                              step=0.01)
        value = pm.logp(pm.Normal.dist(mean, pt.sqrt(SIGMA**2 + std**2)), data).sum()
        tick = time.perf_counter()
        f = pytensor.function([y0, theta], [value, *pt.grad(value, [y0, theta])])
        logp = float(f(y0_true, theta_true)[0])
        first = time.perf_counter() - tick
        spent = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            f(y0_true, theta_true)
            spent.append(time.perf_counter() - t0)
        print(f"| {d} | {first:.1f} | {1e3 * np.median(spent):.2f} | {logp:.6f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--lorenz96", type=int, nargs="+", help="the block-diagonal EK1 table for these sizes")
    args = parser.parse_args()
    if args.lorenz96:
        print(f"Python {platform.python_version()}, numpy {np.__version__}, pymc {pm.__version__}, "
              f"{platform.machine()}; medians over {args.repeats} calls\n")
        diagonal_ek1_rows(args.lorenz96, args.repeats)
        return
    ode = pn.ODE(fitzhugh_nagumo, n_states=2, n_theta=3)
    truth = pn.solve(ode, Y0, THETA, (0.0, 20.0), save_at=TIMES, step=0.005).mean
    data = truth + SIGMA * np.random.default_rng(0).standard_normal(truth.shape)
    print(f"Python {platform.python_version()}, numpy {np.__version__}, pymc {pm.__version__}, "
          f"{platform.machine()}; medians over {args.repeats} calls\n")
    print("| step | output | log-likelihood | logp+grad (ms) | × filter |")
    print("|---|---|---|---|---|")
    for step, diffusion in ((0.05, None), (None, "calibrated"), (None, "local")):
        fns = functions(ode, data, step, diffusion)
        values = {name: float(f(Y0, THETA)[0]) for name, f in fns.items()}  # also compiles the kernels
        times = {name: [] for name in fns}
        for _ in range(args.repeats):
            for name, f in fns.items():
                t0 = time.perf_counter()
                f(Y0, THETA)
                times[name].append(time.perf_counter() - t0)
        base = np.median(times["filter"])
        for name in fns:
            med = np.median(times[name])
            label = f"{step}" if step is not None else f"error control, {diffusion}"
            print(f"| {label} | {name} | {values[name]:.6f} | {1e3 * med:.3f} | {med / base:.2f} |")


if __name__ == "__main__":
    main()
