r"""Fixed-step solvers (Euler, Heun, RK4, Störmer–Verlet) with exact discrete adjoints.

The solvers march from ``ode.t0`` through every observation time with a fixed step, and return the
states at the observation times. Gradients are those of the *discrete* map (reverse-mode
differentiation of the scheme itself, i.e. the symplectic-partner adjoint of Sanz-Serna 2016; notes
000 §3.4), so an optimiser or NUTS sees a gradient consistent with the number it computes.

Two numba kernels serve every ODE and every method (the vector field and its Jacobians arrive as
addresses of C callbacks, see :mod:`pymc_pnode._callbacks`): :func:`rk_forward` and :func:`rk_backward`.
:class:`FixedStepSolver` validates the inputs and lays out the step grid; :func:`rk_solve` wraps it in
PyTensor Ops (forward and adjoint), with ``numba_funcify`` registrations for ``mode="NUMBA"``.

Step alignment
--------------
Observation times are always hit exactly. With ``alignment="exact"`` (default) every gap between
consecutive times (including ``times[0] - ode.t0``) must be an integer multiple of ``step``: the
solver is then a constant-step scheme, as in Matsuda & Miyatake, and a ``step`` larger than an
observation gap is a ``ValueError``. With ``alignment="shrink"`` each gap is split into
``ceil(gap / step)`` equal sub-steps, so ``step`` is an upper bound on the step size.

Störmer–Verlet
--------------
For a separable second-order system the state is ``y = [q, v]`` with the first half positions and
the second half velocities, and ``func`` returns ``[dq/dt, dv/dt]`` where ``dq/dt`` depends on ``v``
(and ``t``, ``p``) only and ``dv/dt`` depends on ``q`` (and ``t``, ``p``) only, e.g. ``[v, a(q)]``.
One step is drift–kick–drift: ``q += h/2 g(v)``, ``v += h a(q)``, ``q += h/2 g(v)``.
"""

from __future__ import annotations

import math
from collections import namedtuple

import numba as nb
import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType, grad_not_implemented
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

from pymc_pnode._callbacks import FN, call
from pymc_pnode._jit import JIT, compile_on_first_use, readonly, register_numba
from pymc_pnode.filtering.linalg import all_finite
from pymc_pnode.validation import as_positive_float, validate_times

__all__ = [
    "METHODS",
    "FixedStepSolver",
    "rk_backward",
    "rk_forward",
    "rk_perturbed_forward",
    "rk_solve",
]


_SCHEME_RK = 0
_SCHEME_SV = 1

# The vector field with its derivatives (callback addresses), as the adjoint steps need it.
RKField = namedtuple("RKField", "rhs jac_y jac_p theta")
# An explicit Runge–Kutta method's Butcher tableau.
Tableau = namedtuple("Tableau", "a b c")
# The fixed-step grid from ``t0`` through the output ``times``: ``nsub[k]`` steps of ``hsub[k]`` before ``times[k]``.
StepGrid = namedtuple("StepGrid", "t0 times nsub hsub")


def _tableau(a, b, c):
    return (
        np.ascontiguousarray(a, dtype=np.float64),
        np.ascontiguousarray(b, dtype=np.float64),
        np.ascontiguousarray(c, dtype=np.float64),
    )


# Butcher tableaux of the explicit Runge–Kutta methods: (A, b, c, order).
_RK_TABLEAUX = {
    "euler": (*_tableau([[0.0]], [1.0], [0.0]), 1),
    "heun": (*_tableau([[0.0, 0.0], [1.0, 0.0]], [0.5, 0.5], [0.0, 1.0]), 2),
    "midpoint": (*_tableau([[0.0, 0.0], [0.5, 0.0]], [0.0, 1.0], [0.0, 0.5]), 2),
    "rk4": (
        *_tableau(
            [[0.0, 0.0, 0.0, 0.0], [0.5, 0.0, 0.0, 0.0], [0.0, 0.5, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]],
            [1.0 / 6.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 6.0],
            [0.0, 0.5, 0.5, 1.0],
        ),
        4,
    ),
}
# Störmer–Verlet does not use a tableau; the kernel receives a dummy one.
_SV_DUMMY = _tableau([[0.0]], [1.0], [0.0])

#: Method names and their orders of convergence.
METHODS: dict[str, int] = {
    **{name: tab[3] for name, tab in _RK_TABLEAUX.items()},
    "stormer_verlet": 2,
}


