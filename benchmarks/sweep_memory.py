"""Peak memory and time of a dense Fenrir logp + gradient, stored or checkpointed.

The problem of ``benchmarks/scale.py`` (Lorenz-96, every other state observed at t = 0.1, ..., 2.0, EK1(3) with
dense covariances, diffusion 1) at a fixed step of 0.001 (2000 steps). Every run is a fresh Python process: the
default ``memory_budget`` (everything stored: two D×D matrices of the forward pass and five of the data phase per
grid point, D = 4d) against a small budget (checkpointed: the forward pass keeps roots at
``pymc_pnode.filtering.fenrir.checkpoint_slots`` points, the sweep recomputes them in intervals). Reported: the
process's resident memory once both Fenrir kernels are loaded from the numba cache, its peak during the first
evaluation and ``--repeats`` more (Linux: ``VmHWM``, reset through ``/proc/self/clear_refs`` before them), their
difference (what the evaluations need), the first evaluation and the median logp + gradient; the log-likelihoods
and gradients of the two runs must be equal. Each run is made twice and the second reported: the first compiles
whatever the numba cache lacks.

Run: ``python benchmarks/sweep_memory.py [--states 10 20] [--repeats 3]`` (prints a Markdown table).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

STEP = 0.001
SMALL_BUDGET = 32 * 2**20


def measure(d: int, budget: float, repeats: int) -> dict:

    import numpy as np
    import pymc  # noqa: F401 (a PyMC user has it imported)
    import pytensor
    import pytensor.tensor as pt
    from scale import ORDER, problem

    import pymc_pnode as pn

    case = problem(d)
    y0, times, observed, data = case.y0, case.times, case.observed, case.data
    ode = pn.ODE(case.field, n_states=d, n_theta=len(case.theta))
    y0_var, theta_var, sigma_var = pt.vector("y0"), pt.vector("theta"), pt.scalar("sigma")
    logp = pn.fenrir_loglik(ode, y0_var, theta_var, times, data, obs_matrix=np.eye(d)[observed], obs_sigma=sigma_var,
                            diffusion=1.0, solver=pn.EK1(ORDER), step=STEP, memory_budget=budget)
    fn = pytensor.function([y0_var, theta_var, sigma_var], [logp, *pt.grad(logp, [y0_var, theta_var, sigma_var])])
    args = (y0, np.asarray(case.theta, dtype=float), case.sigma)
    ode.taylor_vjp(ORDER), ode.hess_contract  # noqa: B018 (generated modules: not part of the sweep)
    problem = logp.owner.inputs[0].owner.op.problem  # logp = sum(terms of the Fenrir Op)
    problem.kernel, problem.checkpointed_kernel  # noqa: B018 (both loaded from the cache before measuring)
    with open("/proc/self/clear_refs", "w") as f:  # Linux: reset the high-water mark VmHWM to the current RSS
        f.write("5")
    before = _status_mb("VmRSS")
    tick = time.perf_counter()
    first = fn(*args)
    first_s = time.perf_counter() - tick
    evals = []
    for _ in range(repeats):
        tick = time.perf_counter()
        fn(*args)
        evals.append(time.perf_counter() - tick)
    from pymc_pnode.filtering.fenrir import stored_bytes_per_point

    stored_mb = (round(2.0 / STEP) + 1) * stored_bytes_per_point(ORDER, d, False, True) / 2**20
    return {"d": d, "budget_mb": budget / 2**20, "checkpointed": stored_mb > budget / 2**20, "stored_mb": stored_mb,
            "rss_before_mb": before, "rss_peak_mb": _status_mb("VmHWM"),
            "first_s": first_s, "eval_s": float(np.median(evals)), "logp": float(first[0]),
            "grad": np.concatenate([np.ravel(g) for g in first[1:]]).tolist()}


def _status_mb(field: str) -> float:
    """A memory figure of this process from /proc/self/status, in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(field)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--states", type=int, nargs="+", default=[10, 20])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budgets", type=float, nargs="+", default=[1024.0, SMALL_BUDGET / 2**20],
                        help="memory budgets in MiB (default: the package's default, 1 GiB, and 32)")
    parser.add_argument("--one", nargs=2, type=float, help=argparse.SUPPRESS)  # (d, budget): run in this process
    args = parser.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    if args.one:
        sys.path.insert(0, here)
        print(json.dumps(measure(int(args.one[0]), args.one[1], args.repeats)))
        return
    import numpy as np

    rows = []
    for d in args.states:
        for budget in [mb * 2**20 for mb in args.budgets]:
            command = [sys.executable, __file__, "--one", str(d), str(budget), "--repeats", str(args.repeats)]
            # twice: the first process compiles what the cache lacks (LLVM's own memory would count as the peak)
            for _ in range(2):
                out = subprocess.run(command, capture_output=True, text=True, check=True, cwd=here)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, pymc_pnode at {here}; Lorenz-96, EK1(3) dense, "
          f"{round(2.0 / STEP)} steps\n")
    print("| d | evaluation | budget [MB] | stored it would need [MB] | RSS before [MB] | peak during evaluations [MB] "
          "| peak − before [MB] | first call [s] | logp+grad [s] |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        kind = "checkpointed" if row["checkpointed"] else "stored"
        print(f"| {row['d']} | {kind} | {row['budget_mb']:.0f} | {row['stored_mb']:.0f} | {row['rss_before_mb']:.0f} "
              f"| {row['rss_peak_mb']:.0f} | {row['rss_peak_mb'] - row['rss_before_mb']:.0f} | {row['first_s']:.1f} "
              f"| {row['eval_s']:.2f} |")
    for d in args.states:
        same_d = [row for row in rows if row["d"] == d]
        first = same_d[0]
        same = all(row["logp"] == first["logp"] and np.array_equal(row["grad"], first["grad"]) for row in same_d)
        print(f"\nd = {d}: log-likelihood {first['logp']:.6f}; the budgets' values and gradients "
              f"{'equal' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
