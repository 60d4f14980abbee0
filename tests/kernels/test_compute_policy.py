"""The compute policy (rpcsrv.executor.compute): job slots sized to the cores, BLAS threads that fit them."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from rpcsrv.executor.compute import ComputePolicy


def blas_threads() -> int:
    from threadpoolctl import threadpool_info

    return [i for i in threadpool_info() if i["user_api"] == "blas"][0]["num_threads"]


def test_threads_per_job_fit_the_cores(monkeypatch):
    p = ComputePolicy(cores=4)
    monkeypatch.setattr(p, "others_busy", lambda: 0)
    assert [p.threads_for(k) for k in (1, 2, 3, 4)] == [4, 2, 1, 1]
    with p.fixed_threads(3):
        assert p.threads_for(1) == p.threads_for(4) == 3
    assert p.threads_for(1) == 4


def test_busy_cores_are_left_to_the_processes_using_them(monkeypatch):
    p = ComputePolicy(cores=4)
    monkeypatch.setattr(p, "others_busy", lambda: 3)
    assert p.threads_for(1) == 1
    monkeypatch.setattr(p, "others_busy", lambda: 1)
    assert p.threads_for(1) == 3 and p.threads_for(2) == 2
    assert ComputePolicy(cores=2).others_busy() >= 0  # reads /proc/stat (0 where it is missing)


def test_a_job_sets_the_blas_threads(monkeypatch):
    pytest.importorskip("threadpoolctl")
    before = blas_threads()
    p = ComputePolicy(cores=2)
    monkeypatch.setattr(p, "others_busy", lambda: 0)
    try:
        with p.job() as n:
            assert n == 2 and blas_threads() == 2
        with p.fixed_threads(1), p.job() as n:
            assert n == 1 and blas_threads() == 1
            np.ones((64, 64), np.float32) @ np.ones((64, 64), np.float32)
    finally:
        p.blas.set(before)


def _overlap(p: ComputePolicy, kinds: list[bool]) -> tuple[dict, list]:
    """Run one job per entry of ``kinds`` (``local``) in threads at once; the most jobs of each kind (and
    in all) seen inside at one time, and (running jobs, BLAS threads) as each started."""
    inside, most, seen, lock = {True: 0, False: 0}, {True: 0, False: 0, "all": 0}, [], threading.Lock()

    def work(local):
        with p.job(local=local):
            with lock:
                inside[local] += 1
                most[local] = max(most[local], inside[local])
                most["all"] = max(most["all"], inside[True] + inside[False])
            with p._lock:  # the process-wide BLAS setting against the jobs running now
                seen.append((p.running, p.blas.current))
            time.sleep(0.05)
            with lock:
                inside[local] -= 1

    threads = [threading.Thread(target=work, args=(local,)) for local in kinds]
    before = blas_threads()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    finally:
        p.blas.set(before)
    assert p.running == 0
    return most, seen


def test_at_most_cores_jobs_compute_at_once_and_share_the_cores():
    """Jobs held for other processes (native workers) fill the cores; (jobs) x (BLAS threads) never
    exceeds them."""
    most, seen = _overlap(ComputePolicy(cores=2), [False] * 5)
    assert most["all"] == 2
    assert seen and all(k * n <= 2 for k, n in seen)


def test_jobs_in_this_interpreter_run_one_at_a_time():
    """Two model runs in one interpreter contend for its lock (issue 16: 0.8x the runs of one): local jobs
    take turns, while a worker's job may compute beside one of them."""
    most, _ = _overlap(ComputePolicy(cores=2), [True] * 4)
    assert most[True] == 1
    most, seen = _overlap(ComputePolicy(cores=2), [True, True, False, True, False])
    assert most[True] == 1 and most["all"] == 2 and all(k * n <= 2 for k, n in seen)


def test_a_job_inside_a_job_takes_no_second_slot():
    """A VM function that runs a graph executor, a profiler around a call: one job, no deadlock."""
    p = ComputePolicy(cores=1)
    done = []

    def work():
        with p.job() as outer, p.job() as inner:
            done.append((outer, inner, p.running))

    t = threading.Thread(target=work)
    t.start()
    t.join(5)
    assert not t.is_alive() and done == [(1, 1, 1)] and p.running == 0
    with p.job():  # the slot was given back
        assert p.running == 1


def test_relax_vm_calls_are_jobs(monkeypatch):
    """A Relax VM call from outside holds a job slot while it computes (issue 16: VM sessions share the
    cores as graph executors do)."""
    from rpcsrv.executor import compute
    from rpcsrv.executor.vm import interpreter

    seen = []
    real = compute.POLICY.job

    def spy(*args):
        seen.append(compute.POLICY.running)
        return real(*args)

    monkeypatch.setattr(compute, "job", spy)
    vm = interpreter.VirtualMachine.__new__(interpreter.VirtualMachine)
    vm._closure = lambda name: interpreter.Closure(name, lambda _vm, *a: ("ran", compute.POLICY.running), ())
    vm.staging = type("S", (), {"stage": staticmethod(lambda i, a: a)})()
    assert interpreter.export(vm.call("main")) == ("ran", 1) and len(seen) == 1 and compute.POLICY.running == 0


