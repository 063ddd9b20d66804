"""Chkrebtii layer stability: the largest stable ``k h`` for the test equation ``y' = -k y``.

Measures the table of ``docs/chkrebtii.md`` ("Stability (measured)"): for each noise rule (``"zero"``, ``"code"``,
``"paper"``) and each length-scale ``lam`` in {h/2, h, 2h, 4h, 8h}, the largest ``k h`` for which the conditional mean
of Algorithm 1 (uniform kernel) on ``y' = -k y``, ``y(0) = 1``, stays bounded over ``--steps`` steps (default 5000).

Setting: ``pn.chkrebtii_sample(ode, [1.0], [k], (0, steps * h), n_grid=steps + 1, alpha=1e30, lam=m * h,
kernel="uniform", noise=rule, times=[steps * h], return_mean=True)`` with ``h = 0.01`` (``t_end = 50``) by default.
The conditional mean ``m^N(t)`` is returned by the package itself (``return_mean=True``). Its weights do not depend on
``alpha``, which only scales the random parts (the step-ahead draws ``u_n`` around their means and the final draw)
by ``alpha^{-1/2}``; ``alpha = 1e30`` makes those parts smaller than rounding, so ``m^N`` is the deterministic mean
recursion (interrogations at the step-ahead means). Only the end point is requested (``times=[t_end]``): with the
default ``times`` (the whole grid) the final joint draw would cost O(N^3).

Definition: a run is **stable** if the conditional mean at the end, ``m^N(t_end)``, is finite and ``|m^N(t_end)| <= 1``
(= ``y(0)``; the exact solution decays to ``exp(-k t_end)``). A divergent run (non-finite numbers; the package warns
and returns NaN) is unstable.

Search for each (rule, lam): the mean recursion of this linear equation depends on ``k`` and ``h`` only through ``k h``
(and on ``lam / h``), so ``h`` is fixed and ``k = (k h) / h``. First a scan of ``--scan`` log-spaced values of ``k h``
over [1e-4, 4]; if the smallest is unstable the result is "< 1e-4", if all are stable "> 4". Otherwise the last stable
scan value below the first unstable one and that unstable value bracket the threshold, and a bisection in
``log(k h)`` shrinks the bracket until ``hi / lo <= 1 + rtol`` (``--rtol``, default 0.01, i.e. about 10 halvings from a
scan bracket). The reported value is ``lo`` (the largest ``k h`` found stable) to two significant digits; a scan value
above the first unstable one that is stable again (a stability region that is not an interval) is flagged with "*".

Checks (``--no-checks`` to skip): the same search for a few settings that should not matter (other ``h``) or may
matter (other numbers of steps, since a weakly growing mode needs many steps to exceed 1; ``alpha = 1``: a random
realisation's conditional mean with step-ahead noise, seed 0). Then long runs (``--no-long`` to skip): ``m(t_end)`` at
``k h = 1e-3`` after 5000 … 320000 steps, against the exact ``exp(-k t_end)``, and the per-step growth rate of the
parasitic mode, ``ln|m(320000) / m(80000)| / 240000``, in units of ``k h``: does a "threshold" mark a stability limit,
or the number of steps after which a slowly growing mode reaches 1? The rate is shown only if ``|m(320000)| >= 1e-8``
(below that both values are rounding residue) and is a lower estimate when ``m(80000)`` is still at rounding level.

Lorenz63 (``--no-lorenz`` to skip): the same conditional mean (uniform kernel, ``alpha = 1e30``) on the Lorenz63
system of ``case_studies/chkrebtii_lorenz.ipynb`` (the paper's Figure 2: N = 5001 points on [0, 20], σ = 10,
b = 8/3, r = 28, ``y0 = (-12, -5, 38)``) for each rule and λ in {h/2, h, 2h, 4h}: finite and bounded, or not. For
comparison with the linear table, ``|k| h`` of the contracting direction: ``h`` times the most negative real part of
the Jacobian's eigenvalues along the exact trajectory (its largest and median value over 2001 points).

Run: ``nice -n 10 python benchmarks/chkrebtii_stability.py`` (well under a minute after the package's kernels are
compiled; a few ms per solve of 5000 steps). Prints Markdown tables, the machine, versions and date.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
import warnings

import numba
import numpy as np

import pymc_pnode as pn

warnings.filterwarnings("ignore", message="PyTensor could not link to a BLAS")

RULES = ("zero", "code", "paper")
LAM_STEPS = (0.5, 1.0, 2.0, 4.0, 8.0)  # lam = m * h
KH_MIN, KH_MAX = 1e-4, 4.0


def decay(y, t, p):
    return [-p[0] * y[0]]


class Problem:
    """``y' = -k y``, ``y(0) = 1`` on ``steps`` steps of size ``h``: stability of the conditional mean."""

    def __init__(self, ode: pn.ODE, h: float, steps: int, alpha: float, seed: int):
        self.ode, self.h, self.steps, self.alpha, self.seed = ode, h, steps, alpha, seed
        self.t_end = h * steps
        self.solves = 0

    def end_mean(self, kh: float, lam_steps: float, rule: str) -> float:
        """The conditional mean ``m^N(t_end)`` at ``k = kh / h``."""
        self.solves += 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # divergent runs: NaN with a warning
            _, mean = pn.chkrebtii_sample(
                self.ode, [1.0], [kh / self.h], (0.0, self.t_end), n_grid=self.steps + 1, alpha=self.alpha,
                lam=lam_steps * self.h, kernel="uniform", noise=rule, times=[self.t_end], size=1,
                rng=self.seed, return_mean=True)
        return float(mean[0, -1, 0])

    def stable(self, kh: float, lam_steps: float, rule: str) -> bool:
        value = self.end_mean(kh, lam_steps, rule)
        return bool(np.isfinite(value) and abs(value) <= 1.0)


