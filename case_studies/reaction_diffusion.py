"""Fisher–KPP reaction–diffusion by the method of lines: the model of ``fenrir_reaction_diffusion.ipynb``.

:math:`u_t = D u_{xx} + r u (1 - u)` on :math:`x \\in [0, 1]` with zero-flux boundaries, discretised on ``N_CELLS``
cells of width :math:`h = 1/N`: :math:`\\dot u_i = D (u_{i-1} - 2 u_i + u_{i+1}) / h^2 + r u_i (1 - u_i)` with
mirrored ghost cells. A front that starts at the left wall travels right at speed :math:`\\approx 2\\sqrt{D r}`.
"""

from __future__ import annotations

import functools

import numpy as np
from scipy.integrate import solve_ivp

import pymc_pnode as pn

N_CELLS = 50
X = (np.arange(N_CELLS) + 0.5) / N_CELLS
THETA_TRUE = np.array([0.0025, 3.0])  # diffusion D, growth rate r
U0 = np.exp(-((X / 0.08) ** 2))  # the initial front, known
SENSORS = np.arange(2, N_CELLS, 5)  # every fifth cell observed
TIMES = np.arange(1, 11) * 0.4  # t = 0.4, ..., 4.0
NOISE_SD = 0.05


def fisher_kpp(u, t, p):
    diffusion, growth = p[0], p[1]
    n = len(u)
    rate = diffusion * n * n
    field = []
    for i in range(n):
        left = u[i - 1] if i > 0 else u[i]
        right = u[i + 1] if i < n - 1 else u[i]
        field.append(rate * (left - 2.0 * u[i] + right) + growth * u[i] * (1.0 - u[i]))
    return field


OBS_MATRIX = np.eye(N_CELLS)[SENSORS]


@functools.cache
def _ode() -> pn.ODE:
    return pn.ODE(fisher_kpp, n_states=N_CELLS, n_theta=2)


def __getattr__(name: str):
    # ``ODE`` is built on first use: importing ``fisher_kpp`` alone (benchmarks/scale.py) builds nothing.
    if name == "ODE":
        return _ode()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def reference(theta, times, rtol: float = 1e-10, atol: float = 1e-12) -> np.ndarray:
    """A tight implicit (Radau) solution at ``times``, shape ``(len(times), N_CELLS)``."""
    ode = _ode()
    out = solve_ivp(lambda t, u: ode.f(u, t, theta), (0.0, float(times[-1])), U0, method="Radau", t_eval=times,
                    jac=lambda t, u: ode.jacobian(u, t, theta), rtol=rtol, atol=atol)
    if not out.success:
        raise RuntimeError(out.message)
    return out.y.T


def make_data(seed: int = 11) -> np.ndarray:
    """Noisy observations of the sensor cells at ``TIMES``, shape ``(len(TIMES), len(SENSORS))``."""
    rng = np.random.default_rng(seed)
    exact = reference(THETA_TRUE, TIMES)[:, SENSORS]
    return exact + NOISE_SD * rng.normal(size=exact.shape)


def exact_loglik(theta, sigma: float, data: np.ndarray) -> float:
    """The Gaussian log-likelihood of ``data`` around the tight reference solution (what Fenrir approximates)."""
    resid = data - reference(theta, TIMES)[:, SENSORS]
    return float(-0.5 * np.sum(resid**2) / sigma**2 - resid.size * np.log(sigma * np.sqrt(2.0 * np.pi)))
