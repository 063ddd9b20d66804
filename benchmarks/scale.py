"""Scaling with the number of states: build, first compile, logp + gradient and peak memory of a Fenrir model.

Problems (``--problem``): ``lorenz96``, ``dy_i/dt = (y_{i+1} - y_{i-2}) y_{i-1} - y_i + F`` (indices mod d),
F = 8 the one parameter, y0 = F + sin(i), every other state observed at t = 0.1, 0.2, ..., 2.0 with Gaussian
noise (sd 0.1, seeded); ``fisher_kpp``, the method-of-lines reaction–diffusion PDE of
``case_studies/reaction_diffusion.py`` on d cells (parameters D = 0.0025 and r = 3, the initial front
``exp(-(x/0.08)²)``, every other cell observed at t = 0.4, 0.8, ..., 4.0 with noise sd 0.05, seeded; its
stiffness grows like D d²). IWP(3) prior, fixed steps from t0 = 0 (``--step``; by default 200 steps of 0.01 for
Lorenz-96, 4000 of 0.001 for the PDE: with 0.002 the isotropic EK0 and with 0.02 every solver fails at d = 100, and
our fixed-step guard returns -inf where probdiffeq returned -4e79), diffusion 1; gradient with respect to y0, the
parameters and the noise sd. Solvers (``--structures``): ``dense`` = EK1(3),
``diagonal`` = EK1(3, structure="diagonal"), ``isotropic`` = EK0(3, structure="isotropic").

Every size runs in a fresh Python process, as a user building a new model pays: the package's library
kernels come from a warmed numba cache (copied, so that every run starts from the same cache), the
generated vector-field modules and any kernel specialised on the model are compiled in the run. The warm
cache is made first by fitting *other* models (FitzHugh–Nagumo, d = 2, and Lorenz-96 with
``--warm-states``), so kernels that depend only on the solver's order count as library kernels.

Phases (seconds): ``ode`` = ``pn.ODE`` (tracing, symbolic Jacobians, the rhs/Jacobian module),
``hessians`` and ``taylor`` = the generated modules of the second derivatives the gradient needs
(``ODE.hess_contract``) and of the Taylor coefficients and their vector–Jacobian product (``ODE.taylor_vjp``;
source and numba compile), ``graph`` = ``pn.fenrir_loglik`` and ``pytensor.function`` of logp and its
gradient, ``first`` = the first evaluation (compiles any kernel specialised on the model), ``total`` = all of
them (PyMC is imported before the clock starts: a PyMC user has imported it already); ``eval`` = median seconds
per logp + gradient over ``--repeats`` calls; ``rss`` = the process's peak resident memory.

With ``--peer`` (run it with a Python that has the ``bench`` extra), every dense and diagonal size is also timed
with probdiffeq's state-space model of the same structure (:func:`measure_peer`), in its own fresh process; its
"first" is tracing, XLA compilation and the first call.

Run: ``python benchmarks/scale.py --states 5 10 20`` (prints a Markdown table; ``--json FILE`` saves rows).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import namedtuple
from pathlib import Path

ORDER = 3
FORCING = 8.0
UNOBSERVED_STD = 1e6  # probdiffeq observes the full state at every grid point; this hides an entry

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "case_studies"))
from reaction_diffusion import fisher_kpp  # noqa: E402 (the case study's field; its ODE is built only on use)


def lorenz96(y, t, p):
    d = len(y)
    return [(y[(i + 1) % d] - y[i - 2]) * y[i - 1] - y[i] + p[0] for i in range(d)]


Problem = namedtuple("Problem", ["field", "theta", "y0", "times", "observed", "data", "sigma", "t_end", "n_steps"])


def problem(d: int, name: str = "lorenz96") -> Problem:
    """The ``d``-state benchmark problem ``name`` with its (seeded) data."""
    import numpy as np
    from scipy.integrate import solve_ivp

    if name == "lorenz96":
        field, theta, y0, sigma = lorenz96, np.array([FORCING]), FORCING + np.sin(np.arange(d)), 0.1
        times, method, n_steps = np.round(np.arange(1, 21) * 0.1, 10), "DOP853", 200
    else:
        x = (np.arange(d) + 0.5) / d
        field, theta, y0, sigma = fisher_kpp, np.array([0.0025, 3.0]), np.exp(-((x / 0.08) ** 2)), 0.05
        times, method, n_steps = np.round(np.arange(1, 11) * 0.4, 10), "Radau", 4000  # (stiff for large d)
    observed = np.arange(0, d, 2)
    sol = solve_ivp(lambda t, y: field(list(y), t, theta), (0.0, float(times[-1])), y0, method=method,
                    t_eval=times, rtol=1e-12, atol=1e-12)
    data = sol.y.T[:, observed] + sigma * np.random.default_rng(1).standard_normal((times.size, observed.size))
    return Problem(field, theta, y0, times, observed, data, sigma, float(times[-1]), n_steps)


SOLVERS = {"dense": ("EK1", "dense"), "diagonal": ("EK1", "diagonal"), "isotropic": ("EK0", "isotropic")}


def measure(d: int, repeats: int, kernel: str = "auto", structure: str = "dense", step: float | None = None,
            name: str = "lorenz96") -> dict:
    """All phases for ``d`` states of problem ``name``, in this process (``step``: the problem's default);
    ``kernel`` "generic" or "specialised" overrides the package's choice between the kernel of any ``d`` and one
    compiled for ``d`` (dense structure)."""
    import resource

    import numpy as np
    import pymc  # noqa: F401 (imported before the clock: a PyMC user has it already; ≈ 2.7 s here)
    import pytensor
    import pytensor.tensor as pt

    import pymc_pnode as pn
    from pymc_pnode.filtering import fenrir

    if kernel != "auto":
        fenrir.SPECIALISED_MAX_STATES = 0 if kernel == "generic" else d

    prob = problem(d, name)
    step = step or prob.t_end / prob.n_steps
    obs_matrix = np.eye(d)[prob.observed]

    row = {"d": d, "structure": structure, "steps": round(prob.t_end / step),
           "kernel": kernel if kernel != "auto" else
           ("specialised" if d <= fenrir.SPECIALISED_MAX_STATES and structure == "dense" else "generic")}
    method, layout = SOLVERS[structure]
    solver = getattr(pn, method)(ORDER, layout)
    start = time.perf_counter()
    ode = pn.ODE(prob.field, n_states=d, n_theta=prob.theta.size)
    row["ode"] = time.perf_counter() - start
    tick = time.perf_counter()
    ode.hess_contract  # noqa: B018 (compiles the generated module)
    row["hessians"] = time.perf_counter() - tick
    tick = time.perf_counter()
    ode.taylor_coefficients(ORDER)
    ode.taylor_vjp(ORDER)
    row["taylor"] = time.perf_counter() - tick

    tick = time.perf_counter()
    y0_var = pt.vector("y0")
    theta_var = pt.vector("theta")
    sigma_var = pt.scalar("sigma")
    logp = pn.fenrir_loglik(ode, y0_var, theta_var, prob.times, prob.data, obs_matrix=obs_matrix,
                            obs_sigma=sigma_var, diffusion=1.0, solver=solver, step=step)
    fn = pytensor.function([y0_var, theta_var, sigma_var],
                           [logp, *pt.grad(logp, [y0_var, theta_var, sigma_var])])
    row["graph"] = time.perf_counter() - tick
    args = (prob.y0, prob.theta, prob.sigma)
    tick = time.perf_counter()
    first = fn(*args)
    row["first"] = time.perf_counter() - tick
    row["total"] = time.perf_counter() - start
    row["logp"] = float(first[0])
    times_per_eval = []
    for _ in range(repeats):
        tick = time.perf_counter()
        fn(*args)
        times_per_eval.append(time.perf_counter() - tick)
    row["eval"] = float(np.median(times_per_eval))
    row["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def measure_peer(d: int, repeats: int, structure: str, step: float | None = None, name: str = "lorenz96") -> dict:
    """probdiffeq's jitted ``value_and_grad`` of the same Fenrir-type loss for ``d`` states of problem ``name``, in
    this process (its field written again in JAX).

    Its state-space model of the same structure (``state_space_model_dense``/``_blockdiag`` with a first-order
    linearisation, ``_isotropic`` with a zeroth-order one), IWP(3), exact Taylor initialisation, fixed-interval
    smoother on the same grid, diffusion 1, and ``loss_lml_timeseries``. That loss observes every state at
    every grid point, so the entries we do not observe get the standard deviation ``UNOBSERVED_STD`` and
    their nearly constant contribution is removed (the value printed beside ours checks it). ``first`` =
    tracing, XLA compile and the first call; ``eval`` = median seconds per call.
    """
    import math
    import resource

    import jax
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from probdiffeq import ivpsolve
    from probdiffeq import probdiffeq as pdq

    from pymc_pnode.solve import fixed_grid

    prob = problem(d, name)
    step = step or prob.t_end / prob.n_steps
    grid = fixed_grid(np.union1d([0.0], prob.times), step)
    seen = np.zeros((grid.size, d), dtype=bool)
    seen[np.ix_(np.searchsorted(grid, prob.times), prob.observed)] = True
    u = np.zeros((grid.size, d))
    u[seen] = prob.data.ravel()
    offset = (seen.size - prob.data.size) * (math.log(UNOBSERVED_STD) + 0.5 * math.log(2 * math.pi))
    grid, u, seen = jnp.asarray(grid), jnp.asarray(u), jnp.asarray(seen)
    ssm = {"dense": pdq.state_space_model_dense, "diagonal": pdq.state_space_model_blockdiag,
           "isotropic": pdq.state_space_model_isotropic}[structure]()
    loss = pdq.loss_lml_timeseries(average_pdfs=False)

    def loglik(y0, theta, sigma):
        def field(y, *, t):
            if name == "lorenz96":
                return (jnp.roll(y, -1) - jnp.roll(y, 2)) * jnp.roll(y, 1) - y + theta[0]
            left, right = jnp.concatenate([y[:1], y[:-1]]), jnp.concatenate([y[1:], y[-1:]])  # mirrored ghosts
            return theta[0] * d * d * (left - 2.0 * y + right) + theta[1] * y * (1.0 - y)

        vf = pdq.ode(field, jacobian=pdq.jacobian_materialize())
        tcoeffs, _ = pdq.jetexpand_ode_unroll(num=ORDER)(vf, [y0], t=0.0)
        scale = jnp.ones(()) if structure == "isotropic" else jnp.ones(d)
        prior = ssm.prior_wiener_integrated(tcoeffs, output_scale=scale)
        constraint = ssm.constraint_ode_ts0(vf) if structure == "isotropic" else ssm.constraint_ode_ts1(vf)
        solver = pdq.solver(constraint=constraint, strategy=pdq.strategy_smoother_fixedinterval())
        sol = ivpsolve.solve_fixed_grid(solver=solver)(prior, grid=grid)
        return loss(u, posterior=sol.solution_full, std=jnp.where(seen, sigma, UNOBSERVED_STD)) + offset

    value_and_grad = jax.jit(jax.value_and_grad(loglik, argnums=(0, 1, 2)))
    args = (jnp.asarray(prob.y0), jnp.asarray(prob.theta), jnp.asarray(prob.sigma))
    row = {"d": d, "structure": structure, "steps": round(prob.t_end / step), "kernel": "probdiffeq"}
    tick = time.perf_counter()
    value, _ = jax.block_until_ready(value_and_grad(*args))
    row["first"] = row["total"] = time.perf_counter() - tick
    row["logp"] = float(value)
    times_per_eval = []
    for _ in range(repeats):
        tick = time.perf_counter()
        jax.block_until_ready(value_and_grad(*args))
        times_per_eval.append(time.perf_counter() - tick)
    row["eval"] = float(np.median(times_per_eval))
    row["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def warm(cache: Path, warm_states: list[int], structures: list[str]) -> None:
    """Fill ``cache`` with the package's kernels by evaluating other models than the measured ones."""
    code = (
        "import sys; sys.path.insert(0, %r); import scale, numpy as np, pytensor, pytensor.tensor as pt\n"
        "import pymc_pnode as pn\n"
        "fhn = pn.ODE(lambda y, t, p: [p[2] * (y[0] - y[0] ** 3 / 3 + y[1]), -(y[0] - p[0] - p[1] * y[1]) / p[2]],"
        " 2, 3)\n"
        "y0, th = pt.vector('y0'), pt.vector('th')\n"
        "times = np.arange(1, 11) * 0.1\n"
        "lp = pn.fenrir_loglik(fhn, y0, th, times, np.zeros((10, 1)), obs_matrix=[[1.0, 0.0]], obs_sigma=0.1,"
        " diffusion=1.0, solver=pn.EK1(%d), step=0.01)\n"
        "pytensor.function([y0, th], [lp, *pt.grad(lp, [y0, th])])([-1.0, 1.0], [0.2, 0.2, 3.0])\n"
        "for d in %r:\n"
        "    for structure in %r: scale.measure(d, 1, 'auto', structure)\n"
    ) % (str(Path(__file__).resolve().parent), ORDER, warm_states, structures)
    _run_python(code, cache, Path(tempfile.mkdtemp(prefix="scale_gen_")))


def _run_python(code: str, numba_cache: Path, generated: Path) -> str:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(numba_cache), PYMC_PNODE_CACHE_DIR=str(generated))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, nargs="+", default=[5, 10, 20])
    parser.add_argument("--warm-states", type=int, nargs="*", default=[7],
                        help="Lorenz-96 sizes evaluated while warming the cache (not measured)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--kernels", nargs="+", default=["auto"], choices=["auto", "generic", "specialised"],
                        help="measure every size with each of these Fenrir kernels")
    parser.add_argument("--structures", nargs="+", default=["dense"], choices=sorted(SOLVERS),
                        help="measure every size with each of these solvers")
    parser.add_argument("--problem", choices=["lorenz96", "fisher_kpp"], default="lorenz96")
    parser.add_argument("--step", type=float, default=None, help="default: the problem's")
    parser.add_argument("--cache", type=Path, default=None,
                        help="a warmed numba cache to start every run from (default: warm a new one)")
    parser.add_argument("--cache-out", type=Path, default=None,
                        help="where to warm the cache when --cache is not given")
    parser.add_argument("--peer", action="store_true",
                        help="also time probdiffeq (the `bench` extra) for the dense and diagonal structures")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import numba
    import pytensor

    import pymc_pnode

    base = args.cache
    if base is None:
        base = args.cache_out or Path(tempfile.mkdtemp(prefix="scale_numba_"))
        tick = time.perf_counter()
        warm(base, args.warm_states, args.structures)
        print(f"warmed the library kernels in {time.perf_counter() - tick:.0f} s ({base})", file=sys.stderr)
    rows = []
    for d, kernel, structure in itertools.product(args.states, args.kernels, args.structures):
        run_cache = Path(tempfile.mkdtemp(prefix="scale_run_"))
        shutil.copytree(base, run_cache, dirs_exist_ok=True)
        code = ("import sys, json; sys.path.insert(0, %r); import scale; "
                "print(json.dumps(scale.measure(%d, %d, %r, %r, %r, %r)))") % (
            str(Path(__file__).resolve().parent), d, args.repeats, kernel, structure, args.step, args.problem)
        out = _run_python(code, run_cache, Path(tempfile.mkdtemp(prefix="scale_gen_")))
        rows.append(json.loads(out.strip().splitlines()[-1]))
        shutil.rmtree(run_cache, ignore_errors=True)
        print(rows[-1], file=sys.stderr)
        if args.peer and structure != "isotropic" and kernel == args.kernels[0]:
            # probdiffeq's isotropic loss takes one standard deviation per time: it cannot leave states unobserved.
            code = ("import sys, json; sys.path.insert(0, %r); import scale; "
                    "print(json.dumps(scale.measure_peer(%d, %d, %r, %r, %r)))") % (
                str(Path(__file__).resolve().parent), d, args.repeats, structure, args.step, args.problem)
            rows.append(json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                                  check=True).stdout.strip().splitlines()[-1]))
            print(rows[-1], file=sys.stderr)

    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores; Python "
          f"{platform.python_version()}, numba {numba.__version__}, pytensor {pytensor.__version__}, "
          f"pymc_pnode {pymc_pnode.__version__}; {time.strftime('%Y-%m-%d %H:%M')}; problem {args.problem}\n")
    print("| d | structure | steps | Fenrir kernel | `pn.ODE` | Hessians | Taylor | graph | first logp+grad "
          "| total to first | logp+grad | peak RSS | logp |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    def seconds(row, key):
        return f"{row[key]:.1f} s" if key in row else "–"

    for r in rows:
        phases = " | ".join(seconds(r, key) for key in ("ode", "hessians", "taylor", "graph", "first", "total"))
        print(f"| {r['d']} | {r['structure']} | {r['steps']} | {r['kernel']} | {phases} | {r['eval'] * 1e3:.2f} ms | "
              f"{r['rss_mb']:.0f} MB | {r['logp']:.6f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
