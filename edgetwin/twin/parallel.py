"""Independent work — ensemble members, evaluation episodes, what-if cells — in parallel.

One function, `run_tasks`, maps a module-level function over argument tuples: in this process
(``workers=1``), on a local process pool (the default: one worker per core this process may use),
or on a Ray cluster (``ray_address``; ``pip install -e ".[ray]"``). Each task's result depends on
its arguments only (every task carries its own seed), so the three give the same results, in the
order of the tasks.

Why processes, not threads: a member fit is Python-bound (SB3/imitation loops around small MLPs),
so threads would share one interpreter lock.

Torch threads per worker: the caller's ``torch.get_num_threads()`` unless told otherwise. Not
``cores // workers``, because torch's result depends on its thread count (a matrix product split
over two threads sums in another order: a member fitted with 2 threads differs in the last bits
from one fitted with 1, and GAIL amplifies that), and the same seed must give the same twin
wherever it runs. The CLI sets 1 thread before it fits (small MLPs on a shared 2-core machine run
fastest single-threaded), so its workers use 1 each and do not oversubscribe the cores.

Ray is imported only when ``ray_address`` is given; without it nothing here touches Ray.

Pool tasks travel with cloudpickle (as Ray's do), so a task may carry a closure, e.g. a what-if
policy factory over the twin; a module-level function still travels by reference. The arguments
every task shares (a log) go once through a temporary file in the system's temp directory, which
each worker reads once: a table that large should sit in a worker's memory once, not also as the
bytes it arrived in.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from typing import Any

from tqdm.auto import tqdm

from edgetwin.contract.errors import InputError

__all__ = ["available_cores", "check_ray", "resolve_workers", "run_tasks"]


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, else ``os.cpu_count()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def resolve_workers(workers: int | None, n_tasks: int) -> int:
    """Worker processes for ``n_tasks`` tasks: ``None``/0 = one per available core; never more
    than there are tasks; 1 = serial, in this process.

    Raises:
        InputError: a negative count.
    """
    if workers is not None and workers < 0:
        raise InputError(f"workers must be >= 0 (0: one per core), got {workers}", "--workers")
    n = available_cores() if not workers else int(workers)
    return max(1, min(n, max(1, n_tasks)))


def _init_worker(torch_threads: int) -> None:
    """Pool-worker start-up: pin torch (and the BLAS/OpenMP pools under numpy) to its share of cores."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(torch_threads)
    import torch

    torch.set_num_threads(torch_threads)


#: the shared arguments this pool worker last read: ``(path, tuple)`` (`_cloud_call`)
_SHARED: tuple[str, tuple[Any, ...]] | None = None


def _cloud_call(shared_path: str, payload: bytes) -> Any:
    """A pool task: ``fn(*shared, *args)``, ``shared`` read from the file ``run_tasks`` wrote (once
    per worker and pool: a worker's later tasks reuse it) and ``(fn, args)`` cloudpickled.

    Not an artifact (DESIGN.md: artifacts are data): the file is this process's own ``mkstemp``
    (mode 0600, removed when the pool ends) and the payload comes from its pipe; neither is a path
    or a message a user or another party can supply, as Ray's and multiprocessing's own pickles."""
    global _SHARED
    import cloudpickle

    if _SHARED is None or _SHARED[0] != shared_path:
        _SHARED = None  # the previous pool's tuple goes before this one is read
        with open(shared_path, "rb") as fh:
            _SHARED = (shared_path, tuple(cloudpickle.load(fh)))
    fn, args = cloudpickle.loads(payload)
    return fn(*_SHARED[1], *args)


def _ray_call(fn: Callable[..., Any], torch_threads: int, *args: Any) -> Any:
    """A task on a Ray worker: the same thread setting as a pool worker, then ``fn(*args)`` (Ray
    resolves object references passed as top-level arguments before the call)."""
    import torch

    torch.set_num_threads(torch_threads)
    return fn(*args)


