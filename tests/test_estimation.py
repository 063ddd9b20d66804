"""The one result type of the point estimators: baselines, pn.fit, diffusion tempering, IRLS."""

import numpy as np
import pymc as pm
import pytensor
import pytest
import xarray as xr

import pymc_pnode as pn
from pymc_pnode.baselines import EstimationResult, results_table
from pymc_pnode.optimize import FitResult, TemperingResult


def _result(**kw):
    base = dict(theta=[1.0, 2.0], y0=[0.5], objective=0.25, n_iterations=7, wall_time=0.5,
                converged=True, message="ok", method="demo", objective_name="SSR")
    base.update(kw)
    return EstimationResult(**base)


def test_fields_are_coerced_to_float_arrays():
    r = _result(theta=(1, 2), y0=None)
    assert r.theta.dtype == np.float64 and r.theta.shape == (2,)
    assert r.y0 is None
    assert r.success is True
    assert "demo" in repr(r)


def test_to_dict_and_summary():
    r = _result()
    row = r.to_dict(theta_names=["a", "b"], y0_names=["x"], theta_true=[1.0, 1.0])
    assert row["a"] == 1.0 and row["b"] == 2.0 and row["x"] == 0.5
    assert row["theta_error"] == pytest.approx(1.0)
    assert row["converged"] is True and row["n_iterations"] == 7
    text = r.summary(theta_names=["a", "b"])
    assert "converged after 7 iterations" in text and "a = 1" in text
    assert "NOT converged" in _result(converged=False).summary()


def test_to_dict_rejects_wrong_names():
    with pytest.raises(ValueError, match="theta_names"):
        _result().to_dict(theta_names=["a"])
    with pytest.raises(ValueError, match="theta_true"):
        _result().to_dict(theta_true=[1.0, 2.0, 3.0])


def test_results_table():
    table = results_table({"first": _result(), "second": _result(theta=[3.0, 4.0])},
                          theta_names=["a", "b"], theta_true=[3.0, 4.0])
    assert list(table.index) == ["first", "second"]
    assert table.loc["second", "theta_error"] == 0.0
    assert list(results_table([_result()]).index) == ["demo"]
    with pytest.raises(ValueError, match="EstimationResult"):
        results_table([object()])


def test_replace_returns_a_copy():
    r = _result()
    r2 = r.replace(converged=False, message="failed")
    assert r.converged and not r2.converged and r2.message == "failed"


def test_theta_names_are_checked_and_used():
    with pytest.raises(ValueError, match="theta_names must have 2 entries"):
        _result(theta_names=["a"])
    r = _result(theta_names=["a", "b"])
    assert r.to_dict()["b"] == 2.0 and "a = 1" in r.summary()


def test_to_xarray_round_trips_through_netcdf(tmp_path):
    ds = _result(theta_names=["a", "b"], converged=False).to_xarray()
    assert list(ds["theta"].coords["theta_dim_0"].values) == ["a", "b"]
    assert ds["y0"].values.tolist() == [0.5]
    assert ds.attrs["converged"] == 0 and ds.attrs["n_iterations"] == 7 and ds.attrs["method"] == "demo"
    ds.to_netcdf(tmp_path / "estimate.nc")
    back = xr.load_dataset(tmp_path / "estimate.nc")
    assert back["theta"].sel(theta_dim_0="b").item() == 2.0 and back.attrs["objective"] == 0.25


def _conjugate_model(data, kappa=None):
    """mu ~ N(0, 10^2) per column, offset ~ N(0, 1) unobserved; data ~ N(mu, kappa). MAP (no Jacobian):
    mu = sum(data) / (n + kappa / 100), offset = 0."""
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0, shape=2)
        pm.Normal("offset", 0.0, 1.0)
        pm.Normal("y", mu, 1.0 if kappa is None else pytensor.tensor.sqrt(kappa), observed=data)
    return model


def test_a_model_variable_named_theta_keeps_its_own_shape_in_xarray():
    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, 1.0, shape=3)
        scale = pm.Normal("scale", 0.0, 1.0)
        pm.Normal("y", theta.sum() + scale, 1.0, observed=[1.0, 2.0])
    fit = pn.fit(model)
    assert fit.theta.size == 4 and len(fit.theta_names) == 4
    ds = fit.to_xarray()
    assert ds["theta"].shape == (3,) and ds["scale"].shape == ()
    np.testing.assert_array_equal(ds["theta"].values, fit["theta"])


def test_fit_and_tempering_return_estimation_results():
    data = np.random.default_rng(3).normal([1.0, -2.0], 1.0, size=(20, 2))
    fit = pn.fit(_conjugate_model(data), objective="map")
    assert isinstance(fit, FitResult) and isinstance(fit, EstimationResult)
    assert fit.theta_names == ["mu[0]", "mu[1]", "offset"] and fit.y0 is None
    np.testing.assert_allclose(fit.theta, [*(data.sum(0) / (20 + 0.01)), 0.0], atol=1e-6)
    np.testing.assert_allclose(fit["mu"], fit.theta[:2])
    assert fit.converged and fit.method == "map" and fit.n_function_evals == fit.n_evaluations >= fit.n_iterations
    assert len(fit.history) == fit.n_iterations and fit.history[-1] == pytest.approx(fit.objective)
    assert fit.to_xarray()["mu"].dims == ("mu_dim_0",)
    assert repr(fit).startswith("FitResult(method='map', theta=") and "point" not in repr(fit)

    kappa = pytensor.shared(1.0)
    tempered = pn.diffusion_tempering(_conjugate_model(data, kappa), diffusion=kappa, schedule=[100.0, 10.0, 1.0],
                                      objective="map", progressbar=False)
    assert isinstance(tempered, TemperingResult) and len(tempered.stages) == 3
    assert tempered.n_iterations == sum(s.n_iterations for s in tempered.stages)
    assert tempered.n_function_evals == sum(s.n_function_evals for s in tempered.stages)
    assert tempered.objective == tempered.stages[-1].objective and tempered.history[-1] == tempered.objective
    np.testing.assert_allclose(tempered.theta, fit.theta, atol=1e-5)  # the last stage is the same model

    table = results_table({"fit": fit, "tempering": tempered, "baseline": _result(theta=[0.0, 0.0, 0.0])},
                          theta_names=["a", "b", "c"])
    assert list(table.columns[:4]) == ["method", "a", "b", "c"]
    assert table.loc["tempering", "method"] == "diffusion_tempering"
