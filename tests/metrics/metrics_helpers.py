"""Helpers of the metrics tests: a board serving metrics, a byte-counting relay, a parsed scrape."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Optional

if __name__ != "__main__":  # (run as a script, it is the relay process)
    from conftest import ServerProcess, need_module
else:
    ServerProcess = object


class MetricsBoard(ServerProcess):
    """``rpcsrv serve --metrics-port 0`` in a child process; ``url``: its metrics endpoint."""

    def __init__(self, *args: str, workdir=None, env=None, cwd=None):
        super().__init__("--metrics-port", "0", *args, workdir=workdir, env=env, cwd=cwd)
        line = self.proc.stdout.readline()
        m = re.search(r"(http://[^/\s]+)/", line)
        if not m:
            self.stop()
            raise RuntimeError(f"no metrics line: {line!r} {self.stderr()}")
        self.url = m.group(1)

    def get(self, path: str) -> tuple[int, str, str]:
        """(status, content type, text) of a GET on the metrics port."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as r:
                return r.status, r.headers["Content-Type"], r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers["Content-Type"], exc.read().decode()

    def scrape(self) -> "Scrape":
        status, ctype, text = self.get("/metrics")
        assert status == 200 and ctype.startswith("text/plain"), (status, ctype)
        return Scrape(text)


class Scrape:
    """A /metrics page parsed by prometheus_client's own parser."""

    def __init__(self, text: str):
        parser = need_module("prometheus_client.parser", "the metrics endpoint's tests")
        self.text = text
        self.families = {f.name: f for f in parser.text_string_to_metric_families(text)}
        self.samples = {}
        for fam in self.families.values():
            for s in fam.samples:
                self.samples[(s.name, tuple(sorted(s.labels.items())))] = s.value

    def __call__(self, name: str, **labels) -> float:
        """The value of sample ``name`` with exactly ``labels`` (KeyError when absent)."""
        return self.samples[(name, tuple(sorted(labels.items())))]

    def names(self) -> set[str]:
        return {name for name, _ in self.samples}


def wait_scrape(board: MetricsBoard, predicate, timeout: float = 20.0) -> Scrape:
    """Scrape until ``predicate(scrape)`` holds (the server notices a closed session asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        scrape = board.scrape()
        if predicate(scrape) or time.monotonic() > deadline:
            return scrape
        time.sleep(0.1)


class Relay:
    """A TCP relay on loopback between one client and the board, counting the bytes each way: an
    independent count of what crossed the wire.  It runs in a process of its own (the TVM client may
    hold this process's interpreter lock while it waits for an answer).  ``upstream``: the relay's
    address as the board sees it (the session's peer); ``counts()``: (client->board, board->client)
    bytes, once the session has closed."""

    def __init__(self, port: int):
        self.proc = subprocess.Popen([sys.executable, __file__, str(port)], stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())
        self.upstream: Optional[str] = None

    def wait_peer(self) -> str:
        if self.upstream is None:
            self.upstream = self.proc.stdout.readline().strip()
        return self.upstream

    def counts(self, timeout: float = 20.0) -> tuple[int, int]:
        """Wait for both directions to close; the byte counts."""
        self.wait_peer()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise AssertionError("the client never closed its session") from None
        out = self.proc.stdout.read()  # (not communicate(): it would skip what readline buffered)
        if len(out.split()) != 2:
            raise AssertionError(f"the relay said {out!r} (status {self.proc.returncode})")
        up, down = map(int, out.split())
        return up, down

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _relay_main(board_port: int) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    client, _ = listener.accept()
    board = socket.create_connection(("127.0.0.1", board_port))
    print("%s:%d" % board.getsockname()[:2], flush=True)
    counts = {}

    def pump(src: socket.socket, dst: socket.socket, way: str) -> None:
        n = 0
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                dst.sendall(data)
                n += len(data)
        except OSError:
            pass
        finally:
            counts[way] = n
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    threads = [threading.Thread(target=pump, args=a) for a in ((client, board, "up"), (board, client, "down"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(counts["up"], counts["down"], flush=True)


if __name__ == "__main__":
    _relay_main(int(sys.argv[1]))