def test_a_model_keeps_the_thread_count_its_own_runs_found_faster(monkeypatch):
    """ThreadChoice: the first run is not timed, then 1 and the allowed count alternate until each has
    TRIALS runs; the faster median wins for good (more threads only by MARGIN), and one allowed thread
    leaves nothing to choose."""
    from rpcsrv.executor.compute import ThreadChoice

    for one_faster, many_cost in ((True, 2.0), (False, 0.5), (True, 0.95)):  # 5% faster is within noise
        p = ComputePolicy(cores=2)
        monkeypatch.setattr(p, "others_busy", lambda: 0)
        monkeypatch.setattr(p.blas, "set", lambda n: None)
        choice, used = ThreadChoice(), []
        clock = [0.0]
        monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
        for _ in range(1 + 2 * ThreadChoice.TRIALS + 4):
            with p.job(choice) as n:
                used.append(n)
                clock[0] += 1.0 if n == 1 else many_cost
        trials = used[1:1 + 2 * ThreadChoice.TRIALS]
        assert used[0] == 2 and sorted(trials) == [1] * ThreadChoice.TRIALS + [2] * ThreadChoice.TRIALS
        assert choice.best is (not one_faster) and set(used[-4:]) == {1 if one_faster else 2}
    busy = ThreadChoice()
    assert busy.pick(1) == 1 and busy.best is None  # one thread allowed: nothing learned
    busy.record(1, 1, 5.0)
    assert busy.times == {False: [], True: []}


def test_cores_busy_in_other_processes_count_and_this_processs_own_threads_do_not():
    """OthersBusy: CPU time the machine used beyond this process's own is other processes' busy cores
    (an idle session's call or the benchmark's onnxruntime must not take a model's second thread away).
    Fed readings, so what else the machine runs does not change the answer."""
    from rpcsrv.executor.compute import BUSY_WINDOW, OthersBusy

    reading = {"machine": 100.0, "own": 5.0, "clock": 1000.0}
    others = OthersBusy(machine=lambda: reading["machine"], own=lambda: reading["own"],
                        clock=lambda: reading["clock"])
    assert others.cores() == 0.0  # the first reading only starts the window

    def advance(seconds: float, machine: float, own: float) -> float:
        for key, by in (("clock", seconds), ("machine", machine), ("own", own)):
            reading[key] += by
        return others.cores()

    assert advance(0.5, 1.0, 1.0) == pytest.approx(0.0)  # this process on two cores: nobody else
    assert advance(0.5, 0.5, 0.0) == pytest.approx(1.0)  # another process on one core
    assert advance(0.5, 1.0, 0.5) == pytest.approx(1.0)  # both
    assert advance(0.5, 0.2, 0.4) == 0.0  # (clock ticks: never below zero)
    reading["machine"] += 5.0
    assert advance(BUSY_WINDOW / 2, 0.0, 0.0) == 0.0  # inside the window: the last value stands
    assert advance(BUSY_WINDOW, 0.0, 0.0) > 1.0
    assert OthersBusy(machine=lambda: None).cores() == 0.0  # no /proc/stat: nobody counted


def test_the_machines_busy_time_includes_this_processs_own():
    """``/proc/stat``'s busy time grows at least by this process's CPU time: the subtraction that leaves
    other processes' share has a real minuend (true however busy the machine is)."""
    import os

    from rpcsrv.executor.compute import OthersBusy

    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat here: the policy counts no other process")
    machine0, own0 = OthersBusy._machine_busy(), time.process_time()
    end = time.monotonic() + 60
    while time.process_time() - own0 < 0.3 and time.monotonic() < end:  # this process busy for 0.3 s of CPU
        pass
    machine, own = OthersBusy._machine_busy() - machine0, time.process_time() - own0
    assert own >= 0.3
    assert machine >= own - 2 * 0.01 * 2  # (two readings of clock ticks, 10 ms each, per CPU)


def test_threads_that_compute_yield_to_the_event_loop_only_in_a_server():
    """With ``nice`` set (the server sets COMPUTE_NICE), a thread's first local job lowers that thread's
    priority (and the BLAS library's threads'), not the caller's other threads; without it nothing moves."""
    import os

    if not hasattr(os, "getpriority") or not os.path.isdir("/proc/self/task"):
        pytest.skip("per-thread priorities are Linux's")
    main_before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def priority_in_job(p: ComputePolicy) -> tuple[int, int]:
        seen = []

        def work():
            before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            with p.job(local=True):
                seen.append((before, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))

        t = threading.Thread(target=work)
        t.start()
        t.join(10)
        return seen[0]

    plain = ComputePolicy(cores=2)
    before, during = priority_in_job(plain)
    assert during == before
    server = ComputePolicy(cores=2)
    server.nice = 3
    before, during = priority_in_job(server)
    assert during == min(before + 3, 19)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_before  # the caller's stays


def test_a_job_waits_for_a_slot_until_its_deadline_at_most():
    """With every slot held (a hung native call of another session), a job with a deadline gives up at
    the deadline with SlotTimeout, and the policy's count stays right; without one it would wait on."""
    from rpcsrv.executor.compute import SlotTimeout

    p = ComputePolicy(cores=1)
    taken, done = threading.Event(), threading.Event()

    def hold():
        with p.job(local=False):
            taken.set()
            done.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert taken.wait(10)
        start = time.monotonic()
        with pytest.raises(SlotTimeout):
            with p.job(local=False, deadline=start + 0.2):
                pass
        assert 0.15 < time.monotonic() - start < 5 and p.running == 1
    finally:
        done.set()
        t.join(10)
    with p.job(local=False, deadline=time.monotonic() + 5) as n:  # free again: taken at once
        assert n == 1 and p.running == 1
    assert p.running == 0
