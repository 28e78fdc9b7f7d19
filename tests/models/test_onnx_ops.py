"""``op_types`` reads a graph's operators as the ``onnx`` package does, without importing it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from uniun.models.onnx_ops import op_types


def _save(tmp_path: Path, ops: list[str]) -> Path:
    nodes, x = [], "x"
    for i, op in enumerate(ops):
        inputs = [x, "c"] if op in ("Add", "Mul", "MatMul") else [x]
        nodes.append(helper.make_node(op, inputs, [f"y{i}"], doc_string="GroupQueryAttention"))
        x = f"y{i}"
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [2, 2])],
        [numpy_helper.from_array(np.eye(2, dtype=np.float32), "c")])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, doc_string="a model with a long doc string " * 20), path)
    return path


def test_op_types_match_the_onnx_package(tmp_path: Path) -> None:
    path = _save(tmp_path, ["Add", "Relu", "MatMul", "Relu", "Sigmoid"])
    want = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert op_types(path) == want == {"Add", "Relu", "MatMul", "Sigmoid"}


def test_a_doc_string_naming_an_op_is_not_an_op(tmp_path: Path) -> None:
    # The runner asks whether the graph has GroupQueryAttention; text elsewhere in the
    # file must not answer yes (a byte search would).
    assert "GroupQueryAttention" not in op_types(_save(tmp_path, ["Relu"]))


def test_a_file_that_is_not_a_model_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01")
    with pytest.raises(ValueError):
        op_types(path)
