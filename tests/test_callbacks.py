"""The C callbacks through which kernels call an ODE's generated functions (``pymc_pnode._callbacks``)."""

import numba as nb
import numpy as np
import pytensor.tensor as pt
import pytest
from numba.core.errors import TypingError

import pymc_pnode as pn
from pymc_pnode._callbacks import call


@nb.njit
def _call_into(address, y, t, p, a):
    call(address, y, t, p, a)


@nb.njit
def _call_into_two(address, y, t, p, a, b):
    call(address, y, t, p, a, b)


@nb.njit
def _call_into_three(address, y, t, p, a, b, c):
    call(address, y, t, p, a, b, c)


_CALLERS = {1: _call_into, 2: _call_into_two, 3: _call_into_three}


def _field(y, t, p):
    # Three states, two parameters, time-dependent, with non-zero second derivatives in y and (y, θ).
    return [p[0] * y[0] * y[1] - pt.sin(t), y[2] ** 2 - p[1] * y[0], pt.exp(-y[1]) * p[0] + t * y[2]]


@pytest.fixture(scope="module")
def ode():
    return pn.ODE(_field, n_states=3, n_theta=2)


def _generated_functions(ode, order=3):
    taylor, taylor_jac = ode.taylor_functions(order)
    return {"rhs": ode.rhs, "jac_y": ode.jac_y, "jac_p": ode.jac_p, "hess_yy": ode.hess_yy, "hess_yp": ode.hess_yp,
            "hess_rows_y": ode.hess_rows_y, "hess_rows_p": ode.hess_rows_p, "hess_contract": ode.hess_contract,
            "taylor": taylor, "taylor_jac": taylor_jac,
            "taylor_vjp": ode.taylor_vjp(order)}


@pytest.mark.parametrize("name", ["rhs", "jac_y", "jac_p", "hess_yy", "hess_yp", "hess_rows_y", "hess_rows_p",
                                  "hess_contract", "taylor", "taylor_jac", "taylor_vjp"])
def test_callback_writes_what_the_generated_function_writes(ode, name):
    function = _generated_functions(ode)[name]
    rng = np.random.default_rng(3)
    y, t, p = rng.uniform(0.5, 1.5, 3), 0.7, rng.uniform(0.5, 1.5, 2)
    y_shape, p_shape, *array_shapes = function.shapes
    assert y_shape == (3,) and p_shape == (2,)
    # Contracted forms take a weight array before their outputs: random inputs there, NaN-filled outputs elsewhere.
    inputs = 1 if name in ("hess_contract", "taylor_vjp") else 0
    expected = [rng.standard_normal(s) if i < inputs else np.full(s, np.nan) for i, s in enumerate(array_shapes)]
    got = [a.copy() for a in expected]
    function(y, t, p, *expected)
    _CALLERS[len(got)](function.address, y, t, p, *got)
    for e, g in zip(expected, got):
        assert np.all(np.isfinite(g))
        np.testing.assert_array_equal(g, e)


def test_taylor_callbacks_are_per_order(ode):
    y, p = np.array([1.0, 0.5, 0.2]), np.array([0.3, 0.8])
    low, high = ode.taylor_coefficients(2), ode.taylor_coefficients(4)
    assert low.shapes[2] == (3, 3) and high.shapes[2] == (5, 3)
    assert low.address != high.address
    out_low, out_high = np.empty((3, 3)), np.empty((5, 3))
    _call_into(low.address, y, 0.0, p, out_low)
    _call_into(high.address, y, 0.0, p, out_high)
    np.testing.assert_array_equal(out_high[:3], out_low)  # the same coefficients, more of them


def test_a_second_ode_of_the_same_field_reuses_the_cached_wrapper(ode):
    again = pn.ODE(_field, n_states=3, n_theta=2)
    assert again.rhs.address == ode.rhs.address  # the same generated module, loaded once per process


def test_call_refuses_arrays_that_are_not_c_contiguous(ode):
    y, p = np.ones(3), np.ones(2)
    strided = np.empty(6)[::2]
    with pytest.raises(TypingError):
        _call_into(ode.rhs.address, y, 0.0, p, strided)
