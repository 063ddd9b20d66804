"""The covariance algebra of Algorithm 1: everything that does not depend on the interrogations.

Given the grid, the kernel, ``lam`` and the noise rule, every covariance, gain and step-ahead variance
of Algorithm 1 (Chkrebtii et al., 2016) is independent of ``f`` and ``theta``, and all of them are
proportional to ``1 / alpha`` with ``alpha``-free weights. This module computes them once
(at ``alpha = 1``) in batch form: sequential conditioning on interrogations ``f_0..f_{N-1}``
with independent noise ``r_n`` is the lower Cholesky factor ``L`` of ``K + diag(r)``
(``K = C_t(s, s)``), where ``L[n, n]^2 = g_n`` is the innovation variance of Algorithm 1 and
``v_n = K[n, n] - sum_k L[n, k]^2 = C_t^{n-1}(s_n, s_n)``. With whitened interrogations
``e = L^{-1} f`` the conditional state mean at any time ``a`` is ``u0 + sum_k G(a, k) e_k`` where
``G(a, .) = L^{-1} X(a, s)^T`` and its variance is ``C(a, a) - sum_k G(a, k)^2``.

For the uniform kernel ``K`` is banded (half-bandwidth ``w``: offsets with ``|s_i - s_j| < 2 lam``), so
``L`` is banded and ``G(s_n, k)`` equals an ``n``-independent ``G_inf(k)`` once ``s_n - s_k >= 2 lam``:
the step-ahead weights need only ``w`` "near" entries per step, which is the O(N) truncation of
§3.4 (exact, not an approximation). The squared-exponential kernel has ``w = N - 1`` (O(N^3)).

Every quantity can carry a forward-mode tangent in ``lam`` (one scalar direction), which gives the
exact ``lam``-gradient of the PyMC layer.
"""

from __future__ import annotations

import math
from collections import namedtuple
from dataclasses import dataclass

import numba as nb
import numpy as np

from pymc_pnode._jit import JIT, compile_on_first_use
from pymc_pnode.chkrebtii.kernels import UNIFORM, kc, kt, kx, kx_far

__all__ = [
    "NOISE_RULES",
    "Structure",
    "Weights",
    "component_structure",
    "covariance_structure",
    "noise_code",
    "stacked_structure",
]

PAPER = 0
CODE = 1
ZERO = 2
NOISE_RULES = {"paper": PAPER, "code": CODE, "zero": ZERO}

Weights = namedtuple("Weights", ["lb", "ginf", "gn", "sd", "hh", "lt"])
Weights.__doc__ = """The covariance structure's arrays (or their tangents, or cotangents), as the recursion takes them.

``lb[n, o] = L[n, n - o]`` (``o = 0..w``) the banded Cholesky factor, ``ginf[k]`` the far weights,
``gn[n, o - 1] = G(s_n, n - o)`` the near step-ahead weights, ``sd[n]`` the step-ahead standard deviation
``sqrt(C^{n-1}(s_n, s_n))``, ``hh[i, k] = G(t_i, k)`` the weights of the final conditional mean and ``lt``
the lower Cholesky factor of ``C^N(t, t) + nugget`` (per component: one leading axis more when stacked).
"""


def noise_code(noise: str) -> int:
    """Integer code of a noise rule; ``ValueError`` for unknown names."""
    if noise not in NOISE_RULES:
        raise ValueError(f"noise must be one of {sorted(NOISE_RULES)}, got {noise!r}")
    return NOISE_RULES[noise]


@nb.njit(**JIT)
def _bandwidth(n_grid: int, span: float, lam: float, kind: int) -> int:
    """Largest grid offset ``o`` with ``K(o h) != 0`` (``N - 1`` for the squared exponential)."""
    if kind != UNIFORM:
        return n_grid - 1
    w = 0
    while w + 1 <= n_grid - 1 and kt(span * (w + 1) / (n_grid - 1), 0.0, lam, kind)[0] > 0.0:
        w += 1
    return w


