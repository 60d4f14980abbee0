"""The HIL runner's Prometheus check: each board's counters moved as the scenario expects.

The farm's Prometheus (docker/Dockerfile.prometheus, docker/prometheus.yml) scrapes every board's
``rpcsrv serve --metrics-port`` endpoint, its targets labelled with the board's tracker ``key``.  After
the scenario, :func:`check` asks Prometheus's HTTP API (``/api/v1/query``, instant queries) for the
counters summed per key and compares them with what the runner did there: every target up, at least
as many sessions as requests and ten requests per session, a model run per graph executor run, a
module call per kernel or VM ``main`` call, native workers started where native libraries ran.
Prometheus scrapes every 2 s; the check waits (up to ``timeout``) for a scrape that shows it all.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request


def query(url: str, expr: str) -> dict[str, float]:
    """``expr`` (summed ``by (key)``) -> {key: value}."""
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"prometheus: {expr}: {body}")
    return {s["metric"].get("key", ""): float(s["value"][1]) for s in body["data"]["result"]}


def expectations(cases: list, requests: int) -> dict[str, float]:
    """Lower bounds, per key, for ``requests`` requests going round ``cases``."""
    done = [cases[i % len(cases)] for i in range(requests)]
    return {
        "sum by (key) (rpcsrv_sessions_total)": requests,
        "sum by (key) (rpcsrv_requests_total)": 10 * requests,  # handshake, upload, load, calls...
        # graph executor runs are model runs; a kernel's or the VM's ``main`` called directly is a module call
        "sum by (key) (rpcsrv_model_run_seconds_count)": sum(c.kind == "graph" for c in done),
        'sum by (key) (rpcsrv_call_seconds_count{kind="module_call"})': sum(c.kind in ("kernel", "vm") for c in done),
        "sum by (key) (rpcsrv_native_workers_started_total)": min(1, sum(c.library.suffix == ".so" for c in done)),
    }


def check(url: str, plan: dict[str, dict[str, float]], boards: dict[str, int], timeout: float = 60.0) -> list[str]:
    """Wait until Prometheus shows ``plan`` ({key: {expr: lower bound}}) and ``boards`` ({key: targets
    up}); the failures left at the deadline (empty: all good)."""
    deadline = time.monotonic() + timeout
    while True:
        failures = []
        try:
            up = query(url, 'sum by (key) (up{job="rpcsrv"})')
            failures += [f"{key}: {up.get(key, 0):.0f} of {n} boards up" for key, n in boards.items()
                         if up.get(key, 0) < n]
            for expr in {e for want in plan.values() for e in want}:
                got = query(url, expr)
                failures += [f"{key}: {expr} = {got.get(key, 0):g}, expected >= {want[expr]:g}"
                             for key, want in plan.items() if got.get(key, 0) < want[expr]]
        except (OSError, RuntimeError, ValueError) as exc:
            failures = [f"prometheus at {url} does not answer: {exc}"]
        if not failures or time.monotonic() > deadline:
            return failures
        time.sleep(1)
