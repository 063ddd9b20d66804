"""``ChkrebtiiSolution``: Chkrebtii et al.'s probabilistic solution as a latent layer of a PyMC model."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pytensor.graph.basic import Constant

from pymc_pnode.chkrebtii.delay import DelayODE
from pymc_pnode.chkrebtii.ops import CovarianceStructureOp, RecursionOp
from pymc_pnode.chkrebtii.problem import discretisation, positive_parameter, segments
from pymc_pnode.discontinuities import restart_state
from pymc_pnode.ode import ODE, vector_tensor

__all__ = ["ChkrebtiiSolution", "INNOVATIONS_TAG"]

INNOVATIONS_TAG = "chkrebtii_innovations"
_OUTPUTS = ("draw", "mean")


def _as_vector(value, name: str, size: int, allow_scalar: bool = False) -> pt.TensorVariable:
    """A float64 1-d tensor of length ``size`` (or 1 when ``allow_scalar``); numbers are checked now."""
    var = pt.as_tensor_variable(value).astype("float64")
    if var.ndim > 1:
        raise ValueError(f"{name} must be a scalar or a 1-d tensor, got ndim={var.ndim}")
    if var.ndim == 0:
        if not allow_scalar:
            raise ValueError(f"{name} must have shape ({size},), got a scalar")
        var = var.reshape((1,))
    static = var.type.shape[0]
    allowed = (size, 1) if allow_scalar else (size,)
    if static is not None and static not in allowed:
        raise ValueError(f"{name} must have shape ({size},), got ({static},)")
    return var


def _constant_value(value):
    """The numeric value of ``value`` if it is known at model-build time, else ``None``."""
    if isinstance(value, Constant):
        return np.asarray(value.data, dtype=np.float64)
    if isinstance(value, (int, float, np.number, np.ndarray, list, tuple)):
        try:
            return np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):  # a list holding tensors
            return None
    return None


def ChkrebtiiSolution(  # noqa: N802 - a PyMC model block, named like a distribution
    name: str,
    ode: ODE | DelayODE,
    *,
    y0,
    theta,
    t_span: tuple[float, float],
    n_grid: int,
    alpha,
    lam,
    kernel: str = "uniform",
    noise: str = "zero",
    times: Sequence[float] | None = None,
    dims: Sequence[str] | None = None,
    output: str = "draw",
    jitter: float = 1e-12,
    discontinuities: Sequence[float] | None = None,
    jumps=None,
    model: pm.Model | None = None,
) -> pt.TensorVariable:
    r"""Add a realisation of Chkrebtii et al.'s probabilistic ODE solution to the current model.

    Algorithm 1 is written as a deterministic function of standard-normal innovations
    ``z ~ N(0, I)``: the one-step-ahead draws use ``z[:N-1]`` and the final joint draw at ``times`` uses
    ``z[N-1:]``. This block creates ``z`` as the free variable ``"{name}_innovations"`` (shape
    ``(N - 1 + len(times), n_states)``, or ``(N - 1, n_states)`` with ``output="mean"``) and returns the
    realisation as the deterministic ``name`` of shape ``(len(times), n_states)``. It is differentiable
    in ``y0``, ``theta``, ``alpha``, ``lam`` and ``z``, so NUTS samples everything jointly
    (a non-centred parameterisation of the solution uncertainty), and
    :class:`~pymc_pnode.ChkrebtiiMetropolis` gives the paper's Algorithm 2. Write any observation model
    on the returned tensor (nonlinear observation functions included).

    Parameters
    ----------
    name : str
        Name of the deterministic output; the innovations are ``name + "_innovations"``.
    ode : ODE or DelayODE
        Vector field.
    y0 : array_like or tensor, shape (n_states,)
        Initial state (may be random).
    theta : array_like or tensor, shape (n_theta,)
        Parameters (may be random; for a :class:`DelayODE` with ``delay_param`` it holds the delay).
    t_span : (float, float)
        Integration interval (the grid spans it).
    n_grid : int
        Number of grid points ``N >= 2``.
    alpha, lam : float, array_like or tensor
        Prior precision and length-scale (> 0), scalars or one per state component; may be random.
    kernel, noise, jitter :
        As in :func:`~pymc_pnode.chkrebtii_sample`.
    times : array_like, optional
        Strictly increasing output times inside ``t_span`` (default: the grid).
    dims : sequence of str, optional
        Dims of the output (``(time_dim, state_dim)``).
    output : {"draw", "mean"}, default "draw"
        ``"draw"``: the final joint draw of Algorithm 1. ``"mean"``: the conditional mean
        :math:`m^N(t)` given the interrogations (what the authors' JAK-STAT code feeds the likelihood).
    discontinuities : sequence of float, optional
        Times inside ``t_span`` where the vector field jumps in ``t`` (a switched input, an infusion started or
        stopped). The GP prior on the derivative is smooth, so at a jump the solution is restarted: each segment
        between jumps has its own grid (``n_grid`` shared out in proportion to the segments' lengths, at least 2
        each) and starts from the realisation (or, with ``output="mean"``, the mean) where the previous one
        ended, as :mod:`pymc_pnode.discontinuities` does for the ODE filters. The segments' innovations are
        consecutive rows of ``"{name}_innovations"``. Not for a :class:`DelayODE` (its history would cross the
        restarts).
    jumps : array_like or tensor, shape (len(discontinuities), n_states), optional
        Jumps of the state at the ``discontinuities`` (a bolus dose; may be random): each restart adds its row to
        the realisation where the previous segment ended, as :func:`pymc_pnode.solve` does to its mean.
    model : pymc.Model, optional
        Defaults to the model on the context stack.

    Returns
    -------
    pytensor.tensor.TensorVariable
        The realisation, shape ``(len(times), n_states)``.

    Raises
    ------
    ValueError
        At model-build time for invalid settings: non-positive numeric ``alpha``/``lam``,
        ``n_grid < 2``, times outside ``t_span``, shape mismatches, unknown ``kernel``/``noise``/``output``.

    Notes
    -----
    A realisation whose solve diverges (non-finite values) adds ``-inf`` to the model log-density
    through the potential ``"{name}_diverged"``: NUTS records a divergence and Metropolis rejects.
    The realisation itself is then all zeros (a NaN would make the log-density NaN), which is what
    forward sampling (prior/posterior predictive) shows for such draws.
    """
    if not isinstance(ode, (ODE, DelayODE)):
        raise ValueError(f"ode must be a pymc_pnode.ODE or DelayODE, got {type(ode).__name__}")
    if output not in _OUTPUTS:
        raise ValueError(f"output must be one of {_OUTPUTS}, got {output!r}")
    disc = discretisation(t_span, n_grid, times, kernel, noise, jitter)
    pieces, jumps = segments(disc, ode, discontinuities, jumps)
    model = pm.modelcontext(model)
    d, k = ode.n_states, ode.n_theta
    for value, nm in ((alpha, "alpha"), (lam, "lam")):
        numeric = _constant_value(value)
        if numeric is not None:
            positive_parameter(numeric, nm, d)
    # numbers are validated now; symbolic lengths are pinned (a wrong run-time length must not reach
    # the kernels, which index by n_states and n_theta)
    y0_t = vector_tensor(y0, "y0", d, ode.validate_y0)
    theta_t = vector_tensor(theta, "theta", k, ode.validate_theta)
    alpha_t = _as_vector(alpha, "alpha", d, allow_scalar=True)
    lam_t = _as_vector(lam, "lam", d, allow_scalar=True)
    lam_static = lam_t.type.shape[0]
    if lam_static is None:
        raise ValueError("lam must have a static length (1 or n_states)")
    per_component = lam_static == d and d > 1
    cmap = tuple(range(d)) if per_component else (0,) * d

    draw = output == "draw"
    n_innov = sum(seg.n_grid - 1 + (len(seg.times) if draw else 0) for seg, _ in pieces)
    with model:
        z = pm.Normal(f"{name}_innovations", 0.0, 1.0, shape=(n_innov, d))
    setattr(z.tag, INNOVATIONS_TAG, True)

    idx = np.array(cmap, dtype=np.int64)
    inv_sqrt_alpha = pt.broadcast_to(1.0 / pt.sqrt(alpha_t), (d,))
    y_start, first, parts, failed = y0_t, 0, [], 0.0
    for s, (seg, keep) in enumerate(pieces):
        lb, ginf, gn, sd, hh, lt, w = CovarianceStructureOp(seg)(lam_t)
        sd_scaled = sd[idx] * inv_sqrt_alpha[:, None]
        lt_scaled = lt[idx] * inv_sqrt_alpha[:, None, None]
        n_steps, n_out = seg.n_grid - 1, (len(seg.times) if draw else 0)
        zt = z[first + n_steps:first + n_steps + n_out] if draw else pt.zeros((0, d), dtype="float64")
        u_seg, failed_seg = RecursionOp(ode, seg, draw, cmap)(
            y_start, theta_t, z[first:first + n_steps], zt, lb, ginf, gn, sd_scaled, hh, lt_scaled, w
        )
        first += n_steps + n_out
        y_start = restart_state(u_seg[-1], jumps, s)  # the next segment restarts where this one ended (its end)
        parts.append(u_seg if keep is None else u_seg[keep])
        failed = failed + failed_seg
    u = parts[0] if len(parts) == 1 else pt.concatenate(parts)
    with model:
        pm.Potential(f"{name}_diverged", pt.switch(pt.gt(failed, 0.0), -np.inf, 0.0))
        return pm.Deterministic(name, u, dims=dims)

