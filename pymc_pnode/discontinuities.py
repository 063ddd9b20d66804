"""Declared jumps of the vector field in ``t``: where the ODE filters end one segment and restart the next.

A filter's IWP prior is smooth, so its derivative states cannot follow a jump of ``f`` in ``t`` (a switched input,
a dose). At a declared jump ``t_d`` the solve ends a segment just before ``t_d`` — the field evaluated on the left
of a switch written ``t >= t_d`` or ``t > t_d`` — and the next segment starts just after it, from the mean solution
where the previous one ended, its derivative states initialised from the field on the right (Taylor mode) and its
covariance from zero, as at ``t0``. Used by :func:`pymc_pnode.solve` and the Fenrir likelihood.

The state itself may jump there too (a bolus dose, a harvest): ``jumps`` (one row per discontinuity, see
:func:`declared_restarts`) is added to the mean where the previous segment ended, ``y(t_d⁺) = y(t_d⁻) + jump``.
An observation at ``t_d`` is of the state before the jump (a trough level measured just before a dose).
"""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
from pytensor.graph.basic import Variable

from pymc_pnode.validation import as_float_array, validate_discontinuities

# How far (relative to the time span) a segment ends before a jump and the next starts after it. The solution
# moves by about ``f · 2e-10 · span`` in between; the restart takes the mean at the end as its start.
DISCONTINUITY_OFFSET = 1e-10


def _offset(t: float, span: float) -> float:
    return max(DISCONTINUITY_OFFSET * span, 1e3 * float(np.spacing(abs(t))))


def segment_bounds(t0: float, t1: float, discontinuities: np.ndarray) -> list[tuple[float, float]]:
    """``(start, end)`` of each segment of ``[t0, t1]`` split at the sorted ``discontinuities`` (inside ``(t0, t1)``):
    each segment but the last ends just before a jump, each but the first starts just after one."""
    span = t1 - t0
    edges = np.concatenate([[t0], discontinuities, [t1]])
    last = edges.size - 2
    return [(float(a) + (0.0 if i == 0 else _offset(a, span)), float(b) - (0.0 if i == last else _offset(b, span)))
            for i, (a, b) in enumerate(zip(edges[:-1], edges[1:]))]


def split_times(t0: float, t1: float, discontinuities: np.ndarray, times: np.ndarray) -> list[tuple]:
    """Per segment of :func:`segment_bounds`: ``(start, end, rows, at)`` with the indices ``rows`` of the ``times`` that
    belong to it (:func:`segment_of`) and those times moved into it (a time at a jump to the segment's end)."""
    which = segment_of(times, discontinuities)
    out = []
    for s, (start, end) in enumerate(segment_bounds(t0, t1, discontinuities)):
        rows = np.flatnonzero(which == s)
        out.append((start, end, rows, np.clip(times[rows], start, end)))
    return out


def declared_restarts(discontinuities, jumps, start: float, end: float, n_states: int, symbolic: bool = True):
    """The declared discontinuities that matter to a solve over ``(start, end)`` and the state's jump at each.

    Without ``jumps`` (``None``): :func:`~pymc_pnode.validation.validate_discontinuities` (sorted, deduplicated, those
    outside ``(start, end)`` dropped) and ``None``. With ``jumps``, an array of shape ``(len(discontinuities),
    n_states)`` whose row ``j`` is added to the state at ``discontinuities[j]``, the times must be strictly increasing
    and after ``start`` (a jump at ``t0`` belongs in ``y0``); those at or after ``end`` change nothing observed and
    are dropped with their rows. ``jumps`` may be symbolic (a random dose) when ``symbolic``; it is then returned as a
    float64 tensor whose shape is pinned, numbers as a float64 array. Bad input raises a ``ValueError`` that
    names the argument."""
    if jumps is None:
        return validate_discontinuities(discontinuities, start, end), None
    if discontinuities is None:
        raise ValueError("jumps needs discontinuities=[...]: the times at which the state jumps, one row of jumps "
                         "per time")
    times = np.atleast_1d(as_float_array(discontinuities, "discontinuities"))
    if times.ndim != 1 or not np.all(np.isfinite(times)):
        raise ValueError(f"discontinuities must be a 1-d sequence of finite times, got {discontinuities!r}")
    if np.any(np.diff(times) <= 0):
        raise ValueError("discontinuities must be strictly increasing when jumps are given (row j of jumps is the "
                         f"state's jump at discontinuities[j]), got {times.tolist()}")
    if times[0] <= start:
        raise ValueError(f"discontinuities with jumps must lie after t0={start!r} (add a jump at t0 to y0), got "
                         f"{float(times[0])!r}")
    shape = (times.size, n_states)
    n_kept = int(np.searchsorted(times, end, side="left"))
    symbolic_value = isinstance(jumps, Variable) or (
        isinstance(jumps, (list, tuple)) and any(isinstance(v, Variable) for row in jumps
                                                 for v in (row if isinstance(row, (list, tuple)) else [row])))
    if symbolic_value:
        if not symbolic:
            raise ValueError("jumps must be numbers here, got a symbolic tensor")
        var = pt.as_tensor_variable(jumps)
        var = var if var.dtype == "float64" else pt.cast(var, "float64")
        if var.ndim != 2 or any(s is not None and s != n for s, n in zip(var.type.shape, shape)):
            raise ValueError(f"jumps must have shape {shape} (one row per discontinuity, one column per state), "
                             f"got a tensor of static shape {var.type.shape}")
        return times[:n_kept], pt.specify_shape(var, shape)[:n_kept]
    arr = as_float_array(jumps, "jumps")
    if arr.shape != shape:
        raise ValueError(f"jumps must have shape {shape} (one row per discontinuity, one column per state), got "
                         f"{arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("jumps must be finite, it contains NaN or ±inf")
    return times[:n_kept], np.ascontiguousarray(arr[:n_kept])


def restart_state(end_value, jumps, s: int):
    """Where segment ``s + 1`` starts: ``end_value`` (where segment ``s`` ended) plus row ``s`` of the state's
    ``jumps`` (from :func:`declared_restarts`: ``None``, an array, or a tensor of static shape); ``end_value`` itself
    without jumps or after the last segment."""
    n_jumps = 0 if jumps is None else (jumps.type.shape[0] if isinstance(jumps, Variable) else len(jumps))
    return end_value if s >= n_jumps else end_value + jumps[s]


def segment_of(times: np.ndarray, discontinuities: np.ndarray) -> np.ndarray:
    """The segment of each time: a time at a jump belongs to the segment that ends there (the solution is
    continuous; only its derivative jumps)."""
    return np.searchsorted(discontinuities, times, side="left")
