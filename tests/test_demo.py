"""The README's main job, `python -m pymc_pnode.demo`, in a reduced run: it builds its model, samples, and writes
the InferenceData and the figure it promises (the full run's convergence is recorded in docs/benchmarks.md)."""

import arviz as az

from pymc_pnode.demo import main


def test_demo_runs_end_to_end_and_saves_its_outputs(tmp_path, capsys):
    figure = tmp_path / "demo.png"
    main(["--draws", "30", "--tune", "30", "--chains", "2", "--cores", "1", "--output", str(figure)])
    out = capsys.readouterr().out
    assert figure.stat().st_size > 0
    idata = az.from_netcdf(tmp_path / "demo.nc")
    assert idata.posterior["theta"].shape == (2, 30, 3)
    assert list(idata.posterior["theta"].coords["param"].values) == ["a", "b", "c"]
    assert "V" in idata.log_likelihood
    assert "profile maximum in c: Fenrir, error-controlled" in out
