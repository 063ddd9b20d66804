"""Tests of the parallel tempering step method (pymc_pnode.sampling)."""

from __future__ import annotations

import pickle
import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest

from pymc_pnode.sampling import (
    AdaptiveMove,
    HamiltonianMove,
    ParallelTempering,
    RandomWalkMetropolis,
    geometric_betas,
    sample_pt,
)
from pymc_pnode.sampling.acceptance import metropolis_accept
from pymc_pnode.sampling.adaptation import WindowedAdaptation
from pymc_pnode.sampling.ladder import LadderAdapter, validate_betas
from pymc_pnode.sampling.swaps import CommunicationCheck, RoundTripCounter, select_swap_pairs
from tests.conftest import LIKELIHOOD_MUTATIONS, scale_likelihood

SAMPLE_KW = {"progressbar": False, "compute_convergence_checks": False}

# Bimodal target: 0.3 N(-5, 0.5^2) + 0.7 N(5, 0.5^2).
MIX_W = np.array([0.3, 0.7])
MIX_MU = np.array([-5.0, 5.0])
MIX_SD = 0.5
PRIOR_SD = 10.0


@pytest.fixture(scope="module")
def bimodal_model() -> pm.Model:
    """Mixture posterior built as prior N(0, 10) times a likelihood potential.

    The potential equals log(mixture) - log(prior), so the posterior is exactly
    the mixture while tempering the likelihood interpolates towards the broad
    prior, which connects the modes.
    """
    with pm.Model() as model:
        x = pm.Normal("x", 0.0, PRIOR_SD)
        mixture = pm.logp(pm.NormalMixture.dist(w=MIX_W, mu=MIX_MU, sigma=MIX_SD), x)
        prior = pm.logp(pm.Normal.dist(0.0, PRIOR_SD), x)
        pm.Potential("likelihood", mixture - prior)
    return model


# Conjugate model: y_i ~ N(mu, 1), mu ~ N(0, 2^2).
CONJ_N = 20
CONJ_PRIOR_SD = 2.0
CONJ_Y = np.random.default_rng(11).normal(0.7, 1.0, size=CONJ_N)
CONJ_POST_VAR = 1.0 / (1.0 / CONJ_PRIOR_SD**2 + CONJ_N)
CONJ_POST_MEAN = CONJ_POST_VAR * CONJ_Y.sum()


@pytest.fixture(scope="module")
def conjugate_model() -> pm.Model:
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, CONJ_PRIOR_SD)
        pm.Normal("y", mu, 1.0, observed=CONJ_Y)
    return model


@pytest.fixture(scope="module")
def conjugate_mp_idata(conjugate_model: pm.Model) -> az.InferenceData:
    """Two chains on two processes, shared by the statistics tests."""
    with conjugate_model:
        step = ParallelTempering(n_replicas=4, beta_min=0.01)
        return pm.sample(
            draws=300, tune=300, step=step, chains=2, cores=2, random_seed=5, **SAMPLE_KW
        )


def _fraction_positive(idata: az.InferenceData, name: str) -> float:
    return float((idata.posterior[name].values > 0.0).mean())


# ---------------------------------------------------------------- bimodal target


def test_bimodal_weights_recovered_where_nuts_fails(bimodal_model: pm.Model) -> None:
    idata = sample_pt(
        draws=2500,
        tune=1000,
        chains=2,
        cores=1,
        model=bimodal_model,
        random_seed=20240501,
        initvals={"x": 5.0},
        progressbar=False,
        compute_convergence_checks=False,
    )
    x = idata.posterior["x"].values
    frac_pt = float((x > 0).mean())
    # The mode indicator decorrelates about once per cold->hot->cold round trip
    # (~0.14 per draw with the default 8-replica ladder), so its ESS here is
    # ~700 and the Monte Carlo sd of the fraction ~0.017: +-0.05 is ~3 sd.
    per_chain = (x > 0).mean(axis=1)
    assert np.all((per_chain > 0.55) & (per_chain < 0.85)), per_chain
    assert abs(frac_pt - 0.7) < 0.05, frac_pt
    assert abs(float((x < 0).mean()) - 0.3) < 0.05
    # Within a mode the cold replica samples the right Gaussian.
    right = x[x > 0]
    assert abs(right.mean() - 5.0) < 0.1
    assert abs(right.std() - MIX_SD) < 0.1
    assert idata.sample_stats["round_trips"].values[:, -1].min() > 100
    assert idata.sample_stats["betas"].dims == ("chain", "draw", "replica")

    with bimodal_model:
        nuts = pm.sample(
            draws=1000,
            tune=500,
            chains=1,
            cores=1,
            random_seed=3,
            initvals={"x": 5.0},
            **SAMPLE_KW,
        )
    frac_nuts = _fraction_positive(nuts, "x")
    # A single NUTS chain started in the right mode never leaves it.
    assert abs(frac_nuts - 0.7) > 0.2, frac_nuts


