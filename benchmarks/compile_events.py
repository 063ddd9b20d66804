"""Seconds numba spends compiling each function on the way to a Fenrir kernel, from numba's compile events.

Compiles ``fenrir_kernel(q, d)`` (into an empty cache: run with ``NUMBA_CACHE_DIR`` and ``PYMC_PNODE_CACHE_DIR``
pointing to new directories) and lists the compiled functions by exclusive seconds (their own compile, without the
functions compiled while typing them) with the inclusive seconds beside. Unlike ``compile_profile.py`` (LLVM time per
library) it needs no LLVM pass timings and shows numba's front end too: a function that a kernel force-inlines is
also compiled on its own, and appears here with that cost.

Run: ``NUMBA_CACHE_DIR=$(mktemp -d) PYMC_PNODE_CACHE_DIR=$(mktemp -d) python benchmarks/compile_events.py
[--order 3] [--states 2] [--top 8]``.
"""

from __future__ import annotations

import argparse
import time

from numba.core import event


class _Recorder(event.Listener):
    def __init__(self):
        self.records = []  # (start or end, time, function name)

    def on_start(self, ev):
        dispatcher = ev.data.get("dispatcher") if ev.data else None
        name = getattr(getattr(dispatcher, "py_func", None), "__qualname__", str(dispatcher))
        self.records.append((True, time.perf_counter(), name))

    def on_end(self, ev):
        self.records.append((False, time.perf_counter(), ""))


def exclusive_times(records) -> list[tuple[float, float, str]]:
    """(exclusive s, inclusive s, name) per compile, from nested start/end records."""
    stack, rows = [], []
    for is_start, t, name in records:
        if is_start:
            stack.append([t, name, 0.0])
            continue
        started, name, nested = stack.pop()
        inclusive = t - started
        if stack:
            stack[-1][2] += inclusive
        rows.append((inclusive - nested, inclusive, name))
    return sorted(rows, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--order", type=int, default=3)
    parser.add_argument("--states", type=int, default=2)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    recorder = _Recorder()
    event.register("numba:compile", recorder)
    from pymc_pnode.filtering.fenrir import fenrir_kernel

    start = time.perf_counter()
    fenrir_kernel(args.order, args.states)
    print(f"wall {time.perf_counter() - start:.1f} s")
    for exclusive, inclusive, name in exclusive_times(recorder.records)[: args.top]:
        print(f"excl {exclusive:7.2f}  incl {inclusive:7.2f}  {name}")


if __name__ == "__main__":
    main()
