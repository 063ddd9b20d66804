"""Simulation-based calibration of a PyMC model (Talts, Betancourt, Simpson, Vehtari & Gelman, 2018).

For each replicate: draw the parameters and the data from the prior predictive of a simulator (by default the
model itself), condition the model on the simulated data, sample its posterior, and record the rank of each
true parameter value among ``L`` posterior draws. If the posterior is the exact posterior of the simulator's
joint distribution, every rank is uniform on ``{0, …, L}`` (Talts et al., 2018, Theorem 1). A likelihood that
approximates the simulator's (a PN likelihood, a coarse solver) is calibrated to the extent that its ranks
stay uniform.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Mapping

import numpy as np
import pymc as pm
import pytensor.tensor as pt

from pymc_pnode.studies.runner import run_study
from pymc_pnode.studies.transport import PortableModels

#: Posterior sampling of each replicate unless ``sample_kwargs`` says otherwise.
DEFAULT_SAMPLE_KWARGS = dict(draws=500, tune=500, chains=2, cores=1, progressbar=False,
                             compute_convergence_checks=False)
_MAX_REDRAWS = 100


def condition_on_data(model: pm.Model, data: Mapping[str, np.ndarray]) -> pm.Model:
    """A copy of ``model`` whose observed variables hold ``data`` (by name) instead of their values.

    Works on the model's graph (``pymc.model.fgraph``): the observed value of each named variable is replaced,
    whether it was given as an array or as ``pm.Data``; everything else — priors, likelihood terms such as
    ``pn.Fenrir``, potentials, coords — is kept.
    """
    from pymc.model.fgraph import ModelObservedRV, fgraph_from_model, model_from_fgraph
    from pytensor.compile.sharedvalue import SharedVariable

    observed = {rv.name for rv in model.observed_RVs}
    unknown = set(data) - observed
    if unknown:
        raise ValueError(f"data: {sorted(unknown)} are not observed variables of the model (observed: "
                         f"{sorted(observed)})")
    fgraph, _ = fgraph_from_model(model, inlined_views=True)
    for node in list(fgraph.apply_nodes):
        if not isinstance(node.op, ModelObservedRV) or node.outputs[0].name not in data:
            continue
        value = node.inputs[1]
        new = np.asarray(data[node.outputs[0].name], dtype=value.dtype)
        if not np.all(np.isfinite(new)):
            # Likelihoods fix their missing-value masks when the model is built (pn.Fenrir among them).
            raise ValueError(f"data[{node.outputs[0].name!r}] has non-finite values: conditioning cannot add "
                             "missing values; rebuild the model with them instead")
        if new.shape != tuple(value.type.shape) and None not in value.type.shape:
            raise ValueError(f"data[{node.outputs[0].name!r}] has shape {new.shape}, the model's observed value "
                             f"{tuple(value.type.shape)}")
        root = value.owner.inputs[0] if value.owner is not None and not value.owner.inputs[1:] else value
        if isinstance(root, SharedVariable):
            root.set_value(new.astype(root.type.dtype))
        else:
            fgraph.replace(value, value.type.filter_variable(pt.constant(new, dtype=value.dtype)),
                           import_missing=True)
    return model_from_fgraph(fgraph, mutate_fgraph=True)


def scalar_parameters(model: pm.Model, var_names=None) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The model's free parameters (all, or those named) as scalars: label → (variable name, index), e.g.
    ``"theta[c]"`` → ``("theta", (2,))``; labels use the variable's coords where it has dims."""
    shapes = model.eval_rv_shapes()
    free = {rv.name: rv for rv in model.free_RVs}
    names = list(free) if var_names is None else list(var_names)
    unknown = [name for name in names if name not in free]
    if unknown:
        raise ValueError(f"var_names: {unknown} are not free variables of the model (free: {list(free)})")
    labels: dict[str, tuple[str, tuple[int, ...]]] = {}
    for rv in (free[name] for name in names):
        shape = tuple(int(s) for s in shapes[rv.name])
        dims = model.named_vars_to_dims.get(rv.name) or (None,) * len(shape)
        for index in np.ndindex(*shape):
            parts = [str(model.coords[dim][i]) if model.coords.get(dim) is not None else str(i)
                     for dim, i in zip(dims, index)]
            labels[f"{rv.name}[{','.join(parts)}]" if index else rv.name] = (rv.name, index)
    return labels


