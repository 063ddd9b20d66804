"""The guard against rounding-noise gradients of the Fenrir likelihood (docs/fenrir.md, "Gradients on strongly
unstable invariant sets").

The covariance-form adjoint of an update applies the congruence ``(I − K H)ᵀ · (I − K H)``; with a huge gain
(``H x`` has a far smaller variance than its terms) float64 rounding can swamp the result. The kernel bounds
that rounding at every update (:func:`~pymc_pnode.filtering.update.congruence_rounding`); above a threshold the
gradient is recomputed with other rounding errors and refused (``-inf``, counted, warned) if it changed.

Also here: derivatives at a solution that sits exactly at an equilibrium of the vector field, where error control
and the local diffusion have no information (docs/fenrir.md, "Known failures"), are counted and warned.
"""

import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from scipy.integrate import solve_ivp
from scipy.stats import norm

import pymc_pnode as pn
from pymc_pnode.accuracy import ROUNDING_CHECK
from pymc_pnode.filtering.update import (
    Cotangent,
    GaussianObservation,
    UpdateAdjointOut,
    update_adjoint,
    update_adjoint_work,
)
from pymc_pnode.pn_solution import PNSolutionProblem


def _adjoint_in_float64(sp, hm, sbar):
    """The package's update adjoint with no mean or likelihood cotangent: ``Σ̄⁻ = (I − K H)ᵀ Σ̄⁺ (I − K H)``, and
    its rounding bound."""
    n = sp.shape[0]
    bar = Cotangent(np.zeros(n), sbar.copy())
    out = UpdateAdjointOut(np.empty(1), np.empty(1), np.zeros((1, n)), np.zeros(1))
    assert update_adjoint(GaussianObservation(hm, np.zeros(1), np.zeros(1), 1), sp, sp, np.zeros(n), (0.0, 0.0),
                          bar, False, out, update_adjoint_work(n, 1))
    return bar.cov, out.rounding[0]


def _scaled_norm(x, sp):
    """Frobenius norm in the coordinates of the bound (each state scaled by its standard deviation)."""
    s = np.sqrt(np.diag(sp))
    return np.linalg.norm(s[:, None] * x * s)


def _covariances(n_big):
    """States (a, b, c) with b = a − c, var a = n_big², var c = 1, observed as z = a − b = c. For large n_big
    the gain is huge in scaled coordinates (z is c exactly, but as a − b its terms are n_big times larger). The
    entries are integers, so S = 1 and K = (0, −1, 1) are exact in float64."""
    big = float(n_big) ** 2
    sp = np.array([[big, big, 0.0], [big, big + 1.0, -1.0], [0.0, -1.0, 1.0]])
    return sp, np.array([[1.0, -1.0, 0.0]])


@pytest.mark.parametrize("n_big", [1.0, 1e3, 1e6])
def test_rounding_bound_is_the_adjoint_steps_sensitivity_to_rounding_of_its_input(n_big):
    # Σ̄⁺ carries rounding errors of relative size ε (in the scaled norm) from the steps after this one; the
    # bound says how much they can change Σ̄⁻, relative to it. Σ̄⁺ is chosen orthogonal to K, so that the
    # congruence cancels (the exact Σ̄⁻ is Σ̄⁺): the case where a huge gain shows. The bound must hold, and be
    # nearly attained.
    sp, hm = _covariances(n_big)
    rng = np.random.default_rng(1)
    w = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]).T @ rng.standard_normal((2, 2))  # columns ⊥ K = (0, −1, 1)
    sbar = w @ w.T
    value, bound = _adjoint_in_float64(sp, hm, sbar)
    # a perturbation of scaled norm ε ‖Σ̄⁺‖ (random in the scaled coordinates), mapped back
    scaled = rng.standard_normal((3, 3))
    scaled = (scaled + scaled.T) * np.finfo(float).eps * _scaled_norm(sbar, sp) / np.linalg.norm(scaled + scaled.T)
    s = np.sqrt(np.diag(sp))
    noise = scaled / s[:, None] / s
    perturbed, _ = _adjoint_in_float64(sp, hm, sbar + noise)
    change = _scaled_norm(perturbed - value, sp) / _scaled_norm(value, sp)
    assert change <= 1.01 * bound + 8 * np.finfo(float).eps  # plus this computation's own rounding
    if n_big == 1.0:
        assert bound < 1e-14  # an ordinary update: far below the check threshold
    if n_big >= 1e6:
        assert bound > ROUNDING_CHECK and change > 1e-3 * bound  # the sensitivity is real, and flagged


