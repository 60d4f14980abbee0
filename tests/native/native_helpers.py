"""Fixtures for the native tests: C libraries built by gcc or a cross compiler, TVM-built kernels."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np

from conftest import need_module, need_program

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def build_c(name: str, out_dir: Path, cc: str = "gcc") -> Path:
    """``fixtures/<name>.c`` compiled by ``cc`` into ``out_dir/<name>.so``."""
    exe = need_program(cc, f"builds the {name} fixture")
    out = out_dir / f"{name}.{Path(cc).name}.so"
    subprocess.run([exe, "-O2", "-shared", "-fPIC", "-o", str(out), str(FIXTURES / f"{name}.c")], check=True,
                   capture_output=True)
    return out


#: name -> (dtype, number of buffers, numpy reference from the inputs)
KERNELS = {
    "fill_f32": ("float32", 1, lambda: [np.arange(16, dtype="float32") * 3]),
    "add_one_f32": ("float32", 2, lambda a: [a + 1]),
    "scale_f64": ("float64", 2, lambda a: [a * 2.5]),
    "mul_i32": ("int32", 3, lambda a, b: [a * b]),
    "sub_f64": ("float64", 3, lambda a, b: [a - b]),
}


_BUILD = """
import sys
from tvm import te
import tvm

def kernel(name, dtype, nbuf, n, out):
    ins = [te.placeholder((n,), name=f"A{i}", dtype=dtype) for i in range(nbuf - 1)]
    body = {
        "fill_f32": lambda i: (i * 3).astype(dtype),
        "add_one_f32": lambda i: ins[0][i] + 1.0,
        "scale_f64": lambda i: ins[0][i] * 2.5,
        "mul_i32": lambda i: ins[0][i] * ins[1][i],
        "sub_f64": lambda i: ins[0][i] - ins[1][i],
    }[name]
    res = te.compute((n,), body, name="B")
    func = te.create_prim_func([*ins, res]).with_attr("global_symbol", name)
    tvm.compile(func, target="llvm").export_library(out)

def matmul(n, m, k, out):
    a = te.placeholder((n, k), name="A", dtype="float32")
    b = te.placeholder((k, m), name="B", dtype="float32")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    tvm.compile(te.create_prim_func([a, b, c]), target="llvm").export_library(out)

def parallel_workspace(n, out):
    a = te.placeholder((n,), name="A")
    b = te.compute((n,), lambda i: a[i] * 2.0, name="B")  # an intermediate buffer: a workspace
    c = te.compute((n,), lambda i: b[i] + b[n - 1 - i], name="C")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, c]).with_attr("global_symbol", "par_ws"))
    block = sch.get_sblock("C") if hasattr(sch, "get_sblock") else sch.get_block("C")
    sch.parallel(sch.get_loops(block)[0])
    tvm.compile(sch.mod, target="llvm").export_library(out)

for job in eval(sys.argv[1]):
    {"kernel": kernel, "matmul": matmul, "par_ws": parallel_workspace}[job[0]](*job[1:])
"""


def _build(jobs: list[tuple]) -> None:
    """Build with the real apache-tvm in a child process: the test process never loads TVM's
    libraries, like a board (whose libtvm_ffi would otherwise take the library's symbols first)."""
    if importlib.util.find_spec("tvm") is None:
        need_module("tvm", "compiles the kernels")  # skips (fails under RPCSRV_REQUIRE_ALL=1)
    subprocess.run([sys.executable, "-c", _BUILD, repr(jobs)], check=True, capture_output=True, timeout=600)


def tvm_kernels(out_dir: Path, names=None, n: int = 16) -> dict[str, Path]:
    """Kernels compiled by the real apache-tvm (``tvm.compile(te.create_prim_func(...), "llvm")``)."""
    names = sorted(KERNELS) if names is None else names
    paths = {name: out_dir / f"{name}.so" for name in names}
    _build([("kernel", name, KERNELS[name][0], KERNELS[name][1], n, str(paths[name])) for name in names])
    return paths


def kernel_inputs(name: str, n: int = 16, seed: int = 0) -> list[np.ndarray]:
    dtype, nbuf, _ = KERNELS[name]
    rng = np.random.default_rng(seed)
    if dtype.startswith("int"):
        return [rng.integers(-1000, 1000, n).astype(dtype) for _ in range(nbuf - 1)]
    return [rng.standard_normal(n).astype(dtype) for _ in range(nbuf - 1)]


def parallel_workspace_kernel(out_dir: Path, n: int = 4096) -> Path:
    """``par_ws(A, C)``: C[i] = 2A[i] + 2A[n-1-i] with a parallel loop and an intermediate buffer, so the
    compiled code calls the runtime's parallel launch and workspace through its context pointers."""
    path = out_dir / "par_ws.so"
    _build([("par_ws", n, str(path))])
    return path


def matmul_candidates(out_dir: Path, sizes: list[tuple[int, int, int]]) -> list[Path]:
    """TVM-compiled matmuls ``C[n, m] = A[n, k] @ B[k, m]`` (entry ``main``), as a tuner's candidates."""
    paths = [out_dir / f"matmul_{i}.so" for i in range(len(sizes))]
    _build([("matmul", n, m, k, str(p)) for (n, m, k), p in zip(sizes, paths)])
    return paths
