"""Ladders over values of PyTensor shared variables ("diffusion" ladders).

Instead of (or in addition to) raising the likelihood to a power, replicas may
differ in the value of shared variables of the model, e.g. the diffusion of a
probabilistic ODE solver or an observation noise scale: a large value makes
the likelihood flat ("hot").  Entry 0 of every ladder is the *cold* value the
reported draws are conditioned on.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pymc.model import Model
from pytensor.compile.sharedvalue import SharedVariable

__all__ = ["LADDER_STAT_PREFIX", "SharedLadder"]

LADDER_STAT_PREFIX = "ladder_"
"""Prefix of the per-replica sampler statistics reporting scalar shared ladders."""


class SharedLadder:
    """Validated per-replica values of laddered shared variables.

    Parameters
    ----------
    ladder : mapping
        Maps a shared variable (or the name of one registered in ``model``,
        e.g. created with ``pm.Data``) to a sequence of ``K`` values, one per
        replica, cold first.
    model : pymc.Model
        Used to resolve names.

    Raises
    ------
    TypeError
        If a key is not a shared variable.
    ValueError
        If the mapping is empty, the ladders have different lengths or fewer
        than two entries, a value has the wrong shape, or values are not finite.

    Warns
    -----
    UserWarning
        If the cold value differs from the shared variable's current value:
        other step methods and posterior predictive sampling see the current
        value, not the cold ladder value.
    """

    def __init__(self, ladder: Mapping[Any, Sequence[Any]], model: Model) -> None:
        if not isinstance(ladder, Mapping) or len(ladder) == 0:
            raise ValueError("shared_ladder must be a non-empty mapping {shared_variable: values}.")
        self.variables: list[SharedVariable] = []
        self.values: list[list[np.ndarray]] = []
        for key, seq in ladder.items():
            var = self._resolve(key, model)
            if var in self.variables:
                raise ValueError(f"Shared variable {var.name!r} appears twice in shared_ladder.")
            self.variables.append(var)
            self.values.append(self._convert(var, seq))

        lengths = {var.name: len(vals) for var, vals in zip(self.variables, self.values)}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"All shared_ladder entries must have the same length; got {lengths}.")
        if self.n_replicas < 2:
            raise ValueError(
                "Each shared_ladder entry needs at least 2 values (one per replica); "
                f"got {lengths}."
            )
        for var, vals in zip(self.variables, self.values):
            if not np.array_equal(vals[0], var.get_value(borrow=True)):
                warnings.warn(
                    f"The cold value shared_ladder[{var.name!r}][0] differs from the current "
                    f"value of {var.name!r}. The reported draws target the cold value, while "
                    "other step methods and predictive sampling use the current value.",
                    UserWarning,
                    stacklevel=3,
                )

    @staticmethod
    def _resolve(key: Any, model: Model) -> SharedVariable:
        var = key
        if isinstance(key, str):
            if key not in model.named_vars:
                raise ValueError(f"shared_ladder key {key!r} is not a variable of the model.")
            var = model.named_vars[key]
        if not isinstance(var, SharedVariable):
            raise TypeError(
                f"shared_ladder keys must be PyTensor shared variables (e.g. from pm.Data or "
                f"pytensor.shared); got {type(var).__name__} for {key!r}."
            )
        return var

    @staticmethod
    def _convert(var: SharedVariable, seq: Sequence[Any]) -> list[np.ndarray]:
        if isinstance(seq, str) or not hasattr(seq, "__len__"):
            raise ValueError(
                f"shared_ladder[{var.name!r}] must be a sequence with one value per replica."
            )
        current = np.asarray(var.get_value(borrow=True))
        values = []
        for k, value in enumerate(seq):
            raw = np.asarray(value)
            if not np.can_cast(raw.dtype, current.dtype, casting="same_kind"):
                raise ValueError(
                    f"shared_ladder[{var.name!r}][{k}] has dtype {raw.dtype}, which cannot be "
                    f"cast safely to the shared variable's dtype {current.dtype}."
                )
            arr = np.array(raw, dtype=current.dtype)
            if arr.shape != current.shape:
                raise ValueError(
                    f"shared_ladder[{var.name!r}][{k}] has shape {arr.shape}, but the shared "
                    f"variable has shape {current.shape}."
                )
            if arr.dtype.kind in "fc" and not np.all(np.isfinite(arr)):
                raise ValueError(f"shared_ladder[{var.name!r}][{k}] is not finite: {value!r}.")
            values.append(arr)
        return values

    @property
    def n_replicas(self) -> int:
        """Length of the ladders."""
        return len(self.values[0])

    def replica_values(self, k: int) -> tuple[np.ndarray, ...]:
        """Values of all laddered variables for replica ``k`` (in variable order)."""
        return tuple(vals[k] for vals in self.values)

    def differs(self, k: int) -> bool:
        """Whether replicas ``k`` and ``k + 1`` use different shared values."""
        return any(not np.array_equal(vals[k], vals[k + 1]) for vals in self.values)

    def stat_values(self) -> dict[str, np.ndarray]:
        """Per-replica values of the scalar laddered variables, for sampler statistics.

        Returns
        -------
        dict
            ``{"ladder_<name>": array of shape (K,)}`` for every laddered
            variable whose value is a real scalar (e.g. a Fenrir diffusion);
            unnamed variables are called ``shared<i>`` by their position in
            the ladder.  Non-scalar variables are not reported.
        """
        out: dict[str, np.ndarray] = {}
        for i, (var, vals) in enumerate(zip(self.variables, self.values)):
            if vals[0].ndim != 0 or vals[0].dtype.kind not in "biuf":
                continue
            name = f"{LADDER_STAT_PREFIX}{var.name or f'shared{i}'}"
            if name in out:  # two variables with the same name: disambiguate by position
                name = f"{name}_{i}"
            out[name] = np.array([float(v) for v in vals], dtype=np.float64)
        return out
