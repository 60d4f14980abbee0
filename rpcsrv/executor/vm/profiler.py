"""A call profiler for the Relax VM, used as its instrument (``set_instrument``).

TVM's Relax VM has no profiler of its own any more (apache-tvm 0.27 has ``set_instrument`` only), and
an instrument given over RPC would have to be a function of the board.  So the VM module has
rpcsrv's ``rpcsrv_profile(name, *args)``: it calls VM function ``name`` once with a
:class:`VMProfiler` as the instrument and answers the report as JSON: the call's ``total_seconds``
and, per called function (kernels, builtins, VM functions) in order of first call, its calls,
total, mean, min and max seconds and its arguments at the first call (shape and dtype, or a type
name).  Nested calls (a VM function calling others) are timed each on their own, so a VM function's
time includes its callees'.
"""

from __future__ import annotations

import json
import time
from typing import Any

#: at most this many distinct function names are kept (a hostile executable cannot grow it forever)
MAX_NAMES = 10_000


def _describe(value: Any) -> dict:
    """``{"shape": [1, 8], "dtype": "float32"}`` for a tensor (a VM tensor or an array), else its type."""
    arr = getattr(value, "array", value)
    if hasattr(arr, "shape") and hasattr(arr, "dtype"):
        return {"shape": [int(d) for d in arr.shape], "dtype": str(arr.dtype)}
    return {"type": type(value).__name__}


class VMProfiler:
    """``instrument(func, func_symbol, before_run, ret_value, *args) -> 0``: times every call."""

    def __init__(self):
        self.stack: list[float] = []
        self.stats: dict[str, list[float]] = {}  # name -> [calls, total, min, max]
        self.dropped = 0
        self.total = 0.0
        self.args: dict[str, list[dict]] = {}  # name -> its arguments at the first call

    def time(self, run) -> None:
        """Run ``run()`` and keep how long it took (the whole call being profiled)."""
        start = time.perf_counter()
        try:
            run()
        finally:
            self.total = time.perf_counter() - start

    def __call__(self, func: Any, symbol: Any, before_run: Any, ret_value: Any, *args: Any) -> int:
        if before_run:
            if str(symbol) not in self.args and len(self.args) < MAX_NAMES:
                self.args[str(symbol)] = [_describe(a) for a in args]
            self.stack.append(time.perf_counter())
            return 0
        if not self.stack:
            return 0
        seconds = time.perf_counter() - self.stack.pop()
        entry = self.stats.get(str(symbol))
        if entry is None:
            if len(self.stats) >= MAX_NAMES:
                self.dropped += 1
                return 0
            entry = self.stats[str(symbol)] = [0, 0.0, seconds, seconds]
        entry[0] += 1
        entry[1] += seconds
        entry[2] = min(entry[2], seconds)
        entry[3] = max(entry[3], seconds)
        return 0

    def report(self) -> str:
        calls = [{"name": name, "calls": int(n), "total_seconds": total, "mean_seconds": total / n,
                  "min_seconds": low, "max_seconds": high, "args": self.args.get(name, [])}
                 for name, (n, total, low, high) in self.stats.items()]
        return json.dumps({"total_seconds": self.total, "calls": calls,
                           "recorded": sum(c["calls"] for c in calls), "dropped": self.dropped})


