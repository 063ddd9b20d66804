"""Keep freed memory for the next evaluation: glibc's allocator settings for repeated solves.

Every solve and likelihood evaluation allocates its run's arrays (megabytes on long grids) and frees them.
With glibc's default, adaptive thresholds, such blocks can come from freshly mapped pages, or from heap the
allocator has just handed back to the system, on every evaluation: each touched 4 KiB page is then a page
fault. Measured (docs/benchmarks.md, "Memory between evaluations"): ≈ 1100 minor page faults per 2000-step
IWP(5) solve of a 2-state ODE, and 3.1–3.3 µs per step where 2.2–2.3 were possible. Fixed thresholds —
blocks up to 32 MiB from the heap, and the heap trimmed only when 128 MiB are free at its top — keep the
blocks between evaluations, at the cost of at most that much freed memory held by the process. Applied once,
at import, on Linux with glibc; ``PYMC_PNODE_MALLOC=default`` leaves the allocator as it is.
"""

from __future__ import annotations

import ctypes
import os
import platform

# mallopt parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 128 << 20


def tune_allocator() -> bool:
    """Set glibc's mmap and trim thresholds for repeated evaluations; True if they were set."""
    if os.environ.get("PYMC_PNODE_MALLOC", "").lower() == "default":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD,
                                                                              TRIM_THRESHOLD_BYTES))