# ------------------------------------------------------------- conjugate normal


@pytest.mark.parametrize(
    "move, n_replicas, draws",
    [("metropolis", 4, 1500), (HamiltonianMove(path_length=1.5), 3, 1000)],
    ids=["metropolis", "hmc"],
)
def test_conjugate_normal_posterior(
    conjugate_model: pm.Model, move: object, n_replicas: int, draws: int
) -> None:
    with conjugate_model:
        step = ParallelTempering(n_replicas=n_replicas, beta_min=0.05, move=move)
        idata = pm.sample(
            draws=draws, tune=500, step=step, chains=2, cores=1, random_seed=7, **SAMPLE_KW
        )
    mu = idata.posterior["mu"]
    ess = float(az.ess(idata, var_names=["mu"])["mu"])
    assert ess > 300, ess
    post_sd = np.sqrt(CONJ_POST_VAR)
    # Tolerance: 4 Monte Carlo standard errors.  For the mean MCSE = sd / sqrt(ESS);
    # for the variance of a Gaussian, Var(s^2) ~= 2 sd^4 / ESS.
    assert abs(float(mu.mean()) - CONJ_POST_MEAN) < 4.0 * post_sd / np.sqrt(ess)
    assert abs(float(mu.var()) - CONJ_POST_VAR) < 4.0 * CONJ_POST_VAR * np.sqrt(2.0 / ess)
    assert np.all(idata.sample_stats["betas"].values[..., 0] == 1.0)


# ------------------------------------------------- posterior tempering, bimodal prior

# x ~ 0.5 N(-4, 0.5²) + 0.5 N(4, 0.5²), one observation y ~ N(x, 3²) at y = 1.5: the prior itself
# has two modes 16 prior sd apart, which tempering the whole density (beta * (prior + likelihood))
# flattens in the hot replicas. The likelihood moves the right mode's weight from 0.5 to 0.785 (and
# to 0.659 at half weight), which the check below resolves.
BIPRIOR_MU = np.array([-4.0, 4.0])
BIPRIOR_SD = 0.5
BI_OBS, BI_OBS_SD = 1.5, 3.0


def _bimodal_prior_model() -> pm.Model:
    with pm.Model() as model:
        pm.NormalMixture("x", w=[0.5, 0.5], mu=BIPRIOR_MU, sigma=BIPRIOR_SD, initval=-4.0)
        pm.Normal("y", model["x"], BI_OBS_SD, observed=BI_OBS)
    return model


def _bimodal_prior_reference() -> dict[str, float]:
    """Posterior summaries by quadrature of prior × likelihood on a fine grid."""
    grid = np.linspace(-10.0, 10.0, 400_001)
    prior = sum(0.5 * np.exp(-0.5 * ((grid - m) / BIPRIOR_SD) ** 2) for m in BIPRIOR_MU)
    dens = prior * np.exp(-0.5 * ((grid - BI_OBS) / BI_OBS_SD) ** 2)
    dens /= dens.sum()
    right = grid > 0
    mean_right = float((dens[right] * grid[right]).sum() / dens[right].sum())
    return {"p_right": float(dens[right].sum()), "mean": float((dens * grid).sum()), "right_mean": mean_right}


def _sample_bimodal_prior(model: pm.Model, tempering: str, seed: int = 6) -> az.InferenceData:
    with model:
        step = ParallelTempering(n_replicas=6, beta_min=0.01, tempering=tempering)
        return pm.sample(draws=2000, tune=800, step=step, chains=2, cores=1, random_seed=seed,
                         initvals={"x": -4.0}, **SAMPLE_KW)


