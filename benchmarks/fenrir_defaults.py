"""Fenrir with its defaults: accuracy against the exact likelihood, and cost against fixed steps.

1. Accuracy. Three ODEs with one state observed — a relaxation oscillator (Van der Pol, μ up to 10), a
   field with a finite-time blow-up region (y1' = a y1² − b y1) and partially observed predator–prey —
   over a box of parameters (the boxes of ``tests/test_fenrir_defaults.py``). For each point: the exact
   Gaussian log-likelihood around a DOP853 solution (rtol = atol = 1e-12), and Fenrir with its defaults
   (error control at rtol 1e-4, atol 1e-6, local calibrated diffusion), with the global calibrated
   diffusion, and at fixed steps with a fixed diffusion 1.
2. Cost on FitzHugh–Nagumo (the problem of ``benchmarks/fenrir_speed.py``: y1 observed at 1.0, 1.1, …, 20.0,
   noise sd 0.1, IWP(3), EK1): logp + gradient of the defaults beside fixed steps, with each one's
   log-likelihood error at the true parameters (fixed steps with diffusion 1 and with the default local
   diffusions); medians over repeated calls taking turns. With JAX and
   probdiffeq importable (the ``bench`` extra, or a separate environment that also sees this package), the
   peer's jitted fixed-step ``value_and_grad`` takes turns in the same loop.

Run: ``python benchmarks/fenrir_defaults.py [--repeats 41] [--cost-only]``; prints Markdown tables for
``docs/benchmarks.md``.
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
import pytensor.tensor as pt
from scipy.integrate import solve_ivp
from scipy.stats import norm

import pymc_pnode as pn
from pymc_pnode.solve import fixed_grid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # tests/ as a package
from tests.test_fenrir_defaults import CASES  # noqa: E402  (the same ODEs and boxes as the tests)

warnings.filterwarnings("ignore", message="PyTensor could not link to a BLAS")
warnings.filterwarnings("ignore", category=pn.AccuracyWarning)  # the fixed-step rows are meant to be coarse


def reference(func, y0, theta, times):
    sol = solve_ivp(lambda t, y: func(y, t, theta), (0.0, times[-1]), y0, method="DOP853", t_eval=times,
                    rtol=1e-12, atol=1e-12)
    return sol.y.T if sol.success and sol.y.shape[1] == times.size else None


def loglik_function(ode, y0, times, data, sd, **kwargs):
    theta = pt.vector("theta")
    ll = pn.fenrir_loglik(ode, y0, theta, times, data, obs_matrix=[[1.0, 0.0]], obs_sigma=sd, **kwargs)
    return pytensor.function([theta], ll), pytensor.function([theta], [ll, pytensor.grad(ll, theta)])


VARIANTS = {
    "defaults (rtol 1e-4, local κ)": {},
    "rtol 1e-6, local κ": dict(rtol=1e-6, atol=1e-8),
    "defaults with global κ": dict(diffusion="global"),
    "fixed step 0.05, κ = 1": dict(step=0.05, diffusion=1.0),
    "fixed step 0.01, κ = 1": dict(step=0.01, diffusion=1.0),
}


def accuracy_table() -> list[str]:
    rows = ["| ODE | Fenrir | max abs. error [nats] | max rel. error | points with -inf where the exact one is "
            "finite | -inf where no solution exists |", "| --- | --- | --- | --- | --- | --- |"]
    for name, (func, n_theta, y0, times, truth, sd, box) in CASES.items():
        ode = pn.ODE(func, n_states=2, n_theta=n_theta)
        y0 = np.array(y0)
        data = reference(func, y0, np.array(truth), times)[:, :1] + sd * np.random.default_rng(0).standard_normal(
            (times.size, 1))
        exact = []
        for th in box:
            ref = reference(func, y0, np.array(th, dtype=float), times)
            exact.append(-np.inf if ref is None else norm.logpdf(data[:, 0], ref[:, 0], sd).sum())
        for label, kwargs in VARIANTS.items():
            logp, _ = loglik_function(ode, y0, times, data, sd, **kwargs)
            errs, rels, spurious, blow_ups_ok, n_blow_up = [], [], 0, 0, 0
            for th, ex in zip(box, exact):
                value = float(logp(np.array(th, dtype=float)))
                if not np.isfinite(ex):
                    n_blow_up += 1
                    blow_ups_ok += value == -np.inf
                elif value == -np.inf:
                    spurious += 1
                else:
                    errs.append(abs(value - ex))
                    rels.append(abs(value - ex) / abs(ex))
            print(f"  {name}: {label}: max error {max(errs):.3g}", flush=True)
            rows.append(f"| {name} | {label} | {max(errs):.3g} | {max(rels):.2e} | {spurious} of {len(box)} | "
                        f"{blow_ups_ok} of {n_blow_up} |")
    return rows


def cost_table(repeats: int) -> list[str]:
    sys.path.insert(0, os.path.dirname(__file__))
    from fenrir_speed import SIGMA, THETA, TIMES, Y0, fhn, load_peer, probdiffeq_functions, simulate_data

    ode = pn.ODE(fhn, n_states=2, n_theta=3)
    data = np.asarray(simulate_data(20240521)).reshape(-1, 1)
    ref = reference(fhn, Y0, THETA, TIMES)
    exact = norm.logpdf(data[:, 0], ref[:, 0], SIGMA).sum()
    variants = {"defaults (rtol 1e-4, local κ)": {}, "rtol 1e-3, local κ": dict(rtol=1e-3, atol=1e-5),
                "rtol 1e-6, local κ": dict(rtol=1e-6, atol=1e-8)}
    for step in (0.1, 0.05, 0.04, 0.035, 0.025, 0.02, 0.01):  # 0.04 and 0.035 bracket the defaults' accuracy
        variants[f"fixed step {step}, κ = 1"] = dict(step=step, diffusion=1.0)
    # A fixed step without a diffusion argument gets the default, local diffusions (two passes, as the defaults):
    # beside these, the defaults' cost is that of error control alone.
    for step in (0.05, 0.035, 0.025, 0.02):  # 0.025 and 0.02 bracket the defaults' accuracy
        variants[f"fixed step {step}, local κ"] = dict(step=step)
    fns, calls = {}, {}  # label: (value, steps, Fenrir problem or None for the peer); label: timed call
    for label, kwargs in variants.items():
        logp, both = loglik_function(ode, Y0, TIMES, data, SIGMA, **kwargs)
        both(THETA)
        value = float(logp(THETA))
        problem = [v for v in both.maker.fgraph.toposort() if hasattr(v.op, "problem")][0].op.problem
        grid = problem.solver_grid(Y0, THETA, data, SIGMA)
        fns[label] = (value, grid.size - 1, problem)
        calls[label] = lambda both=both: both(THETA)
    peer = load_peer()  # probdiffeq (the `bench` extra), fixed steps with diffusion 1, if importable
    for step in (0.05, 0.04, 0.035, 0.02) if peer is not None else ():  # 0.04, 0.035: about the defaults' accuracy
        label = f"probdiffeq, fixed step {step}, κ = 1 (jax.jit value_and_grad)"
        value, value_grad, _ = probdiffeq_functions(peer, data[:, 0], step)
        x = np.concatenate([Y0, THETA, [SIGMA]])
        n_steps = fixed_grid(np.union1d([0.0], TIMES), step).size - 1  # the peer's grid is ours
        fns[label] = (value(x), n_steps, None)
        calls[label] = lambda value_grad=value_grad, x=x: value_grad(x)
    times = {label: [] for label in fns}
    for _ in range(repeats):  # implementations take turns, call by call
        for label, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[label].append(time.perf_counter() - t0)
    rows = ["| Fenrir | steps | logp+grad median [ms] | min [ms] | log-likelihood error at the truth [nats] | "
            "evaluations over the tolerance (fixed steps: the guard at the default rtol 1e-4) |",
            "| --- | --- | --- | --- | --- | --- |"]
    for label, (value, n_steps, problem) in fns.items():
        t = np.array(times[label]) * 1e3
        counts = problem.diagnostics if problem is not None else None
        guard = f"{counts.n_over_tolerance} of {counts.n_evaluations}" if counts is not None else "–"
        rows.append(f"| {label} | {n_steps} | {np.median(t):.2f} | {t.min():.2f} | {abs(value - exact):.2e} | "
                    f"{guard} |")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--cost-only", action="store_true", help="only part 2, the cost table")
    args = parser.parse_args()
    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; Python "
          f"{platform.python_version()}, pymc_pnode {pn.__version__}, numpy {np.__version__}")
    acc = [] if args.cost_only else accuracy_table()
    cost = cost_table(args.repeats)
    if acc:
        print("\nAccuracy against the exact likelihood (parameter boxes of tests/test_fenrir_defaults.py)\n")
        print("\n".join(acc))
    print(f"\nFitzHugh–Nagumo, 191 observations, logp + gradient (compiled PyTensor function, default mode), "
          f"median of {args.repeats} calls taking turns; load average {os.getloadavg()}\n")
    print("\n".join(cost))


if __name__ == "__main__":
    main()
