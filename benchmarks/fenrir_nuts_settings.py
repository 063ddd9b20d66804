"""NUTS on the demo's FitzHugh–Nagumo model under four Fenrir settings: how many leapfrog steps per draw.

Model of ``python -m pymc_pnode.demo`` (V observed at 0.5, 0.75, …, 10; σ free; LogNormal priors off the truth),
sampled with nutpie, one chain, 100 tuning + 100 draws, seed 1. Settings: error control (rtol 1e-4) with the
local calibrated diffusion (the defaults), error control with κ = 1, a fixed step 0.05 with the local diffusion,
and a fixed step 0.05 with κ = 1. Reports wall time, leapfrog steps per draw, divergences and the solver counts
of :func:`pymc_pnode.fenrir_diagnostics`.

Run: ``python benchmarks/fenrir_nuts_settings.py``.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import pymc as pm
from scipy.integrate import solve_ivp

import pymc_pnode as pn
from pymc_pnode.demo import fitzhugh_nagumo

warnings.simplefilter("ignore")

SETTINGS = {
    "error control, local κ (defaults)": {},
    "error control, κ = 1": dict(diffusion=1.0),
    "fixed step 0.05, local κ": dict(step=0.05, check_accuracy=False),
    "fixed step 0.05, κ = 1": dict(step=0.05, diffusion=1.0, check_accuracy=False),
}


def main():
    ode = pn.ODE(fitzhugh_nagumo, n_states=2, n_theta=3)
    times = np.arange(0.5, 10.01, 0.25)
    y0 = np.array([-1.0, 1.0])
    exact = solve_ivp(lambda t, y: fitzhugh_nagumo(y, t, [0.2, 0.2, 3.0]), (0.0, 10.0), y0, t_eval=times,
                      rtol=1e-12, atol=1e-12, method="DOP853").y.T
    data = exact[:, :1] + 0.1 * np.random.default_rng(2026).standard_normal((times.size, 1))
    rows = ["| Fenrir | wall [s] | leapfrog steps per draw | divergences | evaluations | solver steps per evaluation |",
            "| --- | --- | --- | --- | --- | --- |"]
    for label, kwargs in SETTINGS.items():
        with pm.Model() as model:
            theta = pm.LogNormal("theta", np.log([0.3, 0.3, 2.5]), 0.5, shape=3)
            sigma = pm.HalfNormal("sigma", 0.5)
            pn.Fenrir("V", ode, y0=y0, theta=theta, times=times, observed=data, obs_matrix=[[1.0, 0.0]],
                      obs_sigma=sigma, **kwargs)
            model.compile_logp()(model.initial_point())  # numba compiles the kernel here, not in the timing
            start = time.perf_counter()
            idata = pm.sample(draws=100, tune=100, chains=1, cores=1, nuts_sampler="nutpie", progressbar=False,
                              random_seed=1)
            wall = time.perf_counter() - start
        counts = pn.fenrir_diagnostics(model)["V"]
        row = (f"| {label} | {wall:.1f} | {float(idata.sample_stats['n_steps'].mean()):.1f} | "
               f"{int(idata.sample_stats['diverging'].sum())} | {counts.n_evaluations} | "
               f"{counts.n_steps / counts.n_evaluations:.0f} |")
        print(row, flush=True)
        rows.append(row)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
