"""Built-in demo: fit the FitzHugh–Nagumo model to noisy voltage data with the Fenrir likelihood.

Run with ``python -m pymc_pnode.demo``. It simulates data, solves the ODE with an EK1 filter, finds
the MAP estimate and samples the posterior with NUTS, prints an ArviZ summary and saves a plot of the
fit with its numerical and posterior uncertainty to ``pymc_pnode_demo.png``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def fitzhugh_nagumo(y, t, p):
    a, b, c = p[0], p[1], p[2]
    return [c * (y[0] - y[0] ** 3 / 3 + y[1]), -(y[0] - a - b * y[1]) / c]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--draws", type=int, default=400)
    parser.add_argument("--tune", type=int, default=1000)
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--output", default="pymc_pnode_demo.png")
    args = parser.parse_args(argv)

    import arviz as az
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pymc as pm

    import pymc_pnode as pn

    true_theta, y0 = np.array([0.2, 0.2, 3.0]), np.array([-1.0, 1.0])
    ode = pn.ODE(fitzhugh_nagumo, n_states=2, n_theta=3)
    times = np.arange(0.5, 10.01, 0.25)
    reference = pn.solve(ode, y0, true_theta, (0.0, 10.0), step=1e-3, save_at=times)
    rng = np.random.default_rng(2026)
    data = reference.mean[:, :1] + 0.1 * rng.standard_normal((times.size, 1))
    print(f"Simulated {times.size} noisy voltage observations of FitzHugh–Nagumo, theta={true_theta}")

    with pm.Model(coords={"time": times, "observable": ["V"]}) as model:
        theta = pm.LogNormal("theta", np.log([0.5, 0.5, 2.0]), 1.0, shape=3)
        sigma = pm.HalfNormal("sigma", 0.5)
        pn.Fenrir("V", ode, y0=y0, theta=theta, times=times, observed=data, obs_matrix=[[1.0, 0.0]],
                  obs_sigma=sigma, diffusion=1.0, solver=pn.EK1(order=3), step=0.05,
                  dims=("time", "observable"))
        start = time.perf_counter()
        map_point = pm.find_MAP(progressbar=False)
        print(f"MAP estimate: theta={np.round(map_point['theta'], 3)}, sigma={map_point['sigma']:.3f}")
        # dense mass matrix: b and c are strongly correlated
        idata = pm.sample(draws=args.draws, tune=args.tune, chains=args.chains, random_seed=1, target_accept=0.9,
                          init="adapt_full", initvals={"theta": map_point["theta"], "sigma": map_point["sigma"]})
        pm.compute_log_likelihood(idata)
        elapsed = time.perf_counter() - start
    print(az.summary(idata, var_names=["theta", "sigma"]))
    print(f"Wall time (MAP + NUTS): {elapsed:.1f} s; true theta = {true_theta}")

    post_theta = idata.posterior["theta"].values.reshape(-1, 3)
    fine = np.linspace(0.0, 10.0, 401)
    fig, ax = plt.subplots(figsize=(8, 4))
    for th in post_theta[rng.choice(len(post_theta), 20, replace=False)]:
        sol = pn.solve(ode, y0, th, (0.0, 10.0), step=0.05, save_at=fine)
        ax.plot(fine, sol.mean[:, 0], color="C0", alpha=0.2, lw=1)
        ax.fill_between(fine, sol.mean[:, 0] - 2 * sol.std[:, 0], sol.mean[:, 0] + 2 * sol.std[:, 0],
                        color="C0", alpha=0.05)
    ax.plot(times, data[:, 0], "k.", label="data")
    ax.set(xlabel="t", ylabel="V", title="FitzHugh–Nagumo: posterior PN trajectories (Fenrir + NUTS)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"Saved the fit to {args.output}")


if __name__ == "__main__":
    main()
