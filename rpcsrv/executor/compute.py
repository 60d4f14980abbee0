"""The compute policy: how many model runs compute at once, and with how many BLAS threads each.

Every session runs its calls in a worker thread of its own, and numpy's BLAS (OpenBLAS) would start
as many threads per product as the machine has cores: K sessions then ask for K x cores threads on
``cores`` cores, and the board does less work in total the more sessions compute.  So a
model run (``GraphExecutorModule.run``) is a *job*:

* at most ``CORES`` jobs compute at once (a semaphore; the others wait in their worker thread, so
  small calls of other sessions, which are not jobs, still find the interpreter free);
* the BLAS library's thread count is set when a job starts, to ``max(1, CORES // running jobs)``:
  one job alone uses every core, several share them, and (jobs) x (BLAS threads) never exceeds the
  cores; and a job takes more than one BLAS thread only for cores no other process kept busy lately
  (``/proc/stat``'s busy time less this process's own, over the last tenth of a second or more: see
  :class:`OthersBusy`).  OpenBLAS's thread count
  is process-wide, so this is one setting for all jobs, changed
  (through threadpoolctl's controller, a cheap call) only when it differs from the current one.

In a native worker process (``rpcsrv.native``) the slots are the server's: the worker's policy is
*remote* (the ``slots`` of :meth:`ComputePolicy.configure`), a job there asks the server for a slot and its
thread count over the worker's socket, and the server holds the slot in its own policy for it.  So sessions whose models
compute in worker processes share the same cores' slots as those computing in server threads.

More BLAS threads are not always faster: a model of many small products (ShuffleNet) ran 20% slower
with 2 threads than with 1 on an idle 2-core machine.  So a job may bring a :class:`ThreadChoice`
(each graph executor has one): while the policy allows more than one thread, its first runs alternate
between one thread and the allowed count, and from then on it uses whichever was faster.

A job inside a job (a VM function that runs a graph executor, a profiler around a call) is part of
the outer one: ``job()`` is reentrant per thread and takes no second slot.

Jobs that compute in this interpreter run one at a time (``ComputeSettings.interpreter_jobs``), each with the BLAS
threads of every core left free; only jobs that compute elsewhere (a native worker's, held here with
``job(local=False)``) take the other slots.  Two model runs in two threads of one interpreter contend
for its lock at every kernel call: ShuffleNet, 78 kernel calls of 20-600 us, ran 0.8x as many runs
per second with 2 threads as with 1, and a K-session RPC loop fell to 0.78x of one session at K=32; one
at a time, K=2..32 ran 0.99-1.13x of one session.  A BLAS-bound model (ResNet-50) lost nothing: two runs
at once with 1 BLAS thread each did no more than one with 2 threads.

``fixed_threads(n)`` pins the BLAS threads per job (benchmarks compare 1 and 2 threads with it);
``None`` leaves the policy in charge.  How the process computes (:class:`ComputeSettings`: the priority of
its computing threads, BLAS threads pinned for the whole process, jobs per interpreter) is set once by
whoever owns the process, before its first job: a server from its options, a native worker from its start
message (:meth:`ComputePolicy.configure`); a program that merely uses the executor keeps the defaults,
which the environment may set (``rpcsrv.config.environment``).  Without threadpoolctl the policy only
limits concurrency.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from ..config import environment

#: the shortest window over which other processes' CPU use is measured, and how long a reading is used
BUSY_WINDOW = 0.1

#: cores this process may run on
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass(frozen=True)
class ComputeSettings:
    """How one process computes.

    * ``nice``: how much lower the threads that compute run than the one that answers (a nice increment;
      0: no change): a server's event loop answers every session's small calls while jobs hold the cores
      (``ComputePolicy._yield_to_event_loop``), a native worker's computing thread yields to its server;
    * ``blas_threads``: BLAS threads per job, pinned for the whole process (None: the policy's choice; a
      deployment's choice, and the concurrency benchmark's single-thread reference);
    * ``interpreter_jobs``: jobs that compute in this interpreter at once (see the module doc; more for a
      deployment whose models are BLAS-bound enough to gain from it).
    """

    nice: int = 0
    blas_threads: Optional[int] = None
    interpreter_jobs: int = 1

    @classmethod
    def from_environment(cls, nice: str = "") -> "ComputeSettings":
        """The settings the environment gives (``nice``: the variable that sets the priority, if any)."""
        pinned = environment.count("RPCSRV_BLAS_THREADS")
        return cls(nice=(environment.count(nice) or 0) if nice else 0,
                   blas_threads=None if pinned is None else max(1, pinned),
                   interpreter_jobs=max(1, environment.count("RPCSRV_INTERPRETER_JOBS") or 1))


class _Blas:
    """Get/set the BLAS libraries' thread count (threadpoolctl's controllers, found once)."""

    def __init__(self) -> None:
        self._libs: Optional[list] = None
        self.current: Optional[int] = None

    def libs(self) -> list:
        if self._libs is None:
            try:
                import numpy  # noqa: F401  (its BLAS must be loaded before threadpoolctl looks)
                from threadpoolctl import ThreadpoolController
            except ImportError:
                self._libs = []
            else:
                self._libs = list(ThreadpoolController().select(user_api="blas").lib_controllers)
        return self._libs

    def set(self, n: int) -> None:
        if n != self.current:
            for lib in self.libs():
                lib.set_num_threads(n)
            self.current = n


class ThreadChoice:
    """Which BLAS thread count runs one model fastest, learned from its own runs.

    While the policy allows ``share`` > 1 threads, runs alternate between 1 and ``share`` until each has
    ``TRIALS`` timed runs (a model's first run is not timed: it pays one-off costs); then the faster
    median wins for good, more threads only by ``MARGIN`` (``best``: 1, or "as many as allowed").  With
    one thread allowed there is nothing to choose."""

    TRIALS = 3
    #: more threads must be this much faster to win: they take a core that other sessions and processes
    #: could use, and a small-op model's medians differ by less than the machine's noise (ShuffleNet over
    #: RPC kept 2 threads and ran at 0.87-0.95x of the rate pinned to 1)
    MARGIN = 0.1

    def __init__(self) -> None:
        self.times: dict[bool, list[float]] = {False: [], True: []}  # more than one thread? -> seconds
        self.best: Optional[bool] = None
        self.warm = False

    def pick(self, share: int) -> int:
        if share <= 1 or self.best is False:
            return 1
        if self.best or not self.warm:
            return share
        return share if len(self.times[True]) < len(self.times[False]) else 1

    def record(self, threads: int, share: int, seconds: float) -> None:
        if share <= 1 or self.best is not None:
            return
        if not self.warm:
            self.warm = True
            return
        self.times[threads > 1].append(seconds)
        if all(len(v) >= self.TRIALS for v in self.times.values()):
            one, many = (sorted(self.times[k])[self.TRIALS // 2] for k in (False, True))
            self.best = many < one * (1 - self.MARGIN)


def thread_ids() -> list[int]:
    """This process's thread IDs (Linux: /proc/self/task; empty elsewhere)."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []


def lower_priority(tids: list[int], increment: int) -> None:
    """Raise the nice value of each thread in ``tids`` by ``increment`` (Linux keeps one per thread; raising
    it needs no privilege).  A priority is a preference: where it cannot be set, nothing changes."""
    for tid in tids if increment > 0 else ():
        try:
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + increment)
        except AttributeError:
            return  # no per-thread priorities here
        except OSError:
            continue  # a thread that ended meanwhile


