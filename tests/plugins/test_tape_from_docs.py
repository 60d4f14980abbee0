"""A plugin written from docs/plugins.md alone (``tests/plugins/tape_plugin/``: the made-up "tape" accelerator, its
binary format, a codegen with DAG patterns and a numpy runtime whose weights come from the const loader), installed
from its own pyproject.toml's entry points the way tests/plugins install the example, then used as a vendor's user
would: ``byoc compile --codegen tape`` (the diamond and the residual block claimed as composites), ``rpcsrv serve``
running the library for the real apache-tvm client in both blob layouts and as a Relax VM executable (checked
against onnxruntime), ``rpcsrv inspect`` and ``extract``; and ``byoc run``, ``byoc profile``, ``byoc compare`` on
the board."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import ServerProcess, need_module
from plugin_helpers import reference

pytestmark = pytest.mark.tvm

PACKAGE = Path(__file__).resolve().parent / "tape_plugin"
COMPOSITES = ("tape.conv_silu", "tape.conv_residual", "tape.gemm_relu")


def installed(root: Path) -> str:
    """A site folder holding the package's distribution metadata with the entry points of its pyproject.toml;
    returns the PYTHONPATH (that folder and the package's source) that installs it."""
    project = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]
    info = root / "site" / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    groups = project["entry-points"]
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in eps.items()) + "\n"
        for group, eps in groups.items()))
    return os.pathsep.join([str(root / "site"), str(PACKAGE)])


