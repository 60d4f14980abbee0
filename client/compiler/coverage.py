"""How much of the board's executor the host C covers: the ONNX ops (default domain) whose kernel the
board's ExampleJSON runtime has, split into those a host function can also compute (a partial
offload may leave them to the host) and those it cannot (they must be offloaded)."""

from __future__ import annotations

import onnx

from rpcsrv.loader.opset import OPS, onnx_op_to_kernel

from .hostgen import HOST_OPS


def executor_onnx_ops() -> list[str]:
    """ONNX op types (default domain) the board's executor has a kernel for."""
    names = {s.name for s in onnx.defs.get_all_schemas() if s.domain in ("", "ai.onnx")}
    return sorted(n for n in names if onnx_op_to_kernel(n) in OPS)


def host_coverage() -> tuple[list[str], list[str]]:
    """(covered, missing): the executor's ONNX ops with and without a host implementation."""
    ops = executor_onnx_ops()
    host = set(HOST_OPS)
    return [n for n in ops if n in host], [n for n in ops if n not in host]


if __name__ == "__main__":
    covered, missing = host_coverage()
    print(f"host C covers {len(covered)} of the {len(covered) + len(missing)} ONNX ops the board's executor runs")
    print("covered:", ", ".join(covered))
    print("not covered:", ", ".join(missing))
