"""The running rounding-error bound ``T(f)`` of a vector field (:mod:`pymc_pnode._rounding_bound`,
:attr:`pymc_pnode.ODE.term_scale`), which the EK0's rounding floor reads.

It must bound the rounding error of the generated ``f`` (checked against exact rational arithmetic at points where
the terms cancel), be of the size of the terms (not a blanket overestimate), and its vector–Jacobian product must be
its derivative.
"""

from fractions import Fraction

import numpy as np
import pytensor.tensor as pt
import pytest

import pymc_pnode as pn

EPS = np.finfo(float).eps


def _logistic(y, t, p):
    return [p[0] * y[0] * (1 - y[0] / p[1])]


def _lotka_volterra(y, t, p):
    return [p[0] * y[0] - p[1] * y[0] * y[1], p[3] * y[0] * y[1] - p[2] * y[1]]


def _rational(y, t, p):  # a Michaelis–Menten uptake against a linear supply, and a difference of squares
    return [p[0] - p[1] * y[0] / (p[2] + y[0]), (y[0] - y[1]) * (y[0] + y[1]) - p[3] * t]


def _cancelling_points(name, rng, n):
    """(y, t, θ) near where the field's terms cancel: its equilibria (plus rounding-sized offsets) and random points."""
    points = []
    for i in range(n):
        wiggle = 1.0 + rng.choice([0.0, 1e-15, -3e-15, 1e-12, 1e-6])
        if name == "logistic":
            theta = np.array([rng.uniform(0.1, 3.0), rng.uniform(1.0, 1e3)])
            y = np.array([theta[1] * wiggle])
        elif name == "lotka_volterra":
            theta = rng.uniform(0.2, 4.0, 4)
            y = np.array([theta[2] / theta[3], theta[0] / theta[1]]) * wiggle
        else:
            theta = rng.uniform(0.5, 5.0, 4)
            theta[0] = theta[1] * rng.uniform(0.1, 0.9)  # supply below the uptake's maximum: an equilibrium
            y0 = theta[0] * theta[2] / (theta[1] - theta[0])
            y = np.array([y0 * wiggle, y0 * (1.0 + rng.choice([0.0, 1e-15, 1e-9]))])
        t = 0.0 if (name != "rational" or i % 2) else float(rng.uniform(0.0, 1e-12))
        points.append((y, t, theta))
    return points


def _exact(field, y, t, theta):
    return [float(v) for v in field([Fraction(v) for v in y], Fraction(t), [Fraction(v) for v in theta])]


@pytest.mark.parametrize("field, n_states, n_theta", [(_logistic, 1, 2), (_lotka_volterra, 2, 4), (_rational, 2, 4)],
                         ids=["logistic", "lotka_volterra", "rational"])
def test_term_scale_bounds_the_rounding_error_of_the_generated_field(field, n_states, n_theta):
    ode = pn.ODE(field, n_states, n_theta)
    term_scale, _ = ode.term_scale
    rng = np.random.default_rng(7)
    out, scale = np.empty(n_states), np.empty(n_states)
    ratios = []
    for y, t, theta in _cancelling_points(field.__name__.strip("_"), rng, 400):
        ode.rhs(y, t, theta, out)
        term_scale(y, t, theta, scale)
        error = np.abs(out - _exact(field, y, t, theta))
        # (the exact value is of the float64 inputs: the bound's |y| part covers their own rounding, not measured)
        assert np.all(error <= EPS * scale * (1 + 1e-6) + 1e-300), (y, t, theta, error, scale)
        ratios.extend(error[scale > 0] / (EPS * scale[scale > 0]))
    ratios = np.array(ratios)
    assert ratios.max() > 0.01  # a bound of the right size: some errors reach a good part of it


def test_term_scale_is_the_scale_of_the_terms_at_an_equilibrium():
    # f = r y (1 − y/K) at y = K = 10, r = 0.8: the terms r y and y/K are 8 and 1; T = 32 by the rules (each
    # operation's inputs and result, propagated), of the size of Σ_a |L_a ξ_a| = 8, not of f = 0
    ode = pn.ODE(_logistic, 1, 2)
    scale = np.empty(1)
    ode.term_scale[0](np.array([10.0]), 0.0, np.array([0.8, 10.0]), scale)
    assert scale[0] == pytest.approx(32.0)


@pytest.mark.parametrize("field, n_states, n_theta", [(_lotka_volterra, 2, 4), (_rational, 2, 4)],
                         ids=["lotka_volterra", "rational"])
def test_term_scale_vjp_is_its_derivative(field, n_states, n_theta):
    ode = pn.ODE(field, n_states, n_theta)
    term_scale, vjp = ode.term_scale
    rng = np.random.default_rng(3)
    y, t, theta = rng.uniform(0.5, 2.0, n_states), 0.3, rng.uniform(0.5, 2.0, n_theta)
    w = rng.standard_normal(n_states)
    grad_y, grad_p = np.empty(n_states), np.empty(n_theta)
    vjp(y, t, theta, w, grad_y, grad_p)

    def weighted(y_, theta_):
        out = np.empty(n_states)
        term_scale(y_, t, theta_, out)
        return w @ out

    h = 1e-6
    for j in range(n_states):
        e = np.zeros(n_states)
        e[j] = h
        assert grad_y[j] == pytest.approx((weighted(y + e, theta) - weighted(y - e, theta)) / (2 * h), rel=1e-6)
    for j in range(n_theta):
        e = np.zeros(n_theta)
        e[j] = h
        assert grad_p[j] == pytest.approx((weighted(y, theta + e) - weighted(y, theta - e)) / (2 * h), rel=1e-6,
                                          abs=1e-9)


def test_a_selection_selects_the_bound_and_comparisons_carry_none():
    def field(y, t, p):
        return [pt.switch(y[0] > p[0], y[0] - p[0], 2.0 * (p[0] - y[0]))]

    ode = pn.ODE(field, 1, 1)
    scale = np.empty(1)
    for y, expected in ((3.0, 3.0 + 5.0), (1.0, 2.0 * (1.0 + 3.0) + 2.0 * 1.0 * 1.0)):
        # y − p: T(y) + |y| + |p|; 2 (p − y): 2 (|y| + |p| + |y|) + |2 (p − y)| (a product's own rounding)
        ode.term_scale[0](np.array([y]), 0.0, np.array([2.0]), scale)
        assert scale[0] == pytest.approx(expected)
