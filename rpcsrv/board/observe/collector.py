"""The board's Prometheus metrics, collected at scrape time from its counters and live state.

A custom ``prometheus_client`` collector: nothing is updated per call through the library (whose
metric objects take a lock per update); :class:`BoardCollector` reads :class:`~.stats.ServerStats`,
the server state (sessions, memory accounts) and the tracker registration when Prometheus asks.
Each server has its own ``CollectorRegistry`` (:func:`make_registry`), so several servers in one
process (tests) never mix.  The metric names and their meaning are listed in ``docs/deploy.md``.
"""

from __future__ import annotations

import platform
from dataclasses import fields
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily,
                                    InfoMetricFamily)

from .stats import BOUNDS, KINDS, REQUEST_CODES, ServerStats

#: every metric family the board serves, as a scrape names them (counters without ``_total``); tests check
#: the docs and the Grafana dashboard against it
NAMES = ("rpcsrv_board_info", "rpcsrv_start_time_seconds", "rpcsrv_limit", "rpcsrv_connections_open",
         "rpcsrv_sessions_open", "rpcsrv_sessions", "rpcsrv_sessions_ended", "rpcsrv_sessions_refused",
         "rpcsrv_requests", "rpcsrv_request_errors", "rpcsrv_call_seconds", "rpcsrv_model_run_seconds",
         "rpcsrv_received_bytes", "rpcsrv_sent_bytes", "rpcsrv_memory_used_bytes", "rpcsrv_memory_limit_bytes",
         "rpcsrv_session_memory_bytes", "rpcsrv_session_memory_limit_bytes", "rpcsrv_native_workers_alive",
         "rpcsrv_native_workers_started", "rpcsrv_native_workers_crashed", "rpcsrv_native_loaned_requests",
         "rpcsrv_tracker_registered",
         "rpcsrv_tracker_registrations",
         "rpcsrv_health_ok", "rpcsrv_health_checks", "rpcsrv_health_last_failure_time_seconds",
         "rpcsrv_health_failure_info")


def board_version() -> str:
    try:
        from importlib.metadata import version

        return version("rpcsrv")
    except Exception:  # not installed (a source checkout on sys.path)
        return "unknown"


def _histogram(name: str, doc: str, label: str, groups: dict[str, list]) -> HistogramMetricFamily:
    """``groups``: label value -> [buckets (non-cumulative), sum]."""
    fam = HistogramMetricFamily(name, doc, labels=[label] if label else None)
    for value, (buckets, total) in groups.items():
        running, out = 0, []
        for bound, n in zip((*BOUNDS, float("inf")), buckets):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), running))
        fam.add_metric([value] if label else [], out, total)
    return fam


