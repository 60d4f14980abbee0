"""The Relax virtual machine: the machine that runs a checked ``relax.VMExecutable``.

``VirtualMachine`` (``relax.VirtualMachine``) is what ``vm_load_executable`` returns and what the
client's ``relax.VirtualMachine`` drives: ``vm_initialization`` (device, allocator triples),
functions by name, ``save_function``, ``invoke_closure``, the stateful ``set_input`` /
``invoke_stateful`` / ``get_output`` / ``get_output_arity``, ``get_function_arity`` /
``get_function_param_name`` (TVM's ``src/runtime/vm/vm.cc``).

Each VM function is compiled once into a list of steps; a call step holds the callee and its
arguments as (is-register, value) pairs, so running an instruction is one list comprehension and
one call.  Native kernels get their arguments as DLTensor addresses (``ffi.py``).  The executable's
runtime module, checked when the library loads, is ``executable.py``; the checks are ``checks.py``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ...loader.vm_executable import (
    ARG_CONST, ARG_IMMEDIATE, ARG_REGISTER, BEGIN_SPECIAL_REG, KIND_VM, OP_CALL, OP_GOTO, OP_IF,
    OP_RET, VM_REGISTER, VOID_REGISTER,
)
from .. import compute
from ..module import RuntimeModule
from ...protocol.dtypes import DataType
from .builtins import BUILTINS, VMError, read_if_cond
from .ffi import T_DLTENSOR, NativeKernel, encode_value
from .registers import (
    Closure, InputStaging, ShapeTuple, Storage, StoragePool, Tensor, as_tensor, export,
)

NAIVE_ALLOCATOR, POOLED_ALLOCATOR = 1, 2
#: compiled step kinds besides the opcodes (``VirtualMachine.run``)
S_KERNEL, S_ALLOC_TENSOR, S_NULL, S_CONST = 11, 12, 13, 14
#: builtins without side effects whose result depends only on their arguments: folded at compile
#: time when every argument is a constant
FOLDABLE = frozenset(BUILTINS[f"vm.builtin.{n}"] for n in ("reshape", "shape_of", "tensor_to_shape"))
#: device types whose memory is this board's host memory (cpu, ext_dev)
HOST_DEVICES = (1, 12)

class VirtualMachine(RuntimeModule):
    """One VM over an executable: devices, allocator, constants, functions, stateful inputs."""

    type_key = "relax.VirtualMachine"

    def __init__(self, executable: "VMExecutableRuntime"):  # noqa: F821 (executable.py imports this module)
        super().__init__(executable.imports)
        self.executable = executable
        self.exe = executable.exe
        self.devices: list[tuple[int, int]] = []
        self.pool: Optional[StoragePool] = None
        self.consts: list[Any] = []
        self.funcs: list[Any] = []
        self.programs: dict[int, list[tuple]] = {}
        self.inputs: dict[str, list[Any]] = {}
        self.outputs: dict[str, Any] = {}
        self.saved: dict[str, Closure] = {}
        self._keep: list = []  # DLTensors of constant kernel arguments
        self.staging = InputStaging()
        self.instrument: Optional[Callable[..., Any]] = None  # set_instrument

    # ------------------------------------------------------------------ set-up
    def initialize(self, *args: Any) -> None:
        """``vm_initialization``: (device type, device id, allocator type) per device."""
        if not args or len(args) % 3:
            raise VMError(f"vm_initialization expects (device type, device id, allocator type) triples, "
                          f"got {len(args)} arguments")
        devices, naive = [], False
        for i in range(0, len(args), 3):
            dev_type, dev_id, alloc = (int(a) for a in args[i:i + 3])
            if dev_type not in HOST_DEVICES:
                raise VMError(f"vm_initialization: device type {dev_type} is not available on this board "
                              f"(cpu only)")
            if alloc not in (NAIVE_ALLOCATOR, POOLED_ALLOCATOR):
                raise VMError(f"vm_initialization: unknown allocator type {alloc} (1 naive, 2 pooled)")
            naive = naive or alloc == NAIVE_ALLOCATOR
            devices.append((dev_type, dev_id))
        self.devices = devices
        self.pool = StoragePool(naive=naive)
        self.consts = self.executable.constants
        self.funcs = [self._pool_entry(i) for i in range(len(self.exe.functions))]
        self.programs = {}

    def _pool_entry(self, index: int) -> Any:
        f = self.exe.functions[index]
        if f.kind == KIND_VM:
            return Closure(f.name, lambda vm, *args, _i=index: vm.run(_i, args))
        fn = self.executable.resolve(f.name)
        if fn is None:  # checked at load; the imports may have changed since (ImportModule)
            raise VMError(f"cannot find function {f.name!r} in the VM builtins or the library")
        return fn

    def _program(self, index: int) -> list[tuple]:
        """Function ``index`` compiled to steps (once per VM); see ``run`` for the step kinds."""
        prog = self.programs.get(index)
        if prog is None:
            f = self.exe.functions[index]
            prog = self.programs[index] = [self._step(ins) for ins in self.executable.code[f.start_instr:f.end_instr]]
        return prog

    def _step(self, ins) -> tuple:
        if ins.op == OP_RET:
            return (OP_RET, ins.reg)
        if ins.op != OP_CALL:
            return (ins.op, ins.reg, ins.offset)
        fn, name = self.funcs[ins.func], self.exe.functions[ins.func].name
        dst = ins.dst if ins.dst < BEGIN_SPECIAL_REG else -1
        spec = tuple(self._arg(kind, value) for kind, value in ins.args)
        if self.instrument is not None:  # every call goes through the instrument, no fast paths
            return (OP_CALL, InstrumentedCall(fn, name, self), spec, dst, name)
        if fn is BUILTINS["vm.builtin.null_value"] and not spec:
            return (S_NULL, dst)
        if fn in FOLDABLE and not any(is_reg for is_reg, _ in spec):
            # a pure builtin of constants (e.g. a reshaped batch-norm parameter): computed once here
            return (S_CONST, fn(*[v for _, v in spec]), dst, name)
        if (fn is BUILTINS["vm.builtin.alloc_tensor"] and len(spec) == 4 and spec[0][0]
                and not any(is_reg for is_reg, _ in spec[1:]) and isinstance(spec[2][1], ShapeTuple)
                and isinstance(spec[3][1], DataType)):
            return (S_ALLOC_TENSOR, spec[0][1], (int(spec[1][1]), tuple(spec[2][1]), spec[3][1]), dst, name)
        if isinstance(fn, NativeKernel):
            words: list[int] = []
            regs: list[tuple[int, int]] = []
            for is_reg, v in spec:
                if is_reg:
                    regs.append((len(words), v))
                    words.extend((T_DLTENSOR, 0))
                else:
                    words.extend(encode_value(v, self._keep))
            # the argument array is made once; each run writes the registers' words into it
            return (S_KERNEL, fn, fn.argv(words), tuple(regs), len(spec), dst, name)
        return (OP_CALL, fn, spec, dst, name)

    def _arg(self, kind: int, value: int) -> tuple[bool, Any]:
        if kind == ARG_REGISTER:
            if value == VOID_REGISTER:
                return False, None
            if value == VM_REGISTER:
                return False, self
            return True, value
        if kind == ARG_IMMEDIATE:
            return False, value
        if kind == ARG_CONST:
            return False, self.consts[value]
        return False, self.funcs[value]

    # ------------------------------------------------------------------ running
    def run(self, index: int, args: tuple) -> Any:
        """Run bytecode function ``index`` on register values ``args``.

        Steps: ``S_KERNEL`` (a native kernel: its argument array, made once, gets the registers'
        DLTensor addresses), ``S_ALLOC_TENSOR`` (a tensor in a storage, constant offset, shape and
        dtype), ``S_NULL`` (clear a register), ``OP_CALL`` (any other packed function or closure),
        ``OP_RET``, ``OP_GOTO``, ``OP_IF``.
        """
        f = self.exe.functions[index]
        if len(args) != f.num_args:
            names = f" ({', '.join(f.param_names)})" if f.param_names else ""
            raise VMError(f"function {f.name!r} expects {f.num_args} arguments{names}, got {len(args)}")
        prog = self._program(index)
        regs: list[Any] = [None] * f.register_file_size
        regs[:len(args)] = args
        hold: list = []  # DLTensors made for non-tensor arguments during this run
        pc = 0
        try:
            while True:
                step = prog[pc]
                code = step[0]
                if code == S_KERNEL:
                    argv = step[2]
                    for at, r in step[3]:
                        v = regs[r]
                        if type(v) is Tensor:
                            argv[at] = T_DLTENSOR
                            argv[at + 1] = v.dla or v.make_dl()
                        else:
                            argv[at], argv[at + 1] = encode_value(v, hold)
                    ret = step[1].call_argv(argv, step[4])
                    if step[5] >= 0:
                        regs[step[5]] = ret
                elif code == S_ALLOC_TENSOR:
                    storage = regs[step[1]]
                    if type(storage) is not Storage:
                        raise VMError(f"alloc_tensor: expected a storage, got a {type(storage).__name__}")
                    regs[step[3]] = storage.alloc_tensor(*step[2])
                elif code == S_CONST:
                    if step[2] >= 0:
                        regs[step[2]] = step[1]
                elif code == S_NULL:
                    if step[1] >= 0:
                        regs[step[1]] = None
                elif code == OP_CALL:
                    fn = step[1]
                    values = [regs[v] if is_reg else v for is_reg, v in step[2]]
                    if type(fn) is Closure:
                        ret = fn.impl(self, *values, *fn.bound)
                    else:
                        ret = fn(*values)
                    if step[3] >= 0:
                        regs[step[3]] = ret
                elif code == OP_RET:
                    r = step[1]
                    return regs[r] if r < BEGIN_SPECIAL_REG else (self if r == VM_REGISTER else None)
                elif code == OP_GOTO:
                    pc += step[2]
                    continue
                else:
                    pc += 1 if read_if_cond(regs[step[1]]) else step[2]
                    continue
                pc += 1
        except VMError:
            raise
        except IndexError:
            if pc >= len(prog):
                raise VMError(f"{f.name}: ran past its last instruction without a return") from None
            raise VMError(f"{f.name}: instruction {pc} ({_step_name(prog[pc])}): index out of range") from None
        except Exception as exc:
            raise VMError(f"{f.name}: instruction {pc} ({_step_name(prog[pc])}): {type(exc).__name__}: {exc}") from None

    def invoke(self, fn: Any, args: tuple) -> Any:
        """Call a closure or packed function with register values (``invoke_closure``)."""
        if isinstance(fn, Closure):
            return fn.impl(self, *args, *fn.bound)
        if callable(fn):
            return fn(*args)
        raise VMError(f"invoke_closure: expected a function, got a {type(fn).__name__}")

    def _invoke_closure(self, clo: Any, *args: Any) -> Any:
        """``invoke_closure`` from outside: one job of the compute policy."""
        values = tuple(as_tensor(a) for a in args)
        with compute.job():
            return export(self.invoke(clo, values))

    def _require_init(self) -> None:
        if self.pool is None:
            raise VMError("the VM is not initialized: call vm_initialization (relax.VirtualMachine does) first")

    def _closure(self, name: str) -> Closure:
        self._require_init()
        if name in self.saved:
            return self.saved[name]
        index = self.executable.by_name.get(name)
        if index is None or self.exe.functions[index].kind != KIND_VM:
            raise VMError(f"Unknown function: {name!r} (VM functions: {', '.join(self.vm_function_names())})")
        return self.funcs[index]

    def vm_function_names(self) -> list[str]:
        return [f.name for f in self.exe.functions if f.kind == KIND_VM]

    def call(self, name: str, *args: Any) -> Any:
        """Call VM function ``name`` with arguments from outside (arrays); returns outside values.
        The call is one job of the compute policy (``compute``), as a graph executor's run is."""
        clo = self._closure(name)
        staged = [self.staging.stage(i, a) for i, a in enumerate(args)]
        with compute.job():
            return export(clo.impl(self, *staged, *clo.bound))

    # ------------------------------------------------------------------ the remote interface
    def get_function(self, name: str):
        table = {
            "vm_initialization": self.initialize,
            "save_function": self.save_function,
            "invoke_closure": self._invoke_closure,
            "invoke_stateful": self.invoke_stateful,
            "set_instrument": self.set_instrument,
            "rpcsrv_profile": self.profile_call,
            "get_output_arity": self.get_output_arity,
            "get_output": self.get_output,
            "set_input": self.set_input,
            "set_input_with_param_module": self._no_param_module,
            "get_function_arity": lambda fname: len(self._info(fname).param_names),
            "get_function_param_name": self.get_function_param_name,
        }
        if name in table:
            return table[name]
        if name in self.saved or (name in self.executable.by_name
                                  and self.exe.functions[self.executable.by_name[name]].kind == KIND_VM):
            def call(*args: Any, _name: str = name) -> Any:
                return self.call(_name, *args)
            call.__name__ = name
            return call
        return None

    def _info(self, name: str):
        index = self.executable.by_name.get(name)
        if index is None:
            raise VMError(f"Unknown function: {name!r}")
        return self.exe.functions[index]

    def get_function_param_name(self, name: str, index: int) -> str:
        names = self._info(name).param_names
        if not 0 <= index < len(names):
            raise VMError(f"Invalid index for {name} ({index} out of {len(names)})")
        return names[index]

    def save_function(self, name: str, save_name: str, include_return: Any, *args: Any) -> None:
        clo = self._closure(name)
        bound = clo.bind(tuple(as_tensor(a) for a in args))
        if include_return:
            self.saved[save_name] = Closure(save_name, bound.impl, bound.bound)
        else:
            def impl(vm, *a: Any, _c: Closure = bound) -> None:
                _c.impl(vm, *a)
            self.saved[save_name] = Closure(save_name, impl, bound.bound)

    def set_input(self, name: str, *args: Any) -> None:
        self._require_init()
        f = self._info(name)
        if len(args) != f.num_args:
            raise VMError(f"set_input: function {name!r} takes {f.num_args} arguments, got {len(args)}")
        self.inputs[name] = [as_tensor(a) for a in args]

    def invoke_stateful(self, name: str) -> None:
        clo = self._closure(name)
        if name not in self.inputs:
            raise VMError(f"No inputs set for stateful call of {name}; use `set_input` first.")
        with compute.job():
            self.outputs[name] = clo.impl(self, *self.inputs[name], *clo.bound)

    def _output(self, name: str, idx: tuple) -> Any:
        if name not in self.outputs:
            raise VMError(f"No output saved for call of {name!r}; use `invoke_stateful` to call it first.")
        out = self.outputs[name]
        for i in idx:
            if not isinstance(out, list):
                raise VMError("Attempted to index into an object that is not a tuple.")
            if not 0 <= int(i) < len(out):
                raise VMError(f"Invalid index ({i} >= {len(out)}).")
            out = out[int(i)]
        return out

    def get_output_arity(self, name: str, *idx: Any) -> int:
        out = self._output(name, idx)
        return len(out) if isinstance(out, list) else -1

    def get_output(self, name: str, *idx: Any) -> Any:
        out = self._output(name, idx)
        if isinstance(out, list):
            raise VMError("`get_output` cannot return a tuple for RPC compatibility. "
                          "Please specify another index argument.")
        return export(out)

    def profile_call(self, name: str, *args: Any) -> str:
        """rpcsrv's ``rpcsrv_profile(name, *args)``: one call of VM function ``name`` with every call
        instruction timed (:class:`rpcsrv.executor.vm.profiler.VMProfiler` as the instrument, then the
        previous instrument again); the JSON report (``profiler.py``).  A function of the VM module,
        so it runs wherever the VM does (a native worker too)."""
        from .profiler import VMProfiler

        prof, previous = VMProfiler(), self.instrument
        self.set_instrument(prof)
        try:
            prof.time(lambda: self.call(name, *args))
        finally:
            self.set_instrument(previous)
        return prof.report()

    def set_instrument(self, instrument: Any) -> None:
        """TVM's ``set_instrument``: ``instrument(func, func_symbol, before_run, ret_value, *args)`` is
        called before and after every call instruction (None: no instrument); returning 1 before a
        call skips it.  Over RPC the instrument must be a function of the board; ``rpcsrv_profile``
        uses this with rpcsrv's own profiler.  The functions are compiled again either way."""
        if instrument is not None and not callable(instrument):
            raise VMError(f"set_instrument expects a function or None, got a {type(instrument).__name__}")
        self.instrument = instrument
        self.programs = {}

    @staticmethod
    def _no_param_module(*_args: Any) -> None:
        raise VMError("set_input_with_param_module: parameter modules are not available on this board")


