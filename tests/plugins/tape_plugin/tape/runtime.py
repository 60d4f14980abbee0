"""The board side of tape: :data:`PLUGIN`, named by the entry point ``rpcsrv.runtimes: tape``.

:class:`TapeRuntime` runs one program with numpy: its packed function ``symbol(*inputs, *outputs)``
writes the outputs in place; its weights come from the const loader (``bind_constants``), and a program
left without one is refused at ``load_module`` (``check_constants``).  Imports nothing of the client.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from rpcsrv.executor import ExecutorError, RuntimeModule
from rpcsrv.loader.plugins import ModuleKind, RuntimePlugin, file_name

from .fmt import CODEC, TYPE_KEY, TapeModule


def _pad(x, pads, value):
    top, left, bottom, right = pads
    return np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=value)


def conv(x, w, b=None, ints=()):
    sh, sw, *pads, group = ints
    win = sliding_window_view(_pad(x, pads, 0.0), w.shape[2:], axis=(2, 3))[:, :, ::sh, ::sw]
    cin, cout = x.shape[1] // group, w.shape[0] // group
    y = np.concatenate([np.einsum("nchwij,ocij->nohw", win[:, g * cin:(g + 1) * cin], w[g * cout:(g + 1) * cout])
                        for g in range(group)], axis=1)
    return y if b is None else y + b.reshape(1, -1, 1, 1)


def maxpool(x, ints):
    kh, kw, sh, sw, *pads = ints
    return sliding_window_view(_pad(x, pads, -np.inf), (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw].max(axis=(4, 5))


def gemm(x, w, c=None, ints=(0,)):
    y = x @ (w.T if ints[0] else w)
    return y if c is None else y + c


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


OPS = {
    "conv": lambda srcs, ints: conv(*srcs, ints=ints),
    "maxpool": lambda srcs, ints: maxpool(srcs[0], ints),
    "gemm": lambda srcs, ints: gemm(*srcs, ints=ints),
    "flatten": lambda srcs, ints: srcs[0].reshape(int(np.prod(srcs[0].shape[:ints[0]])), -1),
    "add": lambda srcs, ints: srcs[0] + srcs[1],
    "mul": lambda srcs, ints: srcs[0] * srcs[1],
    "sigmoid": lambda srcs, ints: _sigmoid(srcs[0]),
    "relu": lambda srcs, ints: np.maximum(srcs[0], 0),
}
ACTS = {"none": lambda y: y, "relu": lambda y: np.maximum(y, 0), "silu": lambda y: y * _sigmoid(y)}


class TapeRuntime(RuntimeModule):
    type_key = TYPE_KEY

    def __init__(self, program, imports=None):
        super().__init__(imports)
        self.program = program
        self.symbol = program.symbol
        self.shapes = [tuple(s.dims) for s in program.slots]
        self.weights: dict[int, np.ndarray] = {}

    def get_function(self, name: str):
        return self.run if name == self.symbol else None

    def bind_constants(self, symbol, arrays, source) -> bool:
        if symbol != self.symbol:
            return False
        for w in self.program.weights:
            if w.name in arrays:
                value = np.asarray(arrays[w.name], np.float32)
                if value.shape != self.shapes[w.slot]:
                    raise ExecutorError(f"tape {symbol}: weight {w.name!r} from {source} is {list(value.shape)}, "
                                        f"the program wants {list(self.shapes[w.slot])}")
                self.weights[w.slot] = value
        return True

    def check_constants(self) -> None:
        missing = [w.name for w in self.program.weights if w.slot not in self.weights]
        if missing:
            raise ExecutorError(f"tape {self.symbol}: weight(s) {', '.join(missing)} not bound (no const loader "
                                f"gives them)")

    def run(self, *args) -> None:
        p = self.program
        if len(args) != len(p.args) + len(p.results):
            raise ExecutorError(f"{self.symbol} takes {len(p.args)} input(s) then {len(p.results)} output(s), "
                                f"got {len(args)} arguments")
        for sid, arr in zip(list(p.args) + list(p.results), args):
            if not isinstance(arr, np.ndarray) or arr.shape != self.shapes[sid] or arr.dtype != np.float32:
                raise ExecutorError(f"{self.symbol}: argument for slot {sid} must be float32 "
                                    f"{list(self.shapes[sid])}, got {getattr(arr, 'dtype', type(arr).__name__)} "
                                    f"{list(getattr(arr, 'shape', []))}")
        values = dict(self.weights)
        values.update(zip(p.args, args))
        for ins in p.tape:
            y = ACTS[ins.act](OPS[ins.op]([values[i] for i in ins.srcs], list(ins.ints)))
            if ins.skip >= 0:
                y = ACTS[ins.post](y + values[ins.skip])
            values[ins.dst] = np.asarray(y, np.float32).reshape(self.shapes[ins.dst])
        for sid, out in zip(p.results, args[len(p.args):]):
            np.copyto(out, values[sid])


def summarize(node: TapeModule) -> dict:
    p = node.program
    return {"tape": {"symbol": p.symbol, "slots": len(p.slots), "weights": [w.name for w in p.weights],
                     "tape": [str(ins.op) + ("" if ins.act == "none" else f".{ins.act}") for ins in p.tape]}}


def format_lines(head: str, info: dict) -> list[str]:
    t = info["tape"]
    return [f"{head}: tape {t['symbol']}: {len(t['tape'])} instruction(s) ({', '.join(t['tape'])}), "
            f"{t['slots']} slots, {len(t['weights'])} weight(s) from the const loader"]


def extract(node: TapeModule):
    from .fmt import Program

    text = "\n".join(f"{k}: {ins.op}" for k, ins in enumerate(node.program.tape)) + "\n"
    return ({"tape_symbol": node.program.symbol},
            [("tape_listing", f"tape/{file_name(node.program.symbol)}.txt", text, "the program's instructions"),
             ("tape_program", f"tape/{file_name(node.program.symbol)}.bin", Program.build(node.program),
              "the program uncompressed")])


KIND = ModuleKind(type_keys=(TYPE_KEY,), codec=CODEC,
                  runtime=lambda node, imports, options: TapeRuntime(node.program, imports),
                  summarize=summarize, format=format_lines, functions=lambda node: [node.program.symbol],
                  label="tape program", extract=extract)
PLUGIN = RuntimePlugin(TYPE_KEY, (KIND,), "the tape accelerator (numpy), written from docs/plugins.md")
