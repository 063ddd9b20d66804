"""Parallel tempering (replica exchange) as a PyMC step method."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pymc.blocking import RaveledVars, StatsType
from pymc.exceptions import SamplingError
from pymc.model import modelcontext
from pymc.pytensorf import continuous_types
from pymc.stats.convergence import SamplerWarning, WarningType
from pymc.step_methods.arraystep import ArrayStepShared
from pymc.step_methods.compound import StepMethodState
from pymc.step_methods.state import dataclass_state
from pymc.util import RandomGenerator, get_value_vars_from_user_vars
from rich.progress import TextColumn
from rich.table import Column

from pymc_pnode.sampling.acceptance import metropolis_accept
from pymc_pnode.sampling.ladder import (
    DEFAULT_BETA_MIN,
    DEFAULT_N_REPLICAS,
    LadderAdapter,
    geometric_betas,
    validate_betas,
    validate_n_replicas,
)
from pymc_pnode.sampling.moves import MoveSpec, ReplicaMove, make_replica_moves
from pymc_pnode.sampling.shared_ladder import SharedLadder
from pymc_pnode.sampling.swaps import SWAP_SCHEMES, CommunicationCheck, RoundTripCounter, select_swap_pairs
from pymc_pnode.sampling.tempered_target import (
    TEMPERING_MODES,
    LogDensityTerms,
    ReplicaState,
    TemperedTarget,
)

__all__ = ["ParallelTempering", "ParallelTemperingState"]


@dataclass_state
class ParallelTemperingState(StepMethodState):
    """Everything that changes while a chain runs (see ``BlockedStep.sampling_state``).

    PyMC restores this state before each sequentially sampled chain, so
    chains never inherit replicas or adaptation from one another.
    """

    tune: bool
    betas: np.ndarray
    replicas: Any
    moves: Any
    ladder_adapter: Any
    round_trips: Any
    communication: Any
    swap_round: int
    swap_prob_sum: np.ndarray
    swap_attempts: np.ndarray
    extra_snapshot: Any


def _rebuild(cls: type) -> ParallelTempering:
    # Bypass BlockedStep.__new__, which needs a model context; the pickled
    # __dict__ holds everything the step needs.
    return object.__new__(cls)


class ParallelTempering(ArrayStepShared):
    r"""Parallel tempering (replica exchange) step method.

    ``K`` replicas of the sampled variables are kept inside the step.  Replica
    ``k`` targets

    .. math:: \log \pi_k(x) = V(x; s_k) + \beta_k D(x; s_k),

    where ``V = model.varlogp`` is the prior term (with Jacobians), ``D =
    model.datalogp`` the likelihood and potential terms, ``beta_k`` the inverse
    temperature and ``s_k`` the replica's values of optionally laddered shared
    variables.  Every iteration each replica makes ``n_moves`` within-replica
    moves, then adjacent replicas propose to exchange their states.  The
    draw reported to PyMC is the state of the cold replica (``beta_0 = 1``,
    cold shared values), so chains, multiprocessing, progress bars and
    ``InferenceData`` all come from :func:`pymc.sample`.

    Parameters
    ----------
    vars : list of TensorVariable, optional
        Continuous variables to sample; defaults to all continuous free
        variables.  Other variables may be sampled by other step methods,
        but then the hot replicas condition on the cold chain's values of
        those variables, which makes the combined sampler approximate.
    n_replicas : int, optional
        Number of replicas ``K >= 2``.  Defaults to the length of ``betas`` or
        of the shared ladder, or 8.
    betas : sequence of float, optional
        Inverse temperatures, non-increasing, in ``(0, 1]``, starting at 1.
        Defaults to the geometric ladder ``beta_min ** (k / (K - 1))``, or to
        all ones when only a ``shared_ladder`` is given.
    beta_min : float, optional
        Hottest inverse temperature of the default geometric ladder
        (default 1e-3).  Mutually exclusive with ``betas``.
    shared_ladder : mapping, optional
        ``{shared_variable_or_name: [v_0, ..., v_{K-1}]}``.  Replica ``k``
        evaluates the model with the shared variable set to ``v_k``; ``v_0``
        is the cold value.  Combine with ``betas``/``beta_min`` to temper the
        likelihood as well.
    tempering : {"likelihood", "posterior"}, default "likelihood"
        Whether ``beta`` multiplies only the likelihood (prior stays intact)
        or the whole log-density (``beta_k * (V + D)``, useful when the prior
        itself is multimodal; needs proper priors to stay integrable).
    adapt_betas : bool, optional
        Adapt the ladder during tuning towards equal swap rates (hottest and
        coldest ``beta`` fixed).  Defaults to True for the default geometric
        ladder and False for user-given ladders.
    move : str, ReplicaMove, sequence or callable, default "metropolis"
        Within-replica move: ``"metropolis"`` (adaptive random walk),
        ``"hmc"``, a :class:`~pymc_pnode.sampling.moves.ReplicaMove` template
        (deep-copied per replica), one move per replica, or a factory
        ``move(k) -> ReplicaMove``.
    swap_scheme : {"even_odd", "random_pair"}, default "even_odd"
        Deterministic alternation of even and odd adjacent pairs, or one
        random adjacent pair per iteration.
    n_moves : int, default 1
        Within-replica moves per swap round (per reported draw).
    ladder_adapt_rate : float, default 0.1
        Initial gain of the ladder adaptation.
    model : pymc.Model, optional
        Defaults to the model on the context stack.
    rng : RandomGenerator, optional
        Seed or generator; :func:`pymc.sample` overrides it per chain.
    initial_point : dict, optional
        Point used for shapes; defaults to ``model.initial_point()``.
    compile_kwargs : dict, optional
        Passed to :func:`pymc.pytensorf.compile`.
    blocked : bool, default True
        Kept for PyMC compatibility; all variables are updated jointly.

    Raises
    ------
    ValueError
        For invalid ladders (first beta not 1, betas outside ``(0, 1]``,
        increasing betas, ``K < 2``), inconsistent replica counts, shared
        ladders of the wrong length or shape, unknown option values, or
        discrete variables in ``vars``.

    Notes
    -----
    Sampler statistics (``idata.sample_stats``), with ``K`` replicas:

    ``accept`` ()
        Move acceptance probability of the cold replica.
    ``replica_accept`` (K,)
        Move acceptance probability of every replica.
    ``replica_scale`` (K,)
        Proposal scale (random walk) or step size (HMC) of every replica.
    ``swap_accept`` (K-1,)
        Acceptance probability of the swap of pair ``(k, k+1)``; NaN when the
        pair was not attempted in this iteration.
    ``swap_accepted`` (K-1,)
        Whether that swap happened.
    ``swap_rate`` (K-1,)
        Running mean of ``swap_accept`` since the start of the current phase
        (tuning or sampling).
    ``betas`` (K,)
        Inverse temperatures used in this iteration.
    ``round_trips`` ()
        Cold-to-hot-to-cold round trips completed since the end of tuning.
    ``model_logp`` ()
        Log-density of the cold replica.
    ``warning``
        A ``SamplerWarning`` (logged by PyMC, as NUTS's divergences are) in the iteration where, after
        tuning, a neighbouring pair is found to swap or a replica's move to accept in under 1 % of
        attempts (:class:`~pymc_pnode.sampling.swaps.CommunicationCheck`); ``None`` otherwise.
    ``ladder_<name>`` (K,)
        Per-replica values of every scalar shared variable in
        ``shared_ladder`` (e.g. ``ladder_kappa`` for a Fenrir diffusion
        called ``kappa``).

    Examples
    --------
    .. code-block:: python

        with model:
            idata = pm.sample(step=ParallelTempering(n_replicas=8), chains=2)
    """

    name = "parallel_tempering"
    default_blocked = True
    # Shapes depend on the number of replicas, so the real dict is set per instance.
    stats_dtypes_shapes: dict[str, tuple[type, list[int]]] = {}
    _state_class = ParallelTemperingState

    def __init__(
        self,
        vars: Sequence[Any] | None = None,
        n_replicas: int | None = None,
        betas: Sequence[float] | np.ndarray | None = None,
        *,
        beta_min: float | None = None,
        shared_ladder: Mapping[Any, Sequence[Any]] | None = None,
        tempering: str = "likelihood",
        adapt_betas: bool | None = None,
        move: MoveSpec = "metropolis",
        swap_scheme: str = "even_odd",
        n_moves: int = 1,
        ladder_adapt_rate: float = 0.1,
        model: Any = None,
        rng: RandomGenerator = None,
        initial_point: dict[str, np.ndarray] | None = None,
        compile_kwargs: dict[str, Any] | None = None,
        blocked: bool = True,
    ) -> None:
        model = modelcontext(model)
        if initial_point is None:
            initial_point = model.initial_point()
        vars = self._resolve_vars(vars, model)

        ladder = SharedLadder(shared_ladder, model) if shared_ladder is not None else None
        betas_arr = self._resolve_betas(n_replicas, betas, beta_min, ladder)
        n_rep = betas_arr.size

        if tempering not in TEMPERING_MODES:
            raise ValueError(f"tempering must be one of {TEMPERING_MODES}, got {tempering!r}.")
        if swap_scheme not in SWAP_SCHEMES:
            raise ValueError(f"swap_scheme must be one of {SWAP_SCHEMES}, got {swap_scheme!r}.")
        if isinstance(n_moves, bool) or int(n_moves) != n_moves or n_moves < 1:
            raise ValueError(f"n_moves must be a positive integer, got {n_moves!r}.")
        if not ladder_adapt_rate > 0.0:
            raise ValueError(f"ladder_adapt_rate must be positive, got {ladder_adapt_rate!r}.")

        if tempering == "likelihood" and ladder is None and not (
            model.observed_RVs or model.potentials
        ):
            warnings.warn(
                "The model has no observed variables or potentials, so tempering the "
                "likelihood changes nothing; use tempering='posterior' to temper the prior.",
                UserWarning,
                stacklevel=2,
            )

        strictly_decreasing = bool(np.all(np.diff(betas_arr) < 0.0))
        if adapt_betas is None:
            adapt_betas = betas is None and strictly_decreasing
        elif adapt_betas and not strictly_decreasing:
            raise ValueError(
                "adapt_betas=True needs strictly decreasing betas; got "
                f"{betas_arr.tolist()}. Pass beta_min or distinct betas."
            )

        ndim = int(sum(np.asarray(initial_point[v.name]).size for v in vars))
        moves = make_replica_moves(move, betas_arr, ndim)
        requires_grad = any(m.requires_grad for m in moves)

        self._terms = LogDensityTerms(
            model,
            vars,
            ladder.variables if ladder is not None else [],
            initial_point,
            compute_grads=requires_grad,
            compile_kwargs=compile_kwargs,
        )
        super().__init__(vars, self._terms.extra_shared, blocked=blocked, rng=rng)

        self.n_replicas = n_rep
        self.tempering = tempering
        self.swap_scheme = swap_scheme
        self.n_moves = int(n_moves)
        self.adapt_betas = bool(adapt_betas)
        self.ladder_adapt_rate = float(ladder_adapt_rate)
        self.shared_ladder = ladder
        if ladder is None:
            self._replica_shared: list[tuple[np.ndarray, ...]] = [()] * n_rep
            self._pair_reevaluate = [False] * (n_rep - 1)
        else:
            self._replica_shared = [ladder.replica_values(k) for k in range(n_rep)]
            # Swaps between replicas with equal shared values can reuse cached terms.
            self._pair_reevaluate = [ladder.differs(k) for k in range(n_rep - 1)]

        self._initial_betas = betas_arr
        self._untuned_moves = moves
        # Scalar shared ladders (e.g. a Fenrir diffusion) are reported per draw like betas.
        self._ladder_stats = ladder.stat_values() if ladder is not None else {}
        self._set_stats_metadata(n_rep)
        self.tune = True
        self._reset_chain()

    # ------------------------------------------------------------------ setup

    @staticmethod
    def _resolve_vars(vars: Sequence[Any] | None, model: Any) -> list[Any]:
        if vars is None:
            value_vars = list(model.continuous_value_vars)
        else:
            value_vars = get_value_vars_from_user_vars(vars, model)
        if not value_vars:
            raise ValueError("ParallelTempering needs at least one continuous variable.")
        discrete = [v.name for v in value_vars if v.dtype not in continuous_types]
        if discrete:
            raise ValueError(
                f"ParallelTempering only samples continuous variables; {discrete} are discrete. "
                "Assign them to another step method."
            )
        others = [v.name for v in model.value_vars if v not in value_vars]
        if others:
            warnings.warn(
                f"ParallelTempering does not sample {others}. Those variables are updated by "
                "other step methods given the cold replica only, while the hot replicas "
                "condition on their current values; the combined sampler is then only "
                "approximately invariant. Include all continuous variables when possible.",
                UserWarning,
                stacklevel=3,
            )
        return value_vars

    @staticmethod
    def _resolve_betas(
        n_replicas: int | None,
        betas: Sequence[float] | np.ndarray | None,
        beta_min: float | None,
        ladder: SharedLadder | None,
    ) -> np.ndarray:
        sizes: dict[str, int] = {}
        if n_replicas is not None:
            sizes["n_replicas"] = validate_n_replicas(n_replicas)
        betas_arr = None
        if betas is not None:
            if beta_min is not None:
                raise ValueError("Pass either betas or beta_min, not both.")
            betas_arr = validate_betas(betas)
            sizes["len(betas)"] = betas_arr.size
        if ladder is not None:
            sizes["length of shared_ladder"] = ladder.n_replicas
        if len(set(sizes.values())) > 1:
            raise ValueError(f"Inconsistent number of replicas: {sizes}.")
        n_rep = next(iter(sizes.values())) if sizes else DEFAULT_N_REPLICAS
        if betas_arr is not None:
            return betas_arr
        if ladder is not None and beta_min is None:
            # A pure shared-variable ladder: no likelihood power.
            return np.ones(n_rep)
        return geometric_betas(n_rep, DEFAULT_BETA_MIN if beta_min is None else beta_min)

    def _set_stats_metadata(self, n_rep: int) -> None:
        shapes: dict[str, tuple[type, list[int]]] = {
            "accept": (np.float64, []),
            "replica_accept": (np.float64, [n_rep]),
            "replica_scale": (np.float64, [n_rep]),
            "swap_accept": (np.float64, [n_rep - 1]),
            "swap_accepted": (bool, [n_rep - 1]),
            "swap_rate": (np.float64, [n_rep - 1]),
            "betas": (np.float64, [n_rep]),
            "round_trips": (np.int64, []),
            "model_logp": (np.float64, []),
            "warning": (SamplerWarning, None),
        }
        for name in self._ladder_stats:
            shapes[name] = (np.float64, [n_rep])
        self.stats_dtypes_shapes = shapes
        # PyMC's NDArray trace stores one scalar per draw and stat unless the
        # dtype is object; vector stats are stacked back into arrays on export.
        self.stats_dtypes = [
            {name: (object if shape else dtype) for name, (dtype, shape) in shapes.items()}
        ]

    def _reset_chain(self) -> None:
        """Return to the untuned, uninitialised state of a fresh chain."""
        n_rep = self.n_replicas
        self.betas = self._initial_betas.copy()
        self.ladder_adapter = (
            LadderAdapter(self.betas, rate=self.ladder_adapt_rate) if self.adapt_betas else None
        )
        self.moves: list[ReplicaMove] = copy.deepcopy(self._untuned_moves)
        self.replicas: list[ReplicaState] | None = None
        self.round_trips = RoundTripCounter(n_rep)
        self.communication = CommunicationCheck(n_rep)
        self.swap_round = 0
        self.swap_prob_sum = np.zeros(n_rep - 1)
        self.swap_attempts = np.zeros(n_rep - 1, dtype=np.int64)
        self.extra_snapshot: list[np.ndarray] | None = None

    def reset_tuning(self) -> None:
        """Restart adaptation and replicas (PyMC calls this at the start of each chain)."""
        self._reset_chain()

    def stop_tuning(self) -> None:
        """Freeze the ladder and the moves; restart swap and round-trip counters."""
        self.tune = False
        for m in self.moves:
            m.stop_tuning()
        self.round_trips.count = 0
        self.communication = CommunicationCheck(self.n_replicas)
        self.swap_prob_sum[:] = 0.0
        self.swap_attempts[:] = 0

    # --------------------------------------------------------------- sampling

    def _target(self, k: int) -> TemperedTarget:
        return TemperedTarget(self._terms, self.betas[k], self._replica_shared[k], self.tempering)

    def _snapshot_extra(self) -> list[np.ndarray]:
        return [np.array(s.get_value(borrow=True), copy=True) for s in self.shared.values()]

    def _initialize(self, x0: np.ndarray) -> None:
        states: list[ReplicaState] = []
        for k in range(self.n_replicas):
            if k > 0 and not any(
                not np.array_equal(a, b)
                for a, b in zip(self._replica_shared[k], self._replica_shared[0])
            ):
                # Same shared values as the cold replica: the cached terms are identical.
                state = states[0]
            else:
                try:
                    state = self._terms.evaluate(x0, self._replica_shared[k], safe=False)
                except Exception as err:
                    raise SamplingError(
                        f"Evaluating the log-density of replica {k} at the initial point failed: "
                        f"{err}"
                    ) from err
            if not np.isfinite(self._target(k).logp(state)):
                raise SamplingError(
                    f"Replica {k} (beta={self.betas[k]:.3g}) has a non-finite log-density at the "
                    "initial point; choose other initial values (initvals)."
                )
            states.append(state)
        self.replicas = states

    def _sync_with_point(self, x0: np.ndarray) -> None:
        """Make the cached replica states consistent with the incoming point."""
        if self.replicas is None:
            self.extra_snapshot = self._snapshot_extra()
            self._initialize(x0)
            return
        if self.shared:
            snapshot = self._snapshot_extra()
            if any(not np.array_equal(a, b) for a, b in zip(snapshot, self.extra_snapshot)):
                # Other step methods moved variables we condition on: refresh all caches.
                self.extra_snapshot = snapshot
                self.replicas = [
                    self._terms.evaluate(s.x, self._replica_shared[k])
                    for k, s in enumerate(self.replicas)
                ]
        if not np.array_equal(x0, self.replicas[0].x):
            self.replicas[0] = self._terms.evaluate(x0, self._replica_shared[0])
        for k in range(1, self.n_replicas):
            if not self.replicas[k].finite:
                # A hot state left without support (the conditioning variables moved):
                # restart it from the cold position, which has support.
                restart = self._terms.evaluate(x0, self._replica_shared[k])
                if restart.finite:
                    self.replicas[k] = restart

    def astep(self, q0: RaveledVars) -> tuple[RaveledVars, StatsType]:
        """One iteration: within-replica moves, then a round of swaps."""
        self._sync_with_point(np.asarray(q0.data, dtype=self._terms.dtype))
        assert self.replicas is not None

        replica_accept = np.empty(self.n_replicas)
        for k in range(self.n_replicas):
            target = self._target(k)
            state = self.replicas[k]
            total = 0.0
            for _ in range(self.n_moves):
                state, prob = self.moves[k].step(state, target, self.rng, self.tune)
                total += prob
            self.replicas[k] = state
            replica_accept[k] = total / self.n_moves

        swap_accept, swap_accepted = self._swap_round()
        swap_rate = self.swap_prob_sum / np.maximum(self.swap_attempts, 1)
        warning = None
        if not self.tune:
            message = self.communication.record(replica_accept, swap_rate, self.swap_attempts, self.betas,
                                                self._ladder_stats)
            if message is not None:
                warning = SamplerWarning(WarningType.BAD_ACCEPTANCE, message, "warn")
        cold = self.replicas[0]
        stats = {
            "accept": float(replica_accept[0]),
            "replica_accept": replica_accept,
            "replica_scale": np.array([m.scale for m in self.moves], dtype=np.float64),
            "swap_accept": swap_accept,
            "swap_accepted": swap_accepted,
            "swap_rate": swap_rate,
            "betas": self.betas.copy(),
            "round_trips": int(self.round_trips.count),
            "model_logp": float(cold.var_logp + cold.data_logp),
            "warning": warning,
        }
        for name, values in self._ladder_stats.items():
            stats[name] = values.copy()
        return RaveledVars(cold.x.copy(), q0.point_map_info), [stats]

    def _swap_round(self) -> tuple[np.ndarray, np.ndarray]:
        assert self.replicas is not None
        n_pairs = self.n_replicas - 1
        swap_accept = np.full(n_pairs, np.nan)
        swap_accepted = np.zeros(n_pairs, dtype=bool)
        pairs = select_swap_pairs(self.swap_scheme, self.swap_round, self.n_replicas, self.rng)
        self.swap_round += 1
        for j in pairs:
            lo, hi = self._target(j), self._target(j + 1)
            state_lo, state_hi = self.replicas[j], self.replicas[j + 1]
            if self._pair_reevaluate[j]:
                hi_as_lo, lo_as_hi = lo.evaluate(state_hi.x), hi.evaluate(state_lo.x)
            else:
                hi_as_lo, lo_as_hi = state_hi, state_lo
            log_ratio = (
                lo.logp(hi_as_lo) + hi.logp(lo_as_hi) - lo.logp(state_lo) - hi.logp(state_hi)
            )
            accepted, prob = metropolis_accept(log_ratio, self.rng)
            swap_accept[j] = prob
            swap_accepted[j] = accepted
            if accepted:
                self.replicas[j], self.replicas[j + 1] = hi_as_lo, lo_as_hi
                self.round_trips.swap(j)
        self.round_trips.end_round()
        self.swap_prob_sum[pairs] += swap_accept[pairs]
        self.swap_attempts[pairs] += 1
        if self.tune and self.ladder_adapter is not None:
            self.betas = self.ladder_adapter.update(pairs, swap_accept[pairs])
        return swap_accept, swap_accepted

    # ------------------------------------------------------- PyMC integration

    def __reduce__(self) -> tuple[Any, ...]:
        # BlockedStep pickles its constructor arguments, which include the model;
        # models do not survive the standard pickle module, and the step needs
        # nothing but its own attributes once constructed.
        state = {k: v for k, v in self.__dict__.items() if k != "_BlockedStep__newargs"}
        return (_rebuild, (type(self),), state)

    @staticmethod
    def _progressbar_config(n_chains: int = 1) -> tuple[list[TextColumn], dict[str, list[Any]]]:
        columns = [
            TextColumn("{task.fields[accept_rate]:0.2f}", table_column=Column("Accept", ratio=1)),
            TextColumn(
                "{task.fields[min_swap_rate]:0.2f}", table_column=Column("Min swap", ratio=1)
            ),
            TextColumn("{task.fields[round_trips]}", table_column=Column("Round trips", ratio=1)),
        ]
        stats = {
            "accept_rate": [0.0] * n_chains,
            "min_swap_rate": [0.0] * n_chains,
            "round_trips": [0] * n_chains,
        }
        return columns, stats

    @staticmethod
    def _make_progressbar_update_functions() -> tuple[Any, ...]:
        def update_stats(step_stats: dict[str, Any]) -> dict[str, Any]:
            return {
                "accept_rate": step_stats["accept"],
                "min_swap_rate": float(np.min(step_stats["swap_rate"])),
                "round_trips": step_stats["round_trips"],
            }

        return (update_stats,)