# ----------------------------------------------------------------------------------- kernels
# Every call of the vector field goes through the dedicated buffers ``xb`` (argument) and ``fb``
# (result): through the first-class functions the kernels took before the C callbacks, array *views*
# (``xs[i]``) cost ~5x more per call than whole 1-d buffers (measured). The helpers
# are inlined: a real call passing a dozen arrays pays reference counting on each of them.
@nb.njit(inline="always", **JIT)
def _rk_stages(rhs, p, x, t, h, tableau, work):
    """Stage points ``work.xs[i]`` and slopes ``work.ks[i] = f(xs[i], t + c_i h)`` of one explicit RK step."""
    a, c = tableau.a, tableau.c
    xs, ks, xb, fb = work.xs, work.ks, work.xb, work.fb
    s = c.shape[0]
    d = x.shape[0]
    for i in range(s):
        for m in range(d):
            acc = x[m]
            for j in range(i):
                if a[i, j] != 0.0:
                    acc += h * a[i, j] * ks[j, m]
            xs[i, m] = acc
            xb[m] = acc
        call(rhs, xb, t + c[i] * h, p, fb)
        for m in range(d):
            ks[i, m] = fb[m]


@nb.njit(inline="always", **JIT)
def _rk_combine(x, h, b, ks, out):
    """``out = x + h Σ_i b_i k_i``, the end of an explicit RK step after :func:`_rk_stages` (``out`` may be ``x``).

    ``b`` and ``ks`` come unpacked from the caller: reading them out of their named tuples at every step
    costs a reference count per read (numba), measurable on cheap steps.
    """
    for j in range(x.shape[0]):
        acc = x[j]
        for st in range(b.shape[0]):
            acc += h * b[st] * ks[st, j]
        out[j] = acc


@nb.njit(inline="always", **JIT)
def _sv_stages(rhs, p, x, t, h, work):
    """The three evaluation points ``ys = work.xs`` and fields ``fs = work.ks`` of one drift–kick–drift step."""
    ys, fs, xb, fb = work.xs, work.ks, work.xb, work.fb
    d = x.shape[0]
    m = d // 2
    for i in range(d):
        ys[0, i] = x[i]
        xb[i] = x[i]
    call(rhs, xb, t, p, fb)
    for i in range(d):
        fs[0, i] = fb[i]
    for i in range(m):
        ys[1, i] = x[i] + 0.5 * h * fs[0, i]  # q_{n+1/2}
        ys[1, m + i] = x[m + i]
    for i in range(d):
        xb[i] = ys[1, i]
    call(rhs, xb, t + 0.5 * h, p, fb)
    for i in range(d):
        fs[1, i] = fb[i]
    for i in range(m):
        ys[2, i] = ys[1, i]
        ys[2, m + i] = x[m + i] + h * fs[1, m + i]  # v_{n+1}
    for i in range(d):
        xb[i] = ys[2, i]
    call(rhs, xb, t + h, p, fb)
    for i in range(d):
        fs[2, i] = fb[i]


@nb.njit(inline="always", **JIT)
def _stage_vjp(jac_y, jac_p, p, st, t, fbar, gp, work):
    """``work.xbar[st] = (df/dy)^T fbar`` and ``gp += (df/dp)^T fbar`` at the stage point ``work.xs[st]``."""
    ys, ybar, jy, jp, xb = work.xs, work.xbar, work.jy, work.jp, work.xb
    d = ys.shape[1]
    for i in range(d):
        xb[i] = ys[st, i]
    call(jac_y, xb, t, p, jy)
    for j in range(d):
        acc = 0.0
        for i in range(d):
            acc += jy[i, j] * fbar[i]
        ybar[st, j] = acc
    nth = gp.shape[0]
    if nth > 0:
        call(jac_p, xb, t, p, jp)
        for j in range(nth):
            acc = 0.0
            for i in range(d):
                acc += jp[i, j] * fbar[i]
            gp[j] += acc


#: Work buffers of :func:`rk_step_adjoint` for ``s`` stages, ``d`` states and ``n_theta`` parameters.
RKAdjointWork = namedtuple("RKAdjointWork", "xs ks xbar kbar jy jp xb fb")


