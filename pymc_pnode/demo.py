"""Built-in demo: fit the FitzHugh–Nagumo model to noisy voltage data with the Fenrir likelihood.

Run with ``python -m pymc_pnode.demo``. It simulates data, samples the posterior with NUTS (nutpie, four chains in
parallel, its low-rank mass matrix) using Fenrir with its defaults (error-controlled steps, calibrated diffusion),
prints an ArviZ summary and whether the run meets the usual convergence checks, saves the InferenceData to
``pymc_pnode_demo.nc`` and a figure to ``pymc_pnode_demo.png``:
the posterior fit, and a likelihood profile that shows what the numerical error of a coarse fixed-step
RK4 solution does to the classical likelihood, next to the error-controlled Fenrir likelihood.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def fitzhugh_nagumo(y, t, p):
    a, b, c = p[0], p[1], p[2]
    return [c * (y[0] - y[0] ** 3 / 3 + y[1]), -(y[0] - a - b * y[1]) / c]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--tune", type=int, default=600)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--cores", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--output", default="pymc_pnode_demo.png")
    args = parser.parse_args(argv)

    import warnings

    # Two notices that do not concern this run: PyTensor's C backend without BLAS (the demo samples with nutpie's
    # numba backend, and the Fenrir kernel is numba code) and ArviZ's announcement of its next major version.
    warnings.filterwarnings("ignore", message="PyTensor could not link to a BLAS")
    warnings.filterwarnings("ignore", message=r"\s*ArviZ is undergoing a major refactor", category=FutureWarning)
    import arviz as az
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pymc as pm
    import pytensor
    import pytensor.tensor as pt
    from scipy.integrate import solve_ivp

    import pymc_pnode as pn

    start = time.perf_counter()
    true_theta, y0 = np.array([0.2, 0.2, 3.0]), np.array([-1.0, 1.0])
    ode = pn.ODE(fitzhugh_nagumo, n_states=2, n_theta=3)
    times = np.arange(0.5, 10.01, 0.25)

    def exact_solution(theta, t_eval):
        return solve_ivp(lambda t, y: fitzhugh_nagumo(y, t, theta), (0.0, t_eval[-1]), y0, method="DOP853",
                         t_eval=t_eval, rtol=1e-12, atol=1e-12).y.T

    rng = np.random.default_rng(2026)
    data = exact_solution(true_theta, times)[:, :1] + 0.1 * rng.standard_normal((times.size, 1))
    print(f"Simulated {times.size} noisy voltage observations of FitzHugh–Nagumo, theta={true_theta}")

    with pm.Model(coords={"time": times, "observable": ["V"], "param": ["a", "b", "c"]}):
        # a and b on their natural scale: b's posterior reaches towards 0, which a log-scale prior turns into a
        # long left tail in log b (a divergence and R-hat 1.02 in 4 × 600 draws; docs/benchmarks.md, the demo).
        a_b = pm.Normal("a_b", [0.3, 0.3], 0.15)
        c = pm.LogNormal("c", np.log(2.5), 0.5)
        theta = pm.Deterministic("theta", pt.concatenate([a_b, c[None]]), dims="param")
        sigma = pm.HalfNormal("sigma", 0.5)
        # The defaults: error-controlled steps and the per-step calibrated diffusion.
        pn.Fenrir("V", ode, y0=y0, theta=theta, times=times, observed=data, obs_matrix=[[1.0, 0.0]],
                  obs_sigma=sigma, dims=("time", "observable"))
        # The low-rank mass matrix learns the correlation of log b and log c (≈ −0.9): ≈ 11 leapfrog steps per
        # draw instead of 16 with the diagonal one. 300 tuning steps were too few (docs/benchmarks.md, the demo).
        idata = pm.sample(draws=args.draws, tune=args.tune, chains=args.chains, cores=args.cores, random_seed=1,
                          target_accept=0.95, nuts_sampler="nutpie", progressbar=False,
                          nuts_sampler_kwargs={"low_rank_modified_mass_matrix": True})
        pm.compute_log_likelihood(idata, progressbar=False)
    summary = az.summary(idata, var_names=["theta", "sigma"])
    print(summary)
    n_div = int(idata.sample_stats["diverging"].sum())
    print(f"Divergences: {n_div}; wall time so far {time.perf_counter() - start:.1f} s; true theta = {true_theta}")
    clean = summary["r_hat"].max() <= 1.01 and min(summary["ess_bulk"].min(), summary["ess_tail"].min()) >= 400
    print("Converged cleanly (R-hat <= 1.01, bulk and tail ESS >= 400, no divergences):", bool(clean and n_div == 0))
    nc_path = os.path.splitext(args.output)[0] + ".nc"
    idata.to_netcdf(nc_path)
    print(f"Saved the InferenceData to {nc_path}")

    # What the numerical error does: profile log-likelihoods in c (a, b, σ at the truth).
    c_grid = np.linspace(2.6, 3.4, 41)
    th = pt.vector("theta")
    coarse = 0.25
    rk = pn.rk_solve(ode, y0, th, times, step=coarse)
    rk_ll = pytensor.function([th], pm.logp(pm.Normal.dist(rk[:, 0], 0.1), data[:, 0]).sum())
    fen_default = pytensor.function([th], pn.fenrir_loglik(ode, y0, th, times, data, obs_matrix=[[1.0, 0.0]],
                                                           obs_sigma=0.1))
    profiles = {"exact (DOP853, 1e-12)": [], f"RK4, fixed step {coarse}": [], "Fenrir, error-controlled": []}
    for c in c_grid:
        theta_c = np.array([0.2, 0.2, c])
        exact = exact_solution(theta_c, times)[:, 0]
        profiles["exact (DOP853, 1e-12)"].append(-0.5 * np.sum(((data[:, 0] - exact) / 0.1) ** 2
                                                               + np.log(2 * np.pi * 0.01)))
        profiles[f"RK4, fixed step {coarse}"].append(float(rk_ll(theta_c)))
        profiles["Fenrir, error-controlled"].append(float(fen_default(theta_c)))

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    post_theta = idata.posterior["theta"].values.reshape(-1, 3)
    fine = np.linspace(0.0, 10.0, 401)
    for th_draw in post_theta[rng.choice(len(post_theta), 20, replace=False)]:
        ax.plot(fine, exact_solution(th_draw, fine)[:, 0], color="C0", alpha=0.2, lw=1)
    ax.plot(times, data[:, 0], "k.", label="data")
    ax.set(xlabel="t", ylabel="V", title="Solutions at 20 posterior draws (Fenrir defaults + NUTS)")
    ax.legend()
    for (label, values), style in zip(profiles.items(), ["k-", "C3--", "C0:"]):
        values = np.array(values)
        ax2.plot(c_grid, values - np.max(values), style, label=label)
    ax2.set(xlabel="c (a = b = 0.2, σ = 0.1)", ylabel="log-likelihood − its maximum", ylim=(-30, 1),
            title="Profile in c: a coarse fixed RK4 step vs error control")
    ax2.axvline(true_theta[2], color="grey", lw=0.5)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    for label, values in profiles.items():
        print(f"  profile maximum in c: {label:28s} c = {c_grid[int(np.argmax(values))]:.2f}")
    print(f"Saved the figure to {args.output}; total wall time {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
