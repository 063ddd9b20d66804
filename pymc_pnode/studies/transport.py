"""PyMC models that keep their custom distributions when they travel to another process.

``pm.CustomDist`` (which ``pn.Fenrir`` is built on) creates a new random-variable class per distribution and
registers its log-density, log-CDF and support point with PyMC's dispatchers in the process that built the model.
cloudpickle recreates the class in a dask worker, but not the registrations, so a worker that builds the
model's log-density (``pm.sample`` does) fails with "Logprob method not implemented for CustomDist_…". A
:class:`PortableModels` bundle carries the registered functions along and registers them again on arrival.
"""

from __future__ import annotations

from pymc.distributions.custom import CustomDistRV, CustomSymbolicDistRV
from pymc.distributions.distribution import _support_point
from pymc.logprob.abstract import _logcdf, _logprob

_DISPATCHERS = {"logprob": _logprob, "logcdf": _logcdf, "support_point": _support_point}


def custom_registrations(*models) -> list[tuple[type, dict]]:
    """The dispatcher registrations of every custom random-variable class of the models' variables."""
    found: dict[type, dict] = {}
    for model in models:
        for rv in model.basic_RVs:
            op_type = type(rv.owner.op)
            if issubclass(op_type, (CustomDistRV, CustomSymbolicDistRV)) and op_type not in found:
                found[op_type] = {name: dispatcher.registry[op_type] for name, dispatcher in _DISPATCHERS.items()
                                  if op_type in dispatcher.registry}
    return list(found.items())


def register(registrations: list[tuple[type, dict]]) -> None:
    """Register again, in this process, what :func:`custom_registrations` collected (where missing)."""
    for op_type, functions in registrations:
        for name, function in functions.items():
            if op_type not in _DISPATCHERS[name].registry:
                _DISPATCHERS[name].register(op_type)(function)


class PortableModels:
    """Models (a mapping of names to ``pm.Model``) that can be pickled into another process with their custom
    distributions working there."""

    def __init__(self, **models):
        self.models = models

    def __getitem__(self, name: str):
        return self.models[name]

    def __getstate__(self):
        return {"models": self.models, "registrations": custom_registrations(*self.models.values())}

    def __setstate__(self, state):
        register(state["registrations"])
        self.models = state["models"]
