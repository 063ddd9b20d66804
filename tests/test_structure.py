"""State-space structures (isotropic EK0, block-diagonal EK1): equal to the dense filter where the maths says so."""

import numba as nb
import numpy as np
import pytensor.tensor as pt
import pytest
from scipy.integrate import solve_ivp
from scipy.stats import norm

import pymc_pnode as pn
from pymc_pnode._callbacks import call
from pymc_pnode.filtering.odefilter import Diffusion, run_block_filter, run_filter
from pymc_pnode.filtering.stepping import Stepping
from pymc_pnode.filtering.structure import initial_root
from pymc_pnode.filtering.update import VectorField
from pymc_pnode.solve import DIFFUSION_FIXED, ProbabilisticSolution, fixed_grid, validate_filter
from tests.conftest import assert_gradient_matches_central_differences

D = 5


def reaction_diffusion(y, t, p):
    # A periodic chain with cubic reaction: the Jacobian's diagonal -3 a y_i² - 2 b differs between states
    # and changes in time, and the off-diagonal couplings b are what the diagonal EK1 leaves out.
    return [-p[0] * y[i] ** 3 + p[1] * (y[i - 1] - 2 * y[i] + y[(i + 1) % D]) + p[2] * np.sin(i) for i in range(D)]


@pytest.fixture(scope="module")
def chain_ode():
    return pn.ODE(reaction_diffusion, n_states=D, n_theta=3)


Y0 = np.array([1.0, -0.5, 0.3, 0.8, -1.2])
THETA = np.array([1.0, 0.7, 0.4])
SAVE = np.linspace(0.0, 2.0, 9)


def _assert_same_solution(a, b, tol=1e-9):
    assert a.stats["n_steps"] == b.stats["n_steps"] and a.stats["success"] and b.stats["success"]
    assert np.array_equal(a.t, b.t)
    scale = 1.0 + np.abs(a.mean)
    assert np.max(np.abs(a.mean - b.mean) / scale) < tol
    assert np.allclose(a.cov, b.cov, rtol=1e-7, atol=1e-14 * np.max(np.abs(a.cov)))
    assert np.isclose(a.stats["diffusion"], b.stats["diffusion"], rtol=1e-8)


@pytest.mark.parametrize("diffusion", ["calibrated", "local", 0.3])
@pytest.mark.parametrize("step", [0.02, None], ids=["fixed", "adaptive"])
@pytest.mark.parametrize("structure", ["isotropic", "diagonal"])
def test_structured_ek0_equals_dense_ek0(chain_ode, diffusion, step, structure):
    """Under the EK0 (L = 0) with one scalar diffusion the dense covariance is P ⊗ I_d: the isotropic and the
    block-diagonal EK0 are the same filter, smoothed marginals and dense output included."""
    kwargs = dict(save_at=SAVE, step=step, diffusion=diffusion, rtol=1e-5, atol=1e-7)
    dense = pn.solve(chain_ode, Y0, THETA, (0.0, 2.0), solver=pn.EK0(3), **kwargs)
    structured = pn.solve(chain_ode, Y0, THETA, (0.0, 2.0), solver=pn.EK0(3, structure), **kwargs)
    _assert_same_solution(dense, structured)
    assert np.all(structured.std[1:] > 0.0)
    raw = dict(kwargs, smooth=False)
    _assert_same_solution(pn.solve(chain_ode, Y0, THETA, (0.0, 2.0), solver=pn.EK0(3), **raw),
                          pn.solve(chain_ode, Y0, THETA, (0.0, 2.0), solver=pn.EK0(3, structure), **raw))
    off_grid = np.array([0.13, 0.91, 1.77])
    m_dense, c_dense = dense.interpolate(off_grid)
    m_struct, c_struct = structured.interpolate(off_grid)
    assert np.allclose(m_dense, m_struct, rtol=1e-9, atol=1e-12)
    assert np.allclose(c_dense, c_struct, rtol=1e-7, atol=1e-14 * np.max(np.abs(c_dense)))
    joint_dense, joint_struct = dense.joint_cov(), structured.joint_cov()
    assert np.allclose(joint_dense, joint_struct, rtol=1e-7, atol=1e-14 * np.max(np.abs(joint_dense)))


