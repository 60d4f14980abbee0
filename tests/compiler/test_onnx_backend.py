"""The ONNX backend node cases of the ``onnx`` wheel, for every op of the board's kernel table.

compile → export raw blob → ``rpcsrv.executor.load_module`` (``compiler_helpers.run_in_process``) →
factory "default" → set_input / run / get_output, compared with the expected outputs.  The per-op
table (with each failure's reason) is printed; run with ``-s`` to see it.  At least 95% of the
in-scope cases must pass.
"""

from __future__ import annotations

import pytest

from rpcsrv.client.compiler.conformance import report, run_case, select_cases
from compiler_helpers import run_in_process

PASS_RATE = 0.95


@pytest.fixture(scope="module")
def selected():
    return select_cases()


def test_backend_node_cases(selected, tmp_path):
    cases, skipped = selected
    assert len(cases) > 100, "the onnx wheel should provide many node cases for the kernel table"
    results = [run_case(c, run_in_process, tmp=str(tmp_path)) for c in cases]
    table = report(results)
    reasons: dict[str, int] = {}
    for why in skipped.values():
        kind = why.split()[0].rstrip(":")
        reasons[kind] = reasons.get(kind, 0) + 1
    print(f"\nONNX backend node cases: {len(cases)} in scope, skipped {len(skipped)} "
          f"({', '.join(f'{n} for {k}' for k, n in sorted(reasons.items()))})\n{table}")
    passed = sum(r.ok for r in results)
    assert passed >= PASS_RATE * len(results), table


def test_the_runner_is_pluggable_and_failures_carry_reasons(selected):
    cases, _ = selected
    some = [c for c in cases if c.name in ("test_add", "test_relu", "test_sub")]
    assert len(some) == 3
    calls = []

    def counting(path, inputs, n):
        calls.append(sorted(inputs))
        return run_in_process(path, inputs, n)

    assert all(run_case(c, counting).ok for c in some)
    assert calls and ["x", "y"] in calls

    def wrong(path, inputs, n):
        return [o * 0 + 1 for o in run_in_process(path, inputs, n)]

    bad = run_case(some[0], wrong)
    assert not bad.ok and "values differ" in bad.reason

    def broken(path, inputs, n):
        raise ConnectionError("board went away")

    down = run_case(some[0], broken)
    assert not down.ok and down.reason == "ConnectionError: board went away"
