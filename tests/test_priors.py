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
def test_structured_congruences_equal_the_dense_products(q, d):
    """``congruence`` (A X Aᵀ) and ``congruence_t`` (Aᵀ X A), which use A(h)'s Kronecker structure, against
    products with the dense A(h) of ``dense_transition``, itself checked against the matrix exponential."""
    from pymc_pnode.filtering.prior import congruence, congruence_t, dense_transition, new_step

    h = 0.37
    dd = (q + 1) * d
    step = new_step(h, 1.0, q)
    a_mat, q_mat = np.empty((dd, dd)), np.empty((dd, dd))
    dense_transition(step, IWP(q).Q_bar_sqrt, q, d, a_mat, q_mat)
    generator = np.kron(np.diag(np.ones(q), 1), np.eye(d))  # states ordered derivative-major
    np.testing.assert_allclose(a_mat, expm(generator * h), rtol=1e-13, atol=1e-15)
    x = np.random.default_rng(q * 10 + d).standard_normal((dd, dd))
    out, work = np.empty((dd, dd)), np.empty((dd, dd))
    congruence(step, q, d, x, work, out)
    np.testing.assert_allclose(out, a_mat @ x @ a_mat.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(work, a_mat @ x, rtol=1e-12, atol=1e-12)  # the smoother's tangents read A X
    congruence_t(step, q, d, x, work, out)
    np.testing.assert_allclose(out, a_mat.T @ x @ a_mat, rtol=1e-12, atol=1e-12)