def _diagonal_of(jac_y, d):
    """The Jacobian with its off-diagonal entries zeroed, as a C callback like those the kernels take (keep the
    returned object alive while its ``address`` is in use)."""
    full_jacobian, k = jac_y.address, jac_y.shapes[1][0]
    pointer = nb.types.CPointer(nb.float64)

    @nb.cfunc(nb.types.void(pointer, nb.float64, pointer, pointer))
    def diagonal_jacobian(y, t, p, out):
        full = np.empty((d, d))
        call(full_jacobian, nb.carray(y, (d,)), t, nb.carray(p, (k,)), full)
        diagonal = nb.carray(out, (d, d))
        diagonal[:, :] = 0.0
        for i in range(d):
            diagonal[i, i] = full[i, i]

    return diagonal_jacobian


@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "adaptive"])
def test_diagonal_ek1_equals_dense_ek1_with_the_jacobians_diagonal(chain_ode, adaptive):
    """The block-diagonal EK1 is the dense EK1 run with L = diag(∂f/∂y): same grid, means, covariances,
    calibration, smoothing and dense output."""
    q = 3
    solver = pn.EK1(q, "diagonal")
    rq = solver.prior.Q_bar_sqrt
    coeffs = np.empty((q + 1, D))
    chain_ode.taylor_coefficients(q)(Y0, 0.0, THETA, coeffs)
    mu0 = coeffs.reshape(-1).copy()
    grid = fixed_grid(SAVE, 0.05) if not adaptive else SAVE
    stepping = Stepping(adaptive, 1e-3, 1e-6, 1e-8, 10_000, False)
    diffusion = Diffusion(DIFFUSION_FIXED, 0.5)
    diagonal_jacobian = _diagonal_of(chain_ode.jac_y, D)
    dense_field = VectorField(chain_ode.rhs.address, diagonal_jacobian.address, 0, THETA, True)
    dense_run, dense_stats = run_filter(dense_field, mu0, initial_root("dense", q, D), rq, diffusion, stepping, grid)
    block_field = VectorField(chain_ode.rhs.address, chain_ode.jac_y.address, 0, THETA, True)
    block_run, block_stats = run_block_filter(block_field, mu0, initial_root("diagonal", q, D), rq, diffusion,
                                              stepping, grid)
    assert dense_stats.status == block_stats.status == 0
    assert dense_stats.n_steps == block_stats.n_steps and dense_stats.n_rejected == block_stats.n_rejected
    assert np.isclose(dense_stats.stat_sum, block_stats.stat_sum, rtol=1e-9)
    np.testing.assert_allclose(block_run.grid, dense_run.grid, rtol=1e-9)  # adaptive steps: rounding
    np.testing.assert_allclose(block_run.mu, dense_run.mu, rtol=1e-8, atol=1e-11 * np.max(np.abs(dense_run.mu)))

    def solution(run, solver):
        out = np.nonzero(np.isin(run.grid, SAVE))[0]
        return ProbabilisticSolution(chain_ode, THETA, solver, run, out, {}, True)

    dense, block = solution(dense_run, pn.EK1(q)), solution(block_run, solver)
    np.testing.assert_allclose(block.mean, dense.mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(block.cov, dense.cov, rtol=1e-7, atol=1e-14 * np.max(np.abs(dense.cov)))
    off_grid = np.array([0.07, 1.31])
    for a, b in zip(block.interpolate(off_grid), dense.interpolate(off_grid)):
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-14 * np.max(np.abs(b)))
    joint = dense.joint_cov()
    np.testing.assert_allclose(block.joint_cov(), joint, rtol=1e-7, atol=1e-14 * np.max(np.abs(joint)))
    np.testing.assert_allclose(np.einsum("aiaj->aij", joint), dense.cov, rtol=1e-9, atol=1e-14 * np.max(np.abs(joint)))


