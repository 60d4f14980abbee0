"""A session's workspace: the one directory its file functions may touch.

Every path a client names is resolved inside the workspace; absolute paths, ``..`` that climbs out,
and symlinks that point out are refused with a clear error.  A byte budget bounds what a session
may store, and every file written is also charged to the session's memory account (when one is set:
a workspace on tmpfs is memory) before its first byte is written, and released when it is removed,
replaced, abandoned half-written, or the workspace is cleaned up.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


class WorkspaceError(PermissionError):
    """A path outside the workspace, or a write beyond its budget."""


class Workspace:
    def __init__(self, root: Path, max_bytes: int = 1 << 30, account=None):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.account = account  # a rpcsrv.board.accounts.MemoryAccount, or None
        self._charged: dict[Path, int] = {}  # bytes charged per file written through this workspace
        self._resolved: dict[str, Path] = {}  # nothing here creates symlinks, so results stay valid

    @classmethod
    def create(cls, parent: Path | None, prefix: str = "session-", max_bytes: int = 1 << 30) -> "Workspace":
        """A fresh directory for one session under ``parent`` (the system temp dir by default)."""
        if parent is not None:
            Path(parent).mkdir(parents=True, exist_ok=True)
        return cls(Path(tempfile.mkdtemp(prefix=prefix, dir=parent)), max_bytes)

    def path(self, name: str) -> Path:
        """The absolute path of ``name`` inside the workspace, or WorkspaceError."""
        cached = self._resolved.get(name)
        if cached is not None:
            return cached
        if not isinstance(name, str) or "\0" in name:
            raise WorkspaceError(f"invalid path {name!r}")
        if os.path.isabs(name):
            raise WorkspaceError(f"path {name!r} is absolute; paths are relative to the session workspace")
        target = (self.root / name).resolve()
        if target != self.root and self.root not in target.parents:
            raise WorkspaceError(f"path {name!r} leaves the session workspace")
        if len(self._resolved) < 4096:
            self._resolved[name] = target
        return target

    def used_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file() and not p.is_symlink())

    def write(self, name: str, data) -> Path:
        """Store ``data`` as file ``name`` (replacing it), within the byte budget."""
        sink = self.open_write(name, len(data))
        try:
            sink.write(data)
        except BaseException:
            sink.abort()
            raise
        return sink.commit()

    def open_write(self, name: str, nbytes: int) -> "FileSink":
        """Start writing ``nbytes`` to file ``name``: the path and the budget are checked now, the
        bytes arrive in pieces (:meth:`FileSink.write`), and the file appears on :meth:`FileSink.commit`."""
        target = self.path(name)
        if target == self.root or target.is_dir():
            raise WorkspaceError(f"{name!r} is a directory")
        old = target.stat().st_size if target.is_file() else 0
        if self.used_bytes() - old + nbytes > self.max_bytes:
            raise WorkspaceError(f"writing {nbytes} bytes to {name!r} exceeds the workspace budget "
                                 f"of {self.max_bytes} bytes")
        if self.account is not None:
            self.account.charge(nbytes, f"workspace file {name!r}")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            return FileSink(target, nbytes, self)
        except BaseException:
            self._release(nbytes)
            raise

    def _release(self, nbytes: int) -> None:
        if self.account is not None and nbytes:
            self.account.release(nbytes)

    def _committed(self, target: Path, nbytes: int) -> None:
        self._release(self._charged.pop(target, 0))  # the file it replaced
        self._charged[target] = nbytes

    def _forget(self, target: Path) -> None:
        """Release the charges of ``target`` and of every file under it (it is being removed)."""
        for path in [p for p in self._charged if p == target or target in p.parents]:
            self._release(self._charged.pop(path))

    def read(self, name: str) -> bytes:
        target = self.path(name)
        if not target.is_file():
            raise FileNotFoundError(f"no file {name!r} in the session workspace")
        return target.read_bytes()

    def remove(self, name: str) -> None:
        target = self.path(name)
        if target == self.root:
            raise WorkspaceError("cannot remove the workspace itself")
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        else:
            raise FileNotFoundError(f"no file {name!r} in the session workspace")
        self._forget(target)

    def listdir(self, name: str = ".") -> list[str]:
        target = self.path(name or ".")
        if not target.is_dir():
            raise FileNotFoundError(f"no directory {name!r} in the session workspace")
        return sorted(os.listdir(target))

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self._forget(self.root)


class FileSink:
    """A file being written in pieces: a ``.part`` file beside the target, renamed over it once
    complete, so a half-received upload never replaces a good file."""

    def __init__(self, target: Path, nbytes: int, workspace: Workspace | None = None):
        self.target = target
        self.nbytes = nbytes
        self.received = 0
        self._workspace = workspace  # told when the file is in place or abandoned (its charge)
        self._tmp = target.with_name(target.name + ".part")
        self._file = open(self._tmp, "wb")

    def write(self, data) -> None:
        if self.received + len(data) > self.nbytes:
            raise WorkspaceError(f"{self.target.name}: more than the announced {self.nbytes} bytes")
        self._file.write(data)
        self.received += len(data)

    def commit(self) -> Path:
        """Close and move into place (only once every announced byte arrived)."""
        self._file.close()
        if self.received != self.nbytes:
            self.abort()
            raise WorkspaceError(f"{self.target.name}: {self.received} of {self.nbytes} bytes arrived")
        os.replace(self._tmp, self.target)
        if self._workspace is not None:
            self._workspace._committed(self.target, self.nbytes)
            self._workspace = None
        return self.target

    def abort(self) -> None:
        """Drop the partial file (and its charge)."""
        self._file.close()
        try:
            os.unlink(self._tmp)
        except FileNotFoundError:
            pass
        if self._workspace is not None:
            self._workspace._release(self.nbytes)
            self._workspace = None
