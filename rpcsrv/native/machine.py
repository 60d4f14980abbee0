"""Which machine a library was built for, and whether this board can run it: moved to
``rpcsrv.loader.machine`` (the executor's prebuilt kernels are chosen by it too, and the executor may
not import ``rpcsrv.native``); the native layer's imports keep this name."""

from ..loader.machine import Machine, board, machine_of

__all__ = ["Machine", "board", "machine_of"]