@nb.njit(**JIT)
def rk_adjoint_work(s: int, d: int, n_theta: int) -> RKAdjointWork:
    return RKAdjointWork(
        np.empty((s, d)), np.empty((s, d)), np.zeros((s, d)), np.empty(d), np.empty((d, d)),
        np.empty((d, n_theta)), np.empty(d), np.empty(d),
    )


@nb.njit(inline="always", **JIT)
def rk_step_adjoint(field, x, t, h, tableau, lam, gp, work):
    """Reverse one explicit RK step from ``x`` at ``t`` of the :data:`RKField` ``field``.

    ``lam <- (dx_{n+1}/dx_n)^T lam`` and ``gp += (dx_{n+1}/dp)^T lam``.

    The stages are recomputed from ``x`` (:data:`Tableau` ``tableau``); ``work`` is an
    :data:`RKAdjointWork`.
    """
    rhs, jac_y, jac_p, p = field
    a, b, c = tableau
    s = c.shape[0]
    d = x.shape[0]
    xbar, kbar = work.xbar, work.kbar
    _rk_stages(rhs, p, x, t, h, tableau, work)
    # Reverse sweep over the stages: k_i feeds the update (weight b_i) and the later stage points
    # (weights a_mi).
    for st in range(s - 1, -1, -1):
        for j in range(d):
            acc = h * b[st] * lam[j]
            for mm in range(st + 1, s):
                if a[mm, st] != 0.0:
                    acc += h * a[mm, st] * xbar[mm, j]
            kbar[j] = acc
        _stage_vjp(jac_y, jac_p, p, st, t + c[st] * h, kbar, gp, work)
    for st in range(s):
        for j in range(d):
            lam[j] += xbar[st, j]


# Inputs are typed read-only (PyTensor's numba backend passes constants as read-only arrays; writable
# arrays convert to read-only types), except the parameters, which go on to the generated functions.
_W1 = nb.float64[::1]
_R1 = nb.types.Array(nb.float64, 1, "C", readonly=True)
_R2 = nb.types.Array(nb.float64, 2, "C", readonly=True)
_RI1 = nb.types.Array(nb.int64, 1, "C", readonly=True)

_GRID_T = nb.types.NamedTuple([nb.float64, _R1, _RI1, _R1], StepGrid)
_TABLEAU_T = nb.types.NamedTuple([_R2, _R1, _R1], Tableau)
_FORWARD_SIG = (FN, _W1, _R1, _GRID_T, nb.int64, _TABLEAU_T)


@compile_on_first_use(_FORWARD_SIG, **JIT)
def rk_forward(rhs, p, y0, grid, scheme, tableau):
    """March from ``grid.t0`` through ``grid.times`` with ``nsub[k]`` steps of size ``hsub[k]`` per gap.

    Returns ``(ys, traj, ok)``: states at ``times`` (``(K, d)``), at every step (``(N + 1, d)``)
    and whether every state stayed finite. After a non-finite state the march stops and the
    remaining rows are NaN.
    """
    t0, times, nsub, hsub = grid
    b, c = tableau.b, tableau.c
    d = y0.shape[0]
    n_obs = times.shape[0]
    n_total = 0
    for k in range(n_obs):
        n_total += nsub[k]
    ys = np.full((n_obs, d), np.nan)
    traj = np.full((n_total + 1, d), np.nan)
    x = np.empty(d)
    for i in range(d):
        x[i] = y0[i]
        traj[0, i] = y0[i]
    s = c.shape[0] if scheme == _SCHEME_RK else 3
    work = rk_adjoint_work(s, d, 0)
    xs, ks = work.xs, work.ks
    m = d // 2
    n = 0
    t_start = t0
    for k in range(n_obs):
        h = hsub[k]
        for i in range(nsub[k]):
            t = t_start + i * h
            if scheme == _SCHEME_RK:
                # (the loop of _rk_combine, written out: called here it made this solve 20 % slower, measured)
                _rk_stages(rhs, p, x, t, h, tableau, work)
                for j in range(d):
                    acc = x[j]
                    for st in range(s):
                        acc += h * b[st] * ks[st, j]
                    x[j] = acc
            else:
                _sv_stages(rhs, p, x, t, h, work)
                for j in range(m):
                    x[j] = xs[2, j] + 0.5 * h * ks[2, j]
                    x[m + j] = xs[2, m + j]
            n += 1
            finite = True
            for j in range(d):
                traj[n, j] = x[j]
                finite = finite and math.isfinite(x[j])
            if not finite:
                return ys, traj, False
        for j in range(d):
            ys[k, j] = x[j]
        t_start = times[k]
    return ys, traj, True


