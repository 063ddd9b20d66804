"""Interface of within-replica moves and construction of one move per replica.

A *move* is a Markov kernel that, outside tuning, leaves one replica's
:class:`~pymc_pnode.sampling.tempered_target.TemperedTarget` invariant.  Each
replica owns its own move object, so adaptive moves tune a separate proposal
for every temperature.  Moves never hold compiled functions: the target is
passed in on every call, which keeps them cheap to copy and to pickle.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import numpy as np

from pymc_pnode.sampling.adaptation import WindowedAdaptation
from pymc_pnode.sampling.tempered_target import ReplicaState, TemperedTarget

__all__ = ["AdaptiveMove", "MoveSpec", "ReplicaMove", "make_replica_moves"]


class ReplicaMove(ABC):
    """Base class of within-replica Markov kernels.

    Subclasses implement :meth:`step`; they may adapt themselves while
    ``tune`` is True and must be non-adaptive afterwards.
    """

    requires_grad: bool = False
    """Whether :meth:`step` needs gradients of the tempered log-density."""

    def setup(self, ndim: int, beta: float) -> None:  # noqa: B027 -- optional hook
        """Prepare for a replica of dimension ``ndim`` at inverse temperature ``beta``.

        Called once per replica before sampling starts.
        """

    @abstractmethod
    def step(
        self,
        state: ReplicaState,
        target: TemperedTarget,
        rng: np.random.Generator,
        tune: bool,
    ) -> tuple[ReplicaState, float]:
        """Advance one replica.

        Parameters
        ----------
        state : ReplicaState
            Current state; its cached terms are valid for ``target``.
        target : TemperedTarget
            The replica's tempered density.
        rng : numpy.random.Generator
            Random number generator of the step method.
        tune : bool
            Whether the sampler is tuning (adaptation allowed).

        Returns
        -------
        new_state : ReplicaState
            The next state (``state`` itself if the move was rejected).
        accept_prob : float
            Metropolis acceptance probability of the proposal, in ``[0, 1]``.
        """

    def stop_tuning(self) -> None:  # noqa: B027 -- optional hook
        """Freeze adaptation at the end of tuning."""

    @property
    def scale(self) -> float:
        """Characteristic proposal scale (reported as a sampler statistic)."""
        return float("nan")


class AdaptiveMove(ReplicaMove):
    """A move with one tuned size (a proposal scale or a leapfrog step size) and a metric, both adapted
    while tuning by :class:`~pymc_pnode.sampling.adaptation.WindowedAdaptation`: the size by dual
    averaging towards the target acceptance, the metric at the end of doubling windows.

    Subclasses call :meth:`start_adaptation` in :meth:`setup` and implement :meth:`transition` (one
    transition at a given size) and :meth:`use_metric` (a window's new metric estimate).
    """

    def start_adaptation(self, adaptation: WindowedAdaptation, size: float) -> None:
        """Start tuning from ``size`` with ``adaptation`` (call in :meth:`setup`)."""
        self._adaptation = adaptation
        self._size = float(size)

    def step(self, state: ReplicaState, target: TemperedTarget, rng: np.random.Generator,
             tune: bool) -> tuple[ReplicaState, float]:
        """One transition at the current size (see :meth:`ReplicaMove.step`), adapting while ``tune``."""
        if tune:
            self._size = self._adaptation.step
        new_state, accept_prob = self.transition(state, target, rng, self._size)
        if tune:
            metric = self._adaptation.update(accept_prob, new_state.x)
            if metric is not None:
                self.use_metric(metric)
        return new_state, accept_prob

    @abstractmethod
    def transition(self, state: ReplicaState, target: TemperedTarget, rng: np.random.Generator,
                    size: float) -> tuple[ReplicaState, float]:
        """``(new_state, accept_prob)`` of one transition with proposal scale or step size ``size``."""

    @abstractmethod
    def use_metric(self, metric: np.ndarray) -> None:
        """Adopt a window's metric estimate (and restart the size's averaging, now stale)."""

    def stop_tuning(self) -> None:
        """Fix the size at its dual-averaged value."""
        self._size = self._adaptation.final_step

    @property
    def scale(self) -> float:
        """The current proposal scale or leapfrog step size."""
        return self._size


MoveSpec = str | ReplicaMove | Sequence[ReplicaMove] | Callable[[int], ReplicaMove]
"""Accepted forms of the ``move`` argument of :class:`ParallelTempering`."""


def _builtin_move(name: str) -> ReplicaMove:
    # Imported lazily to keep this module free of concrete move classes.
    from pymc_pnode.sampling.hmc import HamiltonianMove
    from pymc_pnode.sampling.random_walk import RandomWalkMetropolis

    key = name.lower().replace("-", "_")
    if key in ("metropolis", "rwm", "random_walk"):
        return RandomWalkMetropolis()
    if key in ("hmc", "hamiltonian"):
        return HamiltonianMove()
    raise ValueError(
        f"Unknown move {name!r}; use 'metropolis', 'hmc', a ReplicaMove instance, a "
        "sequence of one ReplicaMove per replica, or a factory callable(k) -> ReplicaMove."
    )


def make_replica_moves(move: MoveSpec, betas: np.ndarray, ndim: int) -> list[ReplicaMove]:
    """Build and set up one independent move object per replica.

    Parameters
    ----------
    move : str, ReplicaMove, sequence of ReplicaMove or callable
        ``"metropolis"`` (adaptive random walk) or ``"hmc"``; a template move
        that is deep-copied for every replica; one move per replica; or a
        factory called as ``move(k)`` for replica ``k``.
    betas : numpy.ndarray
        Initial inverse temperatures, one per replica.
    ndim : int
        Dimension of the raveled state.

    Returns
    -------
    list of ReplicaMove

    Raises
    ------
    ValueError
        For an unknown move name or a sequence of the wrong length.
    TypeError
        If something other than a :class:`ReplicaMove` is supplied or produced.
    """
    n_replicas = len(betas)
    if isinstance(move, str):
        moves = [_builtin_move(move) for _ in range(n_replicas)]
    elif isinstance(move, ReplicaMove):
        moves = [copy.deepcopy(move) for _ in range(n_replicas)]
    elif isinstance(move, Sequence):
        if len(move) != n_replicas:
            raise ValueError(
                f"A sequence of moves needs one move per replica ({n_replicas}), got {len(move)}."
            )
        # Copy so that the same object listed twice does not share adaptation state.
        moves = [copy.deepcopy(m) for m in move]
    elif callable(move):
        moves = [move(k) for k in range(n_replicas)]
    else:
        raise TypeError(f"Unsupported move specification {move!r}.")
    for k, m in enumerate(moves):
        if not isinstance(m, ReplicaMove):
            raise TypeError(f"Move for replica {k} is {type(m).__name__}, not a ReplicaMove.")
        m.setup(ndim, float(betas[k]))
    return moves