def threshold(problem: Problem, lam_steps: float, rule: str, n_scan: int, rtol: float) -> dict:
    """Largest stable ``k h`` in [KH_MIN, KH_MAX]: log scan, then log bisection to ``hi / lo <= 1 + rtol``."""
    grid = np.geomspace(KH_MIN, KH_MAX, n_scan)
    flags = [problem.stable(kh, lam_steps, rule) for kh in grid]
    if all(flags):
        return {"lo": KH_MAX, "hi": None, "text": f"> {KH_MAX:g}", "monotone": True}
    first_bad = flags.index(False)
    monotone = not any(flags[first_bad:])
    if first_bad == 0:
        return {"lo": None, "hi": KH_MIN, "text": f"< {KH_MIN:g}", "monotone": monotone}
    lo, hi = float(grid[first_bad - 1]), float(grid[first_bad])
    while hi / lo > 1.0 + rtol:
        mid = float(np.sqrt(lo * hi))
        if problem.stable(mid, lam_steps, rule):
            lo = mid
        else:
            hi = mid
    return {"lo": lo, "hi": hi, "text": f"{lo:#.2g}" + ("" if monotone else "*"), "monotone": monotone}


def lam_label(m: float) -> str:
    return {0.5: "λ = h/2", 1.0: "λ = h"}.get(m, f"λ = {m:g}h")


def table(problem: Problem, rules, lam_steps, n_scan: int, rtol: float) -> tuple[str, str, dict]:
    """Markdown table of thresholds (rules × lam) and a table of the brackets."""
    results = {(r, m): threshold(problem, m, r, n_scan, rtol) for r in rules for m in lam_steps}
    head = "| noise rule | " + " | ".join(lam_label(m) for m in lam_steps) + " |"
    sep = "|---" * (len(lam_steps) + 1) + "|"
    main = [head, sep] + [f'| "{r}" | ' + " | ".join(results[r, m]["text"] for m in lam_steps) + " |"
                          for r in rules]

    def bracket(res):
        if res["lo"] is None or res["hi"] is None:
            return res["text"]
        return f"[{res['lo']:.4g}, {res['hi']:.4g})"

    detail = [head, sep] + [f'| "{r}" | ' + " | ".join(bracket(results[r, m]) for m in lam_steps) + " |"
                            for r in rules]
    return "\n".join(main), "\n".join(detail), results