class OthersBusy:
    """How many cores other processes kept busy lately: the machine's busy CPU time (``/proc/stat``) less
    this process's own (``time.process_time``: every thread of it, BLAS's included), per second of the
    window since the last reading (at least ``BUSY_WINDOW``; 0 where /proc/stat is missing).

    An average, not a snapshot: ``/proc/loadavg``'s count of runnable threads, used before, saw a
    kernel daemon waking for a moment as a busy core, and this process's own other threads (an idle
    session's call, onnxruntime in the benchmark) as other processes, and kept a model on one thread
    half the time where two ran it 1.6x faster (DenseNet)."""

    def __init__(self, machine: Optional[Callable[[], Optional[float]]] = None,
                 own: Callable[[], float] = time.process_time, clock: Callable[[], float] = time.monotonic) -> None:
        """``machine``: seconds of CPU time all processes used (default: ``/proc/stat``); ``own``: this
        process's; ``clock``: seconds of wall time."""
        self.value = 0.0
        self._last: Optional[tuple[float, float, float]] = None  # (machine busy s, our CPU s, monotonic s)
        self._machine, self._own, self._clock = machine or self._machine_busy, own, clock

    def cores(self) -> float:
        now = self._clock()
        if self._last is not None and now - self._last[2] < BUSY_WINDOW:
            return self.value
        busy, ours = self._machine(), self._own()
        if busy is None:
            return 0.0
        if self._last is not None:
            self.value = max(0.0, (busy - self._last[0]) - (ours - self._last[1])) / (now - self._last[2])
        self._last = (busy, ours, now)
        return self.value

    @staticmethod
    def _machine_busy() -> Optional[float]:
        """Seconds of CPU time all processes have used since boot (idle and I/O wait excluded)."""
        try:
            with open("/proc/stat") as f:
                ticks = [int(v) for v in f.readline().split()[1:]]
            return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None


