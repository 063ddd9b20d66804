"""Fenrir speed: time per log-likelihood and per log-likelihood + gradient, and NUTS ESS per second.

Problem: FitzHugh–Nagumo (a = b = 0.2, c = 3, y0 = [-1, 1]); y1 observed at t = 1.0, 1.1, ..., 20.0
with Gaussian noise (sd 0.1, seeded); IWP(3) prior, EK1, fixed steps 0.05 and 0.01 from t0 = 0,
diffusion 1, gradient with respect to y0, theta and the noise sd.

Rows, side by side in one process:

- ``pymc_pnode.fenrir_loglik`` compiled with ``pytensor.function`` (value, and value + ``pytensor.grad``)
  in the default mode and in ``mode="NUMBA"``;
- probdiffeq's jitted time-series marginal likelihood (``loss_lml_timeseries``) and its jitted
  ``jax.value_and_grad``: dense state-space model, IWP(3), ``constraint_ode_ts1`` with a
  materialised Jacobian (EK1), fixed-interval smoother on the same grid, no output-scale
  calibration (diffusion 1). Runs when JAX and probdiffeq (the ``bench`` extra) are importable.

``--nuts`` adds short NUTS runs (minutes): effective samples per second for the pymc_pnode Fenrir
model (``pm.sample``; optionally in ``mode="NUMBA"`` or sampled by nutpie),
``pm.ode.DifferentialEquation`` on the same data and, when BlackJAX is importable,
probdiffeq + BlackJAX NUTS, all with the same priors and the same posterior parametrisation.

Run: ``python benchmarks/fenrir_speed.py [--nuts]``; prints Markdown tables for ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time
import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
from scipy.integrate import solve_ivp

import pymc_pnode as pn
from pymc_pnode.solve import fixed_grid

THETA = np.array([0.2, 0.2, 3.0])
Y0 = np.array([-1.0, 1.0])
SIGMA = 0.1
DIFFUSION = 1.0
ORDER = 3
TIMES = np.round(np.arange(10, 201) / 10.0, 10)  # 1.0, 1.1, ..., 20.0
UNOBSERVED_STD = 1e6  # probdiffeq observes the full state at every grid point; this hides an entry

warnings.filterwarnings("ignore", message="PyTensor could not link to a BLAS")


def fhn(y, t, p):
    """FitzHugh–Nagumo in the ``pm.ode.DifferentialEquation`` signature."""
    return [p[2] * (y[0] - y[0] ** 3 / 3 + y[1]), -(y[0] - p[0] - p[1] * y[1]) / p[2]]


def simulate_data(seed: int) -> np.ndarray:
    """y1 at ``TIMES`` (reference solution, rtol = atol = 1e-12) plus N(0, 0.1²) noise."""
    sol = solve_ivp(lambda t, y: fhn(y, t, THETA), (0.0, TIMES[-1]), Y0, method="DOP853",
                    t_eval=TIMES, rtol=1e-12, atol=1e-12)
    return sol.y[0] + SIGMA * np.random.default_rng(seed).standard_normal(TIMES.size)


def interleaved_seconds(fns: list, repeats: int) -> list[tuple[float, float]]:
    """Median and minimum wall time per function, calling the functions in turn ``repeats`` times.

    The shared machine has slow spells of several seconds in which everything runs up to 2× slower;
    taking turns exposes every implementation to the same spells, and the minimum shows the
    undisturbed cost.
    """
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [(float(np.median(ts)), float(np.min(ts))) for ts in times]


def load_avg() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def grad_error(grad: np.ndarray, value_fn, x: np.ndarray) -> float:
    """max |grad − central difference| / max |central difference| at ``x`` (flat parameters)."""
    fd = np.empty_like(x)
    for i in range(x.size):
        h = 1e-6 * max(1.0, abs(x[i]))
        e = np.zeros_like(x)
        e[i] = h
        fd[i] = (value_fn(x + e) - value_fn(x - e)) / (2 * h)
    return float(np.max(np.abs(grad - fd)) / np.max(np.abs(fd)))


def split(x: np.ndarray):
    """Flat parameter vector ``[y0 (2), theta (3), sigma]`` → ``(y0, theta, sigma)``."""
    return x[:2], x[2:5], x[5]


# --------------------------------------------------------------------------- pymc_pnode
def pnode_functions(ode: pn.ODE, data: np.ndarray, step: float, mode):
    """Compiled value and value+gradient functions of ``pn.fenrir_loglik``; first-call seconds."""
    t0 = time.perf_counter()
    y0, theta, sigma = pt.vector("y0"), pt.vector("theta"), pt.scalar("sigma")
    ll = pn.fenrir_loglik(ode, y0, theta, TIMES, data[:, None], obs_matrix=[[1.0, 0.0]],
                          obs_sigma=sigma, diffusion=DIFFUSION, solver=pn.EK1(order=ORDER), step=step)
    grads = pytensor.grad(ll, [y0, theta, sigma])
    value = pytensor.function([y0, theta, sigma], ll, mode=mode)
    value_grad = pytensor.function([y0, theta, sigma], [ll, *grads], mode=mode)
    x = np.concatenate([Y0, THETA, [SIGMA]])
    value(*split(x))
    value_grad(*split(x))
    first = time.perf_counter() - t0

    def val(x):
        return float(value(*split(x)))

    def val_grad(x):
        v, gy, gt, gs = value_grad(*split(x))
        return float(v), np.concatenate([gy, gt, [gs]])

    return val, val_grad, first


# --------------------------------------------------------------------------- probdiffeq peer
def load_peer():
    """``(jax, jnp, ivpsolve, probdiffeq)`` with float64 enabled, or None (message printed)."""
    try:
        import jax

        jax.config.update("jax_enable_x64", True)
        # Synchronous CPU dispatch: JAX compilation never overlaps a running computation, so
        # compile time can be told apart from sampling time (see CompileClock).
        jax.config.update("jax_cpu_enable_async_dispatch", False)
        import jax.numpy as jnp
        from probdiffeq import ivpsolve
        from probdiffeq import probdiffeq as pdq
    except ImportError as err:
        print(f"probdiffeq peer skipped: {err} (install the `bench` extra to include it)\n")
        return None
    return jax, jnp, ivpsolve, pdq


def probdiffeq_loglik(peer, data: np.ndarray, step: float):
    """probdiffeq's Fenrir-type log-likelihood ``(y0, theta, sigma) -> float`` (a JAX function).

    The grid is pymc_pnode's (0 → 20, containing every observation time). probdiffeq's
    ``loss_lml_timeseries`` observes the whole state at every grid point, so y2 and the grid points
    between observations get the standard deviation ``UNOBSERVED_STD``; their nearly constant
    contribution ``-log(UNOBSERVED_STD) - log(2π)/2`` per entry is removed, which leaves the same
    quantity as ``pn.fenrir_loglik`` (checked: the printed values agree).
    """
    jax, jnp, ivpsolve, pdq = peer
    grid = fixed_grid(np.union1d([0.0], TIMES), step)
    obs_idx = np.searchsorted(grid, TIMES)
    assert np.allclose(grid[obs_idx], TIMES)
    u = np.zeros((grid.size, 2))
    u[obs_idx, 0] = data
    n_hidden = 2 * grid.size - TIMES.size
    offset = n_hidden * (math.log(UNOBSERVED_STD) + 0.5 * math.log(2 * math.pi))
    grid, u = jnp.asarray(grid), jnp.asarray(u)
    loss = pdq.loss_lml_timeseries(average_pdfs=False)

    def loglik(y0, theta, sigma):
        vf = pdq.ode(lambda y, *, t: jnp.stack(fhn(y, t, theta)), jacobian=pdq.jacobian_materialize())
        tcoeffs, _ = pdq.jetexpand_ode_unroll(num=ORDER)(vf, [y0], t=0.0)
        ssm = pdq.state_space_model_dense()
        prior = ssm.prior_wiener_integrated(tcoeffs, output_scale=math.sqrt(DIFFUSION) * jnp.ones(2))
        solver = pdq.solver(constraint=ssm.constraint_ode_ts1(vf),
                            strategy=pdq.strategy_smoother_fixedinterval())
        sol = ivpsolve.solve_fixed_grid(solver=solver)(prior, grid=grid)
        std = jnp.full(u.shape, UNOBSERVED_STD).at[obs_idx, 0].set(sigma)
        return loss(u, posterior=sol.solution_full, std=std) + offset

    return loglik


def probdiffeq_functions(peer, data: np.ndarray, step: float):
    """Jitted value and ``value_and_grad`` of :func:`probdiffeq_loglik`; first-call seconds."""
    jax, jnp = peer[0], peer[1]
    loglik = probdiffeq_loglik(peer, data, step)
    value = jax.jit(loglik)
    value_grad = jax.jit(jax.value_and_grad(loglik, argnums=(0, 1, 2)))
    x = np.concatenate([Y0, THETA, [SIGMA]])
    args = lambda x: (jnp.asarray(x[:2]), jnp.asarray(x[2:5]), jnp.asarray(x[5]))  # noqa: E731
    t0 = time.perf_counter()
    jax.block_until_ready(value(*args(x)))
    jax.block_until_ready(value_grad(*args(x)))
    first = time.perf_counter() - t0

    def val(x):
        return float(jax.block_until_ready(value(*args(x))))

    def val_grad(x):
        v, (gy, gt, gs) = jax.block_until_ready(value_grad(*args(x)))
        return float(v), np.concatenate([np.asarray(gy), np.asarray(gt), [float(gs)]])

    return val, val_grad, first


def timing_table(data: np.ndarray, steps, repeats: int, peer) -> list[tuple]:
    """Rows ``(step, n_steps, implementation, logp ms, logp+grad ms, logp+grad min ms, first s, logp, grad error)``."""
    t0 = time.perf_counter()
    ode = pn.ODE(fhn, n_states=2, n_theta=3)
    print(f"pn.ODE construction: {time.perf_counter() - t0:.2f} s")
    x = np.concatenate([Y0, THETA, [SIGMA]])
    rows = []
    for step in steps:
        n_steps = fixed_grid(np.union1d([0.0], TIMES), step).size - 1
        impls = [(f"pymc_pnode, pytensor default mode ({pytensor.config.mode})",
                  lambda: pnode_functions(ode, data, step, None)),
                 ("pymc_pnode, mode=\"NUMBA\"", lambda: pnode_functions(ode, data, step, "NUMBA"))]
        if peer is not None:
            impls.append(("probdiffeq, jax.jit (value) / jax.jit(jax.value_and_grad)",
                          lambda: probdiffeq_functions(peer, data, step)))
        built = []
        for label, build in impls:
            val, val_grad, first = build()
            built.append((label, val, val_grad, first))
            print(f"  step {step}: {label} built ({first:.1f} s)", flush=True)
        t_vals = interleaved_seconds([lambda val=val: val(x) for _, val, _, _ in built], repeats)
        t_grads = interleaved_seconds([lambda vg=vg: vg(x) for _, _, vg, _ in built], repeats)
        for (label, val, val_grad, first), (t_val, _), (t_grad, t_grad_min) in zip(built, t_vals, t_grads):
            value, grad = val_grad(x)
            rows.append((step, n_steps, label, t_val * 1e3, t_grad * 1e3, t_grad_min * 1e3, first, value,
                         grad_error(grad, val, x)))
            print(f"  step {step}: {label}: logp {t_val * 1e3:.2f} ms, logp+grad {t_grad * 1e3:.2f} ms "
                  f"(min {t_grad_min * 1e3:.2f}; load {load_avg()})", flush=True)
    return rows


# --------------------------------------------------------------------------- NUTS
PRIOR_THETA_SD, PRIOR_Y0_SD, PRIOR_SIGMA_SD = 0.5, 0.5, 0.2


def pymc_model(kind: str, data: np.ndarray, step: float, y0_known: bool):
    """The benchmark posterior in PyMC with the Fenrir likelihood or ``pm.ode.DifferentialEquation``."""
    import pymc as pm

    with pm.Model() as model:
        theta = pm.LogNormal("theta", np.log(THETA), PRIOR_THETA_SD, shape=3)
        y0 = Y0 if y0_known else pm.Normal("y0", Y0, PRIOR_Y0_SD, shape=2)
        sigma = pm.HalfNormal("sigma", PRIOR_SIGMA_SD)
        if kind == "fenrir":
            ode = pn.ODE(fhn, n_states=2, n_theta=3)
            pn.Fenrir("y1", ode, y0=y0, theta=theta, times=TIMES, observed=data[:, None],
                      obs_matrix=[[1.0, 0.0]], obs_sigma=sigma, diffusion=DIFFUSION,
                      solver=pn.EK1(order=ORDER), step=step)
        else:
            ode = pm.ode.DifferentialEquation(func=fhn, times=TIMES, n_states=2, n_theta=3, t0=0.0)
            pm.Normal("y1", ode(y0=y0, theta=theta)[:, 0], sigma, observed=data)
    return model


def true_start(y0_known: bool) -> dict:
    """The true values of the free variables: every sampler starts there."""
    return {"theta": THETA, "sigma": SIGMA} if y0_known else {"theta": THETA, "y0": Y0, "sigma": SIGMA}


def run_pymc_nuts(kind: str, data, step: float, chains: int, tune: int, draws: int, seed: int,
                  dense: bool, y0_known: bool, mode=None) -> dict:
    """``pm.sample`` (NUTS, chains one after another) started at the true values; dense or diagonal
    mass-matrix adaptation."""
    import pymc as pm

    model = pymc_model(kind, data, step, y0_known)
    kwargs = {} if mode is None else {"compile_kwargs": {"mode": mode}}
    load0 = load_avg()
    t0 = time.perf_counter()
    with model:
        idata = pm.sample(draws=draws, tune=tune, chains=chains, cores=1,
                          init="adapt_full" if dense else "adapt_diag",
                          initvals=true_start(y0_known), random_seed=seed,
                          progressbar=False, compute_convergence_checks=False,
                          discard_tuned_samples=False, **kwargs)
    wall = time.perf_counter() - t0
    n_grad = int(idata.warmup_sample_stats["n_steps"].sum() + idata.sample_stats["n_steps"].sum())
    return summarise(idata, tune, float(idata.sample_stats.attrs["sampling_time"]), wall, n_grad,
                     int(idata.sample_stats["diverging"].sum()), load0)


def run_nutpie_nuts(data, step: float, chains: int, tune: int, draws: int, seed: int, dense: bool,
                    y0_known: bool) -> dict:
    """The pymc_pnode Fenrir model sampled by nutpie (the Ops' numba implementations compiled into
    nutpie's logp), chains one after another from the true values; ``dense`` selects nutpie's
    low-rank-modified mass matrix."""
    import nutpie

    model = pymc_model("fenrir", data, step, y0_known)
    t0 = time.perf_counter()
    compiled = nutpie.compile_pymc_model(model, initial_points=true_start(y0_known), jitter_rvs=set())
    compile_seconds = time.perf_counter() - t0
    load0 = load_avg()
    t1 = time.perf_counter()
    idata = nutpie.sample(compiled, draws=draws, tune=tune, chains=chains, cores=1, seed=seed,
                          save_warmup=True, progress_bar=False, low_rank_modified_mass_matrix=dense)
    seconds = time.perf_counter() - t1
    n_grad = int(idata.warmup_sample_stats["n_steps"].sum() + idata.sample_stats["n_steps"].sum())
    return summarise(idata, tune, seconds, seconds + compile_seconds, n_grad,
                     int(idata.sample_stats["diverging"].sum()), load0)


def summarise(idata, tune: int, seconds: float, wall: float, n_grad: int, divergences: int,
              load0: str) -> dict:
    """Minimum bulk ESS over all parameters (ArviZ), rates and posterior means of one run."""
    import arviz as az

    post = idata.posterior
    ess = az.ess(post[[v for v in ("theta", "y0", "sigma") if v in post]], method="bulk")
    th = post["theta"].mean(("chain", "draw")).values
    n_draws = post.sizes["chain"] * post.sizes["draw"]
    return dict(ess=float(min(ess[v].values.min() for v in ess.data_vars)), seconds=seconds,
                wall=wall, n_grad=n_grad, n_draws=n_draws, chains=post.sizes["chain"], tune=tune,
                divergences=divergences,
                means=f"a={th[0]:.3f}, b={th[1]:.3f}, c={th[2]:.3f}, σ={float(post['sigma'].mean()):.3f}",
                load=f"{load0} → {load_avg()}")


class CompileClock:
    """Wall time JAX spends tracing, lowering and compiling (union of the reported time spans).

    Valid with synchronous dispatch (set in :func:`load_peer`); otherwise compilation can overlap
    running computations and would be subtracted twice.
    """

    EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
              "/jax/core/compile/jaxpr_to_mlir_module_duration",
              "/jax/core/compile/backend_compile_duration")

    def __init__(self):
        self.spans: list[tuple[float, float]] = []

    def __call__(self, event, start, end, **kwargs):
        if event in self.EVENTS:
            self.spans.append((start, end))

    def seconds(self) -> float:
        total, reach = 0.0, -math.inf  # nested traces (inner jits) are counted once
        for start, end in sorted(self.spans):
            if end > reach:
                total += end - max(start, reach)
                reach = end
        return total


def run_blackjax_nuts(peer, data, step: float, chains: int, tune: int, draws: int, seed: int,
                      dense: bool, y0_known: bool):
    """probdiffeq likelihood + BlackJAX NUTS (Stan-style window adaptation), same posterior."""
    try:
        import blackjax
    except ImportError as err:
        print(f"probdiffeq + BlackJAX row skipped: {err}")
        return None
    import arviz as az
    from jax import monitoring

    jax, jnp = peer[0], peer[1]
    loglik = probdiffeq_loglik(peer, data, step)

    def logdensity(z):
        # z = [log theta (3), y0 (2, unless known), log sigma]: PyMC's transforms, with their
        # log-Jacobians.
        log_theta, log_sigma = z[:3], z[-1]
        y0 = jnp.asarray(Y0) if y0_known else z[3:5]
        sigma = jnp.exp(log_sigma)
        lp = -0.5 * jnp.sum(((log_theta - jnp.log(THETA)) / PRIOR_THETA_SD) ** 2)
        lp += -0.5 * jnp.sum(((y0 - Y0) / PRIOR_Y0_SD) ** 2)
        lp += -0.5 * (sigma / PRIOR_SIGMA_SD) ** 2 + log_sigma
        return lp + loglik(y0, jnp.exp(log_theta), sigma)

    clock = CompileClock()
    monitoring.register_event_time_span_listener(clock)
    z0 = jnp.concatenate([jnp.log(THETA), jnp.zeros(0) if y0_known else jnp.asarray(Y0),
                          jnp.log(jnp.array([SIGMA]))])
    key = jax.random.key(seed)
    samples, divergences, n_grad = [], 0, 0
    load0 = load_avg()
    t0 = time.perf_counter()
    try:
        for _ in range(chains):
            key, k_warm, k_draw = jax.random.split(key, 3)
            warmup = blackjax.window_adaptation(blackjax.nuts, logdensity, target_acceptance_rate=0.8,
                                                is_mass_matrix_diagonal=not dense)
            (state, params), warm_info = jax.block_until_ready(warmup.run(k_warm, z0, num_steps=tune))
            kernel = blackjax.nuts(logdensity, **params)

            def one_step(s, k, kernel=kernel):
                s, info = kernel.step(k, s)
                return s, (s.position, info.is_divergent, info.num_integration_steps)

            run = jax.jit(lambda s, ks: jax.lax.scan(one_step, s, ks))
            _, (positions, divergent, n_steps) = jax.block_until_ready(
                run(state, jax.random.split(k_draw, draws)))
            samples.append(np.asarray(positions))
            divergences += int(np.sum(divergent))
            n_grad += int(np.sum(n_steps) + np.sum(warm_info.info.num_integration_steps))
    finally:
        monitoring.unregister_event_time_span_listener(clock)
    wall = time.perf_counter() - t0
    z = np.stack(samples)  # (chain, draw, 6)
    post = {"theta": np.exp(z[..., :3]), "sigma": np.exp(z[..., -1])}
    if not y0_known:
        post["y0"] = z[..., 3:5]
    idata = az.from_dict(posterior=post)
    return summarise(idata, tune, wall - clock.seconds(), wall, n_grad, divergences, load0)


def nuts_table(data, peer, args) -> list[tuple[str, dict]]:
    """Run the requested samplers one after another; rows ``(label, summary)``."""
    common = dict(chains=args.chains, tune=args.tune, draws=args.draws, seed=args.seed,
                  dense=args.mass_matrix == "dense", y0_known=args.nuts_y0 == "known")
    results = []
    if "fenrir" in args.samplers:
        results.append(("pymc_pnode Fenrir, pm.sample",
                        run_pymc_nuts("fenrir", data, args.nuts_step, **common)))
    if "fenrir-numba" in args.samplers:
        results.append(("pymc_pnode Fenrir, pm.sample (mode=\"NUMBA\")",
                        run_pymc_nuts("fenrir", data, args.nuts_step, **common, mode="NUMBA")))
    if "fenrir-nutpie" in args.samplers:
        results.append(("pymc_pnode Fenrir, nutpie", run_nutpie_nuts(data, args.nuts_step, **common)))
    if "pm-ode" in args.samplers:
        ode = {**common, "chains": args.ode_chains or args.chains, "tune": args.ode_tune or args.tune,
               "draws": args.ode_draws or args.draws}
        results.append(("pm.ode.DifferentialEquation, pm.sample",
                        run_pymc_nuts("ode", data, args.nuts_step, **ode)))
    if "blackjax" in args.samplers:
        if peer is None:
            print("probdiffeq + BlackJAX row skipped: probdiffeq is not installed")
        else:
            bj = run_blackjax_nuts(peer, data, args.nuts_step, **common)
            if bj is not None:
                results.append(("probdiffeq + BlackJAX NUTS", bj))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=float, nargs="+", default=[0.05, 0.01])
    parser.add_argument("--repeats", type=int, default=15, help="timed calls per median")
    parser.add_argument("--seed", type=int, default=20240521, help="data and sampler seed")
    parser.add_argument("--no-peer", action="store_true", help="skip probdiffeq even if installed")
    parser.add_argument("--skip-timing", action="store_true", help="only the NUTS comparison")
    parser.add_argument("--nuts", action="store_true", help="also run short NUTS comparisons (minutes)")
    parser.add_argument("--nuts-step", type=float, default=0.05)
    parser.add_argument("--samplers", nargs="+", default=["fenrir", "pm-ode", "blackjax"],
                        choices=["fenrir", "fenrir-numba", "fenrir-nutpie", "pm-ode", "blackjax"])
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--tune", type=int, default=200)
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--mass-matrix", choices=["dense", "diag"], default="dense",
                        help="mass-matrix adaptation of every sampler (the posterior is strongly correlated)")
    parser.add_argument("--nuts-y0", choices=["known", "unknown"], default="known",
                        help="y0 in the NUTS posterior (unknown: a thin ridge, tree depth 8-10)")
    parser.add_argument("--ode-chains", type=int, help="chains for pm.ode (default: --chains)")
    parser.add_argument("--ode-tune", type=int, help="tune steps for pm.ode (default: --tune)")
    parser.add_argument("--ode-draws", type=int, help="draws for pm.ode (default: --draws)")
    args = parser.parse_args()

    print(f"{time.strftime('%Y-%m-%d %H:%M %Z')}; {platform.machine()}, {os.cpu_count()} cores; "
          f"load average (1/5/15 min) at start {load_avg()}")
    print(f"python {platform.python_version()}, pymc_pnode {pn.__version__}, pytensor "
          f"{pytensor.__version__}, numpy {np.__version__}")
    peer = None if args.no_peer else load_peer()
    if peer is not None:
        import probdiffeq

        print(f"peer: jax {peer[0].__version__}, probdiffeq {probdiffeq.__version__} (CPU, float64)")
    data = simulate_data(args.seed)

    if not args.skip_timing:
        rows = timing_table(data, args.steps, args.repeats, peer)
        print(f"\nFenrir log-likelihood, FitzHugh–Nagumo, {TIMES.size} observations of y1, IWP({ORDER}), "
              f"EK1; median of {args.repeats} calls, the implementations taking turns; "
              f"gradient with respect to y0, theta, sigma. "
              f"Load average at the end: {load_avg()}\n")
        print("| step | steps | implementation | logp [ms] | logp+grad [ms] | logp+grad min [ms] | first call [s] | "
              "logp | grad vs central diff. (rel.) |\n" + "| --- " * 9 + "|")
        for step, n, label, t_val, t_grad, t_grad_min, first, value, err in rows:
            print(f"| {step} | {n} | {label} | {t_val:.2f} | {t_grad:.2f} | {t_grad_min:.2f} | {first:.1f} | "
                  f"{value:.6f} | {err:.1e} |")

    if args.nuts:
        print(f"\nNUTS, step {args.nuts_step}, chains run one after another, started at the true values, "
              f"{args.mass_matrix} mass matrix, y0 {args.nuts_y0}",
              flush=True)
        results = nuts_table(data, peer, args)
        print("\n| sampler | chains × (tune + draws) | min bulk ESS | sampling time [s] | ESS/s | "
              "grad evals per draw | ms per grad eval | wall incl. compile [s] | divergences | "
              "posterior means | load average |\n" + "| --- " * 11 + "|")
        for label, r in results:
            chains, per_chain = r["chains"], r["n_draws"] // r["chains"]
            print(f"| {label} | {chains} × ({r['tune']} + {per_chain}) | {r['ess']:.0f} | "
                  f"{r['seconds']:.1f} | {r['ess'] / r['seconds']:.3f} | "
                  f"{r['n_grad'] / (chains * (r['tune'] + per_chain)):.1f} | "
                  f"{r['seconds'] / r['n_grad'] * 1e3:.1f} | {r['wall']:.1f} | {r['divergences']} | "
                  f"{r['means']} | {r['load']} |")


if __name__ == "__main__":
    main()
