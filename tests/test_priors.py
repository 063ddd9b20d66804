"""IWP(q) transitions against the matrix exponential and the integral definition of Q(h)."""

import numpy as np
import pytest
from scipy.linalg import expm

from pymc_pnode.priors import IWP


@pytest.mark.parametrize("q", range(1, 9))
@pytest.mark.parametrize("h", [1e-3, 0.37, 2.0])
def test_transition_matches_sde_discretisation(q, h):
    prior = IWP(q)
    a, qm = prior.transition(h)
    f = prior.drift()
    n = q + 1
    assert np.allclose(a, expm(f * h), rtol=1e-12, atol=1e-14)
    # Van Loan: expm([[F, L L^T], [0, -F^T]] h) gives Q(h) = Φ12 Φ11^T with Φ11 = exp(F h).
    ll = np.zeros((n, n))
    ll[q, q] = 1.0
    block = np.block([[f, ll], [np.zeros((n, n)), -f.T]]) * h
    big = expm(block)
    q_ref = big[:n, n:] @ expm(f * h).T
    assert np.allclose(qm, q_ref, rtol=1e-9, atol=1e-14 * h)
    assert np.allclose(qm, qm.T)


def test_worked_iwp3_matrices():
    h = 0.5
    a, qm = IWP(3).transition(h)
    expected_q = np.array(
        [
            [h**7 / 252, h**6 / 72, h**5 / 30, h**4 / 24],
            [h**6 / 72, h**5 / 20, h**4 / 8, h**3 / 6],
            [h**5 / 30, h**4 / 8, h**3 / 3, h**2 / 2],
            [h**4 / 24, h**3 / 6, h**2 / 2, h],
        ]
    )
    assert np.allclose(qm, expected_q, rtol=1e-13)
    assert np.allclose(a[0], [1, h, h**2 / 2, h**3 / 6])


@pytest.mark.parametrize("q", range(1, 9))
def test_exact_square_root_of_preconditioned_diffusion(q):
    prior = IWP(q)
    r = prior.Q_bar_sqrt
    assert np.allclose(np.triu(r), r)
    assert np.allclose(r.T @ r, prior.Q_bar, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("bad", [0, -1, 13, 2.5, True])
def test_bad_order(bad):
    with pytest.raises(ValueError, match="order"):
        IWP(bad)


@pytest.mark.parametrize("q, d", [(1, 1), (2, 3), (3, 2), (4, 1), (5, 4)])
def test_structured_products_equal_the_dense_ones(q, d):
    """The tangent kernels' structured forms of A(h) and Q(h) — ``congruence`` (A X Aᵀ), ``congruence_t``
    (Aᵀ X A), ``transition_matrix`` and ``add_noise`` (+κQ) — against the dense matrices of the matrix exponential
    and of ``IWP.transition`` (checked against the SDE's discretisation above), derivative-major as the filters."""
    from pymc_pnode.filtering.prior import add_noise, congruence, congruence_t, new_step, transition_matrix

    h, kappa = 0.37, 1.7
    dd = (q + 1) * d
    step = new_step(h, 1.0, q)
    a_mat = expm(np.kron(np.diag(np.ones(q), 1), np.eye(d)) * h)
    out = np.empty((dd, dd))
    transition_matrix(step, q, d, out)
    np.testing.assert_allclose(out, a_mat, rtol=1e-13, atol=1e-15)
    x = np.random.default_rng(q * 10 + d).standard_normal((dd, dd))
    noisy = x.copy()
    add_noise(step, IWP(q).Q_bar_sqrt, q, d, kappa, noisy)
    np.testing.assert_allclose(noisy, x + kappa * np.kron(IWP(q).transition(h)[1], np.eye(d)), rtol=1e-12,
                               atol=1e-12)
    work = np.empty((dd, dd))
    congruence(step, q, d, x, work, out)
    np.testing.assert_allclose(out, a_mat @ x @ a_mat.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(work, a_mat @ x, rtol=1e-12, atol=1e-12)  # the smoother's tangents read A X
    congruence_t(step, q, d, x, work, out)
    np.testing.assert_allclose(out, a_mat.T @ x @ a_mat, rtol=1e-12, atol=1e-12)