_R3 = nb.types.Array(nb.float64, 3, "C", readonly=True)
_PERTURBED_SIG = (FN, _W1, _R1, _GRID_T, _TABLEAU_T, _R3)


@compile_on_first_use(_PERTURBED_SIG, **JIT)
def rk_perturbed_forward(rhs, p, y0, grid, tableau, noise):
    """Randomised solves of an explicit RK method (Conrad, Girolami, Särkkä, Stuart & Zygalakis, 2017):
    ``x_{n+1} = Ψ_h(x_n) + e_n ⊙ ξ_n`` with ``ξ_n`` the standard normal draws ``noise[s, n]`` and ``e_n`` the
    step's local error estimate by step doubling, ``|Ψ_h(x_n) − Ψ_{h/2}(Ψ_{h/2}(x_n))|`` per component.

    Returns the states at ``grid.times`` of every sample, ``(S, K, d)`` (NaN after a divergence).
    """
    t0, times, nsub, hsub = grid
    n_samples = noise.shape[0]
    d = y0.shape[0]
    n_obs = times.shape[0]
    ys = np.full((n_samples, n_obs, d), np.nan)
    work = rk_adjoint_work(tableau.c.shape[0], d, 0)
    b, ks = tableau.b, work.ks
    x, full, half = np.empty(d), np.empty(d), np.empty(d)
    for smp in range(n_samples):
        x[:] = y0
        n = 0
        t_start = t0
        finite = True
        for k in range(n_obs):
            h = hsub[k]
            for i in range(nsub[k]):
                t = t_start + i * h
                _rk_stages(rhs, p, x, t, h, tableau, work)
                _rk_combine(x, h, b, ks, full)
                _rk_stages(rhs, p, x, t, 0.5 * h, tableau, work)
                _rk_combine(x, 0.5 * h, b, ks, half)
                _rk_stages(rhs, p, half, t + 0.5 * h, 0.5 * h, tableau, work)
                _rk_combine(half, 0.5 * h, b, ks, half)
                for j in range(d):
                    x[j] = full[j] + abs(full[j] - half[j]) * noise[smp, n, j]
                n += 1
            finite = all_finite(x)
            if not finite:
                break
            ys[smp, k] = x
            t_start = times[k]
    return ys


_BACKWARD_SIG = (FN, FN, FN, _W1, _R2, _GRID_T, nb.int64, _TABLEAU_T, _R2)


@compile_on_first_use(_BACKWARD_SIG, **JIT)
def rk_backward(rhs, jac_y, jac_p, p, traj, grid, scheme, tableau, g_obs):
    """Discrete adjoint: ``(dL/dy0, dL/dp)`` given ``g_obs = dL/dys`` (``(K, d)``).

    ``traj`` is the stored trajectory of :func:`rk_forward`; stage values are recomputed from it.
    A non-finite trajectory or cotangent gives zero gradients (the caller's value is then non-finite
    and the gradient is not used).
    """
    t0, times, nsub, hsub = grid
    d = traj.shape[1]
    nth = p.shape[0]
    n_obs = times.shape[0]
    lam = np.zeros(d)
    gp = np.zeros(nth)
    if not (all_finite(traj) and all_finite(g_obs)):
        return lam, gp
    s = tableau.c.shape[0] if scheme == _SCHEME_RK else 3
    work = rk_adjoint_work(s, d, nth)
    xbar, kbar = work.xbar, work.kbar
    field = RKField(rhs, jac_y, jac_p, p)
    x = np.empty(d)
    m = d // 2
    n = traj.shape[0] - 1
    for i in range(d):
        lam[i] = g_obs[n_obs - 1, i]
    for k in range(n_obs - 1, -1, -1):
        t_start = times[k - 1] if k > 0 else t0
        h = hsub[k]
        for i in range(nsub[k] - 1, -1, -1):
            n -= 1
            t = t_start + i * h
            for j in range(d):
                x[j] = traj[n, j]
            if scheme == _SCHEME_RK:
                rk_step_adjoint(field, x, t, h, tableau, lam, gp, work)
            else:
                _sv_stages(rhs, p, x, t, h, work)
                # Drift 2: q_{n+1} = q_half + h/2 g(v_{n+1}), evaluated at ys[2].
                for j in range(d):
                    kbar[j] = 0.5 * h * lam[j] if j < m else 0.0
                _stage_vjp(jac_y, jac_p, p, 2, t + h, kbar, gp, work)
                for j in range(d):
                    lam[j] += xbar[2, j]  # lam = (q_half bar, v_{n+1} bar)
                # Kick: v_{n+1} = v_n + h a(q_half), evaluated at ys[1].
                for j in range(d):
                    kbar[j] = h * lam[j] if j >= m else 0.0
                _stage_vjp(jac_y, jac_p, p, 1, t + 0.5 * h, kbar, gp, work)
                for j in range(d):
                    lam[j] += xbar[1, j]  # lam = (q_half bar, v_n bar)
                # Drift 1: q_half = q_n + h/2 g(v_n), evaluated at ys[0].
                for j in range(d):
                    kbar[j] = 0.5 * h * lam[j] if j < m else 0.0
                _stage_vjp(jac_y, jac_p, p, 0, t, kbar, gp, work)
                for j in range(d):
                    lam[j] += xbar[0, j]
        if k > 0:
            for j in range(d):
                lam[j] += g_obs[k - 1, j]
    return lam, gp


