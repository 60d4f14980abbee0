"""Shared fixtures of the Relax VM tests: libraries compiled by apache-tvm (once per test session).

Import the fixtures into a test module (``from vm_fixtures import tvm, vm_libs``).  The libraries
are built into one folder under pytest's session temp dir, so every module of a session reuses
them (a build takes a few seconds per model).
"""

from __future__ import annotations

import pytest

from conftest import need_module
import vm_models


@pytest.fixture(scope="module")
def tvm():
    need_module("onnx", "the test models are written as ONNX graphs")
    need_module("onnxruntime", "onnxruntime is the numeric reference next to TVM's own VM")
    return need_module("tvm", "libraries are compiled with `pip install apache-tvm`")


@pytest.fixture(scope="module")
def vm_libs(tvm, tmp_path_factory):
    """name -> path of that model's library (see ``vm_models.NAMES``)."""
    folder = tmp_path_factory.getbasetemp() / "vm-libs"
    folder.mkdir(exist_ok=True)
    return {name: vm_models.build(name, folder) for name in vm_models.NAMES}


def tvm_reference(tvm, lib, args):
    """Outputs of TVM's own in-process VM for ``lib`` on ``args`` (a list, tuples flattened)."""
    from tvm import relax

    vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    return [o.numpy() for o in out] if not hasattr(out, "numpy") else [out.numpy()]
