"""Parallel tempering with a diffusion ladder on a Fenrir likelihood (pymc_pnode.sampling).

The model is a pendulum observed at integer times with an unknown angular
frequency ``omega``.  Sampling once per unit of time aliases ``omega`` with
``2 pi - omega``, so the Fenrir posterior has two separated modes (near 2.03 and
4.28) whose weights are set by the prior.  Replicas differ only in the Fenrir
diffusion ``kappa``: large diffusions let the probabilistic ODE solution
interpolate the data and flatten the likelihood.  The reference posterior is
computed by quadrature over ``omega`` of the same Fenrir likelihood at the cold
diffusion.
"""

from __future__ import annotations

import arviz as az
import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from scipy.integrate import solve_ivp
from scipy.stats import truncnorm

import pymc_pnode as pn
from pymc_pnode.sampling import (
    ParallelTempering,
    diffusion_ladder,
    geometric_diffusions,
    sample_pt,
)
from tests.conftest import LIKELIHOOD_MUTATIONS, scale_likelihood

SAMPLE_KW = {"progressbar": False, "compute_convergence_checks": False}

OMEGA_TRUE = 2.0
Y0 = (0.3, 0.0)  # initial angle and angular velocity (known)
OBS_SD = 0.05
TIMES = np.arange(1.0, 6.01, 1.0)  # sparse sampling: aliasing at 2 pi - omega
STEP = 0.1  # solver step: resolves omega * STEP <= 0.6 on the prior's support
PRIOR = {"mu": 2.5, "sigma": 1.5, "lower": 0.5, "upper": 6.0}
KAPPA_COLD = 1.0
# The likelihood is insensitive to kappa below ~1e6 here, flat above ~1e9.5.
KAPPA_LADDER = geometric_diffusions(KAPPA_COLD, 1e9, 4, warm=1e7)
MODE_SPLIT = np.pi  # the two aliased modes lie on either side of the Nyquist frequency


def pendulum(y, t, p):
    return [y[1], -p[0] ** 2 * pt.sin(y[0])]


@pytest.fixture(scope="module")
def pendulum_ode() -> pn.ODE:
    return pn.ODE(pendulum, n_states=2, n_theta=1)


def _simulate_data() -> np.ndarray:
    """Angles at ``TIMES`` from an accurate reference solution plus Gaussian noise."""
    ref = solve_ivp(
        lambda t, y: [y[1], -(OMEGA_TRUE**2) * np.sin(y[0])],
        (0.0, TIMES[-1]),
        Y0,
        rtol=1e-12,
        atol=1e-12,
        dense_output=True,
    )
    noise = OBS_SD * np.random.default_rng(1).standard_normal(TIMES.size)
    return (ref.sol(TIMES)[0] + noise)[:, None]


@pytest.fixture(scope="module")
def pendulum_data() -> np.ndarray:
    return _simulate_data()


def _fenrir_kwargs() -> dict:
    return {
        "times": TIMES,
        "obs_matrix": [[1.0, 0.0]],
        "obs_sigma": OBS_SD,
        "solver": pn.EK1(order=3),
        "step": STEP,
    }


def _build_model(ode: pn.ODE, data: np.ndarray, kappa) -> pm.Model:
    with pm.Model() as model:
        omega = pm.TruncatedNormal("omega", **PRIOR)
        pn.Fenrir(
            "angle", ode, y0=Y0, theta=omega[None], observed=data, diffusion=kappa,
            **_fenrir_kwargs(),
        )
    return model