def tape_model(seed: int = 3) -> onnx.ModelProto:
    """A CNN with a SiLU after its first conv (a diamond), a residual block reading its input twice, a lone Relu,
    max pools, a Gemm → Relu and a last Gemm."""
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype("float32")

    inits = {"w1": w(8, 3, 3, 3), "b1": w(8, 1)[:, 0], "w2": w(8, 8, 3, 3), "b2": w(8, 1)[:, 0],
             "fc1": w(16, 128), "fb1": w(16, 1)[:, 0], "fc2": w(16, 5), "fb2": w(5, 1)[:, 0]}
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             n("Sigmoid", ["c1"], ["g1"], name="gate1"),
             n("Mul", ["c1", "g1"], ["s1"], name="silu1"),
             n("MaxPool", ["s1"], ["m1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
             n("Relu", ["m1"], ["p"], name="lone_relu"),
             n("Conv", ["p", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             n("Relu", ["c2"], ["r2"], name="relu2"),
             n("Add", ["p", "r2"], ["a"], name="residual"),
             n("Relu", ["a"], ["ra"], name="relu3"),
             n("MaxPool", ["ra"], ["m2"], kernel_shape=[2, 2], strides=[2, 2], name="pool2"),
             n("Flatten", ["m2"], ["f"], name="flatten"),
             n("Gemm", ["f", "fc1", "fb1"], ["h"], transB=1, name="fc1"),
             n("Relu", ["h"], ["hr"], name="relu4"),
             n("Gemm", ["hr", "fc2", "fb2"], ["y"], name="fc2")]
    graph = helper.make_graph(nodes, "tape_cnn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
                              initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _run(env, *argv, check=True):
    out = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=300)
    if check:
        assert out.returncode == 0, out.stdout + out.stderr
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(environment with the package installed, folder, model, input): the model and x.npy in the folder, the
    library compiled as tape_classic.so and tape_ffi.so."""
    root = tmp_path_factory.mktemp("tape")
    env = dict(os.environ, PYTHONPATH=installed(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    model = tape_model()
    onnx.save(model, root / "tape.onnx")
    x = np.random.default_rng(7).standard_normal((1, 3, 16, 16)).astype("float32")
    np.save(root / "x.npy", x)
    for layout in ("classic", "ffi"):
        _run(env, "-m", "rpcsrv.client.cli", "compile", str(root / "tape.onnx"), "-o", str(root / f"tape_{layout}.so"),
             "--codegen", "tape", "--layout", layout)
    return env, root, model, x


def test_compile_claims_the_diamond_and_the_residual_block(built):
    env, root, _model, _x = built
    out = _run(env, "-m", "rpcsrv.client.cli", "compile", str(root / "tape.onnx"), "-o", str(root / "v.blob"),
               "--codegen", "tape", "-v").stdout
    assert "1 tape subgraph(s)" in out and "host function" not in out, out
    head = [line for line in out.splitlines() if line.startswith("  tvmgen_default_tape_main_0:")]
    assert len(head) == 1, out
    for name in COMPOSITES:
        assert name in head[0]
    assert "8 constant(s) (" in head[0] and "in the const loader" in head[0]
    assert "[conv, max_pool, relu, conv, max_pool, flatten, gemm, gemm]" in head[0]  # the lone Relu too
    assert "= conv.silu(" in out and "= conv.relu(" in out and " relu" in out  # the listing, from the codegen


@pytest.mark.parametrize("layout", ["classic", "ffi"])
def test_the_board_runs_it_for_the_real_tvm_client(built, layout, monkeypatch, tmp_path):
    tvm = need_module("tvm", "the real TVM client comes from `pip install apache-tvm`")
    need_module("onnxruntime", "the numeric reference")
    env, root, model, x = built
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    srv = ServerProcess("-v", *(["--isolate", "all"] if layout == "ffi" else []), workdir=tmp_path)
    try:
        sess = tvm.rpc.connect(srv.host, srv.port)
        lib = root / f"tape_{layout}.so"
        sess.upload(str(lib))
        dev = sess.cpu(0)
        gmod = sess.load_module(lib.name)["default"](dev)
        gmod["set_input"]("x", tvm.runtime.tensor(x, dev))
        gmod["run"]()
        np.testing.assert_allclose(gmod["get_output"](0).numpy(), reference(model, x), rtol=1e-4, atol=1e-5)
        fn = sess.load_module(lib.name)["tvmgen_default_tape_main_0"]  # called by name with a wrong argument
        with pytest.raises(Exception, match="takes 1 input"):
            fn(tvm.runtime.tensor(x, dev))
        assert srv.alive()
        assert "tape (rpcsrv-tape-plugin 0.2.0)" in srv.stderr()
    finally:
        srv.stop()


def test_the_relax_vm_calls_it_the_same_way(built, monkeypatch, tmp_path):
    tvm = need_module("tvm", "the real TVM client comes from `pip install apache-tvm`")
    need_module("onnxruntime", "the numeric reference")
    from tvm import relax

    env, root, model, x = built
    lib = root / "tape_relax.so"
    _run(env, "-m", "rpcsrv.client.cli", "compile", str(root / "tape.onnx"), "-o", str(lib), "--codegen", "tape",
         "--executor", "relax")
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    srv = ServerProcess(workdir=tmp_path)
    try:
        sess = tvm.rpc.connect(srv.host, srv.port)
        sess.upload(str(lib))
        dev = sess.cpu()
        vm = relax.VirtualMachine(sess.load_module(lib.name), dev)
        y = vm["main"](tvm.runtime.tensor(x, dev)).numpy()
        np.testing.assert_allclose(y, reference(model, x), rtol=1e-4, atol=1e-5)
    finally:
        srv.stop()


def test_inspect_and_extract(built, tmp_path):
    env, root, _model, _x = built
    out = _run(env, "-m", "rpcsrv", "inspect", str(root / "tape_classic.so")).stdout
    assert "tape (plugin tape): tvmgen_default_tape_main_0" in out
    assert "tape tvmgen_default_tape_main_0: 8 instruction(s) (conv.silu, maxpool, relu, conv.relu," in out
    assert "tvmgen_default_tape_main_0: tape program" in out
    info = json.loads(_run(env, "-m", "rpcsrv", "inspect", "--json", str(root / "tape_ffi.so")).stdout)
    (tape,) = [m for m in info["modules"] if m["type_key"] == "tape"]
    assert tape["tape"]["weights"] == [f"tvmgen_default_tape_main_0.{k}" for k in range(8)]
    _run(env, "-m", "rpcsrv", "extract", str(root / "tape_classic.so"), "-o", str(tmp_path / "parts"))
    manifest = json.loads((tmp_path / "parts" / "manifest.json").read_text())
    (entry,) = [m for m in manifest["modules"] if m["type_key"] == "tape"]
    assert entry["tape_symbol"] == "tvmgen_default_tape_main_0"
    listing = (tmp_path / "parts" / entry["tape_listing"][0]).read_text()
    assert listing.startswith("0: conv\n1: maxpool\n2: relu\n3: conv\n")


@pytest.fixture(scope="module")
def board(built, tmp_path_factory):
    env, *_ = built
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = env["PYTHONPATH"]
    try:
        srv = ServerProcess(workdir=tmp_path_factory.mktemp("tape-board"))
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    yield srv
    assert srv.alive(), "the board died during the tests"
    srv.stop()


def _byoc(env, root, command, layout, port, *extra):
    lib = str(root / f"tape_{layout}.so")
    args = [lib, str(root / "tape.onnx")] if command == "compare" else [lib]
    return _run(env, "-m", "rpcsrv.client.cli", command, *args, "--port", str(port), "--input", f"x={root / 'x.npy'}",
                *extra, check=False)


def _run_and_profile(built, board, layout):
    need_module("onnxruntime", "the numeric reference")
    env, root, model, x = built
    out = _byoc(env, root, "run", layout, board.port, "-o", str(root / f"out_{layout}.npz"))
    assert out.returncode == 0, out.stderr
    np.testing.assert_allclose(np.load(root / f"out_{layout}.npz")["y"], reference(model, x), rtol=1e-4, atol=1e-5)
    out = _byoc(env, root, "profile", layout, board.port, "--json")
    assert out.returncode == 0, out.stderr
    assert "tvmgen_default_tape_main_0" in out.stdout
    assert board.alive()


def test_byoc_run_and_profile(built, board):
    """The tvm-ffi layout: byoc reads the library's inputs and outputs without knowing the tape kind."""
    _run_and_profile(built, board, "ffi")


def test_byoc_run_profile_and_compare(built, board):
    """Everything a vendor's user does on the board, the classic layout included."""
    _run_and_profile(built, board, "classic")
    env, root, _model, _x = built
    for layout in ("classic", "ffi"):
        out = _byoc(env, root, "compare", layout, board.port)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "agree" in out.stdout


def test_a_payload_must_carry_its_length():
    """What the docs say of ``fmt``: zlib data alone reads to the end of the stream, so the classic layout (payloads
    back to back) cannot be read; the tape payload's u32 count makes it readable in both layouts."""
    sys.path.insert(0, str(PACKAGE))
    try:
        from construct import Compressed

        from rpcsrv.loader import GraphExecutorFactoryModule, HostLibraryModule, LoaderError
        from rpcsrv.loader.blob import build_blob, parse_blob
        from rpcsrv.loader.node import PayloadCodec
        from rpcsrv.loader.plugins import add_codec, isolated
        from tape import fmt
    finally:
        sys.path.remove(str(PACKAGE))
    program = dict(version=fmt.VERSION, symbol="f", slots=[dict(dims=[1, 4])], args=[0], results=[0], weights=[],
                   tape=[dict(op="relu", act="none", srcs=[0], dst=0, skip=-1, post="none", ints=[])])
    for payload, classic_reads in ((fmt.PAYLOAD, True), (Compressed(fmt.Program, "zlib"), False)):
        with isolated():
            add_codec(fmt.TYPE_KEY, PayloadCodec(payload, fmt.decode, fmt.encode))
            node = fmt.TapeModule(fmt.Program.parse(fmt.Program.build(program)))
            root = GraphExecutorFactoryModule("{}", {}, "default", imports=[HostLibraryModule([], imports=[node])])
            (tape,) = [m for m in parse_blob(build_blob(root, "ffi")).walk() if m.type_key == "tape"]
            assert tape.program.symbol == "f"
            if classic_reads:
                assert [m.type_key for m in parse_blob(build_blob(root, "classic")).walk()][-1] == "tape"
            else:
                with pytest.raises(LoaderError):
                    parse_blob(build_blob(root, "classic"))
