"""Chkrebtii layer speed: realisation and realisation + gradient time versus the grid size N.

Chkrebtii et al. (2016, §3.4) state that Algorithm 1 costs O(N) with a compactly supported kernel
(the uniform kernel: truncated weight matrices) and O(N³) otherwise (the squared exponential). This
script measures it for ``pymc_pnode``'s implementation.

Problem: Lotka–Volterra, theta = (1.0, 0.8, 0.6, 1.1), y0 = (1.0, 0.5), t in [0, 10], 20 output
times 0.5, 1.0, ..., 10; grid of N points (h = 10 / (N - 1)), alpha = N, lam = 2h for both kernels
(uniform: half-bandwidth w = 3), noise rule ``"paper"`` (stable on this problem for every N below).

Columns, each the median of repeated calls after one warm-up call (compilation excluded):

- ``structure``: the covariance algebra alone (everything that depends only on the grid, the kernel
  and lam; O(N w²) uniform, O(N³) squared exponential);
- ``realisation``: one forward draw, ``pn.chkrebtii_sample(..., size=1)`` (validation, structure,
  nonlinear recursion, final joint draw at the 20 times);
- ``realisation, λ fixed``: the layer's value compiled with ``pytensor.function`` and a constant
  lam, so the structure is constant-folded at compile time and each call is the recursion plus the
  final draw (O(N w) uniform, O(N²) squared exponential): the per-draw cost of Algorithm 2 or NUTS
  with a fixed length-scale;
- ``realisation + gradient``: one call of a compiled ``pytensor.function`` returning the sum of
  ``ChkrebtiiSolution``'s output and its reverse-mode gradient with respect to theta, y0, alpha,
  lam and the innovations (structure, its exact lam-tangents, recursion and adjoint);
- ``… + gradient, λ fixed``: the same with a constant lam (gradient with respect to theta, y0, alpha
  and the innovations).

Both kernels run at ``--n-grid`` (default N = 50, 100, ..., 1600); the uniform kernel, whose cost
at these N is mostly fixed per-call overhead (tenths of a millisecond), also runs at
``--uniform-extra`` (default 3200, 6400, 12800). The log-log slope of time against N is fitted by
least squares for each kernel and column, over the common N and over each kernel's largest three N.

Run: ``python benchmarks/chkrebtii_speed.py`` (about 5 minutes on 2 cores; ``--quick`` for a
seconds-long smoke run). Prints Markdown tables and writes them, with the machine and versions, to
``--output`` (default ``benchmarks/results/chkrebtii_speed.md``).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
import warnings
from pathlib import Path

import numba
import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pytensor.graph.replace import graph_replace

import pymc_pnode as pn
from pymc_pnode.chkrebtii import ChkrebtiiSolution, chkrebtii_sample
from pymc_pnode.chkrebtii.problem import discretisation
from pymc_pnode.chkrebtii.structure import covariance_structure

warnings.filterwarnings("ignore", message="PyTensor could not link to a BLAS")

THETA = np.array([1.0, 0.8, 0.6, 1.1])
Y0 = np.array([1.0, 0.5])
T_SPAN = (0.0, 10.0)
TIMES = np.linspace(0.5, 10.0, 20)
LAM_STEPS = 2.0  # lam = LAM_STEPS * h
KERNELS = ("uniform", "squared_exponential")
COLUMNS = ("structure", "realisation", "realisation, λ fixed", "realisation + gradient",
           "… + gradient, λ fixed")
HERE = Path(__file__).resolve().parent


def lotka_volterra(y, t, p):
    return [p[0] * y[0] - p[1] * y[0] * y[1], p[2] * y[0] * y[1] - p[3] * y[1]]


def median_seconds(fn, repeats: int, budget: float) -> tuple[float, int]:
    """Median wall time of timed calls after one warm-up call (excluded), and the number of calls.

    At most ``repeats`` calls, fewer (but at least 3) when the warm-up call shows that ``repeats``
    calls would exceed ``budget`` seconds.
    """
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    n = repeats if first * repeats <= budget else max(3, min(repeats, int(budget / first)))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), n


def compiled_layer(ode: pn.ODE, n: int, kernel: str, noise: str, lam: float, lam_free: bool,
                   gradient: bool, mode):
    """A compiled function of the layer: ``u`` or ``[sum(u), d sum(u) / d inputs...]``.

    Inputs ``theta, y0, alpha, (lam,) z``: lam only if ``lam_free``, otherwise the constant ``lam``.
    """
    theta = pt.dvector("theta")
    y0 = pt.dvector("y0")
    alpha = pt.dscalar("alpha")
    lam_in = pt.dscalar("lam") if lam_free else lam
    z = pt.dmatrix("z")
    with pm.Model() as model:
        u = ChkrebtiiSolution("u", ode, y0=y0, theta=theta, t_span=T_SPAN, n_grid=n, alpha=alpha,
                              lam=lam_in, kernel=kernel, noise=noise, times=TIMES)
    (u_z,) = graph_replace([u], {model["u_innovations"]: z}, strict=False)
    inputs = [theta, y0, alpha, *([lam_in] if lam_free else []), z]
    if not gradient:
        return pytensor.function(inputs, u_z, mode=mode)
    total = u_z.sum()
    return pytensor.function(inputs, [total, *pytensor.grad(total, inputs)], mode=mode)


def measure(ode: pn.ODE, n: int, kernel: str, noise: str, repeats: int, budget: float, mode,
            seed: int) -> dict:
    """All timings (seconds) for one kernel and grid size, plus the bandwidth and sanity checks."""
    h = (T_SPAN[1] - T_SPAN[0]) / (n - 1)
    lam, alpha = LAM_STEPS * h, float(n)
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n - 1 + TIMES.size, ode.n_states))
    row = {"kernel": kernel, "N": n, "calls": repeats}

    def timed(column, fn):
        row[column], calls = median_seconds(fn, repeats, budget)
        row["calls"] = min(row["calls"], calls)

    disc = discretisation(T_SPAN, n, TIMES, kernel, noise, 1e-12)

    def structure():
        return covariance_structure(disc, np.array([lam]))

    def draw():
        return chkrebtii_sample(ode, Y0, THETA, T_SPAN, n_grid=n, alpha=alpha, lam=lam,
                                kernel=kernel, noise=noise, times=TIMES, size=1, rng=rng)

    row["w"] = int(structure().w[0])
    timed("structure", structure)
    finite = bool(np.all(np.isfinite(draw())))
    timed("realisation", draw)

    value_fixed = compiled_layer(ode, n, kernel, noise, lam, False, False, mode)
    u_fixed = value_fixed(THETA, Y0, alpha, z)
    finite &= bool(np.all(np.isfinite(u_fixed)))
    timed("realisation, λ fixed", lambda: value_fixed(THETA, Y0, alpha, z))

    grad_free = compiled_layer(ode, n, kernel, noise, lam, True, True, mode)
    outs = grad_free(THETA, Y0, alpha, lam, z)
    finite &= all(bool(np.all(np.isfinite(o))) for o in outs)
    # The layer's value is the same realisation whichever way it is compiled.
    consistent = bool(np.isclose(float(outs[0]), float(u_fixed.sum()), rtol=1e-9, atol=1e-9))
    timed("realisation + gradient", lambda: grad_free(THETA, Y0, alpha, lam, z))

    grad_fixed = compiled_layer(ode, n, kernel, noise, lam, False, True, mode)
    finite &= all(bool(np.all(np.isfinite(o))) for o in grad_fixed(THETA, Y0, alpha, z))
    timed("… + gradient, λ fixed", lambda: grad_fixed(THETA, Y0, alpha, z))
    row["ok"] = finite and consistent
    return row


def loglog_slope(ns, seconds) -> float:
    """Least-squares slope of log(seconds) against log(N)."""
    return float(np.polyfit(np.log(ns), np.log(seconds), 1)[0])


def fmt_ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def load_avg() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return float("nan")


def describe_machine(mode) -> str:
    return (f"{time.strftime('%Y-%m-%d %H:%M %Z')}; {platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} cores, {memory_gib():.0f} GiB; python {platform.python_version()}, "
            f"pymc_pnode {pn.__version__}, pymc {pm.__version__}, pytensor {pytensor.__version__}, "
            f"numba {numba.__version__}, numpy {np.__version__}; PyTensor mode "
            f"{mode or pytensor.config.mode}")


def tables(rows: list[dict], kernels, common) -> str:
    lines = ["| kernel | N | w | " + " | ".join(f"{c} [ms]" for c in COLUMNS) + " |",
             "| --- " * (3 + len(COLUMNS)) + "|"]
    for r in rows:
        flag = "" if r["ok"] else " (non-finite or inconsistent!)"
        lines.append(f"| {r['kernel']}{flag} | {r['N']} | {r['w']} | "
                     + " | ".join(fmt_ms(r[c]) for c in COLUMNS) + " |")
    lines += ["", "Log-log slope of time against N (least squares; 1 = linear, 2 = quadratic, "
              "3 = cubic):", "",
              f"| kernel | quantity | slope, N = {min(common)}…{max(common)} | "
              "slope, largest 3 N |",
              "| --- | --- | --- | --- |"]
    for kernel in kernels:
        sub = [r for r in rows if r["kernel"] == kernel]
        ns = np.array([r["N"] for r in sub], dtype=float)
        in_common = np.isin(ns, common)
        for c in COLUMNS:
            t = np.array([r[c] for r in sub])
            both = (f"{loglog_slope(ns[in_common], t[in_common]):.2f}"
                    if in_common.sum() >= 2 else "–")
            tail = (f"{loglog_slope(ns[-3:], t[-3:]):.2f} (N ≥ {int(ns[-3])})"
                    if len(sub) >= 3 else "–")
            lines.append(f"| {kernel} | {c} | {both} | {tail} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-grid", type=int, nargs="+", default=[50, 100, 200, 400, 800, 1600],
                        help="grid sizes N")
    parser.add_argument("--uniform-extra", type=int, nargs="*", default=[3200, 6400, 12800],
                        help="additional N for the (cheap) uniform kernel only, where its fixed "
                             "per-call overheads no longer hide the linear growth")
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    parser.add_argument("--repeats", type=int, default=15, help="timed calls per median (max)")
    parser.add_argument("--budget", type=float, default=60.0,
                        help="seconds per median: fewer calls (at least 3) for slow cells")
    parser.add_argument("--noise", default="paper", choices=["paper", "zero", "code"])
    parser.add_argument("--mode", default=None,
                        help='PyTensor mode, e.g. "NUMBA" (default: the configured mode)')
    parser.add_argument("--seed", type=int, default=2016)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: N = 50, 100, 200 (uniform also 800), 3 repeats, "
                             "5 s budget")
    parser.add_argument("--output", type=Path, default=None,
                        help="Markdown results file (default: benchmarks/results/"
                             "chkrebtii_speed.md, or chkrebtii_speed_quick.md with --quick)")
    args = parser.parse_args()
    if args.quick:
        args.n_grid, args.uniform_extra, args.repeats, args.budget = [50, 100, 200], [800], 3, 5.0
    if any(n < 2 for n in [*args.n_grid, *args.uniform_extra]):
        parser.error("--n-grid values must be >= 2")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    output = args.output or HERE / "results" / (
        "chkrebtii_speed_quick.md" if args.quick else "chkrebtii_speed.md")

    machine = describe_machine(args.mode)
    start_load = load_avg()
    print(machine)
    print(f"load average (1/5/15 min) at start: {start_load}", flush=True)
    ode = pn.ODE(lotka_volterra, n_states=2, n_theta=4)
    rows = []
    t_start = time.perf_counter()
    for kernel in args.kernels:
        extra = args.uniform_extra if kernel == "uniform" else []
        for n in sorted(set(args.n_grid) | set(extra)):
            t0 = time.perf_counter()
            row = measure(ode, n, kernel, args.noise, args.repeats, args.budget, args.mode,
                          args.seed + n)
            rows.append(row)
            print(f"  {kernel:>19} N = {n:5d}: w = {row['w']}, "
                  + ", ".join(f"{c} {fmt_ms(row[c])} ms" for c in COLUMNS)
                  + f" ({row['calls']} calls per median; {time.perf_counter() - t0:.0f} s)"
                  + ("" if row["ok"] else " NON-FINITE OR INCONSISTENT"), flush=True)
    end_load = load_avg()
    header = (
        f"Lotka–Volterra, t in [0, 10], {TIMES.size} output times, alpha = N, "
        f"lam = {LAM_STEPS:g}h, noise rule {args.noise!r}, PyTensor mode "
        f"{args.mode or pytensor.config.mode}; medians of up to {args.repeats} calls after a "
        f"warm-up call (at least 3 calls; fewer than {args.repeats} when {args.repeats} would "
        f"exceed {args.budget:g} s); wall time {time.perf_counter() - t_start:.0f} s.\n"
        f"Load average (1/5/15 min) at start {start_load}, at the end {end_load}."
    )
    text = tables(rows, args.kernels, args.n_grid)
    print("\n" + header + "\n\n" + text)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(f"# Chkrebtii layer speed\n\n{machine}\n\n{header}\n\n{text}\n",
                      encoding="utf-8")
    print(f"\nwritten to {output}")


if __name__ == "__main__":
    main()