class SimulatedReplicate:
    """One SBC replicate, as a picklable callable for :func:`~pymc_pnode.studies.run_study`.

    ``replicate(task)`` with ``task = {"replicate": i, "seed": s}`` draws (parameters, data) from the
    simulator with seed ``s``, samples the posterior of the conditioned model and returns one row: the rank of
    each scalar parameter among ``n_rank_draws`` evenly thinned posterior draws, and the replicate's
    diagnostics (divergences, largest R-hat, smallest bulk ESS, redraws of invalid simulations, seconds).
    The compiled simulator is kept between the replicates a worker runs.
    """

    def __init__(self, model: pm.Model, simulator: pm.Model, sample_kwargs: Mapping[str, Any], n_rank_draws: int,
                 var_names=None):
        self._models = PortableModels(model=model, simulator=simulator)
        self.sample_kwargs = dict(sample_kwargs)
        self.n_rank_draws = n_rank_draws
        self.parameters = scalar_parameters(model, var_names)
        self.ranked_names = list(dict.fromkeys(name for name, _ in self.parameters.values()))
        self.observed_names = [rv.name for rv in model.observed_RVs]
        missing = [name for name in self.ranked_names + self.observed_names if name not in simulator.named_vars]
        if missing:
            raise ValueError(f"simulator: has no variables named {missing} (it must draw every ranked free "
                             "variable and every observed variable of the model, by name)")
        self._draw = None

    @property
    def model(self) -> pm.Model:
        return self._models["model"]

    @property
    def simulator(self) -> pm.Model:
        return self._models["simulator"]

    def __getstate__(self):
        return {**self.__dict__, "_draw": None}

    def _compile_draw(self):
        sim = self.simulator
        outputs = [sim[name] for name in self.ranked_names + self.observed_names]
        # Potentials of the simulator (e.g. pn.DifferentialEquation's failed-solve flag) veto a draw.
        veto = [pm.math.sum(p) for p in sim.potentials]
        fn = pm.pytensorf.compile(inputs=[], outputs=outputs + veto)
        rngs = pm.pytensorf.find_rng_nodes(outputs + veto)
        return fn, rngs

    def simulate(self, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int]:
        """True parameter values and data for ``seed``, and how many invalid draws were discarded."""
        if self._draw is None:
            self._draw = self._compile_draw()
        fn, rngs = self._draw
        pm.pytensorf.reseed_rngs(rngs, seed)
        n_ranked, n_drawn = len(self.ranked_names), len(self.ranked_names) + len(self.observed_names)
        for redraws in range(_MAX_REDRAWS):
            values = fn()
            draws, veto = values[:n_drawn], values[n_drawn:]
            if all(np.all(np.isfinite(v)) for v in draws) and all(np.isfinite(v) for v in veto):
                truth = dict(zip(self.ranked_names, draws[:n_ranked]))
                return truth, dict(zip(self.observed_names, draws[n_ranked:])), redraws
        raise RuntimeError(f"the simulator gave no valid draw (finite values, finite potentials) in {_MAX_REDRAWS} "
                           "tries")

    def __call__(self, task: Mapping[str, int]) -> dict[str, Any]:
        start = time.perf_counter()
        seed = int(task["seed"])
        truth, data, redraws = self.simulate(seed)
        conditioned = condition_on_data(self.model, data)
        with conditioned, _quiet("pymc"):
            idata = pm.sample(**self.sample_kwargs, random_seed=seed)
        rng = np.random.default_rng([seed, 1])
        row: dict[str, Any] = {"replicate": int(task["replicate"]), "seed": seed}
        for label, (name, index) in self.parameters.items():
            draws = idata.posterior[name].values.reshape(-1, *np.shape(truth[name]))[(slice(None), *index)]
            row[label] = posterior_rank(draws, float(truth[name][index]), self.n_rank_draws, rng)
        row.update(_diagnostics(idata, self.ranked_names))
        row.update(redraws=redraws, seconds=time.perf_counter() - start)
        return row


