"""``byoc demo``: the seed story end to end against a running board.

1. the BYOC guide's subgraph (add → subtract → multiply on four 10x10 inputs), compiled for a small
   accelerator that only has ``add,sub,mul``;
2. a small CNN (conv+bias+relu, pooling, dense, softmax) on the full ExampleJSON op set;

each exported as a ``.so`` (or a raw blob when there is no C compiler), uploaded to the board,
run through RPC, and checked against onnxruntime.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import numpy as np

from .demo_models import onnxruntime_outputs, sample_inputs, seed_model, small_cnn
from .run import UserError, run_library


def _compile(model, ops, out_dir: Path, name: str) -> Path:
    from . import compile_onnx

    compiled = compile_onnx(model, ops=ops)
    fmt = "so" if shutil.which("cc") or shutil.which("gcc") else "blob"
    path = out_dir / f"{name}.{'so' if fmt == 'so' else 'blob'}"
    compiled.export_library(str(path))
    return path


def run_demo(host: str, port: int, key: str = "", quiet: bool = False) -> bool:
    """Compile, run and check both demo models; True when every output matches onnxruntime."""
    try:
        import onnxruntime  # noqa: F401 - the reference the demo checks against
    except ImportError:
        raise UserError("byoc demo compares with onnxruntime, which is not installed: "
                        "pip install 'rpcsrv[demo]' (scripts/demo.sh does)") from None
    cases = [("byoc_seed", seed_model(), "add,sub,mul"), ("small_cnn", small_cnn(), None)]
    ok = True
    with tempfile.TemporaryDirectory(prefix="byoc-demo-") as tmp:
        for name, model, ops in cases:
            lib = _compile(model, ops.split(",") if ops else None, Path(tmp), name)
            inputs = sample_inputs(model)
            outputs, timer = run_library(str(lib), host, port, key, inputs, progress=False)
            expected = onnxruntime_outputs(model, inputs)
            for i, (got, want) in enumerate(zip(outputs, expected)):
                err = float(np.max(np.abs(got - want))) if got.size else 0.0
                good = got.shape == want.shape and np.allclose(got, want, rtol=1e-4, atol=1e-5)
                ok &= good
                print(f"{name}: output {i} {tuple(got.shape)} max |rpcsrv - onnxruntime| = {err:.2e} "
                      f"{'OK' if good else 'MISMATCH'}")
            if len(outputs) != len(expected):
                ok = False
                print(f"{name}: {len(outputs)} outputs, onnxruntime has {len(expected)}")
            if not quiet:
                print(f"  library {lib.name}: {lib.stat().st_size} bytes; " +
                      ", ".join(f"{n} {t * 1e3:.1f} ms" for n, t in timer.phases))
    print("demo:", "all outputs match onnxruntime" if ok else "MISMATCH")
    return ok


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="compile two models, run them on a board, check the numbers",
                       description="The seed story end to end against a running board (rpcsrv serve): "
                                   "compile the BYOC guide's add/sub/mul subgraph and a small CNN, upload "
                                   "them, run them over TVM RPC and compare with onnxruntime.  Needs "
                                   "onnxruntime (pip install 'rpcsrv[demo]').")
    p.add_argument("--host", default="127.0.0.1", help="the board's address")
    p.add_argument("--port", type=int, default=9090, help="the board's port")
    p.add_argument("--key", default="", help="the key the board was started with (rpcsrv serve --key)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    return 0 if run_demo(args.host, args.port, args.key) else 1
