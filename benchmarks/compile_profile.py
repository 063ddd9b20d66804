"""Where the cold compile of a Fenrir kernel goes: LLVM time per compiled function.

Compiles ``fenrir_kernel(q, d)`` into an empty numba cache (run it with ``NUMBA_CACHE_DIR`` pointing to a new
directory, and ``NUMBA_LLVM_PASS_TIMINGS=1`` so that numba records LLVM's pass timings), then lists every
package function numba compiled on the way with the LLVM time of its library (optimisation passes and object
emission), largest first, and the kernel's own pass breakdown. The rest of the wall time is numba's front end
(typing, lowering).

Run: ``NUMBA_CACHE_DIR=$(mktemp -d) NUMBA_LLVM_PASS_TIMINGS=1 python benchmarks/compile_profile.py [--order 3]
[--states 2] [--structure dense|diagonal|isotropic]`` (the block structures share one kernel per order).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import time

import numba as nb
from numba.core.registry import CPUDispatcher


def llvm_seconds(cres) -> float:
    timings = (cres.metadata or {}).get("llvm_pass_timings")
    if timings is None:
        return 0.0
    match = re.search(r"Total time: ([0-9.]+)", timings.summary())
    return float(match.group(1)) if match else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--order", type=int, default=3)
    parser.add_argument("--states", type=int, default=2)
    parser.add_argument("--structure", choices=["dense", "diagonal", "isotropic"], default="dense")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    if not os.environ.get("NUMBA_LLVM_PASS_TIMINGS"):
        sys.exit("set NUMBA_LLVM_PASS_TIMINGS=1 (and NUMBA_CACHE_DIR to a new directory)")
    import pymc_pnode
    from pymc_pnode.filtering.fenrir import fenrir_kernel

    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
          f"numba {nb.__version__}, pymc_pnode {pymc_pnode.__version__}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    start = time.perf_counter()
    kernel = fenrir_kernel(args.order, args.states, args.structure)
    wall = time.perf_counter() - start
    rows, seen = [], set()
    for module in list(sys.modules.values()):
        if not getattr(module, "__name__", "").startswith("pymc_pnode"):
            continue
        for name, obj in vars(module).items():
            dispatcher = getattr(obj, "_dispatcher", None) or obj  # deferred kernels (_jit.CompiledOnFirstUse)
            if isinstance(dispatcher, CPUDispatcher) and id(dispatcher) not in seen:
                seen.add(id(dispatcher))
                rows += [(llvm_seconds(cres), f"{module.__name__}.{name}") for cres in dispatcher.overloads.values()]
    kernel_cres = next(iter(kernel.overloads.values()))
    label = f"fenrir_kernel({args.order}, {args.states}, {args.structure!r})"
    rows.append((llvm_seconds(kernel_cres), f"the kernel {label} itself"))
    rows.sort(reverse=True)
    print(f"\n{label} into this cache: {wall:.1f} s wall; LLVM in all "
          f"{sum(r[0] for r in rows):.1f} s\n")
    print("| compiled function (one row per specialisation) | LLVM s |")
    print("| --- | --- |")
    for seconds, name in rows[: args.top]:
        print(f"| {name} | {seconds:.2f} |")
    print("\nThe kernel's own LLVM passes:\n```")
    for line in kernel_cres.metadata["llvm_pass_timings"].summary(topn=8).splitlines():
        print(line if len(line) <= 110 else line[:100] + " …")  # mangled names run to thousands of characters
    print("```")


if __name__ == "__main__":
    main()
