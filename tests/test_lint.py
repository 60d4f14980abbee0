"""The tree passes ruff (pyflakes and pycodestyle rules, 120 columns; see pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO, need_module


def test_ruff_is_clean():
    need_module("ruff", "the linter comes with the test extras")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", str(REPO)],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr


#: the longest a source file may grow (issue 26): past it, a file holds more than one job
MAX_LINES = 450


def test_no_source_file_over_the_limit():
    sources = [p for folder in ("rpcsrv", "client", "bench", "tests", "scripts", "docker")
               for pattern in ("*.py", "*.c", "*.h", "*.sh") for p in (REPO / folder).rglob(pattern)]
    assert len(sources) > 100  # the walk found the tree
    long = {str(p.relative_to(REPO)): n for p in sources
            if (n := p.read_bytes().count(b"\n")) > MAX_LINES}
    assert not long, f"source files over {MAX_LINES} lines: {long}"
