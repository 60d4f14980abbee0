"""The ExampleJSON module kind (type key ``examplejson``), declared as a built-in plugin.

Its loader half: the node (:class:`ExampleJSONModule`, the subgraphs as one text, ``docs/examplejson.md``),
the payload codec (one dmlc string) and what ``rpcsrv inspect`` shows (each subgraph's inputs,
constants, op counts, outputs; read tolerantly, since the executor is the authority on whether the
text runs).  The runtime is ``rpcsrv.executor.examplejson.subgraphs``, which the executor attaches to
:data:`KIND` through the registry (``plugins.attach_runtime``); :data:`PLUGIN` installs the kind through the
same interface an installed plugin uses (``plugins.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .examplejson_text import is_header, lex
from .formats import ExampleJSONPayload
from .node import ModuleNode, PayloadCodec
from .plugins import ModuleKind, RuntimePlugin, file_name


@dataclass(eq=False, repr=False)
class ExampleJSONModule(ModuleNode):
    """A BYOC ExampleJSON module: its subgraphs as one text."""

    code: str
    type_key: str = field(default="examplejson", kw_only=True)


def summarize_examplejson(code: str) -> list[dict]:
    """Each subgraph of an ExampleJSON text: name, inputs, constants, op counts, outputs (from its lexed
    lines, ``examplejson_text.lex``: a text the board would refuse is still described)."""
    subgraphs: list[dict] = []
    for _line, kind, _text, words in lex(code):
        if kind == "header":
            subgraphs.append({"name": words[0], "inputs": [], "consts": [], "ops": {}, "nodes": 0, "outputs": []})
            continue
        if not subgraphs:
            subgraphs.append({"name": "(unnamed)", "inputs": [], "consts": [], "ops": {}, "nodes": 0,
                              "outputs": []})
        sg = subgraphs[-1]
        if kind == "input":
            dims = [w for w in words[2:] if w.lstrip("-").isdigit()]
            dtype = words[words.index("dtype:") + 1] if "dtype:" in words[:-1] else "float32"
            sg["inputs"].append({"id": words[1] if len(words) > 1 else "?",
                                 "shape": [int(d) for d in dims], "dtype": dtype})
        elif kind == "const":
            sg["consts"].append(words[words.index("name:") + 1] if "name:" in words[:-1] else "?")
        elif kind == "output":
            sg["outputs"] = words[1:]
        else:
            sg["ops"][words[0]] = sg["ops"].get(words[0], 0) + 1
            sg["nodes"] += 1
    return subgraphs


def _format(head: str, info: dict) -> list[str]:
    out = [f"{head}: {len(info['subgraphs'])} subgraph(s)"]
    for sg in info["subgraphs"]:
        ops = ", ".join(f"{k} x{v}" for k, v in sg["ops"].items())
        ins = ", ".join(f"{i.get('dtype')}{list(i.get('shape') or [])}" for i in sg["inputs"])
        out.append(f"  {sg['name']}: inputs [{ins}], {sg['nodes']} nodes ({ops})"
                   + (f", consts {sg['consts']}" if sg["consts"] else "")
                   + (f", outputs {sg['outputs']}" if sg["outputs"] else ""))
    return out


def split_examplejson(code: str) -> list[tuple[str, str]]:
    """(symbol, text) of each subgraph of an ExampleJSON text (a one-token line starts one)."""
    parts: list[tuple[str, list[str]]] = []
    for line in code.splitlines():
        if is_header(line.split()):
            parts.append((line.split()[0], [line]))
        elif parts:
            parts[-1][1].append(line)
    return [(name, "\n".join(lines) + "\n") for name, lines in parts]


def _extract(m: ExampleJSONModule):
    """``rpcsrv extract``: each subgraph as its own text file."""
    return {}, [("subgraphs", f"examplejson/{file_name(sym)}.txt", text, f"ExampleJSON subgraph {sym!r}")
                for sym, text in split_examplejson(m.code)]


KIND = ModuleKind(
    type_keys=("examplejson",),
    codec=PayloadCodec(ExampleJSONPayload, lambda v, key: ExampleJSONModule(v, type_key=key), lambda m: m.code),
    summarize=lambda m: {"subgraphs": summarize_examplejson(m.code)},
    format=_format,
    functions=lambda m: [sg["name"] for sg in summarize_examplejson(m.code)],
    label="ExampleJSON subgraph",
    extract=_extract,
)

PLUGIN = RuntimePlugin("examplejson", (KIND,), "ExampleJSON subgraphs on the board's numpy kernels")
