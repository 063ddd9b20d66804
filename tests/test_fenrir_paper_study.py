"""The helpers of ``case_studies/fenrir_paper.py`` (the Fenrir paper's experiments) against independent
computations: the data-calibrated starting diffusion against the dense joint Gaussian, and the
compiled objective whose data are swapped between runs against a freshly built Fenrir likelihood;
and the interior-point optimiser (``fenrir_dt_table1._fminbox``) both case studies use."""

import importlib.util
import sys
import warnings
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from scipy.linalg import block_diag

import pymc_pnode as pn

_PATH = Path(__file__).resolve().parents[1] / "case_studies" / "fenrir_paper.py"
sys.path.insert(0, str(_PATH.parent))  # the script imports its sibling fenrir_dt_table1
_spec = importlib.util.spec_from_file_location("fenrir_paper", _PATH)
fp = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = fp  # dataclasses resolve annotations through sys.modules
_spec.loader.exec_module(fp)


def _dense_quadratic_form(study, data, order):
    """``uᵀ K⁻¹ u / N`` with ``K`` the prior covariance of all observations (IWP(order), unit
    diffusion, x(0) ~ N(0, 10⁴ I)), built from the driving noises of every step at once."""
    d, n = study.n_states, order + 1
    iwp, D = pn.IWP(order), study.n_states * (order + 1)
    e0 = np.zeros((1, n))
    e0[0, 0] = 1.0
    H = study.H @ np.kron(np.eye(d), e0)
    times = np.asarray(study.times)
    steps = np.diff(np.concatenate([[0.0], times]))
    noises = [1e4 * np.eye(D)]
    maps = []  # x(t_i) = Σ_j M_ij v_j with v_0 = x(0), v_j the noise of step j
    current = [np.eye(D)]
    for h in steps:
        if h > 0:
            a, q = iwp.transition(h)
            A = np.kron(np.eye(d), a)
            current = [A @ m for m in current] + [np.eye(D)]
            noises.append(np.kron(np.eye(d), q))
        maps.append(list(current))
    M = np.vstack([H @ np.hstack(m + [np.zeros((D, D))] * (len(noises) - len(m))) for m in maps])
    K = M @ block_diag(*noises) @ M.T
    u = np.asarray(data).ravel()
    return float(u @ np.linalg.solve(K, u)) / times.size


@pytest.mark.parametrize("key", ["lv_low", "seir"])
def test_initial_diffusion_equals_dense_gaussian(key):
    # Steps of 1 from t = 0: at Lotka-Volterra's step 0.1 (or SEIR's first gap of 30) the prior
    # covariance of the data under x(0) ~ N(0, 10⁴ I) has condition number ~1e15, and both
    # computations agree to 2-3 % only.
    study = fp.STUDIES[key]
    times = np.arange(7.0)
    study = fp.dataclasses.replace(study, times=times)
    rng = np.random.default_rng(3)
    data = rng.standard_normal((7, study.H.shape[0]))
    np.testing.assert_allclose(fp.initial_diffusion(study, data, order=3),
                               _dense_quadratic_form(study, data, 3), rtol=1e-6)


def test_shared_data_objective_equals_fresh_loglik():
    study = fp.STUDIES["fhn_low"]
    obj = fp.FenrirObjective(study)
    x = np.array([-0.9, 1.1, 0.25, 0.15, 2.8, np.log(0.01), np.log(0.5)])
    for seed in (0, 1):  # the second data set checks that set_data really swaps the data
        data = fp.make_data(study, np.random.default_rng(seed))
        obj.set_data(data)
        nll, grad = obj(x)
        z = pt.vector("z")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", pn.AccuracyWarning)
            ll = pn.fenrir_loglik(obj.ode, z[:2], z[2:5], study.times, data, obs_sigma=pt.exp(0.5 * z[5]),
                                  diffusion=pt.exp(z[6]), solver=pn.EK1(order=study.order), step=study.step)
            fresh = pytensor.function([z], [ll, pytensor.grad(ll, z)])(x)
        np.testing.assert_allclose(nll, -fresh[0], rtol=1e-12)
        np.testing.assert_allclose(grad, -fresh[1], rtol=1e-10, atol=1e-12)


def test_trmse_is_zero_at_the_truth_and_positive_elsewhere():
    study = fp.STUDIES["lv_low"]
    assert fp.trmse(study, study.y0_true, study.theta_true) == 0.0
    assert fp.trmse(study, study.y0_true, (2.1, 1.0, 4.0, 1.0)) > 0.01


# The interior-point emulation of Optim.jl's Fminbox (fenrir_dt_table1._fminbox), used by both diffusion-tempering
# and Fenrir-paper studies, and fenrir_paper's wrapper that maps a raw box onto [0, 1]^n.
def _quadratic(centre):
    centre = np.asarray(centre, float)
    return lambda x: (float(np.sum((x - centre) ** 2)), 2.0 * (x - centre))


def test_fminbox_finds_an_interior_minimum():
    x, f, nit = fp._fminbox(_quadratic([0.3, 0.7]), np.array([0.9, 0.1]), f_reltol=1e-12, f_abstol=1e-14)
    np.testing.assert_allclose(x, [0.3, 0.7], atol=1e-4)
    assert f < 1e-8 and nit > 0


def test_fminbox_approaches_a_bound_from_inside():
    x, f, _ = fp._fminbox(_quadratic([1.5, 0.5]), np.array([0.2, 0.2]), f_reltol=1e-12, f_abstol=1e-14)
    assert 0.99 < x[0] < 1.0  # iterates never touch the box
    assert abs(x[1] - 0.5) < 1e-3


def test_fminbox_backtracks_from_failed_evaluations():
    # a "diverging solve" beyond 0.85: the minimiser of the smooth part (0.95) is not reachable
    smooth = _quadratic([0.95])

    def fun(x):
        return (fp.FAILED, np.zeros_like(x)) if x[0] > 0.85 else smooth(x)

    x, f, _ = fp._fminbox(fun, np.array([0.1]), f_reltol=1e-10, f_abstol=1e-12)
    assert x[0] <= 0.85 and f < fp.FAILED
    assert x[0] > 0.6  # it still went most of the way


def test_interior_point_wrapper_maps_the_raw_box():
    x, f, _ = fp._interior_point(_quadratic([3.0, -40.0]), np.array([0.0, 10.0]), [(-2.0, 5.0), (-50.0, 50.0)], 200)
    np.testing.assert_allclose(x, [3.0, -40.0], atol=1e-3)
