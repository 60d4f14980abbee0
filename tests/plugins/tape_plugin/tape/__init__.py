"""tape: a made-up accelerator whose programs are instruction tapes, as an rpcsrv plugin.

* ``fmt.py``: the type key, the payload (a u32 byte count, then a zlib-compressed program), the loader
  node and the codec, shared by both halves;
* ``codegen.py``: the compiler side (``byoc compile --codegen tape``), with DAG patterns;
* ``runtime.py``: the board side (``rpcsrv serve``), weights bound from the const loader by name.
"""
