"""The common result type of the baseline estimators."""

import numpy as np
import pytest

from pymc_pnode.baselines import EstimationResult, results_table


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
