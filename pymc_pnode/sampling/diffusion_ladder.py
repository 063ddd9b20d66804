"""Diffusion ladders: parallel tempering over the diffusion of Fenrir likelihood terms.

The Fenrir likelihood (:func:`pymc_pnode.Fenrir`) depends on the diffusion
``kappa`` of the probabilistic ODE solver.  A large ``kappa`` makes the
physics-enhanced prior of the ODE solution wide, the probabilistic solution
then interpolates the data and the likelihood surface over the ODE parameters
becomes smooth -- the "hot" end used by diffusion tempering for optimisation
(``pymc_pnode.diffusion_tempering``).  Making ``kappa`` a PyTensor shared
variable and laddering it over the replicas of :class:`ParallelTempering` is the
Bayesian counterpart: replica ``k`` samples the posterior under the Fenrir
likelihood with diffusion ``kappa_k``, and the cold replica reports draws for
the cold diffusion.

This module builds such ladders; the sampler itself treats them like any other
``shared_ladder``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pytensor.compile.sharedvalue import SharedVariable

from pymc_pnode.sampling.ladder import validate_n_replicas

__all__ = ["diffusion_ladder", "geometric_diffusions"]


def _positive(value: Any, name: str) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}.") from err
    if not (math.isfinite(out) and out > 0.0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}.")
    return out


def geometric_diffusions(
    cold: float, hot: float, n_replicas: int, *, warm: float | None = None
) -> np.ndarray:
    """Geometric ladder of diffusion values, cold (small) to hot (large).

    Parameters
    ----------
    cold : float
        Diffusion of the cold replica (whose draws are reported), ``> 0``.
    hot : float
        Diffusion of the hottest replica, ``> cold``.
    n_replicas : int
        Number of replicas ``K >= 2``.
    warm : float, optional
        Diffusion of the first hot replica, ``cold < warm <= hot``.  Replicas
        ``1, ..., K-1`` are then spaced geometrically between ``warm`` and
        ``hot``, instead of all replicas between ``cold`` and ``hot``.  Useful
        because the Fenrir likelihood barely changes while the solver's
        posterior variance is small compared with the observation noise: the
        interesting range of ``kappa`` often starts many decades above the
        cold value.  Requires ``n_replicas >= 3`` unless ``warm == hot``.

    Returns
    -------
    numpy.ndarray
        Float64 array of shape ``(K,)``, strictly increasing, with
        ``ladder[0] == cold`` and ``ladder[-1] == hot``.

    Raises
    ------
    ValueError
        If a value is not positive and finite, ``hot <= cold``, ``warm`` is
        outside ``(cold, hot]``, or ``n_replicas < 2`` (``< 3`` with a
        ``warm`` below ``hot``).

    Examples
    --------
    >>> geometric_diffusions(1.0, 1e4, 5)
    array([1.e+00, 1.e+01, 1.e+02, 1.e+03, 1.e+04])
    >>> geometric_diffusions(1.0, 1e9, 4, warm=1e7)
    array([1.e+00, 1.e+07, 1.e+08, 1.e+09])
    """
    n_replicas = validate_n_replicas(n_replicas)
    cold = _positive(cold, "cold")
    hot = _positive(hot, "hot")
    if not hot > cold:
        raise ValueError(
            f"The hot diffusion must exceed the cold one (large diffusion = hot); got "
            f"cold={cold!r}, hot={hot!r}."
        )
    if warm is None:
        exponents = np.arange(n_replicas, dtype=np.float64) / (n_replicas - 1)
        ladder = 10.0 ** (math.log10(cold) + exponents * (math.log10(hot) - math.log10(cold)))
    else:
        warm = _positive(warm, "warm")
        if not cold < warm <= hot:
            raise ValueError(f"warm must lie in (cold, hot] = ({cold!r}, {hot!r}], got {warm!r}.")
        if n_replicas == 2:
            if warm != hot:
                raise ValueError(
                    "With 2 replicas the only hot diffusion is `hot`; pass warm=None or "
                    "warm=hot, or use more replicas."
                )
            ladder = np.array([cold, hot])
        else:
            exponents = np.arange(n_replicas - 1, dtype=np.float64) / (n_replicas - 2)
            hot_part = 10.0 ** (math.log10(warm) + exponents * (math.log10(hot) - math.log10(warm)))
            ladder = np.concatenate([[cold], hot_part])
    # Pin the end points exactly (10 ** log10(.) may be off by one ulp).
    ladder[0] = cold
    ladder[-1] = hot
    if warm is not None:
        ladder[1] = warm
    if np.any(np.diff(ladder) <= 0.0):
        raise ValueError(
            f"The diffusion ladder must be strictly increasing; got {ladder.tolist()}. "
            "Use fewer replicas or a wider range."
        )
    return ladder


def diffusion_ladder(
    diffusion: SharedVariable,
    hot: float,
    n_replicas: int,
    *,
    warm: float | None = None,
    cold: float | None = None,
) -> dict[SharedVariable, list[float]]:
    """A ``shared_ladder`` over the diffusion of Fenrir terms, for :class:`ParallelTempering`.

    Parameters
    ----------
    diffusion : pytensor shared variable
        Scalar shared variable passed as ``diffusion`` to one or more
        :func:`pymc_pnode.Fenrir` terms (``pytensor.shared(kappa_cold)`` or
        ``pm.Data("kappa", kappa_cold)``).
    hot : float
        Diffusion of the hottest replica.  Choose it so that the Fenrir
        likelihood is (nearly) flat over the region the modes lie in, or so
        that it is unimodal: large enough that the probabilistic solution can
        interpolate the data.
    n_replicas : int
        Number of replicas ``K >= 2``.
    warm : float, optional
        Diffusion of the first hot replica; see :func:`geometric_diffusions`.
    cold : float, optional
        Diffusion of the cold replica.  Defaults to the current value of
        ``diffusion``; other values trigger the sampler's warning that the
        reported draws and the model's own value disagree.

    Returns
    -------
    dict
        ``{diffusion: [kappa_0, ..., kappa_{K-1}]}``, strictly increasing,
        ready for ``ParallelTempering(shared_ladder=...)`` or
        ``sample_pt(shared_ladder=...)``.  Combine with ``betas`` or
        ``beta_min`` to temper the likelihood power as well.

    Raises
    ------
    TypeError
        If ``diffusion`` is not a shared variable.
    ValueError
        If ``diffusion`` is not a scalar of floating-point dtype, or the
        ladder values are invalid (see :func:`geometric_diffusions`).

    Examples
    --------
    >>> import pytensor
    >>> kappa = pytensor.shared(1.0, name="kappa")
    >>> ladder = diffusion_ladder(kappa, hot=1e10, n_replicas=5, warm=1e7)
    >>> ladder[kappa]
    [1.0, 10000000.0, 100000000.0, 1000000000.0, 10000000000.0]
    """
    if not isinstance(diffusion, SharedVariable):
        raise TypeError(
            "diffusion must be the PyTensor shared variable used as the Fenrir diffusion "
            f"(pytensor.shared or pm.Data); got {type(diffusion).__name__}."
        )
    current = np.asarray(diffusion.get_value(borrow=True))
    if current.ndim != 0 or current.dtype.kind != "f":
        raise ValueError(
            f"The diffusion {diffusion.name!r} must be a floating-point scalar; got dtype "
            f"{current.dtype} and shape {current.shape}."
        )
    cold_value = float(current) if cold is None else cold
    values = geometric_diffusions(cold_value, hot, n_replicas, warm=warm)
    return {diffusion: [float(v) for v in values]}
