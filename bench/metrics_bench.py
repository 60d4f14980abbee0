"""What the metrics cost on the small-call round trip (issue 28): ``rpcsrv serve`` with and without
``--metrics-port``, the real TVM client (or ``--client ours``: the project's own), loopback.

    python bench/metrics_bench.py [--calls 2000] [--rounds 21] [--scrape 1.0] [--pin same|split|none]

Two boards run side by side, one with the metrics endpoint (scraped every ``--scrape`` seconds by a
separate process, as Prometheus would, every scrape also fetching the status page) and one without.
Each round times ``--calls`` calls of ``tvm.rpc.server.workpath`` on both, in alternating order; the
figure is the median over rounds of the paired difference (with - without), in microseconds per call
and in percent, with the spread of the rounds (the 25th-75th percentiles of the differences) for a
sense of the noise.  ``--pin same`` (default) pins client and servers to one CPU, which measures the
processing cost and keeps a shared machine's scheduler out of the figure (``bench/rpc_bench.py``).
``--aa`` starts both boards without metrics: the same figure is then the noise floor.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rpc_bench import pin  # noqa: E402

SCRAPER = """
import sys, time, urllib.request
url, every = sys.argv[1], float(sys.argv[2])
while True:
    for path in ("/metrics", "/"):
        urllib.request.urlopen(url + path, timeout=10).read()
    time.sleep(every)
"""


def connect(client: str, port: int):
    if client == "tvm":
        import tvm

        return tvm.rpc.connect("127.0.0.1", port)
    from rpcsrv.client import rpc

    return rpc.connect("127.0.0.1", port)


def timed(f, calls: int) -> float:
    f("x")
    t0 = time.perf_counter()
    for _ in range(calls):
        f("x")
    return (time.perf_counter() - t0) / calls * 1e6


def run(calls: int, rounds: int, scrape: float, client: str, placement: str, aa: bool = False) -> dict:
    procs, sessions = [], {}
    try:
        plain, plain_port, _ = start_board()
        procs.append(plain)
        metered, metered_port, metrics_url = start_board() if aa else start_board("--metrics-port", "0")
        procs.append(metered)
        sessions = {"without": connect(client, plain_port), "with": connect(client, metered_port)}
        funcs = {name: s.get_function("tvm.rpc.server.workpath") for name, s in sessions.items()}
        if metrics_url and scrape > 0:
            procs.append(subprocess.Popen([sys.executable, "-c", SCRAPER, metrics_url, str(scrape)],
                                          start_new_session=True))
        cpus = os.sched_getaffinity(0)
        cpu = min(cpus)
        if placement == "same":
            pin([p.pid for p in procs], {cpu}, {cpu})
        elif placement == "split":
            pin([p.pid for p in procs], {min(cpus - {cpu}, default=cpu)}, {cpu})
        per = {"with": [], "without": []}
        for r in range(rounds):
            order = ("with", "without") if r % 2 else ("without", "with")
            for name in order:
                per[name].append(timed(funcs[name], calls))
        w, wo = np.array(per["with"]), np.array(per["without"])
        diff = w - wo
        return {"without us": float(np.median(wo)), "with us": float(np.median(w)),
                "overhead us": float(np.median(diff)), "overhead %": float(np.median(diff / wo) * 100),
                "diff p25 us": float(np.percentile(diff, 25)), "diff p75 us": float(np.percentile(diff, 75)),
                "round spread us (without, p25-p75)": (float(np.percentile(wo, 25)), float(np.percentile(wo, 75))),
                "scraped": bool(metrics_url and scrape > 0)}
    finally:
        for s in sessions.values():
            if hasattr(s, "close"):
                s.close()
        sessions.clear()
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # each in a group of its own, with its native workers
            except (ProcessLookupError, PermissionError):
                pass
            p.wait()


def start_board(*extra: str) -> tuple[subprocess.Popen, int, str | None]:
    """``rpcsrv serve`` on free ports: the process, its RPC port and its metrics URL (with --metrics-port)."""
    proc = subprocess.Popen([sys.executable, "-m", "rpcsrv", "serve", "--port", "0", *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    port = int(re.search(r":(\d+)", proc.stdout.readline()).group(1))
    url = None
    if extra:
        url = re.search(r"(http://\S+)/", proc.stdout.readline()).group(1)
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep the pipe drained
    return proc, port, url


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--scrape", type=float, default=1.0, help="seconds between scrapes (0: no scraper)")
    ap.add_argument("--client", choices=["tvm", "ours"], default="tvm")
    ap.add_argument("--pin", choices=["same", "split", "none"], default="same")
    ap.add_argument("--aa", action="store_true", help="the noise floor: both boards without metrics")
    args = ap.parse_args()
    res = run(args.calls, args.rounds, args.scrape, args.client, args.pin, args.aa)
    if args.aa:
        print("A/A run (both boards without --metrics-port): the 'overhead' below is the noise floor")
    print(f"small-call round trip, {args.client} client, {args.rounds} rounds x {args.calls} calls, pin {args.pin}"
          f"{', scraped every %gs' % args.scrape if res['scraped'] else ''}:")
    print(f"  without --metrics-port {res['without us']:.1f} us, with {res['with us']:.1f} us")
    print(f"  overhead (median of paired rounds) {res['overhead us']:+.2f} us = {res['overhead %']:+.2f}%  "
          f"(paired differences p25..p75: {res['diff p25 us']:+.2f} .. {res['diff p75 us']:+.2f} us; rounds "
          f"without metrics p25..p75: {res['round spread us (without, p25-p75)'][0]:.1f} .. "
          f"{res['round spread us (without, p25-p75)'][1]:.1f} us)")


if __name__ == "__main__":
    main()