def long_runs(ode: pn.ODE, h: float, alpha: float, seed: int, rules, kh: float = 1e-3,
              steps=(5000, 20000, 80000, 320000), lam_steps=(1.0, 2.0, 8.0)) -> None:
    """``m(t_end)`` at a fixed small ``k h`` for growing numbers of steps, and the growth rate of the last two."""
    print(f"\nLong runs at k h = {kh:g} (h = {h:g}, alpha = {alpha:g}): m(t_end) after n steps; growth = "
          f"ln|m({steps[-1]}) / m({steps[-2]})| / {steps[-1] - steps[-2]} / (k h):\n")
    print("| noise rule | λ | " + " | ".join(f"n = {n}" for n in steps) + " | growth / (k h) |")
    print("|---" * (len(steps) + 3) + "|")
    print("| exact | – | " + " | ".join(f"{np.exp(-kh * n):.2e}" for n in steps) + " | −1 |")
    for rule in rules:
        for m in lam_steps:
            values = [Problem(ode, h, n, alpha, seed).end_mean(kh, m, rule) for n in steps]
            growth = np.log(abs(values[-1] / values[-2])) / (steps[-1] - steps[-2]) / kh
            # Below 1e-8 both values are rounding residue (the exact solution is far smaller): no mode to measure.
            text = f"{growth:+.2f}" if abs(values[-1]) >= 1e-8 else "– (rounding level)"
            print(f'| "{rule}" | {lam_label(m)[4:]} | ' + " | ".join(f"{v:.2e}" for v in values)
                  + f" | {text} |", flush=True)


def lorenz63(rules, n_grid: int = 5001, t_end: float = 20.0) -> None:
    """Bounded or not: the conditional mean on Lorenz63 at the notebook's grid, for each rule and λ."""
    from scipy.integrate import solve_ivp

    sigma, b, r = 10.0, 8.0 / 3.0, 28.0
    y0 = [-12.0, -5.0, 38.0]

    def lorenz(y, t, p):
        return [p[0] * (y[1] - y[0]), y[0] * (p[2] - y[2]) - y[1], y[0] * y[1] - p[1] * y[2]]

    def jacobian(y):
        return np.array([[-sigma, sigma, 0.0], [r - y[2], -1.0, -y[0]], [y[1], y[0], -b]])

    h = t_end / (n_grid - 1)
    exact = solve_ivp(lambda t, y: lorenz(y, t, [sigma, b, r]), (0.0, t_end), y0, rtol=1e-10, atol=1e-10,
                      t_eval=np.linspace(0.0, t_end, 2001)).y.T
    contracting = np.array([-np.linalg.eigvals(jacobian(y)).real.min() for y in exact]) * h
    print(f"\nLorenz63 (σ = {sigma:g}, b = 8/3, r = {r:g}, y0 = {y0}), N = {n_grid} on [0, {t_end:g}] (h = {h:g}), "
          f"uniform kernel, alpha = 1e30 (exact interrogations). |k| h of the contracting direction along the exact "
          f"trajectory: largest {contracting.max():.3f}, median {np.median(contracting):.3f}.\n")
    ode = pn.ODE(lorenz, n_states=3, n_theta=3)
    times = np.linspace(0.0, t_end, 201)
    lams = (0.5, 1.0, 2.0, 4.0)
    print("| noise rule | " + " | ".join(lam_label(m) for m in lams) + " |")
    print("|---" * (len(lams) + 1) + "|")
    for rule in rules:
        cells = []
        for m in lams:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # divergent runs: NaN with a warning
                _, mean = pn.chkrebtii_sample(ode, y0, [sigma, b, r], (0.0, t_end), n_grid=n_grid, alpha=1e30,
                                              lam=m * h, kernel="uniform", noise=rule, times=times, size=1, rng=0,
                                              return_mean=True)
            finite = np.isfinite(mean).all()
            cells.append(f"bounded (max abs {np.abs(mean).max():.1f})" if finite else "diverges (NaN, warned)")
        print(f'| "{rule}" | ' + " | ".join(cells) + " |", flush=True)