class SlotTimeout(TimeoutError):
    """No compute slot came free before the deadline of the job that waited for it."""


def _acquire(semaphore: threading.Semaphore, deadline: Optional[float]) -> None:
    """Take ``semaphore``, waiting until ``deadline`` (``time.monotonic()``) at most; None: for as long as it takes."""
    if deadline is None:
        semaphore.acquire()
    elif not semaphore.acquire(timeout=max(0.0, deadline - time.monotonic())):
        raise SlotTimeout("no compute slot came free before the deadline")


class ComputePolicy:
    """A pool of ``cores`` job slots and the BLAS thread count that goes with the jobs running."""

    def __init__(self, cores: int = CORES, settings: Optional[ComputeSettings] = None):
        self.cores = max(1, cores)
        self._slots = threading.BoundedSemaphore(self.cores)
        self._lock = threading.Lock()
        self.running = 0
        self.blas = _Blas()
        self.others = OthersBusy()
        self._depth = threading.local()  # jobs this thread is inside (a nested job takes no slot)
        self._niced = threading.local()  # whether this thread's priority was lowered (_yield_to_event_loop)
        self._blas_niced = False
        self.configure(settings or ComputeSettings())

    def configure(self, settings: ComputeSettings,
                  slots: Optional[tuple[Callable[[], int], Callable[[], None]]] = None) -> None:
        """How this process computes, set by its owner before the first job.  ``slots``: take job slots from
        elsewhere, ``(acquire, release)``: ``acquire()`` blocks until a slot is granted and returns the BLAS
        threads for it, ``release()`` gives it back (a native worker asks its server's policy)."""
        self.settings = settings
        #: nice increment for the threads that compute here (0: none)
        self.nice = settings.nice
        self._fixed: Optional[int] = settings.blas_threads
        self._interpreter = threading.BoundedSemaphore(settings.interpreter_jobs)
        self._remote = slots

    def threads_for(self, running: int) -> int:
        """BLAS threads per job while ``running`` jobs compute: the cores shared among the jobs, and only
        the cores no other process is using (BLAS threads that wait for a busy core stall every product
        they split: measured 3-25x slower than one thread on a loaded 2-core machine)."""
        if self._fixed is not None:
            return self._fixed
        share = self.cores // max(1, running)
        if share > 1:
            share = min(share, max(1, self.cores - self.others_busy()))
        return max(1, share)

    def others_busy(self) -> int:
        """Cores other processes keep busy (:class:`OthersBusy`, rounded: a core counts from half busy)."""
        return int(self.others.cores() + 0.5)

    @contextlib.contextmanager
    def job(self, choice: Optional[ThreadChoice] = None, local: bool = True,
            deadline: Optional[float] = None) -> Iterator[int]:
        """Hold a job slot while computing; yields the BLAS threads set for it (``choice``: the
        model's own :class:`ThreadChoice` among the threads allowed).  Inside a job of the same
        thread, the outer job's slot and threads stand.  ``local=False``: the job computes in another
        process (a native worker's slot, held here), so it does not wait for this interpreter.
        ``deadline`` (``time.monotonic()``): wait for the slot until then at most, else :class:`SlotTimeout`."""
        depth = getattr(self._depth, "n", 0)
        if depth:
            threads, share = max(1, self.blas.current or 1), 1
        else:
            local = local and self._remote is None
            if local:
                self._yield_to_event_loop()
                _acquire(self._interpreter, deadline)
            try:
                threads, share = self._take(choice, deadline)
            except BaseException:
                if local:
                    self._interpreter.release()
                raise
        self._depth.n = depth + 1
        start = time.perf_counter()
        try:
            yield threads
        finally:
            self._depth.n = depth
            if not depth:
                self._give()
                if local:
                    self._interpreter.release()
                if choice is not None and self._fixed is None:
                    choice.record(threads, share, time.perf_counter() - start)

    def _yield_to_event_loop(self) -> None:
        """Lower the priority of the threads that compute here by ``nice``, once each: this session thread,
        and at the first job the BLAS library's own threads (this process's threads that Python did not
        start).  Only a server sets ``nice``: a program that merely uses the executor keeps its priorities.

        The server's event loop answers every session's small calls; while a job's BLAS threads hold
        every core, it would wait for a time slice (ShuffleNet over RPC with 2 threads per job: small-call
        p99 10-12 ms at K >= 16).  At a lower priority the compute threads yield to it at once."""
        if self.nice <= 0 or getattr(self._niced, "done", False):
            return
        self._niced.done = True
        ours = [threading.get_native_id()]
        with self._lock:
            blas, self._blas_niced = not self._blas_niced, True
        if blas:
            python = {t.native_id for t in threading.enumerate()}
            ours += [tid for tid in thread_ids() if tid not in python]
        lower_priority(ours, self.nice)

    def _take(self, choice: Optional[ThreadChoice], deadline: Optional[float] = None) -> tuple[int, int]:
        """Wait for a slot (here, or granted by the remote policy; ``deadline`` only bounds the wait here)
        and set the BLAS threads for it: (threads, the most the policy allowed)."""
        if self._remote is not None:
            granted = self._remote[0]()  # the slot is taken even when the threads are pinned here
            share = self._fixed or granted
            threads = share if choice is None or self._fixed else choice.pick(share)
            self.blas.set(threads)
            return threads, share
        _acquire(self._slots, deadline)
        with self._lock:
            self.running += 1
            share = self.threads_for(self.running)
            threads = share if choice is None or self._fixed is not None else choice.pick(share)
            self.blas.set(threads)
        return threads, share

    def _give(self) -> None:
        if self._remote is not None:
            self._remote[1]()
            return
        with self._lock:
            self.running -= 1
        self._slots.release()

    @contextlib.contextmanager
    def fixed_threads(self, n: Optional[int]) -> Iterator[None]:
        """Pin the BLAS threads per job to ``n`` (``None``: the policy) inside the block."""
        before, self._fixed = self._fixed, n
        self.blas.current = None  # threadpoolctl limits set around the block may have changed it
        try:
            yield
        finally:
            self._fixed = before
            self.blas.current = None


#: the process's policy, used by the graph executor's ``run`` (configured by the process's owner: ``configure``)
POLICY = ComputePolicy(settings=ComputeSettings.from_environment())
job = POLICY.job
fixed_threads = POLICY.fixed_threads
