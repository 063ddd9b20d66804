"""Delay differential equations with constant lag, history function and data-driven forcing.

Chkrebtii et al.'s JAK-STAT model (Chkrebtii et al., 2016, eq. 12) has a lagged state ``u(t - tau)`` with an
unknown constant delay ``tau`` and a measured forcing ``EpoR_A(t)``. :class:`DelayODE` handles both by
an augmented ODE: the user's field ``func(y, t, p, y_lag, forcing)`` is compiled as a
:class:`pymc_pnode.ODE` whose parameter vector is ``[p, y_lag, forcing]``, so the generated ``jac_p``
also yields ``df/dy_lag`` (needed for exact gradients) and the forcing costs nothing per step. The
solver supplies, at grid time ``s_n``,

* ``y_lag = phi(s_n - tau)`` (the history) when ``s_n - tau <= t0``, otherwise the linear
  interpolation on the grid of the step-ahead conditional means of Algorithm 1 (a first-order
  quantity, like the solver itself; the authors' code uses the conditional mean too);
* ``forcing`` interpolated linearly from data at ``s_n`` (the authors' code does the same).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytensor

from pymc_pnode.ode import ODE

__all__ = ["DelayODE"]


class _AugmentedField:
    """``func(y, t, p_aug)`` of the augmented ODE: unpacks ``p_aug = [p, y_lag, forcing]``."""

    def __init__(self, func: Callable, n_theta: int, n_states: int, n_forcing: int):
        self.func, self.n_theta, self.n_states, self.n_forcing = func, n_theta, n_states, n_forcing

    def __call__(self, y, t, p_aug):
        k, d = self.n_theta, self.n_states
        p = [p_aug[i] for i in range(k)]
        lag = [p_aug[k + i] for i in range(d)]
        if self.n_forcing:
            forcing = [p_aug[k + d + i] for i in range(self.n_forcing)]
            return self.func(y, t, p, lag, forcing)
        return self.func(y, t, p, lag)


class _HistoryField:
    """``phi(t, p)`` (or ``d phi / dt``) in the ``func(y, t, p)`` convention, for code generation."""

    def __init__(self, history: Callable, n_states: int, derivative: bool):
        self.history, self.n_states, self.derivative = history, n_states, derivative

    def __call__(self, y, t, p):
        out = self.history(t, p)
        if not isinstance(out, (list, tuple)):
            out = [out[i] for i in range(self.n_states)]
        out = [pytensor.tensor.as_tensor_variable(o) + 0.0 * t for o in out]
        if not self.derivative:
            return out
        return [
            pytensor.grad(o, t, disconnected_inputs="ignore", return_disconnected="zero") for o in out
        ]


class DelayODE:
    r"""A delay equation :math:`\dot y(t) = f(y(t), t, p, y(t - \tau), F(t))` with constant delay.

    Parameters
    ----------
    func : callable
        ``func(y, t, p, y_lag)`` or, with ``forcing``, ``func(y, t, p, y_lag, forcing)``, returning
        ``n_states`` PyTensor expressions; ``y_lag[i]`` is :math:`y_i(t - \tau)` and ``forcing[j]`` the
        ``j``-th forcing signal at ``t``. Same operations as for :class:`pymc_pnode.ODE`.
    n_states, n_theta : int
        State and parameter dimensions (``p`` has ``n_theta`` entries).
    delay : float, optional
        A fixed delay :math:`\tau \ge 0`.
    delay_param : int, optional
        Index of :math:`\tau` in ``p`` (the delay is a parameter: it may carry a prior and receives
        exact gradients). Give exactly one of ``delay`` and ``delay_param``.
    history : callable, optional
        ``history(t, p)`` returning ``n_states`` PyTensor expressions: the state for :math:`t \le t_0`.
        Default: the constant history :math:`\phi(t) = y_0` (the JAK-STAT case, where ``y0`` may itself be
        a parameter).
    forcing : tuple or callable, optional
        ``(times, values)`` data (``values`` of shape ``(len(times),)`` or ``(len(times), n_forcing)``),
        interpolated linearly and held constant outside the data range; or a callable mapping an array
        of times to such values.
    t0 : float, default 0.0
        Initial time.

    Raises
    ------
    ValueError
        On invalid dimensions, delay specification or forcing data.
    """

    def __init__(
        self,
        func: Callable,
        n_states: int,
        n_theta: int,
        *,
        delay: float | None = None,
        delay_param: int | None = None,
        history: Callable | None = None,
        forcing: tuple | Callable | None = None,
        t0: float = 0.0,
    ):
        if not callable(func):
            raise ValueError("func must be callable as func(y, t, p, y_lag[, forcing])")
        if (delay is None) == (delay_param is None):
            raise ValueError("give exactly one of delay (a number) and delay_param (an index into p)")
        if delay is not None:
            delay = float(delay)
            if not (np.isfinite(delay) and delay >= 0.0):
                raise ValueError(f"delay must be finite and >= 0, got {delay!r}")
        if delay_param is not None:
            if int(delay_param) != delay_param or not 0 <= delay_param < n_theta:
                raise ValueError(f"delay_param must be an index in [0, {n_theta}), got {delay_param!r}")
            delay_param = int(delay_param)
        if history is not None and not callable(history):
            raise ValueError("history must be callable as history(t, p) or None")
        self.func = func
        self.n_states = int(n_states)
        self.n_theta = int(n_theta)
        self.t0 = float(t0)
        self.delay = delay
        self.delay_param = delay_param
        self.history = history
        self.forcing = forcing
        self._forcing_check = self._forcing_at(np.array([self.t0]))
        self.n_forcing = int(self._forcing_check.shape[1])
        self.augmented = ODE(
            _AugmentedField(func, self.n_theta, self.n_states, self.n_forcing),
            n_states=self.n_states,
            n_theta=self.n_theta + self.n_states + self.n_forcing,
            t0=self.t0,
        )
        self.history_ode = self.history_dt_ode = None
        if history is not None:
            self.history_ode = ODE(_HistoryField(history, self.n_states, False),
                                   self.n_states, self.n_theta, self.t0)
            self.history_dt_ode = ODE(_HistoryField(history, self.n_states, True),
                                      self.n_states, self.n_theta, self.t0)

    def _forcing_at(self, times: np.ndarray) -> np.ndarray:
        times = np.asarray(times, dtype=np.float64)
        if self.forcing is None:
            return np.zeros((times.size, 0))
        if callable(self.forcing):
            vals = np.asarray(self.forcing(times), dtype=np.float64)
            vals = vals.reshape(times.size, -1)
        else:
            try:
                ft, fv = self.forcing
            except (TypeError, ValueError) as err:
                raise ValueError("forcing must be a (times, values) pair or a callable") from err
            ft = np.asarray(ft, dtype=np.float64).reshape(-1)
            fv = np.asarray(fv, dtype=np.float64)
            if fv.ndim == 1:
                fv = fv[:, None]
            if fv.ndim != 2 or fv.shape[0] != ft.size or ft.size < 1:
                raise ValueError("forcing values must have shape (len(times),) or (len(times), n)")
            if np.any(np.diff(ft) <= 0.0) or not np.all(np.isfinite(ft)):
                raise ValueError("forcing times must be finite and strictly increasing")
            vals = np.stack([np.interp(times, ft, fv[:, j]) for j in range(fv.shape[1])], axis=1)
        if not np.all(np.isfinite(vals)):
            raise ValueError("forcing values must be finite")
        return np.ascontiguousarray(vals)

    def forcing_values(self, times: Sequence[float]) -> np.ndarray:
        """The forcing at ``times``, shape ``(len(times), n_forcing)``."""
        return self._forcing_at(np.asarray(times, dtype=np.float64).reshape(-1))

    def validate_y0(self, y0, name: str = "y0") -> np.ndarray:
        """See :meth:`pymc_pnode.ODE.validate_y0`."""
        return self.augmented.validate_y0(y0, name)

    def validate_theta(self, theta, name: str = "theta") -> np.ndarray:
        """``theta`` as float64 ``(n_theta,)``; ``ValueError`` otherwise (including a negative delay)."""
        arr = ODE.validate_theta(self, theta, name)  # shape and finiteness, as for an ODE (uses n_theta only)
        if self.delay_param is not None and arr[self.delay_param] < 0.0:
            tau = arr[self.delay_param]
            raise ValueError(f"the delay {name}[{self.delay_param}] must be >= 0, got {tau}")
        return arr

    def __repr__(self) -> str:
        name = getattr(self.func, "__name__", "func")
        tau = f"delay={self.delay}" if self.delay is not None else f"delay=p[{self.delay_param}]"
        return f"DelayODE({name}, n_states={self.n_states}, n_theta={self.n_theta}, {tau})"

    def __reduce__(self):
        return (_rebuild_delay_ode, (self.func, self.n_states, self.n_theta, self.delay,
                                     self.delay_param, self.history, self.forcing, self.t0))


def _rebuild_delay_ode(func, n_states, n_theta, delay, delay_param, history, forcing, t0):
    return DelayODE(func, n_states, n_theta, delay=delay, delay_param=delay_param,
                    history=history, forcing=forcing, t0=t0)
