"""Solutions that the IWP prior represents exactly (polynomials of degree ≤ q): values, gradients and ``pn.solve``.

A polynomial solution (``y' = θ t``: a quadratic; free fall with a push linear in t: a cubic) makes every ODE
residual rounding noise, exactly 0 on one step and 1e-14 on the next. The local diffusions estimated from those
residuals spanned 1e-150 … 1e-19, and diffusion ratios of 1e120 between neighbouring steps made the backward
kernels (Fenrir, the smoother of ``pn.solve``) singular. Since the local diffusion is floored at the diffusion of a
residual made of rounding alone (``calibration.rounding_kappa``) the values are exact to rounding.

For each case, over 30 parameter values (27 spread over a range and the truth ± 1e-6), printed against the exact
Gaussian log-likelihood of the exact polynomial (the data are drawn at the truth):
the largest error of the finite Fenrir values, how many values are ``-inf``, how many are silently wrong (finite,
more than 1e-6 nats off, and not counted as failed, over the tolerance or unreliable in ``pn.fenrir_diagnostics``,
which is what the ``pn.AccuracyWarning`` reports), the largest relative error of the gradient against central
differences (at 6 of the values), and the largest error of ``pn.solve``'s smoothed mean at its defaults (error
control, local diffusion).

Run: ``python benchmarks/polynomial_solutions.py`` (a few minutes from empty caches); output in
``benchmarks/results/polynomial_solutions.md``. ``PYTHONPATH=<tree>`` runs it against another checkout.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
from scipy.stats import norm

import pymc_pnode as pn


def ramp(y, t, p):
    return [p[0] * t]


def ballistic(y, t, p):
    return [y[1], -p[0] + p[1] * t]


# name, field, states, y0, truth (theta), the parameter varied (index, range), exact solution, observed rows
CASES = [
    ("y' = θ t (quadratic)", ramp, 1, [1.0], [0.5], (0, (0.1, 1.5)),
     lambda y0, th, t: np.c_[y0[0] + th[0] * t**2 / 2], [[1.0]]),
    ("free fall with a push (cubic)", ballistic, 2, [1.0, 4.0], [2.0, 0.5], (0, (0.5, 3.5)),
     lambda y0, th, t: np.c_[y0[0] + y0[1] * t - th[0] * t**2 / 2 + th[1] * t**3 / 6,
                             y0[1] - th[0] * t + th[1] * t**2 / 2], [[1.0, 0.0]]),
]
SETTINGS = [("defaults", {}), ("step 0.1, local diffusion", dict(step=0.1, diffusion="local")),
            ("step 0.1, global diffusion", dict(step=0.1, diffusion="global"))]
TIMES = np.linspace(0.5, 3.0, 11)
SIGMA = 0.3


def _parameter_values(truth, index, span):
    values = []
    for v in [*np.linspace(*span, 27), truth[index] - 1e-6, truth[index], truth[index] + 1e-6]:
        theta = np.array(truth, dtype=float)
        theta[index] = v
        values.append(theta)
    return values


def _central_differences(f, x, eps=1e-6):
    out = np.empty(x.size)
    for i in range(x.size):
        e = np.zeros(x.size)
        e[i] = eps * max(1.0, abs(x[i]))
        out[i] = (f(x + e) - f(x - e)) / (2 * e[i])
    return out


def _flags(counts) -> int:
    """Evaluations counted as failed, over the tolerance or with an unreliable gradient (what the package reports)."""
    c = counts.as_dict()
    return c["n_failed"] + c["n_over_tolerance"] + c["n_unreliable_gradient"] + c["n_equilibrium_gradient"]


def fenrir_rows(case) -> list[str]:
    name, field, d, y0, truth, (index, span), exact, obs = case
    ode = pn.ODE(field, n_states=d, n_theta=len(truth))
    obs = np.array(obs)
    data = exact(y0, truth, TIMES) @ obs.T + SIGMA * np.random.default_rng(1).standard_normal((TIMES.size, 1))
    rows = []
    for label, kwargs in SETTINGS:
        x = pt.dvector("x")
        ll = pn.fenrir_loglik(ode, x[:d], x[d:], TIMES, data, obs_matrix=obs, obs_sigma=SIGMA, **kwargs)
        fn = pytensor.function([x], [ll, pytensor.grad(ll, x)])
        counts = ll.owner.inputs[0].owner.op.problem.diagnostics  # Sum(FenrirOp(...))
        errors, n_inf, n_silent, grad_errors = [], 0, 0, []
        values = _parameter_values(truth, index, span)
        for i, theta in enumerate(values):
            point = np.r_[y0, theta]
            flags_before = _flags(counts)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", pn.AccuracyWarning)
                value, grad = fn(point)
            flagged = _flags(counts) > flags_before
            reference = norm.logpdf(data, exact(y0, theta, TIMES) @ obs.T, SIGMA).sum()
            if not np.isfinite(value):
                n_inf += 1
                continue
            errors.append(abs(value - reference))
            n_silent += errors[-1] > 1e-6 and not flagged
            if i % 5 == 0:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", pn.AccuracyWarning)
                    fd = _central_differences(lambda z: fn(z)[0], point)
                grad_errors.append(np.abs(grad - fd).max() / np.abs(fd).max())
        worst = f"{max(errors):.3g}" if errors else "–"
        worst_grad = f"{max(grad_errors):.2g}" if grad_errors else "–"
        rows.append(f"| {name} | {label} | {len(values)} | {worst} | {n_inf} | {n_silent} | {worst_grad} |")
    return rows


def solve_row(case) -> str:
    name, field, d, y0, truth, (index, span), exact, _ = case
    ode = pn.ODE(field, n_states=d, n_theta=len(truth))
    worst, n_bad = 0.0, 0
    for theta in _parameter_values(truth, index, span):
        sol = pn.solve(ode, y0, theta, (0.0, TIMES[-1]), save_at=TIMES)
        error = np.abs(sol.mean - exact(y0, theta, TIMES)).max()
        if not (np.isfinite(error) and np.isfinite(sol.std).all()):
            n_bad += 1
        else:
            worst = max(worst, error)
    return f"| {name} | {worst:.3g} | {n_bad} |"


def main() -> None:
    print("| case | settings | parameter values | largest error of a finite value [nats] | `-inf` | "
          "silently wrong | largest gradient error (relative, 6 values) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for case in CASES:
        print("\n".join(fenrir_rows(case)))
    print("\n`pn.solve` at its defaults (error control, local diffusion, smoothed), the same 30 parameter values:\n")
    print("| case | largest error of a finite smoothed mean | non-finite means or standard deviations |")
    print("| --- | --- | --- |")
    for case in CASES:
        print(solve_row(case))


if __name__ == "__main__":
    main()