def _check_bimodal_prior_posterior(idata: az.InferenceData, ref: dict[str, float]) -> None:
    """Mode weight and means within 4 Monte Carlo standard errors (ESS-based) of quadrature."""
    x = idata.posterior["x"]
    indicator = (x > 0).astype(float).rename("right").to_dataset()
    mcse_right = float(az.mcse(indicator)["right"])
    assert mcse_right < 0.04, mcse_right
    draws = x.values.ravel()
    assert abs(float((draws > 0).mean()) - ref["p_right"]) < 4 * mcse_right + 0.01, ((draws > 0).mean(), ref)
    mcse_mean = float(az.mcse(idata, var_names=["x"])["x"])
    assert abs(float(draws.mean()) - ref["mean"]) < 4 * mcse_mean + 0.02, (draws.mean(), ref)
    assert abs(float(draws[draws > 0].mean()) - ref["right_mean"]) < 0.05, ref


def test_posterior_tempering_samples_a_bimodal_prior_posterior() -> None:
    ref = _bimodal_prior_reference()
    # the likelihood moves weight to the right mode: 0.5 a priori
    assert 0.75 < ref["p_right"] < 0.82, ref
    idata = _sample_bimodal_prior(_bimodal_prior_model(), "posterior")
    assert np.all(idata.sample_stats["betas"].values[..., 0] == 1.0)
    _check_bimodal_prior_posterior(idata, ref)


@LIKELIHOOD_MUTATIONS
def test_posterior_tempering_check_fails_with_mutated_likelihood(factor: float) -> None:
    model = scale_likelihood(_bimodal_prior_model(), factor)
    idata = _sample_bimodal_prior(model, "posterior")
    with pytest.raises(AssertionError):
        _check_bimodal_prior_posterior(idata, _bimodal_prior_reference())


# ------------------------------------------------------ statistics and plumbing


def test_sample_stats_shapes_and_ranges(conjugate_mp_idata: az.InferenceData) -> None:
    stats = conjugate_mp_idata.sample_stats
    k = 4
    assert stats["betas"].shape == (2, 300, k)
    assert stats["replica_accept"].shape == (2, 300, k)
    assert stats["replica_scale"].shape == (2, 300, k)
    assert stats["swap_accept"].shape == (2, 300, k - 1)
    assert stats["swap_accepted"].shape == (2, 300, k - 1)
    assert stats["swap_rate"].shape == (2, 300, k - 1)
    assert stats["accept"].shape == (2, 300)
    assert stats["round_trips"].shape == (2, 300)

    swap = stats["swap_accept"].values
    attempted = ~np.isnan(swap)
    # Even/odd scheme: pairs (0,1),(2,3) and (1,2) alternate every draw.
    assert np.all(attempted.sum(axis=-1) >= 1)
    assert np.all(attempted.any(axis=1))
    assert np.all((swap[attempted] >= 0.0) & (swap[attempted] <= 1.0))
    assert not np.any(stats["swap_accepted"].values & ~attempted)
    for name in ("swap_rate", "replica_accept", "accept"):
        values = stats[name].values
        assert np.all((values >= 0.0) & (values <= 1.0)), name

    betas = stats["betas"].values
    assert np.all(betas[..., 0] == 1.0)
    assert np.allclose(betas[..., -1], 0.01)
    assert np.all(np.diff(betas, axis=-1) < 0.0)
    # The ladder is frozen after tuning: identical for all kept draws of a chain.
    assert np.all(betas == betas[:, :1, :])
    # Adapted towards equal swap rates.
    final_rates = stats["swap_rate"].values[:, -1, :]
    assert np.all(final_rates.max(axis=-1) - final_rates.min(axis=-1) < 0.2), final_rates


def test_multiprocess_chains_are_distinct(conjugate_mp_idata: az.InferenceData) -> None:
    mu = conjugate_mp_idata.posterior["mu"].values
    assert mu.shape == (2, 300)
    assert not np.allclose(mu[0], mu[1])
    assert abs(mu.mean() - CONJ_POST_MEAN) < 0.1