def run_tasks(
    fn: Callable[..., Any],
    tasks: Sequence[tuple[Any, ...]],
    workers: int | None = 1,
    ray_address: str | None = None,
    progress: bool = False,
    desc: str = "tasks",
    shared: tuple[Any, ...] = (),
    on_result: Callable[[int, Any], None] | None = None,
    torch_threads: int | None = None,
    beside: Executor | None = None,
    on_idle: Callable[[], None] | None = None,
) -> list[Any]:
    """``[fn(*shared, *task) for task in tasks]``, serially, on a process pool or on Ray.

    Args:
        fn: a module-level function (pickled by reference for the pool); it must seed everything
            it samples from its arguments, so that where it runs does not change its result.
        tasks: one argument tuple per task.
        workers: processes of the local pool; ``None``/0 = one per available core, 1 = serial in
            this process (no pickling). Ignored when ``ray_address`` is given.
        ray_address: a Ray cluster (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``) or
            ``"local"`` for a local Ray instance; when Ray is already initialised in this
            process it is used as it is.
        progress: a tqdm bar over finished tasks.
        shared: leading arguments common to every task (a large table, a layout): sent once per
            worker on Ray (``ray.put``); on the pool, pickled once into a temporary file that each
            worker reads once. Not as bytes with each task: pickling a million-row log once per
            task held one copy per task in this process (1.8 GB for a 5-member fit), and one
            pickle sent with every task still sat, as bytes, beside the unpickled table in this
            process and in every worker for as long as a task ran (0.35 GiB each at 1M rows).
        on_result: called in this process as ``on_result(i, result)`` when task ``i`` finishes
            (e.g. to checkpoint it), in completion order.
        torch_threads: torch threads in each worker (default: this process's count, so that a
            task gives the same result as in this process).
        beside: a process pool already running (e.g. one warm worker on a spare core, started with
            `_init_worker` at this process's torch thread count): the tasks are shared between this
            process and it (`_run_beside`) instead of ``workers``; the same results, in task order.
            Why: a fresh pool's workers each import torch and the fitting code first (seconds each),
            and this process would only wait for them.
        on_idle: with ``beside``, called once when this process has no task left to start and waits
            for the pool's (so that the caller may use its core meanwhile).

    Returns:
        the results in the order of ``tasks``.

    Raises:
        InputError: ``ray_address`` given but Ray is not installed, or it cannot connect.
    """
    if not tasks:
        return []
    if torch_threads is None:
        import torch

        torch_threads = torch.get_num_threads()
    if ray_address is not None:
        return _run_ray(fn, tasks, ray_address, progress, desc, shared, on_result, torch_threads)
    if beside is not None and len(tasks) > 1:
        return _run_beside(fn, tasks, beside, progress, desc, shared, on_result, on_idle)
    n = resolve_workers(workers, len(tasks))
    results: list[Any] = [None] * len(tasks)
    bar = tqdm(total=len(tasks), desc=desc, disable=not progress)
    if n == 1:
        for i, t in enumerate(tasks):
            results[i] = fn(*shared, *t)
            if on_result is not None:
                on_result(i, results[i])
            bar.update(1)
        bar.close()
        return results
    # spawn, not fork: a forked child inherits torch's and OpenMP's thread state mid-flight
    ctx = mp.get_context("spawn")
    import cloudpickle

    fd, shared_path = tempfile.mkstemp(prefix="edgetwin-shared-", suffix=".pkl")
    try:
        with os.fdopen(fd, "wb") as fh:
            cloudpickle.dump(tuple(shared), fh)
        with ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=_init_worker,
                                 initargs=(torch_threads,)) as pool:
            futures = {pool.submit(_cloud_call, shared_path, cloudpickle.dumps((fn, tuple(t)))): i
                       for i, t in enumerate(tasks)}
            for fut in as_completed(futures):
                i = futures[fut]
                results[i] = fut.result()
                if on_result is not None:
                    on_result(i, results[i])
                bar.update(1)
    finally:
        os.unlink(shared_path)
    bar.close()
    return results


