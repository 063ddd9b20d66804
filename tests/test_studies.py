"""The study runner (dask.distributed), its store, and simulation-based calibration."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pymc as pm
import pytest

from pymc_pnode import studies
from pymc_pnode.studies.ranks import _ecdf_counts
from pymc_pnode.studies.runner import _oversubscribed
from pymc_pnode.studies.sbc import posterior_rank, replicate_seeds
from pymc_pnode.studies.store import StudyStore

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def client():
    cluster = studies.local_cluster(n_workers=2)
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


def test_local_cluster_workers_run_without_dask_defaults_that_slow_fits(client):
    import dask

    def worker_settings():
        keys = ("distributed.admin.tick.interval", "distributed.admin.system-monitor.interval",
                "distributed.worker.memory.monitor-interval", "distributed.worker.profile.enabled")
        return [dask.config.get(k) for k in keys], os.environ.get("MALLOC_TRIM_THRESHOLD_")

    for settings, trim in client.run(worker_settings).values():
        assert settings == ["1s", "5s", "1s", False]
        assert trim is None
    assert dask.config.get("distributed.admin.tick.interval") == "20ms"  # the caller's configuration is untouched


def noisy_task(task):
    """A task with its own seed; ``kill`` in the task's directory makes its first attempt kill its worker."""
    marks = Path(task["dir"])
    (marks / f"ran-{task['i']}-{os.getpid()}-{time.time_ns()}").touch()
    if task.get("kill") and not (marks / "killed").exists():
        (marks / "killed").touch()
        os._exit(1)  # the worker process dies mid-task
    if (marks / f"fail-{task['i']}").exists():
        raise RuntimeError(f"task {task['i']} asked to fail")
    time.sleep(task.get("sleep", 0.0))
    rng = np.random.default_rng(task["seed"])
    return [{"draw": rng.normal(), "which": j} for j in range(2)]


def runs_of(directory: Path, i: int) -> int:
    return len(list(directory.glob(f"ran-{i}-*")))


def make_tasks(directory, n, **extra):
    return {i: {"i": i, "seed": 100 + i, "dir": str(directory), **extra} for i in range(n)}


def test_cluster_equals_serial_and_a_killed_worker_loses_nothing(client, tmp_path):
    (tmp_path / "serial").mkdir()
    serial = studies.run_study(noisy_task, make_tasks(tmp_path / "serial", 8), client="serial", progress=False)
    tasks = make_tasks(tmp_path, 8, sleep=0.2)
    tasks[5]["kill"] = True
    store = tmp_path / "store"
    result = studies.run_study(noisy_task, tasks, client=client, store=store, progress=False)
    assert (tmp_path / "killed").exists()  # a worker did die mid-run
    assert result.failures == {} and result.n_run == 8
    assert result.table.equals(serial.table)  # same rows, same order, whatever ran where
    assert list(result.table["task"]) == [i for i in range(8) for _ in range(2)]
    recorded = [json.loads(line)["task"] for line in (store / "results.jsonl").read_text().splitlines()]
    assert sorted(recorded) == list(range(8))  # every task recorded exactly once
    assert runs_of(tmp_path, 5) == 2  # the killed task ran again, elsewhere


def test_warm_up_by_default_only_where_workers_outnumber_cores(client):
    # two single-threaded workers on this machine: no more threads than cores (CI and here: 2 cores)
    assert _oversubscribed(client) is (2 > (os.cpu_count() or 1))
    with distributed.LocalCluster(n_workers=1, threads_per_worker=(os.cpu_count() or 1) + 1, processes=False,
                                  dashboard_address=None) as crowded, distributed.Client(crowded) as crowded_client:
        assert _oversubscribed(crowded_client)


def test_failures_are_reported_and_a_rerun_repeats_only_unfinished_tasks(client, tmp_path):
    tasks = make_tasks(tmp_path, 6)
    for i in (1, 4):
        (tmp_path / f"fail-{i}").touch()
    store = tmp_path / "store"
    with pytest.warns(studies.StudyWarning, match="2 of 6 tasks"):
        first = studies.run_study(noisy_task, tasks, client=client, store=store, retries=1, progress=False)
    assert set(first.failures) == {1, 4} and "asked to fail" in first.failures[1]
    assert sorted(set(first.table["task"])) == [0, 2, 3, 5]
    assert runs_of(tmp_path, 1) == 2  # the first attempt and one retry
    assert set(StudyStore(store).failures()) == {"1", "4"}
    for i in (1, 4):
        (tmp_path / f"fail-{i}").unlink()
    second = studies.run_study(noisy_task, tasks, client=client, store=store, progress=False)
    assert second.n_resumed == 4 and second.n_run == 2 and second.failures == {}
    assert [runs_of(tmp_path, i) for i in range(6)] == [1, 3, 1, 1, 3, 1]  # finished tasks never ran again
    assert sorted(set(second.table["task"])) == list(range(6))
    assert StudyStore(store).failures() == {}


