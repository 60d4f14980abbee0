"""The environment variables rpcsrv reads, declared and read here and nowhere else.

Each variable is one row of :data:`VARIABLES` (its name, its default, what it sets).  A value is read when
it is used (:func:`text`, :func:`flag`, :func:`count`, :func:`seconds`), so a deployment or a test that
changes the environment of a running process is heard.  These are the settings of a *process* (where its
libraries come from, how its threads compute); what a server is told on its command line is an options
object (``rpcsrv.board.options``), passed down, never an environment variable.

A native worker reads no environment variable of rpcsrv's: its server reads the values (:func:`snapshot`)
and sends them in the worker's start message, and the worker takes them as its settings (:func:`adopt`),
so a worker started with a scrubbed environment still builds, loads and loops as its server does.  What
must be set before Python starts (``PYTHONPATH``, the BLAS thread variables) stays in the worker's
environment (``rpcsrv.native.confine.worker_env``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Optional


@dataclass(frozen=True)
class Variable:
    name: str
    default: str
    sets: str


#: every variable rpcsrv reads, by name
VARIABLES: Mapping[str, Variable] = MappingProxyType({v.name: v for v in (
    Variable("RPCSRV_COMPILED_KERNELS", "1", "0, off, no or false: the executor runs its numpy kernels only"),
    Variable("RPCSRV_KERNELS_LIB", "", "the compiled kernels' library to load (one built elsewhere)"),
    Variable("RPCSRV_NATIVE_SHIM", "", "the runtime shim to load (one built elsewhere), and no other"),
    Variable("RPCSRV_CACHE_DIR", "", "where the shim and the kernels are built and cached "
                                     "(default ~/.cache/rpcsrv)"),
    Variable("RPCSRV_CC", "", "the C compiler, before $CC, cc, gcc and clang"),
    Variable("CC", "", "the C compiler, after $RPCSRV_CC"),
    Variable("RPCSRV_BLAS_THREADS", "", "BLAS threads per model run, pinned (default: the compute policy's)"),
    Variable("RPCSRV_INTERPRETER_JOBS", "1", "model runs computing in one interpreter at once"),
    Variable("RPCSRV_COMPUTE_NICE", "5", "how much lower the server's computing threads run than its event loop"),
    Variable("RPCSRV_WORKER_NICE", "5", "how much lower a native worker runs than its server"),
    Variable("RPCSRV_WORKER_TRACE", "", "non-empty: a native worker prints the traceback of each failed request"),
    Variable("RPCSRV_LOAN_LOOP", "c", "python: a loan's loop in Python instead of the runtime shim's C loop"),
    Variable("RPCSRV_NATIVE_QUICK_WAIT", "0.0001", "seconds the event loop waits in select for a native "
                                                   "worker's answer before it waits through trio"),
)})


class _Source:
    """Where the values come from: this process's environment, or (a native worker) its server's values."""

    def __init__(self) -> None:
        self.values: Mapping[str, str] = os.environ


_SOURCE = _Source()


def text(name: str) -> str:
    """The variable's value, stripped (its default when unset or empty)."""
    return _SOURCE.values.get(name, "").strip() or VARIABLES[name].default


def is_set(name: str) -> bool:
    """Whether the variable has a value of its own (not its default)."""
    return bool(_SOURCE.values.get(name, "").strip())


def flag(name: str) -> bool:
    """The variable as a switch: off for 0, off, no and false."""
    return text(name).lower() not in ("0", "off", "no", "false")


def count(name: str) -> Optional[int]:
    """The variable as a non-negative integer (its default when it is not one; None when that is empty)."""
    value = text(name)
    if not value.isdigit():
        value = VARIABLES[name].default
    return int(value) if value else None


def seconds(name: str) -> float:
    """The variable as a number of seconds (its default when it is not one)."""
    try:
        return max(0.0, float(text(name)))
    except ValueError:
        return float(VARIABLES[name].default)


def snapshot() -> dict[str, str]:
    """The variables this process has values for: what its native workers get in their start message."""
    return {name: _SOURCE.values[name] for name in VARIABLES if _SOURCE.values.get(name, "").strip()}


def adopt(values: Mapping[str, str]) -> None:
    """From now on the settings are ``values`` (a server's :func:`snapshot`), not this process's environment:
    a native worker's first act (``rpcsrv.native.worker``)."""
    unknown = sorted(set(values) - set(VARIABLES))
    if unknown:
        raise ValueError(f"unknown settings {', '.join(unknown)}")
    _SOURCE.values = MappingProxyType(dict(values))
