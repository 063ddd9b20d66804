"""What SBC ranks say: uniformity tests, interval coverage and the rank plots of Talts et al. (2018).

Ranks lie in ``{0, …, L}``; under calibration each is uniform there. Two tests, per parameter:

- the χ² test of the rank histogram in ``n_bins`` bins of consecutive ranks (Talts et al., 2018, §4);
- the simultaneous ECDF test of Säilynoja, Bürkner & Vehtari (2022, §2): the statistic is the smallest
  two-sided binomial tail probability of the rank ECDF over ``0 … L − 1``; its null distribution is simulated
  from uniform ranks, which gives both a p-value and the simultaneous band drawn by :func:`plot_ranks`.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

#: Central posterior intervals whose coverage :func:`interval_coverage` reports by default.
LEVELS = (0.5, 0.9, 0.95)


def _parameters(ranks) -> list[str]:
    return [name for name in ranks.data_vars if ranks[name].dims == ("replicate",)]


def _n_rank_draws(ranks) -> int:
    if "n_rank_draws" not in ranks.attrs:
        raise ValueError("ranks: an SBC result of pymc_pnode.studies.sbc (its attrs record n_rank_draws)")
    return int(ranks.attrs["n_rank_draws"])


def _ecdf_tail(counts: np.ndarray, n: int, probabilities: np.ndarray) -> np.ndarray:
    """Smallest two-sided binomial tail probability of ECDF counts (…, L) over the last axis."""
    lower = stats.binom.cdf(counts, n, probabilities)
    upper = stats.binom.sf(counts - 1, n, probabilities)
    return np.minimum(1.0, 2.0 * np.minimum(lower, upper)).min(axis=-1)


def _ecdf_counts(ranks: np.ndarray, n_rank_draws: int) -> np.ndarray:
    """Number of ranks ≤ k for k = 0 … L − 1 (the ECDF at L is always 1), over the last axis of ``ranks``."""
    ranks = np.asarray(ranks, dtype=int)
    flat = ranks.reshape(-1, ranks.shape[-1])
    histogram = np.zeros((flat.shape[0], n_rank_draws + 1), dtype=int)
    np.add.at(histogram, (np.arange(flat.shape[0])[:, None], flat), 1)
    return histogram.cumsum(axis=-1)[:, :n_rank_draws].reshape(*ranks.shape[:-1], n_rank_draws)


def _null_tails(n: int, n_rank_draws: int, n_simulations: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    simulated = rng.integers(0, n_rank_draws + 1, size=(n_simulations, n))
    probabilities = (np.arange(n_rank_draws) + 1) / (n_rank_draws + 1)
    return _ecdf_tail(_ecdf_counts(simulated, n_rank_draws), n, probabilities)


def _bin_edges(n: int, n_rank_draws: int, n_bins: int | None = None) -> np.ndarray:
    """Edges of bins of consecutive ranks: ``n_bins``, or at most 20 with at least 5 expected ranks each."""
    bins = n_bins or int(max(2, min(20, n // 5, n_rank_draws + 1)))
    return np.linspace(0, n_rank_draws + 1, bins + 1).round().astype(int)


def rank_uniformity(ranks, *, n_bins: int | None = None, n_simulations: int = 2000, seed: int = 0):
    """Tests of uniform ranks, one row per parameter.

    Parameters
    ----------
    ranks : xarray.Dataset
        The result of :func:`~pymc_pnode.studies.sbc`.
    n_bins : int, optional
        Bins of the χ² test (default: at most 20, with at least 5 expected ranks per bin).
    n_simulations : int, default 2000
        Uniform-rank samples simulating the null distribution of the ECDF statistic.
    seed : int, default 0
        Seed of those simulations.

    Returns
    -------
    pandas.DataFrame
        Columns ``n`` (replicates), ``chi2``, ``chi2_p`` and ``ecdf_p`` (Säilynoja et al., 2022: the share of
        uniform samples whose ECDF strays as far as this one's), indexed by parameter. Small p-values say
        the ranks are not uniform — the posterior is not calibrated for that parameter.
    """
    import pandas as pd

    L = _n_rank_draws(ranks)
    names = _parameters(ranks)
    n = int(ranks.sizes["replicate"])
    edges = _bin_edges(n, L, n_bins)
    expected = n * np.diff(edges) / (L + 1)
    null = _null_tails(n, L, n_simulations, seed)
    probabilities = (np.arange(L) + 1) / (L + 1)
    rows = {}
    for name in names:
        r = ranks[name].values.astype(int)
        observed, _ = np.histogram(r, bins=edges)
        chi2, chi2_p = stats.chisquare(observed, expected)
        tail = _ecdf_tail(_ecdf_counts(r, L), n, probabilities)
        rows[name] = {"n": n, "chi2": float(chi2), "chi2_p": float(chi2_p),
                      "ecdf_p": float((np.sum(null <= tail) + 1) / (null.size + 1))}
    return pd.DataFrame.from_dict(rows, orient="index")


def interval_coverage(ranks, levels=LEVELS):
    """Coverage of central posterior intervals, from the ranks.

    The truth lies inside the central ``level`` interval of the posterior draws when its rank fraction
    ``u = (rank + ½) / (L + 1)`` lies in ``[(1 − level)/2, (1 + level)/2]``; under calibration this happens with
    probability ``level`` (to within ``1 / (L + 1)``).

    Returns
    -------
    pandas.DataFrame
        One row per (parameter, level): ``coverage``, its Wilson 95 % interval ``low``/``high``, and ``n``.
    """
    import pandas as pd

    L = _n_rank_draws(ranks)
    rows = []
    for name in _parameters(ranks):
        u = (ranks[name].values + 0.5) / (L + 1)
        for level in levels:
            inside = (u >= (1 - level) / 2) & (u <= (1 + level) / 2)
            low, high = _wilson(int(inside.sum()), inside.size)
            rows.append({"parameter": name, "level": level, "coverage": float(inside.mean()), "low": low,
                         "high": high, "n": int(inside.size)})
    return pd.DataFrame(rows)


def _wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # at p = 0 or 1 the exact limit is 0 or 1; rounding can leave it a hair outside
    return float(max(centre - half, 0.0)), float(min(centre + half, 1.0))


def ecdf_band(n: int, n_rank_draws: int, *, alpha: float = 0.05, n_simulations: int = 2000, seed: int = 0):
    """Simultaneous ``1 − alpha`` band of the ECDF of ``n`` uniform ranks on ``0 … L`` (Säilynoja et al., 2022).

    Returns ``(z, lower, upper)``: the ECDF's fractions ``z_k = (k + 1)/(L + 1)`` and the band's limits of the
    ECDF at them.
    """
    L = n_rank_draws
    null = _null_tails(n, L, n_simulations, seed)
    gamma = float(np.quantile(null, alpha))
    z = (np.arange(L) + 1) / (L + 1)
    lower = stats.binom.ppf(gamma / 2, n, z) / n
    upper = stats.binom.ppf(1 - gamma / 2, n, z) / n
    return z, lower, upper


def plot_ranks(ranks, *, kind: str = "ecdf", parameters=None, alpha: float = 0.05, axes=None, label=None):
    """Rank plots of an SBC result: ``"ecdf"`` (ECDF minus the uniform CDF with its simultaneous band,
    Säilynoja et al., 2022) or ``"hist"`` (rank histogram with the 99 % range of a uniform bin, Talts et al.,
    2018, Fig. 3). One panel per parameter; returns the axes."""
    import matplotlib.pyplot as plt

    if kind not in ("ecdf", "hist"):
        raise ValueError(f"kind must be 'ecdf' or 'hist', got {kind!r}")
    L = _n_rank_draws(ranks)
    names = list(parameters) if parameters is not None else _parameters(ranks)
    n = int(ranks.sizes["replicate"])
    if axes is None:
        columns = min(4, len(names))
        _, axes = plt.subplots(-(-len(names) // columns), columns, figsize=(3.2 * columns, 2.6 * -(-len(names) //
                                                                                                  columns)),
                               squeeze=False)
    axes = np.ravel(axes)
    if kind == "ecdf":
        z, lower, upper = ecdf_band(n, L, alpha=alpha)
    for ax, name in zip(axes, names):
        r = ranks[name].values.astype(int)
        if kind == "ecdf":
            ecdf = _ecdf_counts(r, L) / n
            ax.fill_between(z, lower - z, upper - z, color="0.85", step="mid", label=f"{1 - alpha:.0%} band")
            ax.step(z, ecdf - z, where="mid", label=label)
            ax.axhline(0, color="0.5", lw=0.6)
            ax.set_xlabel("fractional rank")
        else:
            edges = _bin_edges(n, L)
            p = np.diff(edges) / (L + 1)
            low, high = stats.binom.ppf(0.005, n, p), stats.binom.ppf(0.995, n, p)
            ax.fill_between(edges, np.append(low, low[-1]), np.append(high, high[-1]), color="0.85", step="post")
            ax.hist(r, bins=edges, histtype="step", label=label)
            ax.set_xlabel("rank")
        ax.set_title(name, fontsize=9)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    return axes
