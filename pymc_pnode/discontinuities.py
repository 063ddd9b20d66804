"""Declared jumps of the vector field in ``t``: where the ODE filters end one segment and restart the next.

A filter's IWP prior is smooth, so its derivative states cannot follow a jump of ``f`` in ``t`` (a switched input,
a dose). At a declared jump ``t_d`` the solve ends a segment just before ``t_d`` — the field evaluated on the left
of a switch written ``t >= t_d`` or ``t > t_d`` — and the next segment starts just after it, from the mean solution
where the previous one ended, its derivative states initialised from the field on the right (Taylor mode) and its
covariance from zero, as at ``t0``. Used by :func:`pymc_pnode.solve` and the Fenrir likelihood.
"""

from __future__ import annotations

import numpy as np

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


def segment_of(times: np.ndarray, discontinuities: np.ndarray) -> np.ndarray:
    """The segment of each time: a time at a jump belongs to the segment that ends there (the solution is
    continuous; only its derivative jumps)."""
    return np.searchsorted(discontinuities, times, side="left")
