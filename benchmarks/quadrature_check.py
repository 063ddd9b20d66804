"""Does the a-posteriori quadrature check of the Fenrir defaults flag the wrong likelihoods, and only those, and
how many does solving again at tighter tolerances repair?

Every error-controlled Fenrir evaluation checks its solution's means against their own derivative states
(:func:`pymc_pnode.filtering.calibration.quadrature_defect`): a solution with a defect above the tolerance is solved
again at tighter tolerances (:func:`pymc_pnode.accuracy.tighter_tolerances`) until one passes; one that none passes
is counted over the tolerance and warned (``pn.AccuracyWarning``). This script draws parameters (and initial
states) at random from broad ranges for seven ODEs, evaluates the default likelihood (rtol 1e-4, atol 1e-6) and,
for comparison, rtol 1e-6 and atol 1e-8, each as the package before the re-solve evaluated it (the check alone), with
the start rule (a nonzero entry of y0 below atol counts as over the tolerance) but no re-solve, and as the package
now evaluates it, and compares each value with the exact Gaussian log-likelihood around a DOP853
solution (rtol 1e-12). It reports, per ODE and setting: the evaluations whose value is more than 0.1 and 1 nat off,
how many of those the check flagged, how many accurate ones (within 0.1 nat) it flagged (false alarms), how many
were solved again, and the mean time per evaluation.

Run: ``python benchmarks/quadrature_check.py [--draws 40]`` (about 10 minutes with warm caches); output in
``benchmarks/results/quadrature_check.md``.
"""

from __future__ import annotations

import argparse
import platform
import time
import warnings
from datetime import datetime, timezone

import numpy as np
import scipy
from known_failures import fhn as fitzhugh_nagumo  # the same fields as the known failures
from known_failures import logistic, sir, van_der_pol
from scipy.integrate import solve_ivp
from scipy.stats import norm

import pymc_pnode as pn
import pymc_pnode.accuracy
from pymc_pnode.accuracy import SolverDiagnostics, unresolved_start
from pymc_pnode.filtering.odefilter import DIFFUSION_LOCAL
from pymc_pnode.likelihoods.fenrir import FenrirProblem, StepControl


def lotka_volterra(y, t, p):
    return [p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]]


def lorenz(y, t, p):
    return [p[0] * (y[1] - y[0]), y[0] * (p[1] - y[2]) - y[1], y[0] * y[1] - p[2] * y[2]]


def seir(y, t, p):
    infections = p[0] * y[0] * y[2]
    return [-infections, infections - p[1] * y[1], p[1] * y[1] - p[2] * y[2]]


def log_uniform(rng, low, high):
    return float(np.exp(rng.uniform(np.log(low), np.log(high))))


# name: (field, n_states, observed state, times, noise sd, draw(rng) -> (y0, theta))
PROBLEMS = {
    "SIR, seed I0 in [1e-12, 1e-1]": (
        sir, 3, 1, np.arange(5.0, 105.0, 5.0), 5.0,
        lambda r: ([1000.0, log_uniform(r, 1e-12, 1e-1), 0.0], [log_uniform(r, 1e-4, 1e-3), r.uniform(0.05, 0.3)])),
    "SEIR, seed E0 in [1e-12, 1e-1]": (
        seir, 3, 2, np.arange(5.0, 155.0, 5.0), 5.0,
        lambda r: ([1000.0, log_uniform(r, 1e-12, 1e-1), 0.0], [log_uniform(r, 2e-4, 1e-3), r.uniform(0.1, 0.5),
                                                               r.uniform(0.05, 0.3)])),
    "logistic, y0 in [1e-11, 1]": (
        logistic, 1, 0, np.linspace(1.0, 30.0, 30), 0.2,
        lambda r: ([log_uniform(r, 1e-11, 1.0)], [r.uniform(0.3, 1.5), r.uniform(5.0, 20.0)])),
    "FitzHugh–Nagumo": (
        fitzhugh_nagumo, 2, 0, np.linspace(1.0, 20.0, 40), 0.1,
        lambda r: ([r.uniform(-2, 2), r.uniform(-1, 1)], [r.uniform(0.0, 0.5), r.uniform(0.0, 0.5),
                                                          log_uniform(r, 1.0, 10.0)])),
    "Van der Pol, μ in [0.5, 20]": (
        van_der_pol, 2, 0, np.linspace(0.5, 20.0, 40), 0.1,
        lambda r: ([r.uniform(-2, 2), r.uniform(-1, 1)], [log_uniform(r, 0.5, 20.0)])),
    "Lotka–Volterra": (
        lotka_volterra, 2, 0, np.linspace(0.5, 15.0, 30), 0.2,
        lambda r: ([log_uniform(r, 0.1, 5.0), log_uniform(r, 0.1, 5.0)],
                   [log_uniform(r, 0.5, 3.0), log_uniform(r, 0.3, 2.0), log_uniform(r, 0.5, 3.0),
                    log_uniform(r, 0.3, 2.0)])),
    "Lorenz, t ≤ 5": (
        lorenz, 3, 0, np.linspace(0.1, 5.0, 50), 1.0,
        lambda r: ([r.uniform(-5, 5), r.uniform(-5, 5), r.uniform(10, 30)], [r.uniform(8, 12), r.uniform(20, 30),
                                                                              r.uniform(2, 3)])),
}
SETTINGS = {"defaults (rtol 1e-4, atol 1e-6)": StepControl(None),
            "rtol 1e-6, atol 1e-8": StepControl(None, rtol=1e-6, atol=1e-8)}


