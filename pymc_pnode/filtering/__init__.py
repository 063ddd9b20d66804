"""Numba kernels of the square-root ODE filters, one module per operation (each with its adjoint):
``prior``, ``predict``, ``update``, ``calibration``, ``stepping``, ``odefilter`` (the forward pass),
``smoother`` (backward kernels), ``data_update`` and ``fenrir`` (the likelihood); see docs/architecture.md."""
