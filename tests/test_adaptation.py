"""The tuning helpers shared by the package's adaptive moves (sampling/adaptation.py) and the Chkrebtii
Algorithm-2 proposal that uses them."""

import numpy as np
import pytest

from pymc_pnode.chkrebtii.proposal import Algorithm2Proposal
from pymc_pnode.sampling.acceptance import metropolis_accept
from pymc_pnode.sampling.adaptation import DualAveraging, WelfordCovariance, WindowedAdaptation


def _draws(n=400, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 3)) @ np.array([[1.0, 0.0, 0.0], [0.5, 0.1, 0.0], [0.0, 0.2, 3.0]])


@pytest.mark.parametrize("diagonal", [False, True])
def test_welford_equals_the_sample_covariance_with_its_shrinkage(diagonal):
    x = _draws()
    cov = WelfordCovariance(3, diagonal=diagonal)
    for row in x:
        cov.add(row)
    sample = np.cov(x.T) if not diagonal else np.var(x, axis=0, ddof=1)
    w = x.shape[0] / (x.shape[0] + 5.0)
    identity = np.eye(3) if not diagonal else 1.0
    np.testing.assert_allclose(cov.estimate("identity"), w * sample + 1e-3 * (1 - w) * identity, rtol=1e-12)
    variances = np.diag(sample) if not diagonal else sample
    towards_diagonal = w * sample + (1 - w) * (np.diag(variances) if not diagonal else variances)
    np.testing.assert_allclose(cov.estimate("diagonal"), towards_diagonal, rtol=1e-12, atol=2e-10 * variances.max())
    with pytest.raises(ValueError, match="shrink"):
        cov.estimate("none")


def test_dual_averaging_finds_the_step_of_the_target_acceptance():
    # acceptance exp(-step) decreases in the step; the target 0.6 is reached at step -log(0.6)
    averaging = DualAveraging(initial_step=5.0, target=0.6)
    for _ in range(3000):
        averaging.update(np.exp(-averaging.step))
    assert averaging.final_step == pytest.approx(-np.log(0.6), rel=0.02)


def test_windowed_adaptation_returns_each_windows_covariance():
    x = _draws(700)
    adaptation = WindowedAdaptation(3, 1.0, 0.5, first_window=100)
    closed = {i: est for i, row in enumerate(x) if (est := adaptation.update(0.5, row)) is not None}
    assert sorted(closed) == [99, 299, 699]  # windows of 100, 200, 400 draws
    second = WelfordCovariance(3)
    for row in x[100:300]:
        second.add(row)
    np.testing.assert_allclose(closed[299], second.estimate(), rtol=1e-12)
    assert WindowedAdaptation(3, 1.0, 0.5, adapt_metric=False).update(0.5, x[0]) is None


def test_algorithm2_proposal_tunes_to_its_target_whatever_the_parameter_scale():
    # Target: theta ~ N(0, diag(1e-4, 1e-2)) and two N(0, 1) innovations, redrawn from their prior (so their
    # proposal term cancels their prior): the random walk must shrink its scale by two orders of magnitude
    # and reach the 0.234 acceptance of its target.
    sd = np.array([0.01, 0.1])
    mask = np.array([False, False, True, True])

    def log_target(x):
        return -0.5 * float(np.sum((x[:2] / sd) ** 2)) - 0.5 * float(x[2:] @ x[2:])

    rng = np.random.default_rng(1)
    proposal = Algorithm2Proposal(mask, scaling=0.5)
    x, logp = np.zeros(4), log_target(np.zeros(4))

    def step(tune):
        nonlocal x, logp
        new, log_q = proposal.propose(x, rng)
        new_logp = log_target(new)
        accepted, prob = metropolis_accept(new_logp - logp - log_q, rng)
        if accepted:
            x, logp = new, new_logp
        if tune:
            proposal.adapt(prob, x)
        return prob

    for _ in range(3000):
        step(tune=True)
    proposal.stop_tuning()
    acceptance = np.mean([step(tune=False) for _ in range(4000)])
    assert acceptance == pytest.approx(0.234, abs=0.05)
    spread = proposal.scaling * np.sqrt(np.diag(proposal.chol @ proposal.chol.T))
    assert np.all(spread / sd > 0.5) and np.all(spread / sd < 5.0)  # the proposal learned both scales
