"""``pn.DifferentialEquation`` against ``pm.ode.DifferentialEquation``: NUTS ESS/s and per-gradient time.

Two models, each sampled in its own fresh Python process (so "total" includes building and compiling the
model; the package's numba kernels come from the disk cache unless ``--cold``):

* ``sir``: PyMC's documented SIR example (``pm.ode`` API docs): S, I from (0.99, 0.01), β = 4, γ = 1, times
  0.25, 0.5, …, 4.75, lognormal noise σ = (0.2, 0.3) (seed 20394); priors σ ~ HalfCauchy(1),
  R0 ~ Normal(2, 3) truncated at 1, λ ~ LogNormal(log 2, 2), β = λ R0.
* ``vdp``: a stiffer model, van der Pol with μ = 10 (y1' = y2, y2' = μ (1 - y1²) y2 - y1) from (2, 0), y1
  observed at 0.5, 1, …, 20 with noise sd 0.1 (seed 3); priors μ ~ LogNormal(log 10, 0.5), y0 ~ N((2, 0), 0.5²),
  σ ~ HalfNormal(0.5).

Samplers: ``pm.ode`` + ``pm.sample``; ``pn.DifferentialEquation`` + ``pm.sample`` (``pn_pymc``; ``pn_pymc_1core``
runs the chains one after the other in this process, without worker start-up); ``pn.DifferentialEquation``
+ nutpie (numba backend). All 2 chains × (``--tune`` + ``--draws``) on 2 cores; ``pm.sample`` starts with its
default jitter+adapt_diag at the same seed. Reported: wall time in total and for sampling alone, minimum
bulk ESS over the free parameters, ESS/s on the total, divergences, posterior means.

Per-gradient time (``--gradients``): value and gradient of a Gaussian log-likelihood of the solution at the
true parameters, ``pn.DifferentialEquation`` (compiled PyTensor function, default and NUMBA modes) against
``scipy.integrate.solve_ivp`` on the forward-sensitivity system (RK45 for SIR, LSODA for van der Pol, same
rtol/atol, the package's compiled vector field and Jacobians) and against ``pm.ode``'s compiled logp+grad.

Run: ``python benchmarks/pm_ode.py [--models sir vdp] [--samplers pm_ode pn_pymc pn_nutpie] [--gradients]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import timeit
import warnings

import numpy as np

warnings.filterwarnings("ignore", message=".*could not link to a BLAS.*")

RTOL, ATOL = 1e-6, 1e-8


def sir(y, t, p):
    return [-p[0] * y[0] * y[1], p[0] * y[0] * y[1] - p[1] * y[1]]


def van_der_pol(y, t, p):
    return [y[1], p[0] * (1.0 - y[0] ** 2) * y[1] - y[0]]


def sir_data():
    from scipy.integrate import odeint

    times = np.arange(0, 5, 0.25)
    y = odeint(lambda y, t: sir(y, t, (4.0, 1.0)), [0.99, 0.01], times, rtol=1e-8)
    rng = np.random.default_rng(20394)
    return times[1:], np.exp(np.log(y[1:]) + rng.standard_normal(y[1:].shape) * [0.2, 0.3])


def vdp_data():
    from scipy.integrate import solve_ivp

    times = np.arange(0.5, 20.01, 0.5)
    sol = solve_ivp(lambda t, y: van_der_pol(y, t, (10.0,)), (0, 20), [2.0, 0.0], t_eval=times, method="Radau",
                    rtol=1e-10, atol=1e-10)
    return times, sol.y[0] + 0.1 * np.random.default_rng(3).standard_normal(times.size)


def build(model_name: str, backend: str):
    import pymc as pm

    import pymc_pnode as pn

    cls = pm.ode.DifferentialEquation if backend == "pm_ode" else pn.DifferentialEquation
    kw = {} if backend == "pm_ode" else {"rtol": RTOL, "atol": ATOL}
    if model_name == "sir":
        times, data = sir_data()
        ode = cls(func=sir, times=times, n_states=2, n_theta=2, t0=0, **kw)
        with pm.Model() as model:
            sigma = pm.HalfCauchy("sigma", 1, shape=2)
            r0 = pm.Truncated("R0", pm.Normal.dist(mu=2, sigma=3), lower=1)
            lam = pm.LogNormal("lambda", pm.math.log(2), 2)
            beta = pm.Deterministic("beta", lam * r0)
            curves = ode(y0=[0.99, 0.01], theta=[beta, lam])
            pm.LogNormal("Y", mu=pm.math.log(curves), sigma=sigma, observed=data)
        return model, ["sigma", "R0", "lambda"]
    times, data = vdp_data()
    ode = cls(func=van_der_pol, times=times, n_states=2, n_theta=1, t0=0, **kw)
    with pm.Model() as model:
        mu = pm.LogNormal("mu", np.log(10.0), 0.5)
        y0 = pm.Normal("y0", [2.0, 0.0], 0.5, shape=2)
        sigma = pm.HalfNormal("sigma", 0.5)
        curves = ode(y0=y0, theta=[mu])
        pm.Normal("Y", mu=curves[:, 0], sigma=sigma, observed=data)
    return model, ["mu", "y0", "sigma"]


def run_sampler(model_name: str, sampler: str, draws: int, tune: int) -> dict:
    """One sampling run (in this process); returns the measurements."""
    import arviz as az
    import pymc as pm

    t_start = time.perf_counter()
    model, names = build(model_name, "pm_ode" if sampler == "pm_ode" else "pn")
    if sampler == "pn_nutpie":
        import nutpie

        compiled = nutpie.compile_pymc_model(model, backend="numba")
        t_sample = time.perf_counter()
        idata = nutpie.sample(compiled, draws=draws, tune=tune, chains=2, cores=2, seed=1, progress_bar=False)
    else:
        with model:
            t_sample = time.perf_counter()
            idata = pm.sample(draws, tune=tune, chains=2, cores=1 if sampler == "pn_pymc_1core" else 2,
                              random_seed=1, progressbar=False, compute_convergence_checks=False)
    t_end = time.perf_counter()
    ess = az.ess(idata, var_names=names)
    min_ess = min(float(ess[n].min()) for n in names)
    rhat = az.rhat(idata, var_names=names)
    return {
        "total_s": t_end - t_start,
        "sampling_s": t_end - t_sample,
        "min_ess_bulk": min_ess,
        "max_rhat": max(float(rhat[n].max()) for n in names),
        "divergences": int(idata.sample_stats["diverging"].sum()),
        "means": {n: np.round(idata.posterior[n].mean(("chain", "draw")).values, 3).tolist() for n in names},
    }


def subprocess_run(model_name: str, sampler: str, args, cold: bool) -> dict:
    env = dict(os.environ)
    if cold:  # fresh caches: numba kernels and generated vector-field code compile from scratch
        cache = tempfile.mkdtemp(prefix="pm_ode_bench_")
        env.update(NUMBA_CACHE_DIR=cache, PYMC_PNODE_CACHE_DIR=cache)
    cmd = [sys.executable, __file__, "--one", model_name, sampler, "--draws", str(args.draws), "--tune", str(args.tune)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def sensitivity_gradient(ode, y0, theta, times, data, sigma, method):
    """Value and gradient of a Gaussian log-likelihood by solve_ivp on the forward-sensitivity system."""
    from scipy.integrate import solve_ivp

    d, k = ode.n_states, ode.n_theta
    jy, jp, f = np.empty((d, d)), np.empty((d, k)), np.empty(d)

    def rhs(t, z):
        y = z[:d]
        s = z[d:].reshape(d, d + k)  # dy/d(y0, theta)
        ode.rhs(y, t, theta, f)
        ode.jac_y(y, t, theta, jy)
        ode.jac_p(y, t, theta, jp)
        ds = jy @ s
        ds[:, d:] += jp
        return np.concatenate([f, ds.ravel()])

    z0 = np.concatenate([y0, np.hstack([np.eye(d), np.zeros((d, k))]).ravel()])
    sol = solve_ivp(rhs, (0.0, times[-1]), z0, t_eval=times, method=method, rtol=RTOL, atol=ATOL)
    ys = sol.y[:d].T
    sens = sol.y[d:].T.reshape(-1, d, d + k)
    resid = (data - ys) / sigma
    value = -0.5 * np.sum(resid**2)
    grad = np.einsum("ti,tij->j", resid / sigma, sens)
    return value, grad


def gradient_timings(model_name: str, repeats: int) -> list[tuple[str, float]]:
    import pytensor
    import pytensor.tensor as pt

    import pymc_pnode as pn

    if model_name == "sir":
        times, _ = sir_data()
        func, d, k, y0, theta, method = sir, 2, 2, np.array([0.99, 0.01]), np.array([4.0, 1.0]), "RK45"
    else:
        times, _ = vdp_data()
        func, d, k, y0, theta, method = van_der_pol, 2, 1, np.array([2.0, 0.0]), np.array([10.0]), "LSODA"
    de = pn.DifferentialEquation(func, times, n_states=d, n_theta=k, rtol=RTOL, atol=ATOL)
    data = de.solver.solve(y0, theta) * 1.01
    y0_var, theta_var = pt.dvector("y0"), pt.dvector("theta")
    value = -0.5 * pt.sum(((data - de(y0=y0_var, theta=theta_var)) / 0.1) ** 2)
    rows = []
    for mode in ("FAST_RUN", "NUMBA"):
        fn = pytensor.function([y0_var, theta_var], [value, *pt.grad(value, [y0_var, theta_var])], mode=mode)
        fn(y0, theta)
        rows.append((f"pn.DifferentialEquation logp+grad ({mode})", _median(lambda: fn(y0, theta), repeats)))
    def sens():
        return sensitivity_gradient(de.ode, y0, theta, times, data, 0.1, method)

    sens()
    rows.append((f"solve_ivp {method} forward sensitivities", _median(sens, max(3, repeats // 20))))
    pm_de = __import__("pymc").ode.DifferentialEquation(func=func, times=times, n_states=d, n_theta=k, t0=0)
    pm_value = -0.5 * pt.sum(((data - pm_de(y0=y0_var, theta=theta_var)) / 0.1) ** 2)
    pm_fn = pytensor.function([y0_var, theta_var], [pm_value, *pt.grad(pm_value, [y0_var, theta_var])])
    pm_fn(y0, theta)
    rows.append(("pm.ode.DifferentialEquation logp+grad", _median(lambda: pm_fn(y0, theta), max(3, repeats // 20))))
    return rows


def _median(fn, repeats: int) -> float:
    return float(np.median(timeit.repeat(fn, number=1, repeat=repeats)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["sir", "vdp"], choices=["sir", "vdp"])
    parser.add_argument("--samplers", nargs="+", default=["pm_ode", "pn_pymc", "pn_pymc_1core", "pn_nutpie"],
                        choices=["pm_ode", "pn_pymc", "pn_pymc_1core", "pn_nutpie"])
    parser.add_argument("--draws", type=int, default=500)
    parser.add_argument("--tune", type=int, default=500)
    parser.add_argument("--cold", action="store_true", help="also run the pn samplers with empty caches")
    parser.add_argument("--gradients", action="store_true", help="per-gradient timings only")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_sampler(*args.one, args.draws, args.tune)))
        return
    import pymc
    import pytensor

    import pymc_pnode

    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
          f"pymc {pymc.__version__}, pytensor {pytensor.__version__}, pymc_pnode {pymc_pnode.__version__}; "
          f"rtol={RTOL}, atol={ATOL}; load average {os.getloadavg()}\n")
    if args.gradients:
        print("| model | method | ms per value+gradient |\n| --- | --- | --- |")
        for model_name in args.models:
            for label, seconds in gradient_timings(model_name, args.repeats):
                print(f"| {model_name} | {label} | {1e3 * seconds:.3f} |", flush=True)
        return
    print(f"2 chains x ({args.tune} tune + {args.draws} draws), 2 cores\n")
    print("| model | sampler | caches | total s | sampling s | min bulk ESS | ESS/s (total) | max R-hat | divergences "
          "| posterior means |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for model_name in args.models:
        for sampler in args.samplers:
            for cold in ([False, True] if args.cold and sampler != "pm_ode" else [False]):
                r = subprocess_run(model_name, sampler, args, cold)
                print(f"| {model_name} | {sampler} | {'cold' if cold else 'warm'} | {r['total_s']:.1f} | "
                      f"{r['sampling_s']:.1f} | {r['min_ess_bulk']:.0f} | {r['min_ess_bulk'] / r['total_s']:.1f} | "
                      f"{r['max_rhat']:.3f} | {r['divergences']} | {r['means']} |", flush=True)
    print(f"\nload average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