def test_generic_cotangent_with_a_huge_gain_is_not_flagged():
    # Without cancellation the congruence's result is as large as its terms: rounding is small relative to it.
    sp, hm = _covariances(1e6)
    s = np.sqrt(np.diag(sp))
    scaled = np.random.default_rng(2).standard_normal((3, 3))
    _, bound = _adjoint_in_float64(sp, hm, (scaled @ scaled.T) / s[:, None] / s)
    assert bound < 1e-14


# Lotka–Volterra in the Fenrir paper's parametrisation (θ = (α, β, δ, γ)); with the predator at 0 the ODE
# sits on an invariant set whose linearised predator grows like e^{∫ γ y1 dt} (≈ e^36 over [0, 2] here).
def _lv(y, t, p):
    return [p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]]


@pytest.fixture(scope="module")
def unstable_lv():
    """Value-and-gradient function of x = (y0, θ, log σ², log κ) at a point an optimiser of the paper's
    §5.1 study reached (case_studies/fenrir_paper.ipynb): EK1(5), step 5e-3, fixed diffusion."""
    ode = pn.ODE(_lv, n_states=2, n_theta=4)
    times = np.round(np.arange(0.0, 2.0001, 0.1), 10)
    truth = solve_ivp(lambda t, y: _lv(y, t, (2.0, 1.0, 4.0, 1.0)), (0.0, 2.0), [5.0, 3.0], t_eval=times,
                      rtol=1e-10, atol=1e-10).y.T
    data = truth + 0.1 * np.random.default_rng([2022, 3]).standard_normal(truth.shape)
    x = pt.vector("x")
    ll = pn.fenrir_loglik(ode, x[:2], x[2:6], times, data, obs_sigma=pt.exp(0.5 * x[6]), diffusion=pt.exp(x[7]),
                          solver=pn.EK1(order=5), step=5e-3)
    fn = pytensor.function([x], [ll, pytensor.grad(ll, x)])
    value_fn = pytensor.function([x], ll)
    point = np.array([5.94091217, 0.0, 0.100767923, 5.81630687, 3.5776509e-03, 2.99526015, 2.08222103, 19.2292975])
    return fn, value_fn, point, ll


def _counts(ll):
    op = ll.owner.inputs[0].owner.op  # Sum(FenrirOp(...))
    return op.problem.diagnostics


def test_rounding_noise_gradient_is_refused_counted_and_warned(unstable_lv):
    fn, value_fn, point, ll = unstable_lv
    counts = _counts(ll)
    before = counts.n_unreliable_gradient
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value, grad = fn(point)  # the predator exactly 0
    assert value == -np.inf and np.all(grad == 0.0)
    assert counts.n_unreliable_gradient == before + 1
    messages = [str(w.message) for w in caught if issubclass(w.category, pn.AccuracyWarning)]
    assert any("gradient was rounding noise" in m for m in messages), messages
    assert np.isfinite(value_fn(point))  # the value alone is still computed


def test_gradient_away_from_the_invariant_set_is_kept_and_exact(unstable_lv):
    fn, _, point, ll = unstable_lv
    counts = _counts(ll)
    before = counts.n_failed
    x = point.copy()
    x[1] = 1e-3
    value, grad = fn(x)
    assert np.isfinite(value) and counts.n_failed == before
    for j in (0, 2, 5):
        e = np.zeros_like(x)
        e[j] = 1e-6 * max(1.0, abs(x[j]))
        fd = (fn(x + e)[0] - fn(x - e)[0]) / (2 * e[j])
        np.testing.assert_allclose(grad[j], fd, rtol=1e-4)