def _quadrature(
    ode: pn.ODE, data: np.ndarray, kappa: float, n_coarse: int = 139, refine: int = 8
) -> dict[str, float]:
    """Posterior summaries of omega under the Fenrir likelihood with diffusion ``kappa``.

    Trapezoidal rule on a coarse grid over the prior's support, refined
    ``refine``-fold in every coarse cell next to a point whose log-density is
    within 30 of the maximum (the rest carries a relative mass below 1e-12).
    With the defaults the cold modes (sd ~0.035) get a spacing of 0.005.
    """
    theta = pt.dvector("theta")
    loglik = pytensor.function(
        [theta],
        pn.fenrir_loglik(ode, Y0, theta, data=data, diffusion=kappa, **_fenrir_kwargs()),
    )
    a = (PRIOR["lower"] - PRIOR["mu"]) / PRIOR["sigma"]
    b = (PRIOR["upper"] - PRIOR["mu"]) / PRIOR["sigma"]
    prior = truncnorm(a, b, PRIOR["mu"], PRIOR["sigma"])

    def log_post(points: np.ndarray) -> np.ndarray:
        return prior.logpdf(points) + np.array([loglik([w]) for w in points])

    coarse = np.linspace(PRIOR["lower"], PRIOR["upper"], n_coarse)
    lp_coarse = log_post(coarse)
    near = np.flatnonzero(lp_coarse > lp_coarse.max() - 30.0)
    cells = np.unique(np.clip(np.concatenate([near - 1, near]), 0, n_coarse - 2))
    fine = np.concatenate(
        [np.linspace(coarse[i], coarse[i + 1], refine + 1)[1:-1] for i in cells]
    )
    grid = np.concatenate([coarse, fine])
    lp = np.concatenate([lp_coarse, log_post(fine)])
    order = np.argsort(grid)
    grid, lp = grid[order], lp[order]
    dens = np.exp(lp - lp.max())
    dens /= np.trapezoid(dens, grid)
    out = {"mean": float(np.trapezoid(dens * grid, grid))}
    for name, mask in (("low", grid < MODE_SPLIT), ("high", grid >= MODE_SPLIT)):
        mass = float(np.trapezoid(dens * mask, grid))
        mode_mean = float(np.trapezoid(dens * mask * grid, grid)) / mass
        mode_var = float(np.trapezoid(dens * mask * (grid - mode_mean) ** 2, grid)) / mass
        out |= {f"p_{name}": mass, f"{name}_mean": mode_mean, f"{name}_sd": float(np.sqrt(mode_var))}
    return out


@pytest.fixture(scope="module")
def cold_reference(pendulum_ode: pn.ODE, pendulum_data: np.ndarray) -> dict[str, float]:
    return _quadrature(pendulum_ode, pendulum_data, KAPPA_COLD)


# -------------------------------------------------------------- the ladder helper


def test_geometric_diffusions_values_and_validation() -> None:
    np.testing.assert_allclose(geometric_diffusions(1.0, 1e4, 5), 10.0 ** np.arange(5))
    ladder = geometric_diffusions(0.5, 1e9, 4, warm=1e7)
    assert ladder[0] == 0.5 and ladder[1] == 1e7 and ladder[-1] == 1e9
    np.testing.assert_allclose(ladder[2], 1e8)
    np.testing.assert_array_equal(geometric_diffusions(1.0, 10.0, 2, warm=10.0), [1.0, 10.0])
    for args, kwargs, message in [
        ((1.0, 1e4, 1), {}, "at least 2 replicas"),
        ((1.0, 1.0, 3), {}, "must exceed"),
        ((10.0, 1.0, 3), {}, "must exceed"),
        ((0.0, 1.0, 3), {}, "cold must be a positive"),
        ((1.0, np.inf, 3), {}, "hot must be a positive"),
        ((1.0, 1e4, 3), {"warm": 1e5}, "warm must lie"),
        ((1.0, 1e4, 3), {"warm": 1.0}, "warm must lie"),
        ((1.0, 1e4, 2), {"warm": 1e2}, "With 2 replicas"),
    ]:
        with pytest.raises(ValueError, match=message):
            geometric_diffusions(*args, **kwargs)


def test_diffusion_ladder_uses_current_value_as_cold() -> None:
    kappa = pytensor.shared(3.0, name="kappa_helper")
    ladder = diffusion_ladder(kappa, hot=3e6, n_replicas=4)
    assert list(ladder) == [kappa]
    np.testing.assert_allclose(ladder[kappa], [3.0, 3e2, 3e4, 3e6])
    assert diffusion_ladder(kappa, hot=1e3, n_replicas=2, cold=1.0)[kappa] == [1.0, 1e3]
    with pytest.raises(TypeError, match="shared variable"):
        diffusion_ladder(pt.dscalar("k"), hot=1e3, n_replicas=3)
    with pytest.raises(ValueError, match="floating-point scalar"):
        diffusion_ladder(pytensor.shared(np.ones(2)), hot=1e3, n_replicas=3)
    with pytest.raises(ValueError, match="floating-point scalar"):
        diffusion_ladder(pytensor.shared(np.int64(1)), hot=1e3, n_replicas=3)


