"""Checkpointed dense Fenrir likelihoods (``memory_budget``): when an evaluation would store more than the budget,
the forward pass keeps its roots only at checkpoints and the kernel recomputes them, and the data phase's store, in
intervals; the value and gradient are those of the stored sweep to rounding, in every diffusion mode, with fixed
and error-controlled steps, restarts at discontinuities, missing data and several noise scales."""

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest

import pymc_pnode as pn
from pymc_pnode.filtering.fenrir import STATUS_CHECKPOINTS, FenrirArguments, checkpoint_interval, checkpoint_slots
from pymc_pnode.filtering.odefilter import keep_thin_root
from tests import test_fenrir_discontinuities as chain
from tests.conftest import lotka_volterra

Y0, THETA = np.array([1.0, 1.0]), np.array([1.5, 1.0, 1.0, 3.0])
TIMES = np.linspace(0.5, 6.0, 12)


@pytest.fixture(scope="module")
def lv_ode():
    return pn.ODE(lotka_volterra, n_states=2, n_theta=4)


@pytest.fixture(scope="module")
def data(lv_ode):
    truth = pn.solve(lv_ode, Y0, THETA, (0.0, 6.0), save_at=TIMES, step=0.01).mean
    out = truth + 0.1 * np.random.default_rng(0).standard_normal(truth.shape)
    out[3, 1] = out[7, 0] = np.nan  # missing components
    return out


def _value_and_gradient(ode, data, times, budget, **kwargs):
    y0, theta, sigma = pt.dvector("y0"), pt.dvector("theta"), pt.dvector("sigma")
    ll = pn.fenrir_loglik(ode, y0, theta, times, data, obs_sigma=sigma, memory_budget=budget, **kwargs)
    return pytensor.function([y0, theta, sigma], [ll, *pytensor.grad(ll, [y0, theta, sigma])])


def _assert_same_to_rounding(actual, desired):
    """Equal to a few ulps. Not bitwise: the checkpointed sweep runs outlined copies of the phases that the stored
    sweep inlines, and with FMA contraction (``_jit.INLINE_JIT``) LLVM may fuse a multiply-add in one copy and not
    in the other, depending on which kernel of the process compiled a shared helper first. CI measured gradients
    2e-15 apart (relative) after a full test run, bitwise equal when this file runs alone; an error of the
    checkpointing (a wrong interval bound, a stale store) is many orders larger."""
    desired = np.asarray(desired)
    np.testing.assert_allclose(actual, desired, rtol=1e-12, atol=1e-12 * np.max(np.abs(desired), initial=0.0))


SETTINGS = {
    "fixed diffusion": dict(step=0.05, diffusion=0.5),
    "global diffusion": dict(step=0.05, diffusion="global"),
    "defaults": dict(),
    "local, fixed step": dict(step=0.05),
    "ek0, two steps": dict(step=0.1, diffusion=2.0, solver=pn.EK0(order=3)),  # three grid points: intervals of 1
}


@pytest.mark.parametrize("kwargs", SETTINGS.values(), ids=SETTINGS.keys())
def test_checkpointed_sweep_equals_the_stored_sweep(lv_ode, data, kwargs):
    """Fixed steps (121 points): 22 root rows (26 with a fixed or global diffusion) whatever the budget, points 8
    apart; error control: budget 1 byte, four rows, ≈ 120 points 32 apart; 200 kB (D = 8), 48 rows. Intervals of
    one to four strides."""
    times = TIMES if kwargs.get("step") != 0.1 else np.array([0.1, 0.2])
    obs = data if times is TIMES else data[:2]
    stored = _value_and_gradient(lv_ode, obs, times, 2.0**30, **kwargs)
    sigma = np.array([0.1, 0.15])
    for budget in (1.0, 2e5):  # every evaluation is over budget
        checkpointed = _value_and_gradient(lv_ode, obs, times, budget, **kwargs)
        for a, b in zip(stored(Y0, THETA, sigma), checkpointed(Y0, THETA, sigma)):
            _assert_same_to_rounding(b, a)
    assert np.all(np.abs(stored(Y0, THETA, sigma)[2]) > 0)