@pytest.fixture(scope="module")
def unstable_lv_solution():
    """:class:`PNSolutionProblem` of the same Lotka–Volterra ODE, grid and diffusion (filtering marginals)."""
    ode = pn.ODE(_lv, n_states=2, n_theta=4)
    times = np.round(np.arange(0.1, 2.0001, 0.1), 10)
    return PNSolutionProblem(ode, times, pn.EK1(order=5), 5e-3, 1e-4, 1e-6, 20_000, float(np.exp(19.2292975)))


def test_probabilistic_solution_jacobians_that_are_rounding_noise_are_refused(unstable_lv_solution):
    problem = unstable_lv_solution
    theta = np.array([0.100767923, 5.81630687, 3.5776509e-03, 2.99526015])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        refused = problem.evaluate(np.array([5.94091217, 0.0]), theta)
    assert refused.log_ok[0] == -np.inf and not refused.jac_std.any()
    assert problem.diagnostics.n_unreliable_gradient == 1
    assert any("gradient was rounding noise" in str(w.message) for w in caught)
    # away from the invariant set the Jacobians are kept, and exact
    y0 = np.array([5.94091217, 1e-3])
    kept = problem.evaluate(y0, theta)
    assert kept.log_ok[0] == 0.0 and problem.diagnostics.n_unreliable_gradient == 1
    h = 1e-6
    up, down = problem.evaluate(y0, theta + [h, 0, 0, 0]), problem.evaluate(y0, theta - [h, 0, 0, 0])
    np.testing.assert_allclose(kept.jac_mean[..., 2], (up.mean - down.mean) / (2 * h), rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(kept.jac_std[..., 2], (up.std - down.std) / (2 * h), rtol=1e-4, atol=1e-12)


def _logistic(y, t, p):
    return [p[0] * y[0] * (1 - y[0] / p[1])]


@pytest.fixture(scope="module")
def logistic_ode():
    return pn.ODE(_logistic, n_states=1, n_theta=2)


def _equilibrium_warnings(caught) -> int:
    return sum("exactly at an equilibrium" in str(w.message) for w in caught
               if issubclass(w.category, pn.AccuracyWarning))


@pytest.mark.parametrize("kwargs, flagged", [({}, True), (dict(step=0.25, diffusion="local"), True),
                                             (dict(step=0.25, diffusion="global"), False)])
def test_a_gradient_at_an_exact_equilibrium_is_counted_and_warned(logistic_ode, kwargs, flagged):
    """Logistic growth from y0 = 0, an equilibrium (and the initial point of a ``y0 ~ N(0, 1)`` prior): every ODE
    residual and derivative is exactly zero, so error control and the local diffusion have no information there, and
    the gradient is far from the derivative of the value (defaults: −594 against −36,462). The value is exact; the
    gradient is counted and warned, not only at the defaults. A fixed step with the global diffusion depends on no
    residual: its gradient at 0 is the derivative, and quiet. Off the equilibrium: quiet, gradients exact."""
    times, sigma = np.linspace(1.0, 12.0, 12), 0.2
    data = sigma * np.random.default_rng(0).standard_normal(times.size)
    y0 = pt.dvector("y0")
    ll = pn.fenrir_loglik(logistic_ode, y0, np.array([0.8, 10.0]), times, data, obs_sigma=sigma, **kwargs)
    fn, value_fn = pytensor.function([y0], [ll, pytensor.grad(ll, y0)]), pytensor.function([y0], ll)
    counts = _counts(ll)

    def central_difference(y, h):
        return (value_fn([y + h]) - value_fn([y - h])) / (2 * h)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert value_fn([0.0]) == pytest.approx(norm.logpdf(data, 0.0, sigma).sum(), abs=1e-9)  # the solution ≡ 0
        assert _equilibrium_warnings(caught) == 0  # a value alone is not flagged
        value, grad = fn([0.0])
        assert _equilibrium_warnings(caught) == int(flagged) and counts.n_equilibrium_gradient == int(flagged)
        derivative = central_difference(0.0, 1e-9)
        if flagged:
            assert abs(grad[0] - derivative) > 0.05 * abs(derivative)  # why it is flagged (−594 vs −36,462)
        else:
            np.testing.assert_allclose(grad[0], derivative, rtol=1e-5)
        for start in (1e-3, 0.02):  # (below 0 the solution blows down to −∞ before t = 12)
            assert np.isfinite(fn([start])[0])
            np.testing.assert_allclose(fn([start])[1][0], central_difference(start, 1e-7), rtol=1e-4)
        assert counts.n_equilibrium_gradient == int(flagged) and counts.as_dict()["n_equilibrium_gradient"] == int(
            flagged)


@pytest.mark.parametrize("solver", [pn.EK1(3), pn.EK1(3, structure="diagonal"), pn.EK0(3),
                                    pn.EK0(3, structure="isotropic")], ids=str)
def test_a_start_within_rounding_of_an_equilibrium_has_the_derivative(logistic_ode, solver):
    """Logistic growth from K (1 + 1e-15), K (1 + 1e-14) and ``exp(log 10)``: the carrying capacity K = 10 up to
    rounding, fixed step 0.25 and the local diffusion. f(y0) is the rounding error of its cancelling terms, the
    residuals are rounding noise whose derivatives are ≈ 1e15 times their size, and the gradient was −2.3e11 (EK1)
    and −4.6e11 (EK0) against the value's derivative 0.45, unflagged. With the rounding floor's scale of f's terms
    (calibration.rounding_kappa: ``|L ξ|`` for the EK1, the running bound ``T(f)`` for the EK0) such steps take the
    floor and differentiate it: the derivative, and quiet (not an exact equilibrium)."""
    times, sigma, theta = np.linspace(1.0, 12.0, 12), 0.2, np.array([0.8, 10.0])
    data = 10.0 + sigma * np.random.default_rng(0).standard_normal(times.size)
    y0 = pt.dvector("y0")
    ll = pn.fenrir_loglik(logistic_ode, y0, theta, times, data, obs_sigma=sigma, solver=solver, step=0.25,
                          diffusion="local")
    fn, value_fn = pytensor.function([y0], [ll, pytensor.grad(ll, y0)]), pytensor.function([y0], ll)
    h = 1e-5  # the value is smooth on this scale (a fixed grid), and leaves the rounding regime
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for start in (np.exp(np.log(10.0)), 10.0 * (1 + 1e-15), 10.0 * (1 + 1e-14)):
            assert start != 10.0
            value, grad = fn([start])
            assert value == pytest.approx(norm.logpdf(data, 10.0, sigma).sum(), abs=1e-6)
            np.testing.assert_allclose(grad[0], (value_fn([start + h]) - value_fn([start - h])) / (2 * h), rtol=0.01)
        # pn.probabilistic_solution's tangents follow the same floor: mean Jacobians within 6e-5 (EK1) and 5e-3
        # (EK0) of central differences on a derivative of 0.45 (2.8e-4 and 4.7e-3 before; the EK0's were never
        # rounding noise: benchmarks/equilibrium_rounding.py). Not closer, because the central difference leaves the
        # floor's regime: 1e-5 from K the residuals set the local diffusions, which the means of the EK0, without
        # L in its update, follow more (the floor's own tangents: the ballistic test below).
        problem = PNSolutionProblem(logistic_ode, times, solver, 0.25, 1e-6, 1e-9, 100_000, "local")
        for start in (np.exp(np.log(10.0)), 10.0 * (1 + 1e-14)):
            y = np.array([start])
            central = (problem.evaluate(y + h, theta).mean - problem.evaluate(y - h, theta).mean) / (2 * h)
            np.testing.assert_allclose(problem.evaluate(y, theta).jac_mean[..., 0], central,
                                       atol=1e-4 if solver.ek1 else 6e-3)
    assert not [w for w in caught if issubclass(w.category, pn.AccuracyWarning)]
    assert _counts(ll).n_equilibrium_gradient == 0


def _ballistic(y, t, p):
    return [y[1], -p[0] + p[1] * t]


@pytest.mark.parametrize("solver", [pn.EK0(3), pn.EK0(3, structure="isotropic"), pn.EK1(3)], ids=str)
def test_tangents_of_the_rounding_floor_are_exact(solver):
    """A cubic solution, which the IWP(3) prior represents exactly: every residual is rounding noise and every step's
    local diffusion is the rounding floor ρ_n, a smooth function of (y0, θ) through ``E1 μ⁻``, ``f`` and the scale of
    f's terms (the EK0's ``T(f)`` depends on θ too: ``|p1 t|``). The probabilistic solution's standard deviations are
    ``√ρ``-sized (≈ 5e-17) and their tangents (``jac_std``), which differentiate the floor, equal central differences
    (measured: within 1e-8 relative). Not the EK1's in θ1: its floor, whose scale for the velocity has no ``T(f)``
    and lacks the prediction's own terms, is exceeded by the residual's noise at some steps, and the standard
    deviations jump (by 2.9e-17 under a change of 1e-8 in θ1, measured): no floor tangent to check there."""
    ode = pn.ODE(_ballistic, n_states=2, n_theta=2)
    problem = PNSolutionProblem(ode, np.linspace(0.5, 3.0, 11), solver, 0.25, 1e-6, 1e-9, 100_000, "local")
    y0, theta = np.array([1.0, 4.0]), np.array([2.0, 0.5])
    at = problem.evaluate(y0, theta)
    assert 0.0 < at.std.max() < 1e-15
    for j in range(1, 4) if not solver.ek1 else range(1, 3):  # (the height's y0 moves nothing)
        shift = np.zeros(4)
        shift[j] = 1e-6
        up = problem.evaluate(y0 + shift[:2], theta + shift[2:])
        down = problem.evaluate(y0 - shift[:2], theta - shift[2:])
        central = (up.std - down.std) / 2e-6
        assert np.abs(central).max() > 1e-18
        np.testing.assert_allclose(at.jac_std[..., j], central, rtol=0, atol=1e-6 * np.abs(central).max())


def test_probabilistic_solution_jacobians_at_an_exact_equilibrium_are_counted_and_warned(logistic_ode):
    """The same for ``pn.probabilistic_solution`` (error control, local diffusion): at y0 = 0 every step is at
    the equilibrium (``pn.solve`` counts them in ``stats["n_at_equilibrium"]``) and the Jacobians are flagged; off it,
    none."""
    times, theta = np.linspace(1.0, 12.0, 12), np.array([0.8, 10.0])
    problem = PNSolutionProblem(logistic_ode, times, pn.EK1(3), None, 1e-6, 1e-9, 100_000, None)
    sol = pn.solve(logistic_ode, [0.0], theta, (0.0, 12.0), save_at=times)
    assert sol.stats["n_at_equilibrium"] == sol.stats["n_steps"] > 0
    assert pn.solve(logistic_ode, [1e-3], theta, (0.0, 12.0), save_at=times).stats["n_at_equilibrium"] == 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        at_zero = problem.evaluate(np.array([0.0]), theta)
        assert _equilibrium_warnings(caught) == 1 and problem.diagnostics.n_equilibrium_gradient == 1
        assert at_zero.log_ok[0] == 0.0 and not at_zero.mean.any()  # kept: the value is exact
        problem.evaluate(np.array([1e-3]), theta)
    assert problem.diagnostics.n_equilibrium_gradient == 1