class BoardCollector:
    """Reads one server's counters and state (``server``: a ``board.server.Server``) at every scrape."""

    def __init__(self, server: Any, stats: ServerStats):
        self.server = server
        self.stats = stats

    def describe(self):
        return []  # collected lazily: nothing to describe up front (registry made with auto_describe off)

    def collect(self) -> Iterator[Any]:
        server, st = self.server, self.stats
        opts = server.options
        limits = opts.limits
        info = InfoMetricFamily("rpcsrv_board", "This board: rpcsrv version, key, native policy, machine")
        info.add_metric([], {"version": board_version(), "key": opts.key or "", "native": opts.native.mode,
                             "machine": platform.machine(), "hostname": platform.node()})
        yield info
        yield GaugeMetricFamily("rpcsrv_start_time_seconds", "When the server started (Unix time)",
                                value=st.started)
        lim = GaugeMetricFamily("rpcsrv_limit", "The server's limits (rpcsrv serve flags)", labels=["limit"])
        for f in fields(limits):
            lim.add_metric([f.name], float(getattr(limits, f.name)))
        yield lim
        yield GaugeMetricFamily("rpcsrv_connections_open", "Open TCP connections (handshaken or not)",
                                value=server.connections)
        yield GaugeMetricFamily("rpcsrv_sessions_open", "Sessions now open", value=len(st.live))
        yield CounterMetricFamily("rpcsrv_sessions", "Sessions opened since the start", value=st.sessions_total)
        ended = CounterMetricFamily("rpcsrv_sessions_ended", "Sessions ended, by reason (closed, timeout, "
                                    "idle, shutdown, lost, call-timeout)", labels=["reason"])
        for reason in sorted({"closed", "timeout", "idle", "shutdown", "lost", "call-timeout", *st.ended}):
            ended.add_metric([reason], st.ended.get(reason, 0))
        yield ended
        refused = CounterMetricFamily("rpcsrv_sessions_refused", "Clients turned away, by reason (key, "
                                      "limit, draining, connections)", labels=["reason"])
        for reason in sorted({"key", "limit", "draining", "connections", *st.refused}):
            refused.add_metric([reason], st.refused.get(reason, 0))
        yield refused
        yield from self._requests()
        rx, tx = st.traffic()
        yield CounterMetricFamily("rpcsrv_received_bytes", "Bytes received from clients", value=rx)
        yield CounterMetricFamily("rpcsrv_sent_bytes", "Bytes sent to clients", value=tx)
        yield from self._memory()
        alive, started, crashed = st.workers()
        yield GaugeMetricFamily("rpcsrv_native_workers_alive", "Native worker processes serving a session",
                                value=alive)
        yield CounterMetricFamily("rpcsrv_native_workers_started", "Native workers taken by sessions",
                                  value=started)
        yield CounterMetricFamily("rpcsrv_native_loaned_requests", "Requests a native worker answered while "
                                  "it held its session's connection (repeated native calls)", value=st.loaned)
        yield CounterMetricFamily("rpcsrv_native_workers_crashed", "Native workers that ended other than "
                                  "by closing (a crash, or stopped at the session deadline)", value=crashed)
        yield from self._health()
        gate = server.gate
        if gate is not None and hasattr(gate, "connected"):  # a tracker registration (rpcsrv.farm)
            yield GaugeMetricFamily("rpcsrv_tracker_registered", "1 while registered with the tracker",
                                    value=1 if gate.connected else 0)
            yield CounterMetricFamily("rpcsrv_tracker_registrations", "Successful (re)registrations with "
                                      "the tracker", value=getattr(gate, "registrations", 0))

    def _health(self) -> Iterator[Any]:
        health = self.server.health  # the self-test's verdict (--health-interval, board/health.py)
        yield GaugeMetricFamily("rpcsrv_health_ok", "1 while the board's self-test passes (or has not run), 0 "
                                "while it fails (the board is then off the tracker or proxy)", value=int(health.ok))
        checks = CounterMetricFamily("rpcsrv_health_checks", "Self-tests run (--health-interval), by result",
                                     labels=["result"])
        for result in ("ok", "failed"):
            checks.add_metric([result], health.checks[result])
        yield checks
        yield GaugeMetricFamily("rpcsrv_health_last_failure_time_seconds", "When the self-test last failed "
                                "(Unix time; 0: never)", value=health.last_failure)
        failure = InfoMetricFamily("rpcsrv_health_failure", "Why the self-test last failed (empty: never)")
        failure.add_metric([], {"reason": health.last_failure_reason[:500]})
        yield failure

    def _requests(self) -> Iterator[Any]:
        requests = CounterMetricFamily("rpcsrv_requests", "Requests answered, by RPC code", labels=["code"])
        errors = CounterMetricFamily("rpcsrv_request_errors", "Requests answered with an RPC exception, "
                                     "by RPC code", labels=["code"])
        by_code: dict[str, list[int]] = {code: [0, 0] for code in REQUEST_CODES}  # every series from the start
        by_kind: dict[str, list] = {k: [[0] * (len(BOUNDS) + 1), 0.0] for k in KINDS}
        for (code, kind), cell in list(self.stats.cells.items()):
            c = by_code.setdefault(code, [0, 0])
            c[0] += cell.count
            c[1] += cell.errors
            k = by_kind.setdefault(kind, [[0] * (len(BOUNDS) + 1), 0.0])
            k[0] = [a + b for a, b in zip(k[0], cell.buckets)]
            k[1] += cell.sum
        for code, (n, e) in sorted(by_code.items()):
            requests.add_metric([code], n)
            errors.add_metric([code], e)
        yield requests
        yield errors
        yield _histogram("rpcsrv_call_seconds", "Time from a request's last byte to its answer's last byte, by "
                         "function kind", "kind", by_kind)
        yield _histogram("rpcsrv_model_run_seconds", "Model runs (graph executor run, VM invoke, time "
                         "evaluator) and their durations", "", {"": by_kind["model_run"]})

    def _memory(self) -> Iterator[Any]:
        server, st = self.server, self.stats
        limits = server.options.limits
        yield GaugeMetricFamily("rpcsrv_memory_used_bytes", "Memory charged to all sessions together",
                                value=server.account.used)
        yield GaugeMetricFamily("rpcsrv_memory_limit_bytes", "The server-wide memory budget "
                                "(--max-total-memory-mb)", value=limits.max_total_memory)
        per = GaugeMetricFamily("rpcsrv_session_memory_bytes", "Memory charged to each open session, by "
                                "session slot (0..max_sessions-1, reused)", labels=["slot"])
        for live in sorted(st.live.values(), key=lambda s: s.slot):
            per.add_metric([str(live.slot)], live.session.account.used)
        yield per
        yield GaugeMetricFamily("rpcsrv_session_memory_limit_bytes", "The per-session memory budget "
                                "(--max-memory-mb)", value=limits.max_memory)


def make_registry(server: Any, stats: ServerStats) -> CollectorRegistry:
    """A registry of its own for one server: its collector and this process's CPU and memory."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BoardCollector(server, stats))
    ProcessCollector(registry=registry)
    return registry