def test_step_pickles_and_still_works(conjugate_model: pm.Model) -> None:
    with conjugate_model:
        step = ParallelTempering(n_replicas=3, move="hmc")
    restored = pickle.loads(pickle.dumps(step))
    assert restored.n_replicas == 3
    assert restored.stats_dtypes_shapes["swap_accept"] == (np.float64, [2])
    point, stats = restored.step(conjugate_model.initial_point())
    assert set(point) == {"mu"}
    assert np.isfinite(point["mu"])
    assert stats[0]["betas"].shape == (3,)


def test_random_pair_scheme_attempts_one_pair(conjugate_model: pm.Model) -> None:
    with conjugate_model:
        step = ParallelTempering(
            n_replicas=4, betas=[1.0, 0.5, 0.25, 0.1], swap_scheme="random_pair"
        )
        idata = pm.sample(
            draws=100, tune=50, step=step, chains=1, cores=1, random_seed=1, **SAMPLE_KW
        )
    swap = idata.sample_stats["swap_accept"].values
    assert np.all((~np.isnan(swap)).sum(axis=-1) == 1)
    # User ladders are not adapted by default.
    assert np.allclose(idata.sample_stats["betas"].values, [1.0, 0.5, 0.25, 0.1])


def test_non_finite_logp_is_rejected_not_fatal() -> None:
    with pm.Model():
        x = pm.Normal("x", 0.0, 1.0)
        # NaN density for x > 1 (e.g. a failed ODE solve) must act like zero density.
        pm.Potential("nan_region", pt.switch(pt.gt(x, 1.0), np.nan, 0.0))
        step = ParallelTempering(n_replicas=3, beta_min=0.1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            idata = pm.sample(
                draws=300, tune=200, step=step, chains=1, cores=1, random_seed=2, **SAMPLE_KW
            )
    x_draws = idata.posterior["x"].values
    assert np.all(np.isfinite(x_draws))
    assert x_draws.max() <= 1.0


# ----------------------------------------------------------- shared-variable ladder

SIGMA_COLD = 1.0
SIGMA_LADDER = [1.0, 2.0, 4.0, 8.0]  # hot = large noise sd = flat likelihood
SQ_Y = np.random.default_rng(3).normal(2.0**2, SIGMA_COLD, size=4)
SQ_PRIOR_MU, SQ_PRIOR_SD = 1.0, 2.0


def _squared_mean_exact() -> dict[str, float]:
    """Cold posterior of mu for y ~ N(mu^2, SIGMA_COLD), mu ~ N(1, 2), by quadrature."""
    grid = np.linspace(-6.0, 6.0, 600_001)
    log_post = -0.5 * ((grid - SQ_PRIOR_MU) / SQ_PRIOR_SD) ** 2
    log_post += -0.5 * (((SQ_Y[:, None] - grid**2) / SIGMA_COLD) ** 2).sum(axis=0)
    weights = np.exp(log_post - log_post.max())
    weights /= weights.sum()
    right = grid > 0
    w_right = weights[right] / weights[right].sum()
    right_mean = float((w_right * grid[right]).sum())
    return {
        "p_pos": float(weights[right].sum()),
        "mean": float((weights * grid).sum()),
        "right_sd": float(np.sqrt((w_right * (grid[right] - right_mean) ** 2).sum())),
    }


def test_shared_variable_ladder_samples_cold_posterior() -> None:
    sigma = pytensor.shared(SIGMA_COLD, name="sigma")
    with pm.Model():
        mu = pm.Normal("mu", SQ_PRIOR_MU, SQ_PRIOR_SD)
        # y depends on mu^2: modes near mu = +-2, ~30 sd apart at the cold noise level,
        # which a local sampler cannot connect; a noise sd of 8 connects them.
        pm.Normal("y", mu**2, sigma, observed=SQ_Y)
        step = ParallelTempering(shared_ladder={sigma: SIGMA_LADDER})
        idata = pm.sample(
            draws=3000, tune=700, step=step, chains=2, cores=1, random_seed=4, **SAMPLE_KW
        )
    assert step.n_replicas == len(SIGMA_LADDER)
    assert sigma.get_value() == SIGMA_COLD  # the model's own value is untouched
    # A pure shared-variable ladder has no likelihood power.
    assert np.all(idata.sample_stats["betas"].values == 1.0)

    exact = _squared_mean_exact()
    assert 0.65 < exact["p_pos"] < 0.8  # unequal modes, so weighting errors would show
    mu_draws = idata.posterior["mu"].values
    indicator = (idata.posterior["mu"] > 0).astype(float).rename("right").to_dataset()
    # Tolerances are 4 Monte Carlo standard errors (ESS-based, arviz.mcse); the
    # MCSE bound keeps the test able to detect a wrong mode weight.
    mcse_frac = float(az.mcse(indicator)["right"])
    assert mcse_frac < 0.03, mcse_frac
    assert abs(float((mu_draws > 0).mean()) - exact["p_pos"]) < 4 * mcse_frac
    mcse_mean = float(az.mcse(idata, var_names=["mu"])["mu"])
    assert abs(float(mu_draws.mean()) - exact["mean"]) < 4 * mcse_mean
    # Within the dominant mode the width is set by the cold noise sd (a hot value
    # would at least double it).
    right = mu_draws[mu_draws > 0]
    assert abs(right.std() - exact["right_sd"]) < 0.15 * exact["right_sd"]
    swap = idata.sample_stats["swap_accept"].values
    assert np.nanmean(swap) > 0.3


def test_shared_variable_ladder_conjugate_exact() -> None:
    """Swaps between replicas with different noise sd leave the cold posterior exact."""
    sigma = pytensor.shared(1.0, name="noise_sd")
    with pm.Model():
        mu = pm.Normal("mu", 0.0, CONJ_PRIOR_SD)
        pm.Normal("y", mu, sigma, observed=CONJ_Y)
        step = ParallelTempering(shared_ladder={sigma: [1.0, 3.0, 9.0, 27.0]})
        idata = pm.sample(
            draws=1500, tune=500, step=step, chains=2, cores=1, random_seed=8, **SAMPLE_KW
        )
    mu_draws = idata.posterior["mu"]
    ess = float(az.ess(idata, var_names=["mu"])["mu"])
    assert ess > 300, ess
    # Hot states (noise sd up to 27) leaking into the cold replica would inflate
    # the variance by orders of magnitude; 4 Monte Carlo standard errors otherwise.
    assert abs(float(mu_draws.mean()) - CONJ_POST_MEAN) < 4.0 * np.sqrt(CONJ_POST_VAR / ess)
    assert abs(float(mu_draws.var()) - CONJ_POST_VAR) < 4.0 * CONJ_POST_VAR * np.sqrt(2.0 / ess)


def test_shared_ladder_combined_with_betas() -> None:
    with pm.Model() as model:
        sigma = pm.Data("noise", 1.0)  # registered in the model, so addressable by name
        mu = pm.Normal("mu", 0.0, 1.0)
        pm.Normal("y", mu, sigma, observed=np.array([0.5, 1.5]))
        step = ParallelTempering(
            betas=[1.0, 0.5, 0.2], shared_ladder={"noise": [1.0, 2.0, 4.0]}
        )
    assert step.n_replicas == 3
    point = model.initial_point()
    _, stats = step.step(point)
    assert stats[0]["swap_accept"].shape == (2,)


# ------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def tiny_model() -> pm.Model:
    with pm.Model() as model:
        pm.Normal("a", 0.0, 1.0)
        pm.Normal("obs", model["a"], 1.0, observed=[0.0])
    return model


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"betas": [0.5, 0.25]}, "first inverse temperature must be 1"),
        ({"betas": [1.0, 0.5, 0.0]}, r"\(0, 1\]"),
        ({"betas": [1.0, -0.5]}, r"\(0, 1\]"),
        ({"betas": [1.0, 1.5]}, r"\(0, 1\]"),
        ({"betas": [1.0, np.nan]}, r"\(0, 1\]"),
        ({"betas": [1.0, 0.2, 0.5]}, "non-increasing"),
        ({"betas": [1.0]}, "at least 2 replicas"),
        ({"n_replicas": 1}, "at least 2 replicas"),
        ({"n_replicas": 3, "betas": [1.0, 0.5]}, "Inconsistent number of replicas"),
        ({"beta_min": 0.0}, r"\(0, 1\]"),
        ({"beta_min": 2.0}, r"\(0, 1\]"),
        ({"betas": [1.0, 0.5], "beta_min": 0.1}, "either betas or beta_min"),
        ({"tempering": "prior"}, "tempering"),
        ({"swap_scheme": "all_pairs"}, "swap_scheme"),
        ({"move": "gibbs"}, "Unknown move"),
        ({"n_moves": 0}, "n_moves"),
        ({"betas": [1.0, 1.0], "adapt_betas": True}, "strictly decreasing"),
    ],
)
def test_bad_input_raises_value_error(tiny_model: pm.Model, kwargs: dict, message: str) -> None:
    with tiny_model, pytest.raises(ValueError, match=message):
        ParallelTempering(**kwargs)