# ----------------------------------------------------------------------------------- step grid
def _step_grid(t0: float, times: np.ndarray, step: float, alignment: str):
    """Number of sub-steps and step size for each gap ``times[k] - times[k-1]`` (``times[-1] = t0``)."""
    starts = np.concatenate([[t0], times[:-1]])
    gaps = times - starts
    nsub = np.zeros(times.size, dtype=np.int64)
    hsub = np.zeros(times.size, dtype=np.float64)
    for k, gap in enumerate(gaps):
        if gap == 0.0:  # only times[0] == t0
            continue
        ratio = gap / step
        if alignment == "exact":
            n = int(round(ratio))
            if ratio < 1.0 - 1e-9:
                raise ValueError(
                    f"step={step} is larger than the observation spacing {gap} "
                    f"(between t={starts[k]} and t={times[k]}); alignment='exact' requires the step "
                    "to divide every gap. Reduce the step or use alignment='shrink'."
                )
            if abs(ratio - n) > 1e-6 * n:
                raise ValueError(
                    f"the observation gap {gap} (between t={starts[k]} and t={times[k]}) is not an "
                    f"integer multiple of step={step}; alignment='exact' requires it. Choose a step "
                    "that divides every gap or use alignment='shrink'."
                )
        else:
            n = max(1, int(math.ceil(ratio - 1e-9)))
        nsub[k] = n
        hsub[k] = gap / n
    return nsub, hsub


def _depends_on(expr, var) -> bool:
    from pytensor.graph.traversal import ancestors

    return any(v is var for v in ancestors([expr]))


def _check_separable(ode) -> None:
    """Störmer–Verlet needs ``[dq/dt, dv/dt] = [g(v), a(q)]``; checked on the symbolic field."""
    d = ode.n_states
    if d % 2:
        raise ValueError(
            f"method='stormer_verlet' needs an even number of states [positions, velocities], "
            f"got n_states={d}"
        )
    fs, ys = getattr(ode, "_f", None), getattr(ode, "_y", None)
    if fs is None or ys is None:
        return
    m = d // 2
    for i in range(d):
        same_half = range(0, m) if i < m else range(m, d)
        for j in same_half:
            if _depends_on(fs[i], ys[j]):
                kind = "position" if i < m else "velocity"
                raise ValueError(
                    f"method='stormer_verlet' needs a separable system: the first half of the state "
                    f"are positions q, the second half velocities v, and func must return "
                    f"[dq/dt(v), dv/dt(q)]. The {kind} derivative {i} depends on state {j}."
                )


