"""The ONNX backend node cases over the wire: compile → ``rpcsrv serve`` → upload, load_module,
``lib["default"](dev)``, set_input / run / get_output through a real RPC client → compare.

Run once with the real TVM client (apache-tvm, tvm-ffi dialect) and once with our own client,
each keeping one session for all cases.  At least 95% of the in-scope cases must pass through
each; the per-op table with every failure's reason is printed (``-s`` shows it).  Whatever fails
must fail the same way in process: the wire adds no failure of its own.
"""

from __future__ import annotations

import pytest

from rpcsrv.client.compiler.conformance import report, run_case, select_cases
from rpcsrv.client.compiler.conformance_rpc import RUNNERS
from compiler_helpers import run_in_process
from conftest import need_module

PASS_RATE = 0.95


@pytest.fixture(scope="module")
def cases():
    return select_cases()[0]


@pytest.mark.parametrize("kind", ["ours", "tvm"])
def test_backend_node_cases_over_rpc(kind, cases, server, tmp_path):
    if kind == "tvm":
        need_module("tvm", "the real TVM client comes from `pip install apache-tvm`")
    runner = RUNNERS[kind](server.host, server.port)
    try:
        results = [run_case(c, runner, tmp=str(tmp_path)) for c in cases]
    finally:
        runner.close()
    table = report(results)
    print(f"\nONNX backend node cases through rpcsrv serve with the {kind} client:\n{table}")
    assert server.alive(), server.stderr()
    passed = sum(r.ok for r in results)
    assert passed >= PASS_RATE * len(results), table
    # the failures are the kernels' known gaps, not transport trouble: same outcome in process
    by_name = {c.name: c for c in cases}
    for r in results:
        if not r.ok:
            local = run_case(by_name[r.name], run_in_process, tmp=str(tmp_path))
            assert not local.ok, f"{r.name} passes in process but fails over RPC: {r.reason}"
            assert local.reason.split(": ", 1)[-1] in r.reason or r.reason.startswith("output"), \
                (r.reason, local.reason)