@pytest.mark.parametrize("solver", [pn.EK1(4, "diagonal"), pn.EK0(4, "isotropic")],
                         ids=["EK1-diagonal", "EK0-isotropic"])
def test_structured_solvers_converge_to_the_scipy_solution(chain_ode, solver):
    ref = solve_ivp(lambda t, y: chain_ode.f(y, t, THETA), (0.0, 2.0), Y0, method="DOP853", rtol=1e-12,
                    atol=1e-12, t_eval=SAVE).y.T
    sol = pn.solve(chain_ode, Y0, THETA, (0.0, 2.0), solver=solver, save_at=SAVE, rtol=1e-8, atol=1e-10)
    assert sol.success
    assert np.max(np.abs(sol.mean - ref) / (1.0 + np.abs(ref))) < 1e-6
    assert np.all(np.isfinite(sol.std)) and np.all(sol.std[1:] > 0.0)


def test_block_diagonal_samples_match_the_posterior_moments(chain_ode, rng):
    sol = pn.solve(chain_ode, Y0, THETA, (0.0, 2.0), solver=pn.EK1(2, "diagonal"), step=0.1, save_at=SAVE)
    draws = sol.sample(4000, rng=rng)
    assert draws.shape == (4000, SAVE.size, D)
    later = slice(1, None)  # the initial state is exact
    se = sol.std[later] / np.sqrt(draws.shape[0])
    assert np.all(np.abs(draws.mean(axis=0)[later] - sol.mean[later]) < 5 * se)
    np.testing.assert_allclose(draws.std(axis=0)[later], sol.std[later], rtol=0.1)
    # States are independent under the block-diagonal posterior.
    corr = np.corrcoef(draws[:, -1, 0], draws[:, -1, 1])[0, 1]
    assert abs(corr) < 0.1


def test_structure_errors_name_the_structure(chain_ode):
    with pytest.raises(ValueError, match="structure.*isotropic.*EK0"):
        pn.EK1(3, "isotropic")
    with pytest.raises(ValueError, match="structure must be one of"):
        pn.EK0(3, "banded")
    with pytest.raises(ValueError, match="solver: a dense-only user supports the structures"):
        validate_filter(pn.EK1(3, "diagonal"), ("dense",), user="a dense-only user")


@pytest.mark.parametrize("diffusion", [None, "local", 0.5], ids=["calibrated", "local", "fixed"])
@pytest.mark.parametrize("solver", [pn.EK1(3, "diagonal"), pn.EK0(3, "isotropic"), pn.EK0(3, "diagonal")],
                         ids=["EK1-diagonal", "EK0-isotropic", "EK0-diagonal"])
