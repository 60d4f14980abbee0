"""Module kinds as plugins: the interface a board runtime implements, and the registry of those in use.

A *module kind* is what the board needs to run one kind of module a library carries
(:class:`ModuleKind`): for its type keys, the payload codec (construct declaration, bytes → loader
node and back), the runtime factory (loader node → runtime module with its functions) and what
``rpcsrv inspect`` says about it.  A :class:`RuntimePlugin` is a named group of kinds.

Every kind goes through :func:`install`, the built-in ones too (``modules.py`` installs the graph
executor factory, const loader, ExampleJSON and Relax VM kinds at import); an installed Python
package adds its own through the entry-point group ``rpcsrv.runtimes`` (:data:`GROUP`), each entry
point naming a ``RuntimePlugin`` (or a function returning one), loaded by :func:`load_plugins` when
``rpcsrv serve``, ``inspect`` or ``extract`` start.  A plugin that fails to import or to install
is one log line and one entry of :func:`report`; the board goes on without it.  Two plugins
claiming one type key is an error naming both.

The runtime factory may be given as ``"module:attribute"`` (resolved by the executor when the first
such module is built): the built-in kinds are declared here in the loader, below the executor that
implements them, exactly as an entry point names an object it does not import.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence, Union

from .node import PAYLOADS, ModuleNode, PayloadCodec

__all__ = ["GROUP", "ENV", "KINDS", "ModuleKind", "RuntimePlugin", "PluginError", "add_codec", "install", "kind_of",
           "load_plugins", "load_plugins_from_env", "report", "isolated"]

#: the entry-point group of board plugins
GROUP = "rpcsrv.runtimes"
#: the environment variable that hands the server's plugin choice to its worker processes
ENV = "RPCSRV_PLUGINS"

log = logging.getLogger("rpcsrv.plugins")

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def file_name(name: str) -> str:
    """``name`` (a symbol, a module name: chosen by whoever built the library) as one safe file name."""
    return _UNSAFE.sub("_", name).strip(".") or "unnamed"

#: factory(node, imports, options) -> RuntimeModule, or "module:attribute" naming one
RuntimeFactoryRef = Union[Callable[..., Any], str]


class PluginError(ValueError):
    """A plugin that cannot be installed (a malformed declaration, a type key taken by another)."""


@dataclass(frozen=True)
class ModuleKind:
    """One kind of module: everything the loader, the executor and ``inspect`` need for its type keys
    (docs/plugins.md, "Reference: the contract", says it all for a vendor).

    * ``type_keys``: the keys TVM writes for it (several when TVM renamed it: ``metadata`` → ``const_loader``);
    * ``codec``: the payload's construct declaration (``fmt``, which must know where it ends: in the
      classic layout the next module's entry follows it with no length between) and
      ``decode(value, key) -> node`` (a ``ValueError`` refuses the library) / ``encode(node)``;
    * ``runtime``: ``factory(node, imports, options) -> RuntimeModule`` (``rpcsrv.executor.module``):
      ``imports`` are the runtime modules of ``node.imports``, ``options`` the board's
      ``rpcsrv.executor.BuildOptions`` for this load (native code; a plugin kind ignores it);
    * ``summarize(node) -> dict``: JSON-serialisable facts for ``rpcsrv inspect --json`` (optional);
    * ``format(head, summary) -> list[str]``: those facts as text lines (optional; default: the head);
    * ``functions(node) -> list[str]``: the packed functions the module exports (``inspect`` names
      them as ``label`` where a graph calls them);
    * ``extract(node) -> (fields, parts)``: what ``rpcsrv extract`` writes besides the raw payload:
      manifest fields, and parts ``(field, relative path, text or bytes, what it is)``, each file's path
      listed under ``field`` in the module's manifest entry (optional).
    """

    type_keys: tuple[str, ...]
    codec: PayloadCodec
    runtime: RuntimeFactoryRef
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


@dataclass
class _State:
    installed: dict[str, dict] = field(default_factory=dict)  # plugin name -> {source, type_keys, description}
    failed: dict[str, str] = field(default_factory=dict)  # plugin name -> error
    skipped: list[str] = field(default_factory=list)  # installed packages not loaded (--plugin, --no-plugins)


#: type key -> its kind, and the name of the plugin that installed it
KINDS: dict[str, ModuleKind] = {}
OWNERS: dict[str, str] = {}
_STATE = _State()


def _check(plugin: Any) -> RuntimePlugin:
    if not isinstance(plugin, RuntimePlugin):
        raise PluginError(f"expected an rpcsrv.loader.plugins.RuntimePlugin, got {type(plugin).__name__}")
    if not plugin.name or not isinstance(plugin.name, str):
        raise PluginError("a plugin needs a name")
    if not plugin.kinds:
        raise PluginError(f"plugin {plugin.name!r} declares no module kind")
    for kind in plugin.kinds:
        if not isinstance(kind, ModuleKind):
            raise PluginError(f"plugin {plugin.name!r}: expected ModuleKind entries, got {type(kind).__name__}")
        if not kind.type_keys or not all(isinstance(k, str) and k for k in kind.type_keys):
            raise PluginError(f"plugin {plugin.name!r}: a module kind needs non-empty type keys")
        if not isinstance(kind.codec, PayloadCodec):
            raise PluginError(f"plugin {plugin.name!r}, {kind.type_keys[0]!r}: codec must be a PayloadCodec")
        if not callable(kind.runtime) and not (isinstance(kind.runtime, str) and ":" in kind.runtime):
            raise PluginError(f"plugin {plugin.name!r}, {kind.type_keys[0]!r}: runtime must be a factory "
                              f"or 'module:attribute'")
    return plugin


def install(plugin: Any, source: str = "built-in") -> None:
    """Add ``plugin``'s kinds to the loader's ``PAYLOADS`` and to :data:`KINDS` (all or nothing).

    Installing the same plugin object again does nothing; a type key another plugin (or a direct
    ``PAYLOADS`` entry) already has is a :class:`PluginError` naming both."""
    plugin = _check(plugin)
    if plugin.name in _STATE.installed:
        if all(KINDS.get(k) is kind for kind in plugin.kinds for k in kind.type_keys):
            return
        raise PluginError(f"two plugins are named {plugin.name!r} ({_STATE.installed[plugin.name]['source']} "
                          f"and {source})")
    seen: set[str] = set()
    for kind in plugin.kinds:
        for key in kind.type_keys:
            if key in seen:
                raise PluginError(f"plugin {plugin.name!r} declares type key {key!r} twice")
            seen.add(key)
            if key in OWNERS:
                raise PluginError(f"plugin {plugin.name!r} ({source}) registers type key {key!r}, which plugin "
                                  f"{OWNERS[key]!r} ({_STATE.installed[OWNERS[key]]['source']}) already has")
            if key in PAYLOADS and PAYLOADS[key] is not kind.codec:  # (a codegen may have put the codec)
                raise PluginError(f"plugin {plugin.name!r} ({source}) registers type key {key!r}, which "
                                  f"rpcsrv.loader's PAYLOADS table already has")
    for kind in plugin.kinds:
        for key in kind.type_keys:
            PAYLOADS[key] = kind.codec
            KINDS[key] = kind
            OWNERS[key] = plugin.name
    _STATE.installed[plugin.name] = {"source": source, "type_keys": sorted(seen),
                                     "description": plugin.description}


def add_codec(key: str, codec: PayloadCodec) -> None:
    """Let this process write (and read) payloads of ``key`` without running them: what a codegen needs
    to export its modules (``rpcsrv.client.compiler``).  The board plugin with the same codec object
    can still be installed after it; another codec for a taken key is a :class:`PluginError`."""
    if not isinstance(codec, PayloadCodec):
        raise PluginError(f"type key {key!r}: codec must be a PayloadCodec")
    if PAYLOADS.get(key, codec) is not codec:
        raise PluginError(f"type key {key!r} already has another payload codec"
                          + (f" (plugin {OWNERS[key]!r})" if key in OWNERS else ""))
    PAYLOADS[key] = codec


def kind_of(node: Any) -> ModuleKind | None:
    """The installed kind of a decoded loader node (None for the host library, unknown keys and the rest)."""
    kind = KINDS.get(getattr(node, "type_key", None))
    return None if kind is None or type(node).__name__ == "UnknownModule" else kind


def _entry_points() -> list:
    return sorted(importlib.metadata.entry_points(group=GROUP), key=lambda ep: ep.name)


def _source(ep) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else ep.value


def _fail(name: str, error: str) -> None:
    _STATE.failed[name] = error
    log.warning("plugin %s not loaded: %s", name, error)


def load_plugins(select: Sequence[str] | None = None, enabled: bool = True, export: bool = False) -> dict:
    """Load the installed plugins of :data:`GROUP` (only those named in ``select`` if given; none
    if not ``enabled``); returns :func:`report`.  ``export``: record the choice in :data:`ENV` for
    the worker processes the server starts.  Loading again skips the plugins already installed."""
    wanted = None if select is None else list(dict.fromkeys(select))
    found = set()
    for ep in _entry_points():
        found.add(ep.name)
        if not enabled or (wanted is not None and ep.name not in wanted):
            if ep.name not in _STATE.skipped:
                _STATE.skipped.append(ep.name)
            continue
        if ep.name in _STATE.installed:
            continue
        try:
            obj = ep.load()
            plugin = obj() if callable(obj) and not isinstance(obj, RuntimePlugin) else obj
            if isinstance(plugin, RuntimePlugin) and plugin.name != ep.name:
                raise PluginError(f"the entry point is named {ep.name!r} but its plugin {plugin.name!r}")
            install(plugin, _source(ep))
        except Exception as exc:  # a broken plugin must not stop the board: one line, then go on
            _fail(ep.name, f"{type(exc).__name__}: {exc}".replace("\n", " "))
        else:
            _STATE.failed.pop(ep.name, None)
            if ep.name in _STATE.skipped:
                _STATE.skipped.remove(ep.name)
    for name in wanted or ():
        if enabled and name not in found:
            _fail(name, f"no such plugin installed (entry-point group {GROUP}; installed: "
                        f"{', '.join(sorted(found)) or 'none'})")
    if export:
        os.environ[ENV] = ",".join(n for n in _STATE.installed if _STATE.installed[n]["source"] != "built-in")
    return report()


def load_plugins_from_env() -> dict:
    """What a worker process loads: the plugins its server exported in :data:`ENV` (none if unset)."""
    chosen = os.environ.get(ENV)
    if chosen is None:
        return report()
    return load_plugins([n for n in chosen.split(",") if n], enabled=bool(chosen))


def report() -> dict:
    """The plugins in use: ``{"loaded": [...], "failed": [...], "skipped": [...]}``; each loaded one
    with its name, source (``built-in`` or the distribution and version) and type keys."""
    return {"loaded": [{"name": n, **info} for n, info in _STATE.installed.items()],
            "failed": [{"name": n, "error": e} for n, e in _STATE.failed.items()],
            "skipped": list(_STATE.skipped)}


@contextmanager
def isolated() -> Iterator[None]:
    """Run a block with a copy of the registry and restore it after (tests that install plugins)."""
    global _STATE
    saved = (dict(PAYLOADS), dict(KINDS), dict(OWNERS), _STATE)
    _STATE = _State(dict(_STATE.installed), dict(_STATE.failed), list(_STATE.skipped))
    try:
        yield
    finally:
        for table, old in zip((PAYLOADS, KINDS, OWNERS), saved[:3]):
            table.clear()
            table.update(old)
        _STATE = saved[3]
