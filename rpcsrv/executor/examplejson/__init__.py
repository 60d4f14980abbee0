"""The ExampleJSON module kind (type key ``examplejson``; docs/examplejson.md): subgraphs of kernel steps.

* ``text.py``: the text, parsed into subgraphs and checked without data (ops, attributes, dtypes);
* ``subgraphs.py``: the runtime module, one packed function per subgraph (its steps bound to kernels and
  run plans when the constants arrive);
* the rewrites of a subgraph before its steps are bound, each with its own docstring: ``scale_fold.py``,
  ``residual_fold.py``, ``shuffle_fold.py``, ``concat_fold.py`` and ``concat_chain.py``.

The package holds no names of its own: import the module that defines one.
"""
