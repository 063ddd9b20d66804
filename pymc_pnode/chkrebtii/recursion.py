"""The nonlinear part of Algorithm 1: one-step-ahead draws and interrogations, and its adjoint.

With the covariance structure of :mod:`pymc_pnode.chkrebtii.structure` (whitened interrogations
``e = L^{-1} f``), one realisation is, per component ``i`` (structure ``c = cmap[i]``)::

    u_0 = y0
    u_n = y0 + sum_{k <= n-w-1} Ginf[k] e_k + sum_{o=1}^{w} Gn[n, o-1] e_{n-o} + sd[n] z_{n-1}   (n >= 1)
    f_n = f(u_n, s_n, theta)
    e_n = (f_n - sum_{o=1}^{w} Lb[n, o] e_{n-o}) / Lb[n, 0]
    U(t_j) = y0 + sum_k H[j, k] e_k (+ sum_l LT[j, l] zT_l for the final joint draw)

which is O(N w d) per realisation. Delay equations pass the lagged state through extra
"parameters" of an augmented vector field (see :mod:`pymc_pnode.chkrebtii.delay`): the lag at
``s_n - tau`` is the linear interpolation of the step-ahead conditional means ``m^{k-1}(s_k)`` (the
draws without their noise) on the grid, or the history function before ``t0``.

``backward`` recomputes the forward pass and returns the exact reverse-mode gradient with respect
to every input (``y0``, ``theta``, the innovations and the structure arrays). Both kernels take the
vector field as addresses of C callbacks (:mod:`pymc_pnode._callbacks`) and named bundles of
arrays, with explicit signatures: they are compiled once (and cached on disk) for every ODE, at their
first use.
"""

from __future__ import annotations

import math
from collections import namedtuple

import numba as nb
import numpy as np

from pymc_pnode._callbacks import call
from pymc_pnode._jit import JIT, compile_on_first_use, readonly
from pymc_pnode.chkrebtii.structure import Weights
from pymc_pnode.filtering.linalg import matvec_t

__all__ = ["LAG_CONSTANT", "LAG_FUNCTION", "LAG_NONE", "Innovations", "Setting", "backward", "forward"]

LAG_NONE = 0
LAG_CONSTANT = 1  # history phi(t) = y0 for t <= t0
LAG_FUNCTION = 2  # history phi(t, theta) compiled from a user function


Setting = namedtuple(
    "Setting", ["bandwidth", "cmap", "grid", "draw", "lag_mode", "tau_index", "tau_fixed", "forcing"]
)
Setting.__doc__ = """Everything of one recursion besides the weights and the differentiable inputs.

``bandwidth`` (int64 ``(C,)``) of each structure, ``cmap`` (int64 ``(d,)``) the structure of each state,
``grid`` the absolute grid ``s``, ``draw`` whether the output is the final joint draw (else the conditional
mean), the lag mode, the index of the delay in ``theta`` (``-1``: the fixed delay ``tau_fixed``) and the
forcing values ``(N, n_forcing)`` on the grid.
"""
Innovations = namedtuple("Innovations", ["y0", "theta", "z", "zt"])
Innovations.__doc__ = """The differentiable inputs besides the weights: ``y0``, ``theta`` and the standard-normal
innovations ``z`` ``(N - 1, d)`` of the step-ahead draws and ``zt`` ``(T, d)`` of the final joint draw."""


def _bundle_type(bundle, *arrays):
    """numba type of ``bundle`` built from the example values, arrays made read-only (``nb.typeof`` picks the
    uniform or the heterogeneous named-tuple type, which a hand-written ``nb.types.NamedTuple`` would not)."""
    return nb.typeof(bundle(*(readonly(a, np.asarray(a).dtype) if isinstance(a, np.ndarray) else a
                              for a in arrays)))


# Inputs are read-only C-contiguous arrays (PyTensor passes constants read-only); see ``readonly``.
_WEIGHTS_T = _bundle_type(Weights, np.zeros((1, 1, 1)), np.zeros((1, 1)), np.zeros((1, 1, 1)),
                          np.zeros((1, 1)), np.zeros((1, 1, 1)), np.zeros((1, 1, 1)))