@pytest.mark.parametrize(
    "ladder, extra, message",
    [
        ([1.0, 2.0, 4.0], {"n_replicas": 4}, "Inconsistent number of replicas"),
        ([1.0, 2.0, 4.0], {"betas": [1.0, 0.5]}, "Inconsistent number of replicas"),
        ([1.0], {}, "at least 2 values"),
        ([1.0, [2.0, 3.0]], {}, "shape"),
        ([1.0, np.inf], {}, "not finite"),
    ],
)
def test_bad_shared_ladder_raises_value_error(ladder: list, extra: dict, message: str) -> None:
    sigma = pytensor.shared(1.0, name="sigma_bad")
    with pm.Model():
        a = pm.Normal("a", 0.0, 1.0)
        pm.Normal("obs", a, sigma, observed=[0.0])
        with pytest.raises(ValueError, match=message):
            ParallelTempering(shared_ladder={sigma: ladder}, **extra)


def test_shared_ladder_variable_must_enter_logp(tiny_model: pm.Model) -> None:
    unrelated = pytensor.shared(1.0, name="unrelated")
    with tiny_model, pytest.raises(ValueError, match="does not enter"):
        ParallelTempering(shared_ladder={unrelated: [1.0, 2.0]})


def test_cold_value_mismatch_warns() -> None:
    sigma = pytensor.shared(1.0, name="sigma_warn")
    with pm.Model():
        a = pm.Normal("a", 0.0, 1.0)
        pm.Normal("obs", a, sigma, observed=[0.0])
        with pytest.warns(UserWarning, match="cold value"):
            ParallelTempering(shared_ladder={sigma: [0.5, 2.0]})