class FixedStepSolver:
    """A fixed-step solver of ``ode`` on a given set of output times, with its discrete adjoint.

    Parameters
    ----------
    ode : pymc_pnode.ODE
        The differential equation; integration starts at ``ode.t0``.
    times : array_like
        Strictly increasing output times, ``times[0] >= ode.t0``.
    method : {"euler", "heun", "midpoint", "rk4", "stormer_verlet"}
        The scheme (orders 1, 2, 2, 4, 2). ``"stormer_verlet"`` needs a separable second-order
        system with the state ordered ``[positions, velocities]`` (see the module docstring).
    step : float
        Step size (``alignment="exact"``) or upper bound on it (``alignment="shrink"``).
    alignment : {"exact", "shrink"}
        How steps meet the output times; see the module docstring.

    Attributes
    ----------
    nsub, hsub : ndarray
        Number and size of the steps in each gap ``times[k] - times[k - 1]`` (with
        ``times[-1] = ode.t0``).
    n_steps : int
        Total number of steps.
    order : int
        Order of convergence of the method.

    Raises
    ------
    ValueError
        Unknown method, non-positive step, non-increasing times, misaligned steps, or a
        non-separable system for Störmer–Verlet.
    """

    def __init__(self, ode, times, *, method: str = "rk4", step: float, alignment: str = "exact"):
        if method not in METHODS:
            raise ValueError(f"method must be one of {sorted(METHODS)}, got {method!r}")
        if alignment not in ("exact", "shrink"):
            raise ValueError(f"alignment must be 'exact' or 'shrink', got {alignment!r}")
        step = as_positive_float(step, "step")
        if method == "stormer_verlet":
            _check_separable(ode)
        self.ode = ode
        self.n_states, self.n_theta = ode.n_states, ode.n_theta
        self.method = method
        self.step = step
        self.alignment = alignment
        self.order = METHODS[method]
        self.times = validate_times(times, "times", start=ode.t0)
        self.t0 = float(ode.t0)
        self.nsub, self.hsub = _step_grid(self.t0, self.times, step, alignment)
        self.n_steps = int(self.nsub.sum())
        if method == "stormer_verlet":
            self.scheme = _SCHEME_SV
            self.a, self.b, self.c = _SV_DUMMY
        else:
            self.scheme = _SCHEME_RK
            self.a, self.b, self.c = _RK_TABLEAUX[method][:3]
        # read-only, as the kernels' signatures type them
        self.grid = StepGrid(self.t0, readonly(self.times), readonly(self.nsub, np.int64), readonly(self.hsub))
        self.tableau = Tableau(readonly(self.a), readonly(self.b), readonly(self.c))
        self._key = (
            method, alignment, step, self.times.tobytes(), self.nsub.tobytes(), self.hsub.tobytes(),
        )

    # Ops use the solver as a prop: equal solvers give mergeable nodes.
    def __eq__(self, other):
        return isinstance(other, FixedStepSolver) and other.ode is self.ode and other._key == self._key

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        return (
            f"FixedStepSolver({self.ode!r}, method={self.method!r}, step={self.step}, "
            f"n_times={self.times.size}, n_steps={self.n_steps})"
        )

    def forward(self, y0: np.ndarray, theta: np.ndarray):
        """Raw forward pass on validated float64 arrays: ``(ys, traj, ok)`` (see :func:`rk_forward`)."""
        return rk_forward(self.ode.rhs.address, theta, y0, self.grid, self.scheme, self.tableau)

    def backward(self, theta: np.ndarray, traj: np.ndarray, g_obs: np.ndarray):
        """Raw adjoint pass: ``(dL/dy0, dL/dtheta)`` for the cotangent ``g_obs = dL/dys``."""
        return rk_backward(*self.ode.field_addresses, theta, traj, self.grid, self.scheme, self.tableau, g_obs)

    def perturbed_solve(self, y0, theta, n_samples: int, rng=None) -> np.ndarray:
        """``n_samples`` randomised solutions at ``times``, shape ``(n_samples, K, n_states)``.

        The probabilistic integrator of Conrad et al. (2017): every step adds Gaussian noise whose standard
        deviation is the step's local error estimate by step doubling (Matsuda & Miyatake, 2021, footnote 2
        of §4.1.2). NaN rows after a divergence. Not for Störmer–Verlet.
        """
        if self.scheme != _SCHEME_RK:
            raise ValueError(f"perturbed solves need an explicit Runge–Kutta method, got method={self.method!r}")
        y0 = self.ode.validate_y0(y0)
        theta = self.ode.validate_theta(theta)
        noise = np.random.default_rng(rng).standard_normal((int(n_samples), self.n_steps, self.n_states))
        return rk_perturbed_forward(self.ode.rhs.address, theta, y0, self.grid, self.tableau, readonly(noise))

    def solve(self, y0, theta=None) -> np.ndarray:
        """States at ``times``, shape ``(K, n_states)`` (NaN rows after a divergence).

        Parameters
        ----------
        y0 : array_like
            Initial state at ``ode.t0``.
        theta : array_like, optional
            Parameters (omit when ``n_theta == 0``).
        """
        y0 = self.ode.validate_y0(y0)
        theta = self.ode.validate_theta(theta)
        return self.forward(y0, theta)[0]

    def vjp(self, y0, theta, g_obs) -> tuple[np.ndarray, np.ndarray]:
        """Gradient of ``sum(g_obs * ys)`` with respect to ``(y0, theta)`` by the discrete adjoint."""
        y0 = self.ode.validate_y0(y0)
        theta = self.ode.validate_theta(theta)
        g = np.ascontiguousarray(g_obs, dtype=np.float64)
        if g.shape != (self.times.size, self.n_states):
            raise ValueError(f"g_obs must have shape {(self.times.size, self.n_states)}, got {g.shape}")
        _, traj, _ = self.forward(y0, theta)
        return self.backward(theta, traj, g)