@contextlib.contextmanager
def _quiet(logger_name: str):
    """PyMC's per-fit log lines (sampler choice, timings) hidden while a study samples many posteriors."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def posterior_rank(draws: np.ndarray, truth: float, n_rank_draws: int, rng: np.random.Generator) -> int:
    """Rank of ``truth`` among ``n_rank_draws`` draws thinned evenly from ``draws`` (chains concatenated).

    Ties (possible for discrete or clipped parameters) are broken at random, as Talts et al. (2018) do, so
    that the rank stays uniform under calibration.
    """
    draws = np.asarray(draws, dtype=float).ravel()
    if draws.size < n_rank_draws:
        raise ValueError(f"n_rank_draws={n_rank_draws} exceeds the {draws.size} posterior draws of a replicate")
    kept = draws[np.linspace(0, draws.size - 1, n_rank_draws).round().astype(int)]
    below, ties = int(np.sum(kept < truth)), int(np.sum(kept == truth))
    return below + (int(rng.integers(0, ties + 1)) if ties else 0)


def _diagnostics(idata, names) -> dict[str, float]:
    import arviz as az

    posterior = idata.posterior[names]
    diverging = idata.sample_stats.get("diverging")
    rhat = az.rhat(posterior) if posterior.sizes["chain"] > 1 else None
    ess = az.ess(posterior, method="bulk")
    return {
        "divergences": int(diverging.sum()) if diverging is not None else 0,
        "rhat_max": float(max(float(rhat[v].max()) for v in names)) if rhat is not None else float("nan"),
        "ess_bulk_min": float(min(float(ess[v].min()) for v in names)),
    }


def replicate_seeds(seed, n_replicates: int) -> list[int]:
    """Independent seeds of the replicates (``numpy.random.SeedSequence(seed).spawn``): replicate ``i``'s
    seed depends only on ``seed`` and ``i``, so a study's results do not depend on how it is run."""
    return [int(child.generate_state(1)[0]) for child in np.random.SeedSequence(seed).spawn(n_replicates)]


