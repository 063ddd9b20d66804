"""Numba kernels of the square-root ODE filters (forward pass, smoothing, sampling)."""