_SETTING_T = _bundle_type(Setting, np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1), True, 0, 0, 0.0,
                          np.zeros((1, 1)))
_INNOVATIONS_T = _bundle_type(Innovations, np.zeros(1), np.zeros(1), np.zeros((1, 1)), np.zeros((1, 1)))
# addresses of the C callbacks of rhs, jac_y, jac_p of the (augmented) field and of the history phi,
# d phi / d theta and d phi / dt
_FIELD_T = (nb.int64,) * 6
_ARGS = (*_FIELD_T, _SETTING_T, _WEIGHTS_T, _INNOVATIONS_T)


@nb.njit(inline="always", **JIT)
def _prologue(setting, weights, innovations):
    """``(sizes, h, tau, y0, theta)``: the sizes (grid points, states, parameters, lagged states, augmented
    parameters ``theta``, lags and forcing, output times), the grid step, the delay (a parameter or fixed),
    and writable copies of ``y0`` and ``theta`` (the callbacks take writable arrays)."""
    grid, y0, theta = setting.grid, innovations.y0, innovations.theta
    nn, d, k = grid.shape[0], y0.shape[0], theta.shape[0]
    n_lag = d if setting.lag_mode != LAG_NONE else 0
    sizes = (nn, d, k, n_lag, k + n_lag + setting.forcing.shape[1], weights.hh.shape[1])
    tau = theta[setting.tau_index] if setting.tau_index >= 0 else setting.tau_fixed
    return sizes, (grid[nn - 1] - grid[0]) / (nn - 1), tau, y0.copy(), theta.copy()


@nb.njit(**JIT)
def _lag_position(a, h, n):
    """Bracketing grid index ``j`` and weight of ``a > 0`` with ``j + 1 <= n``."""
    x = a / h
    j = int(math.floor(x))
    if j >= n:
        return n - 1, 1.0
    return j, x - j


