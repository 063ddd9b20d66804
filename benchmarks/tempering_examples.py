"""The two optimisation examples of ``docs/fenrir.md`` ("Optimisation and diffusion tempering"), executed.

1. FitzHugh–Nagumo (the docs' code): V observed at t = 0.5, 0.75, …, 10 with noise sd 0.1 (data of
   ``case_studies/fenrir_fhn_common.make_data``, seed 42), θ ~ Uniform(0, (1, 1, 20)), EK1 IWP(3), step 0.05,
   start θ = (0.01, 0.01, 10): a plain ``pn.fit(objective="mle")`` against ``pn.diffusion_tempering`` with
   early stopping (OURS+), and the log-likelihood of the truth on the same data.
2. Van der Pol, μ ∈ [0.1, 10] (truth μ = 3), both states observed at t = 0.5, 1, …, 15 with noise sd 0.1,
   y(0) = (2, 0) known, EK1 IWP(3), step 0.05, start μ = 0.5: the same two optimisers.

Run: ``python benchmarks/tempering_examples.py``; prints a Markdown table (``benchmarks/results/tempering_examples.md``
holds the run cited in the docs). Not a speed benchmark; it takes a few minutes.
"""

from __future__ import annotations

import os
import platform
import sys
import time
import warnings

import numpy as np
import pymc as pm
import pytensor
from scipy.integrate import solve_ivp

import pymc_pnode as pn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "case_studies"))
import fenrir_fhn_common as F  # noqa: E402

warnings.filterwarnings("ignore", message=".*could not link to a BLAS.*")


def van_der_pol(y, t, p):
    return [y[1], p[0] * (1.0 - y[0] ** 2) * y[1] - y[0]]


VDP = pn.ODE(van_der_pol, n_states=2, n_theta=1)


def fhn_model(kappa):
    times, _, data = F.make_data(t_last=10.0, spacing=0.25, t_first=0.5, seed=42)
    with pm.Model() as model:
        theta = pm.Uniform("theta", 0.0, [1.0, 1.0, 20.0], shape=3)
        pn.Fenrir("V", F.ODE, y0=F.Y0_TRUE, theta=theta, times=times, observed=data,
                  obs_matrix=[[1.0, 0.0]], obs_sigma=F.OBS_SIGMA, diffusion=kappa, step=0.05)
    return model, {"theta": [0.01, 0.01, 10.0]}, {"theta": F.THETA_TRUE}


def vdp_model(kappa):
    times = np.arange(1, 31) * 0.5
    exact = solve_ivp(lambda t, y: [y[1], 3.0 * (1 - y[0] ** 2) * y[1] - y[0]], (0.0, times[-1]), [2.0, 0.0],
                      t_eval=times, method="DOP853", rtol=1e-11, atol=1e-11).y.T
    data = exact + 0.1 * np.random.default_rng(1).standard_normal(exact.shape)
    with pm.Model() as model:
        mu = pm.Uniform("mu", 0.1, 10.0, shape=1)
        pn.Fenrir("y", VDP, y0=[2.0, 0.0], theta=mu, times=times, observed=data, obs_sigma=0.1, diffusion=kappa,
                  step=0.05)
    return model, {"mu": [0.5]}, {"mu": [3.0]}


def run(name, build):
    kappa = pytensor.shared(1.0)
    model, start, truth = build(kappa)
    rows = []
    t0 = time.perf_counter()
    plain = pn.fit(model, objective="mle", start=start)
    rows.append((name, "pn.fit (mle)", plain, time.perf_counter() - t0))
    t0 = time.perf_counter()
    tempered = pn.diffusion_tempering(model, diffusion=kappa, start=start, early_stopping=True, progressbar=False)
    rows.append((name, "diffusion_tempering (OURS+)", tempered, time.perf_counter() - t0))
    kappa.set_value(1.0)
    loglik = model.compile_fn(model.datalogp, point_fn=True)
    truth_point = {model.rvs_to_values[model[k]].name: model.rvs_to_transforms[model[k]].forward(
        np.asarray(v, dtype=float), *model[k].owner.inputs).eval() for k, v in truth.items()}
    out = []
    for name_, label, result, seconds in rows:
        out.append(f"| {name_} | {label} | {np.array2string(result.theta, precision=3)} | {result.objective:.2f} | "
                   f"{result.n_iterations} | {seconds:.0f} |")
    true_values = np.concatenate([np.ravel(v) for v in truth.values()])
    true_loglik = float(loglik(truth_point))
    out.append(f"| {name} | truth | {np.array2string(true_values, precision=3)} | {true_loglik:.2f} | | |")
    return out


def main():
    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
          f"pymc {pm.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("| problem | optimiser | estimate | log-likelihood (κ = 1) | iterations | s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, build in (("FitzHugh–Nagumo", fhn_model), ("Van der Pol", vdp_model)):
        for row in run(name, build):
            print(row, flush=True)


if __name__ == "__main__":
    main()