def test_structured_probabilistic_solution_equals_solve_with_exact_gradients(chain_ode, solver, diffusion):
    """Filtered and smoothed tensors (with the covariance across times) of a structured solver: the numbers of
    ``pn.solve`` and gradients that match central differences (a fixed step: the exact derivative)."""
    times = SAVE[1:]
    kwargs = dict(solver=solver, step=0.05, diffusion=diffusion)
    solve_kwargs = dict(solver=solver, step=0.05, save_at=times, diffusion=diffusion)
    filtered = pn.solve(chain_ode, Y0, THETA, (0.0, 2.0), smooth=False, **solve_kwargs)
    smoothed = pn.solve(chain_ode, Y0, THETA, (0.0, 2.0), **solve_kwargs)
    joint = smoothed.joint_cov().reshape(times.size * D, times.size * D)
    mean_f, std_f = pn.probabilistic_solution(chain_ode, Y0, THETA, times, **kwargs)
    mean_s, std_s, cov_s = pn.probabilistic_solution(chain_ode, Y0, THETA, times, smooth=True, joint_cov=True,
                                                     **kwargs)
    np.testing.assert_array_equal(mean_f.eval(), filtered.mean)
    np.testing.assert_array_equal(std_f.eval(), filtered.std)
    np.testing.assert_array_equal(mean_s.eval(), smoothed.mean)
    np.testing.assert_array_equal(std_s.eval(), smoothed.std)
    np.testing.assert_allclose(cov_s.eval(), joint, rtol=1e-12, atol=1e-14 * np.abs(joint).max())
    # independent states (given the means): no covariance between different states at any two times
    assert np.all(smoothed.joint_cov()[:, 0, :, 1] == 0.0)
    rng = np.random.default_rng(7)
    weights = rng.standard_normal((4, times.size, D))
    cov_weights = rng.standard_normal(joint.shape) / np.abs(joint).max()

    def objective(y0, theta):
        mean_f, std_f = pn.probabilistic_solution(chain_ode, y0, theta, times, **kwargs)
        mean_s, std_s, cov_s = pn.probabilistic_solution(chain_ode, y0, theta, times, smooth=True, joint_cov=True,
                                                         **kwargs)
        return ((weights[0] * mean_f).sum() + (weights[1] * pt.log(std_f)).sum() + (weights[2] * mean_s).sum()
                + (weights[3] * pt.log(std_s)).sum() + (cov_weights * cov_s).sum())

    assert_gradient_matches_central_differences(objective, [Y0, THETA], rel=1e-6, abs_=1e-6)


# ---------------------------------------------------------------------------------------------- Fenrir
TIMES = np.linspace(0.2, 2.0, 10)
# Three observed states, one of them scaled: a selection every structure can condition on state by state.
CMAT = np.eye(D)[[0, 2, 3]] * np.array([[1.0], [2.0], [1.0]])


@pytest.fixture(scope="module")
def chain_data(chain_ode):
    truth = pn.solve(chain_ode, Y0, THETA, (0.0, 2.0), save_at=TIMES, rtol=1e-11, atol=1e-13).mean @ CMAT.T
    data = truth + 0.1 * np.random.default_rng(3).standard_normal(truth.shape)
    data[4, 1] = np.nan  # a missing value is skipped
    return truth, data


def _problem(chain_ode, data, solver, diffusion, step):
    from pymc_pnode.likelihoods.fenrir import FenrirProblem, StepControl, diffusion_mode

    return FenrirProblem.build(chain_ode, TIMES, data.shape, CMAT, 3, solver, StepControl(step=step),
                               diffusion_mode(diffusion))