# ----------------------------------------------------------------------------------- PyTensor Ops
def _as_array(x, size: int, name: str) -> np.ndarray:
    arr = np.ascontiguousarray(x, dtype=np.float64)
    if arr.shape != (size,):
        raise ValueError(f"{name} must have shape ({size},), got {arr.shape}")
    return arr


class RKSolveOp(Op):
    """``(y0, theta) -> (ys, traj)`` by a :class:`FixedStepSolver`; the gradient is the discrete adjoint.

    The second output (the states at every step) feeds the adjoint Op; :func:`rk_solve` returns
    only the first.
    """

    __props__ = ("solver",)

    def __init__(self, solver: FixedStepSolver):
        self.solver = solver

    def make_node(self, y0, theta):
        y0 = pt.as_tensor_variable(y0)
        theta = pt.as_tensor_variable(theta)
        s = self.solver
        ys = pt.tensor(dtype="float64", shape=(s.times.size, s.n_states))
        traj = pt.tensor(dtype="float64", shape=(s.n_steps + 1, s.n_states))
        return Apply(self, [y0, theta], [ys, traj])

    def perform(self, node, inputs, output_storage):
        s = self.solver
        y0 = _as_array(inputs[0], s.n_states, "y0")
        theta = _as_array(inputs[1], s.n_theta, "theta")
        ys, traj, _ = s.forward(y0, theta)
        output_storage[0][0] = ys
        output_storage[1][0] = traj

    def infer_shape(self, fgraph, node, input_shapes):
        s = self.solver
        return [(s.times.size, s.n_states), (s.n_steps + 1, s.n_states)]

    def L_op(self, inputs, outputs, output_grads):
        g_ys, g_traj = output_grads
        if not isinstance(g_traj.type, DisconnectedType):
            raise NotImplementedError("gradients through the full step trajectory are not supported")
        if isinstance(g_ys.type, DisconnectedType):
            return [pt.zeros_like(inputs[0]), pt.zeros_like(inputs[1])]
        g_y0, g_theta = RKAdjointOp(self.solver)(inputs[1], outputs[1], g_ys)
        return [g_y0, g_theta]


class RKAdjointOp(Op):
    """``(theta, traj, g_ys) -> (dL/dy0, dL/dtheta)``: the discrete adjoint of :class:`RKSolveOp`."""

    __props__ = ("solver",)

    def __init__(self, solver: FixedStepSolver):
        self.solver = solver

    def make_node(self, theta, traj, g_ys):
        theta = pt.as_tensor_variable(theta)
        traj = pt.as_tensor_variable(traj)
        g_ys = pt.cast(pt.as_tensor_variable(g_ys), "float64")
        s = self.solver
        outs = [
            pt.tensor(dtype="float64", shape=(s.n_states,)),
            pt.tensor(dtype="float64", shape=(s.n_theta,)),
        ]
        return Apply(self, [theta, traj, g_ys], outs)

    def perform(self, node, inputs, output_storage):
        s = self.solver
        theta = _as_array(inputs[0], s.n_theta, "theta")
        traj = np.ascontiguousarray(inputs[1], dtype=np.float64)
        g_ys = np.ascontiguousarray(inputs[2], dtype=np.float64)
        g_y0, g_theta = s.backward(theta, traj, g_ys)
        output_storage[0][0] = g_y0
        output_storage[1][0] = g_theta

    def infer_shape(self, fgraph, node, input_shapes):
        return [(self.solver.n_states,), (self.solver.n_theta,)]

    def L_op(self, inputs, outputs, output_grads):
        return [grad_not_implemented(self, i, x) for i, x in enumerate(inputs)]