# ------------------------------------------------------------------ unit level


def test_geometric_ladder_and_validation() -> None:
    betas = geometric_betas(5, 1e-4)
    assert betas[0] == 1.0 and betas[-1] == 1e-4
    np.testing.assert_allclose(betas[1:] / betas[:-1], 0.1)
    assert geometric_betas(8).shape == (8,)
    np.testing.assert_array_equal(validate_betas([1, 0.5, 0.5]), [1.0, 0.5, 0.5])


def test_ladder_adapter_equalises_swap_rates() -> None:
    adapter = LadderAdapter(np.array([1.0, 0.9, 0.01]), rate=0.5)
    # Pair 0 swaps easily (narrow gap), pair 1 rarely: gap 0 must widen.
    gap0 = np.log(1.0 / 0.9)
    for _ in range(200):
        betas = adapter.update(np.array([0, 1]), np.array([0.95, 0.05]))
    assert betas[0] == 1.0 and np.isclose(betas[-1], 0.01)
    assert np.log(1.0 / betas[1]) > 2 * gap0


def test_round_trip_counter_and_pairs() -> None:
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(select_swap_pairs("even_odd", 0, 5, rng), [0, 2])
    np.testing.assert_array_equal(select_swap_pairs("even_odd", 1, 5, rng), [1, 3])
    counter = RoundTripCounter(2)
    counter.swap(0)  # walker 0 reaches the hot end
    counter.end_round()
    assert counter.count == 0
    counter.swap(0)  # and comes back
    counter.end_round()
    assert counter.count == 1


def test_custom_move_factory(conjugate_model: pm.Model) -> None:
    with conjugate_model:
        step = ParallelTempering(
            n_replicas=2,
            move=lambda k: RandomWalkMetropolis(
                adapt_covariance=False, initial_scale=0.1 * (k + 1)
            ),
        )
    assert [m.scale for m in step.moves] == pytest.approx([0.1, 0.2])