def test_a_killed_study_process_resumes_where_it_stopped(tmp_path):
    store, marks = tmp_path / "store", tmp_path / "marks"
    marks.mkdir()
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_studies import make_tasks, noisy_task
        from pymc_pnode.studies import run_study
        run_study(noisy_task, make_tasks({str(marks)!r}, 12, sleep=0.4), client="serial", store={str(store)!r},
                  progress=False)
    """)
    process = subprocess.Popen([sys.executable, "-c", script])
    results = store / "results.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not results.exists() or len(results.read_text().splitlines()) < 3):
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    finished = {json.loads(line)["task"] for line in results.read_text().splitlines()}
    assert 3 <= len(finished) < 12
    result = studies.run_study(noisy_task, make_tasks(marks, 12, sleep=0.0), client="serial", store=store,
                               progress=False)
    assert result.n_resumed == len(finished) and len(result.table) == 24
    assert all(runs_of(marks, i) == 1 for i in finished)


def test_store_drops_a_torn_line_and_refuses_another_study(tmp_path):
    store = StudyStore(tmp_path, {"study": "a"})
    store.record(0, [{"x": 1.0, "y": float("nan")}])
    with open(tmp_path / "results.jsonl", "a") as handle:
        handle.write('{"task": 1, "rows": [{"x"')  # a crash mid-write
    reopened = StudyStore(tmp_path, {"study": "a"})
    assert list(reopened.finished()) == ["0"] and np.isnan(reopened.table()["y"][0])
    reopened.record(2, [{"x": 3}])
    assert list(StudyStore(tmp_path).finished()) == ["0", "2"]
    with pytest.raises(ValueError, match="records another study"):
        StudyStore(tmp_path, {"study": "b"})
    with pytest.warns(studies.StudyWarning, match="column 'v'.*array of shape"):
        bad = studies.run_study(lambda task: {"v": np.zeros(3)}, [0], client="serial", progress=False, retries=0)
    assert list(bad.failures) == [0] and len(bad.table) == 0
    with pytest.raises(ValueError, match="client"):
        studies.run_study(noisy_task, [], client=3)


def conjugate_model(noise_sd=1.0):
    with pm.Model(coords={"group": ["a", "b"]}) as model:
        mu = pm.Normal("mu", 0.0, 1.0, dims="group")
        pm.Normal("y", mu, noise_sd, observed=np.zeros((4, 2)))
    return model


SBC_KWARGS = dict(draws=300, tune=200, chains=1)


def test_sbc_ranks_are_uniform_for_an_exact_posterior_and_not_for_a_wrong_one(client):
    calibrated = studies.sbc(conjugate_model(), 60, sample_kwargs=SBC_KWARGS, n_rank_draws=50, client=client,
                             seed=3, progress=False)
    assert list(calibrated.data_vars) == ["mu[a]", "mu[b]"] and calibrated.sizes["replicate"] == 60
    assert int(calibrated["mu[a]"].max()) <= 50
    tests = studies.rank_uniformity(calibrated)
    assert (tests["ecdf_p"] > 0.01).all() and (tests["chi2_p"] > 0.01).all()
    # The model believes the noise is 3x smaller than in the simulator: over-confident posteriors.
    wrong = studies.sbc(conjugate_model(noise_sd=1 / 3), 60, simulator=conjugate_model(), sample_kwargs=SBC_KWARGS,
                        n_rank_draws=50, client=client, seed=3, progress=False)
    assert (studies.rank_uniformity(wrong)["ecdf_p"] < 0.01).all()
    coverage = studies.interval_coverage(wrong).set_index(["parameter", "level"])["coverage"]
    assert coverage.loc[("mu[a]", 0.9)] < 0.75
    good = studies.interval_coverage(calibrated)
    assert np.all(np.abs(good["coverage"] - good["level"]) < 0.15)


def test_sbc_on_a_cluster_equals_serial_and_resumes(client, tmp_path):
    kwargs = dict(sample_kwargs=SBC_KWARGS, n_rank_draws=50, seed=11, progress=False)
    serial = studies.sbc(conjugate_model(), 4, client="serial", **kwargs)
    distributed_run = studies.sbc(conjugate_model(), 4, client=client, store=tmp_path, **kwargs)
    for name in serial.data_vars:
        np.testing.assert_array_equal(serial[name].values, distributed_run[name].values)
    again = studies.sbc(conjugate_model(), 4, client=client, store=tmp_path, **kwargs)
    np.testing.assert_array_equal(again["seconds"].values, distributed_run["seconds"].values)  # nothing rerun
    with pytest.raises(ValueError, match="records another study"):
        studies.sbc(conjugate_model(), 5, client="serial", store=tmp_path, **kwargs)


def normal_logp(value, mu):
    return pm.logp(pm.Normal.dist(mu, 1.0), value)


def custom_dist_model():
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        pm.CustomDist("y", mu, logp=normal_logp, random=lambda mu, rng=None, size=None: rng.normal(mu, 1.0, size),
                      observed=np.zeros(4))
    return model


def test_sbc_of_a_custom_distribution_runs_on_workers(client):
    """pm.CustomDist (pn.Fenrir's base) registers its log-density in the building process only; the replicate
    carries the registration to the workers (without it: "Logprob method not implemented")."""
    kwargs = dict(sample_kwargs=SBC_KWARGS, n_rank_draws=50, seed=2, progress=False)
    on_workers = studies.sbc(custom_dist_model(), 2, client=client, **kwargs)
    assert on_workers.attrs["failed_replicates"] == []
    np.testing.assert_array_equal(on_workers["mu"].values,
                                  studies.sbc(custom_dist_model(), 2, client="serial", **kwargs)["mu"].values)


def test_condition_on_data_replaces_array_and_pm_data_observations():
    with pm.Model() as model:
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1.0, observed=np.zeros(3))
        pm.Normal("z", mu, 1.0, observed=pm.Data("z_data", np.zeros(2)))
    new = studies.condition_on_data(model, {"y": np.array([1.0, 2.0, 3.0]), "z": np.array([4.0, 5.0])})
    point = {"mu": 0.5}
    expected = sum(-0.5 * (v - 0.5) ** 2 - 0.5 * np.log(2 * np.pi) for v in [1, 2, 3, 4, 5])
    np.testing.assert_allclose(new.compile_logp(vars=new.observed_RVs)(point), expected)
    np.testing.assert_allclose(model.compile_logp(vars=model.observed_RVs)(point),
                               5 * (-0.125 - 0.5 * np.log(2 * np.pi)))
    with pytest.raises(ValueError, match="not observed variables"):
        studies.condition_on_data(model, {"mu": 1.0})
    with pytest.raises(ValueError, match="non-finite"):
        studies.condition_on_data(model, {"y": np.array([1.0, np.nan, 3.0])})


def test_condition_on_data_reaches_the_fenrir_likelihood(fhn_ode):
    import pymc_pnode as pn

    times = np.linspace(0.5, 3.0, 6)
    data = np.cos(times)[:, None]

    def fenrir_model(observed):
        with pm.Model() as model:
            c = pm.LogNormal("c", np.log(3.0), 0.2)
            pn.Fenrir("v", fhn_ode, y0=[-1.0, 1.0], theta=pm.math.stack([0.2, 0.2, c]), times=times,
                      observed=observed, obs_matrix=[[1.0, 0.0]], obs_sigma=0.1)
        return model

    conditioned = studies.condition_on_data(fenrir_model(np.zeros_like(data)), {"v": data})
    point = {"c_log__": np.log(2.5)}
    np.testing.assert_allclose(conditioned.compile_logp()(point), fenrir_model(data).compile_logp()(point), rtol=1e-12)


def test_rank_helpers():
    rng = np.random.default_rng(0)
    assert posterior_rank(np.arange(10.0), 4.5, 10, rng) == 5
    assert posterior_rank(np.arange(100.0), 50.5, 10, rng) == 5  # thinned evenly to 10 draws
    ties = [posterior_rank(np.zeros(10), 0.0, 10, rng) for _ in range(2000)]
    assert set(ties) == set(range(11))  # ties broken uniformly
    with pytest.raises(ValueError, match="n_rank_draws"):
        posterior_rank(np.zeros(5), 0.0, 10, rng)
    np.testing.assert_array_equal(_ecdf_counts(np.array([0, 2, 2, 3]), 3), [1, 1, 3])
    assert replicate_seeds(5, 3) == replicate_seeds(5, 4)[:3]  # a replicate's seed does not depend on n
    with pytest.raises(ValueError, match="random_seed"):
        studies.sbc(conjugate_model(), 2, sample_kwargs={"random_seed": 1}, client="serial")
    with pytest.raises(ValueError, match="simulator: has no variables named"):
        with pm.Model() as other:
            pm.Normal("y", 0.0, 1.0, observed=np.zeros((4, 2)))
        studies.sbc(conjugate_model(), 2, simulator=other, client="serial")


def test_sbc_ranks_only_the_named_variables():
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        nuisance = pm.Normal("nuisance", 0.0, 1.0)
        pm.Normal("y", mu + 0.0 * nuisance, 1.0, observed=np.zeros(3))
    with pm.Model() as simulator:
        mu = pm.Normal("mu", 0.0, 1.0)
        pm.Normal("y", mu, 1.0, observed=np.zeros(3))
    ranks = studies.sbc(model, 2, simulator=simulator, var_names=["mu"], sample_kwargs=SBC_KWARGS, n_rank_draws=50,
                        client="serial", seed=0, progress=False)
    assert list(ranks.data_vars) == ["mu"]
    with pytest.raises(ValueError, match="var_names"):
        studies.sbc(model, 2, simulator=simulator, var_names=["sigma"], client="serial")