def describe_machine() -> str:
    return (f"{time.strftime('%Y-%m-%d %H:%M %Z')}; {platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} cores; python {platform.python_version()}, pymc_pnode {pn.__version__} "
            f"({os.path.dirname(pn.__file__)}), numba {numba.__version__}, numpy {np.__version__}; "
            f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--h", type=float, default=0.01, help="step size (t_end = steps * h)")
    parser.add_argument("--steps", type=int, default=5000, help="number of steps (grid of steps + 1 points)")
    parser.add_argument("--alpha", type=float, default=1e30,
                        help="prior precision; 1e30 makes the step-ahead draws equal their means to rounding")
    parser.add_argument("--rules", nargs="+", default=list(RULES), choices=RULES)
    parser.add_argument("--lam-steps", type=float, nargs="+", default=list(LAM_STEPS), help="lam / h")
    parser.add_argument("--scan", type=int, default=25, help="log-spaced scan values of k h over [1e-4, 4]")
    parser.add_argument("--rtol", type=float, default=0.01, help="bisection stops when hi / lo <= 1 + rtol")
    parser.add_argument("--seed", type=int, default=0, help="seed of the (negligible at alpha = 1e30) noise")
    parser.add_argument("--no-checks", action="store_true", help="skip the h / steps / alpha checks")
    parser.add_argument("--no-long", action="store_true", help="skip the long runs at k h = 1e-3")
    parser.add_argument("--no-lorenz", action="store_true", help="skip the Lorenz63 runs")
    args = parser.parse_args()
    if args.steps < 1 or args.h <= 0 or args.scan < 2 or args.rtol <= 0:
        parser.error("need steps >= 1, h > 0, scan >= 2, rtol > 0")

    print(describe_machine(), flush=True)
    t_start = time.perf_counter()
    ode = pn.ODE(decay, n_states=1, n_theta=1)
    problem = Problem(ode, args.h, args.steps, args.alpha, args.seed)
    problem.end_mean(0.01, 2.0, "zero")  # compile / load the kernels outside the timing of the search
    t_search = time.perf_counter()
    problem.solves = 0
    main_table, detail, results = table(problem, args.rules, args.lam_steps, args.scan, args.rtol)
    print(f"\nLargest stable k h for y' = -k y, y(0) = 1: conditional mean of Algorithm 1, uniform kernel, "
          f"{args.steps} steps of h = {args.h:g} (t_end = {args.h * args.steps:g}), alpha = {args.alpha:g}; "
          f"stable = |m(t_end)| <= 1 and finite; log scan of {args.scan} values over [{KH_MIN:g}, {KH_MAX:g}], "
          f"then log bisection to hi/lo <= {1 + args.rtol:g}; two significant digits of the largest stable value "
          f"found ({problem.solves} solves, {time.perf_counter() - t_search:.1f} s):\n")
    print(main_table)
    print("\nBrackets [largest stable, smallest unstable) found:\n")
    print(detail, flush=True)
    if "zero" in args.rules and "code" in args.rules:
        same = all(results["zero", m]["text"] == results["code", m]["text"] for m in args.lam_steps)
        diffs = []
        for m in args.lam_steps:
            for kh in (1e-3, 0.01, 0.1, 1.0):
                a, b = problem.end_mean(kh, m, "zero"), problem.end_mean(kh, m, "code")
                if np.isfinite(a) and np.isfinite(b):
                    diffs.append(abs(a - b) / max(abs(a), 1e-300))
        print(f'\n"code" against "zero": thresholds {"identical" if same else "DIFFERENT"}; largest relative '
              f"difference of m(t_end) at k h in {{1e-3, 0.01, 0.1, 1}} (finite runs): "
              f"{max(diffs) if diffs else float('nan'):.2e}", flush=True)

    if not args.no_checks:
        checks = [
            (f"h = {args.h * 10:g} ({args.steps} steps)", dict(h=args.h * 10)),
            (f"h = {args.h / 10:g} ({args.steps} steps)", dict(h=args.h / 10)),
            (f"{args.steps // 5} steps (h = {args.h:g})", dict(steps=args.steps // 5)),
            (f"{args.steps * 4} steps (h = {args.h:g})", dict(steps=args.steps * 4)),
            (f"alpha = 1 (random step-ahead draws, seed {args.seed})", dict(alpha=1.0)),
        ]
        for label, change in checks:
            setting = dict(h=args.h, steps=args.steps, alpha=args.alpha) | change
            check = Problem(ode, setting["h"], setting["steps"], setting["alpha"], args.seed)
            t0 = time.perf_counter()
            check_table, _, _ = table(check, args.rules, args.lam_steps, args.scan, args.rtol)
            print(f"\nCheck, {label} ({check.solves} solves, {time.perf_counter() - t0:.1f} s):\n")
            print(check_table, flush=True)
    if not args.no_long:
        long_runs(ode, args.h, args.alpha, args.seed, [r for r in args.rules if r != "code"])
    if not args.no_lorenz:
        lorenz63(args.rules)
    print(f"\nTotal wall time {time.perf_counter() - t_start:.0f} s; load average at the end "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