@pytest.mark.parametrize("n_pts", [1, 2, 4, 5, 9, 17, 100, 1000])
def test_a_thin_run_keeps_evenly_spaced_roots_in_its_slots(n_pts):
    """The checkpoints of a thin forward pass: every point j·stride, in at most ``root_slots`` rows (more than
    half of them used), point 0 first."""
    slots = 8
    rows, stride = np.zeros((slots, 1)), 1
    for n in range(1, n_pts):
        stride = keep_thin_root(rows, np.array([float(n)]), n, stride, slots)
    kept = (n_pts - 1) // stride + 1
    assert kept <= slots and (kept > slots // 2 or stride == 1)
    np.testing.assert_array_equal(rows[:kept, 0], stride * np.arange(kept))
    assert [checkpoint_slots(2e5, 8, 0, 1), checkpoint_slots(2e5, 8, 121, 2), checkpoint_slots(1.0, 8, 121, 2),
            checkpoint_slots(2.0**30, 400, 0, 1), checkpoint_slots(2.0**30, 160, 2001, 1)] == [48, 22, 22, 104, 104]


def test_checkpointed_sweep_through_declared_discontinuities(data):
    ode = pn.ODE(chain._field, n_states=2, n_theta=2)
    for kwargs in (dict(), dict(step=0.01, diffusion=1e-3)):
        stored = _value_and_gradient(ode, chain.DATA, chain.TIMES, 2.0**30, discontinuities=[chain.ON, chain.OFF],
                                     **kwargs)
        checkpointed = _value_and_gradient(ode, chain.DATA, chain.TIMES, 1.0, discontinuities=[chain.ON, chain.OFF],
                                           **kwargs)
        sigma = np.array([chain.SIGMA, 1.5 * chain.SIGMA])
        for a, b in zip(stored(chain.Y0, chain.THETA, sigma), checkpointed(chain.Y0, chain.THETA, sigma)):
            _assert_same_to_rounding(b, a)


def test_default_kernel_hands_over_only_dense_sweeps_over_budget(lv_ode, data):
    """The default kernel answers STATUS_CHECKPOINTS for a dense evaluation over budget (value-only ones too; block
    structures never ask), and the checkpointed kernel then computes it. Between the forward run's store and the
    gradient's: only gradients ask."""
    for structure, budget, want_grad, asks in [("dense", 1.0, True, True), ("dense", 2.0**30, True, False),
                                               ("dense", 1.0, False, True), ("diagonal", 1.0, True, False),
                                               ("dense", 5e5, True, True), ("dense", 5e5, False, False)]:
        solver = pn.EK1(order=3, structure=structure)
        ll = pn.fenrir_loglik(lv_ode, Y0, THETA, TIMES, data, obs_sigma=0.1, step=0.05, solver=solver,
                              memory_budget=budget)
        problem = ll.owner.inputs[0].owner.op.problem
        args = _kernel_arguments(problem, data, want_grad)
        terms, grad, ok, info, _, _ = problem.kernel(problem.functions, args, problem.initial_root)
        assert (int(info[4]) == STATUS_CHECKPOINTS) == asks
        assert bool(ok) != asks
        if asks:
            terms2, grad2, ok2, info2, _, _ = problem.checkpointed_kernel(problem.functions, args, problem.initial_root)
            reference = problem.kernel(problem.functions, args._replace(sweep_budget=2.0**30), problem.initial_root)
            assert ok2 and int(info2[4]) == 0
            _assert_same_to_rounding(terms2, reference[0])
            _assert_same_to_rounding(grad2, reference[1])


def _kernel_arguments(problem, data, want_grad):
    segment = problem.segments[0]
    sigma = np.full(data.shape[1], 0.1)
    return FenrirArguments(Y0.copy(), THETA.copy(), problem.solver.prior.Q_bar_sqrt, problem.solver.ek1, 1.0,
                           problem.diffusion_mode, problem.stepping, segment.grid, segment.obs_at,
                           np.ascontiguousarray(data, dtype=np.float64),
                           problem.obs_matrix, sigma, np.zeros(data.shape[1], dtype=np.int64), 1, want_grad,
                           np.ones(data.shape[0]) if want_grad else np.zeros(0), np.zeros(2), problem.memory_budget)


def test_pymc_block_takes_the_budget_and_bad_budgets_raise(lv_ode, data):
    assert [checkpoint_interval(n) for n in (3, 121, 2001)] == [1, 7, 28]
    logps = []
    for budget in (2.0**30, 1.0):
        with pm.Model() as model:
            theta = pm.LogNormal("theta", np.log(THETA), 0.1)
            pn.Fenrir("obs", lv_ode, y0=Y0, theta=theta, times=TIMES, observed=data, obs_sigma=0.1, step=0.05,
                      memory_budget=budget)
        point = model.initial_point()
        logps.append((model.compile_logp()(point), model.compile_dlogp()(point)))
    _assert_same_to_rounding(logps[1][0], logps[0][0])
    _assert_same_to_rounding(logps[1][1], logps[0][1])
    for bad in (0.0, -1.0, np.nan, "1GB"):
        with pytest.raises(ValueError, match="memory_budget"):
            pn.fenrir_loglik(lv_ode, Y0, THETA, TIMES, data, obs_sigma=0.1, memory_budget=bad)
