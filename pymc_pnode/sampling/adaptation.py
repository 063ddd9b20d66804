"""Tuning helpers shared by the within-replica moves.

* :class:`DualAveraging` -- Nesterov dual averaging of a log step size towards a
  target acceptance probability (Hoffman & Gelman 2014, Algorithm 5).
* :class:`WelfordCovariance` -- streaming mean/covariance estimate with the
  shrinkage used by Stan for mass-matrix estimates.
* :class:`DoublingWindows` -- schedule of doubling estimation windows.  PyMC
  does not tell a step method how long tuning will last, so windows simply
  double in length and the last completed window wins.
* :class:`WindowedAdaptation` -- the three together, as every adaptive move of the package tunes
  (random-walk Metropolis, HMC, the Chkrebtii Algorithm-2 proposal): the step by dual averaging, the
  metric from the draws of each closed window.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["DoublingWindows", "DualAveraging", "WelfordCovariance", "WindowedAdaptation"]


class DualAveraging:
    """Dual-averaging adaptation of a positive step size.

    The acceptance probability is assumed to decrease with the step size, as
    for random-walk proposal scales and leapfrog step sizes.

    Parameters
    ----------
    initial_step : float
        Starting step size (> 0).
    target : float
        Target mean acceptance probability in ``(0, 1)``.
    gamma : float, default 0.05
        Regularisation strength towards ``10 * initial_step``.
    t0 : float, default 10.0
        Offset damping the first iterations.
    kappa : float, default 0.75
        Decay exponent of the averaging weights.
    """

    def __init__(
        self,
        initial_step: float,
        target: float,
        gamma: float = 0.05,
        t0: float = 10.0,
        kappa: float = 0.75,
    ) -> None:
        if not 0.0 < target < 1.0:
            raise ValueError(f"target acceptance must lie in (0, 1), got {target!r}.")
        self.target = float(target)
        self.gamma = float(gamma)
        self.t0 = float(t0)
        self.kappa = float(kappa)
        self.restart(initial_step)

    def restart(self, step: float) -> None:
        """Restart the averaging around a new step size (e.g. after a metric change)."""
        self.log_step = math.log(step)
        self.log_step_bar = self.log_step
        # Shrinking towards a *larger* step makes early iterations explore boldly.
        self.mu = math.log(10.0 * step)
        self.h_bar = 0.0
        self.count = 0

    @property
    def step(self) -> float:
        """Step size to use while tuning."""
        return math.exp(self.log_step)

    @property
    def final_step(self) -> float:
        """Averaged step size to use after tuning."""
        return math.exp(self.log_step_bar)

    def update(self, accept_prob: float) -> None:
        """Feed one acceptance probability (NaN counts as 0)."""
        if not math.isfinite(accept_prob):
            accept_prob = 0.0
        self.count += 1
        weight = 1.0 / (self.count + self.t0)
        self.h_bar = (1.0 - weight) * self.h_bar + weight * (self.target - accept_prob)
        self.log_step = self.mu - math.sqrt(self.count) / self.gamma * self.h_bar
        eta = self.count ** (-self.kappa)
        self.log_step_bar = eta * self.log_step + (1.0 - eta) * self.log_step_bar


class WelfordCovariance:
    """Streaming estimate of the mean and (co)variance of replica states.

    Parameters
    ----------
    ndim : int
        Dimension of the states.
    diagonal : bool, default False
        Track only the marginal variances.
    """

    def __init__(self, ndim: int, diagonal: bool = False) -> None:
        self.ndim = int(ndim)
        self.diagonal = bool(diagonal)
        self.reset()

    def reset(self) -> None:
        """Forget all observations."""
        self.n = 0
        self.mean = np.zeros(self.ndim)
        shape = (self.ndim,) if self.diagonal else (self.ndim, self.ndim)
        self._m2 = np.zeros(shape)

    def add(self, x: np.ndarray) -> None:
        """Add one observation."""
        self.n += 1
        delta = x - self.mean
        self.mean += delta / self.n
        if self.diagonal:
            self._m2 += delta * (x - self.mean)
        else:
            self._m2 += np.outer(delta, x - self.mean)

    def estimate(self, shrink: str = "identity") -> np.ndarray:
        """Regularised (co)variance ``w S + ...`` with ``w = n / (n + 5)``, positive definite for small ``n``.

        ``shrink="identity"`` adds ``1e-3 (1 - w) I``, the shrinkage Stan uses for mass matrices of
        unit-scale (unconstrained) parameters; ``shrink="diagonal"`` adds ``(1 - w) diag(S)`` (towards
        the marginal variances, whatever the parameters' scale) and a ``1e-10`` relative jitter.
        """
        if self.n < 2:
            raise ValueError("At least two observations are needed for a covariance estimate.")
        sample = self._m2 / (self.n - 1)
        weight = self.n / (self.n + 5.0)
        identity = 1.0 if self.diagonal else np.eye(self.ndim)  # a diagonal estimate is a vector of variances
        if shrink == "identity":
            return weight * sample + 1e-3 * (1.0 - weight) * identity
        if shrink == "diagonal":
            variances = sample if self.diagonal else np.diag(sample)
            shrunk = weight * sample + (1.0 - weight) * (variances if self.diagonal else np.diag(variances))
            return shrunk + 1e-10 * max(float(np.max(variances)), 1e-300) * identity
        raise ValueError(f"shrink must be 'identity' or 'diagonal', got {shrink!r}")


class DoublingWindows:
    """Tuning windows of lengths ``first, 2 * first, 4 * first, ...``.

    Parameters
    ----------
    first : int, default 100
        Length of the first window.
    """

    def __init__(self, first: int = 100) -> None:
        if first < 1:
            raise ValueError(f"first window length must be >= 1, got {first!r}.")
        self.length = int(first)
        self.position = 0

    def advance(self) -> bool:
        """Count one tuning iteration; return True when a window has just closed."""
        self.position += 1
        if self.position >= self.length:
            self.position = 0
            self.length *= 2
            return True
        return False


class WindowedAdaptation:
    """Step size by dual averaging and a metric re-estimated at the end of doubling windows.

    The tuning schedule shared by the package's adaptive moves: every transition feeds its acceptance
    probability to :class:`DualAveraging` and, with ``adapt_metric``, its end point to a
    :class:`WelfordCovariance`; when a :class:`DoublingWindows` window closes with enough draws,
    :meth:`update` returns the window's regularised (co)variance for the move to use (and restarts
    the estimate), and the move decides how its step restarts under the new metric.

    Parameters
    ----------
    ndim : int
        Dimension of the adapted coordinates.
    step : float
        Initial step (scale or step size).
    target : float
        Target acceptance probability.
    adapt_metric : bool, default True
        Estimate a (co)variance from the draws.
    diagonal : bool, default False
        Only the marginal variances.
    first_window : int, default 100
        Length of the first window.
    shrink : {"identity", "diagonal"}
        Regularisation of the estimate, see :meth:`WelfordCovariance.estimate`.
    """

    def __init__(self, ndim: int, step: float, target: float, *, adapt_metric: bool = True,
                 diagonal: bool = False, first_window: int = 100, shrink: str = "identity") -> None:
        if shrink not in ("identity", "diagonal"):
            raise ValueError(f"shrink must be 'identity' or 'diagonal', got {shrink!r}")
        self.averaging = DualAveraging(step, target)
        self.adapt_metric = bool(adapt_metric)
        self.first_window = int(first_window)
        self.shrink = shrink
        self.windows = DoublingWindows(self.first_window)
        self.draws = WelfordCovariance(ndim, diagonal=diagonal)

    @property
    def step(self) -> float:
        """Step to use while tuning."""
        return self.averaging.step

    @property
    def final_step(self) -> float:
        """Averaged step to use after tuning."""
        return self.averaging.final_step

    def restart(self, step: float) -> None:
        """Restart the step's averaging at ``step`` (a new metric, a tempered replica's wider start)."""
        self.averaging.restart(step)

    def reset_windows(self) -> None:
        """Start the window schedule and the draws afresh (keeps the step)."""
        self.windows = DoublingWindows(self.first_window)
        self.draws.reset()

    def update(self, accept_prob: float, x: np.ndarray) -> np.ndarray | None:
        """Feed one transition ending at ``x``; the new metric estimate when a window has just closed."""
        self.averaging.update(accept_prob)
        if not self.adapt_metric:
            return None
        self.draws.add(np.asarray(x, dtype=np.float64))
        if not self.windows.advance():
            return None
        # a full covariance needs more draws than dimensions to be non-singular
        enough = self.draws.n > (2 if self.draws.diagonal else self.draws.ndim + 1)
        estimate = self.draws.estimate(self.shrink) if enough else None
        self.draws.reset()
        return estimate