@nb.njit(**JIT)
def _clipped_cholesky(a, da, tangent):
    """Lower Cholesky factor of the symmetric PSD matrix ``a`` (and its tangent along ``da``).

    Pivots that are not positive (a numerically singular direction) drop their column, so the
    factor exists for every positive semi-definite input and ``L L^T`` equals ``a`` on the range.
    """
    n = a.shape[0]
    lo = np.zeros((n, n))
    dlo = np.zeros((n, n)) if tangent else np.zeros((0, 0))
    for j in range(n):
        d = a[j, j]
        dd = da[j, j] if tangent else 0.0
        for k in range(j):
            d -= lo[j, k] * lo[j, k]
            if tangent:
                dd -= 2.0 * lo[j, k] * dlo[j, k]
        if not d > 0.0:
            continue
        r = math.sqrt(d)
        lo[j, j] = r
        if tangent:
            dlo[j, j] = 0.5 * dd / r
        for i in range(j + 1, n):
            x = a[i, j]
            dx = da[i, j] if tangent else 0.0
            for k in range(j):
                x -= lo[i, k] * lo[j, k]
                if tangent:
                    dx -= dlo[i, k] * lo[j, k] + lo[i, k] * dlo[j, k]
            lo[i, j] = x / r
            if tangent:
                dlo[i, j] = (dx - lo[i, j] * dlo[j, j]) / r
    return lo, dlo