def rk_solve(
    ode,
    y0,
    theta,
    times,
    *,
    method: str = "rk4",
    step: float,
    alignment: str = "exact",
) -> pt.TensorVariable:
    r"""Fixed-step numerical solution at ``times`` as a differentiable PyTensor expression.

    Parameters
    ----------
    ode : pymc_pnode.ODE
        The differential equation; integration starts at ``ode.t0`` from ``y0``.
    y0 : array_like or TensorVariable
        Initial state, shape ``(n_states,)``; may be a PyMC random variable (or a list of them).
    theta : array_like or TensorVariable or None
        Parameters, shape ``(n_theta,)``; may be random variables. ``None`` when ``n_theta == 0``.
    times : array_like
        Strictly increasing output times (fixed numbers), ``times[0] >= ode.t0``.
    method : {"rk4", "euler", "heun", "midpoint", "stormer_verlet"}, default "rk4"
        The scheme. Störmer–Verlet needs the state ordered ``[positions, velocities]`` and a
        separable field ``[dq/dt(v), dv/dt(q)]``.
    step : float
        Step size; see ``alignment``.
    alignment : {"exact", "shrink"}, default "exact"
        ``"exact"``: every gap between output times (and from ``ode.t0`` to ``times[0]``) must be
        an integer multiple of ``step`` (a step larger than a gap is a ``ValueError``).
        ``"shrink"``: each gap is split into ``ceil(gap / step)`` equal steps.

    Returns
    -------
    TensorVariable
        The states at ``times``, shape ``(len(times), n_states)``. Its gradient with respect to
        ``y0`` and ``theta`` is the exact discrete adjoint. A solve that diverges gives NaN rows
        from the divergence on (and zero gradients).

    Raises
    ------
    ValueError
        Invalid method, step, times, alignment, or shapes of ``y0``/``theta``.

    Examples
    --------
    >>> def decay(y, t, p):
    ...     return [-p[0] * y[0]]
    >>> ode = ODE(decay, n_states=1, n_theta=1)  # doctest: +SKIP
    >>> ys = rk_solve(ode, [1.0], [0.5], [0.5, 1.0], step=0.1)  # doctest: +SKIP
    >>> ys.eval().shape  # doctest: +SKIP
    (2, 1)
    """
    solver = FixedStepSolver(ode, times, method=method, step=step, alignment=alignment)
    return solver_op(solver, y0, theta)


def solver_op(solver: FixedStepSolver, y0, theta) -> pt.TensorVariable:
    """Apply the forward Op of an existing :class:`FixedStepSolver` to ``(y0, theta)``."""
    ode = solver.ode
    return RKSolveOp(solver)(ode.y0_tensor(y0), ode.theta_tensor(theta))[0]


# ----------------------------------------------------------------------------------- numba mode
def _forward_function(op: RKSolveOp):
    s = op.solver
    rhs, scheme = s.ode.rhs.address, s.scheme
    t0, times, nsub, hsub = s.grid
    a, b, c = s.tableau

    def rk_solve_op(y0, theta):
        ys, traj, _ = rk_forward(rhs, np.ascontiguousarray(theta).copy(), np.ascontiguousarray(y0),
                                 StepGrid(t0, times, nsub, hsub), scheme, Tableau(a, b, c))
        return ys, traj

    return rk_solve_op


def _adjoint_function(op: RKAdjointOp):
    s = op.solver
    rhs, jac_y, jac_p = s.ode.field_addresses
    scheme = s.scheme
    t0, times, nsub, hsub = s.grid
    a, b, c = s.tableau

    def rk_adjoint_op(theta, traj, g_ys):
        return rk_backward(rhs, jac_y, jac_p, np.ascontiguousarray(theta).copy(), np.ascontiguousarray(traj),
                           StepGrid(t0, times, nsub, hsub), scheme, Tableau(a, b, c), np.ascontiguousarray(g_ys))

    return rk_adjoint_op


register_numba(RKSolveOp, _forward_function)
register_numba(RKAdjointOp, _adjoint_function)
