"""The status page in a real headless browser (Debian's chromium) during a live session of the real
TVM client: the page's text shows that session (peer, calls, memory, the modules it holds), the last
error with its client-supplied text escaped, and the board's limits; the page reloads itself.  Also
``/healthz``, a 404, and a screenshot (``RPCSRV_UPDATE_DOCS=1`` copies it to docs/status-page.png)."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, need_module, need_program
from metrics_helpers import MetricsBoard, Relay

TESTS = Path(__file__).resolve().parent.parent
for sub in ("executor", "loader", "interop"):
    sys.path.insert(0, str(TESTS / sub))

tvm = need_module("tvm", "the real TVM client (apache-tvm)")
need_module("prometheus_client", "the metrics endpoint (pip install 'rpcsrv[metrics]')")

from test_tvm_graph import GraphModule, inputs, seed_tree  # noqa: E402
from loader_fixtures import compile_library  # noqa: E402
from rpcsrv.loader import BLOB_SYMBOL, build_blob  # noqa: E402

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]
EVIL = "<b>missing</b>&amp;.so"


def chromium(*args: str) -> str:
    exe = need_program("chromium", "the status page test (apt-get install chromium)")
    profile = tempfile.mkdtemp(prefix="rpcsrv-chromium-")
    try:
        out = subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                             text=True, timeout=90)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


class Tables(HTMLParser):
    """The text of every table cell, by table id, row by row; and every element's tag."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.tags: list[str] = []
        self.meta: list[dict] = []
        self._table = None
        self._cell = None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        attrs = dict(attrs)
        if tag == "meta":
            self.meta.append(attrs)
        if tag == "table":
            self._table = self.tables.setdefault(attrs.get("id", f"t{len(self.tables)}"), [])
        elif tag == "tr" and self._table is not None:
            self._table.append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._table[-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


@pytest.fixture(scope="module")
def seed_so(tmp_path_factory):
    out = tmp_path_factory.mktemp("seed") / "ej_seed_full.so"
    return compile_library(build_blob(seed_tree()), BLOB_SYMBOL, "host", out)


def test_status_page_shows_the_live_session(tmp_path, seed_so):
    board = MetricsBoard("--key", "lab-board-7", "--max-sessions", "9", workdir=tmp_path / "work")
    relay = Relay(board.port)
    try:
        sess = tvm.rpc.connect("127.0.0.1", relay.port, key="lab-board-7")
        dev = sess.cpu(0)
        sess.upload(str(seed_so))
        gmod = GraphModule(sess.load_module(seed_so.name)["default"](dev))
        for i, x in enumerate(inputs()):
            gmod.set_input(f"input{i}", tvm.runtime.tensor(x, dev))
        gmod.f["run"]()
        big = tvm.runtime.tensor(np.ones(3 << 18, "float32"), dev)  # 3 MiB
        with pytest.raises(Exception, match="no file"):
            sess.load_module(EVIL)
        peer = relay.wait_peer()
        scrape = board.scrape()
        dom = chromium("--dump-dom", board.url + "/")
        page = Tables()
        page.feed(dom)

        assert any(m.get("http-equiv") == "refresh" for m in page.meta), "the page does not refresh itself"
        rows = {r[1]: r for r in page.tables["sessions"][1:]}
        assert list(rows) == [peer], (rows, peer)
        number, _, age, memory, calls, errors, modules = rows[peer]
        assert number == "1" and age.endswith("s")
        requests = sum(v for (name, _), v in scrape.samples.items() if name == "rpcsrv_requests_total")
        assert int(calls) == requests > 10  # the page's count is the session's, as /metrics counted it
        assert int(errors) == 1
        held = scrape("rpcsrv_session_memory_bytes", slot="0")
        assert memory == f"{held / (1 << 20):,.1f} MiB" and held >= 3 << 20
        assert "GraphExecutor" in modules.split(", ")
        last = page.tables["errors"][1]
        assert last[1:4] == ["1", peer, "call_func"] and EVIL in last[4]  # shown as text ...
        assert "b" not in page.tags and "<b>missing" not in dom  # ... never as markup
        limits = {r[0]: r[1] for r in page.tables[next(k for k in page.tables if k not in ("sessions", "errors"))]}
        assert limits["max_sessions"] == "9"
        assert "lab-board-7" in dom and "registered" not in dom  # no tracker: no tracker line

        shot = tmp_path / "status.png"
        chromium(f"--screenshot={shot}", "--window-size=1000,760", board.url + "/")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000
        if os.environ.get("RPCSRV_UPDATE_DOCS") == "1":
            shutil.copy(shot, REPO / "docs" / "status-page.png")

        del big, gmod, dev, sess
        gc.collect()
        relay.counts()
        assert board.get("/healthz")[::2] == (200, "ok\n")
        assert board.get("/nope")[0] == 404
        gone = Tables()
        gone.feed(chromium("--dump-dom", board.url + "/"))
        assert "sessions" not in gone.tables  # the session ended: no session row is left
        assert gone.tables["errors"][1][4] == last[4]  # the error stays in the ring
    finally:
        relay.close()
        board.stop()
