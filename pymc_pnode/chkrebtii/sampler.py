"""``chkrebtii_sample``: Monte Carlo draws from Chkrebtii et al.'s probabilistic solution (Algorithm 1)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from pymc_pnode._jit import readonly
from pymc_pnode.chkrebtii.delay import DelayODE
from pymc_pnode.chkrebtii.problem import Discretisation, discretisation, field_spec, positive_parameter, segments
from pymc_pnode.chkrebtii.recursion import Innovations, forward
from pymc_pnode.chkrebtii.structure import Weights, covariance_structure
from pymc_pnode.discontinuities import restart_state
from pymc_pnode.ode import ODE

__all__ = ["chkrebtii_covariance", "chkrebtii_sample"]


def chkrebtii_sample(
    ode: ODE | DelayODE,
    y0: Sequence[float],
    theta: Sequence[float] | None,
    t_span: tuple[float, float],
    *,
    n_grid: int,
    alpha: float | Sequence[float],
    lam: float | Sequence[float],
    kernel: str = "uniform",
    noise: str = "zero",
    times: Sequence[float] | None = None,
    size: int = 1,
    rng: int | np.random.Generator | None = None,
    return_mean: bool = False,
    jitter: float = 1e-12,
    discontinuities: Sequence[float] | None = None,
    jumps=None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    r"""Draw realisations of the probabilistic solution of an ODE / delay equation (Algorithm 1).

    Each realisation runs Algorithm 1 of Chkrebtii et al. (2016) on the equally spaced grid of
    ``n_grid`` points over ``t_span``: sequential GP conditioning on model interrogations
    ``f_n = f(u_n, s_n, theta)`` at one-step-ahead state draws ``u_n``, followed by one joint draw of the
    state at ``times`` from the conditional GP :math:`\mathcal{N}(m^N(t), C^N(t, t))`.

    Parameters
    ----------
    ode : ODE or DelayODE
        The vector field.
    y0 : array_like, shape (n_states,)
        State at ``t_span[0]``.
    theta : array_like, shape (n_theta,)
        Parameters.
    t_span : (float, float)
        Integration interval; the grid spans it exactly.
    n_grid : int
        Number of grid points ``N >= 2`` (step ``h = (t1 - t0) / (N - 1)``).
    alpha : float or array_like (n_states,)
        Prior precision (> 0), scalar or one per state component.
    lam : float or array_like (n_states,)
        Kernel length-scale (> 0), scalar or one per component.
    kernel : {"uniform", "squared_exponential"}
        Derivative-kernel family. The uniform kernel has compact support and costs O(N) per
        realisation (O(N w^2) once, ``w ~ 2 lam / h``); the squared exponential costs O(N^3).
    noise : {"zero", "code", "paper"}
        Interrogation-error variance ``r_{n-1}(s_n)``: ``"zero"`` (Theorem 1; first-order convergence
        of the mean with ``lam`` proportional to ``h``), ``"code"`` (the authors' MATLAB rule: the just
        conditioned derivative variance at the previous grid point, which is zero in exact arithmetic, so
        it coincides with ``"zero"``), ``"paper"`` (``r = C_t^{n-1}(s_n, s_n)``; its mean does not converge
        with ``lam`` proportional to ``h``, see ``case_studies/chkrebtii_ode6.ipynb`` — keep ``lam`` fixed or
        several steps). For the
        squared exponential with ``lam >~ h`` prefer ``"paper"``: exact interrogations make its Gram
        matrix numerically singular (the ``jitter`` floor then acts as a nugget). Exact interrogations are
        stable only for small ``k h`` and short spans (``y' = -k y`` with ``lam = 2h``: ``k h < 0.020`` over
        5000 steps, 0.0061 over 20,000; the paper rule up to ``k h ~ 1.5``,
        ``benchmarks/chkrebtii_stability.py``): use ``"paper"`` with a fixed ``lam`` for stiff or decaying
        dynamics.
    times : array_like, optional
        Strictly increasing output times inside ``t_span`` (default: the grid).
    size : int, default 1
        Number of realisations.
    rng : int or numpy.random.Generator, optional
        Random source.
    return_mean : bool, default False
        Also return the conditional mean :math:`m^N(t)` given each realisation's interrogations.
    jitter : float, default 1e-12
        Relative floor of the innovation variances (``g_n >= jitter C_t^0(s_n, s_n)``) and relative
        nugget of the final joint draw (``jitter * max C^0(t, t)``).
    discontinuities : sequence of float, optional
        Times inside ``t_span`` where the vector field jumps in ``t``: each realisation restarts there from its
        own value, on a grid of its own per segment (as :func:`~pymc_pnode.ChkrebtiiSolution`; the innovations of
        a segment are drawn after those of the previous one, in the layer's order). Not for a :class:`DelayODE`.
    jumps : array_like, shape (len(discontinuities), n_states), optional
        Jumps of the state at the ``discontinuities`` (a bolus dose): each restart adds its row to the realisation
        where the previous segment ended (:func:`pymc_pnode.solve` has the same argument).

    Returns
    -------
    numpy.ndarray or (numpy.ndarray, numpy.ndarray)
        Realisations of shape ``(size, len(times), n_states)`` (and the conditional means, same
        shape). A realisation whose solve diverges (non-finite values) is NaN, with a warning.

    Raises
    ------
    ValueError
        For invalid arguments (non-positive ``alpha``/``lam``, ``n_grid < 2``, times outside the span...).
    """
    disc = discretisation(t_span, n_grid, times, kernel, noise, jitter)
    d = ode.n_states
    y0 = ode.validate_y0(y0)
    theta = ode.validate_theta(theta)
    alpha = positive_parameter(alpha, "alpha", d)
    lam = positive_parameter(lam, "lam", d)
    if isinstance(size, bool) or int(size) != size or size < 1:
        raise ValueError(f"size must be a positive integer, got {size!r}")
    rng = np.random.default_rng(rng)
    segmented, jumps = segments(disc, ode, discontinuities, jumps, symbolic=False)
    pieces = [(seg, keep, *_recursion_arguments(ode, seg, alpha, lam)) for seg, keep in segmented]
    nt = len(disc.times)
    draws = np.empty((int(size), nt, d))
    means = np.empty((int(size), nt, d))
    failed = 0
    for b in range(int(size)):
        y_start, parts = y0, []
        for s, (seg, keep, spec, setting, weights) in enumerate(pieces):
            z = rng.standard_normal((seg.n_grid - 1, d))
            zt = rng.standard_normal((len(seg.times), d))
            innovations = Innovations(readonly(y_start), readonly(theta), readonly(z), readonly(zt))
            out, outm, _, _, _, status = forward.entry_point(*spec.functions, setting, weights, innovations)
            if status != 0:
                break
            y_start = restart_state(out[-1].copy(), jumps, s)  # the next restarts from this realisation's end
            parts.append((out, outm) if keep is None else (out[keep], outm[keep]))
        if status != 0:
            failed += 1
            draws[b] = means[b] = np.nan
            continue
        for k, store in enumerate((draws, means)):
            store[b] = parts[0][k] if len(parts) == 1 else np.concatenate([part[k] for part in parts])
    if failed:
        warnings.warn(
            f"{failed} of {size} realisations diverged (non-finite values) and are NaN; refine the "
            "grid, or use noise='paper' with a fixed lam (exact interrogations are stable only for "
            "small k h, see docs/chkrebtii.md), or increase alpha",
            RuntimeWarning,
            stacklevel=2,
        )
    return (draws, means) if return_mean else draws


def _recursion_arguments(ode, disc: Discretisation, alpha: np.ndarray, lam: np.ndarray) -> tuple:
    """``(field spec, setting, weights)`` of the forward recursion on ``disc`` (validated ``alpha``, ``lam``)."""
    d = ode.n_states
    grid = disc.grid
    spec = field_spec(ode, grid)
    st = covariance_structure(disc, lam)
    cmap = np.zeros(d, np.int64) if lam.size == 1 else np.arange(d, dtype=np.int64)
    scale = np.broadcast_to(1.0 / np.sqrt(alpha), (d,))
    # Per-state step-ahead and final standard deviations scale as alpha^{-1/2} (Chkrebtii et al., 2016, Alg. 1).
    weights = Weights(*(readonly(a) for a in st.weights._replace(sd=st.weights.sd[cmap] * scale[:, None],
                                                                  lt=st.weights.lt[cmap] * scale[:, None, None])))
    return spec, spec.setting(st.w, cmap, grid, True), weights


def chkrebtii_covariance(
    t_span: tuple[float, float],
    *,
    n_grid: int,
    alpha: float | Sequence[float],
    lam: float | Sequence[float],
    kernel: str = "uniform",
    noise: str = "zero",
    times: Sequence[float] | None = None,
    jitter: float = 1e-12,
) -> np.ndarray:
    r"""The covariance :math:`C^N(t, t')` of Algorithm 1's final state at ``times``, per state component.

    Given the grid, the kernel, ``lam`` and the noise rule, every covariance of Algorithm 1 is independent of the
    vector field, the parameters and the realisation (Chkrebtii et al., 2016, Algorithm 1): a realisation at
    ``times`` is :math:`\mathcal{N}(m^N(t), C^N(t, t'))` given its interrogations, with :math:`m^N` the
    conditional mean of :func:`chkrebtii_sample` (``return_mean=True``) or :func:`ChkrebtiiSolution`
    (``output="mean"``). This is the variance of the paper's likelihood of a boundary value (eq. 16, the
    Lane--Emden problem of §5.2). It includes the nugget ``jitter * max C^0(t, t)`` that the final joint draw adds.

    Parameters are those of :func:`chkrebtii_sample` (``alpha``, ``lam`` scalars or one per component).

    Returns
    -------
    numpy.ndarray
        Shape ``(n_components, len(times), len(times))``: one covariance per state component when ``alpha`` or
        ``lam`` is given per component (``n_components`` their length), otherwise one shared by all components
        (``n_components = 1``).
    """
    disc = discretisation(t_span, n_grid, times, kernel, noise, jitter)
    n_comp = max(np.size(alpha), np.size(lam))
    alpha = positive_parameter(alpha, "alpha", n_comp)
    lam = positive_parameter(lam, "lam", n_comp)
    lt = covariance_structure(disc, lam).weights.lt  # Cholesky factors of C^N at alpha = 1, one per length-scale
    lt = np.broadcast_to(lt, (n_comp,) + lt.shape[1:])
    return np.einsum("cij,ckj->cik", lt, lt) / np.broadcast_to(alpha, (n_comp,))[:, None, None]
