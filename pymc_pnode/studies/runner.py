"""Run many independent tasks (fits, posteriors, replicates) on a dask.distributed cluster.

:func:`run_study` sends one function and many small task descriptions to a cluster — a ``LocalCluster`` of
one single-threaded worker process per core by default, or any cluster by its scheduler address — records
each finished task in a :class:`~pymc_pnode.studies.store.StudyStore` as soon as it arrives, and returns one
tidy table. Tasks must be independent and carry their own random seeds, so the table does not depend on
which worker ran what, or on how often a task had to be started.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from pymc_pnode.studies.store import StudyStore, rows_of, task_id

SERIAL = "serial"


class StudyWarning(UserWarning):
    """Some tasks of a study failed after their retries (the study's table lacks their rows)."""


@dataclass
class StudyResult:
    """What a study produced.

    Attributes
    ----------
    table : pandas.DataFrame
        One row per result row of every finished task, with the task's key in the column ``task``, in the
        order of the tasks given.
    failures : dict
        Task key → the error of its last attempt, for tasks that failed after their retries.
    n_run : int
        Tasks executed by this call.
    n_resumed : int
        Tasks found finished in the store and not run again.
    seconds : float
        Wall time of this call.
    """

    table: Any
    failures: dict = field(default_factory=dict)
    n_run: int = 0
    n_resumed: int = 0
    seconds: float = 0.0


def _call(func: Callable, task):
    return rows_of(func(task))


def run_study(
    func: Callable[[Any], Mapping | Sequence[Mapping]],
    tasks: Mapping | Sequence,
    *,
    client=None,
    store=None,
    metadata: Mapping[str, Any] | None = None,
    retries: int = 2,
    warm_up: bool | None = None,
    progress: bool = True,
    description: str = "study",
) -> StudyResult:
    """Run ``func(task)`` for every task, on a dask.distributed cluster, recording results as they finish.

    Parameters
    ----------
    func : callable
        ``func(task)`` returns one result row (a dict of scalars: numbers, bools, strings) or a list of rows.
        It is sent to the workers once (pickled with cloudpickle), so it may be a closure or a callable
        object holding a PyMC model; workers keep it in memory between tasks.
    tasks : mapping or sequence
        Task descriptions (small, picklable: seeds, settings), by key (``int`` or ``str``); a sequence is
        keyed by position.
    client : distributed.Client, str, "serial" or None
        Where to run: ``None`` starts a :func:`local_cluster` (one single-threaded worker process per core;
        closed afterwards); a ``Client``; a scheduler address such as ``"tcp://10.0.0.5:8786"`` (connected
        and closed afterwards); ``"serial"`` runs the tasks one after the other in this process.
    store : str, Path or StudyStore, optional
        Directory of the study's record. Each finished task is written there before the next one is
        recorded, so a crash, an interrupt or a killed worker loses no finished result, and a rerun with
        the same store skips the finished tasks (see :class:`~pymc_pnode.studies.store.StudyStore`).
    metadata : dict, optional
        What the study is; a store that records another study is refused.
    retries : int, default 2
        Extra attempts for a task that raises. A worker that dies is replaced by its nanny and its tasks run
        elsewhere (dask's ``distributed.scheduler.allowed-failures``). Tasks that still fail are reported
        in :attr:`StudyResult.failures`, in the store and by a :class:`StudyWarning`.
    warm_up : bool, optional
        Run the first pending task alone before the others, so that the numba and PyTensor disk caches it
        fills are loaded, not compiled again, by the other workers. Default: only when some machine of the
        cluster runs more worker threads than it has cores — there concurrent cold compiles would compete for
        cores; with at most one worker thread per core (``local_cluster()``) they run side by side in the
        time of one, and warming up would only leave the other workers idle for the first task.
    progress : bool, default True
        Show a progress bar of finished tasks.
    description : str
        Label of the progress bar and prefix of the dask task keys.

    Returns
    -------
    StudyResult
    """
    start = time.perf_counter()
    if not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be a non-negative integer, got {retries!r}")
    if not (client is None or isinstance(client, str) or _is_client(client)):
        raise ValueError(f"client must be a distributed.Client, a scheduler address, 'serial' or None, got {client!r}")
    keyed = dict(tasks) if isinstance(tasks, Mapping) else dict(enumerate(tasks))
    ids = {task_id(key): key for key in keyed}
    if len(ids) != len(keyed):
        raise ValueError("tasks: two keys have the same text (e.g. 1 and '1'); keys must be distinct")
    if not isinstance(store, StudyStore):
        store = StudyStore(store, metadata)
    done = store.finished()
    pending = [key for tid, key in ids.items() if tid not in done]
    failures: dict = {}
    bar = _progress_bar(len(pending), description, progress)

    def finished(key, rows) -> None:
        store.record(key, rows)
        bar.update(1)

    def failed(key, error: BaseException, trace: str, attempts: int) -> None:
        failures[key] = f"{type(error).__name__}: {error}"
        store.record_failure(key, failures[key], trace, attempts)
        bar.update(1)
        bar.set_postfix(failed=len(failures))

    try:
        if client == SERIAL:
            _run_serial(func, keyed, pending, retries, finished, failed)
        elif pending:
            _run_distributed(func, keyed, pending, client, retries, warm_up, description, finished, failed)
    finally:
        bar.close()
    if failures:
        warnings.warn(f"{len(failures)} of {len(keyed)} tasks of {description!r} failed after {retries} retries "
                      f"(first: {next(iter(failures))!r}: {next(iter(failures.values()))}); their rows are "
                      "missing from the table; a rerun with the same store tries them again", StudyWarning,
                      stacklevel=2)
    return StudyResult(table=store.table(order=keyed), failures=failures, n_run=len(pending),
                       n_resumed=len(keyed) - len(pending), seconds=time.perf_counter() - start)


def _run_serial(func, keyed, pending, retries, finished, failed) -> None:
    for key in pending:
        for attempt in range(retries + 1):
            try:
                rows = _call(func, keyed[key])
            except Exception as error:  # noqa: BLE001 - recorded and reported, as on a cluster
                if attempt == retries:
                    failed(key, error, traceback.format_exc(), attempt + 1)
            else:
                finished(key, rows)
                break


def _run_distributed(func, keyed, pending, client, retries, warm_up, description, finished, failed) -> None:
    from distributed import as_completed

    client, owned = _connect(client)
    try:
        shared_func = client.scatter(func, broadcast=True, hash=False)
        prefix = f"{description.replace(' ', '_')}-{os.getpid()}-{time.time_ns()}"

        def submit(key):
            return client.submit(_call, shared_func, keyed[key], key=f"{prefix}-{task_id(key)}", retries=retries,
                                 pure=False)

        if warm_up is None:
            warm_up = _oversubscribed(client)
        first = 1 if warm_up and len(pending) > 1 else 0
        batches = [pending[:first], pending[first:]] if first else [pending]
        for batch in batches:
            futures = {submit(key): key for key in batch}
            try:
                for future in as_completed(futures):
                    key = futures.pop(future)
                    if future.status == "finished":
                        finished(key, future.result())
                    else:
                        error = future.exception()
                        trace = "".join(traceback.format_tb(future.traceback())) if future.traceback() else ""
                        failed(key, error, trace, retries + 1)
                    future.release()
            finally:
                client.cancel(list(futures))
    finally:
        if owned:
            _close(client)


def _machine() -> tuple[str, int]:
    return socket.gethostname(), os.cpu_count() or 1


def _oversubscribed(client) -> bool:
    """Whether some machine of the cluster runs more worker threads than it has cores."""
    threads = client.nthreads()
    load: dict[str, list[int]] = {}
    for address, (host, cores) in client.run(_machine).items():
        load.setdefault(host, [0, cores])[0] += threads.get(address, 1)
    return any(used > cores for used, cores in load.values())


# Housekeeping intervals of the workers and nannies of :func:`local_cluster` (dask's defaults: 20 ms, 500 ms, 100 ms).
_QUIET_HOUSEKEEPING = {
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "5s",
    "distributed.worker.memory.monitor-interval": "1s",
}


def local_cluster(n_workers: int | None = None):
    """A ``distributed.LocalCluster`` for studies: one single-threaded worker process per core (or
    ``n_workers``), no dashboard, and dask defaults changed where they slow PyMC fits down.

    - dask sets ``MALLOC_TRIM_THRESHOLD_=65536`` in its workers: Fenrir NUTS fits took 34–36 s with it against
      28–31 s without (``benchmarks/study_runner.py``), memory being returned to the system and faulted back;
    - without a dashboard the workers' statistical profiler, which samples the running task's stack every 10 ms
      while holding the GIL, serves nothing;
    - the periodic housekeeping of every worker and nanny (event-loop health tick every 20 ms, system monitor
      every 0.5 s, memory monitor every 0.1 s) runs on the cores the fits use: a CPU-bound Python task took
      5.01 s per task on a cluster of 2 against 4.91 s in a ``ProcessPoolExecutor(2)``, and 4.85 s with the
      intervals below (medians of 16 tasks; ``docs/benchmarks.md``, "The study runner"). Memory limits are
      still enforced, once a second.
    """
    import dask
    from distributed import LocalCluster

    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}))
    environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    settings = {"distributed.nanny.pre-spawn-environ": environ, "distributed.worker.profile.enabled": False,
                **_QUIET_HOUSEKEEPING}
    with dask.config.set(settings):  # read by each nanny when it is created, kept for its restarts
        return LocalCluster(n_workers=n_workers or os.cpu_count() or 1, threads_per_worker=1, processes=True,
                            dashboard_address=None)


def _connect(client):
    """A ``(client, owned)`` pair: the given client, or one started here that the caller must close."""
    from distributed import Client

    if client is None:
        return Client(local_cluster()), True
    if isinstance(client, str):
        return Client(client), True
    return client, False


def _is_client(client) -> bool:
    try:
        from distributed import Client
    except ImportError:
        return False
    return isinstance(client, Client)


def _close(client) -> None:
    cluster = client.cluster
    client.close()
    if cluster is not None:
        cluster.close()


def _progress_bar(total: int, description: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=description, unit="task", disable=not enabled)
