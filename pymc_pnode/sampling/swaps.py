"""Selection of replica pairs for swap moves and round-trip bookkeeping."""

from __future__ import annotations

import numpy as np

__all__ = ["SWAP_SCHEMES", "RoundTripCounter", "select_swap_pairs"]

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
