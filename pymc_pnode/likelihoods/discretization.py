r"""Bayesian discretisation-error variance model (Matsuda & Miyatake, 2021, §2, made Bayesian).

The observations are modelled as

.. math::

    y_{k,j} \sim N\bigl(H_j \tilde x_k(y_0, \theta),\; \gamma_j^2 + \sigma_{k,j}^2\bigr),
    \qquad 0 \le \sigma_{1,j}^2 \le \dots \le \sigma_{K,j}^2,

where :math:`\tilde x_k` is a fixed-step numerical solution (:func:`~pymc_pnode.classical.rk.rk_solve`,
exact discrete-adjoint gradients) and the discretisation-error variances are non-decreasing in time
for every observed component. Monotonicity is built in: :math:`\sigma^2_{\cdot,j}` is the cumulative
sum of non-negative increments.

Default prior of the increments (a normalised gamma process with a half-Cauchy scale):

.. math::

    \sigma^2_{k,j} = s_j^2 \sum_{i \le k} \pi_{i,j}, \qquad
    s_j \sim \text{HalfCauchy}(\text{error\_sd\_scale}_j), \qquad
    \pi_{\cdot,j} \sim \text{Dirichlet}(\alpha\, \Delta t_\cdot / \overline{\Delta t}),

with :math:`\Delta t_k = t_k - t_{k-1}` (:math:`t_0` the ODE's initial time; an observation at
:math:`t_0` gets no increment: the solver is exact there). :math:`s_j` is the error standard
deviation at the last time; its scale defaults to the noise standard deviation, so a solver error
comparable to the noise is a priori typical, and the heavy tail admits much larger errors. The shape
:math:`\pi` is independent of the scale (a non-centred parametrisation, no funnel when the error is
negligible).
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pytensor.graph.basic import Variable

from pymc_pnode.classical.rk import FixedStepSolver, solver_op
from pymc_pnode.validation import validate_noise, validate_obs_matrix

__all__ = ["DiscretizationErrorNormal", "monotone_error_variance"]


def _is_symbolic(x) -> bool:
    return isinstance(x, Variable) or (
        isinstance(x, (list, tuple)) and any(isinstance(v, Variable) for v in x)
    )


def _noise_variance(noise_var, n_obs: int):
    if _is_symbolic(noise_var):
        var = pt.as_tensor_variable(noise_var)
        if var.ndim > 1:
            raise ValueError(f"noise_var must be a scalar or a vector of length {n_obs}")
        return pt.cast(var, "float64"), None
    arr = validate_noise(noise_var, n_obs, "noise_var")
    return pt.as_tensor_variable(arr), arr


def monotone_error_variance(
    name: str,
    times: np.ndarray,
    t0: float,
    n_obs: int,
    *,
    error_sd_scale,
    concentration: float = 1.0,
) -> pt.TensorVariable:
    r"""Default prior of non-decreasing error variances, shape ``(K, J)`` (see the module docstring).

    Creates the free variables ``{name}_error_sd`` (shape ``(J,)``) and ``{name}_error_shape``
    (Dirichlet, shape ``(J, K')`` with ``K'`` the number of times after ``t0``) in the current
    model.

    Parameters
    ----------
    name : str
        Prefix of the created variables.
    times : ndarray, shape (K,)
        Observation times (strictly increasing, ``times[0] >= t0``).
    t0 : float
        Initial time of the solve.
    n_obs : int
        Number of observed components J.
    error_sd_scale : array_like, shape (J,)
        Scales of the half-Cauchy priors of the final error standard deviations.
    concentration : float, default 1.0
        Dirichlet concentration per (average) time gap: small values favour errors that grow in a
        few jumps, large values a steady growth proportional to elapsed time.
    """
    if not (np.isfinite(concentration) and concentration > 0.0):
        raise ValueError(f"concentration must be positive, got {concentration!r}")
    gaps = np.diff(np.concatenate([[t0], times]))
    active = gaps > 0.0
    n_active = int(active.sum())
    sd = pm.HalfCauchy(f"{name}_error_sd", beta=error_sd_scale, shape=(n_obs,))
    if n_active == 0:  # every time equals t0: no discretisation error
        return pt.zeros((times.size, n_obs))
    alpha = concentration * gaps[active] / gaps[active].mean()
    if n_active == 1:
        shape = pt.ones((n_obs, 1))
    else:
        shape = pm.Dirichlet(
            f"{name}_error_shape", a=np.tile(alpha, (n_obs, 1)), shape=(n_obs, n_active)
        )
    increments = pt.zeros((times.size, n_obs))
    increments = pt.set_subtensor(increments[np.flatnonzero(active)], (sd[:, None] ** 2 * shape).T)
    return pt.cumsum(increments, axis=0)


def _normal_logp_or_minus_inf(value, mu, sd):
    # A diverging solve gives non-finite means: the whole likelihood is then -inf (NUTS records a
    # divergence) while every gradient stays finite (means sanitised before the Normal logp).
    ok = ~(pt.isnan(mu) | pt.isinf(mu))
    finite = pt.all(ok)
    safe_mu = pt.switch(ok, mu, 0.0)
    logp = pm.logp(pm.Normal.dist(mu=safe_mu, sigma=sd), value)
    return pt.switch(finite, logp, -np.inf)


def _normal_dist(mu, sd, size):
    return pm.Normal.dist(mu=mu, sigma=sd, size=size)


def DiscretizationErrorNormal(
    name: str,
    ode,
    *,
    y0,
    theta,
    times,
    observed,
    noise_var,
    method: str = "rk4",
    step: float,
    obs_matrix=None,
    dims=None,
    alignment: str = "exact",
    increments=None,
    error_sd_scale=None,
    concentration: float = 1.0,
):
    r"""Observed ODE data with monotone discretisation-error variances, as a PyMC model block.

    Models :math:`y_{k,j} \sim N(H_j \tilde x_k, \gamma_j^2 + \sigma_{k,j}^2)` with
    :math:`\sigma^2_{\cdot,j}` non-decreasing in time (cumulative sums of non-negative
    increments). Must be called inside a ``pm.Model`` context. Adds the observed variable
    ``name``, the deterministic ``{name}_error_var`` (:math:`\sigma^2`, same shape and dims as the
    observations) and, unless ``increments`` is given, the free variables ``{name}_error_sd`` and
    ``{name}_error_shape`` of the default prior (see the module docstring).

    Parameters
    ----------
    name : str
        Name of the observed variable.
    ode : pymc_pnode.ODE
        The differential equation; the solve starts at ``ode.t0``.
    y0 : array_like or TensorVariable
        Initial state, shape ``(n_states,)``; may be random variables.
    theta : array_like or TensorVariable or None
        Parameters, shape ``(n_theta,)``; may be random variables.
    times : array_like, shape (K,)
        Strictly increasing observation times, ``times[0] >= ode.t0``.
    observed : array_like, shape (K, J) (or (K,) when J = 1)
        Data.
    noise_var : float, array_like of shape (J,), or TensorVariable
        Observation-noise variances :math:`\gamma_j^2` (variances, not standard deviations). A
        random variable gives the unknown-noise model.
    method : {"rk4", "euler", "heun", "midpoint", "stormer_verlet"}, default "rk4"
        Fixed-step scheme.
    step : float
        Step size (see ``alignment``).
    obs_matrix : array_like, shape (J, n_states), optional
        Observation matrix H; default identity.
    dims : str or tuple of str, optional
        Dims of the observed variable (and of ``{name}_error_var``), e.g. ``("time", "state")``.
    alignment : {"exact", "shrink"}, default "exact"
        Step alignment with the observation times (see
        :class:`~pymc_pnode.classical.rk.FixedStepSolver`).
    increments : TensorVariable, shape (K, J), optional
        Your own non-negative variance increments (e.g. ``pm.Gamma(...)``), replacing the
        default prior; the error variance is their cumulative sum over time.
    error_sd_scale : float or array_like of shape (J,), optional
        Scale of the half-Cauchy prior of the final error standard deviation; default
        :math:`\sqrt{\gamma_j^2}` (for a random ``noise_var``: the data's standard deviation).
    concentration : float, default 1.0
        Dirichlet concentration of the default prior's shape.

    Returns
    -------
    TensorVariable
        The observed random variable.

    Raises
    ------
    ValueError
        Invalid shapes or values (non-positive noise variance, non-increasing times, misaligned
        step, unknown method, non-finite data), or no enclosing model.

    Examples
    --------
    >>> with pm.Model(coords={"time": t_obs}) as model:  # doctest: +SKIP
    ...     theta = pm.LogNormal("theta", np.log([0.5, 0.5, 2.0]), 0.5, shape=3)
    ...     DiscretizationErrorNormal("V", ode, y0=[-1.0, -1.0], theta=theta, times=t_obs,
    ...                               observed=v_obs, noise_var=0.01, obs_matrix=[[1, 0]],
    ...                               method="euler", step=0.05, dims="time")
    ...     idata = pm.sample()
    """
    try:
        model = pm.modelcontext(None)
    except TypeError:
        raise ValueError("DiscretizationErrorNormal must be called inside a `with pm.Model():` block") from None
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    solver = FixedStepSolver(ode, times, method=method, step=step, alignment=alignment)
    n_times = solver.times.size
    h = validate_obs_matrix(obs_matrix, ode.n_states)
    n_obs = h.shape[0]

    data = np.asarray(observed, dtype=np.float64)
    vector_data = data.ndim == 1
    if vector_data and n_obs != 1:
        raise ValueError(f"observed must have shape ({n_times}, {n_obs}), got {data.shape}")
    expected = (n_times,) if vector_data else (n_times, n_obs)
    if data.shape != expected:
        raise ValueError(f"observed must have shape {expected} (times x observed components), got {data.shape}")
    if not np.all(np.isfinite(data)):
        raise ValueError("observed must be finite")
    if isinstance(dims, str):
        dims = (dims,)
    if dims is not None and len(dims) != data.ndim:
        raise ValueError(f"dims must name {data.ndim} dimensions for observed of shape {data.shape}, got {dims}")

    gamma2, gamma2_values = _noise_variance(noise_var, n_obs)
    if increments is None:
        if error_sd_scale is None:
            if gamma2_values is not None:
                error_sd_scale = np.sqrt(gamma2_values)
            else:
                error_sd_scale = np.maximum(data.reshape(n_times, n_obs).std(axis=0), 1e-8)
        scale = np.asarray(error_sd_scale, dtype=np.float64).reshape(-1)
        scale = np.full(n_obs, scale[0]) if scale.size == 1 else scale
        if scale.shape != (n_obs,) or not np.all(np.isfinite(scale)) or np.any(scale <= 0.0):
            raise ValueError(f"error_sd_scale must be positive with {n_obs} entries, got {error_sd_scale!r}")
        with model:
            error_var = monotone_error_variance(
                name, solver.times, solver.t0, n_obs, error_sd_scale=scale,
                concentration=concentration,
            )
    else:
        inc = pt.as_tensor_variable(increments)
        if inc.ndim == 1 and n_obs == 1:
            inc = inc[:, None]
        if inc.ndim != 2:
            raise ValueError(f"increments must have shape ({n_times}, {n_obs}), got ndim={inc.ndim}")
        for axis, size in enumerate((n_times, n_obs)):
            static = inc.type.shape[axis]
            if static is not None and static != size:
                raise ValueError(f"increments must have shape ({n_times}, {n_obs}), got {inc.type.shape}")
        error_var = pt.cumsum(inc, axis=0)

    states = solver_op(solver, y0, theta)
    mu = states @ pt.as_tensor_variable(h).T
    sd = pt.sqrt(gamma2 + error_var)
    if vector_data:
        mu, sd, error_var = mu[:, 0], sd[:, 0], error_var[:, 0]
    with model:
        pm.Deterministic(f"{name}_error_var", error_var, dims=dims)
        return pm.CustomDist(
            name,
            mu,
            sd,
            dist=_normal_dist,
            logp=_normal_logp_or_minus_inf,
            observed=data,
            dims=dims,
        )
