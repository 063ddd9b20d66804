"""One-call parallel tempering sampling on top of :func:`pymc.sample`."""

from __future__ import annotations

import inspect
from typing import Any

import arviz as az
import pymc as pm
from pymc.model import Model, modelcontext

from pymc_pnode.sampling.parallel_tempering import ParallelTempering
from pymc_pnode.sampling.replica_dims import label_replica_dims

__all__ = ["sample_pt"]

# Keyword arguments routed to the step method rather than to pm.sample.
_STEP_KWARGS = frozenset(inspect.signature(ParallelTempering.__init__).parameters) - {
    "self",
    "model",
    "n_replicas",
    "rng",
    "compile_kwargs",
}


def sample_pt(
    draws: int = 1000,
    tune: int = 1000,
    n_replicas: int | None = None,
    chains: int | None = None,
    cores: int | None = None,
    model: Model | None = None,
    **kwargs: Any,
) -> az.InferenceData:
    """Sample a model with :class:`ParallelTempering` through :func:`pymc.sample`.

    Parameters
    ----------
    draws : int, default 1000
        Draws per chain kept after tuning.
    tune : int, default 1000
        Tuning iterations per chain (ladder and proposal adaptation).
    n_replicas : int, optional
        Number of replicas; defaults to the ladder length or 8.
    chains, cores : int, optional
        As in :func:`pymc.sample`.
    model : pymc.Model, optional
        Defaults to the model on the context stack.
    **kwargs
        Arguments of :class:`ParallelTempering` (``vars``, ``betas``,
        ``beta_min``, ``shared_ladder``, ``tempering``, ``adapt_betas``,
        ``move``, ``swap_scheme``, ``n_moves``, ``ladder_adapt_rate``,
        ``initial_point``, ``blocked``) are passed to the step method;
        ``compile_kwargs`` goes to both; everything else (``random_seed``,
        ``progressbar``, ``initvals``, ...) goes to :func:`pymc.sample`.

    Returns
    -------
    arviz.InferenceData
        Posterior draws of the cold replica with the parallel tempering
        statistics in ``sample_stats`` (per-replica statistics on dimension
        ``replica``, per-pair statistics on ``replica_pair``; see
        :func:`label_replica_dims`).
    """
    model = modelcontext(model)
    step_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in _STEP_KWARGS}
    if "compile_kwargs" in kwargs:
        step_kwargs["compile_kwargs"] = kwargs["compile_kwargs"]
    if kwargs.pop("return_inferencedata", True) is False:
        raise ValueError("sample_pt always returns InferenceData; drop return_inferencedata.")
    with model:
        step = ParallelTempering(n_replicas=n_replicas, model=model, **step_kwargs)
        idata = pm.sample(
            draws=draws,
            tune=tune,
            step=step,
            chains=chains,
            cores=cores,
            model=model,
            return_inferencedata=True,
            **kwargs,
        )
    return label_replica_dims(idata)
