"""Solver speed: µs per step of the EK0/EK1 filters, the cost of f and its Jacobian inside kernels,
scipy's RK45 at the same number of steps, and first-call latency with and without the disk cache.

Run: ``python benchmarks/solver_speed.py``. When the ``bench`` extra (JAX, probdiffeq) is
importable, probdiffeq's jitted dense fixed-grid solver runs side by side (``--no-peer`` skips it);
otherwise its rows are skipped with a message. Prints a Markdown table for ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time

import numba as nb
import numpy as np
from scipy.integrate import solve_ivp

import pymc_pnode as pn
from pymc_pnode._callbacks import FN, call

PROBLEMS = {
    "lotka_volterra": (
        "[p[0] * y[0] - p[1] * y[0] * y[1], p[2] * y[0] * y[1] - p[3] * y[1]]",
        [1.0, 1.0], [1.5, 1.0, 3.0, 1.0], 10.0,
    ),
    "fitzhugh_nagumo": (
        "[p[2] * (y[0] - y[0] ** 3 / 3 + y[1]), -(y[0] - p[0] - p[1] * y[1]) / p[2]]",
        [-1.0, 1.0], [0.2, 0.2, 3.0], 20.0,
    ),
}


def make_ode(expr: str, n_theta: int) -> pn.ODE:
    namespace: dict = {}
    exec(f"def field(y, t, p):\n    return {expr}\n", namespace)
    return pn.ODE(namespace["field"], n_states=2, n_theta=n_theta)


def median_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


@nb.njit((FN, FN, nb.float64[::1], nb.float64[::1], nb.int64))
def _call_loop(rhs, jac, y, p, n):
    out = np.empty(y.shape[0])
    jout = np.empty((y.shape[0], y.shape[0]))
    acc = 0.0
    for i in range(n):
        y[0] += 1e-12
        call(rhs, y, 0.0, p, out)
        call(jac, y, 0.0, p, jout)
        acc += out[0] + jout[0, 0]
    return acc


def field_cost_ns(ode: pn.ODE, y0, theta, n: int = 200_000) -> float:
    y, p = np.array(y0, float), np.array(theta, float)
    seconds = median_time(lambda: _call_loop(ode.rhs.address, ode.jac_y.address, y, p, n), 5)
    return seconds / n * 1e9


def first_call_latency() -> tuple[float, float]:
    """Seconds for import + ODE construction + first solve, in a fresh and in a cached process."""
    script = textwrap.dedent(
        """
        import time
        t0 = time.perf_counter()
        import pymc_pnode as pn
        def fhn(y, t, p):
            return [p[2] * (y[0] - y[0] ** 3 / 3 + y[1]), -(y[0] - p[0] - p[1] * y[1]) / p[2]]
        ode = pn.ODE(fhn, n_states=2, n_theta=3)
        pn.solve(ode, [-1.0, 1.0], [0.2, 0.2, 3.0], (0.0, 20.0), step=0.01)
        print(time.perf_counter() - t0)
        """
    )
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYMC_PNODE_CACHE_DIR=cache)
        runs = [
            float(subprocess.run([sys.executable, "-c", script], env=env, check=True,
                                 capture_output=True, text=True).stdout.strip().splitlines()[-1])
            for _ in range(2)
        ]
    return runs[0], runs[1]


def load_probdiffeq():
    """Import JAX (float64) and probdiffeq, or return None when the ``bench`` peers are missing."""
    try:
        import jax

        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
        from probdiffeq import ivpsolve
        from probdiffeq import probdiffeq as pdq
    except ImportError as err:
        print(f"probdiffeq peer skipped: {err} (install the `bench` extra to include it)")
        return None
    return jax, jnp, ivpsolve, pdq


def probdiffeq_us_per_step(peer, expr: str, y0, theta, t1: float, n_steps: int, solver: str,
                           order: int, repeats: int) -> tuple[float, bool]:
    """µs per step of probdiffeq's jitted fixed-grid solve, the counterpart of ``pn.solve``.

    Dense state-space model, IWP(``order``) prior, Taylor-mode initialisation, global MLE
    calibration, filter only (like ``pn.solve(..., smooth=False)``); ``solver`` is ``"EK0"``
    (``constraint_ode_ts0``) or ``"EK1"`` (``constraint_ode_ts1`` with a materialised Jacobian).
    Returns the time and whether the solution was finite (probdiffeq's dense ts0 filter with exact,
    noise-free initialisation occasionally returns NaN at higher orders; the time is still reported).
    """
    jax, jnp, ivpsolve, pdq = peer
    namespace: dict = {}
    exec(f"def field(y, p):\n    return {expr}\n", namespace)
    field = namespace["field"]

    def run(u0, p):
        vf = pdq.ode(lambda y, *, t: jnp.stack(field(y, p)), jacobian=pdq.jacobian_materialize())
        tcoeffs, _ = pdq.jetexpand_ode_unroll(num=order)(vf, [u0], t=0.0)
        ssm = pdq.state_space_model_dense()
        constraint = ssm.constraint_ode_ts1(vf) if solver == "EK1" else ssm.constraint_ode_ts0(vf)
        pn_solver = pdq.solver_mle(constraint=constraint, strategy=pdq.strategy_filter())
        grid = jnp.linspace(0.0, t1, n_steps + 1)
        sol = ivpsolve.solve_fixed_grid(solver=pn_solver)(ssm.prior_wiener_integrated(tcoeffs),
                                                         grid=grid)
        return sol.u.mean[0], sol.u.std[0]

    fn = jax.jit(run)
    u0, p = jnp.asarray(y0, dtype=float), jnp.asarray(theta, dtype=float)
    mean, std = jax.block_until_ready(fn(u0, p))
    finite = bool(jnp.all(jnp.isfinite(mean)) and jnp.all(jnp.isfinite(std)))
    seconds = median_time(lambda: jax.block_until_ready(fn(u0, p)), repeats)
    return seconds / n_steps * 1e6, finite


def describe_machine() -> str:
    """One line: date, CPU, cores, load average, versions."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{time.strftime('%Y-%m-%d %H:%M %Z')}; {platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} cores, load average (1/5/15 min) {load}; python "
            f"{platform.python_version()}, pymc_pnode {pn.__version__}, numpy {np.__version__}, "
            f"numba {nb.__version__}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--no-peer", action="store_true", help="skip probdiffeq even if installed")
    args = parser.parse_args()
    print(describe_machine())
    peer = None if args.no_peer else load_probdiffeq()
    if peer is not None:
        import probdiffeq

        print(f"peer: jax {peer[0].__version__}, probdiffeq {probdiffeq.__version__} (CPU, float64)")
    rows = []
    for name, (expr, y0, theta, t1) in PROBLEMS.items():
        ode = make_ode(expr, len(theta))
        h = t1 / args.steps
        for solver in (pn.EK0(order=3), pn.EK1(order=3), pn.EK0(order=5), pn.EK1(order=5)):
            run = lambda: pn.solve(ode, y0, theta, (0.0, t1), solver=solver, step=h,  # noqa: E731
                                   smooth=False)
            sec = median_time(run, args.repeats)
            stats = run().stats
            note = "" if stats["success"] else f" — diverged after {stats['n_steps']} steps"
            rows.append((name, f"pymc_pnode {solver!r}{note}", sec / args.steps * 1e6))
            if peer is not None:
                kind = type(solver).__name__
                us, finite = probdiffeq_us_per_step(peer, expr, y0, theta, t1, args.steps, kind,
                                                    solver.order, args.repeats)
                linearisation = "ts1" if kind == "EK1" else "ts0"
                label = f"probdiffeq {kind}(order={solver.order}) (dense, {linearisation})"
                rows.append((name, label + ("" if finite else " — returned NaN"), us))
        rk = median_time(
            lambda: solve_ivp(lambda t, y: ode.f(y, t, theta), (0.0, t1), y0, method="RK45",
                              first_step=h, max_step=h, rtol=1e3, atol=1e3),
            max(3, args.repeats // 5),
        )
        rows.append((name, "scipy RK45 (same steps)", rk / args.steps * 1e6))
        rows.append((name, "f + df/dy call inside a kernel [ns]", field_cost_ns(ode, y0, theta)))
    print(f"\n{args.steps} fixed steps per solve, median of {args.repeats} solves\n")
    print("| problem | solver | µs per step |\n| --- | --- | --- |")
    for name, solver, us in rows:
        print(f"| {name} | {solver} | {us:.2f} |")
    fresh, cached = first_call_latency()
    print(f"\nfirst call (import + ODE + first solve): fresh process {fresh:.1f} s, "
          f"second process with disk cache {cached:.1f} s")
    print(f"load average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
