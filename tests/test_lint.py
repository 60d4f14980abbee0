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
