"""The shared input checks: one rule per kind of argument, errors that name the argument."""

import numpy as np
import pytest

from pymc_pnode.validation import (
    as_positive_float,
    as_positive_int,
    validate_bounds,
    validate_data,
    validate_noise,
    validate_obs_matrix,
    validate_step,
    validate_t_span,
    validate_times,
)


def test_times_are_returned_as_contiguous_floats():
    out = validate_times([0, 1, 2.5], "times")
    assert out.dtype == np.float64 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, [0.0, 1.0, 2.5])
    np.testing.assert_array_equal(validate_times(3.0, "t"), [3.0])  # a scalar is one time


@pytest.mark.parametrize(
    "times, kwargs, match",
    [
        ([], {}, "save_at must be a non-empty 1-d"),
        ([[0.0, 1.0]], {}, "save_at must be a non-empty 1-d"),
        ([0.0, np.nan], {}, "save_at must be finite"),
        ([0.0, 1.0, 1.0], {}, r"save_at must be strictly increasing, got 1.0 followed by 1.0"),
        (["a"], {}, "save_at must be numeric"),
        ([0.5, 1.0], {"start": 1.0}, r"save_at must not start before t0=1.0"),
        ([0.5, 3.0], {"span": (0.0, 2.0)}, r"save_at must lie inside t_span"),
    ],
)
def test_bad_times_name_the_argument(times, kwargs, match):
    with pytest.raises(ValueError, match=match):
        validate_times(times, "save_at", **kwargs)


def test_t_span_and_step():
    assert validate_t_span((0, 2)) == (0.0, 2.0)
    for bad in [(1.0, 1.0), (0.0, np.inf), 3.0]:
        with pytest.raises(ValueError, match="t_span"):
            validate_t_span(bad)
    assert validate_step(0.5, 2.0) == 0.5
    for bad in [0.0, -1.0, np.nan, "x"]:
        with pytest.raises(ValueError, match="step must be a positive finite number"):
            validate_step(bad, 2.0)
    with pytest.raises(ValueError, match="step must not exceed the time span"):
        validate_step(3.0, 2.0)


def test_positive_numbers():
    assert as_positive_int(3, "n") == 3 and as_positive_int(np.int64(2), "n") == 2
    for bad in [0, -1, 2.5, True, "3", None]:
        with pytest.raises(ValueError, match="n must be a positive integer"):
            as_positive_int(bad, "n")
    assert as_positive_float("0.5", "tol") == 0.5
    for bad in [0, -1e-3, np.inf, None]:
        with pytest.raises(ValueError, match="tol must be a positive finite number"):
            as_positive_float(bad, "tol")


def test_obs_matrix():
    np.testing.assert_array_equal(validate_obs_matrix(None, 3), np.eye(3))
    np.testing.assert_array_equal(validate_obs_matrix([1.0, 0.0, 0.0], 3), [[1.0, 0.0, 0.0]])
    for bad, match in [(np.ones((2, 2)), r"shape \(n_observed, 3\)"), (np.ones((0, 3)), "shape"),
                       ([[np.nan, 0.0, 0.0]], "finite")]:
        with pytest.raises(ValueError, match=f"obs_matrix must .*{match}"):
            validate_obs_matrix(bad, 3)


def test_data_and_noise():
    y = validate_data([1.0, np.nan, 2.0], 3, 1)
    assert y.shape == (3, 1) and np.isnan(y[1, 0])
    with pytest.raises(ValueError, match=r"data must have shape \(len\(times\), n_observed\) = \(3, 2\)"):
        validate_data(np.ones((3, 1)), 3, 2)
    with pytest.raises(ValueError, match="data must not contain infinite"):
        validate_data([1.0, np.inf, 2.0], 3, 1)
    with pytest.raises(ValueError, match="data must not contain NaN"):
        validate_data([1.0, np.nan, 2.0], 3, 1, allow_missing=False)
    with pytest.raises(ValueError, match="data contains no observed"):
        validate_data([np.nan, np.nan], 2, 1)
    np.testing.assert_array_equal(validate_noise(0.5, 2), [0.5, 0.5])
    for bad in [0.0, [1.0, -1.0], [1.0, 2.0, 3.0], np.nan]:
        with pytest.raises(ValueError, match="obs_sigma must be a positive finite scalar"):
            validate_noise(bad, 2)


def test_bounds():
    assert validate_bounds(None, 2, "bounds") == [(-np.inf, np.inf)] * 2
    assert validate_bounds([(0, None), (None, 1)], 2, "bounds") == [(0.0, np.inf), (-np.inf, 1.0)]
    with pytest.raises(ValueError, match="bounds must contain 2"):
        validate_bounds([(0, 1)], 2, "bounds")
    with pytest.raises(ValueError, match="low < high"):
        validate_bounds([(1, 0), (0, 1)], 2, "bounds")
