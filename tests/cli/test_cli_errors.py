"""Every CLI failure a user can cause is one ``prog: error: ...`` line and exit status 2, no traceback.

One test per case of issue 15: ``byoc run`` (missing library, unreachable board, wrong input name,
shape or dtype, an .npz where an .npy is expected, a wrong key, an unwritable ``-o`` checked before
the run, a missing input), ``byoc demo`` against a dead port, ``rpcsrv serve`` (busy port, port out
of range, unknown host, bad limits, a ``--workdir`` that is a file, ``--port-end`` <= ``--port``),
output piped into ``head``, and ``--dialect classic`` against a tvm-ffi client.  The commands run as
the user runs them: in a child process.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rpcsrv.client.compiler import compile_onnx
from rpcsrv.client.demo_models import seed_model
from conftest import need_module


def cli(*argv, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout)


def one_error_line(proc: subprocess.CompletedProcess, prog: str) -> str:
    """The single ``prog: error: ...`` line of a failed command."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), proc.stderr
    return lines[0]


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def seed_lib(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("lib") / "seed.blob"
    compile_onnx(seed_model(), ops="add,sub,mul").export_library(str(path))
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("inputs")
    rng = np.random.default_rng(0)
    files = {}
    for i in range(4):
        files[f"input{i}"] = folder / f"x{i}.npy"
        np.save(files[f"input{i}"], rng.standard_normal((10, 10)).astype(np.float32))
    np.savez(folder / "all.npz", **{k: np.load(v) for k, v in files.items()})
    files["npz"] = folder / "all.npz"
    return files


def run_args(lib, inputs, port, *extra, skip=()):
    args = ["rpcsrv.client.cli", "run", lib, "--port", port, "--no-progress"]
    for name in ("input0", "input1", "input2", "input3"):
        if name not in skip:
            args += ["--input", f"{name}={inputs[name]}"]
    return [*args, *extra]


# -- byoc run: works, and keeps the model's output names

def test_run_saves_outputs_under_the_model_names(server, seed_lib, inputs, tmp_path):
    out = tmp_path / "out.npz"
    proc = cli(*run_args(seed_lib, inputs, server.port, "-o", out))
    assert proc.returncode == 0, proc.stderr
    with np.load(out) as z:
        assert z.files == ["out"]
        x = [np.load(inputs[f"input{i}"]) for i in range(4)]
        np.testing.assert_allclose(z["out"], ((x[0] + x[1]) - x[2]) * x[3], rtol=1e-6)
    assert "out: shape (10, 10)" in proc.stdout


def test_run_missing_library(inputs, tmp_path):
    err = one_error_line(cli(*run_args(tmp_path / "nope.so", inputs, 9)), "byoc")
    assert "does not exist" in err


def test_run_file_that_is_not_a_library(inputs, tmp_path):
    bogus = tmp_path / "model.so"
    bogus.write_bytes(b"hello, not a library at all" * 10)
    one_error_line(cli(*run_args(bogus, inputs, 9)), "byoc")


def test_run_unreachable_board(seed_lib, inputs):
    err = one_error_line(cli(*run_args(seed_lib, inputs, dead_port())), "byoc")
    assert "cannot reach the board" in err


def test_run_wrong_input_name(seed_lib, inputs):
    proc = cli("rpcsrv.client.cli", "run", seed_lib, "--port", 9, "--input", f"bogus={inputs['input0']}")
    err = one_error_line(proc, "byoc")
    assert "no input 'bogus'" in err and "input0 10x10 float32" in err


def test_run_wrong_input_shape(seed_lib, inputs, tmp_path):
    np.save(tmp_path / "small.npy", np.zeros((2, 2), np.float32))
    err = one_error_line(cli(*run_args(seed_lib, inputs, 9, "--input", f"input0={tmp_path / 'small.npy'}",
                                       skip=("input0",))), "byoc")
    assert "shape 2x2 given, the model wants 10x10" in err


def test_run_wrong_input_dtype(seed_lib, inputs, tmp_path):
    np.save(tmp_path / "f64.npy", np.zeros((10, 10)))
    err = one_error_line(cli(*run_args(seed_lib, inputs, 9, "--input", f"input1={tmp_path / 'f64.npy'}",
                                       skip=("input1",))), "byoc")
    assert "dtype float64 given, the model wants float32" in err


def test_run_npz_where_npy_expected(seed_lib, inputs):
    err = one_error_line(cli(*run_args(seed_lib, inputs, 9, "--input", f"input0={inputs['npz']}",
                                       skip=("input0",))), "byoc")
    assert ".npz archive" in err


def test_run_missing_input_fails_instead_of_running_on_zeros(seed_lib, inputs):
    err = one_error_line(cli(*run_args(seed_lib, inputs, 9, skip=("input2",))), "byoc")
    assert "no value for input(s) input2" in err


def test_run_wrong_key(keyed_server, seed_lib, inputs):
    err = one_error_line(cli(*run_args(seed_lib, inputs, keyed_server.port, "--key", "wrong")), "byoc")
    assert "refused" in err and "wrong" in err


def test_run_unwritable_output_is_checked_before_the_run(seed_lib, inputs, tmp_path):
    # the port is dead: had the run started first, the error would be about the board
    err = one_error_line(cli(*run_args(seed_lib, inputs, dead_port(), "-o", tmp_path / "no" / "out.npz")), "byoc")
    assert "-o" in err and "does not exist" in err
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        err = one_error_line(cli(*run_args(seed_lib, inputs, dead_port(), "-o", ro / "out.npz")), "byoc")
        assert "not writable" in err


def test_demo_against_a_dead_port():
    err = one_error_line(cli("rpcsrv.client.cli", "demo", "--port", dead_port(), timeout=120), "byoc")
    assert "cannot reach the board" in err


# -- rpcsrv serve

def test_serve_busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        err = one_error_line(cli("rpcsrv", "serve", "--port", s.getsockname()[1]), "rpcsrv")
    assert "cannot listen" in err and "in use" in err


@pytest.mark.parametrize("flags,words", [
    (["--port", "99999"], "--port 99999 is not a TCP port"),
    (["--port", "-1"], "--port -1 is not a TCP port"),
    (["--port", "9000", "--port-end", "9000"], "must be greater than --port"),
    (["--max-memory-mb", "0"], "--max-memory-mb 0 must be a positive"),
    (["--max-workspace-mb", "-5"], "--max-workspace-mb -5 must be a positive"),
    (["--health-interval", "0"], "--health-interval must be a positive number of seconds, got 0"),
    (["--call-timeout", "inf"], "--call-timeout must be a positive number of seconds, got inf"),
    (["--call-timeout", "5", "--native", "inprocess"], "--call-timeout needs --native isolated"),
    (["--call-timeout", "5", "--no-native"], "--call-timeout needs --native isolated"),
])
def test_serve_validates_flags_at_start(flags, words):
    assert words in one_error_line(cli("rpcsrv", "serve", *flags), "rpcsrv")


def test_serve_workdir_that_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    assert "is a file" in one_error_line(cli("rpcsrv", "serve", "--port", "0", "--workdir", f), "rpcsrv")


def test_serve_unknown_host():
    err = one_error_line(cli("rpcsrv", "serve", "--host", "no-such-host.invalid", "--port", "0"), "rpcsrv")
    assert "no-such-host.invalid" in err


def test_inspect_not_a_library(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("just some text, certainly no library\n" * 4)
    one_error_line(cli("rpcsrv", "inspect", f), "rpcsrv")


# -- pipes

@pytest.mark.parametrize("prog", ["rpcsrv", "byoc"])
def test_output_piped_into_head(prog, seed_lib, tmp_path):
    import onnx

    onnx.save(seed_model(), tmp_path / "m.onnx")
    argv = ["rpcsrv", "inspect", "--json", seed_lib] if prog == "rpcsrv" else \
        ["rpcsrv.client.cli", "compile", tmp_path / "m.onnx", "-o", tmp_path / "m.blob", "-v"]
    writer = subprocess.Popen([sys.executable, "-m", *map(str, argv)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    writer.stdout.close()  # like `head` that has had enough: gone before the command writes
    err = writer.stderr.read().decode()
    status = writer.wait(60)
    assert "Traceback" not in err and "Exception ignored" not in err
    assert status == 2 and err.strip().splitlines() == [f"{prog}: error: output closed early (broken pipe)"]


# -- dialects

@pytest.mark.tvm
def test_fixed_classic_dialect_names_the_mismatch_to_a_tvm_ffi_client(tmp_path):
    tvm = need_module("tvm", "the real TVM client comes from `pip install apache-tvm`")
    from conftest import ServerProcess

    srv = ServerProcess("--dialect", "classic", workdir=tmp_path)
    try:
        sess = tvm.rpc.connect(srv.host, srv.port)
        with pytest.raises(Exception, match="dialect mismatch: the peer speaks tvm-ffi"):
            sess.get_function("tvm.rpc.server.workpath")
        assert srv.alive()
    finally:
        srv.stop()


# -- byoc bench rpc: a server that does not start says why

def test_bench_shows_why_a_server_did_not_start():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import rpc_bench

    cmd = [sys.executable, "-c", "import sys; print('No module named cloudpickle', file=sys.stderr); sys.exit(3)"]
    with pytest.raises(RuntimeError) as info:
        rpc_bench.start(cmd, r":(\d+)", timeout=30)
    assert "exit status 3" in str(info.value) and "No module named cloudpickle" in str(info.value)


def test_run_board_refusal_is_one_line(tmp_path, inputs):
    """What the board refuses (here: an upload over its workspace limit) comes back as one line."""
    from onnx import TensorProto, helper, numpy_helper

    from conftest import ServerProcess

    big = numpy_helper.from_array(np.ones((10, 10), np.float32), "c")
    filler = numpy_helper.from_array(np.ones((600, 1000), np.float32), "unused_out")
    graph = helper.make_graph([helper.make_node("Add", ["input0", "c"], ["y"])], "big",
                              [helper.make_tensor_value_info("input0", TensorProto.FLOAT, [10, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [10, 10]),
                               helper.make_tensor_value_info("unused_out", TensorProto.FLOAT, [600, 1000])],
                              [big, filler])
    lib = tmp_path / "big.blob"
    compile_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])).export_library(str(lib))
    assert lib.stat().st_size > 2 << 20
    srv = ServerProcess("--max-workspace-mb", "1", workdir=tmp_path / "work")
    try:
        err = one_error_line(cli("rpcsrv.client.cli", "run", lib, "--port", srv.port, "--no-progress",
                                 "--input", f"input0={inputs['input0']}"), "byoc")
        assert "the board reported" in err and "workspace" in err
    finally:
        srv.stop()


def test_run_takes_all_inputs_from_one_npz(server, seed_lib, inputs):
    proc = cli("rpcsrv.client.cli", "run", seed_lib, "--port", server.port, "--no-progress", "--input", inputs["npz"])
    assert proc.returncode == 0, proc.stderr
    assert "out: shape (10, 10)" in proc.stdout
