"""The base of the module tree and of its kinds: ``ModuleNode``, the one walk, and the one registry of kinds.

A leaf: ``modules.py`` (the payload kinds TVM's graph executor libraries carry), each module kind in its own
file (``examplejson.py``, ``vm_executable.py``, ``jsonrt.py``) and ``plugins.py`` (installing kinds, the
installed packages' plugins) build on it without an import circle.

A *module kind* (:class:`ModuleKind`) is everything rpcsrv needs for a module of some type keys: its payload
codec, its runtime factory, what ``rpcsrv inspect`` and ``extract`` say of it.  :data:`REGISTRY` holds every
kind this process knows, by type key; :data:`PAYLOADS` is its codecs as a mapping, which every blob layout
reads.  ``plugins.py`` fills it (the built-in kinds and the installed packages' alike), and nothing else
tells the kinds apart: no class names, no factory names.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional


def walk_imports(root: Any) -> Iterator[Any]:
    """``root``, then its ``imports`` depth-first, each module once: TVM's lookup order.

    The one walk of the project: loader nodes and runtime modules (``rpcsrv.executor.module``)
    both have an ``imports`` list and both use this.
    """
    seen: set[int] = set()
    stack = [root]
    while stack:
        mod = stack.pop()
        if id(mod) in seen:
            continue
        seen.add(id(mod))
        yield mod
        stack.extend(reversed(mod.imports))


@dataclass(eq=False, repr=False)
class ModuleNode:
    """One module of the tree: its type key and the modules it imports (in order)."""

    type_key: str = field(default="module", kw_only=True)
    imports: list["ModuleNode"] = field(default_factory=list, kw_only=True)

    def walk(self) -> Iterator["ModuleNode"]:
        """This module, then its imports depth-first, each module once."""
        return walk_imports(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.type_key!r} imports={len(self.imports)}>"


@dataclass(eq=False, repr=False)
class UnknownModule(ModuleNode):
    """A module whose type key no kind of this process decodes (tvm-ffi layout only, where it can be skipped).

    Kept so that the tree keeps its shape; running it fails (``rpcsrv.executor``), and a key that a plugin
    installed here but turned off would take is refused at ``load_module`` (``plugins.refusal``)."""

    payload: bytes = b""


@dataclass(frozen=True)
class PayloadCodec:
    """How one type key's payload is declared, decoded into a node and encoded back.

    ``fmt`` (construct) must know where it ends: the classic layout puts the next module's entry right
    after it (a length prefix such as ``Prefixed(Int64ul, ...)``, or counts and fixed sizes); the tvm-ffi
    layout hands it exactly its bytes.  ``decode(value, type_key)`` turns ``fmt.parse``'s value into a
    node (``ValueError``: a bad payload), ``encode(node)`` gives back what ``fmt.build`` takes."""

    fmt: Any
    decode: Callable[[Any, str], ModuleNode]
    encode: Callable[[ModuleNode], Any]


#: factory(node, imports, options) -> RuntimeModule (``rpcsrv.executor``)
RuntimeFactory = Callable[..., Any]


@dataclass(frozen=True)
class ModuleKind:
    """One kind of module: everything the loader, the executor and ``inspect`` need for its type keys
    (docs/plugins.md, "Reference: the contract", says it all for a vendor).

    * ``type_keys``: the keys TVM writes for it (several when TVM renamed it: ``metadata`` → ``const_loader``);
    * ``codec``: the payload's construct declaration (``fmt``, which must know where it ends: in the
      classic layout the next module's entry follows it with no length between) and
      ``decode(value, key) -> node`` (a ``ValueError`` refuses the library) / ``encode(node)``;
      None for a module without a payload of its own (the host library, ``_lib``);
    * ``runtime``: ``factory(node, imports, options) -> RuntimeModule`` (``rpcsrv.executor.module``):
      ``imports`` are the runtime modules of ``node.imports``, ``options`` the board's
      ``rpcsrv.executor.BuildOptions`` for this load (native code; a plugin kind ignores it).  None
      where the loader declares a built-in kind: the executor, above it, attaches the runtime through the
      registry (``plugins.attach_runtime``); a kind that still has none decodes but runs nowhere;
    * ``summarize(node) -> dict``: JSON-serialisable facts for ``rpcsrv inspect --json`` (optional);
    * ``format(head, summary) -> list[str]``: those facts as text lines (optional; default: the head);
    * ``functions(node) -> list[str]``: the packed functions the module exports (``inspect`` names
      them as ``label`` where a graph calls them);
    * ``extract(node) -> (fields, parts)``: what ``rpcsrv extract`` writes besides the raw payload:
      manifest fields, and parts ``(field, relative path, text or bytes, what it is)``, each file's path
      listed under ``field`` in the module's manifest entry (optional).
    """

    type_keys: tuple[str, ...]
    codec: Optional[PayloadCodec]
    runtime: Optional[RuntimeFactory] = None
    summarize: Callable[[ModuleNode], dict] | None = None
    format: Callable[[str, dict], list[str]] | None = None
    functions: Callable[[ModuleNode], list[str]] | None = None
    label: str = "external function"
    extract: Callable[[ModuleNode], tuple[dict, list[tuple[str, str, Any, str]]]] | None = None


@dataclass(frozen=True)
class RuntimePlugin:
    """A named group of module kinds: what an entry point of ``rpcsrv.runtimes`` names."""

    name: str
    kinds: tuple[ModuleKind, ...]
    description: str = ""


class KindRegistry:
    """Every module kind of this process, by type key, and the plugins that brought them.

    ``kinds``: type key -> kind; ``owners``: type key -> the plugin that installed it (a key without an owner
    has a codec only: a compiler writes it, nothing here runs it).  The plugins' bookkeeping
    (``installed``, ``failed``, ``skipped``, ``choice``) is ``plugins.py``'s."""

    def __init__(self) -> None:
        self.kinds: dict[str, ModuleKind] = {}
        self.owners: dict[str, str] = {}
        self.installed: dict[str, dict] = {}  # plugin name -> {source, type_keys, description}
        self.failed: dict[str, str] = {}  # plugin name -> error
        self.skipped: list[str] = []  # installed packages' plugins not loaded (the choice left them out)
        self.choice: Optional[tuple[Optional[tuple[str, ...]], bool]] = None  # load_plugins' (select, enabled)

    def kind_of(self, node: Any) -> Optional[ModuleKind]:
        """The kind of a decoded node (None for a module no kind of this process decoded)."""
        if isinstance(node, UnknownModule):
            return None
        return self.kinds.get(node.type_key)

    def state(self) -> tuple:
        """A copy of everything, for :meth:`restore` (``plugins.isolated``)."""
        return (dict(self.kinds), dict(self.owners), dict(self.installed), dict(self.failed), list(self.skipped),
                self.choice)

    def restore(self, state: tuple) -> None:
        """Put back what :meth:`state` copied (in place: the views of ``plugins.py`` stay valid)."""
        kinds, owners, installed, failed, skipped, self.choice = state
        for table, old in ((self.kinds, kinds), (self.owners, owners), (self.installed, installed),
                           (self.failed, failed)):
            table.clear()
            table.update(old)
        self.skipped[:] = skipped


