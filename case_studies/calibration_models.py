"""Model builders for simulation-based calibration (SBC) studies of ``pymc_pnode``.

Each study provides

* ``study_X_simulator()``: the data-generating ``pm.Model``: the ranked parameters with the priors of the
  inference models, and the observed variable (same name and shape as theirs) simulated from a tight-tolerance
  DOPRI5 solution of the ODE (``pn.DifferentialEquation``, whose failed-solve potential vetoes a draw) plus
  Normal noise. Its observed value is a placeholder: an SBC run replaces it with prior-predictive draws.
* ``study_X_models(data)``: a dict ``{name: pm.Model}`` of inference models with identical priors on the
  shared parameters, all with ``observed=`` likelihoods (ordinary PyMC distributions, ``pn.Fenrir`` or a
  ``CustomDist``) so that the observed values can be swapped by graph replacement.
* ``SAMPLE_KWARGS_X``: the ``pm.sample`` arguments per model name (measured: the faster sampler differs by model);
  ``RANK_VARS_X``: the variables ranked (latent nuisance variables of a model — the innovations of the Chkrebtii
  layer, the error variances of the Matsuda block — have no counterpart in the simulator and are not ranked).

Study A: Lotka-Volterra, both states observed; Fenrir (defaults / fixed step) against an RK4 Gaussian
likelihood at a coarse step whose bias is several noise standard deviations.
Study C: FitzHugh-Nagumo with explicit Euler (Matsuda & Miyatake): monotone discretisation-error variances
against the conventional model that ignores the solver error.
Study B: ODE (6) of Chkrebtii et al. (2016): the probabilistic solution layer against explicit Euler on the
same coarse grid.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt

import pymc_pnode as pn
from pymc_pnode.likelihoods.discretization import DiscretizationErrorNormal

# ---------------------------------------------------------------------------------------------------------------
# Study A: Lotka-Volterra, Fenrir versus a coarse RK4 least-squares likelihood
# ---------------------------------------------------------------------------------------------------------------


def lotka_volterra(y, t, p):
    """Lotka-Volterra: prey ``y[0]``, predator ``y[1]``; ``p = (alpha, beta, gamma, delta)``."""
    return [p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]]


LV_ODE = pn.ODE(lotka_volterra, n_states=2, n_theta=4)
A_Y0 = np.array([1.0, 0.5])
A_TIMES = np.arange(1.0, 10.0 + 0.5, 1.0)  # 10 times x 2 states = 20 observations
A_ALPHA, A_GAMMA = 1.0, 1.0  # fixed growth/death rates
A_THETA_MU = np.zeros(2)  # free (beta, delta) ~ LogNormal(0, 0.1): periods near 2 pi, no blow-ups
A_THETA_SD = 0.1
A_SIGMA = 0.01  # known observation noise sd (both states)
A_RK_METHOD = "rk4"  # pn.rk_solve's default scheme, stated explicitly
A_RK_STEP = 1.0  # coarse RK4 step: its error is several noise sds at typical prior draws
# Fixed Fenrir step. At A_RK_STEP the Fenrir solve fails (-inf) at every prior draw we tried, and at 0.5 it
# is -inf or off by up to 8e6 nats; 0.25 is the coarsest step that gives finite, roughly right values.
A_FENRIR_STEP = 0.25
A_EXACT_RTOL, A_EXACT_ATOL = 1e-8, 1e-10
_COMMON = dict(chains=2, cores=1, progressbar=False, compute_convergence_checks=False)
# Per model (measured, warm caches, one dataset): Fenrir default 4.7-5.0 s with nutpie (11.6 s with pm.sample),
# Fenrir at step 0.25 3.4-4.1 s (either sampler), RK4 1.1-1.4 s with pm.sample (nutpie 7.5 s: compile-bound).
SAMPLE_KWARGS_A = {
    "fenrir_default": dict(_COMMON, tune=250, draws=250, nuts_sampler="nutpie"),
    "fenrir_coarse": dict(_COMMON, tune=250, draws=250, nuts_sampler="nutpie"),
    "rk_coarse": dict(_COMMON, tune=250, draws=250),
}
RANK_VARS_A = ["theta"]


def _a_priors():
    """Free ``theta = (beta, delta)``; returns the full ODE parameter vector ``(alpha, beta, gamma, delta)``."""
    theta = pm.LogNormal("theta", A_THETA_MU, A_THETA_SD, shape=2)
    return pt.stack([pt.constant(A_ALPHA), theta[0], pt.constant(A_GAMMA), theta[1]])


def study_a_simulator() -> pm.Model:
    """Study A data: tight-tolerance DOPRI5 solution (``pn.DifferentialEquation``) plus N(0, A_SIGMA^2) noise.

    A failed solve sets the potential ``exact_failed`` to ``-inf`` (the draw is then invalid).
    """
    solve = pn.DifferentialEquation(LV_ODE, times=A_TIMES, rtol=A_EXACT_RTOL, atol=A_EXACT_ATOL, name="exact")
    with pm.Model() as model:
        params = _a_priors()
        states = solve(y0=A_Y0, theta=params)
        pm.Normal("y", states, A_SIGMA, observed=np.zeros((A_TIMES.size, 2)))
    return model


def study_a_models(data) -> dict[str, pm.Model]:
    """The three study-A inference models on ``data`` (shape ``(len(A_TIMES), 2)``)."""
    data = np.asarray(data, dtype=np.float64).reshape(A_TIMES.size, 2)
    models = {}
    with pm.Model() as models["fenrir_default"]:
        params = _a_priors()
        pn.Fenrir("y", LV_ODE, y0=A_Y0, theta=params, times=A_TIMES, observed=data, obs_sigma=A_SIGMA)
    with pm.Model() as models["fenrir_coarse"]:
        params = _a_priors()
        pn.Fenrir("y", LV_ODE, y0=A_Y0, theta=params, times=A_TIMES, observed=data, obs_sigma=A_SIGMA,
                  step=A_FENRIR_STEP, check_accuracy=False)
    with pm.Model() as models["rk_coarse"]:
        params = _a_priors()
        states = pn.rk_solve(LV_ODE, A_Y0, params, A_TIMES, method=A_RK_METHOD, step=A_RK_STEP)
        pm.Normal("y", states, A_SIGMA, observed=data)
    return models


# ---------------------------------------------------------------------------------------------------------------
# Study C: FitzHugh-Nagumo with explicit Euler, monotone discretisation-error variances (Matsuda & Miyatake)
# ---------------------------------------------------------------------------------------------------------------


def fitzhugh_nagumo(y, t, p):
    """FitzHugh-Nagumo in the form of Matsuda & Miyatake (and ``matsuda_bayesian.ipynb``)."""
    a, b, c = p[0], p[1], p[2]
    return [c * (y[0] - y[0] ** 3 / 3 + y[1]), -(y[0] - a + b * y[1]) / c]


FHN_ODE = pn.ODE(fitzhugh_nagumo, n_states=2, n_theta=3)
C_Y0 = np.array([-1.0, -1.0])
C_TIMES = np.arange(1, 31) * 0.4  # 30 times on (0, 12] (the notebook: 101 times on [0, 40])
C_NOISE_VAR = 0.01  # gamma^2, known (sd 0.1), as in the notebook
C_EULER_STEP = 0.2  # as in the notebook
C_THETA_MU = np.log([0.2, 0.2, 3.0])  # narrower than the notebook's LogNormal(log(0.3, 0.3, 2.5), 0.5)
C_THETA_SD = np.array([0.3, 0.3, 0.1])
C_OBS_MATRIX = np.array([[1.0, 0.0]])  # V observed
C_EXACT_RTOL, C_EXACT_ATOL = 1e-8, 1e-10
# Measured: monotone 20 s with nutpie (0 divergences, ESS 388), 83 s with pm.sample (24 divergences, ESS 3);
# sigma2_zero 2.9 s with pm.sample (nutpie 7.5 s). The monotone model misses the 6 s target: see the report.
SAMPLE_KWARGS_C = {
    "monotone": dict(_COMMON, tune=300, draws=300, target_accept=0.9, nuts_sampler="nutpie"),
    "sigma2_zero": dict(_COMMON, tune=300, draws=300, target_accept=0.9),
}
RANK_VARS_C = ["theta"]
C_MODEL_NAMES = ("monotone", "sigma2_zero")


def _c_priors():
    return pm.LogNormal("theta", C_THETA_MU, C_THETA_SD, shape=3)


def study_c_simulator() -> pm.Model:
    """Study C data: V from a tight-tolerance DOPRI5 solve plus N(0, C_NOISE_VAR) noise, observed as ``V``."""
    solve = pn.DifferentialEquation(FHN_ODE, times=C_TIMES, rtol=C_EXACT_RTOL, atol=C_EXACT_ATOL, name="exact")
    with pm.Model() as model:
        theta = _c_priors()
        v = solve(y0=C_Y0, theta=theta)[:, 0]
        pm.Normal("V", v, np.sqrt(C_NOISE_VAR), observed=np.zeros(C_TIMES.size))
    return model


def study_c_models(data) -> dict[str, pm.Model]:
    """``monotone`` (default monotone variance prior) and ``sigma2_zero`` (increments fixed at zero)."""
    data = np.asarray(data, dtype=np.float64).reshape(C_TIMES.size)
    models = {}
    for name in C_MODEL_NAMES:
        extra = {} if name == "monotone" else {"increments": np.zeros((C_TIMES.size, 1))}
        with pm.Model() as models[name]:
            theta = _c_priors()
            DiscretizationErrorNormal("V", FHN_ODE, y0=C_Y0, theta=theta, times=C_TIMES, observed=data,
                                      noise_var=C_NOISE_VAR, method="euler", step=C_EULER_STEP,
                                      obs_matrix=C_OBS_MATRIX, **extra)
    return models


# ---------------------------------------------------------------------------------------------------------------
# Study B: ODE (6) of Chkrebtii et al., probabilistic solution layer versus Euler on the same grid
# ---------------------------------------------------------------------------------------------------------------


def ode6(y, t, p):
    """Chkrebtii et al. (2016), eq. (6): u'' = sin(theta t) - u as a first-order system."""
    return [y[1], -y[0] + pt.sin(p[0] * t)]


ODE6 = pn.ODE(ode6, n_states=2, n_theta=1)
B_Y0 = np.array([-1.0, 0.0])
B_T_SPAN = (0.0, 10.0)
B_TIMES = np.arange(1, 21) * 0.5  # u1 observed at 0.5, 1, ..., 10 (20 times)
# theta ~ LogNormal(log 2, 0.05): at sd 0.1 the sin(theta t) likelihood was multimodal (one replicate's R-hat 1.8).
B_THETA_MU, B_THETA_SD = np.log(2.0), 0.05
B_SIGMA = 0.1  # known noise sd of u1
B_N_GRID = 41  # coarse grid: h = 0.25, every observation time is a grid point
B_H = (B_T_SPAN[1] - B_T_SPAN[0]) / (B_N_GRID - 1)
B_LAM = 2.0 * B_H  # docs/chkrebtii.md: uniform kernel, exact interrogations ("zero"), lambda = 2h, alpha = N
B_ALPHA = float(B_N_GRID)
B_EXACT_RTOL, B_EXACT_ATOL = 1e-8, 1e-10
# Measured: chkrebtii 7.5 s with pm.sample (ESS 842; nutpie 11.5 s and ESS 3), deterministic 0.9 s with pm.sample.
SAMPLE_KWARGS_B = {
    "chkrebtii": dict(_COMMON, tune=400, draws=300),
    "chkrebtii_se": dict(_COMMON, tune=400, draws=300),  # ~10 s per fit with pm.sample (3 replicates)
    "deterministic": dict(_COMMON, tune=400, draws=300),
}
RANK_VARS_B = ["theta"]
# The layer with the prior of the paper's Figure 3 (squared-exponential kernel, lambda = 0.8, alpha = 5, the paper's
# noise rule): in case_studies/chkrebtii_ode6.ipynb its draws cover the exact solution at N = 50, whereas the
# uniform kernel with lambda = 2h, alpha = N is overconfident there.
B_SE = dict(kernel="squared_exponential", lam=0.8, alpha=5.0, noise="paper")
B_MODEL_NAMES = ("chkrebtii", "chkrebtii_se", "deterministic")


def _b_priors():
    return pm.LogNormal("theta", B_THETA_MU, B_THETA_SD)


def study_b_simulator() -> pm.Model:
    """Study B data: u1 from a tight-tolerance DOPRI5 solve plus N(0, B_SIGMA^2) noise, observed as ``y``."""
    solve = pn.DifferentialEquation(ODE6, times=B_TIMES, rtol=B_EXACT_RTOL, atol=B_EXACT_ATOL, name="exact")
    with pm.Model() as model:
        theta = _b_priors()
        u1 = solve(y0=B_Y0, theta=pt.stack([theta]))[:, 0]
        pm.Normal("y", u1, B_SIGMA, observed=np.zeros(B_TIMES.size))
    return model


def study_b_models(data) -> dict[str, pm.Model]:
    """``chkrebtii`` (the solution layer on B_N_GRID points, uniform kernel), ``chkrebtii_se`` (the paper's
    squared-exponential prior) and ``deterministic`` (Euler, same grid)."""
    data = np.asarray(data, dtype=np.float64).reshape(B_TIMES.size)
    models = {}
    with pm.Model() as models["chkrebtii"]:
        theta = _b_priors()
        u = pn.ChkrebtiiSolution("u", ODE6, y0=B_Y0, theta=pt.stack([theta]), t_span=B_T_SPAN, n_grid=B_N_GRID,
                                 alpha=B_ALPHA, lam=B_LAM, kernel="uniform", noise="zero", times=B_TIMES)
        pm.Normal("y", u[:, 0], B_SIGMA, observed=data)
    with pm.Model() as models["chkrebtii_se"]:
        theta = _b_priors()
        u = pn.ChkrebtiiSolution("u", ODE6, y0=B_Y0, theta=pt.stack([theta]), t_span=B_T_SPAN, n_grid=B_N_GRID,
                                 times=B_TIMES, **B_SE)
        pm.Normal("y", u[:, 0], B_SIGMA, observed=data)
    with pm.Model() as models["deterministic"]:
        theta = _b_priors()
        u = pn.rk_solve(ODE6, B_Y0, pt.stack([theta]), B_TIMES, method="euler", step=B_H)
        pm.Normal("y", u[:, 0], B_SIGMA, observed=data)
    return models


SIMULATORS = {"A": study_a_simulator, "B": study_b_simulator, "C": study_c_simulator}
MODELS = {"A": study_a_models, "B": study_b_models, "C": study_c_models}
SAMPLE_KWARGS = {"A": SAMPLE_KWARGS_A, "B": SAMPLE_KWARGS_B, "C": SAMPLE_KWARGS_C}
RANK_VARS = {"A": RANK_VARS_A, "B": RANK_VARS_B, "C": RANK_VARS_C}
