"""The two optimisation examples of ``docs/fenrir.md`` ("Optimisation and diffusion tempering"), executed.

1. FitzHugh–Nagumo: ``V`` observed at t = 0.5, 0.75, …, 10 with noise sd 0.1 (data of
   ``case_studies/fenrir_fhn_common.make_data``, seed 7), θ = (a, b, c) with uniform priors on
   [0, 1] × [0, 1] × [0, 20], Fenrir with EK1 IWP(3) at the fixed step 0.05 and a shared diffusion, the poor
   start θ = (0.01, 0.01, 10) of the docs. A plain ``pn.fit(objective="mle")`` against
   ``pn.diffusion_tempering(..., early_stopping=True)`` (the linear schedule κ = 10^20 … 10^0 of Beck et al.,
   2024), and the log-likelihood of the truth under the last stage's κ.
2. Van der Pol (ẏ1 = y2, ẏ2 = μ (1 − y1²) y2 − y1, y0 = (2, 0), true μ = 3): y1 observed at t = 0.25, 0.5, …, 15
   with noise sd 0.1, μ uniform on [0.1, 10], started at μ = 0.5; the same two estimators.

Run: ``python benchmarks/tempering_examples.py``; prints a Markdown table (the run cited by the docs is in
``benchmarks/results/tempering_examples.md``).
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
import fenrir_fhn_common as F  # noqa: E402  (the FitzHugh–Nagumo ODE and data of the case studies)

warnings.filterwarnings("ignore", message=".*could not link to a BLAS.*")
warnings.filterwarnings("ignore", category=pn.AccuracyWarning)  # step 0.05 is the docs' setting; reported below


def van_der_pol(y, t, p):
    return [y[1], p[0] * (1 - y[0] ** 2) * y[1] - y[0]]


def van_der_pol_data(mu: float = 3.0, sigma: float = 0.1, seed: int = 11):
    times = np.round(0.25 * np.arange(1, 61), 10)
    sol = solve_ivp(lambda t, y: van_der_pol(y, t, [mu]), (0.0, times[-1]), [2.0, 0.0], method="Radau",
                    t_eval=times, rtol=1e-12, atol=1e-12)
    return times, sol.y[0] + sigma * np.random.default_rng(seed).standard_normal(times.size)


def compare(label, build, start, truth):
    """Plain MLE (at κ = 1) and tempered MLE from ``start``; the truth's log-likelihood at the last stage's κ."""
    kappa = pytensor.shared(1.0)
    model = build(kappa)
    rows = []
    t0 = time.perf_counter()
    plain = pn.fit(model, objective="mle", start=start)
    rows.append((label, "pn.fit (MLE)", plain, time.perf_counter() - t0))
    t0 = time.perf_counter()
    tempered = pn.diffusion_tempering(model, diffusion=kappa, start=start, early_stopping=True, progressbar=False)
    rows.append((label, "diffusion_tempering, early stopping", tempered, time.perf_counter() - t0))
    truth_ll = float(pm.do(model, {"theta": truth}).point_logps(round_vals=6)[model.observed_RVs[0].name])
    return rows, truth_ll, float(kappa.get_value())


def fitzhugh_nagumo_model(kappa):
    times, _, data = F.make_data(t_last=10.0, spacing=0.25, t_first=0.5, seed=7)
    with pm.Model() as model:
        theta = pm.Uniform("theta", 0.0, [1.0, 1.0, 20.0], shape=3)
        pn.Fenrir("V", F.ODE, y0=F.Y0_TRUE, theta=theta, times=times, observed=data, obs_matrix=[[1.0, 0.0]],
                  obs_sigma=F.OBS_SIGMA, diffusion=kappa, step=0.05)
    return model


def van_der_pol_model(kappa):
    ode = pn.ODE(van_der_pol, n_states=2, n_theta=1)
    times, data = van_der_pol_data()
    with pm.Model() as model:
        theta = pm.Uniform("theta", 0.1, 10.0, shape=1)
        pn.Fenrir("y1", ode, y0=[2.0, 0.0], theta=theta, times=times, observed=data[:, None],
                  obs_matrix=[[1.0, 0.0]], obs_sigma=0.1, diffusion=kappa, step=0.05)
    return model


def main() -> None:
    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
          f"pymc {pm.__version__}, pymc_pnode {pn.__version__}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    examples = [("FitzHugh–Nagumo", fitzhugh_nagumo_model, {"theta": np.array([0.01, 0.01, 10.0])}, F.THETA_TRUE),
                ("Van der Pol", van_der_pol_model, {"theta": np.array([0.5])}, np.array([3.0]))]
    print("| problem | estimator | θ̂ | log-likelihood | converged | iterations | wall s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    notes = []
    for label, build, start, truth in examples:
        rows, truth_ll, last_kappa = compare(label, build, start, truth)
        for problem, estimator, result, wall in rows:
            theta = ", ".join(f"{v:.4g}" for v in np.atleast_1d(result.point["theta"]))
            print(f"| {problem} | {estimator} | ({theta}) | {result.objective:.2f} | {result.converged} | "
                  f"{result.n_iterations} | {wall:.1f} |")
        notes.append(f"- {label}: the truth θ = {truth.tolist()} has log-likelihood {truth_ll:.2f} "
                     f"at κ = {last_kappa:g}")
    print("\n".join(notes))


if __name__ == "__main__":
    main()
