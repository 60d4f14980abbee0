"""``rpcsrv extract``: every part of an exported library as plain files, with a manifest.

For a user who wants "a binary file with the content that I fully control": what is inside a
``.so``/``.tar``/raw blob, written out so that each part can be read, diffed or rebuilt
(``rpcsrv.client.export`` takes them back).  Files in the output folder:

* ``payloads/NN_<type key>.bin``: each module entry's payload exactly as it sits in the blob (the
  bytes the module's ``SaveToBinary`` wrote; for the vendor's own module kind, its own format);
* ``graph/<module>.json``, ``graph/<module>.params`` (TVM param dict) and ``graph/<module>.npz``:
  each graph executor factory's graph JSON and params;
* what each plugin's module kind writes (``ModuleKind.extract``): ``examplejson/<symbol>.txt`` for each
  ExampleJSON subgraph, ``jsonrt/<symbol>.json`` for each JSON-runtime module's graph JSON
  (``tensorrt``, ``arm_compute_lib``, ...);
* ``constants/<n>.npz`` and the symbol -> constant names list in the manifest: const loader arrays;
* ``host_symbols.txt``: the host library's function symbols, one per line;
* ``manifest.json``: the library (container, layout, arch), the module tree (type key, imports,
  payload file of each module) and, per file, what it is.

Only the loader's public API is used (``load_library``, ``find_blob``, the blob declarations).
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path

import numpy as np

from .loader import ConstLoaderModule, GraphExecutorFactoryModule, HostLibraryModule, load_library, save_param_dict
from .loader.blob import ClassicBlob, FfiBlob
from .loader.containers import find_blob
from .loader.modules import IMPORT_TREE_KEY, LIB_KEY
from .loader.plugins import file_name as _safe, kind_of

def payload_entries(path: str) -> list[tuple[str, bytes]]:
    """(type key, raw payload bytes) of every entry of the library's blob, in file order
    (``_lib`` entries have no payload; the classic ``_import_tree`` entry is left out)."""
    with open(path, "rb") as f:
        data = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    loc = find_blob(data)
    holder = data if loc.buffer is None else memoryview(loc.buffer)
    blob = bytes(holder[loc.offset:loc.offset + loc.size])
    if loc.layout == "ffi" or (loc.layout is None and _is_ffi(blob)):
        parsed = FfiBlob.parse(blob)
        return [(e.type_key, bytes(e.payload or b"")) for e in parsed.entries]
    entries = ClassicBlob.parse(blob)
    result = []
    for i, e in enumerate(entries):
        if e.type_key == IMPORT_TREE_KEY:
            continue
        if i + 1 < len(entries):  # the next entry starts with its key (u64 length + bytes)
            end = entries[i + 1].offset - 8 - len(entries[i + 1].type_key.encode())
        else:
            end = len(blob)
        result.append((e.type_key, blob[e.offset:end] if e.type_key != LIB_KEY else b""))
    return result


def _is_ffi(blob: bytes) -> bool:
    from .loader.blob import detect_layout

    return detect_layout(blob) == "ffi"


class _Writer:
    def __init__(self, out: Path):
        self.out = out
        self.files: list[dict] = []

    def write(self, rel: str, data: bytes | str, what: str, **extra) -> str:
        path = self.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        self.files.append({"path": rel, "what": what, "bytes": path.stat().st_size, **extra})
        return rel

    def npz(self, rel: str, arrays: dict, what: str, **extra) -> str:
        path = self.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            np.savez(f, **{k: np.asarray(v) for k, v in arrays.items()})
        self.files.append({"path": rel, "what": what, "bytes": path.stat().st_size, **extra})
        return rel


def extract_library(path: str, out_dir: str, only: str | None = None) -> dict:
    """Write the parts of the library at ``path`` into ``out_dir``; returns the manifest.

    ``only``: just the modules of this type key (and their payload files).  Raises ``LoaderError``
    for a file that is not a library, ``ValueError`` for an ``only`` key the library lacks.
    """
    lib = load_library(path)
    modules = lib.modules()
    keys = sorted({m.type_key for m in modules})
    if only is not None and only not in keys:
        raise ValueError(f"the library has no module of type key {only!r} (it has: {', '.join(keys)})")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out_dir!r} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    w = _Writer(out)

    def wanted(key: str) -> bool:
        return only is None or key == only

    # raw payloads, in blob order; module objects of the same kind take them in the same order
    raw_by_key: dict[str, list[str]] = {}
    for n, (key, payload) in enumerate(payload_entries(path)):
        if key == LIB_KEY or not wanted(key):
            continue
        rel = w.write(f"payloads/{n:02d}_{_safe(key)}.bin", payload,
                      f"raw payload of a {key!r} module, byte for byte as in the library", type_key=key)
        raw_by_key.setdefault(key, []).append(rel)

    index = {id(m): i for i, m in enumerate(modules)}
    tree, taken = [], {k: 0 for k in raw_by_key}
    for i, m in enumerate(modules):
        entry = {"index": i, "type_key": m.type_key, "imports": [index[id(c)] for c in m.imports]}
        if m.type_key in raw_by_key and taken[m.type_key] < len(raw_by_key[m.type_key]):
            entry["payload"] = raw_by_key[m.type_key][taken[m.type_key]]
            taken[m.type_key] += 1
        tree.append(entry)
        if not wanted(m.type_key):
            continue
        if isinstance(m, GraphExecutorFactoryModule):
            base = f"graph/{_safe(m.module_name)}"
            entry["graph_json"] = w.write(f"{base}.json", m.graph_json, f"graph JSON of module {m.module_name!r}")
            entry["params"] = w.write(f"{base}.params", save_param_dict(dict(m.params)),
                                      f"params of module {m.module_name!r} (TVM param dict)")
            entry["params_npz"] = w.npz(f"{base}.npz", m.params, f"params of module {m.module_name!r} (numpy)")
            entry["module_name"] = m.module_name
        elif kind_of(m) is not None and kind_of(m).extract is not None:  # a plugin's kind (ExampleJSON, ...)
            fields, parts = kind_of(m).extract(m)
            entry.update(fields)
            for field, rel, data, what in parts:
                entry.setdefault(field, []).append(w.write(rel, data, what))
        elif isinstance(m, ConstLoaderModule):
            entry["constants"] = w.npz(f"constants/{i:02d}.npz", m.arrays, "const loader arrays by name")
            entry["const_vars_by_symbol"] = {k: list(v) for k, v in m.const_vars_by_symbol.items()}
        elif isinstance(m, HostLibraryModule) and not any(f["path"] == "host_symbols.txt" for f in w.files):
            w.write("host_symbols.txt", "".join(f"{s}\n" for s in lib.symbols),
                    "function symbols of the host library, one per line")
    manifest = {"library": os.fspath(path), "container": lib.container, "arch": lib.arch,
                "layout": lib.layout, "blob_symbol": lib.symbol, "only": only, "modules": tree,
                "files": w.files}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