@nb.njit(**JIT)
def component_structure(n_grid, span, times, lam, kind, noise, jitter, tangent):
    """Covariance structure of one state component at ``alpha = 1``.

    Parameters
    ----------
    n_grid : int
        Number of grid points ``N >= 2`` (equally spaced on ``[0, span]``, times from ``t0``).
    span : float
        ``t1 - t0``.
    times : float64[::1]
        Output times measured from ``t0``.
    lam : float
        Length-scale.
    kind, noise : int
        Kernel and noise-rule codes.
    jitter : float
        Relative floor of the innovation variances ``g_n >= jitter K[n, n]`` and relative nugget
        ``jitter * max diag C(t, t)`` of the final joint draw.
    tangent : bool
        Also return the ``lam``-derivatives.

    Returns
    -------
    tuple
        ``(weights, w, tangents)``: the :class:`Weights`, the half-bandwidth ``w`` and the ``Weights``
        of the ``lam``-tangents (empty arrays unless ``tangent``).
    """
    nn = n_grid
    # Compile-time specialisation: without tangents the derivative branches vanish from the loops.
    tg = nb.literally(tangent)
    w = _bandwidth(nn, span, lam, kind)
    s = np.empty(nn)
    for n in range(nn):
        s[n] = span * n / (nn - 1)
    nt = nn if tg else 0
    kv = np.empty(w + 1)
    dkv = np.empty(w + 1)
    for o in range(w + 1):
        kv[o], dkv[o] = kt(s[o], 0.0, lam, kind)

    # Banded Cholesky factor of K + diag(r) with the noise rule evaluated on the fly.
    lb = np.zeros((nn, w + 1))
    dlb = np.zeros((nt, w + 1))
    v_prev = 0.0
    g_prev = 1.0
    dv_prev = 0.0
    dg_prev = 0.0
    for n in range(nn):
        m = min(n, w)
        for o in range(m, 0, -1):
            k = n - o
            val = kv[o]
            dval = dkv[o]
            for j in range(max(0, n - w), k):
                val -= lb[n, n - j] * lb[k, k - j]
                if tg:
                    dval -= dlb[n, n - j] * lb[k, k - j] + lb[n, n - j] * dlb[k, k - j]
            lb[n, o] = val / lb[k, 0]
            if tg:
                dlb[n, o] = (dval - lb[n, o] * dlb[k, 0]) / lb[k, 0]
        v = kv[0]
        dv = dkv[0]
        for o in range(1, m + 1):
            v -= lb[n, o] * lb[n, o]
            if tg:
                dv -= 2.0 * lb[n, o] * dlb[n, o]
        if n == 0 or noise == ZERO:
            g, dg = v, dv
        elif noise == PAPER:
            g, dg = 2.0 * v, 2.0 * dv
        else:
            # Code rule: add the just-conditioned derivative variance at the previous grid point,
            # v_prev (g_prev - v_prev) / g_prev (zero in exact arithmetic after a noise-free step).
            pv = v_prev * (g_prev - v_prev) / g_prev
            dpv = (dv_prev * (g_prev - 2.0 * v_prev) + v_prev * dg_prev) / g_prev - pv * dg_prev / g_prev
            g, dg = v + pv, dv + dpv
        floor = jitter * kv[0]
        if not g > floor:
            g, dg = floor, jitter * dkv[0]
        lb[n, 0] = math.sqrt(g)
        if tg:
            dlb[n, 0] = 0.5 * dg / lb[n, 0]
        v_prev, g_prev, dv_prev, dg_prev = v, g, dv, dg

    # Far weights G_inf(k) = [L^{-1} X_inf]_k and their running sum of squares.
    ginf = np.zeros(nn)
    dginf = np.zeros(nt)
    for k in range(nn):
        x, dx = kx_far(s[k], lam, kind)
        for j in range(max(0, k - w), k):
            x -= lb[k, k - j] * ginf[j]
            if tg:
                dx -= dlb[k, k - j] * ginf[j] + lb[k, k - j] * dginf[j]
        ginf[k] = x / lb[k, 0]
        if tg:
            dginf[k] = (dx - ginf[k] * dlb[k, 0]) / lb[k, 0]
    cs = np.zeros(nn + 1)
    dcs = np.zeros(nn + 1)
    for k in range(nn):
        cs[k + 1] = cs[k] + ginf[k] * ginf[k]
        if tg:
            dcs[k + 1] = dcs[k] + 2.0 * ginf[k] * dginf[k]

    # Near step-ahead weights and step-ahead standard deviations.
    gn = np.zeros((nn, w))
    dgn = np.zeros((nt, w))
    sd = np.zeros(nn)
    dsd = np.zeros(nt)
    for n in range(1, nn):
        a = s[n]
        m = min(n, w)
        for o in range(m, 0, -1):
            k = n - o
            x, dx = kx(a, s[k], lam, kind)
            jlo = max(0, k - w)
            jmid = min(k, max(jlo, n - w))  # j < n - w: far weights G_inf(j)
            for j in range(jlo, jmid):
                x -= lb[k, k - j] * ginf[j]
                if tg:
                    dx -= dlb[k, k - j] * ginf[j] + lb[k, k - j] * dginf[j]
            for j in range(jmid, k):
                x -= lb[k, k - j] * gn[n, n - j - 1]
                if tg:
                    dx -= dlb[k, k - j] * gn[n, n - j - 1] + lb[k, k - j] * dgn[n, n - j - 1]
            gn[n, o - 1] = x / lb[k, 0]
            if tg:
                dgn[n, o - 1] = (dx - gn[n, o - 1] * dlb[k, 0]) / lb[k, 0]
        var, dvar = kc(a, a, lam, kind)
        nf = max(0, n - w)
        var -= cs[nf]
        if tg:
            dvar -= dcs[nf]
        for o in range(1, m + 1):
            var -= gn[n, o - 1] * gn[n, o - 1]
            if tg:
                dvar -= 2.0 * gn[n, o - 1] * dgn[n, o - 1]
        if var > 0.0:
            sd[n] = math.sqrt(var)
            if tg:
                dsd[n] = 0.5 * dvar / sd[n]

    # Final conditional mean weights and covariance at the output times.
    nt_out = times.shape[0]
    hh = np.zeros((nt_out, nn))
    dhh = np.zeros((nt_out if tg else 0, nn))
    for i in range(nt_out):
        a = times[i]
        for k in range(nn):
            x, dx = kx(a, s[k], lam, kind)
            for j in range(max(0, k - w), k):
                x -= lb[k, k - j] * hh[i, j]
                if tg:
                    dx -= dlb[k, k - j] * hh[i, j] + lb[k, k - j] * dhh[i, j]
            hh[i, k] = x / lb[k, 0]
            if tg:
                dhh[i, k] = (dx - hh[i, k] * dlb[k, 0]) / lb[k, 0]
    cn = np.empty((nt_out, nt_out))
    dcn = np.zeros((nt_out, nt_out)) if tg else np.zeros((0, 0))
    cmax = 0.0
    dcmax = 0.0
    for i in range(nt_out):
        for j in range(i + 1):
            c, dc = kc(times[i], times[j], lam, kind)
            if i == j and c > cmax:
                cmax, dcmax = c, dc
            for k in range(nn):
                c -= hh[i, k] * hh[j, k]
                if tg:
                    dc -= dhh[i, k] * hh[j, k] + hh[i, k] * dhh[j, k]
            cn[i, j] = c
            cn[j, i] = c
            if tg:
                dcn[i, j] = dc
                dcn[j, i] = dc
    for i in range(nt_out):
        cn[i, i] += jitter * cmax
        if tg:
            dcn[i, i] += jitter * dcmax
    lt, dlt = _clipped_cholesky(cn, dcn, tg)
    return Weights(lb, ginf, gn, sd, hh, lt), w, Weights(dlb, dginf, dgn, dsd, dhh, dlt)


