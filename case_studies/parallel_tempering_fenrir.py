"""Helpers for the case study ``parallel_tempering_fenrir.ipynb``.

A pendulum ``phi'' = -omega^2 sin(phi)`` with known initial state and unknown
angular frequency ``omega`` is observed with Gaussian noise; the likelihood is
the Fenrir marginal likelihood of :func:`pymc_pnode.Fenrir` with a diffusion
held in a PyTensor shared variable.  Two data sets are used:

* **sparse** -- one observation per unit of time: ``omega`` and
  ``2 pi - omega`` fit the data equally well (aliasing), so the posterior has
  two separated modes whose weights come from the prior;
* **dense** -- ten observations per unit of time: the posterior has one mode
  at the true frequency but the likelihood has local optima at wrong
  frequencies, hundreds of log units lower.

The module builds the models, computes reference posteriors by quadrature over
``omega`` and runs/summarises NUTS and parallel tempering.  Run it as a script
for a quick smoke test (``python parallel_tempering_fenrir.py``) or for the
two-parameter comparison quoted in ``docs/parallel_tempering.md``
(``python parallel_tempering_fenrir.py two-parameter``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import arviz as az
import numpy as np
import pandas as pd
import pymc as pm
import pytensor
import pytensor.tensor as pt
from scipy.integrate import solve_ivp
from scipy.stats import truncnorm

import pymc_pnode as pn
from pymc_pnode.sampling import ParallelTempering, diffusion_ladder, label_replica_dims

__all__ = [
    "DATASETS",
    "PRIOR",
    "Dataset",
    "build_model",
    "build_two_parameter_model",
    "expected_swap_rates",
    "loglik_function",
    "make_ode",
    "quadrature",
    "run_nuts",
    "run_pt",
    "summarize",
]

OMEGA_TRUE = 2.0
"""True angular frequency (period ~3.1)."""

PRIOR = {"mu": 2.5, "sigma": 1.5, "lower": 0.5, "upper": 6.0}
"""Truncated-normal prior of omega.  The upper bound keeps ``omega * step <= 0.6``
so the solver grid resolves every admissible frequency."""

SOLVER_ORDER = 3
STEP = 0.1
KAPPA_COLD = 1.0


@dataclass(frozen=True)
class Dataset:
    """Observation design of one experiment.

    Attributes
    ----------
    name : str
    times : numpy.ndarray
        Observation times of the angle.
    y0 : tuple of float
        Known initial angle and angular velocity.
    obs_sd : float
        Observation noise standard deviation (known).
    modes : tuple of float
        Boundaries splitting the omega axis into the "modes" reported.
    """

    name: str
    times: np.ndarray
    y0: tuple[float, float]
    obs_sd: float
    modes: tuple[float, ...]


DATASETS = {
    "sparse": Dataset("sparse", np.arange(1.0, 6.01, 1.0), (0.3, 0.0), 0.05, (np.pi,)),
    "dense": Dataset("dense", np.arange(0.1, 8.0 + 1e-9, 0.1), (0.5, 0.0), 0.1, (1.5, 2.5)),
}


def make_ode() -> pn.ODE:
    """The pendulum ``y = (phi, phi')``, parameter ``p = (omega,)``."""

    def pendulum(y, t, p):
        return [y[1], -p[0] ** 2 * pt.sin(y[0])]

    return pn.ODE(pendulum, n_states=2, n_theta=1)


def simulate(ds: Dataset, seed: int = 1) -> np.ndarray:
    """Noisy angles at ``ds.times`` from an accurate (rtol 1e-12) reference solution."""
    ref = solve_ivp(
        lambda t, y: [y[1], -(OMEGA_TRUE**2) * np.sin(y[0])],
        (0.0, float(ds.times[-1])),
        ds.y0,
        rtol=1e-12,
        atol=1e-12,
        dense_output=True,
    )
    noise = ds.obs_sd * np.random.default_rng(seed).standard_normal(ds.times.size)
    return (ref.sol(ds.times)[0] + noise)[:, None]


def _fenrir_kwargs(ds: Dataset) -> dict:
    return {
        "times": ds.times,
        "obs_matrix": [[1.0, 0.0]],
        "obs_sigma": ds.obs_sd,
        "solver": pn.EK1(order=SOLVER_ORDER),
        "step": STEP,
    }


def build_model(ode: pn.ODE, ds: Dataset, data: np.ndarray, kappa) -> pm.Model:
    """``omega ~ TruncatedNormal(PRIOR)``, angles ~ Fenrir(diffusion=kappa)."""
    with pm.Model() as model:
        omega = pm.TruncatedNormal("omega", **PRIOR)
        pn.Fenrir(
            "angle", ode, y0=ds.y0, theta=omega[None], observed=data, diffusion=kappa,
            **_fenrir_kwargs(ds),
        )
    return model


def build_two_parameter_model(ode: pn.ODE, ds: Dataset, data: np.ndarray, kappa) -> pm.Model:
    """As :func:`build_model`, with the initial angle unknown: ``phi0 ~ N(0.4, 0.3^2)``."""
    with pm.Model() as model:
        omega = pm.TruncatedNormal("omega", **PRIOR)
        phi0 = pm.Normal("phi0", 0.4, 0.3)
        pn.Fenrir(
            "angle", ode, y0=pt.stack([phi0, pt.constant(0.0)]), theta=omega[None],
            observed=data, diffusion=kappa, **_fenrir_kwargs(ds),
        )
    return model


def loglik_function(ode: pn.ODE, ds: Dataset, data: np.ndarray):
    """Compiled ``(omega, kappa) -> log Fenrir likelihood`` (no prior)."""
    theta = pt.dvector("theta")
    kappa = pt.dscalar("kappa")
    fn = pytensor.function(
        [theta, kappa],
        pn.fenrir_loglik(ode, ds.y0, theta, data=data, diffusion=kappa, **_fenrir_kwargs(ds)),
    )
    return lambda omega, k: float(fn(np.array([omega], dtype=np.float64), float(k)))


def log_prior(omega: np.ndarray) -> np.ndarray:
    """Log-density of the truncated-normal prior of omega."""
    a = (PRIOR["lower"] - PRIOR["mu"]) / PRIOR["sigma"]
    b = (PRIOR["upper"] - PRIOR["mu"]) / PRIOR["sigma"]
    return truncnorm(a, b, PRIOR["mu"], PRIOR["sigma"]).logpdf(omega)


def quadrature(loglik, kappa: float, ds: Dataset, spacing: float = 0.02, refine: int = 20) -> dict:
    """Reference posterior of omega by the trapezoidal rule.

    A grid of ``spacing`` over the prior's support is refined ``refine``-fold
    in every cell next to a point whose log posterior is within 30 of the
    maximum (the rest carries a relative mass below 1e-12).

    Returns
    -------
    dict
        ``grid``, normalised ``density``, ``mean``, ``sd``, mode weights
        ``weights`` (one per interval between ``ds.modes``) and the number of
        likelihood evaluations ``n_evals``.
    """
    n_coarse = int(round((PRIOR["upper"] - PRIOR["lower"]) / spacing)) + 1
    coarse = np.linspace(PRIOR["lower"], PRIOR["upper"], n_coarse)

    def log_post(points):
        return log_prior(points) + np.array([loglik(w, kappa) for w in points])

    lp_coarse = log_post(coarse)
    near = np.flatnonzero(lp_coarse > lp_coarse.max() - 30.0)
    cells = np.unique(np.clip(np.concatenate([near - 1, near]), 0, n_coarse - 2))
    fine = np.concatenate([np.linspace(coarse[i], coarse[i + 1], refine + 1)[1:-1] for i in cells])
    grid = np.concatenate([coarse, fine])
    lp = np.concatenate([lp_coarse, log_post(fine)])
    order = np.argsort(grid)
    grid, lp = grid[order], lp[order]
    dens = np.exp(lp - lp.max())
    dens /= np.trapezoid(dens, grid)
    mean = float(np.trapezoid(dens * grid, grid))
    sd = float(np.sqrt(np.trapezoid(dens * (grid - mean) ** 2, grid)))
    labels = np.digitize(grid, ds.modes)
    weights = [float(np.trapezoid(dens * (labels == j), grid)) for j in range(len(ds.modes) + 1)]
    return {"grid": grid, "density": dens, "mean": mean, "sd": sd, "weights": weights,
            "n_evals": int(grid.size)}


def expected_swap_rates(
    loglik, kappas, betas=None, n_points: int = 1101
) -> np.ndarray:
    """Stationary swap acceptance rates of a ladder, by quadrature over omega.

    For adjacent replicas ``j, j+1`` with tempered log-densities
    ``l_j = log prior + beta_j * log Fenrir(kappa_j)`` this is
    ``E[min(1, exp(l_j(y) + l_{j+1}(x) - l_j(x) - l_{j+1}(y)))]`` with ``x ~ pi_j``
    and ``y ~ pi_{j+1}`` independent, evaluated on a uniform grid of
    ``n_points`` over the prior's support (the rate of a well-mixed chain).

    Parameters
    ----------
    loglik : callable
        ``(omega, kappa) -> log-likelihood`` from :func:`loglik_function`.
    kappas : sequence of float
        Diffusion of every replica, cold first.
    betas : sequence of float, optional
        Likelihood powers (default all 1).
    n_points : int
        Grid size (1101 gives a spacing of 0.005).

    Returns
    -------
    numpy.ndarray
        One rate per adjacent pair.
    """
    kappas = np.asarray(kappas, dtype=np.float64)
    betas = np.ones_like(kappas) if betas is None else np.asarray(betas, dtype=np.float64)
    grid = np.linspace(PRIOR["lower"], PRIOR["upper"], n_points)
    cache: dict[float, np.ndarray] = {}
    targets = []
    for k, b in zip(kappas, betas):
        if float(k) not in cache:
            cache[float(k)] = np.array([loglik(w, k) for w in grid])
        targets.append(log_prior(grid) + b * cache[float(k)])
    rates = []
    for la, lb in zip(targets[:-1], targets[1:]):
        pa = np.exp(la - la.max())
        pa /= pa.sum()
        pb = np.exp(lb - lb.max())
        pb /= pb.sum()
        # log ratio[x, y] for x ~ pa (rows) and y ~ pb (columns)
        log_ratio = la[None, :] + lb[:, None] - la[:, None] - lb[None, :]
        accept = np.exp(np.minimum(log_ratio, 0.0))
        rates.append(float(pa @ accept @ pb))
    return np.array(rates)


def _sample(model: pm.Model, step, *, draws, tune, initvals, seed, **kwargs) -> az.InferenceData:
    with model:
        return pm.sample(
            draws=draws, tune=tune, step=step, chains=len(initvals), cores=1,
            initvals=initvals, random_seed=seed, progressbar=False,
            compute_convergence_checks=False, **kwargs,
        )


def run_nuts(model, *, draws, tune, initvals, seed) -> az.InferenceData:
    """PyMC's NUTS, one chain per entry of ``initvals`` (no jitter: chains start there)."""
    return _sample(model, None, draws=draws, tune=tune, initvals=initvals, seed=seed,
                   init="adapt_diag")


def run_pt(model, *, draws, tune, initvals, seed, **pt_kwargs) -> az.InferenceData:
    """:class:`pymc_pnode.ParallelTempering`, one chain per entry of ``initvals``."""
    with model:
        step = ParallelTempering(**pt_kwargs)
    idata = _sample(model, step, draws=draws, tune=tune, initvals=initvals, seed=seed)
    return label_replica_dims(idata)


def summarize(name: str, idata: az.InferenceData, ds: Dataset, ref: dict) -> dict:
    """Mode weights, ESS per second and ladder diagnostics of one run.

    ``sampling_time`` is PyMC's wall time of tuning plus drawing (all chains,
    run sequentially), excluding compilation.
    """
    omega = idata.posterior["omega"]
    labels = np.digitize(omega.values, ds.modes)
    n_modes = len(ds.modes) + 1
    per_chain = [[float((lab == j).mean()) for j in range(n_modes)] for lab in labels]
    pooled = [float((labels == j).mean()) for j in range(n_modes)]
    seconds = float(idata.posterior.attrs["sampling_time"])
    ess = float(az.ess(idata, var_names=["omega"])["omega"])
    rhat = float(az.rhat(idata, var_names=["omega"])["omega"])
    # ESS of the indicator of the reference's heaviest mode; undefined (NaN) when
    # the indicator never changes (a posterior that is one mode for the sampler).
    main = int(np.argmax(ref["weights"]))
    in_main = (labels == main).astype(float)
    ess_mode = np.nan
    if 0.0 < in_main.mean() < 1.0:
        indicator = omega.copy(data=in_main).rename("mode").to_dataset()
        ess_mode = float(az.ess(indicator)["mode"])
    row = {
        "sampler": name,
        "weights (pooled)": np.round(pooled, 3).tolist(),
        "weights per chain": [np.round(w, 3).tolist() for w in per_chain],
        "reference weights": np.round(ref["weights"], 3).tolist(),
        "mean": float(omega.mean()),
        "ref mean": ref["mean"],
        "R-hat": rhat,
        "ESS(omega)": ess,
        "ESS(mode indicator)": ess_mode,
        "time [s]": seconds,
        "ESS/s": ess / seconds,
    }
    stats = idata.sample_stats
    if "swap_rate" in stats:
        row["swap rates"] = np.round(stats["swap_rate"].values[:, -1].mean(axis=0), 2).tolist()
        row["round trips"] = stats["round_trips"].values[:, -1].tolist()
    return row


def table(rows: list[dict]) -> pd.DataFrame:
    """The summaries as a DataFrame indexed by sampler."""
    return pd.DataFrame(rows).set_index("sampler")


def _smoke_test() -> None:
    """A short diffusion-ladder run on the sparse data, checked against quadrature."""
    ode = make_ode()
    ds = DATASETS["sparse"]
    data = simulate(ds)
    loglik = loglik_function(ode, ds, data)
    t0 = time.perf_counter()
    ref = quadrature(loglik, KAPPA_COLD, ds)
    print(f"quadrature: {ref['n_evals']} evaluations, {time.perf_counter() - t0:.1f} s, "
          f"weights {np.round(ref['weights'], 3)}")
    kappa = pytensor.shared(KAPPA_COLD, name="kappa")
    model = build_model(ode, ds, data, kappa)
    idata = run_pt(model, draws=300, tune=200, initvals=[{"omega": 4.3}], seed=1,
                   shared_ladder=diffusion_ladder(kappa, hot=1e10, n_replicas=5, warm=1e7))
    print(table([summarize("PT, diffusion ladder", idata, ds, ref)]).T)


def _two_parameter() -> None:
    """Dense data with omega and the initial angle unknown: beta vs kappa ladder, one chain each."""
    ode = make_ode()
    ds = DATASETS["dense"]
    data = simulate(ds)
    kappa = pytensor.shared(KAPPA_COLD, name="kappa")
    model = build_two_parameter_model(ode, ds, data, kappa)
    ladders = {
        "PT, beta ladder (K=5, beta_min=1e-3)": {"n_replicas": 5, "beta_min": 1e-3},
        "PT, kappa ladder (1, 1e7, ..., 1e10)": {
            "shared_ladder": diffusion_ladder(kappa, hot=1e10, n_replicas=5, warm=1e7)
        },
    }
    for label, kwargs in ladders.items():
        idata = run_pt(model, draws=800, tune=400, initvals=[{"omega": 3.7, "phi0": 0.4}],
                       seed=5, **kwargs)
        post, stats = idata.posterior, idata.sample_stats
        ess = az.ess(idata, var_names=["omega", "phi0"])
        seconds = float(post.attrs["sampling_time"])
        print(f"{label}: time {seconds:.1f} s, omega {float(post.omega.mean()):.4f} "
              f"+- {float(post.omega.std()):.4f}, phi0 {float(post.phi0.mean()):.4f} "
              f"+- {float(post.phi0.std()):.4f}, ESS omega {float(ess.omega):.0f} "
              f"({float(ess.omega) / seconds:.2f}/s), ESS phi0 {float(ess.phi0):.0f} "
              f"({float(ess.phi0) / seconds:.2f}/s), swap rates "
              f"{np.round(stats.swap_rate.values[0, -1], 2)}, round trips "
              f"{int(stats.round_trips.values[0, -1])}", flush=True)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["two-parameter"]:
        _two_parameter()
    else:
        _smoke_test()