@pytest.mark.filterwarnings("ignore::pymc_pnode.AccuracyWarning")  # a coarse step on purpose: equal, not accurate
@pytest.mark.parametrize("diffusion", [None, "global", 0.3], ids=["local", "global", "fixed"])
@pytest.mark.parametrize("step", [0.05, None], ids=["fixed", "adaptive"])
def test_structured_ek0_fenrir_equals_dense_ek0_fenrir(chain_ode, chain_data, diffusion, step):
    """Values and exact gradients of the isotropic and block-diagonal EK0 Fenrir likelihoods equal the dense
    EK0's (the same Gaussian model): the block adjoints, the shared block's accumulated adjoint and the
    per-state data filters against the dense kernel."""
    _, data = chain_data
    args = (Y0, THETA, data, np.array([0.1, 0.2, 0.15]), 0.3 if diffusion == 0.3 else 1.0)
    cotangent = np.linspace(1, 2, 10)
    terms, grad = _problem(chain_ode, data, pn.EK0(3), diffusion, step).evaluate(*args, cotangent=cotangent)
    assert np.all(np.isfinite(terms)) and np.any(grad != 0.0)
    for structure in ("isotropic", "diagonal"):
        s_terms, s_grad = _problem(chain_ode, data, pn.EK0(3, structure), diffusion, step).evaluate(
            *args, cotangent=cotangent)
        np.testing.assert_allclose(s_terms, terms, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(s_grad, grad, rtol=1e-7, atol=1e-9 * np.max(np.abs(grad)))


@pytest.mark.parametrize("solver, diffusion", [(pn.EK1(3, "diagonal"), None), (pn.EK1(3, "diagonal"), "global"),
                                               (pn.EK1(3, "diagonal"), "fixed"), (pn.EK0(3, "isotropic"), None)],
                         ids=["EK1-diagonal-local", "EK1-diagonal-global", "EK1-diagonal-fixed", "EK0-isotropic-local"])
def test_exact_gradient_structured_fenrir(chain_ode, chain_data, solver, diffusion):
    _, data = chain_data

    def loglik(y0, theta, sigma, *kappa):
        return pn.fenrir_loglik(chain_ode, y0, theta, TIMES, data, obs_matrix=CMAT, obs_sigma=sigma,
                                diffusion=kappa[0] if kappa else diffusion, solver=solver, step=0.01)

    point = [Y0, THETA, np.array([0.1, 0.2, 0.15])] + ([np.array(0.5)] if diffusion == "fixed" else [])
    assert_gradient_matches_central_differences(loglik, point, eps=[1e-6, 1e-6, 1e-6, 1e-4])


@pytest.mark.parametrize("diffusion, step", [(None, None), (0.3, 0.05)], ids=["defaults", "fixed"])
def test_diagonal_ek1_fenrir_equals_dense_ek1_fenrir_with_the_jacobians_diagonal(chain_ode, chain_data, diffusion,
                                                                                  step):
    _, data = chain_data
    args = (Y0, THETA, data, np.array([0.1, 0.2, 0.15]), 0.3)
    block = _problem(chain_ode, data, pn.EK1(3, "diagonal"), diffusion, step)
    dense = _problem(chain_ode, data, pn.EK1(3), diffusion, step)
    diagonal_jacobian = _diagonal_of(chain_ode.jac_y, D)

    class DiagonalJacobian(type(dense)):
        def kernel_functions(self, diffusion_mode):
            return super().kernel_functions(diffusion_mode)._replace(jac_y=diagonal_jacobian.address)

    object.__setattr__(dense, "__class__", DiagonalJacobian)
    np.testing.assert_allclose(block.evaluate(*args, warn=False)[0], dense.evaluate(*args, warn=False)[0], rtol=1e-9)


@pytest.mark.parametrize("solver", [pn.EK1(3, "diagonal"), pn.EK0(3, "isotropic")],
                         ids=["EK1-diagonal", "EK0-isotropic"])
def test_structured_fenrir_approaches_the_exact_gaussian_loglik(chain_ode, chain_data, solver):
    truth, data = chain_data
    seen = ~np.isnan(data)
    exact = norm(truth[seen], 0.1).logpdf(data[seen]).sum()
    value = pn.fenrir_loglik(chain_ode, Y0, THETA, TIMES, data, obs_matrix=CMAT, obs_sigma=0.1, diffusion=1e-8,
                             solver=solver, step=0.005).eval()
    assert abs(value - exact) < 1e-5 * abs(exact), (value, exact)
    default = pn.fenrir_loglik(chain_ode, Y0, THETA, TIMES, data, obs_matrix=CMAT, obs_sigma=0.1,
                               solver=solver).eval()
    assert abs(default - exact) < 0.01 * abs(exact), (default, exact)


@pytest.mark.parametrize("structure", ["isotropic", "diagonal"])
def test_observations_that_mix_states_need_the_dense_structure(chain_ode, structure):
    mixing = np.array([[1.0, 1.0, 0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match=r"obs_matrix row 0 combines the states \[0, 1\].*structure='dense'"):
        pn.fenrir_loglik(chain_ode, Y0, THETA, TIMES, np.zeros((TIMES.size, 1)), obs_matrix=mixing, obs_sigma=0.1,
                         solver=pn.EK0(3, structure))
