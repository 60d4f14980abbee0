"""atheris target: the text parsers a client's library feeds the server: graph JSON and ExampleJSON.

    python fuzz/fuzz_parsers.py -max_total_time=3600 -timeout=5

The first byte picks the parser; any exception but ExecutorError (their error type) is a crash.
"""

from __future__ import annotations

from common import run

from rpcsrv.executor.kernels import KERNELS
from rpcsrv.loader.examplejson_text import ExampleJSONError, parse_examplejson
from rpcsrv.loader.graph_json import GraphJSONError, parse_graph_json


def test_one(data: bytes) -> None:
    if not data:
        return
    text = data[1:].decode("utf-8", "replace")
    try:
        if data[0] & 1:
            parse_graph_json(text)
        else:
            parse_examplejson(text, KERNELS)
    except (GraphJSONError, ExampleJSONError):  # refused with a message: fine
        pass


def seeds():
    from exec_helpers import SEED, seed_graph_json

    yield b"\x01" + seed_graph_json().encode()
    yield b"\x00" + SEED.encode()


if __name__ == "__main__":
    run("parsers", test_one, seeds())
