"""``GraphModule`` for :mod:`rpcsrv.client.rpc`, shaped like ``tvm.contrib.graph_executor.GraphModule``.

    gmod = GraphModule(lib["default"](sess.cpu(0)))
    gmod.set_input("x", x_numpy)      # numpy arrays are copied to the board first
    gmod.run()
    y = gmod.get_output(0).numpy()
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from .rpc import RemoteArray, RemoteModule


class GraphModule:
    def __init__(self, module: RemoteModule):
        self.module = module
        self._set_input = module["set_input"]
        self._run = module["run"]
        self._get_output = module["get_output"]
        self._get_input = module["get_input"]
        self._get_num_outputs = module["get_num_outputs"]
        self._get_num_inputs = module["get_num_inputs"]
        self._load_params = module["load_params"]

    @property
    def session(self):
        return self.module.session

    def _remote(self, value) -> RemoteArray:
        if isinstance(value, RemoteArray):
            return value
        return self.session.array(np.asarray(value))

    def set_input(self, key=None, value=None, **params) -> None:
        """Set inputs by name or index; numpy values are uploaded first."""
        if key is not None:
            self._set_input(key, self._remote(value))
        for name, v in params.items():
            self._set_input(name, self._remote(v))

    def run(self, **inputs) -> None:
        if inputs:
            self.set_input(**inputs)
        self._run()

    def get_num_outputs(self) -> int:
        return self._get_num_outputs()

    def get_num_inputs(self) -> int:
        return self._get_num_inputs()

    def get_input(self, index) -> RemoteArray:
        return self._get_input(index)

    def get_output(self, index: int, out: Optional[RemoteArray] = None) -> RemoteArray:
        if out is not None:
            self._get_output(index, out)
            return out
        return self._get_output(index)

    def load_params(self, params_bytes: bytes) -> None:
        self._load_params(bytearray(params_bytes))

    def benchmark(self, dev, number: int = 10, repeat: int = 3) -> list[float]:
        """Seconds per ``run`` for each repeat, measured on the board (TVM's time_evaluator)."""
        return self.module.time_evaluator("run", dev, number=number, repeat=repeat)()
