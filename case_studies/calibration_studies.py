"""Run the simulation-based calibration studies of ``calibration_*.ipynb`` and save their ranks.

Each study (models in ``calibration_models.py``) fits several inference models to the SAME simulated data sets
(one seed per study, so replicate ``i`` has the same true parameters and data for every model), with
``pymc_pnode.studies.sbc`` on a local dask cluster (one worker per core). Every finished replicate is recorded
in ``results/sbc_<study>_<model>/`` as it arrives, so an interrupted run resumes where it stopped; the ranks
are written to ``results/sbc_<study>_<model>.nc``, which the notebooks load.

Run: ``python case_studies/calibration_studies.py A [B C] [--replicates 200] [--models name ...]``.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import calibration_models as M  # noqa: E402
import cloudpickle  # noqa: E402
import numpy as np  # noqa: E402

from pymc_pnode import studies  # noqa: E402

RESULTS = HERE / "results"
SEEDS = {"A": 20261, "B": 20262, "C": 20263}
DATA_SIZE = {"A": M.A_TIMES.size * 2, "B": M.B_TIMES.size, "C": M.C_TIMES.size}
# The model builders live in this directory, not in an installed package: send them to workers by value.
cloudpickle.register_pickle_by_value(M)


def run(study: str, n_replicates: int, only: list[str] | None, client) -> None:
    simulator = M.SIMULATORS[study]()
    for name, model in M.MODELS[study](np.zeros(DATA_SIZE[study])).items():
        if only and name not in only:
            continue
        start = time.perf_counter()
        ranks = studies.sbc(model, n_replicates, simulator=simulator, var_names=M.RANK_VARS[study],
                            sample_kwargs=M.SAMPLE_KWARGS[study][name], client=client,
                            store=RESULTS / f"sbc_{study}_{name}", seed=SEEDS[study], description=f"SBC {study} {name}")
        # netCDF attributes hold text or numbers: the failed replicates as a comma-separated list.
        ranks.attrs.update(study=study, model=name,
                           failed_replicates=",".join(map(str, ranks.attrs["failed_replicates"])))
        ranks.to_netcdf(RESULTS / f"sbc_{study}_{name}.nc")
        tests = studies.rank_uniformity(ranks)
        print(f"study {study}, {name}: {ranks.sizes['replicate']} replicates in {time.perf_counter() - start:.0f} s "
              f"(median fit {float(np.median(ranks['seconds'])):.1f} s)\n{tests}\n", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("studies", nargs="+", choices=sorted(DATA_SIZE))
    parser.add_argument("--replicates", type=int, default=200)
    parser.add_argument("--models", nargs="*", help="only these inference models")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*could not link to a BLAS.*")
    RESULTS.mkdir(exist_ok=True)
    import distributed

    with studies.local_cluster() as cluster, distributed.Client(cluster) as client:
        for study in args.studies:
            run(study, args.replicates, args.models, client)


if __name__ == "__main__":
    main()
