r"""Chkrebtii et al. (2016), §5.3: forced Navier–Stokes on a torus, reduced to a Fourier–Galerkin system.

Used by ``chkrebtii_navier_stokes.ipynb`` and ``tests/test_case_study_navier_stokes.py``; notes 004 §6.5.

The paper (eq. 18) solves the incompressible Navier–Stokes equations on the flat torus
:math:`[0, 2\pi)^2` with viscosity :math:`\theta = 10^{-4}` by a pseudo-spectral projection on a 128 × 128 grid
(16,384 stiff ODEs) and shows four realisations of Algorithm 1's probabilistic solution at
t = 0.2, 0.4, 0.6, 0.8 (Figure 7). The initial field :math:`u^*`, the solver's grid and hyperparameters are not
given, and the printed forcing :math:`g = 5\cdot10^{-3}\cos[(\tfrac12, \tfrac12)\cdot x]` is not periodic on the
domain (the notes flag both). Our reduction, with each choice stated:

* the vorticity form :math:`\omega_t + u\cdot\nabla\omega = \theta\Delta\omega + F`,
  :math:`u = (\psi_{x_2}, -\psi_{x_1})`, :math:`-\Delta\psi = \omega` (the pressure and the incompressibility and
  zero-mean constraints of eq. 18 are then exact), truncated to the Fourier modes
  :math:`k \in \{-K..K\}^2 \setminus \{0\}` (a Galerkin projection, exact in space for the retained modes:
  no aliasing). In Fourier coefficients
  :math:`\dot{\hat\omega}_k = -\sum_{p + q = k} \frac{p \times q}{|p|^2} \hat\omega_p \hat\omega_q
  - \theta |k|^2 \hat\omega_k + \hat F_k` with :math:`p \times q = p_1 q_2 - p_2 q_1`. The state holds the real and
  imaginary parts of :math:`\hat\omega_k` for the half of the modes with :math:`k_1 > 0` or
  :math:`k_1 = 0 < k_2` (the others are their complex conjugates): ``2 K (2 K + 1)`` real ODEs.
  Without viscosity and forcing this system conserves energy :math:`\sum |\hat\omega_k|^2 / |k|^2` and
  enstrophy :math:`\sum |\hat\omega_k|^2` exactly (the tests check both);
* the forcing: the periodic :math:`g = (5\cdot10^{-3}\cos(x_1 + x_2), 0)`, whose curl gives
  :math:`F = 5\cdot10^{-3}\sin(x_1 + x_2)` (the printed amplitude; a forcing acting equally on both velocity
  components would be a gradient, absorbed by the pressure);
* the initial vorticity: a random field with independent Gaussian coefficients of standard deviation
  :math:`\propto |k|^{-2}`, scaled to a root-mean-square vorticity of ``OMEGA_RMS`` = 5, so that the flow turns
  over within the figure's time span (an eddy turnover time :math:`\approx 1/\omega_{\rm rms} = 0.2`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import pymc_pnode as pn

VISCOSITY = 1.0e-4  # the paper's θ
FORCING = 5.0e-3  # the printed amplitude of g
T_SPAN = (0.0, 0.8)
TIMES = np.array([0.2, 0.4, 0.6, 0.8])  # Figure 7's columns
OMEGA_RMS = 5.0


@dataclass(frozen=True)
class Modes:
    """The retained Fourier modes of a truncation ``K``: ``half[j]`` is the wavenumber of state pair ``j``
    (states ``2 j``, ``2 j + 1``: real and imaginary part), ``index[k]`` the pair of ``k`` or of ``-k``
    and ``sign[k]`` +1 for a stored mode, −1 for a conjugate one."""

    K: int
    half: np.ndarray  # (n_pairs, 2) wavenumbers
    index: dict
    sign: dict

    @property
    def n_states(self) -> int:
        return 2 * len(self.half)


def modes(K: int) -> Modes:
    """The modes ``{-K..K}² \\ {0}``, half of them stored (``k1 > 0`` or ``k1 = 0 < k2``)."""
    if int(K) != K or K < 1:
        raise ValueError(f"K must be a positive integer, got {K!r}")
    half = [(k1, k2) for k1 in range(0, K + 1) for k2 in range(-K, K + 1) if k1 > 0 or k2 > 0]
    index, sign = {}, {}
    for j, (k1, k2) in enumerate(half):
        index[(k1, k2)], sign[(k1, k2)] = j, 1
        index[(-k1, -k2)], sign[(-k1, -k2)] = j, -1
    return Modes(int(K), np.array(half, dtype=int), index, sign)


def triads(m: Modes) -> list[list[tuple[float, tuple[int, int], tuple[int, int]]]]:
    """For each stored mode ``k``: the terms ``(c, p, q)`` of ``-Σ_{p+q=k} (p×q)/|p|² ω̂_p ω̂_q``, each unordered
    pair once with the symmetrised coefficient ``c = -(p×q) (1/|p|² - 1/|q|²)`` (zero terms dropped, among them
    ``p = q``, where ``p×q = 0``)."""
    out = []
    for k in map(tuple, m.half):
        terms = []
        for p in m.index:
            q = (k[0] - p[0], k[1] - p[1])
            if q not in m.index or p > q:  # each unordered pair once
                continue
            cross = p[0] * q[1] - p[1] * q[0]
            coef = -cross * (1.0 / (p[0] ** 2 + p[1] ** 2) - 1.0 / (q[0] ** 2 + q[1] ** 2))
            if coef != 0.0:
                terms.append((coef, p, q))
        out.append(terms)
    return out


def forcing_coefficients(m: Modes, amplitude: float = FORCING) -> np.ndarray:
    """State-shaped :math:`\\hat F`: ``amplitude · sin(x1 + x2)`` has ``F̂_(1,1) = -i amplitude / 2``."""
    f = np.zeros(m.n_states)
    j = m.index[(1, 1)]
    f[2 * j + 1] = -0.5 * amplitude
    return f


def navier_stokes_ode(K: int) -> pn.ODE:
    """The Galerkin system of truncation ``K`` as a :class:`pymc_pnode.ODE` with one parameter, the viscosity."""
    m = modes(K)
    terms = triads(m)
    forcing = forcing_coefficients(m)

    def field(y, t, p):
        def coef(k):  # (re, im) of ω̂_k
            j, s = m.index[k], m.sign[k]
            return y[2 * j], s * y[2 * j + 1]

        out = []
        for j, k in enumerate(map(tuple, m.half)):
            re_sum, im_sum = [], []
            for c, a, b in terms[j]:
                ar, ai = coef(a)
                br, bi = coef(b)
                re_sum.append(c * (ar * br - ai * bi))
                im_sum.append(c * (ar * bi + ai * br))
            k2 = float(k[0] ** 2 + k[1] ** 2)
            re = sum(re_sum) - p[0] * k2 * y[2 * j] + forcing[2 * j]
            im = sum(im_sum) - p[0] * k2 * y[2 * j + 1] + forcing[2 * j + 1]
            out += [re, im]
        return out

    return pn.ODE(field, n_states=m.n_states, n_theta=1)


def initial_state(K: int, seed: int = 2016, omega_rms: float = OMEGA_RMS) -> np.ndarray:
    """Random initial vorticity: coefficients with standard deviation ∝ ``|k|⁻²``, scaled to an r.m.s.
    vorticity ``omega_rms`` over the torus."""
    m = modes(K)
    rng = np.random.default_rng(seed)
    k2 = (m.half**2).sum(axis=1).astype(float)
    y = (rng.standard_normal((len(m.half), 2)) / k2[:, None]).ravel()
    return y * (omega_rms / rms_vorticity(y))


def rms_vorticity(y: np.ndarray) -> np.ndarray:
    """Root mean square of ω over the torus (Parseval: ``2 Σ_stored |ω̂_k|²``), over the last axis."""
    return np.sqrt(2.0 * np.sum(np.asarray(y) ** 2, axis=-1))


def vorticity_field(y: np.ndarray, K: int, n_grid: int = 64) -> np.ndarray:
    """ω on an ``n_grid × n_grid`` grid of ``[0, 2π)²`` (rows: x2, columns: x1) from state(s) ``y``
    (shape ``(..., n_states)``): ``ω = Σ_stored 2 (a_k cos(k·x) - b_k sin(k·x))``."""
    m = modes(K)
    x = np.arange(n_grid) * (2 * np.pi / n_grid)
    x1, x2 = np.meshgrid(x, x)
    phase = m.half[:, 0, None, None] * x1 + m.half[:, 1, None, None] * x2  # (pairs, n, n)
    y = np.asarray(y)
    a, b = y[..., 0::2], y[..., 1::2]
    return 2.0 * (np.tensordot(a, np.cos(phase), axes=(-1, 0)) - np.tensordot(b, np.sin(phase), axes=(-1, 0)))


def pseudo_spectral_rhs(y: np.ndarray, K: int, viscosity: float, n_grid: int = 64) -> np.ndarray:
    """The same vector field computed independently: ω, ψ and u on a grid by FFT, ``-u·∇ω`` in physical space and
    projected back onto the retained modes (the grid ``n_grid ≥ 3 K + 1`` resolves the product exactly)."""
    m = modes(K)
    n = n_grid
    w_hat = np.zeros((n, n), complex)  # indexed [k2, k1], numpy's FFT layout
    for j, (k1, k2) in enumerate(m.half):
        w_hat[k2 % n, k1 % n] = y[2 * j] + 1j * y[2 * j + 1]
        w_hat[-k2 % n, -k1 % n] = y[2 * j] - 1j * y[2 * j + 1]
    kk = np.fft.fftfreq(n, 1.0 / n)
    k1g, k2g = np.meshgrid(kk, kk)
    ksq = k1g**2 + k2g**2
    psi_hat = np.where(ksq > 0, w_hat / np.where(ksq > 0, ksq, 1.0), 0.0)
    to_grid = lambda f_hat: np.real(np.fft.ifft2(f_hat)) * n * n  # noqa: E731 - coefficients → values
    u1, u2 = to_grid(1j * k2g * psi_hat), to_grid(-1j * k1g * psi_hat)
    wx, wy = to_grid(1j * k1g * w_hat), to_grid(1j * k2g * w_hat)
    adv_hat = np.fft.fft2(-(u1 * wx + u2 * wy)) / (n * n)
    out = np.empty(m.n_states)
    forcing = forcing_coefficients(m)
    for j, (k1, k2) in enumerate(m.half):
        value = adv_hat[k2 % n, k1 % n] - viscosity * (k1**2 + k2**2) * w_hat[k2 % n, k1 % n]
        out[2 * j], out[2 * j + 1] = value.real + forcing[2 * j], value.imag + forcing[2 * j + 1]
    return out