def sbc(
    model: pm.Model,
    n_replicates: int,
    *,
    simulator: pm.Model | None = None,
    var_names=None,
    sample_kwargs: Mapping[str, Any] | None = None,
    n_rank_draws: int = 100,
    client=None,
    store=None,
    seed=None,
    retries: int = 2,
    progress: bool = True,
    description: str = "sbc",
):
    """Simulation-based calibration ranks of a PyMC model's posterior (Talts et al., 2018, Algorithm 1).

    For each replicate, parameters and data are drawn from the prior predictive of ``simulator`` (default:
    ``model``), ``model``'s observed values are replaced by the simulated data, its posterior is sampled with
    ``pm.sample(**sample_kwargs)``, and the rank of each true parameter among ``n_rank_draws`` posterior
    draws (thinned evenly) is recorded. Replicates run on a dask.distributed cluster with
    :func:`~pymc_pnode.studies.run_study`; with ``store`` given they are recorded there one by one, and a
    rerun resumes.

    Parameters
    ----------
    model : pm.Model
        The model whose posterior is checked, with observed variables.
    n_replicates : int
        Number of replicates (Talts et al. use 1000 for a study; 200 detects gross miscalibration).
    simulator : pm.Model, optional
        The data-generating process, when it is not the model itself: a model with variables of the same
        names as ``model``'s free and observed variables, whose prior predictive draws them jointly — e.g.
        the exact ODE solution plus noise, when ``model`` uses a PN or coarse-solver likelihood. Its priors
        must be ``model``'s for the ranks to be uniform under calibration. A draw with a non-finite value or a
        ``-inf`` potential (a failed solve) is discarded and drawn again (counted in ``redraws``).
    var_names : list of str, optional
        The free variables to rank (default: all). Latent nuisance variables that the simulator does not
        have — e.g. the innovations of a Chkrebtii solution layer — are left out here.
    sample_kwargs : dict, optional
        Arguments of ``pm.sample`` (default :data:`DEFAULT_SAMPLE_KWARGS`: 2 chains × (500 + 500) draws, one
        core; ``nuts_sampler="nutpie"`` works too). ``random_seed`` is set per replicate.
    n_rank_draws : int, default 100
        ``L``, the number of posterior draws each rank is computed among (ranks lie in ``0 … L``). The
        posterior's bulk ESS should exceed it; ``ess_bulk_min`` records it for each replicate.
    client, store, retries, progress, description
        As in :func:`~pymc_pnode.studies.run_study` (default: a ``LocalCluster`` with one worker per core).
    seed : int, optional
        Seed of the study; replicate ``i`` uses the ``i``-th seed spawned from it.

    Returns
    -------
    xarray.Dataset
        One integer variable of ranks per scalar free parameter (named like ``"theta[c]"`` with the model's
        coords), dimension ``replicate``; coordinates along ``replicate``: ``seed``, ``divergences``,
        ``rhat_max``, ``ess_bulk_min`` (over the ranked variables), ``redraws``, ``seconds``; attributes
        ``n_rank_draws`` and ``failed_replicates``.
    """
    if not isinstance(n_replicates, (int, np.integer)) or n_replicates < 1:
        raise ValueError(f"n_replicates must be a positive integer, got {n_replicates!r}")
    if not isinstance(n_rank_draws, (int, np.integer)) or n_rank_draws < 1:
        raise ValueError(f"n_rank_draws must be a positive integer, got {n_rank_draws!r}")
    if not model.observed_RVs:
        raise ValueError("model: has no observed variables to simulate")
    kwargs = {**DEFAULT_SAMPLE_KWARGS, **(sample_kwargs or {})}
    if "random_seed" in kwargs:
        raise ValueError("sample_kwargs: random_seed is set per replicate from seed; pass seed= instead")
    kwargs["return_inferencedata"] = True
    replicate = SimulatedReplicate(model, simulator if simulator is not None else model, kwargs, int(n_rank_draws),
                                   var_names)
    seeds = replicate_seeds(seed, int(n_replicates))
    tasks = {i: {"replicate": i, "seed": s} for i, s in enumerate(seeds)}
    metadata = {"study": "sbc", "model_free": [rv.name for rv in model.free_RVs], "n_replicates": int(n_replicates),
                "seed": repr(seed),
                "n_rank_draws": int(n_rank_draws), "parameters": list(replicate.parameters),
                "sample_kwargs": {k: repr(v) for k, v in sorted(kwargs.items())}}
    result = run_study(replicate, tasks, client=client, store=store, metadata=metadata, retries=retries,
                       progress=progress, description=description)
    return _ranks_dataset(result, list(replicate.parameters), int(n_rank_draws))


def _ranks_dataset(result, labels: list[str], n_rank_draws: int):
    import xarray as xr

    table = result.table
    if len(table) == 0:
        raise RuntimeError(f"no SBC replicate finished ({len(result.failures)} failed: "
                           f"{next(iter(result.failures.values()), '')})")
    table = table.sort_values("replicate")
    coords = {"replicate": table["replicate"].to_numpy()}
    for column in ("seed", "divergences", "rhat_max", "ess_bulk_min", "redraws", "seconds"):
        coords[column] = ("replicate", table[column].to_numpy())
    data = {label: ("replicate", table[label].to_numpy().astype(np.int64)) for label in labels}
    return xr.Dataset(data, coords=coords, attrs={"n_rank_draws": n_rank_draws,
                                                  "failed_replicates": sorted(result.failures)})