_RO1 = nb.types.Array(nb.float64, 1, "C", readonly=True)


@compile_on_first_use((nb.int64, nb.float64, _RO1, _RO1, nb.int64, nb.int64, nb.float64, nb.boolean), **JIT)
def stacked_structure(n_grid, span, times, lam, kind, noise, jitter, tangent):
    """:func:`component_structure` of every component ``c`` (length-scale ``lam[c]``), padded to the
    largest bandwidth ``W``: ``(weights, w, tangents)`` with :class:`Weights` of shapes ``(C, N, W + 1)``,
    ``(C, N)``, ``(C, N, W)``, ``(C, N)``, ``(C, T, N)``, ``(C, T, T)``, the bandwidths ``w`` ``(C,)`` and the
    tangents' ``Weights`` (empty arrays unless ``tangent``). Non-finite or non-positive ``lam`` gives NaN arrays
    with ``W = 0``, which the recursion reports as a diverged solve.
    """
    nc = lam.shape[0]
    nn = n_grid
    nt = times.shape[0]
    ok = True
    for c in range(nc):
        if not (math.isfinite(lam[c]) and lam[c] > 0.0):
            ok = False
    ntg = nc if tangent else 0
    if not ok:
        return _filled(nc, nn, nt, 0, math.nan), np.zeros(nc, np.int64), _filled(ntg, nn, nt, 0, 0.0)
    ws = np.zeros(nc, np.int64)
    for c in range(nc):
        ws[c] = _bandwidth(nn, span, lam[c], kind)
    values, tangents = _filled(nc, nn, nt, ws.max(), 0.0), _filled(ntg, nn, nt, ws.max(), 0.0)
    for c in range(nc):
        if tangent:
            v, w, t = component_structure(nn, span, times, lam[c], kind, noise, jitter, True)
            _place(tangents, c, t, w)
        else:
            v, w, _ = component_structure(nn, span, times, lam[c], kind, noise, jitter, False)
        _place(values, c, v, w)
    return values, ws, tangents


@nb.njit(**JIT)
def _filled(n_comp, nn, nt, width, value):
    """Stacked :class:`Weights` of ``n_comp`` components (grid ``nn``, ``nt`` outputs, padded to ``width``)."""
    return Weights(np.full((n_comp, nn, width + 1), value), np.full((n_comp, nn), value),
                   np.full((n_comp, nn, width), value), np.full((n_comp, nn), value),
                   np.full((n_comp, nt, nn), value), np.full((n_comp, nt, nt), value))


@nb.njit(**JIT)
def _place(stacked, c, component, w):
    """Copy one component's weights (half-bandwidth ``w``) into slot ``c`` of the padded stacked arrays."""
    stacked.lb[c, :, : w + 1] = component.lb
    stacked.ginf[c] = component.ginf
    stacked.gn[c, :, :w] = component.gn
    stacked.sd[c] = component.sd
    stacked.hh[c] = component.hh
    stacked.lt[c] = component.lt


@dataclass
class Structure:
    """Covariance structure of Algorithm 1 for all components (``alpha = 1``), padded to a common ``w``.

    Attributes
    ----------
    weights : Weights
        Stacked per-component arrays of :func:`component_structure`, shapes ``(C, N, W + 1)``,
        ``(C, N)``, ``(C, N, W)``, ``(C, N)``, ``(C, T, N)``, ``(C, T, T)``.
    w : numpy.ndarray
        Bandwidth of each component (int64, ``(C,)``).
    tangents : Weights or None
        ``lam``-derivatives of the weights (component ``c`` with respect to ``lam[c]``).
    """

    weights: Weights
    w: np.ndarray
    tangents: Weights | None = None


def covariance_structure(disc, lam: np.ndarray, tangent: bool = False) -> Structure:
    """:func:`stacked_structure` of a :class:`~pymc_pnode.chkrebtii.problem.Discretisation` as a
    :class:`Structure` (NaN arrays for invalid ``lam``)."""
    nn, span, times, kind, noise, jitter = disc.structure_arguments()
    lam = np.ascontiguousarray(np.atleast_1d(lam), dtype=np.float64).view()
    lam.flags.writeable = False  # a view matching the read-only signature
    weights, w, tangents = stacked_structure(nn, span, times, lam, kind, noise, jitter, bool(tangent))
    return Structure(weights, w, tangents if tangent else None)