def test_ladder_stats_report_scalar_shared_variables() -> None:
    """Scalar laddered variables get a ``ladder_<name>`` statistic; vectors are skipped."""
    noise = pytensor.shared(1.0, name="noise")
    unnamed = pytensor.shared(0.0)
    shift = pytensor.shared(np.zeros(2), name="shift")
    with pm.Model():
        a = pm.Normal("a", 0.0, 1.0, shape=2)
        pm.Normal("obs", a + shift + unnamed, noise, observed=[0.0, 1.0])
        step = ParallelTempering(
            shared_ladder={noise: [1.0, 2.0, 4.0], unnamed: [0.0, 0.5, 1.0],
                           shift: [np.zeros(2), np.ones(2), 2 * np.ones(2)]},
        )
    assert set(step._ladder_stats) == {"ladder_noise", "ladder_shared1"}
    _, stats = step.step({"a": np.zeros(2)})
    np.testing.assert_array_equal(stats[0]["ladder_noise"], [1.0, 2.0, 4.0])
    np.testing.assert_array_equal(stats[0]["ladder_shared1"], [0.0, 0.5, 1.0])
    assert "ladder_shift" not in stats[0]


def test_replica_terms_are_fenrir_at_laddered_diffusion(
    pendulum_ode: pn.ODE, pendulum_data: np.ndarray
) -> None:
    """Replica k evaluates prior + beta_k * Fenrir(kappa_k), both ladders reported as stats."""
    kappa = pytensor.shared(KAPPA_COLD, name="kappa")
    model = _build_model(pendulum_ode, pendulum_data, kappa)
    betas = [1.0, 0.8, 0.5, 0.3]
    with model:
        step = ParallelTempering(
            shared_ladder=diffusion_ladder(kappa, hot=1e9, n_replicas=4, warm=1e7),
            betas=betas,
        )
    theta = pt.dvector("theta")
    kappa_in = pt.dscalar("kappa_in")
    loglik = pytensor.function(
        [theta, kappa_in],
        pn.fenrir_loglik(
            pendulum_ode, Y0, theta, data=pendulum_data, diffusion=kappa_in,
            **_fenrir_kwargs(),
        ),
    )
    omega = 4.2
    # The sampler works on the interval-transformed omega.
    transform = model.rvs_to_transforms[model["omega"]]
    x = np.atleast_1d(transform.forward(omega, *model["omega"].owner.inputs).eval())
    values = []
    for k in range(4):
        state = step._terms.evaluate(x, step._replica_shared[k])
        expected = loglik([omega], KAPPA_LADDER[k])
        assert state.data_logp == pytest.approx(expected, rel=1e-10, abs=1e-8)
        values.append(expected)
        target = step._target(k)
        assert target.logp(state) == pytest.approx(state.var_logp + betas[k] * expected)
    # The ladder really changes the likelihood (it is flat at the hot end).
    assert values[0] - values[-1] > 5.0
    assert kappa.get_value() == KAPPA_COLD

    _, stats = step.step(model.initial_point())
    np.testing.assert_array_equal(stats[0]["ladder_kappa"], KAPPA_LADDER)
    np.testing.assert_array_equal(stats[0]["betas"], betas)
    assert step.stats_dtypes_shapes["ladder_kappa"] == (np.float64, [4])


# ------------------------------------------------------- sampling the cold posterior


def _sample_cold_chain(model: pm.Model, kappa, seed: int = 11) -> az.InferenceData:
    return sample_pt(
        draws=3000,
        tune=500,
        chains=1,
        cores=1,
        model=model,
        shared_ladder={kappa: KAPPA_LADDER},
        random_seed=seed,
        initvals={"omega": 4.3},  # start in the minority mode
        **SAMPLE_KW,
    )