def _run_beside(
    fn: Callable[..., Any],
    tasks: Sequence[tuple[Any, ...]],
    pool: Executor,
    progress: bool,
    desc: str,
    shared: tuple[Any, ...],
    on_result: Callable[[int, Any], None] | None,
    on_idle: Callable[[], None] | None = None,
) -> list[Any]:
    """`run_tasks` on this process and ``pool`` together: this process takes tasks from the front,
    the pool one at a time from the back, until they meet (two members: one each).

    Each task's result depends on its arguments only, so who ran it does not change it; the pool's
    worker must run torch at this process's thread count (`_init_worker`), as a pool's do.
    ``on_result`` is called in this process, for the pool's tasks when this process looks (between
    its own tasks, then while it waits)."""
    import cloudpickle

    results: list[Any] = [None] * len(tasks)
    bar = tqdm(total=len(tasks), desc=desc, disable=not progress)

    def record(i: int, value: Any) -> None:
        results[i] = value
        if on_result is not None:
            on_result(i, value)
        bar.update(1)

    fd, shared_path = tempfile.mkstemp(prefix="edgetwin-shared-", suffix=".pkl")
    try:
        with os.fdopen(fd, "wb") as fh:
            cloudpickle.dump(tuple(shared), fh)
        lo, hi = 0, len(tasks) - 1

        def submit(i: int) -> Future[Any]:
            return pool.submit(_cloud_call, shared_path, cloudpickle.dumps((fn, tuple(tasks[i]))))

        running: tuple[int, Future[Any]] | None = (hi, submit(hi))
        while lo < hi or running is not None:
            if running is not None and (running[1].done() or lo >= hi):
                if lo >= hi and on_idle is not None:
                    on_idle()
                    on_idle = None
                record(running[0], running[1].result())
                running = None
                if lo < hi - 1:
                    hi -= 1
                    running = (hi, submit(hi))
                continue
            if lo < hi:
                record(lo, fn(*shared, *tasks[lo]))
                lo += 1
    finally:
        os.unlink(shared_path)
    bar.close()
    return results


def check_ray(address: str) -> None:
    """Before any long work: Ray is installed and something answers at ``address``.

    Raises:
        InputError: naming ``--ray``.
    """
    try:
        import ray  # noqa: F401
    except ImportError:
        raise InputError('Ray is not installed; install the extra: pip install -e ".[ray]"', "--ray") from None
    _check_reachable(address)


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a ``host:port`` / ``ray://host:port`` nobody answers (Ray itself retries for
    minutes before it gives up)."""
    if address in ("local", "auto"):
        return
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"expected a Ray address like host:6379, ray://host:10001, auto or local; got {address!r}", "--ray")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise InputError(f"no Ray cluster answers at {address!r} ({e})", "--ray") from None


def _run_ray(
    fn: Callable[..., Any],
    tasks: Sequence[tuple[Any, ...]],
    address: str,
    progress: bool,
    desc: str,
    shared: tuple[Any, ...],
    on_result: Callable[[int, Any], None] | None,
    torch_threads: int,
) -> list[Any]:
    try:
        import ray
    except ImportError:
        raise InputError(
            'Ray is not installed; install the extra: pip install -e ".[ray]"', "--ray"
        ) from None
    if not ray.is_initialized():
        _check_reachable(address)
        try:
            if address == "local":
                ray.init(num_cpus=available_cores(), include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise InputError(f"cannot connect to the Ray cluster at {address!r} ({e})", "--ray") from None
    remote = ray.remote(num_cpus=1)(_ray_call)
    shared_refs = [ray.put(s) for s in shared]
    refs = [remote.remote(fn, torch_threads, *shared_refs, *t) for t in tasks]
    index = {r: i for i, r in enumerate(refs)}
    results: list[Any] = [None] * len(tasks)
    bar = tqdm(total=len(tasks), desc=desc, disable=not progress)
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        i = index[done[0]]
        results[i] = ray.get(done[0])
        if on_result is not None:
            on_result(i, results[i])
        bar.update(1)
    bar.close()
    return results

