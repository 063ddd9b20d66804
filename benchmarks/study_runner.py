"""Throughput of ``pymc_pnode.studies.run_study`` against a serial loop, and its per-task overhead.

1. Overhead: ``--n-small`` tasks that return at once, through the runner on a ``LocalCluster`` (start-up
   included and reported apart) and through a plain loop; the difference per task is the runner's overhead.
2. Throughput: ``--n-fits`` posterior fits (NUTS, 1 chain, Fenrir likelihood with its defaults on
   FitzHugh–Nagumo data from ``case_studies/fenrir_fhn_common.py``, each with its own seed), as a plain serial
   loop in this process, through the runner with one worker per core (cluster start-up, the warm-up task and
   the first imports in the workers included), and through the standard library's ``ProcessPoolExecutor``
   with as many processes (the same work without dask: what the machine allows two processes to do). Reports
   fits per minute and the speed-ups over the serial loop.

Caches are warm for both (one fit runs before the serial loop). Run:
``python benchmarks/study_runner.py [--n-fits 16] [--draws 1000]``; prints Markdown rows for
``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pymc as pm

import pymc_pnode as pn
from pymc_pnode import studies

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "case_studies"))
import fenrir_fhn_common as F  # noqa: E402  (the FitzHugh–Nagumo case studies' ODE and data)

warnings.filterwarnings("ignore", message=".*could not link to a BLAS.*")


def instant(task):
    return {"seed": task}


class Fit:
    """One posterior fit with its own seed: the kind of task a repetition study runs."""

    def __init__(self, draws: int):
        self.draws = draws
        self.times, _, self.data = F.make_data(t_last=10.0, spacing=0.25, t_first=0.5, seed=7)

    def __call__(self, seed: int) -> dict:
        start = time.perf_counter()
        with pm.Model():
            theta = pm.LogNormal("theta", np.log([0.2, 0.2, 3.0]), 0.1, shape=3)
            pn.Fenrir("y", F.ODE, y0=F.Y0_TRUE, theta=theta, times=self.times, observed=self.data,
                      obs_matrix=[[1.0, 0.0]], obs_sigma=F.OBS_SIGMA)
            idata = pm.sample(draws=self.draws, tune=self.draws, chains=1, cores=1, random_seed=seed,
                              progressbar=False, compute_convergence_checks=False)
        return {"seed": seed, "c_mean": float(idata.posterior["theta"][..., 2].mean()),
                "seconds": time.perf_counter() - start}


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-small", type=int, default=400)
    parser.add_argument("--n-fits", type=int, default=16)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--warm-up", choices=["auto", "on", "off"], default="auto",
                        help="run_study's warm_up: its default (auto), True or False")
    args = parser.parse_args()
    import distributed

    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
          f"pymc {pm.__version__}, dask.distributed {distributed.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.2f}")

    # 1. Overhead per task.
    _, serial_small = timed(lambda: [instant(i) for i in range(args.n_small)])
    cluster, startup = timed(studies.local_cluster)
    client = distributed.Client(cluster)
    _, runner_small = timed(lambda: studies.run_study(instant, range(args.n_small), client=client, progress=False))
    print("\n| tasks | serial loop s | runner s (cluster up) | overhead per task ms | cluster start-up s |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| {args.n_small} instant | {serial_small:.3f} | {runner_small:.2f} | "
          f"{1e3 * (runner_small - serial_small) / args.n_small:.1f} | {startup:.1f} |")
    client.close()
    cluster.close()

    # 2. Throughput on fits.
    fit = Fit(args.draws)
    warm, _ = timed(lambda: fit(0))
    seeds = list(range(1, args.n_fits + 1))
    serial_rows, serial_s = timed(lambda: [fit(s) for s in seeds])
    per_fit = np.median([r["seconds"] for r in serial_rows])
    warm_up = {"auto": None, "on": True, "off": False}[args.warm_up]
    result, runner_s = timed(lambda: studies.run_study(fit, seeds, progress=False, warm_up=warm_up))
    assert np.allclose(result.table["c_mean"], [r["c_mean"] for r in serial_rows])
    with ProcessPoolExecutor(os.cpu_count(), mp_context=multiprocessing.get_context("spawn")) as pool:
        pool_rows, pool_s = timed(lambda: list(pool.map(fit, seeds)))
    per_fit_runner = np.median(result.table["seconds"])
    per_fit_pool = np.median([r["seconds"] for r in pool_rows])
    rate = lambda seconds: 60 * args.n_fits / seconds  # noqa: E731
    print(f"\n| {args.n_fits} fits | wall s | fits/min | speed-up | median s per fit |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| serial loop | {serial_s:.0f} | {rate(serial_s):.1f} | 1 | {per_fit:.1f} |")
    label = f"run_study, LocalCluster of {os.cpu_count()}, warm_up={warm_up} (start-up incl.)"
    print(f"| {label} | {runner_s:.0f} | {rate(runner_s):.1f} | {serial_s / runner_s:.2f}x | {per_fit_runner:.1f} |")
    print(f"| ProcessPoolExecutor({os.cpu_count()}) (start-up incl.) | {pool_s:.0f} | {rate(pool_s):.1f} | "
          f"{serial_s / pool_s:.2f}x | {per_fit_pool:.1f} |")
    print("(runner results equal the serial loop's: checked)")


if __name__ == "__main__":
    main()
