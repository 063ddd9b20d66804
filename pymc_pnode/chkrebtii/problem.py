"""The discretised problem shared by the forward sampler and the PyMC layer: validation and adapters."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pymc_pnode._jit import readonly
from pymc_pnode.chkrebtii.delay import DelayODE
from pymc_pnode.chkrebtii.kernels import kernel_code
from pymc_pnode.chkrebtii.recursion import LAG_CONSTANT, LAG_FUNCTION, LAG_NONE, Setting
from pymc_pnode.chkrebtii.structure import noise_code
from pymc_pnode.discontinuities import declared_restarts, split_times
from pymc_pnode.ode import ODE
from pymc_pnode.validation import validate_t_span, validate_times

__all__ = ["Discretisation", "FieldSpec", "discretisation", "field_spec", "positive_parameter", "segments"]


@dataclass(frozen=True)
class Discretisation:
    """Grid, output times and solver settings of Algorithm 1 (hashable: used as Op properties)."""

    t0: float
    t1: float
    n_grid: int
    times: tuple
    kernel: str
    noise: str
    jitter: float

    @property
    def span(self) -> float:
        return self.t1 - self.t0

    @property
    def grid(self) -> np.ndarray:
        """The equally spaced grid ``s`` (absolute times), ``s[0] = t0``, ``s[-1] = t1``."""
        g = self.t0 + self.span * np.arange(self.n_grid) / (self.n_grid - 1)
        g[-1] = self.t1
        return g

    @property
    def times_array(self) -> np.ndarray:
        return np.array(self.times, dtype=np.float64)

    @property
    def times_rel(self) -> np.ndarray:
        """Output times measured from ``t0``."""
        return np.ascontiguousarray(self.times_array - self.t0)

    def structure_arguments(self) -> tuple:
        """``(n_grid, span, times from t0, kernel code, noise code, jitter)`` (read-only times): the
        settings of :func:`~pymc_pnode.chkrebtii.structure.stacked_structure` besides ``lam``."""
        return self.n_grid, self.span, readonly(self.times_rel), self.kernel_code, self.noise_code, self.jitter

    @property
    def kernel_code(self) -> int:
        return kernel_code(self.kernel)

    @property
    def noise_code(self) -> int:
        return noise_code(self.noise)


def discretisation(t_span, n_grid, times, kernel: str, noise: str, jitter: float) -> Discretisation:
    """Validated :class:`Discretisation`; ``ValueError`` naming the offending argument."""
    t0, t1 = validate_t_span(t_span)
    if isinstance(n_grid, bool) or int(n_grid) != n_grid or n_grid < 2:
        raise ValueError(f"n_grid must be an integer >= 2, got {n_grid!r}")
    n_grid = int(n_grid)
    kernel_code(kernel)
    noise_code(noise)
    jitter = float(jitter)
    if not (math.isfinite(jitter) and 0.0 <= jitter < 1.0):
        raise ValueError(f"jitter must lie in [0, 1), got {jitter!r}")
    if times is None:
        arr = t0 + (t1 - t0) * np.arange(n_grid) / (n_grid - 1)
        arr[-1] = t1
    else:
        arr = validate_times(times, "times")
        tol = 1e-12 * (t1 - t0)
        if arr[0] < t0 - tol or arr[-1] > t1 + tol:
            raise ValueError(
                f"times must lie inside the grid span [{t0}, {t1}], got [{arr[0]}, {arr[-1]}]"
            )
        arr = np.clip(arr, t0, t1)
    return Discretisation(t0, t1, n_grid, tuple(float(x) for x in arr), kernel, noise, jitter)


def segments(disc: Discretisation, ode, discontinuities, jumps=None, symbolic: bool = True) -> tuple[list, object]:
    """The problem split at declared jumps of the vector field in ``t`` (``discontinuities``, validated here): per
    segment its :class:`Discretisation` and the rows of its outputs that are ``disc.times`` (``[(disc, None)]``
    without jumps); and the state's jumps at the restarts (``None``, an array, or with ``symbolic`` a tensor;
    :func:`~pymc_pnode.discontinuities.declared_restarts`). Each segment has its own equally spaced grid
    (``disc.n_grid - 1`` steps shared out in proportion to the lengths, at least one each) and also outputs its end,
    where the next one restarts; the segments' bounds and the times at a jump are those of the ODE filters
    (:mod:`pymc_pnode.discontinuities`)."""
    times, jumps = declared_restarts(discontinuities, jumps, disc.t0, disc.t1, ode.n_states, symbolic)
    if times.size == 0:
        return [(disc, None)], None
    if isinstance(ode, DelayODE):
        raise ValueError("discontinuities are not supported for a DelayODE (its history would cross the restarts)")
    out = []
    for start, end, _, at in split_times(disc.t0, disc.t1, times, disc.times_array):
        seg_times = np.union1d(at, [end])
        n_grid = max(2, round((disc.n_grid - 1) * (end - start) / disc.span) + 1)
        seg = Discretisation(start, end, n_grid, tuple(float(x) for x in seg_times), disc.kernel, disc.noise,
                             disc.jitter)
        out.append((seg, np.searchsorted(seg_times, at)))
    return out, jumps


def positive_parameter(value, name: str, n_states: int) -> np.ndarray:
    """A positive scalar or per-component ``(n_states,)`` hyperparameter as a float64 1-d array."""
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim > 1 or (arr.ndim == 1 and arr.size not in (1, n_states)):
        raise ValueError(f"{name} must be a scalar or have shape ({n_states},), got shape {arr.shape}")
    arr = arr.reshape(-1)
    if not (np.all(np.isfinite(arr)) and np.all(arr > 0.0)):
        raise ValueError(f"{name} must be finite and positive, got {value!r}")
    return arr


@dataclass
class FieldSpec:
    """What the recursion kernels need to evaluate an :class:`ODE` or a :class:`DelayODE`.

    ``functions`` are the recursion's first six arguments, addresses of C callbacks: the (augmented)
    field's ``rhs``, ``jac_y`` and ``jac_p``, and the history function, its ``theta``-Jacobian and its
    time derivative (0 where there is no history function: never called then).
    """

    functions: tuple
    lag_mode: int
    tau_index: int
    tau_fixed: float
    forcing: np.ndarray
    n_states: int
    n_theta: int

    def setting(self, bandwidth: np.ndarray, cmap: np.ndarray, grid: np.ndarray, draw: bool) -> Setting:
        """The recursion's :class:`~pymc_pnode.chkrebtii.recursion.Setting` (read-only arrays)."""
        return Setting(readonly(bandwidth, np.int64), readonly(cmap, np.int64), readonly(grid), bool(draw),
                       self.lag_mode, self.tau_index, self.tau_fixed, readonly(self.forcing))


def field_spec(ode: ODE | DelayODE, grid: np.ndarray) -> FieldSpec:
    """Adapter from an :class:`ODE` / :class:`DelayODE` to the recursion kernels' arguments."""
    if isinstance(ode, DelayODE):
        history = (0, 0, 0)  # LAG_CONSTANT: never called
        mode = LAG_CONSTANT
        if ode.history_ode is not None:
            history = (ode.history_ode.rhs.address, ode.history_ode.jac_p.address, ode.history_dt_ode.rhs.address)
            mode = LAG_FUNCTION
        tau_index = -1 if ode.delay_param is None else ode.delay_param
        tau_fixed = 0.0 if ode.delay is None else ode.delay
        return FieldSpec((*ode.augmented.field_addresses, *history), mode, tau_index, tau_fixed,
                         ode.forcing_values(grid), ode.n_states, ode.n_theta)
    if isinstance(ode, ODE):
        return FieldSpec((*ode.field_addresses, 0, 0, 0), LAG_NONE, -1, 0.0, np.zeros((grid.size, 0)), ode.n_states,
                         ode.n_theta)
    raise ValueError(f"ode must be a pymc_pnode.ODE or DelayODE, got {type(ode).__name__}")
