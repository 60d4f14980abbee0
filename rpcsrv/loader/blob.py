"""The module blob: TVM's three layouts, parsed into a module tree and built back byte for byte.

The blob is what follows the 8-byte length in the library's blob symbol (``containers.py``).

* **classic** (TVM 0.7 - 0.20, ``__tvm_dev_mblob``; ``ModuleSerializer`` in ``codegen.cc``):
  ``u64`` entry count, then entries ``type_key`` + payload.  Payloads carry no length, so an
  unknown type key cannot be skipped.  ``_lib`` (no payload) marks the host library; the last entry
  ``_import_tree`` holds the tree in CSR form (``row_ptr``, ``child_indices``), module 0 is the root.
* **legacy** (before 0.7, and 0.7+ when the host library imports nothing): the same entries
  without ``_import_tree``; the root is the host library and every entry is one of its imports.
* **ffi** (TVM 0.21+, ``__tvm_ffi__library_bin``; ``library_module.cc`` of tvm-ffi): the import
  tree first (``row_ptr``, ``child_indices``), then one entry per module: ``kind`` and, except for
  ``_lib``, its payload as a length-prefixed byte string (so unknown kinds can be skipped).

The writer numbers modules the way TVM's serializer does (depth-first from the root, every host
library merged into one ``_lib`` slot placed after all its parents), so a child's index is always
above its parent's and each module's imports come back in index order, as with TVM itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from construct import Array, Construct, If, Pass, Struct, Switch, Tell, this

from .errors import LoaderError
from .formats import DmlcBytes, DmlcString, Expect, FormatError, ImportTree, Vector, fail, parse
from .modules import (
    IMPORT_TREE_KEY, LIB_KEY, PAYLOADS, HostLibraryModule, ModuleNode, UnknownModule,
)
from .plugins import refusal

LAYOUTS = ("classic", "legacy", "ffi")


class _UnknownKey(Construct):
    """Switch default of the classic layout: an unknown payload cannot be skipped."""

    def _parse(self, stream, context, path):
        fail(stream, context.offset, refusal(context.type_key))

    def _build(self, obj, stream, context, path):
        raise FormatError(f"cannot write a payload for unknown type key {context.type_key!r}")


class _ClassicPayloads(Mapping):
    """The classic entries' payload declarations by type key: a live view of ``PAYLOADS`` (plugins
    installed after import included) plus the two structural keys."""

    _FIXED = {LIB_KEY: Pass, IMPORT_TREE_KEY: ImportTree}

    def __getitem__(self, key):
        return self._FIXED[key] if key in self._FIXED else PAYLOADS[key].fmt

    def __iter__(self):
        return iter([*PAYLOADS, *self._FIXED])

    def __len__(self):
        return len(PAYLOADS) + len(self._FIXED)


_CLASSIC_PAYLOADS = _ClassicPayloads()

ClassicEntry = Struct(
    "type_key" / DmlcString,
    "offset" / Tell,
    "payload" / Switch(this.type_key, _CLASSIC_PAYLOADS, default=_UnknownKey()),
)
#: classic and legacy blob: ``u64`` count, then the entries
ClassicBlob = Vector(ClassicEntry, min_size=8)

FfiEntry = Struct(
    "type_key" / DmlcString,
    "offset" / Tell,
    "payload" / If(this.type_key != LIB_KEY, DmlcBytes),
)
#: tvm-ffi blob: import tree, then one entry per module
FfiBlob = Struct(
    "tree" / ImportTree,
    Expect(lambda c: len(c.tree.row_ptr) >= 2,
           lambda c: f"import tree with {len(c.tree.row_ptr)} row pointers lists no module "
                     f"(expected at least 2)"),
    "entries" / Array(lambda c: len(c.tree.row_ptr) - 1, FfiEntry),
)


def detect_layout(blob) -> str:
    """The blob's layout family: "ffi" or "classic" (which also covers "legacy").

    A tvm-ffi blob starts with the import tree: a non-zero count, then ``row_ptr[0] == 0``.  A
    classic blob starts with the entry count, then the first type key's length, never 0.
    """
    view = memoryview(blob).cast("B")
    first, second = (int.from_bytes(view[i:i + 8], "little") for i in (0, 8))
    return "ffi" if len(view) >= 16 and first and second == 0 else "classic"


_TYPE_KEY = re.compile(rb"[A-Za-z_][A-Za-z0-9_.]*")  # an empty key does not match


def looks_like_blob(blob) -> bool:
    """Whether ``blob`` starts the way a blob of some layout does (a guess used to tell a truncated
    blob from a file that is no library): an import tree of fewer than 2**32 rows (ffi), or an entry
    count below 2**32 followed by a type key of at most 128 name characters (classic; of a
    truncated blob, the characters that are there)."""
    view = memoryview(blob).cast("B")
    if len(view) < 16:
        return False
    first, second = (int.from_bytes(view[i:i + 8], "little") for i in (0, 8))
    if first >= 1 << 32:
        return False
    if detect_layout(view) == "ffi":
        return True
    key = bytes(view[16:16 + second]) if 0 < second <= 128 else b""
    return _TYPE_KEY.fullmatch(key) is not None


def parse_blob(blob, layout: str | None = None, base: int = 0) -> ModuleNode:
    """The module tree of ``blob`` (bytes or memoryview, without the 8-byte length header).

    ``layout`` is "classic" (also reads "legacy"), "ffi" or None to detect it.  Params and constants
    are numpy views over ``blob``.  ``base`` is the blob's offset in its file, used in messages.
    """
    return parse_blob_ex(blob, layout, base)[0]


def parse_blob_ex(blob, layout: str | None = None, base: int = 0) -> tuple[ModuleNode, str]:
    """Like ``parse_blob`` but also returns the layout found ("classic", "legacy" or "ffi")."""
    layout = layout or detect_layout(blob)
    if layout not in LAYOUTS:
        raise ValueError(f"unknown blob layout {layout!r}; expected one of {LAYOUTS}")
    if layout == "ffi":
        return _parse_ffi(blob, base), "ffi"
    entries, _ = parse(ClassicBlob, blob, base=base, what="classic blob")  # TVM ignores the rest
    nodes, tree = [], None
    for entry in entries:
        if entry.type_key == IMPORT_TREE_KEY:
            if tree is not None:
                raise LoaderError(f"classic blob: second {IMPORT_TREE_KEY} entry "
                                  f"(at offset {base + entry.offset})")
            tree = entry.payload
        else:
            nodes.append(_node(entry, base, entry.payload))
    _check_single_lib(nodes, base)
    if tree is None:
        if any(isinstance(n, HostLibraryModule) for n in nodes):
            raise LoaderError(f"classic blob at offset {base}: {LIB_KEY} entry without an "
                              f"{IMPORT_TREE_KEY} entry (expected one whenever {LIB_KEY} is present)")
        return HostLibraryModule(imports=nodes), "legacy"
    return _link(nodes, tree.row_ptr, tree.child_indices, base), "classic"


def _parse_ffi(blob, base: int) -> ModuleNode:
    value, _ = parse(FfiBlob, blob, base=base, what="tvm-ffi blob")
    nodes = []
    view = memoryview(blob).cast("B")
    for entry in value.entries:
        if entry.type_key == LIB_KEY or entry.type_key not in PAYLOADS:
            nodes.append(_node(entry, base, None))
            continue
        start = entry.offset + 8  # the payload bytes follow their u64 length
        payload, end = parse(PAYLOADS[entry.type_key].fmt, view[start:start + len(entry.payload)],
                             base=base + start, what=f"{entry.type_key} payload")
        if end != len(entry.payload):
            raise LoaderError(f"{entry.type_key} payload: {len(entry.payload) - end} unexpected "
                              f"trailing bytes (at offset {base + start + end})")
        nodes.append(_node(entry, base, payload))
    _check_single_lib(nodes, base)
    return _link(nodes, value.tree.row_ptr, value.tree.child_indices, base)


def _node(entry, base: int, payload) -> ModuleNode:
    key = entry.type_key
    if key == LIB_KEY:
        return HostLibraryModule()
    if key not in PAYLOADS:
        return UnknownModule(type_key=key, payload=bytes(entry.payload))
    try:
        return PAYLOADS[key].decode(payload, key)
    except ValueError as exc:
        raise LoaderError(f"{key} payload: {exc} (at offset {base + entry.offset})") from None


def _check_single_lib(nodes: list[ModuleNode], base: int) -> None:
    if sum(isinstance(n, HostLibraryModule) for n in nodes) > 1:
        raise LoaderError(f"blob at offset {base}: more than one {LIB_KEY} entry (TVM allows one)")


def _link(nodes: list[ModuleNode], row_ptr: list[int], children: list[int], base: int) -> ModuleNode:
    """Attach imports from the CSR import tree after checking it is well formed and acyclic."""
    where = f"import tree of the blob at offset {base}"
    if not nodes:
        raise LoaderError(f"{where}: the blob holds no module")
    if len(row_ptr) != len(nodes) + 1:
        raise LoaderError(f"{where}: {len(row_ptr)} row pointers, expected {len(nodes) + 1} "
                          f"for {len(nodes)} modules")
    if row_ptr[0] != 0 or row_ptr[-1] != len(children) or any(
            a > b for a, b in zip(row_ptr, row_ptr[1:])):
        raise LoaderError(f"{where}: row pointers {row_ptr[:16]} must rise from 0 to "
                          f"{len(children)} (the number of child indices)")
    for c in children:
        if c >= len(nodes):
            raise LoaderError(f"{where}: child index {c} out of range, expected < {len(nodes)}")
    adjacency = [children[row_ptr[i]:row_ptr[i + 1]] for i in range(len(nodes))]
    _check_acyclic(adjacency, where)
    for node, kids in zip(nodes, adjacency):
        node.imports = [nodes[k] for k in kids]
    return nodes[0]


def _check_acyclic(adjacency: list[list[int]], where: str) -> None:
    state = [0] * len(adjacency)  # 0 new, 1 on the current path, 2 done
    for start in range(len(adjacency)):
        if state[start]:
            continue
        stack = [(start, iter(adjacency[start]))]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            for nxt in it:
                if state[nxt] == 1:
                    raise LoaderError(f"{where}: cycle through module {nxt} (imported by {node})")
                if state[nxt] == 0:
                    state[nxt] = 1
                    stack.append((nxt, iter(adjacency[nxt])))
                    break
            else:
                state[node] = 2
                stack.pop()


def _number(root: ModuleNode) -> tuple[list[list[ModuleNode]], list[list[int]]]:
    """TVM's module numbering: groups in index order (host libraries share one group) and the
    sorted child indices of each group."""
    groups: list[list[ModuleNode]] = []
    index: dict[int, int] = {}
    visited = {id(root)}

    def push(stack, mod):
        for im in mod.imports:
            if id(im) not in visited:
                visited.add(id(im))
                stack.append(im)

    stack, boundary = [root], []
    while stack:  # phase 0: everything above the host libraries
        mod = stack.pop()
        if isinstance(mod, HostLibraryModule):
            boundary.append(mod)
            continue
        index[id(mod)] = len(groups)
        groups.append([mod])
        push(stack, mod)
    if boundary:  # phase 1: one slot for all host libraries, then what they import
        lib_slot = len(groups)
        groups.append([])
        stack = boundary
        while stack:
            mod = stack.pop()
            if isinstance(mod, HostLibraryModule):
                groups[lib_slot].append(mod)
                index[id(mod)] = lib_slot
            else:
                index[id(mod)] = len(groups)
                groups.append([mod])
            push(stack, mod)
    rows = []
    for parent, group in enumerate(groups):
        kids = sorted({index[id(im)] for m in group for im in m.imports} - {parent})
        if kids and kids[0] < parent:
            raise ValueError(f"cannot export: {group[0].type_key!r} (module {parent}) imports "
                             f"{groups[kids[0]][0].type_key!r} numbered before it (module {kids[0]}); "
                             f"TVM's serializer refuses such import graphs")
        rows.append(kids)
    return groups, rows


def _payload(mod: ModuleNode) -> bytes:
    if isinstance(mod, UnknownModule):
        return bytes(mod.payload)
    codec = PAYLOADS.get(mod.type_key)
    if codec is None:
        raise ValueError(f"cannot serialize module with type key {mod.type_key!r}")
    return codec.fmt.build(codec.encode(mod))


def build_blob(root: ModuleNode, layout: str = "classic") -> bytes:
    """The blob TVM's writer produces for this tree (without the 8-byte length header).

    "classic" writes TVM 0.7-0.20's layout (no import tree when the root is a host library that
    imports nothing, as TVM does), "ffi" the tvm-ffi layout, "legacy" the pre-0.7 layout (root must
    be a host library whose imports import nothing).
    """
    if layout == "legacy":
        if not isinstance(root, HostLibraryModule) or any(m.imports for m in root.imports):
            raise ValueError("the legacy layout holds a host library root with one level of imports")
        return ClassicBlob.build([_classic_entry(m) for m in root.imports])
    if layout not in ("classic", "ffi"):
        raise ValueError(f"unknown blob layout {layout!r}; expected one of {LAYOUTS}")
    groups, rows = _number(root)
    row_ptr = [0]
    for kids in rows:
        row_ptr.append(row_ptr[-1] + len(kids))
    tree = dict(row_ptr=row_ptr, child_indices=[k for kids in rows for k in kids])
    if layout == "ffi":
        entries = [dict(type_key=LIB_KEY, payload=None) if isinstance(g[0], HostLibraryModule)
                   else dict(type_key=g[0].type_key, payload=_payload(g[0])) for g in groups]
        return FfiBlob.build(dict(tree=tree, entries=entries))
    if isinstance(root, HostLibraryModule) and not root.imports:
        return ClassicBlob.build([])
    entries = [_classic_entry(g[0]) for g in groups]
    entries.append(dict(type_key=IMPORT_TREE_KEY, payload=tree))
    return ClassicBlob.build(entries)


def _classic_entry(mod: ModuleNode) -> dict:
    if isinstance(mod, HostLibraryModule):
        return dict(type_key=LIB_KEY, payload=None)
    if isinstance(mod, UnknownModule) or mod.type_key not in PAYLOADS:
        raise ValueError(f"the classic layout cannot hold module type key {mod.type_key!r}")
    codec = PAYLOADS[mod.type_key]
    return dict(type_key=mod.type_key, payload=codec.encode(mod))
