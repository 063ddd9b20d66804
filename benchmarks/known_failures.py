"""Two ways the Fenrir defaults are still silently wrong (found 2026-11-28 by a robustness sweep; not fixed).

1. **A state that starts far below ``atol`` and grows** (an epidemic from a small seed): SIR on counts, β = 3e-4,
   γ = 0.1, S0 = 1000, I observed every 5 days with σ = 5, data drawn with no outbreak in them. From I0 = 1e-5 the
   exact solution reaches I = 299; the default Fenrir likelihood (rtol 1e-4, atol 1e-6) follows a solution that
   never takes off and returns the value for I ≡ 0, thousands of nats above the exact one, without a warning. Its
   first pass (unit diffusion, which chooses the grid) is the uniform-diffusion filter, whose mean here turns back
   to 0 while its error estimate stays below the tolerance; ``pn.solve`` with the local diffusion follows the
   epidemic at the same tolerances. Printed: the value against the exact one for several I0 and settings.
2. **A gradient at an exact equilibrium** (logistic growth at y0 = 0, a natural initial point of ``y0 ~ N(0, 1)``):
   every ODE residual is exactly zero, so the calibrated diffusion sits at its floor and its path is cut from the
   gradient, while for any y0 ≠ 0 the gradient has it: the gradient at 0 is not the derivative of the value there.

Run: ``python benchmarks/known_failures.py`` (about a minute with warm caches); output in
``benchmarks/results/known_failures.md``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
from scipy.integrate import solve_ivp
from scipy.stats import norm

import pymc_pnode as pn


def sir(y, t, p):
    infections = p[0] * y[0] * y[1]
    return [-infections, infections - p[1] * y[1], p[1] * y[1]]


def logistic(y, t, p):
    return [p[0] * y[0] * (1 - y[0] / p[1])]


def small_seed() -> list[str]:
    theta, times, sigma = np.array([3e-4, 0.1]), np.arange(5.0, 105.0, 5.0), 5.0
    data = sigma * np.random.default_rng(0).standard_normal(times.size)  # a season without an outbreak
    ode = pn.ODE(sir, n_states=3, n_theta=2)
    rows = ["| I0 | settings | exact log-likelihood | Fenrir − exact [nats] | exact max I "
            "| `pn.solve` (local κ) max I |", "| --- | --- | --- | --- | --- | --- |"]
    for i0 in (1e-3, 1e-5, 1e-7, 1e-9):
        y0 = [1000.0, i0, 0.0]
        ref = solve_ivp(lambda t, y: sir(y, t, theta), (0, 100), y0, method="DOP853", t_eval=times, rtol=1e-12,
                        atol=1e-20).y
        exact = norm.logpdf(data, ref[1], sigma).sum()
        solved = pn.solve(ode, y0, theta, (0, 100), save_at=times, rtol=1e-4, atol=1e-6)
        for label, kwargs in (("defaults", {}), ("atol 1e-9", dict(atol=1e-9)), ("step 0.1", dict(step=0.1))):
            value = float(pn.fenrir_loglik(ode, y0, theta, times, data, obs_matrix=[[0, 1, 0]], obs_sigma=sigma,
                                           **kwargs).eval())
            rows.append(f"| {i0:g} | {label} | {exact:.2f} | {value - exact:+.3g} | {ref[1].max():.1f} | "
                        f"{solved.mean[:, 1].max():.1f} |")
    return rows


def equilibrium_gradient() -> list[str]:
    theta, times, sigma = np.array([0.8, 10.0]), np.linspace(1.0, 12.0, 12), 0.2
    data = sigma * np.random.default_rng(0).standard_normal(times.size)
    ode = pn.ODE(logistic, n_states=1, n_theta=2)
    y0 = pt.dvector("y0")
    rows = ["| settings | y0 | value | gradient | central difference (h = 1e-9) |", "| --- | --- | --- | --- | --- |"]
    for label, kwargs in (("defaults", {}), ("step 0.25, local κ", dict(step=0.25, diffusion="local")),
                          ("step 0.25, global κ", dict(step=0.25, diffusion="global"))):
        ll = pn.fenrir_loglik(ode, y0, theta, times, data, obs_sigma=sigma, **kwargs)
        f = pytensor.function([y0], [ll, pytensor.grad(ll, y0)])
        for start in (0.0, 1e-12):
            value, grad = f([start])
            fd = (f([start + 1e-9])[0] - f([start - 1e-9])[0]) / 2e-9
            rows.append(f"| {label} | {start:g} | {float(value):.6f} | {grad[0]:+.6g} | {float(fd):+.6g} |")
    return rows


def main() -> None:
    warnings.simplefilter("ignore")
    print("\n".join(small_seed()))
    print()
    print("\n".join(equilibrium_gradient()))


if __name__ == "__main__":
    main()