def _check_cold_posterior(idata: az.InferenceData, ref: dict[str, float]) -> None:
    """The cold chain's draws against the quadrature reference ``ref`` (cold Fenrir posterior).

    Mode weights and the overall mean are compared within 4 Monte Carlo standard errors
    (ESS-based, ``arviz.mcse``).  The weights are set mostly by the prior here (the two
    aliased likelihood peaks have nearly equal heights), so what ties the draws to the
    likelihood are the within-mode locations and widths: both modes are a few hundredths
    wide, against ~0.7 under the prior alone, and half the likelihood weight widens them
    by sqrt(2) (41 %).  With ~3000 draws the width estimates are good to a few per cent,
    so a 15 % tolerance separates the three cases.
    """
    omega = idata.posterior["omega"]
    low_ind = (omega < MODE_SPLIT).astype(float).rename("low").to_dataset()
    mcse_low = float(az.mcse(low_ind)["low"])
    assert mcse_low < 0.08, mcse_low  # otherwise the weight check below could not fail
    draws = omega.values.ravel()
    low = draws < MODE_SPLIT
    assert abs(float(low.mean()) - ref["p_low"]) < 4 * mcse_low + 0.01, (low.mean(), ref)
    mcse_mean = float(az.mcse(idata, var_names=["omega"])["omega"])
    assert abs(float(draws.mean()) - ref["mean"]) < 4 * mcse_mean + 0.01, (draws.mean(), ref)
    for name, in_mode in (("low", low), ("high", ~low)):
        sample = draws[in_mode]
        assert sample.size > 300, (name, sample.size)
        assert abs(float(sample.mean()) - ref[f"{name}_mean"]) < 0.25 * ref[f"{name}_sd"], (name, sample.mean(), ref)
        assert abs(float(sample.std()) - ref[f"{name}_sd"]) < 0.15 * ref[f"{name}_sd"], (name, sample.std(), ref)


def test_diffusion_ladder_samples_cold_fenrir_posterior(
    pendulum_ode: pn.ODE, pendulum_data: np.ndarray, cold_reference: dict[str, float]
) -> None:
    kappa = pytensor.shared(KAPPA_COLD, name="kappa")
    model = _build_model(pendulum_ode, pendulum_data, kappa)
    idata = _sample_cold_chain(model, kappa)
    assert kappa.get_value() == KAPPA_COLD

    # Stats report the ladder, on the labelled replica dimension.
    stats = idata.sample_stats
    assert stats["ladder_kappa"].dims == ("chain", "draw", "replica")
    np.testing.assert_array_equal(stats["ladder_kappa"].values[0, -1], KAPPA_LADDER)
    assert np.all(stats["betas"].values == 1.0)
    final_rates = stats["swap_rate"].values[0, -1]
    assert np.all(final_rates > 0.1), final_rates
    # The cold chain changes mode about once per cold -> hot -> cold round trip; a
    # chain stuck in its starting mode would make none.
    round_trips = int(stats["round_trips"].values[0, -1])
    assert round_trips >= 150, round_trips

    # The reference is informative: two modes with unequal weights, each a few
    # hundredths wide (a hot diffusion would at least double that, see the last test).
    ref = cold_reference
    assert 0.55 < ref["p_low"] < 0.8, ref
    assert abs(ref["low_mean"] - OMEGA_TRUE) < 0.1 and abs(ref["high_mean"] - (2 * np.pi - OMEGA_TRUE)) < 0.1, ref
    _check_cold_posterior(idata, ref)


@LIKELIHOOD_MUTATIONS
def test_diffusion_ladder_cold_posterior_fails_with_mutated_likelihood(
    pendulum_ode: pn.ODE, pendulum_data: np.ndarray, cold_reference: dict[str, float], factor: float
) -> None:
    """The check above must reject the cold chain of a model whose Fenrir term is scaled.

    The mutation is a potential; parallel tempering counts potentials in the data term
    ``model.datalogp`` (observed variables plus potentials), which each replica evaluates
    at its own diffusion, so every replica targets prior + factor * Fenrir(kappa_k).
    """
    kappa = pytensor.shared(KAPPA_COLD, name="kappa")
    model = scale_likelihood(_build_model(pendulum_ode, pendulum_data, kappa), factor)
    if factor == 0.0:
        # Without the Fenrir term the diffusion does not enter the model: the ladder refuses it.
        with pytest.raises(ValueError, match="does not enter"):
            _sample_cold_chain(model, kappa)
        return
    idata = _sample_cold_chain(model, kappa)
    with pytest.raises(AssertionError):
        _check_cold_posterior(idata, cold_reference)


def test_hot_diffusion_posterior_is_distinguishable(
    pendulum_ode: pn.ODE, pendulum_data: np.ndarray, cold_reference: dict[str, float]
) -> None:
    """Guard for the sampling test: draws at the hot diffusion would fail its width check."""
    hot = _quadrature(pendulum_ode, pendulum_data, float(KAPPA_LADDER[-1]), refine=1)
    assert hot["low_sd"] > 2.0 * cold_reference["low_sd"], (hot, cold_reference)
