"""The measured examples of ``docs/parallel_tempering.md``, executed.

1. The bimodal target ``0.3 N(−5, 0.5²) + 0.7 N(5, 0.5²)`` (a prior ``N(0, 10²)`` times a likelihood potential),
   ``sample_pt`` with its default adapted ladder (8 replicas), 2 chains × (1000 + 2500) from ``x = 5``, seed 1,
   against NUTS (``pm.sample``) with the same draws and start: the weight of the right mode per chain and pooled
   (MCSE and ESS of the mode indicator), wall time, the adapted ladder, the final swap rates, round trips, the
   cold replica's move acceptance, and the mean and sd inside the right mode.
2. The shared-variable ladder of the docs: ``y ~ N(mu², sigma)`` with 4 observations (``rng(3).normal(4, 1, 4)``),
   ``mu ~ N(1, 2²)``, ``sigma`` laddered over ``[1, 2, 4, 8]``, 2 chains × (1000 + 3000), seed 2: the posterior
   probability of ``mu > 0`` against quadrature, per chain and pooled, swap rates, round trips, against NUTS.
3. The two-parameter Fenrir comparison of the case study (``case_studies/parallel_tempering_fenrir.py
   two-parameter``), run as a subprocess and its output printed.

Run: ``python benchmarks/parallel_tempering_examples.py`` (a few minutes on 2 cores); the run cited by the docs is in
``benchmarks/results/parallel_tempering_examples.md``.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import time
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm
import pytensor
from scipy import integrate, stats

import pymc_pnode as pn
from pymc_pnode.sampling import ParallelTempering, sample_pt


def _mode_weight(idata, name: str, positive: bool = True) -> str:
    """Weight of the right-hand mode per chain and pooled, with the MCSE and ESS of the mode indicator."""
    indicator = (idata.posterior[name] > 0) if positive else (idata.posterior[name] < 0)
    per_chain = indicator.mean("draw").values
    dataset = az.convert_to_dataset({"right": indicator.values.astype(float)})
    mcse = float(az.mcse(dataset)["right"])
    ess = float(az.ess(dataset)["right"])
    return (f"{' / '.join(f'{w:.3f}' for w in per_chain)} per chain, {float(indicator.mean()):.3f} pooled "
            f"(MCSE {mcse:.3f}, ESS {ess:.0f})")


def _ladder_summary(idata) -> str:
    sample_stats = idata.sample_stats
    rates = sample_stats.swap_rate.values[:, -1]
    trips = sample_stats.round_trips.values[:, -1]
    text = (f"final swap rates {np.array2string(rates, precision=2)}, round trips {trips.tolist()}, "
            f"cold move acceptance {float(sample_stats.accept.mean()):.2f}")
    if "betas" in sample_stats:
        text += f", ladder {np.array2string(sample_stats.betas.values[0, -1], precision=4)}"
    return text


def bimodal_mixture() -> None:
    w, mu, sd = np.array([0.3, 0.7]), np.array([-5.0, 5.0]), 0.5
    with pm.Model() as model:
        x = pm.Normal("x", 0.0, 10.0)
        mixture = pm.logp(pm.NormalMixture.dist(w=w, mu=mu, sigma=sd), x)
        pm.Potential("likelihood", mixture - pm.logp(pm.Normal.dist(0.0, 10.0), x))
    start = time.perf_counter()
    idata = sample_pt(draws=2500, tune=1000, chains=2, cores=1, model=model, random_seed=1, initvals={"x": 5.0},
                      progressbar=False)
    pt_seconds = time.perf_counter() - start
    right = idata.posterior["x"].values[idata.posterior["x"].values > 0]
    print(f"parallel tempering: right mode {_mode_weight(idata, 'x')}, wall {pt_seconds:.1f} s; "
          f"{_ladder_summary(idata)}; inside the right mode mean {right.mean():.3f}, sd {right.std():.3f}")
    start = time.perf_counter()
    with model:
        nuts = pm.sample(draws=2500, tune=1000, chains=2, cores=1, random_seed=1, initvals={"x": 5.0},
                         progressbar=False)
    print(f"NUTS: right mode {_mode_weight(nuts, 'x')}, wall {time.perf_counter() - start:.1f} s")


def shared_ladder() -> None:
    y = np.random.default_rng(3).normal(4.0, 1.0, 4)

    def posterior(m: float) -> float:
        return float(stats.norm.pdf(m, 1.0, 2.0) * np.prod(stats.norm.pdf(y, m**2, 1.0)))

    total = integrate.quad(posterior, -10, 10, points=[-2, 2], limit=200)[0]
    positive = integrate.quad(posterior, 0, 10, points=[2], limit=200)[0] / total
    sigma = pytensor.shared(1.0, name="sigma")
    with pm.Model():
        mu = pm.Normal("mu", 1.0, 2.0)
        pm.Normal("y", mu**2, sigma, observed=y)
        step = ParallelTempering(shared_ladder={sigma: [1.0, 2.0, 4.0, 8.0]})
        start = time.perf_counter()
        idata = pm.sample(draws=3000, tune=1000, step=step, chains=2, cores=2, random_seed=2, progressbar=False)
        pt_seconds = time.perf_counter() - start
        start = time.perf_counter()
        nuts = pm.sample(draws=3000, tune=1000, chains=2, cores=2, random_seed=2, progressbar=False)
        nuts_seconds = time.perf_counter() - start
    print(f"quadrature P(mu > 0) = {positive:.3f}")
    print(f"shared ladder: P(mu > 0) {_mode_weight(idata, 'mu')}, wall {pt_seconds:.1f} s; {_ladder_summary(idata)}")
    print(f"NUTS: P(mu > 0) {_mode_weight(nuts, 'mu')}, wall {nuts_seconds:.1f} s")


def main() -> None:
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, Python "
          f"{platform.python_version()}, pymc {pm.__version__}, pymc_pnode from {Path(pn.__file__).parent}\n")
    print("## 1. Bimodal mixture\n")
    bimodal_mixture()
    print("\n## 2. Shared-variable ladder\n")
    shared_ladder()
    print("\n## 3. `case_studies/parallel_tempering_fenrir.py two-parameter`\n", flush=True)
    case_studies = Path(__file__).resolve().parents[1] / "case_studies"
    subprocess.run([sys.executable, "parallel_tempering_fenrir.py", "two-parameter"], cwd=case_studies, check=True)


if __name__ == "__main__":
    main()
