"""Calibration and repetition studies: many independent fits on a dask.distributed cluster.

- :func:`run_study`: the runner — any function over many tasks, on a local or remote cluster, results
  recorded task by task in a :class:`StudyStore` so that a rerun resumes;
- :func:`sbc`: simulation-based calibration (Talts et al., 2018) of a PyMC model on that runner;
- :func:`rank_uniformity`, :func:`interval_coverage`, :func:`plot_ranks`: what the ranks say.
"""

from pymc_pnode.studies.ranks import ecdf_band, interval_coverage, plot_ranks, rank_uniformity
from pymc_pnode.studies.runner import StudyResult, StudyWarning, local_cluster, run_study
from pymc_pnode.studies.sbc import condition_on_data, sbc
from pymc_pnode.studies.store import StudyStore
from pymc_pnode.studies.transport import PortableModels

__all__ = ["PortableModels", "StudyResult", "StudyStore", "StudyWarning", "condition_on_data", "ecdf_band",
           "interval_coverage", "local_cluster", "plot_ranks", "rank_uniformity", "run_study", "sbc"]
