"""The Fenrir data update: condition the ODE-filter posterior on a noisy observation, and its adjoint.

``data[i] = C y(t_i) + ε``, ``ε ~ N(0, diag σ²)``, with missing (NaN) components skipped (Tronarp, Bosch &
Hennig, 2022, eq. 14). The value is one QR of a stacked square root and returns the log-density of the
observation (the prediction-error decomposition); the adjoint is the general Gaussian update adjoint
:func:`~pymc_pnode.filtering.update.update_adjoint` on covariances.
"""

from __future__ import annotations

import math
from collections import namedtuple

import numba as nb
import numpy as np

from pymc_pnode._jit import INLINE_JIT
from pymc_pnode.filtering.update import (
    Cotangent,
    GaussianObservation,
    UpdateAdjointOut,
    UpdateAdjointWork,
    condition_stack,
    update_adjoint,
)

_LOG_2PI = math.log(2.0 * math.pi)

# Rows ``data[i] = cmat @ y(t_i) + N(0, diag sigma²)``; row i observes components ``seen[i, :n_seen[i]]``;
# component c's noise scale is noise parameter ``sigma_dir[c]``.
ObservationModel = namedtuple("ObservationModel", ["data", "cmat", "sigma", "sigma_dir", "seen", "n_seen"])
DataUpdateWork = namedtuple("DataUpdateWork", ["mm", "wv", "resid"])


@nb.njit(**INLINE_JIT)
def observation_model(data: np.ndarray, cmat: np.ndarray, sigma: np.ndarray, sigma_dir: np.ndarray) -> ObservationModel:
    """The :data:`ObservationModel` of ``data`` (NaN entries are missing)."""
    n_obs, m = data.shape
    n_seen = np.zeros(n_obs, dtype=np.int64)
    seen = np.zeros((n_obs, m), dtype=np.int64)
    for i in range(n_obs):
        for c in range(m):
            if not math.isnan(data[i, c]):
                seen[i, n_seen[i]] = c
                n_seen[i] += 1
    return ObservationModel(data, cmat, sigma, sigma_dir, seen, n_seen)


@nb.njit(**INLINE_JIT)
def state_observation_model(
    data: np.ndarray, cmat: np.ndarray, sigma: np.ndarray, sigma_dir: np.ndarray, i: int
) -> tuple[ObservationModel, int]:
    """The observation of state ``i`` alone: the rows of ``cmat`` that select it (each row selects one state, a
    block filter's observation), as an :data:`ObservationModel` of one state, and their number."""
    n_obs, m = data.shape
    rows = np.empty(m, dtype=np.int64)
    m_i = 0
    for c in range(m):
        if cmat[c, i] != 0.0:
            rows[m_i] = c
            m_i += 1
    data_i, cmat_i = np.empty((n_obs, m_i)), np.empty((m_i, 1))
    sigma_i, dir_i = np.empty(m_i), np.empty(m_i, dtype=np.int64)
    for a in range(m_i):
        c = rows[a]
        cmat_i[a, 0] = cmat[c, i]
        sigma_i[a] = sigma[c]
        dir_i[a] = sigma_dir[c]
        for j in range(n_obs):
            data_i[j, a] = data[j, c]
    return observation_model(data_i, cmat_i, sigma_i, dir_i), m_i


@nb.njit(**INLINE_JIT)
def data_update_work(dd: int, m: int) -> DataUpdateWork:
    """Work arrays of :func:`data_update_sqrt` for states of length ``dd`` and ``m`` observed components."""
    return DataUpdateWork(np.empty((m + dd + 1, dd + m)), np.empty(max(m, 1)), np.empty(m))


@nb.njit(**INLINE_JIT)
def _half_logdet_upper(m, n):
    s = 0.0
    for k in range(n):
        s += math.log(abs(m[k, k]))
    return s


@nb.njit(inline="always", **INLINE_JIT)
def data_update_sqrt(
    model: ObservationModel, i: int, mean: np.ndarray, root: np.ndarray, work: DataUpdateWork
) -> float:
    """Condition ``N(mean, rootᵀ root)`` (in place) on data row ``i``; returns the log-density of the observation."""
    data, cmat, sigma, _, seen, n_seen = model
    mm, wv, resid = work
    dd = mean.shape[0]
    d = cmat.shape[1]
    idx = seen[i]
    mo = n_seen[i]
    yrow = data[i]
    # mm holds the transposed stack [[root Cᵀ, root], [diag σ, 0]]: mm[j] is its column j
    mm[:, :] = 0.0
    for r in range(mo):
        s = -yrow[idx[r]]
        for c in range(d):
            s += cmat[idx[r], c] * mean[c]
        resid[r] = s
    for r in range(mo):
        col = mm[r]
        for row in range(dd):
            s = 0.0
            for c in range(d):
                s += root[row, c] * cmat[idx[r], c]
            col[row] = s
        col[dd + r] = sigma[idx[r]]
    for c in range(dd):
        col = mm[mo + c]
        for row in range(dd):
            col[row] = root[row, c]
    quad = condition_stack(mm, dd + mo, mo, resid, wv, mean, mean, root)
    return -0.5 * quad - _half_logdet_upper(mm, mo) - 0.5 * mo * _LOG_2PI


@nb.njit(inline="always", **INLINE_JIT)
def data_update_adjoint(
    model: ObservationModel, i: int, m_pre: np.ndarray, sig_pre: np.ndarray, weight: float, bar: Cotangent,
    obs: GaussianObservation, out: UpdateAdjointOut, work: UpdateAdjointWork, grad_sigma: np.ndarray,
) -> bool:
    """Adjoint of ``weight ·`` :func:`data_update_sqrt` of row ``i`` at the prior ``N(m_pre, sig_pre)``.

    ``bar`` goes from the adjoints after the update to those before it; the noise scales' adjoints are
    added to ``grad_sigma``. ``obs`` is scratch for the observation's rows. False if ``S`` is singular.
    """
    data, cmat, sigma, sigma_dir, seen, n_seen = model
    hm, noise_var, resid, _ = obs
    sdiag = out.sdiag
    d = cmat.shape[1]
    dd = m_pre.shape[0]
    mo = n_seen[i]
    for r in range(mo):
        c_obs = seen[i, r]
        for b in range(dd):
            hm[r, b] = cmat[c_obs, b] if b < d else 0.0
        noise_var[r] = sigma[c_obs] * sigma[c_obs]
        v = -data[i, c_obs]
        for c in range(d):
            v += cmat[c_obs, c] * m_pre[c]
        resid[r] = v
    if not update_adjoint(GaussianObservation(hm, noise_var, resid, mo), sig_pre, sig_pre, m_pre,
                          (weight, weight), bar, False, out, work):
        return False
    for r in range(mo):
        c_obs = seen[i, r]
        grad_sigma[sigma_dir[c_obs]] += 2.0 * sigma[c_obs] * sdiag[r]
    return True
