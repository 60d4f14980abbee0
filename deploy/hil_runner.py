"""The hardware-in-the-loop runner: the vendor's host side of a board farm.

Compiles the two demo models (``rpcsrv.client.demo_models``: the BYOC guide's add/sub/mul graph and a small
CNN) into raw-blob libraries with rpcsrv's client (no C compiler needed), computes reference outputs
with onnxruntime, then asks the TVM tracker for boards with the *real* TVM client
(``tvm.rpc.connect_tracker(host, port).request(key)``) and runs the models there, alternating, the
way TVM's graph executor API is used (``lib["default"](dev)``, ``set_input``, ``run``, ``get_output``).

Every output is compared with onnxruntime; the exit status is non-zero on any mismatch or failure, or
when fewer than ``--boards`` distinct boards served.  A board is told apart by the workspace path its
``tvm.rpc.server.workpath`` returns (give each board its own ``--workdir``).

    python deploy/hil_runner.py --tracker 127.0.0.1:9190 --key board-x --requests 20 --boards 2

Used by ``docker/compose.yml`` (the runner service) and by ``tests/hil`` and ``tests/deploy``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class Case:
    name: str
    library: Path
    inputs: dict
    expected: list


@dataclass
class Tally:
    ok: int = 0
    failed: list = field(default_factory=list)
    boards: dict = field(default_factory=dict)  # board (workdir) -> requests served

    def as_dict(self) -> dict:
        return {"ok": self.ok, "failed": self.failed, "boards": self.boards}


def build_cases(out_dir: Path) -> list[Case]:
    """The demo models as raw-blob libraries, with inputs and onnxruntime's outputs."""
    from rpcsrv.client.compiler import compile_onnx
    from rpcsrv.client.demo_models import onnxruntime_outputs, sample_inputs, seed_model, small_cnn

    cases = []
    for name, model, ops in [("byoc_seed", seed_model(), ["add", "sub", "mul"]), ("small_cnn", small_cnn(), None)]:
        lib = out_dir / f"{name}.blob"
        compile_onnx(model, ops=ops).export_library(str(lib), fmt="blob")
        inputs = sample_inputs(model)
        cases.append(Case(name, lib, inputs, onnxruntime_outputs(model, inputs)))
    return cases


def board_of(sess) -> str:
    """Which board a session landed on: the parent of its workspace."""
    return str(Path(sess.get_function("tvm.rpc.server.workpath")("x")).parent.parent)


def run_case(tvm, sess, case: Case) -> float:
    """Upload, load and run ``case`` in ``sess``; the largest |error| against onnxruntime (raises on
    a wrong shape or count)."""
    sess.upload(str(case.library))
    lib = sess.load_module(case.library.name)
    dev = sess.cpu(0)
    gmod = lib["default"](dev)
    set_input, run, get_output = gmod["set_input"], gmod["run"], gmod["get_output"]
    for name, value in case.inputs.items():
        set_input(name, tvm.runtime.tensor(value, dev))
    run()
    worst = 0.0
    for i, want in enumerate(case.expected):
        got = get_output(i).numpy()
        if got.shape != want.shape:
            raise AssertionError(f"{case.name} output {i}: shape {got.shape}, expected {want.shape}")
        if not np.allclose(got, want, rtol=1e-4, atol=1e-5):
            raise AssertionError(f"{case.name} output {i}: max error {np.max(np.abs(got - want)):.3g}")
        worst = max(worst, float(np.max(np.abs(got - want))))
    return worst


def request_and_run(tvm, host: str, port: int, key: str, case: Case, tally: Tally, timeout: float = 60.0,
                    session_timeout: float = 60.0) -> None:
    """One request through the tracker; retried while the tracker is away (bounded by ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            tracker = tvm.rpc.connect_tracker(host, port)
            sess = tracker.request(key, session_timeout=session_timeout, max_retry=2)
            break
        except (RuntimeError, OSError, ConnectionError) as exc:  # the tracker is restarting
            if time.monotonic() > deadline:
                raise RuntimeError(f"no board for {key!r} within {timeout}s: {exc}") from None
            time.sleep(0.5)
    board = board_of(sess)
    run_case(tvm, sess, case)
    tally.ok += 1
    tally.boards[board] = tally.boards.get(board, 0) + 1


def wait_for_boards(tvm, host: str, port: int, key: str, count: int, timeout: float) -> list:
    """Poll ``tracker.summary()`` until ``count`` boards are listed under ``key``; their entries."""
    deadline = time.monotonic() + timeout
    listed: list = []
    while time.monotonic() < deadline:
        try:
            info = tvm.rpc.connect_tracker(host, port).summary()
            listed = [s for s in info["server_info"] if s.get("key") == "server:" + key]
            if len(listed) >= count:
                return listed
        except (RuntimeError, OSError, ConnectionError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{len(listed)} of {count} boards registered under {key!r} after {timeout}s")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tracker", required=True, metavar="HOST:PORT")
    p.add_argument("--key", required=True)
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--boards", type=int, default=2, help="distinct boards that must serve")
    p.add_argument("--wait", type=float, default=120.0, help="seconds to wait for the boards to register")
    args = p.parse_args(argv)
    import tvm

    host, _, port = args.tracker.rpartition(":")
    with tempfile.TemporaryDirectory(prefix="hil-") as tmp:
        cases = build_cases(Path(tmp))
        listed = wait_for_boards(tvm, host, int(port), args.key, args.boards, args.wait)
        print(f"runner: {len(listed)} boards registered: {[s['addr'] for s in listed]}", flush=True)
        tally = Tally()
        for i in range(args.requests):
            case = cases[i % len(cases)]
            try:
                request_and_run(tvm, host, int(port), args.key, case, tally)
            except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
                tally.failed.append(f"request {i} ({case.name}): {type(exc).__name__}: {exc}")
    print("runner:", json.dumps(tally.as_dict()), flush=True)
    good = not tally.failed and tally.ok == args.requests and len(tally.boards) >= args.boards
    print("runner:", "PASS" if good else "FAIL", flush=True)
    return 0 if good else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
