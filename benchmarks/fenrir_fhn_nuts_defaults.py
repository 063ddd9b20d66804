"""The FitzHugh–Nagumo NUTS case study with the Fenrir defaults: wall time and ESS/s, pm.sample and nutpie.

The model and data of ``case_studies/fenrir_fhn_nuts.ipynb`` (y1 at 0.5, 0.75, …, 20, noise sd 0.1, seed 7;
a, b, c ~ LogNormal(log(0.5, 0.5, 2), 1), y0 ~ N(0, 2²), σ ~ HalfNormal(0.5)), with the likelihood
``pn.Fenrir`` at its defaults (error control at rtol 1e-4, calibrated diffusion) instead of the notebook's
fixed step 0.05 and diffusion 1. Every chain starts at the MAP, found as in the notebook: diffusion tempering of
the fixed-step model on the first half of the data from a poor start, then ``pn.fit`` of the defaults model.
Then 4 chains × (1000 tune + 1000 draws), target_accept 0.95 (``--tune``, ``--target-accept`` change them), on 2
cores, with ``pm.sample`` (``cores=2``, dense
mass matrix as in the notebook) and with nutpie (diagonal mass matrix, its default). Wall times exclude
compilation (the Fenrir kernel is compiled before; nutpie's model compilation is timed separately).

Run: ``python benchmarks/fenrir_fhn_nuts_defaults.py [--samplers pymc nutpie] [--tune 500] [--target-accept 0.9]``;
prints a Markdown table for
``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytensor

import pymc_pnode as pn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "case_studies"))
import fenrir_fhn_common as F  # noqa: E402  (the case study's data and ODE)

warnings.filterwarnings("ignore", message=".*could not link to a BLAS.*")
DRAWS, TUNE, CHAINS = 1000, 1000, 4


def fhn_model(times, data, **fenrir_kwargs) -> pm.Model:
    with pm.Model(coords={"param": ["a", "b", "c"], "state": ["y1", "y2"]}) as model:
        theta = pm.LogNormal("theta", mu=np.log([0.5, 0.5, 2.0]), sigma=1.0, dims="param")
        y0 = pm.Normal("y0", 0.0, 2.0, dims="state")
        sigma = pm.HalfNormal("sigma", 0.5)
        pn.Fenrir("y_obs", F.ODE, y0=y0, theta=theta, times=times, observed=data, obs_matrix=[[1.0, 0.0]],
                  obs_sigma=sigma, **fenrir_kwargs)
    return model


def map_start(times, data) -> dict:
    """The notebook's initialisation, ending with the MAP of the defaults model."""
    kappa = pytensor.shared(1.0, name="kappa")
    first_half = times <= 10.0
    held = pm.do(fhn_model(times[first_half], data[first_half], step=0.05, diffusion=kappa),
                 {"sigma": 0.5 * 0.6745})
    temp = pn.diffusion_tempering(held, diffusion=kappa, schedule="linear", objective="map",
                                  start={"theta": np.array([0.01, 0.01, 1.0]), "y0": np.zeros(2)},
                                  early_stopping=True, progressbar=False)
    fit = pn.fit(fhn_model(times, data), objective="map", start={**temp.point, "sigma": 0.5 * 0.6745})
    return {k: np.asarray(v) for k, v in fit.point.items()}


def summarise(label: str, idata, wall: float, compile_s: float) -> str:
    s = az.summary(idata, var_names=["theta", "y0", "sigma"])
    bulk, tail = s["ess_bulk"].min(), s["ess_tail"].min()
    return (f"| {label} | {wall:.0f} | {compile_s:.0f} | {s['r_hat'].max():.3f} | {bulk:.0f} | {tail:.0f} | "
            f"{bulk / wall:.1f} | {int(idata.sample_stats['diverging'].sum())} | "
            f"{float(idata.sample_stats['n_steps'].mean()):.1f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samplers", nargs="+", choices=["pymc", "nutpie"], default=["pymc", "nutpie"])
    parser.add_argument("--tune", type=int, default=TUNE)
    parser.add_argument("--target-accept", type=float, default=0.95)
    args = parser.parse_args()
    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
          f"pymc {pm.__version__}, pytensor {pytensor.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    times, _, data = F.make_data(t_last=20.0, spacing=0.25, t_first=0.5, seed=7)
    t0 = time.perf_counter()
    start = map_start(times, data)
    print(f"MAP start in {time.perf_counter() - t0:.0f} s: {start}", flush=True)
    model = fhn_model(times, data)
    model.compile_logp()(model.initial_point())  # numba compiles the Fenrir kernel here
    rows = ["| sampler | sampling wall [s] | compile [s] | max R-hat | min bulk ESS | min tail ESS | "
            "bulk ESS/s | divergences | leapfrog steps per draw |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    if "pymc" in args.samplers:
        with model:
            t0 = time.perf_counter()
            idata = pm.sample(draws=DRAWS, tune=args.tune, chains=CHAINS, cores=2, init="adapt_full", initvals=start,
                              target_accept=args.target_accept, random_seed=2024, progressbar=False,
                              compute_convergence_checks=False)
        label = f"pm.sample (cores=2, adapt_full), tune {args.tune}, target_accept {args.target_accept}"
        rows.append(summarise(label, idata, time.perf_counter() - t0, 0.0))
        print(rows[-1], flush=True)
    if "nutpie" not in args.samplers:
        print("\n".join(rows))
        return
    import nutpie

    t0 = time.perf_counter()
    # Every chain starts exactly at the MAP, as pm.sample's: ``init_mean`` would jitter the start, and on this
    # multimodal likelihood one jittered chain had not finished after 27 min (2026-11-25, 15:23–15:50 UTC).
    compiled = nutpie.compile_pymc_model(model, initial_points=start, jitter_rvs=set())
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    # low-rank-modified mass matrix: nutpie's analogue of pm.sample's adapt_full, for the curved (b, c) ridge
    idata = nutpie.sample(compiled, draws=DRAWS, tune=args.tune, chains=CHAINS, cores=2, seed=2024,
                          target_accept=args.target_accept, progress_bar=False, low_rank_modified_mass_matrix=True)
    rows.append(summarise(f"nutpie (4 chains in threads, low-rank mass matrix), tune {args.tune}, "
                          f"target_accept {args.target_accept}", idata, time.perf_counter() - t0,
                          compile_s))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