class InstrumentedCall:
    """One call instruction under ``set_instrument`` (TVM's ``RunInstrCall``): the instrument sees the
    function, its name, ``before_run``, the return value (after) and the arguments, dtypes as strings;
    1 returned before the call skips it."""

    __slots__ = ("fn", "name", "vm")

    def __init__(self, fn: Any, name: str, vm: "VirtualMachine"):
        self.fn, self.name, self.vm = fn, name, vm

    def __call__(self, *values: Any) -> Any:
        instrument, fn = self.vm.instrument, self.fn
        seen = [str(v) if isinstance(v, DataType) else v for v in values]
        if instrument is not None and instrument(fn, self.name, True, None, *seen) == 1:
            return None
        ret = fn.impl(self.vm, *values, *fn.bound) if type(fn) is Closure else fn(*values)
        if instrument is not None:
            instrument(fn, self.name, False, ret, *seen)
        return ret


def _step_name(step: tuple) -> str:
    if step[0] in (S_KERNEL, S_ALLOC_TENSOR, OP_CALL, S_CONST):
        return step[-1]
    return {OP_RET: "ret", OP_GOTO: "goto", OP_IF: "if", S_NULL: "vm.builtin.null_value"}.get(step[0], "?")


__all__ = ["VirtualMachine", "VMError", "NativeKernel", "export"]