@compile_on_first_use(_ARGS, **JIT)
def forward(rhs, jac_y, jac_p, hist, hist_jp, hist_dt, setting, weights, innovations):
    """One realisation of Algorithm 1 given all its standard-normal innovations.

    ``rhs``, ``jac_y``, ``jac_p`` are the C callbacks of the (augmented) vector field, ``hist``,
    ``hist_jp``, ``hist_dt`` those of the history function, its ``theta``-Jacobian and its time
    derivative (called only with ``LAG_FUNCTION``); ``setting`` a :class:`Setting`, ``weights`` the structure's
    :class:`~pymc_pnode.chkrebtii.structure.Weights` and ``innovations`` the :class:`Innovations`.

    Returns ``(U, Umean, u, e, paug, status)``: the output (final joint draw, or the conditional
    mean if ``draw`` is false), the conditional mean ``m^N(t)`` given the interrogations, the grid
    states ``u_n`` (step-ahead draws), the whitened interrogations, the augmented parameter vector of
    every step, and ``status`` (0 success, 1 non-finite values: the solve diverged).
    """
    wv, cmap, grid, draw, lag_mode, tau_index, tau_fixed, forcing = setting
    lb, ginf, gn, sd, hh, lt = weights
    y0, theta, z, zt = innovations
    (nn, d, k, nl, naug, nt), h, tau, y0w, thw = _prologue(setting, weights, innovations)
    u = np.zeros((nn, d))
    mb = np.zeros((nn, d))  # step-ahead conditional means m^{n-1}(s_n)
    e = np.zeros((nn, d))
    paug = np.zeros((nn, naug))
    far = np.zeros(d)
    fbuf = np.zeros(d)
    lagbuf = np.zeros(d)
    out = np.zeros((nt, d))
    outm = np.zeros((nt, d))
    status = 0
    for n in range(nn):
        for i in range(d):
            c = cmap[i]
            w = wv[c]
            if n == 0:
                mean = y0[i]
            else:
                kf = n - w - 1
                if kf >= 0:
                    far[i] += ginf[c, kf] * e[kf, i]
                mean = y0[i] + far[i]
                for o in range(1, min(w, n) + 1):
                    mean += gn[c, n, o - 1] * e[n - o, i]
            mb[n, i] = mean
            u[n, i] = mean + (sd[i, n] * z[n - 1, i] if n > 0 else 0.0)
        for q in range(k):
            paug[n, q] = theta[q]
        if lag_mode != LAG_NONE:
            a = grid[n] - grid[0] - tau
            if a > 0.0:
                j, wt = _lag_position(a, h, n)
                for i in range(d):
                    paug[n, k + i] = (1.0 - wt) * mb[j, i] + wt * mb[j + 1, i]
            elif lag_mode == LAG_CONSTANT:
                for i in range(d):
                    paug[n, k + i] = y0[i]
            else:
                call(hist, y0w, grid[0] + a, thw, lagbuf)
                for i in range(d):
                    paug[n, k + i] = lagbuf[i]
        for q in range(forcing.shape[1]):
            paug[n, k + nl + q] = forcing[n, q]
        call(rhs, u[n], grid[n], paug[n], fbuf)
        for i in range(d):
            c = cmap[i]
            w = wv[c]
            if not (math.isfinite(fbuf[i]) and math.isfinite(u[n, i])):
                status = 1
            x = fbuf[i]
            for o in range(1, min(w, n) + 1):
                x -= lb[c, n, o] * e[n - o, i]
            e[n, i] = x / lb[c, n, 0]
        if status != 0:
            return np.zeros((nt, d)), np.zeros((nt, d)), u, e, paug, status
    for j in range(nt):
        for i in range(d):
            c = cmap[i]
            x = y0[i]
            for kk in range(nn):
                x += hh[c, j, kk] * e[kk, i]
            outm[j, i] = x
            if draw:
                for l in range(j + 1):
                    x += lt[i, j, l] * zt[l, i]
            out[j, i] = x
    for j in range(nt):
        for i in range(d):
            if not math.isfinite(out[j, i]):
                return np.zeros((nt, d)), np.zeros((nt, d)), u, e, paug, 1
    return out, outm, u, e, paug, status


