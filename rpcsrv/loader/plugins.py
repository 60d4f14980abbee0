"""Module kinds as plugins: installing them into the one registry of kinds, and the installed packages' plugins.

A *module kind* (:class:`ModuleKind`, declared in ``node.py`` with the registry it goes into) is what the
board needs to run one kind of module a library carries: for its type keys, the payload codec, the runtime
factory and what ``rpcsrv inspect`` says about it.  A :class:`RuntimePlugin` is a named group of kinds.

Every kind goes through :func:`install`, the built-in ones too: the loader declares the built-in kinds
(``modules.py``: the graph executor factory, const loader and host library; ExampleJSON, the Relax VM, the
JSON-runtime modules in their own files) and installs them at import; the executor, which sits above the
loader, attaches their runtimes (:func:`attach_runtime`, ``rpcsrv.executor.runtimes``).  An installed Python
package adds its own kinds, runtime included, through the entry-point group ``rpcsrv.runtimes``
(:data:`GROUP`), each entry point naming a ``RuntimePlugin`` (or a function returning one), loaded by
:func:`load_plugins` when ``rpcsrv serve``, ``inspect`` or ``extract`` start (the server's native workers get
the same choice in their start message).  A plugin that fails to import or to install is one log line and
one entry of :func:`report`; the board goes on without it.  Two plugins claiming one type key is an error
naming both.  A type key no kind in use decodes is refused naming the key, and the installed plugin that
would take it when one is turned off (:func:`refusal`).
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
from contextlib import contextmanager
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Callable, Iterator, Optional, Sequence

from .node import PAYLOADS, REGISTRY, ModuleKind, ModuleNode, PayloadCodec, RuntimeFactory, RuntimePlugin

__all__ = ["GROUP", "KINDS", "OWNERS", "ModuleKind", "RuntimePlugin", "PluginError", "add_codec", "adopt",
           "attach_runtime", "choice", "claimant", "install", "isolated", "kind_of", "load_plugins", "refusal",
           "report"]

#: the entry-point group of board plugins
GROUP = "rpcsrv.runtimes"

log = logging.getLogger("rpcsrv.plugins")

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")

#: type key -> its kind, and the name of the plugin that installed it (read-only views of the registry)
KINDS = MappingProxyType(REGISTRY.kinds)
OWNERS = MappingProxyType(REGISTRY.owners)


def file_name(name: str) -> str:
    """``name`` (a symbol, a module name: chosen by whoever built the library) as one safe file name."""
    return _UNSAFE.sub("_", name).strip(".") or "unnamed"


class PluginError(ValueError):
    """A plugin that cannot be installed (a malformed declaration, a type key taken by another)."""


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
        if kind.codec is not None and not isinstance(kind.codec, PayloadCodec):
            raise PluginError(f"plugin {plugin.name!r}, {kind.type_keys[0]!r}: codec must be a PayloadCodec")
        if kind.runtime is not None and not callable(kind.runtime):
            raise PluginError(f"plugin {plugin.name!r}, {kind.type_keys[0]!r}: runtime must be a factory "
                              f"(node, imports, options) -> RuntimeModule")
    return plugin


def install(plugin: Any, source: str = "built-in") -> None:
    """Add ``plugin``'s kinds to the registry (all or nothing).

    Installing the same plugin object again does nothing; a type key another plugin (or another codec)
    already has is a :class:`PluginError` naming both."""
    plugin = _check(plugin)
    if plugin.name in REGISTRY.installed:
        if all(REGISTRY.kinds.get(k, kind).codec is kind.codec for kind in plugin.kinds for k in kind.type_keys):
            return
        raise PluginError(f"two plugins are named {plugin.name!r} ({REGISTRY.installed[plugin.name]['source']} "
                          f"and {source})")
    seen: set[str] = set()
    for kind in plugin.kinds:
        for key in kind.type_keys:
            if key in seen:
                raise PluginError(f"plugin {plugin.name!r} declares type key {key!r} twice")
            seen.add(key)
            owner = REGISTRY.owners.get(key)
            if owner is not None:
                raise PluginError(f"plugin {plugin.name!r} ({source}) registers type key {key!r}, which plugin "
                                  f"{owner!r} ({REGISTRY.installed[owner]['source']}) already has")
            if key in REGISTRY.kinds and REGISTRY.kinds[key].codec is not kind.codec:  # (a codegen's codec)
                raise PluginError(f"plugin {plugin.name!r} ({source}) registers type key {key!r}, which "
                                  f"another payload codec already has")
    for kind in plugin.kinds:
        for key in kind.type_keys:
            REGISTRY.kinds[key] = kind
            REGISTRY.owners[key] = plugin.name
    REGISTRY.installed[plugin.name] = {"source": source, "type_keys": sorted(seen), "description": plugin.description}


def attach_runtime(kind: ModuleKind, factory: RuntimeFactory) -> None:
    """Give the installed built-in ``kind``, which the loader declares without a runtime, its runtime factory
    (the executor does, for the kinds it implements).  Attaching the same factory again does nothing."""
    for key in kind.type_keys:
        found = REGISTRY.kinds.get(key)
        if found is None or found.codec is not kind.codec:
            raise PluginError(f"type key {key!r}: the kind to attach a runtime to is not installed")
        if found.runtime is not None and found.runtime is not factory:
            raise PluginError(f"type key {key!r} already has a runtime ({REGISTRY.owners.get(key)!r})")
    done = replace(kind, runtime=factory)
    for key in kind.type_keys:
        REGISTRY.kinds[key] = done


def add_codec(key: str, codec: PayloadCodec) -> None:
    """Let this process write (and read) payloads of ``key`` without running them: what a codegen needs
    to export its modules (``rpcsrv.client.compiler``).  The board plugin with the same codec object
    can still be installed after it; another codec for a taken key is a :class:`PluginError`."""
    if not isinstance(codec, PayloadCodec):
        raise PluginError(f"type key {key!r}: codec must be a PayloadCodec")
    if key in REGISTRY.kinds and REGISTRY.kinds[key].codec is not codec:
        owner = REGISTRY.owners.get(key)
        raise PluginError(f"type key {key!r} already has another payload codec"
                          + (f" (plugin {owner!r})" if owner else ""))
    PAYLOADS[key] = codec


def kind_of(node: ModuleNode) -> Optional[ModuleKind]:
    """The installed kind of a decoded loader node (None for a module no kind decoded)."""
    return REGISTRY.kind_of(node)


def _entry_points() -> list:
    return sorted(importlib.metadata.entry_points(group=GROUP), key=lambda ep: ep.name)


def _source(ep) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else ep.value


def _plugin_of(ep) -> Any:
    obj = ep.load()
    return obj() if callable(obj) and not isinstance(obj, RuntimePlugin) else obj


def _fail(name: str, error: str) -> None:
    REGISTRY.failed[name] = error
    log.warning("plugin %s not loaded: %s", name, error)


def load_plugins(select: Sequence[str] | None = None, enabled: bool = True) -> dict:
    """Load the installed plugins of :data:`GROUP` (only those named in ``select`` if given; none
    if not ``enabled``); returns :func:`report`.  Loading again skips the plugins already installed.
    The choice is kept (:func:`choice`): a server hands it to its native workers (:func:`adopt`)."""
    wanted = None if select is None else list(dict.fromkeys(select))
    REGISTRY.choice = (None if wanted is None else tuple(wanted), enabled)
    return _load(lambda name: enabled and (wanted is None or name in wanted), (wanted or ()) if enabled else ())


def choice() -> Optional[dict]:
    """The plugin choice this process made, None when it made none: ``{"select": names or None, "enabled":
    bool, "loaded": the installed packages' plugins it loaded}``, what a server's native worker gets in its
    start message (:func:`adopt`)."""
    if REGISTRY.choice is None:
        return None
    select, enabled = REGISTRY.choice
    loaded = [name for name, info in REGISTRY.installed.items() if info["source"] != "built-in"]
    return {"select": None if select is None else list(select), "enabled": enabled, "loaded": loaded}


def adopt(chosen: dict) -> dict:
    """Load the plugins a server loaded, under its choice (``chosen``: its :func:`choice`): what its native
    worker does with its start message (a plugin that failed in the server is not tried again)."""
    select, enabled = chosen["select"], chosen["enabled"]
    REGISTRY.choice = (None if select is None else tuple(select), enabled)
    loaded = set(chosen["loaded"])
    return _load(lambda name: name in loaded, ())


def _load(take: Callable[[str], bool], wanted: Sequence[str]) -> dict:
    """Install the entry points ``take`` accepts (the others are skipped); a name of ``wanted`` that no entry
    point has fails."""
    found = set()
    for ep in _entry_points():
        found.add(ep.name)
        if not take(ep.name):
            if ep.name not in REGISTRY.skipped:
                REGISTRY.skipped.append(ep.name)
            continue
        if ep.name in REGISTRY.installed:
            continue
        try:
            plugin = _plugin_of(ep)
            if isinstance(plugin, RuntimePlugin) and plugin.name != ep.name:
                raise PluginError(f"the entry point is named {ep.name!r} but its plugin {plugin.name!r}")
            install(plugin, _source(ep))
        except Exception as exc:  # a broken plugin must not stop the board: one line, then go on
            _fail(ep.name, f"{type(exc).__name__}: {exc}".replace("\n", " "))
        else:
            REGISTRY.failed.pop(ep.name, None)
            if ep.name in REGISTRY.skipped:
                REGISTRY.skipped.remove(ep.name)
    for name in wanted:
        if name not in found:
            _fail(name, f"no such plugin installed (entry-point group {GROUP}; installed: "
                        f"{', '.join(sorted(found)) or 'none'})")
    return report()


def report() -> dict:
    """The plugins in use: ``{"loaded": [...], "failed": [...], "skipped": [...]}``; each loaded one
    with its name, source (``built-in`` or the distribution and version) and type keys."""
    return {"loaded": [{"name": n, **info} for n, info in REGISTRY.installed.items()],
            "failed": [{"name": n, "error": e} for n, e in REGISTRY.failed.items()],
            "skipped": list(REGISTRY.skipped)}


def claimant(key: str) -> Optional[tuple[str, str]]:
    """``(plugin, source)`` of an installed package's plugin, not loaded here, that registers ``key``.  Read
    from the entry points when a library needs it (the plugin's module is imported then, and not installed),
    each time: what is installed may change while a process runs."""
    for ep in _entry_points():
        if ep.name in REGISTRY.installed or ep.name in REGISTRY.failed:
            continue
        try:
            plugin = _plugin_of(ep)
            keys = [k for kind in plugin.kinds for k in kind.type_keys]
        except Exception:  # a plugin that cannot even say its keys claims none
            continue
        if key in keys:
            return ep.name, _source(ep)
    return None


def refusal(key: str) -> Optional[str]:
    """Why a module of type key ``key`` cannot be read or run here, or None when a kind in use takes it: the
    key, and the installed plugin that would take it when one is turned off."""
    kind = REGISTRY.kinds.get(key)
    if kind is not None and kind.runtime is not None:
        return None
    found = claimant(key) if kind is None or key not in REGISTRY.owners else None
    if found is None:
        return f"unknown module type key {key!r}: no installed plugin registers it"
    name, source = found
    select, enabled = REGISTRY.choice or (None, True)
    why = ("--no-plugins" if not enabled else "not among --plugin" if select is not None and name not in select
           else "not loaded by this process")
    return (f"unknown module type key {key!r}: no installed plugin in use registers it; plugin {name!r} ({source}) "
            f"would, but it is installed and turned off ({why})")


@contextmanager
def isolated() -> Iterator[None]:
    """Run a block with a copy of the registry and restore it after (tests that install plugins)."""
    saved = REGISTRY.state()
    try:
        yield
    finally:
        REGISTRY.restore(saved)
