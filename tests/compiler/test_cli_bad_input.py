"""``byoc compile`` and the user errors: clear one-line causes, status 2, no traceback."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from rpcsrv.client import CompileError, compile_onnx
from rpcsrv.client.cli import build_parser, main
from rpcsrv.client.demo_models import seed_model, small_cnn
from compiler_helpers import chain_model
from conftest import need_program
from rpcsrv.cli import main as rpcsrv_main
from rpcsrv.loader.inspect import inspect_library


def _byoc(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _user_error(capsys, *argv) -> str:
    rc, _, err = _byoc(capsys, *argv)
    assert rc == 2
    assert err.startswith("byoc: error: ") and "Traceback" not in err
    return err


def test_compile_so_and_inspect_shows_it(tmp_path, capsys):
    src = tmp_path / "cnn.onnx"
    onnx.save(small_cnn(), src)
    rc, out, _ = _byoc(capsys, "compile", src, "-o", tmp_path / "cnn.blob")
    assert rc == 0 and "wrote" in out and "tvmgen_default_examplejson_main_0" in out
    rc, out, _ = _byoc(capsys, "compile", src, "-o", tmp_path / "cnn2.blob", "-q", "-v")
    assert rc == 0 and out.startswith("\n# ExampleJSON of tvmgen_default_examplejson_main_0\n")
    assert '"func_name": "tvmgen_default_examplejson_main_0"' in out
    assert rpcsrv_main(["inspect", str(tmp_path / "cnn.blob")]) == 0
    shown = capsys.readouterr().out
    for what in ("GraphExecutorFactory", "const_loader", "examplejson",
                 "tvmgen_default_examplejson_main_0_const_5", "image"):
        assert what in shown


def test_inspect_summary_matches_the_compiled_model(tmp_path):
    need_program("cc")
    compiled = compile_onnx(seed_model(), ops="add,sub,mul")
    path = compiled.export_library(tmp_path / "seed.so")
    info = inspect_library(path)
    assert (info["container"], info["symbol"], info["layout"]) == ("elf", "__tvm_dev_mblob", "classic")
    mods = {m["type_key"]: m for m in info["modules"]}
    graph = mods["GraphExecutorFactory"]["graph"]
    assert [i["name"] for i in graph["inputs"]] == compiled.input_names
    assert [o["func_name"] for o in graph["ops"]] == [sg.symbol for sg in compiled.subgraphs]
    (sub,) = mods["examplejson"]["subgraphs"]
    assert sub["name"] == compiled.subgraphs[0].symbol
    assert sub["ops"] == {op: compiled.subgraphs[0].ops.count(op) for op in compiled.subgraphs[0].ops}


def test_subcommands_from_other_modules_are_registered():
    choices = build_parser()._subparsers._group_actions[0].choices
    assert "compile" in choices
    assert {"run", "demo"} <= set(choices)  # client/run.py and client/demo.py plug in


def test_partial_ops_error_lists_the_nodes(tmp_path, capsys):
    src = tmp_path / "chain.onnx"
    onnx.save(chain_model(), src)
    err = _user_error(capsys, "compile", src, "-o", tmp_path / "x.blob", "--ops", "add,mul", "--no-host")
    assert "'relu' (Relu)" in err and "'sigmoid' (Sigmoid)" in err and "2 subgraph(s)" in err
    assert not (tmp_path / "x.blob").exists()


@pytest.mark.parametrize("data,expect", [
    (b"\x08\x07\x12\x04garbage-not-onnx\xff\xff", "not a valid ONNX file"),
    (b"", "holds no ONNX graph"),
])
def test_malformed_files(tmp_path, capsys, data, expect):
    (tmp_path / "bad.onnx").write_bytes(data)
    assert expect in _user_error(capsys, "compile", tmp_path / "bad.onnx", "-o", tmp_path / "o.blob")


def test_truncated_file(tmp_path, capsys):
    whole = small_cnn().SerializeToString()
    (tmp_path / "t.onnx").write_bytes(whole[: len(whole) // 2])
    err = _user_error(capsys, "compile", tmp_path / "t.onnx", "-o", tmp_path / "o.blob")
    assert "t.onnx" in err


def test_missing_file(tmp_path, capsys):
    assert "cannot read ONNX file" in _user_error(capsys, "compile", tmp_path / "no.onnx", "-o", tmp_path / "o")


def test_unsupported_opset():
    model = seed_model()
    model.opset_import[0].version = 99
    with pytest.raises(CompileError, match="opset 99 is not supported"):
        compile_onnx(model)


def _dynamic_model() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "d",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_missing_input_shape_asks_for_it(tmp_path, capsys):
    onnx.save(_dynamic_model(), tmp_path / "d.onnx")
    err = _user_error(capsys, "compile", tmp_path / "d.onnx", "-o", tmp_path / "d.blob")
    assert "input 'x' has a dynamic shape (Nx3)" in err and "--input-shape x=1x3" in err
    rc, _, _ = _byoc(capsys, "compile", tmp_path / "d.onnx", "-o", tmp_path / "d.blob",
                     "--input-shape", "x=2x3")
    assert rc == 0


@pytest.mark.parametrize("arg,expect", [
    ("x=4x4", "does not fit the model's ?x3"),
    ("z=2x3", "no input for"),
    ("x=2xq", "bad shape"),
    ("2x3", "expected NAME=SHAPE"),
])
def test_bad_input_shapes(tmp_path, capsys, arg, expect):
    onnx.save(_dynamic_model(), tmp_path / "d.onnx")
    err = _user_error(capsys, "compile", tmp_path / "d.onnx", "-o", tmp_path / "d.blob", "--input-shape", arg)
    assert expect in err


def test_input_shapes_through_the_api():
    assert compile_onnx(_dynamic_model(), input_shapes={"x": "4x3"}).graph.tensors["y"].shape == (4, 3)
    assert compile_onnx(_dynamic_model(), input_shapes={"x": [2, 3]}).graph.tensors["y"].shape == (2, 3)
    with pytest.raises(CompileError, match="not a sequence of integers"):
        compile_onnx(_dynamic_model(), input_shapes={"x": ["a", 3]})


def test_unknown_op_in_ops(tmp_path, capsys):
    onnx.save(seed_model(), tmp_path / "s.onnx")
    err = _user_error(capsys, "compile", tmp_path / "s.onnx", "-o", tmp_path / "s.blob", "--ops", "add,frobnicate")
    assert "unknown op 'frobnicate'" in err


def test_name_collision():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="a"), helper.make_node("Neg", ["x"], ["y"], name="b")]
    graph = helper.make_graph(nodes, "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(CompileError, match="name collision: tensor 'y' is produced by node 'b'"):
        compile_onnx(model)


def test_dtype_the_board_cannot_hold():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "b",
                              [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(CompileError, match="element type BFLOAT16"):
        compile_onnx(model)


def test_foreign_domain_is_reported_as_unsupported():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("FusedThing", ["r"], ["y"], domain="com.example", name="vendor")]
    graph = helper.make_graph(nodes, "f", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    with pytest.raises(CompileError, match="'vendor' \\(FusedThing\\).*domain 'com.example'"):
        compile_onnx(model)


def test_unwritable_output(tmp_path, capsys):
    onnx.save(seed_model(), tmp_path / "s.onnx")
    err = _user_error(capsys, "compile", tmp_path / "s.onnx", "-o", tmp_path / "no" / "dir" / "s.blob")
    assert "cannot write" in err


def test_attribute_a_kernel_does_not_know():
    # (opset 1's ``consumed_inputs`` is dropped on import: client/compiler/opsets.py)
    nodes = [helper.make_node("LeakyRelu", ["x"], ["y"], name="odd_relu", slope=0.1)]
    graph = helper.make_graph(nodes, "o", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(CompileError, match="does not implement attribute\\(s\\) slope"):
        compile_onnx(model)
