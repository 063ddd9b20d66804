"""PyMC likelihood blocks built on ODE solvers (Fenrir, Chkrebtii, discretisation-error models)."""
