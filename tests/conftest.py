"""Shared test fixtures and the optional-dependency policy.

Tests that need something heavy or external (the real TVM client, a cross compiler) call
``need_module`` / ``need_program``: on a user's machine a missing dependency skips the test with a
reason; with ``RPCSRV_REQUIRE_ALL=1`` (set by ``.ci/run``) it fails instead, so CI cannot go green
by skipping.
"""

from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
REQUIRE_ALL = os.environ.get("RPCSRV_REQUIRE_ALL") == "1"


def _missing(reason: str):
    if REQUIRE_ALL:
        pytest.fail(f"required by RPCSRV_REQUIRE_ALL=1 but missing: {reason}", pytrace=False)
    pytest.skip(reason)


def need_module(name: str, why: str = ""):
    """Import and return module ``name``, or skip (fail under RPCSRV_REQUIRE_ALL=1)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        _missing(f"python module {name!r} not importable ({exc}); {why}".rstrip("; "))


def need_program(name: str, why: str = "") -> str:
    """Path of program ``name`` on PATH, or skip (fail under RPCSRV_REQUIRE_ALL=1)."""
    path = shutil.which(name)
    if path is None:
        _missing(f"program {name!r} not on PATH; {why}".rstrip("; "))
    return path


def need_shared(*parts: str) -> Path:
    """A path under ../shared (recorded sessions, seeds), or skip/fail when it is absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        _missing(f"{path} not found (the shared/ folder sits beside the repo)")
    return path
