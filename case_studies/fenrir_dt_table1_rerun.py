"""The pendulum and Lotka-Volterra Fenrir rows of DT Table 1 rerun with today's package: what changed, and where.

The rows of ``fenrir_dt_table1_results.csv`` for PD, LV and LV4 with the methods FENRIR, FENRIR-IP, OURS+ and
OURS+-IP were produced by the package of 2026-11-21 (PD, LV) and 2026-11-26 (LV4) and replaced on 2026-11-28 by a
rerun with the same starts (``fenrir_dt_table1.py --problems PD LV4 LV --starts 100 --processes 1 --methods FENRIR
FENRIR-IP OURS+ OURS+-IP``). This script compares the two (the earlier rows from git, ``--before``, default the
commit before the rerun) and replays every FENRIR run of LV and LV4 with today's package, counting the
log-likelihood evaluations that were -inf and those refused because their gradient was rounding noise (the guard
of 2026-11-27, docs/fenrir.md): are the runs whose estimates changed the ones that met such evaluations?

Run from this folder: ``python fenrir_dt_table1_rerun.py [--before 451ae20]`` (about 5 minutes on one core); prints
Markdown (saved in ``results/fenrir_dt_table1_rerun.md``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import warnings

import fenrir_dt_table1 as study
import numpy as np
import pandas as pd

RERUN_METHODS = ("FENRIR", "FENRIR-IP", "OURS+", "OURS+-IP")


def earlier_rows(commit: str) -> pd.DataFrame:
    """The results file as it was at ``commit`` (read by the study's own loader)."""
    text = subprocess.run(["git", "show", f"{commit}:case_studies/fenrir_dt_table1_results.csv"], check=True,
                          capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "results.csv")
        with open(path, "w") as f:
            f.write(text)
        return study.load_results(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="451ae20")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    old, new = earlier_rows(args.before), study.load_results()
    print("| problem | method | CONV before | CONV now | starts whose CONV changed | estimates within 1e-6 (rel.) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for key in ("PD", "LV", "LV4"):
        for method in RERUN_METHODS:
            m = old[(old.problem == key) & (old.method == method)].merge(
                new[(new.problem == key) & (new.method == method)], on="start", suffixes=("_old", "_new"))
            same = sum(np.allclose(a, b, rtol=1e-6, atol=0) for a, b in zip(m.theta_old, m.theta_new))
            print(f"| {key} | {method} | {m.CONV_old.mean():.2f} | {m.CONV_new.mean():.2f} | "
                  f"{int((m.CONV_old != m.CONV_new).sum())} of {len(m)} | {same} of {len(m)} |")
    print("\nFENRIR runs replayed with today's package: runs with at least one -inf evaluation / with at least one "
          "evaluation refused as rounding noise, among the runs whose estimate changed (beyond 1e-6) and the others.\n")
    print("| problem | changed runs | with -inf | with refused | unchanged runs | with -inf | with refused |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for key in ("LV", "LV4"):
        objective = study.objective(key)
        diagnostics = [v for v in objective._fn.maker.fgraph.toposort()
                       if hasattr(v.op, "problem")][0].op.problem.diagnostics
        m = old[(old.problem == key) & (old.method == "FENRIR")].merge(
            new[(new.problem == key) & (new.method == "FENRIR")], on="start", suffixes=("_old", "_new"))
        counts = {True: [0, 0, 0], False: [0, 0, 0]}
        for _, run in m.iterrows():
            failed, refused = diagnostics.n_failed, diagnostics.n_unreliable_gradient
            record = study.run_method(key, "FENRIR", int(run.start), run.theta0_old)
            assert record["CONV"] == bool(run.CONV_new), "the replay differs from the stored rerun"
            changed = not np.allclose(run.theta_old, run.theta_new, rtol=1e-6, atol=0)
            c = counts[changed]
            c[0] += 1
            c[1] += diagnostics.n_failed > failed
            c[2] += diagnostics.n_unreliable_gradient > refused
        print(f"| {key} | {' | '.join(map(str, counts[True]))} | {' | '.join(map(str, counts[False]))} |")


if __name__ == "__main__":
    main()
