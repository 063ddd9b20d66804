"""Selection of replica pairs for swap moves and round-trip bookkeeping."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["SWAP_SCHEMES", "CommunicationCheck", "RoundTripCounter", "select_swap_pairs"]

SWAP_SCHEMES = ("even_odd", "random_pair")


def select_swap_pairs(
    scheme: str, iteration: int, n_replicas: int, rng: np.random.Generator
) -> np.ndarray:
    """Lower indices ``k`` of the pairs ``(k, k + 1)`` to attempt swapping.

    Parameters
    ----------
    scheme : {"even_odd", "random_pair"}
        ``"even_odd"`` alternates deterministically between all pairs with
        even ``k`` and all pairs with odd ``k`` (the non-reversible DEO scheme
        of Okabe et al. 2001 / Syed et al. 2022, which makes replicas travel
        the ladder ballistically).  ``"random_pair"`` picks one adjacent pair
        uniformly at random.
    iteration : int
        Swap-round counter (decides the parity for ``"even_odd"``).
    n_replicas : int
        Number of replicas.
    rng : numpy.random.Generator
        Used by ``"random_pair"``.

    Returns
    -------
    numpy.ndarray
        Integer array of non-overlapping lower pair indices.
    """
    if scheme == "even_odd":
        return np.arange(iteration % 2, n_replicas - 1, 2)
    if scheme == "random_pair":
        return np.array([rng.integers(n_replicas - 1)])
    raise ValueError(f"Unknown swap scheme {scheme!r}; use one of {SWAP_SCHEMES}.")


class RoundTripCounter:
    """Count cold -> hot -> cold round trips of replica states.

    Every state ("walker") carries a label that follows it through swaps.  A
    round trip is completed when a walker that has visited the hottest
    replica after its last visit to the cold replica reaches the cold replica
    again; the round-trip rate is the standard measure of how well a ladder
    moves information between temperatures.

    Parameters
    ----------
    n_replicas : int
        Number of replicas.
    """

    _NONE, _COLD, _HOT = 0, 1, 2

    def __init__(self, n_replicas: int) -> None:
        self.labels = np.arange(n_replicas)
        self.last_end = np.full(n_replicas, self._NONE)
        self.count = 0
        self._mark_ends()

    def swap(self, k: int) -> None:
        """Record an accepted swap between positions ``k`` and ``k + 1``."""
        self.labels[[k, k + 1]] = self.labels[[k + 1, k]]

    def end_round(self) -> None:
        """Update the walkers at both ends after a swap round."""
        self._mark_ends()

    def _mark_ends(self) -> None:
        cold, hot = self.labels[0], self.labels[-1]
        if self.last_end[cold] == self._HOT:
            self.count += 1
        self.last_end[cold] = self._COLD
        # Only walkers that came from the cold end can start a round trip at the hot end.
        if self.last_end[hot] == self._COLD:
            self.last_end[hot] = self._HOT


class CommunicationCheck:
    """Notices, after tuning, a ladder whose replicas do not communicate.

    A pair of neighbouring replicas that almost never swaps, or a replica whose move almost never accepts,
    cuts the cold chain off from the states of the hotter replicas: modes that only hot replicas find are
    then never reached, and mode weights can be wrong while each replica looks well mixed. The mean
    acceptances since the end of tuning are checked after 100, 200, 400, ... iterations; the first check
    that finds a pair or a replica below ``min_acceptance`` returns a message, once per chain.

    Parameters
    ----------
    n_replicas : int
        Number of replicas.
    min_acceptance : float, default 0.01
        Mean acceptance below which a pair's swaps or a replica's moves count as stuck.
    """

    FIRST_CHECK = 100
    MIN_ATTEMPTS = 10  # a pair's swap rate is judged after this many attempts

    def __init__(self, n_replicas: int, min_acceptance: float = 0.01) -> None:
        self.min_acceptance = float(min_acceptance)
        self.move_accept_sum = np.zeros(n_replicas)
        self.iterations = 0
        self.next_check = self.FIRST_CHECK
        self.reported = False

    def record(self, replica_accept: np.ndarray, swap_rate: np.ndarray, swap_attempts: np.ndarray,
               betas: np.ndarray, ladders: Mapping[str, np.ndarray] | None = None) -> str | None:
        """Add one iteration's move acceptances; a message if this iteration's check finds stuck replicas.

        ``swap_rate`` and ``swap_attempts`` are the running mean acceptance and the number of attempts of
        every pair since the end of tuning; ``betas`` and the per-replica values of any shared-variable
        ladder (``{"ladder_<name>": values}``, as the sampler's statistics) label the replicas in the message.
        """
        self.move_accept_sum += replica_accept
        self.iterations += 1
        if self.reported or self.iterations < self.next_check:
            return None
        self.next_check *= 2
        move_rate = self.move_accept_sum / self.iterations
        pairs = np.flatnonzero((swap_attempts >= self.MIN_ATTEMPTS) & (swap_rate < self.min_acceptance))
        replicas = np.flatnonzero(move_rate < self.min_acceptance)
        if pairs.size == 0 and replicas.size == 0:
            return None
        self.reported = True
        ladders = {name.removeprefix("ladder_"): values for name, values in (ladders or {}).items()}

        def label(k: int) -> str:
            return ", ".join([f"beta {betas[k]:.3g}"] + [f"{name} {values[k]:.3g}" for name, values in ladders.items()])

        found = [f"replicas {k} and {k + 1} ({label(k)}; {label(k + 1)}) swapped in {swap_rate[k]:.1%} of "
                 f"{swap_attempts[k]} attempts" for k in pairs]
        found += [f"replica {k} ({label(k)}) accepted {move_rate[k]:.1%} of its moves" for k in replicas]
        return (
            f"Parallel tempering after {self.iterations} iterations past tuning: " + "; ".join(found) + ". "
            "The cold chain does not receive the hotter replicas' states, so modes found only there are not "
            "sampled and mode weights can be wrong. Add replicas between those temperatures, tune longer, or "
            "use another move for a replica that does not move."
        )

