"""Tables and figures of the calibration notebooks (``calibration_*.ipynb``), from the saved SBC ranks.

The ranks are produced by ``calibration_studies.py`` into ``results/sbc_<study>_<model>.nc``; nothing here fits
a model.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import xarray as xr

from pymc_pnode import studies

RESULTS = Path(__file__).resolve().parent / "results"


def load(study: str, models) -> dict[str, xr.Dataset]:
    """The saved ranks of each model of a study."""
    return {name: xr.load_dataset(RESULTS / f"sbc_{study}_{name}.nc") for name in models}


def sampler_table(ranks: dict[str, xr.Dataset], min_ess: float = 100.0) -> pd.DataFrame:
    """Per model: replicates, fit time, and how often the sampler itself was in doubt."""
    rows = {}
    for name, r in ranks.items():
        rows[name] = {
            "replicates": r.sizes["replicate"],
            "failed": len([f for f in str(r.attrs.get("failed_replicates", "")).split(",") if f]),
            "median fit s": float(np.median(r["seconds"])),
            "replicates with divergences": int((r["divergences"] > 0).sum()),
            "max R-hat > 1.05": int((r["rhat_max"] > 1.05).sum()),
            f"min bulk ESS < {min_ess:.0f}": int((r["ess_bulk_min"] < min_ess).sum()),
            "simulator redraws": int(r["redraws"].sum()),
        }
    return pd.DataFrame.from_dict(rows, orient="index")


def well_mixed(ranks: dict[str, xr.Dataset], max_rhat: float = 1.05, min_ess: float = 100.0) -> dict[str, xr.Dataset]:
    """Only the replicates whose sampler was not in doubt (R-hat ≤ ``max_rhat``, bulk ESS ≥ ``min_ess``).

    A check that a miscalibration is not the sampler's doing; selecting replicates by their diagnostics can itself
    bias the ranks, so this is a diagnostic, not a calibration test."""
    kept = {name: ((r["rhat_max"] <= max_rhat) & (r["ess_bulk_min"] >= min_ess)).values for name, r in ranks.items()}
    return {name: r.isel(replicate=np.flatnonzero(kept[name])) for name, r in ranks.items()}


def uniformity_table(ranks: dict[str, xr.Dataset]) -> pd.DataFrame:
    """χ² and simultaneous-ECDF p-values of uniform ranks, per model and parameter."""
    return pd.concat({name: studies.rank_uniformity(r) for name, r in ranks.items()}, names=["model", "parameter"])


def coverage_table(ranks: dict[str, xr.Dataset], levels=(0.5, 0.9, 0.95)) -> pd.DataFrame:
    """Coverage of central posterior intervals (with Wilson 95 % intervals), model × parameter × level."""
    frames = []
    for name, r in ranks.items():
        c = studies.interval_coverage(r, levels)
        c["model"] = name
        frames.append(c)
    table = pd.concat(frames)
    table["coverage (95% CI)"] = [f"{c:.2f} [{lo:.2f}, {hi:.2f}]" for c, lo, hi in
                                  zip(table["coverage"], table["low"], table["high"])]
    return table.pivot_table(index=["model", "parameter"], columns="level", values="coverage (95% CI)",
                             aggfunc="first")


def plot(ranks: dict[str, xr.Dataset], title: str):
    """Rank ECDF minus the uniform CDF (with the simultaneous 95 % band) and rank histograms: one column per
    parameter, one colour per model."""
    first = next(iter(ranks.values()))
    parameters = [p for p in first.data_vars]
    fig, axes = plt.subplots(2, len(parameters), figsize=(4.2 * len(parameters), 6.2), squeeze=False)
    for i, (name, r) in enumerate(ranks.items()):
        for j, parameter in enumerate(parameters):
            band = i == 0
            ax = axes[0, j]
            studies.plot_ranks(r, kind="ecdf", parameters=[parameter], axes=[ax], label=name)
            if not band:  # one band is enough: the replicate counts agree
                ax.collections[-1].remove()
            studies.plot_ranks(r, kind="hist", parameters=[parameter], axes=[axes[1, j]], label=name)
            if not band:
                axes[1, j].collections[-1].remove()
    axes[0, 0].legend(fontsize=8)
    axes[0, 0].set_ylabel("ECDF − uniform CDF")
    axes[1, 0].set_ylabel("replicates per bin")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