@compile_on_first_use((*_ARGS, nb.types.Array(nb.float64, 2, "C", readonly=True)), **JIT)
def backward(rhs, jac_y, jac_p, hist, hist_jp, hist_dt, setting, weights, innovations, ubar):
    """Reverse-mode gradient of ``forward``'s output ``U`` contracted with ``ubar`` (shape ``(T, d)``).

    Returns the cotangents ``(y0, theta, z, zT, weights)`` (the last as
    :class:`~pymc_pnode.chkrebtii.structure.Weights`); all zero if the forward solve diverged.
    """
    wv, cmap, grid, draw, lag_mode, tau_index, tau_fixed, forcing = setting
    lb, ginf, gn, sd, hh, lt = weights
    y0, theta, z, zt = innovations
    (nn, d, k, nl, naug, nt), h, tau, y0w, thw = _prologue(setting, weights, innovations)
    y0b = np.zeros(d)
    thb = np.zeros(k)
    zb = np.zeros(z.shape)
    ztb = np.zeros(zt.shape)
    lbb = np.zeros(lb.shape)
    ginfb = np.zeros(ginf.shape)
    gnb = np.zeros(gn.shape)
    sdb = np.zeros(sd.shape)
    hhb = np.zeros(hh.shape)
    ltb = np.zeros(lt.shape)
    _, _, u, e, paug, status = forward(rhs, jac_y, jac_p, hist, hist_jp, hist_dt, setting, weights, innovations)
    if status != 0:
        return y0b, thb, zb, ztb, Weights(lbb, ginfb, gnb, sdb, hhb, ltb)
    mb = np.zeros((nn, d))
    for n in range(nn):
        for i in range(d):
            mb[n, i] = u[n, i] - (sd[i, n] * z[n - 1, i] if n > 0 else 0.0)
    eb = np.zeros((nn, d))
    mbb = np.zeros((nn, d))  # cotangent of the step-ahead means through the lag
    ubm = np.zeros((nn, d))  # cotangent of the mean part of u_n
    # Output U(t_j) = y0 + H e (+ LT zT).
    for j in range(nt):
        for i in range(d):
            c = cmap[i]
            g = ubar[j, i]
            y0b[i] += g
            for kk in range(nn):
                eb[kk, i] += hh[c, j, kk] * g
                hhb[c, j, kk] += g * e[kk, i]
            if draw:
                for l in range(j + 1):
                    ltb[i, j, l] += g * zt[l, i]
                    ztb[l, i] += lt[i, j, l] * g
    suffix = np.zeros(d)  # sum of ubm[m] over m >= n + w + 1
    fb = np.zeros(d)
    ub = np.zeros(d)
    jy = np.zeros((d, d))
    jp = np.zeros((d, naug))
    hjp = np.zeros((d, k))
    hdt = np.zeros(d)
    lagb = np.zeros(d)
    for n in range(nn - 1, -1, -1):
        for i in range(d):
            c = cmap[i]
            w = wv[c]
            if n + w + 1 <= nn - 1:
                suffix[i] += ubm[n + w + 1, i]
            eb[n, i] += ginf[c, n] * suffix[i]
            ginfb[c, n] += e[n, i] * suffix[i]
        # e_n = (f_n - sum_o Lb[n, o] e_{n-o}) / Lb[n, 0]
        for i in range(d):
            c = cmap[i]
            w = wv[c]
            piv = lb[c, n, 0]
            fb[i] = eb[n, i] / piv
            lbb[c, n, 0] -= fb[i] * e[n, i]
            for o in range(1, min(w, n) + 1):
                lbb[c, n, o] -= fb[i] * e[n - o, i]
                eb[n - o, i] -= fb[i] * lb[c, n, o]
        # f_n = f(u_n, s_n, paug_n)
        call(jac_y, u[n], grid[n], paug[n], jy)
        call(jac_p, u[n], grid[n], paug[n], jp)
        matvec_t(jy, fb, d, d, ub)
        for q in range(naug):
            acc = 0.0
            for i in range(d):
                acc += jp[i, q] * fb[i]
            if q < k:
                thb[q] += acc
            elif q < k + nl:
                lagb[q - k] = acc
        if lag_mode != LAG_NONE:
            a = grid[n] - grid[0] - tau
            if a > 0.0:
                # lag = (1 - wt) m_j + wt m_{j+1}, wt = (s_n - tau) / h - j
                jl, wt = _lag_position(a, h, n)
                for i in range(d):
                    mbb[jl, i] += (1.0 - wt) * lagb[i]
                    mbb[jl + 1, i] += wt * lagb[i]
                    if tau_index >= 0:
                        thb[tau_index] -= lagb[i] * (mb[jl + 1, i] - mb[jl, i]) / h
            elif lag_mode == LAG_CONSTANT:
                for i in range(d):
                    y0b[i] += lagb[i]
            else:
                call(hist_jp, y0w, grid[0] + a, thw, hjp)
                call(hist_dt, y0w, grid[0] + a, thw, hdt)
                for i in range(d):
                    for q in range(k):
                        thb[q] += hjp[i, q] * lagb[i]
                    if tau_index >= 0:
                        thb[tau_index] -= hdt[i] * lagb[i]
        # u_n = mean_n + sd[n] z_{n-1}; mean_n = y0 + far + near
        for i in range(d):
            c = cmap[i]
            w = wv[c]
            if n == 0:
                y0b[i] += ub[i] + mbb[0, i]
                continue
            zb[n - 1, i] += sd[i, n] * ub[i]
            sdb[i, n] += z[n - 1, i] * ub[i]
            g = ub[i] + mbb[n, i]
            ubm[n, i] = g
            y0b[i] += g
            for o in range(1, min(w, n) + 1):
                eb[n - o, i] += gn[c, n, o - 1] * g
                gnb[c, n, o - 1] += g * e[n - o, i]
    return y0b, thb, zb, ztb, Weights(lbb, ginfb, gnb, sdb, hhb, ltb)