class _DiagonalRandomWalk(AdaptiveMove):
    """A user's move written against AdaptiveMove: a random walk whose metric is a diagonal scaling."""

    START = 50.0  # far above the tuned size

    def setup(self, ndim: int, beta: float) -> None:
        self.sd = np.ones(ndim)
        self.start_adaptation(WindowedAdaptation(ndim, self.START, 0.3, diagonal=True, first_window=50),
                              self.START)

    def transition(self, state, target, rng, size):
        proposal = target.evaluate(state.x + size * self.sd * rng.standard_normal(state.x.size))
        accepted, accept_prob = metropolis_accept(target.logp(proposal) - target.logp(state), rng)
        return (proposal if accepted else state), accept_prob

    def use_metric(self, variances: np.ndarray) -> None:
        self.sd = np.sqrt(variances)


def test_custom_adaptive_move_tunes_and_samples(conjugate_model: pm.Model) -> None:
    """AdaptiveMove's tuning (dual averaging, doubling windows) serves a user's move: the size leaves its
    start and ends at the averaged value, and the conjugate posterior comes out within 4 MC standard errors."""
    with conjugate_model:
        step = ParallelTempering(n_replicas=2, beta_min=0.2, move=_DiagonalRandomWalk())
        idata = pm.sample(draws=1500, tune=600, step=step, chains=1, cores=1, random_seed=3, **SAMPLE_KW)
    for move in step.moves:
        assert move.scale == move._adaptation.final_step
        assert move.sd[0] < 0.8  # a window's variances became the metric (posterior sd 0.22-0.5 at beta 1-0.2)
        assert move.scale * move.sd[0] < 0.1 * _DiagonalRandomWalk.START  # the proposal's sd, tuned down
    mu = idata.posterior["mu"]
    ess = float(az.ess(idata, var_names=["mu"])["mu"])
    assert ess > 200, ess
    assert abs(float(mu.mean()) - CONJ_POST_MEAN) < 4.0 * np.sqrt(CONJ_POST_VAR / ess)
    assert abs(float(mu.var()) - CONJ_POST_VAR) < 4.0 * CONJ_POST_VAR * np.sqrt(2.0 / ess)


def _sample_logged_warnings(betas: list[float], caplog: pytest.LogCaptureFixture) -> list[str]:
    """Samples y_i ~ N(mu, 1) (2000 values) under mu ~ N(0, 100²) and returns PyMC's logged warning messages."""
    y = np.random.default_rng(4).normal(0.3, 1.0, size=2000)
    with pm.Model():
        mu = pm.Normal("mu", 0.0, 100.0)
        pm.Normal("y", mu, 1.0, observed=y)
        step = ParallelTempering(betas=betas, adapt_betas=False)
        with caplog.at_level("WARNING"):
            pm.sample(draws=300, tune=200, step=step, chains=1, cores=1, random_seed=2, **SAMPLE_KW)
    return [r.getMessage() for r in caplog.records if "Parallel tempering after" in r.getMessage()]


def test_ladder_that_does_not_communicate_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    """A cold posterior 5000 times narrower than the hot replica's density: the pair almost never swaps, and
    PyMC logs the step's SamplerWarning naming it; a ladder that swaps is not reported."""
    messages = _sample_logged_warnings([1.0, 1e-6], caplog)
    assert len(messages) == 1, messages
    assert "replicas 0 and 1" in messages[0]
    caplog.clear()
    assert _sample_logged_warnings([1.0, 0.5], caplog) == []


def test_communication_check_names_a_replica_that_does_not_move() -> None:
    check = CommunicationCheck(3)
    rates, attempts, betas = np.array([0.4, 0.3]), np.array([50, 50]), np.array([1.0, 0.3, 0.1])
    for _ in range(CommunicationCheck.FIRST_CHECK - 1):
        assert check.record(np.array([0.5, 0.4, 0.005]), rates, attempts, betas) is None
    message = check.record(np.array([0.5, 0.4, 0.005]), rates, attempts, betas, {"ladder_kappa": [1.0, 4.0, 16.0]})
    assert "replica 2 (beta 0.1, kappa 16) accepted 0.5% of its moves" in message
    assert "replicas 0 and 1" not in message
    for _ in range(300):  # once per chain
        assert check.record(np.zeros(3), np.zeros(2), attempts, betas) is None
