"""Taylor-mode Taylor coefficients: agreement with the symbolic Lie derivatives, closed forms, exact derivatives."""

import math

import numpy as np
import pytensor.tensor as pt
import pytest

import pymc_pnode as pn
from pymc_pnode import _codegen, _taylor_mode


def _every_rule(y, t, p):
    """A field that passes through every family of Taylor rules (products, quotients, primitives with and
    without a cycle, powers, piecewise functions)."""
    return [
        p[0] * pt.exp(-y[1]) * y[0] + pt.sin(t) * pt.cos(y[2]) - pt.tanh(y[0] * p[1]) + pt.sinh(0.3 * y[1]),
        pt.sqrt(y[0] ** 2 + 1.5) / (1 + y[2] ** 2) + pt.log(2 + y[1] ** 2) * pt.sigmoid(y[0]) + 0.01 * y[2] ** 2.5
        + pt.expm1(0.2 * y[0]) * pt.log1p(y[2]) - pt.arcsin(0.5 * y[0]) + pt.cosh(0.2 * y[2]),
        pt.softplus(y[1]) - pt.maximum(y[0], 0.3 * y[1]) + pt.abs(y[2] - 0.2) * p[1] + pt.arctan(y[0])
        + y[1] ** p[0] + pt.switch(y[0] > 0, y[1] ** 3, -y[2]) + pt.erf(y[1]) + pt.tan(0.1 * y[0]) / y[1],
    ]


def _symbolic(ode, kind, order):
    """The generated functions of the symbolic Lie derivatives (the path fields without Taylor rules take)."""
    source = {"taylor": ode._taylor_source, "taylor_vjp": ode._taylor_vjp_source,
              "taylor_jac": ode._taylor_jac_source}[kind](order)
    module = _codegen.load_native(_codegen.source_key(ode._key, f"symbolic-{kind}-{order}"), [source])
    d, k = ode.n_states, ode.n_theta
    shapes = {"taylor": [(order + 1, d)], "taylor_vjp": [(order + 1, d), (d,), (k,)],
              "taylor_jac": [(order + 1, d, d), (order + 1, d, k)]}[kind]
    return ode._compiled(module, kind, *shapes)


@pytest.fixture(scope="module")
def every_rule_ode():
    return pn.ODE(_every_rule, n_states=3, n_theta=2)


@pytest.mark.parametrize("order", [0, 1, 3])
def test_taylor_mode_equals_the_symbolic_lie_derivatives(every_rule_ode, order, rng):
    ode = every_rule_ode
    assert ode._taylor_tape("taylor") is not None
    y, t, p = np.array([0.4, 0.9, 0.6]), 0.3, np.array([1.3, 0.7])
    out, ref = np.empty((order + 1, 3)), np.empty((order + 1, 3))
    ode.taylor_coefficients(order)(y, t, p, out)
    _symbolic(ode, "taylor", order)(y, t, p, ref)
    assert np.allclose(out, ref, rtol=1e-12, atol=1e-12)

    w = rng.normal(size=(order + 1, 3))
    gy, gp, ry, rp = np.empty(3), np.empty(2), np.empty(3), np.empty(2)
    ode.taylor_vjp(order)(y, t, p, w, gy, gp)
    _symbolic(ode, "taylor_vjp", order)(y, t, p, w, ry, rp)
    assert np.allclose(gy, ry, rtol=1e-12, atol=1e-12)
    assert np.allclose(gp, rp, rtol=1e-12, atol=1e-12)

    jy, jp = np.empty((order + 1, 3, 3)), np.empty((order + 1, 3, 2))
    ode.taylor_functions(order)[1](y, t, p, jy, jp)
    assert np.allclose(np.einsum("ki,kij->j", w, jy), gy, rtol=1e-12, atol=1e-12)
    assert np.allclose(np.einsum("ki,kij->j", w, jp), gp, rtol=1e-12, atol=1e-12)


def test_high_orders_match_closed_forms():
    # y' = y² (y = y0 / (1 - y0 t)): y^(k)(0) = k! y0^(k+1); y' = p cos(t) from t0: y^(k) = p cos^(k-1)(t0).
    ode = pn.ODE(lambda y, t, p: [y[0] ** 2, p[0] * pt.cos(t)], n_states=2, n_theta=1, t0=0.7)
    order, y0, amplitude, t0 = 8, 0.6, 1.7, 0.7
    out = np.empty((order + 1, 2))
    ode.taylor_coefficients(order)(np.array([y0, 0.0]), t0, np.array([amplitude]), out)
    expected = [math.factorial(k) * y0 ** (k + 1) for k in range(order + 1)]
    assert np.allclose(out[:, 0], expected, rtol=1e-13)
    cosine_derivatives = [np.cos(t0), -np.sin(t0), -np.cos(t0), np.sin(t0)]
    assert np.allclose(out[1:, 1], [amplitude * cosine_derivatives[(k - 1) % 4] for k in range(1, order + 1)],
                       rtol=1e-13)


