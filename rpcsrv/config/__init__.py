"""The process's settings: the one reader of rpcsrv's environment variables (``environment.py``) and the
C toolchain and cache folder the board builds its native shim and compiled kernels with (``toolchain.py``).

A leaf package (it imports nothing of rpcsrv), so every layer may ask it.  What a server is told on its
command line is not here: that is an options object (``rpcsrv.board.options``) handed down to what needs it.
"""
