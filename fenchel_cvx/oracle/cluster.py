"""The Dask cluster the oracle starts on this machine: single-threaded workers, kept quiet.

``OracleBackend(n_jobs=k)`` (and the oracle's benchmarks) solve a block's independent pieces on
a ``LocalCluster`` of ``k`` worker processes of one thread each (docs/oracle.md). Each task keeps
its worker's core busy for seconds to minutes: the rows of a hidden W-block (``dask_rows``;
the paper's Sec. 4.5.2, eqs. (17) and (19)), a chunk of a block's columns. Dask's defaults are
made for interactive clusters, and wake every process many times a second, which costs a task
nothing while a core is free and takes its core from it once every core has a worker.
:data:`QUIET` turns them off in the clusters that :func:`local_cluster` starts:

* the workers' statistical profiler, which samples the running task's stack every 10 ms (for
  the dashboard's profile page). With it, each of 2 workers solving half of MNIST's W_0 rows
  (m = 60,000) spent 23.7-24.0 s of CPU where it spends 21.8-22.2 s without it (2-core Intel
  Xeon VM, 2026-12-05);
* the event loops' tick (every 20 ms; a second here), which measures how late each loop runs
  (a log line past 3 s, a figure for the dashboard);
* work stealing, which moves queued tasks between workers: the rows' shares are placed on the
  worker that keeps their Grams, and each worker runs one task at a time.

A cluster of your own (``OracleBackend(client=...)``) keeps its settings; to get the same rate,
start its workers and its scheduler with the same ones: ``dask.config.set(QUIET)`` around
``LocalCluster``, or the environment variables
``DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False``,
``DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL=1s`` and
``DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING=False``.
"""

from __future__ import annotations

from typing import Any

from ..heap import freed_memory_kept, keep_freed_memory

#: the Dask settings of the clusters this package starts (the module doc)
QUIET: dict[str, Any] = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.scheduler.work-stealing": False,
}


def local_cluster(workers: int) -> tuple[Any, Any]:
    """``(client, cluster)``: a ``LocalCluster`` of ``workers`` single-threaded worker processes
    with :data:`QUIET`'s settings, every worker up, each keeping its freed memory where this
    process does (``heap.keep_freed_memory``). Close the client, then the cluster."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    import dask
    from distributed import Client, LocalCluster

    client = None
    with dask.config.set(QUIET):
        cluster = LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
        )
    try:
        client = Client(cluster)
        client.wait_for_workers(workers)
        if freed_memory_kept():
            client.run(keep_freed_memory)
    except BaseException:
        if client is not None:
            client.close()
        cluster.close()
        raise
    return client, cluster
