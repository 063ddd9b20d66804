"""The one result type of every point estimator in the package.

The classical baselines (``pymc_pnode.baselines``), IRLS for discretisation-error variances
(``pymc_pnode.classical.irls_fit``), MLE/MAP fits of PyMC models and diffusion tempering
(``pymc_pnode.fit``, ``pymc_pnode.diffusion_tempering``) all return an :class:`EstimationResult` or a subclass
that adds the estimator's own outputs; :func:`results_table` puts any of them side by side and
:meth:`EstimationResult.to_xarray` gives the estimate as an ``xarray.Dataset`` in ArviZ's layout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["EstimationResult", "results_table"]


def _as_vector(x) -> np.ndarray | None:
    return None if x is None else np.array(x, dtype=np.float64).reshape(-1)


@dataclass
class EstimationResult:
    """Outcome of a parameter estimation, shared by every estimator in the package.

    A failed run is a result too: ``converged`` is ``False`` and ``message`` says why (for example
    an ODE solve that stopped at a pole). Estimators never raise for a numerical failure inside the
    optimisation; they raise ``ValueError`` only for invalid input.

    Parameters
    ----------
    theta : array_like
        Estimated parameters, shape ``(n_theta,)``.
    y0 : array_like or None
        Estimated (or, if not fitted, the fixed) initial state, shape ``(n_states,)``.
    objective : float
        Final value of the estimator's own objective (its definition is in ``objective_name``).
    n_iterations : int
        Outer iterations of the optimiser.
    wall_time : float
        Seconds of wall-clock time for the whole estimation.
    converged : bool
        Whether the optimiser reported success *and* the estimator's own checks passed.
    message : str
        Human-readable termination reason.
    method : str
        Name of the estimator, e.g. ``"rk_least_squares"``.
    objective_name : str
        What ``objective`` measures, e.g. ``"sum of squared weighted residuals"``.
    n_function_evals : int
        Evaluations of the objective (each usually one ODE solve or one sweep over the data).
    n_ode_solves : int
        Number of ODE/adjoint/sensitivity integrations, when meaningful (else 0).
    extra : dict
        Estimator-specific outputs (fitted trajectories, node states, histories, ...).
    theta_names : list of str, optional
        Names of the entries of ``theta`` (default ``theta[0]``, ``theta[1]``, ...), used by
        :meth:`to_dict`, :meth:`summary` and :meth:`to_xarray` unless names are passed there.

    Examples
    --------
    >>> r = EstimationResult(theta=[1.0, 2.0], y0=None, objective=0.5, n_iterations=3,
    ...                      wall_time=0.1, converged=True, message="ok", method="demo")
    >>> r.to_dict(theta_names=["a", "b"])["a"]
    1.0
    """

    theta: np.ndarray
    y0: np.ndarray | None
    objective: float
    n_iterations: int
    wall_time: float
    converged: bool
    message: str
    method: str = ""
    objective_name: str = ""
    n_function_evals: int = 0
    n_ode_solves: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    theta_names: list[str] | None = None

    def __post_init__(self) -> None:
        self.theta = _as_vector(self.theta)
        self.y0 = _as_vector(self.y0)
        self.objective = float(self.objective)
        self.n_iterations = int(self.n_iterations)
        self.wall_time = float(self.wall_time)
        self.converged = bool(self.converged)
        self.message = str(self.message)
        self.n_function_evals = int(self.n_function_evals)
        self.n_ode_solves = int(self.n_ode_solves)
        if self.theta_names is not None:
            self.theta_names = self._checked_names(self.theta_names, self.theta.size, "theta_names")

    @staticmethod
    def _checked_names(names: Sequence[str], size: int, argument: str) -> list[str]:
        names = [str(n) for n in names]
        if len(names) != size:
            raise ValueError(f"{argument} must have {size} entries, got {len(names)}")
        return names

    def _theta_labels(self, theta_names: Sequence[str] | None = None) -> list[str]:
        if theta_names is not None:
            return self._checked_names(theta_names, self.theta.size, "theta_names")
        return self.theta_names or [f"theta[{i}]" for i in range(self.theta.size)]

    @property
    def success(self) -> bool:
        """Alias of ``converged`` (the name scipy uses)."""
        return self.converged

    def to_dict(
        self,
        theta_names: Sequence[str] | None = None,
        y0_names: Sequence[str] | None = None,
        theta_true: Sequence[float] | None = None,
    ) -> dict[str, Any]:
        """A flat dictionary for one table row.

        Parameters
        ----------
        theta_names, y0_names : sequence of str, optional
            Column names of the parameters and initial states (default ``theta[0]``, ``y0[0]``...).
        theta_true : sequence of float, optional
            If given, adds ``theta_error`` (Euclidean norm of the parameter error).
        """
        row: dict[str, Any] = {"method": self.method}
        row.update({n: float(v) for n, v in zip(self._theta_labels(theta_names), self.theta)})
        if self.y0 is not None:
            ynames = (self._checked_names(y0_names, self.y0.size, "y0_names") if y0_names is not None
                      else [f"y0[{i}]" for i in range(self.y0.size)])
            row.update({n: float(v) for n, v in zip(ynames, self.y0)})
        if theta_true is not None:
            truth = np.asarray(theta_true, dtype=np.float64).reshape(-1)
            if truth.shape != self.theta.shape:
                raise ValueError(f"theta_true must have shape {self.theta.shape}, got {truth.shape}")
            row["theta_error"] = float(np.linalg.norm(self.theta - truth))
        row.update(
            objective=self.objective,
            n_iterations=self.n_iterations,
            n_function_evals=self.n_function_evals,
            n_ode_solves=self.n_ode_solves,
            wall_time=self.wall_time,
            converged=self.converged,
            message=self.message,
        )
        return row

    def summary(self, theta_names: Sequence[str] | None = None) -> str:
        """A short multi-line text summary."""
        names = self._theta_labels(theta_names)
        status = "converged" if self.converged else "NOT converged"
        lines = [
            f"{self.method or 'estimate'}: {status} after {self.n_iterations} iterations "
            f"({self.wall_time:.3g} s)",
            f"  {self.objective_name or 'objective'} = {self.objective:.6g}",
        ]
        lines += [f"  {n} = {v:.6g}" for n, v in zip(names, self.theta)]
        if self.y0 is not None:
            lines.append("  y0 = " + np.array2string(self.y0, precision=5))
        lines.append(f"  message: {self.message}")
        return "\n".join(lines)

    def estimates(self) -> dict[str, np.ndarray]:
        """The estimated quantities by name: ``theta`` and, if present, ``y0`` (subclasses that estimate
        the variables of a PyMC model give those instead)."""
        out = {"theta": self.theta}
        if self.y0 is not None:
            out["y0"] = self.y0
        return out

    def _coords(self) -> dict[str, list[str]]:
        """Coordinate labels of :meth:`estimates`' dims: ``theta``'s entries by ``theta_names``."""
        return {"theta_dim_0": self._theta_labels()}

    def to_xarray(self):
        """The estimate as an :class:`xarray.Dataset` in ArviZ's layout without ``chain``/``draw``.

        One data variable per estimated quantity (dims ``<name>_dim_<i>``; ``theta`` labelled by
        ``theta_names``); the diagnostics (``method``, ``objective``, ``objective_name``,
        ``converged``, ``n_iterations``, ``n_function_evals``, ``n_ode_solves``, ``wall_time``,
        ``message``) as attributes, with ``converged`` as 0/1 so that the dataset can be written to
        netCDF. Compare with a posterior in ArviZ, e.g.
        ``az.plot_posterior(idata, ref_val=...)`` or ``idata.posterior - result.to_xarray()``.
        """
        import xarray as xr

        coords = self._coords()
        variables = {}
        for name, value in self.estimates().items():
            value = np.asarray(value)
            dims = [f"{name}_dim_{i}" for i in range(value.ndim)]
            variables[name] = xr.DataArray(value, dims=dims,
                                           coords={d: coords[d] for d in dims if d in coords})
        return xr.Dataset(variables, attrs={
            "method": self.method, "objective": self.objective, "objective_name": self.objective_name,
            "converged": int(self.converged), "n_iterations": self.n_iterations,
            "n_function_evals": self.n_function_evals, "n_ode_solves": self.n_ode_solves,
            "wall_time": self.wall_time, "message": self.message,
        })

    def replace(self, **changes: Any) -> EstimationResult:
        """A copy with some fields changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:  # the full arrays in ``extra`` make the default repr unreadable
        return (
            f"{type(self).__name__}(method={self.method!r}, theta={np.array2string(self.theta, precision=5)}, "
            f"objective={self.objective:.6g}, converged={self.converged}, "
            f"n_iterations={self.n_iterations}, wall_time={self.wall_time:.3g})"
        )


def results_table(
    results: Mapping[str, EstimationResult] | Sequence[EstimationResult],
    theta_names: Sequence[str] | None = None,
    theta_true: Sequence[float] | None = None,
):
    """Tabulate several results side by side as a :class:`pandas.DataFrame`.

    Parameters
    ----------
    results : mapping of label -> EstimationResult, or a sequence of results
        Results of any estimator of the package (all are :class:`EstimationResult`). With a mapping,
        the labels become the index; otherwise the ``method`` names do.
    theta_names : sequence of str, optional
        Column names for the parameters.
    theta_true : sequence of float, optional
        True parameters; adds a ``theta_error`` column.
    """
    import pandas as pd

    if isinstance(results, Mapping):
        labels, items = list(results.keys()), list(results.values())
    else:
        items = list(results)
        labels = None
    for r in items:
        if not isinstance(r, EstimationResult):
            raise ValueError(f"results must contain EstimationResult objects, got {type(r).__name__}")
    if labels is None:
        labels = [r.method for r in items]
    rows = [r.to_dict(theta_names=theta_names, theta_true=theta_true) for r in items]
    return pd.DataFrame(rows, index=labels)
