"""A session's workspace: the one directory its file functions may touch.

Every path a client names is resolved inside the workspace; absolute paths, ``..`` that climbs out,
and symlinks that point out are refused with a clear error.  A byte budget bounds what a session
may store.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


class WorkspaceError(PermissionError):
    """A path outside the workspace, or a write beyond its budget."""


class Workspace:
    def __init__(self, root: Path, max_bytes: int = 1 << 30):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
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
        target = self.path(name)
        old = target.stat().st_size if target.is_file() else 0
        if self.used_bytes() - old + len(data) > self.max_bytes:
            raise WorkspaceError(f"writing {len(data)} bytes to {name!r} exceeds the workspace budget "
                                 f"of {self.max_bytes} bytes")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".part")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
        return target

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

    def listdir(self, name: str = ".") -> list[str]:
        target = self.path(name or ".")
        if not target.is_dir():
            raise FileNotFoundError(f"no directory {name!r} in the session workspace")
        return sorted(os.listdir(target))

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