#: the one registry of module kinds
REGISTRY = KindRegistry()


class _Payloads(MutableMapping):
    """Type key -> payload codec, read from :data:`REGISTRY` (what every blob layout reads).  Setting a key
    gives it a codec only (``plugins.add_codec``); deleting one forgets its kind (as on a board without it)."""

    def __getitem__(self, key: str) -> PayloadCodec:
        kind = REGISTRY.kinds.get(key)
        if kind is None or kind.codec is None:
            raise KeyError(key)
        return kind.codec

    def __setitem__(self, key: str, codec: PayloadCodec) -> None:
        if key in REGISTRY.kinds and REGISTRY.kinds[key].codec is not codec:
            raise ValueError(f"type key {key!r} already has another payload codec")
        REGISTRY.kinds.setdefault(key, ModuleKind((key,), codec))

    def __delitem__(self, key: str) -> None:
        self[key]  # (KeyError when it has no codec)
        del REGISTRY.kinds[key]
        REGISTRY.owners.pop(key, None)

    def __iter__(self) -> Iterator[str]:
        return iter([k for k, kind in REGISTRY.kinds.items() if kind.codec is not None])

    def __len__(self) -> int:
        return sum(kind.codec is not None for kind in REGISTRY.kinds.values())


#: type key -> how its payload is declared and decoded (the registry's codecs)
PAYLOADS = _Payloads()