def test_high_order_derivatives_of_the_coefficients_match_central_differences(rng):
    ode = pn.ODE(lambda y, t, p: [p[0] * pt.sin(y[1]) - y[0] * pt.exp(-t), y[0] / (1 + p[1] * y[1] ** 2)],
                 n_states=2, n_theta=2)
    order, y, t, p = 6, np.array([0.3, -0.8]), 0.4, np.array([1.2, 0.5])
    taylor, taylor_jac = ode.taylor_functions(order)
    jy, jp = np.empty((order + 1, 2, 2)), np.empty((order + 1, 2, 2))
    taylor_jac(y, t, p, jy, jp)
    eps = 1e-6
    plus, minus = np.empty((order + 1, 2)), np.empty((order + 1, 2))
    for j in range(2):
        step = np.eye(2)[j] * eps
        taylor(y + step, t, p, plus)
        taylor(y - step, t, p, minus)
        assert np.allclose(jy[:, :, j], (plus - minus) / (2 * eps), rtol=1e-6, atol=1e-7)
        taylor(y, t, p + step, plus)
        taylor(y, t, p - step, minus)
        assert np.allclose(jp[:, :, j], (plus - minus) / (2 * eps), rtol=1e-6, atol=1e-7)
    w = rng.normal(size=(order + 1, 2))
    gy, gp = np.empty(2), np.empty(2)
    ode.taylor_vjp(order)(y, t, p, w, gy, gp)
    assert np.allclose(gy, np.einsum("ki,kij->j", w, jy), rtol=1e-12)
    assert np.allclose(gp, np.einsum("ki,kij->j", w, jp), rtol=1e-12)


def test_a_field_without_taylor_rules_uses_the_symbolic_coefficients():
    ode = pn.ODE(lambda y, t, p: [pt.arctan2(y[0], p[0])], n_states=1, n_theta=1)
    assert ode._taylor_tape("taylor") is None
    y0, scale = 0.8, 1.5
    out = np.empty((3, 1))
    ode.taylor_coefficients(2)(np.array([y0]), 0.0, np.array([scale]), out)
    assert ode._taylor_mode == {"taylor": False}
    slope = np.arctan2(y0, scale)
    assert np.allclose(out[:, 0], [y0, slope, scale / (y0**2 + scale**2) * slope], rtol=1e-13)


def _lorenz96(y, t, p):
    d = len(y)
    return [(y[(i + 1) % d] - y[i - 2]) * y[i - 1] - y[i] + p[0] for i in range(d)]


def test_the_tape_grows_with_the_fields_operations_not_with_d_squared():
    sizes = {}
    for d in (20, 40):
        ode = pn.ODE(_lorenz96, n_states=d, n_theta=1)
        jac_y, jac_p = ode._jacobian_graphs()
        tape = _taylor_mode.build_tape(ode._y, ode._t, ode._p, ode._f, jac_y, jac_p)
        sizes[d] = tape.ops.shape[0]
        assert tape.jac_y.shape[0] == 4 * d  # the non-zero Jacobian entries, not d²
    assert sizes[40] <= 2.1 * sizes[20]


def test_a_field_without_taylor_rules_leaves_the_interpreter_alone(monkeypatch):
    """``pt.mod`` has no Taylor rule: the field's coefficients come from its symbolic Lie derivatives, and the
    Taylor-mode interpreter (≈ 6 s to compile on a cold machine) is not registered for it; a field with rules
    registers it before its function is linked."""
    calls = []
    register = _taylor_mode.register_interpreter
    monkeypatch.setattr(_taylor_mode, "register_interpreter", lambda name: (calls.append(name), register(name)))
    ode = pn.ODE(lambda y, t, p: [pt.mod(y[0], 2.0) * p[0] - y[1], y[0]], n_states=2, n_theta=1)
    y, p, out = np.array([2.5, 0.3]), np.array([1.5]), np.empty((3, 2))
    ode.taylor_coefficients(2)(y, 0.0, p, out)
    f = np.array([0.5 * 1.5 - 0.3, 2.5])
    assert np.allclose(out[:2], [y, f], rtol=1e-14)
    assert np.allclose(out[2], [1.5 * f[0] - f[1], f[0]], rtol=1e-14)  # d mod(y0, 2)/dy0 = 1 here
    ode.taylor_vjp(2)
    assert calls == [] and ode._taylor_mode == {"taylor": False, "taylor_vjp": False}
    with_rules = pn.ODE(lambda y, t, p: [p[0] * y[0] + 0.25 * y[1], y[0]], n_states=2, n_theta=1)
    with_rules.taylor_coefficients(2)(y, 0.0, p, out)
    assert calls == ["taylor"] and np.allclose(out[1], [1.5 * 2.5 + 0.25 * 0.3, 2.5])
