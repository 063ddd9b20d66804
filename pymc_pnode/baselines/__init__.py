"""Classical baseline estimators: RK least squares, multiple shooting, the direct method."""
