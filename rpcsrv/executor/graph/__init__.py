"""The graph executor: TVM's ``GraphExecutor`` over numpy buffers, and what builds on it.

* ``executor.py``: the executor (``tvm.graph_executor.create``: storage, ``set_input``, ``run``, ...);
* ``graph_json.py``: the graph JSON, parsed and checked when the library is loaded;
* ``factory.py``: TVM's ``GraphExecutorFactory`` module (``lib["default"](dev)``, params, ``debug_create``);
* ``debug.py``: the debug executor (TVM's ``GraphExecutorDebug``, and rpcsrv's per-kernel-step views).

The package holds no names of its own: import the module that defines one.
"""
