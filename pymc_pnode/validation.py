"""Checks of user input: one rule and one wording per kind of argument.

Every check raises a ``ValueError`` that names the argument, when the model or problem is built, so that
bad input never reaches a compiled kernel or a sampler.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "as_float_array",
    "as_positive_float",
    "as_positive_int",
    "validate_bounds",
    "validate_data",
    "validate_discontinuities",
    "validate_noise",
    "validate_obs_matrix",
    "validate_step",
    "validate_t_span",
    "validate_times",
]


def as_float_array(value, name: str) -> np.ndarray:
    """``value`` as a float64 array; a ``ValueError`` naming ``name`` when it is not numeric."""
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be numeric, got {type(value).__name__} that cannot be "
                         f"converted to floats ({err})") from err


def as_positive_int(value, name: str) -> int:
    """A positive integer (booleans and non-integral numbers are refused)."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    try:
        integral = int(value) == value
    except (TypeError, ValueError):
        integral = False
    if not integral or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def as_positive_float(value, name: str) -> float:
    """A positive finite number."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return v


def validate_times(
    times, name: str = "times", *, start: float | None = None, span: tuple[float, float] | None = None
) -> np.ndarray:
    """A non-empty 1-d array of finite, strictly increasing times (C-contiguous float64).

    ``start``: the earliest allowed time (an ODE's ``t0``); ``span``: ``(t0, t1)`` the times must lie in.
    """
    arr = np.atleast_1d(as_float_array(times, name))
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-d sequence of times, got shape {np.shape(times)}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, it contains NaN or ±inf")
    if np.any(np.diff(arr) <= 0):
        i = int(np.argmax(np.diff(arr) <= 0))
        raise ValueError(f"{name} must be strictly increasing, got {float(arr[i])!r} followed by {float(arr[i + 1])!r}")
    if start is not None and arr[0] < start:
        raise ValueError(f"{name} must not start before t0={start!r}, got {name}[0]={float(arr[0])!r}")
    if span is not None and (arr[0] < span[0] or arr[-1] > span[1]):
        raise ValueError(f"{name} must lie inside t_span={span}, got [{arr[0]}, {arr[-1]}]")
    return np.ascontiguousarray(arr)


def validate_discontinuities(value, start: float, end: float, name: str = "discontinuities") -> np.ndarray:
    """Times at which the vector field may jump: finite; sorted and deduplicated here. Only those strictly inside
    ``(start, end)`` matter to a solve over that span and are returned."""
    if value is None:
        return np.empty(0)
    arr = np.atleast_1d(as_float_array(value, name))
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-d sequence of times, got shape {np.shape(value)}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, it contains NaN or ±inf")
    arr = np.unique(arr)
    return np.ascontiguousarray(arr[(arr > start) & (arr < end)])


def validate_t_span(t_span) -> tuple[float, float]:
    """A pair ``(t0, t1)`` of finite times with ``t1 > t0``."""
    try:
        t0, t1 = (float(v) for v in t_span)
    except (TypeError, ValueError) as err:
        raise ValueError(f"t_span must be a pair (t0, t1), got {t_span!r}") from err
    if not (math.isfinite(t0) and math.isfinite(t1) and t1 > t0):
        raise ValueError(f"t_span must be finite with t1 > t0, got {t_span!r}")
    return t0, t1


def validate_step(step, span: float, name: str = "step") -> float:
    """A fixed step: positive, finite and not longer than the time span ``span``."""
    h = as_positive_float(step, name)
    if h > span:
        raise ValueError(f"{name} must not exceed the time span {span!r}, got {step!r}")
    return h


def validate_obs_matrix(obs_matrix, n_states: int, name: str = "obs_matrix") -> np.ndarray:
    """The observation matrix ``C`` of ``data = C y + noise``: shape ``(m, n_states)``, finite.

    ``None`` observes every state (the identity); a 1-d array is one observed combination.
    """
    if obs_matrix is None:
        return np.eye(n_states)
    cmat = as_float_array(obs_matrix, name)
    if cmat.ndim == 1:
        cmat = cmat[None, :]
    if cmat.ndim != 2 or cmat.shape[0] < 1 or cmat.shape[1] != n_states:
        raise ValueError(f"{name} must have shape (n_observed, {n_states}), got {np.shape(obs_matrix)}")
    if not np.all(np.isfinite(cmat)):
        raise ValueError(f"{name} must be finite, it contains NaN or ±inf")
    return np.ascontiguousarray(cmat)


def validate_state_selection(cmat: np.ndarray, structure: str, name: str = "obs_matrix") -> None:
    """A ``ValueError`` unless every row of ``cmat`` observes one state (a scaled selection), which a
    block-diagonal or isotropic filter can condition on state by state (:mod:`pymc_pnode.filtering.structure`)."""
    for row, entries in enumerate(cmat):
        states = np.flatnonzero(entries)
        if states.size != 1:
            raise ValueError(f"{name} row {row} combines the states {states.tolist()}: the {structure!r} structure "
                             f"keeps the states' covariances independent and can only observe one state per row; "
                             f"use structure='dense' for observations that mix states")


def validate_data(
    data, n_times: int, n_observed: int, *, allow_missing: bool = True, name: str = "data"
) -> np.ndarray:
    """Observations of shape ``(n_times, n_observed)`` (1-d when one component is observed); NaN marks a
    missing value when ``allow_missing``; ±inf is refused, and at least one value must be observed."""
    y = np.array(as_float_array(data, name), dtype=np.float64)
    if y.ndim == 1 and n_observed == 1:
        y = y[:, None]
    if y.shape != (n_times, n_observed):
        raise ValueError(f"{name} must have shape (len(times), n_observed) = ({n_times}, {n_observed}), "
                         f"got {np.shape(data)}")
    if np.any(np.isinf(y)):
        raise ValueError(f"{name} must not contain infinite values")
    missing = np.isnan(y)
    if missing.any() and not allow_missing:
        raise ValueError(f"{name} must not contain NaN (missing values are not supported here)")
    if missing.all():
        raise ValueError(f"{name} contains no observed (non-NaN) values")
    return y


def validate_noise(sigma, n_observed: int, name: str = "obs_sigma") -> np.ndarray:
    """Observation noise scales: a positive finite scalar (shared) or one per observed component."""
    s = as_float_array(sigma, name)
    if s.size == 1 and s.ndim <= 1:  # a scalar, or a one-element array, is shared
        s = np.full(n_observed, float(s.reshape(-1)[0]))
    if s.shape != (n_observed,) or not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise ValueError(f"{name} must be a positive finite scalar or an array of shape ({n_observed},), "
                         f"got {np.array2string(np.atleast_1d(s), threshold=6)}")
    return s


def validate_bounds(bounds, n: int, name: str) -> list[tuple[float, float]]:
    """``bounds`` as a list of ``n`` (lo, hi) pairs with ``-inf``/``inf`` for None."""
    if bounds is None:
        return [(-np.inf, np.inf)] * n
    try:
        pairs = [tuple(b) for b in bounds]
    except TypeError:
        raise ValueError(f"{name} must be a sequence of (low, high) pairs") from None
    if len(pairs) != n or any(len(b) != 2 for b in pairs):
        raise ValueError(f"{name} must contain {n} (low, high) pairs, got {len(pairs)}")
    out = []
    for lo, hi in pairs:
        lo = -np.inf if lo is None else float(lo)
        hi = np.inf if hi is None else float(hi)
        if np.isnan(lo) or np.isnan(hi) or lo >= hi:
            raise ValueError(f"{name}: each pair must satisfy low < high, got ({lo}, {hi})")
        out.append((lo, hi))
    return out