def exact_loglik(field, y0, theta, times, observed, data, sd):
    sol = solve_ivp(lambda t, y: field(y, t, theta), (0.0, times[-1]), y0, method="DOP853", t_eval=times,
                    rtol=1e-12, atol=1e-20)
    if not sol.success or sol.y.shape[1] != times.size:
        return None
    return norm.logpdf(data[:, 0], sol.y[observed], sd).sum(), sol.y[observed]


# The package before 2026-11-28 evening (the check alone: no start rule, no re-solve), its first solve with the start
# rule (a nonzero y0 entry below atol counts as over the tolerance), and the package's evaluation (both, and re-solves).
VERSIONS = ("check only (before)", "check and start rule", "with re-solve (now)")


def set_version(version: str, tighter: tuple) -> None:
    """Make the package evaluate as ``version`` does (module attributes that
    :func:`pymc_pnode.accuracy.solve_to_tolerance` reads at each evaluation)."""
    pymc_pnode.accuracy.TIGHTER_TOLERANCES = tighter if version == VERSIONS[2] else ()
    pymc_pnode.accuracy.unresolved_start = (lambda y0, atol: 0.0) if version == VERSIONS[0] else unresolved_start


def evaluations(n_draws: int) -> list[tuple]:
    """``(ODE, setting, version, |Fenrir − exact| [nats], largest scaled defect or local error, re-solved, seconds)``
    per finite evaluation."""
    rng = np.random.default_rng(20261128)
    records, tighter = [], pymc_pnode.accuracy.TIGHTER_TOLERANCES
    for name, (field, d, observed, times, sd, draw) in PROBLEMS.items():
        draws = [draw(rng) for _ in range(n_draws)]
        ode = pn.ODE(field, n_states=d, n_theta=len(draws[0][1]))
        truth = None
        while truth is None:  # data: the exact solution at the first draw that has one, plus noise
            truth = exact_loglik(field, np.array(draws[0][0]), np.array(draws[0][1]), times, observed,
                                 np.zeros((times.size, 1)), sd)
            if truth is None:
                draws.pop(0)
        data = (truth[1] + sd * rng.standard_normal(times.size))[:, None]
        for label, control in SETTINGS.items():
            problem = FenrirProblem.build(ode, times, data.shape, np.eye(d)[[observed]], 1, pn.EK1(3), control,
                                          DIFFUSION_LOCAL)
            problem.evaluate(np.array(draws[0][0]), np.array(draws[0][1]), data, sd, 1.0,
                             diagnostics=SolverDiagnostics(), warn=False)  # generated code loaded before the timing
            for y0, theta in draws:
                ref = exact_loglik(field, np.array(y0), np.array(theta), times, observed, data, sd)
                for version in VERSIONS:
                    counts = SolverDiagnostics()
                    set_version(version, tighter)
                    start = time.perf_counter()
                    value = problem.evaluate(np.array(y0), np.array(theta), data, sd, 1.0, diagnostics=counts,
                                             warn=False)[0].sum()
                    seconds = time.perf_counter() - start
                    if ref is not None and np.isfinite(value):
                        records.append((name, label, version, abs(value - ref[0]), counts.max_error,
                                        counts.n_tightened, seconds))
            print(f"  {name}, {label}: done", flush=True)
    return records


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--draws", type=int, default=40)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    records = evaluations(args.draws)
    lines = [f"# python benchmarks/quadrature_check.py --draws {args.draws}", "",
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()}, Python "
             f"{platform.python_version()}, numpy {np.__version__}, scipy {scipy.__version__}, pymc_pnode "
             f"{pn.__version__}. Data: the exact solution at the first draw plus noise; values at every draw. "
             "Flagged: largest scaled defect (or local error) of the returned solution above 1, the package's rule. "
             "Re-solved: the first solution failed the check and was solved again at tighter tolerances.", "",
             "| ODE | setting | version | evaluations | re-solved | off by > 0.1 nat: flagged | off by > 1 nat: "
             "flagged | within 0.1 nat: flagged | largest error not flagged [nats] | mean ms per evaluation |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in PROBLEMS:
        for label in SETTINGS:
            for version in VERSIONS:
                rows = [r[3:] for r in records if r[:3] == (name, label, version)]
                err, defect, again, seconds = (np.array(column) for column in zip(*rows))
                flagged, ok = defect > 1.0, err <= 0.1
                missed = err[~flagged]
                lines.append(
                    f"| {name} | {label} | {version} | {err.size} | {again.sum()} | {flagged[err > 0.1].sum()} of "
                    f"{(err > 0.1).sum()} | {flagged[err > 1].sum()} of {(err > 1).sum()} | {flagged[ok].sum()} of "
                    f"{ok.sum()} | {missed.max() if missed.size else 0:.3g} | {1e3 * seconds.mean():.2f} |")
    lines += ["", "All evaluations together (both settings), for other flagging thresholds:", "",
              "| version | flagged when the defect exceeds | off by > 1 nat: flagged | off by > 0.1 nat: flagged | "
              "within 0.1 nat: flagged |", "| --- | --- | --- | --- | --- |"]
    for version in VERSIONS:
        err, defect = (np.array([r[j] for r in records if r[2] == version]) for j in (3, 4))
        for limit in (1.0, 3.0, 10.0, 100.0):
            flagged = defect > limit
            lines.append(f"| {version} | {limit:g} | {flagged[err > 1].sum()} of {(err > 1).sum()} | "
                         f"{flagged[err > 0.1].sum()} of {(err > 0.1).sum()} | {flagged[err <= 0.1].sum()} of "
                         f"{(err <= 0.1).sum()} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
