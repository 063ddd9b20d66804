"""Readable dimension names for parallel tempering statistics in InferenceData."""

from __future__ import annotations

import arviz as az
import numpy as np
import xarray as xr

from pymc_pnode.sampling.shared_ladder import LADDER_STAT_PREFIX

__all__ = ["PAIR_STATS", "REPLICA_STATS", "label_replica_dims"]

REPLICA_STATS = ("betas", "replica_accept", "replica_scale")
"""Statistics with one entry per replica (besides the ``ladder_<name>`` statistics of
scalar shared ladders, recognised by their prefix)."""

PAIR_STATS = ("swap_accept", "swap_accepted", "swap_rate")
"""Statistics with one entry per adjacent replica pair ``(k, k + 1)``."""


def label_replica_dims(
    idata: az.InferenceData, replica_dim: str = "replica", pair_dim: str = "replica_pair"
) -> az.InferenceData:
    """Rename the automatic ``<stat>_dim_0`` dimensions of the replica statistics.

    :func:`pymc.sample` names the extra dimension of every vector statistic
    separately (``betas_dim_0``, ``swap_accept_dim_0``, ...).  This puts all
    per-replica statistics on ``replica_dim`` and all per-pair statistics on
    ``pair_dim`` so they can be combined directly.

    Parameters
    ----------
    idata : arviz.InferenceData
        Result of sampling with :class:`ParallelTempering` (modified in place).
    replica_dim, pair_dim : str
        New dimension names.

    Returns
    -------
    arviz.InferenceData
        The same object, for chaining.
    """
    for group in ("sample_stats", "warmup_sample_stats"):
        if group not in idata.groups():
            continue
        ds = idata[group]
        renamed = {}
        sizes: dict[str, int] = {}
        for name, da in ds.data_vars.items():
            old = f"{name}_dim_0"
            per_replica = name in REPLICA_STATS or name.startswith(LADDER_STAT_PREFIX)
            if old in da.dims and (per_replica or name in PAIR_STATS):
                new = replica_dim if per_replica else pair_dim
                da = da.drop_vars(old, errors="ignore").rename({old: new})
                sizes[new] = da.sizes[new]
            renamed[name] = da
        if not sizes:
            continue
        out = xr.Dataset(renamed, attrs=ds.attrs)
        out = out.drop_vars(
            [c for c in out.coords if c.endswith("_dim_0") and c not in out.dims],
            errors="ignore",
        )
        out = out.assign_coords({dim: np.arange(size) for dim, size in sizes.items()})
        setattr(idata, group, out)
    return idata
