"""Shared pieces of the atheris targets: the repo on sys.path and a seed corpus per target."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "executor"))


def corpus_dir(name: str, seeds) -> str:
    """``fuzz/corpus/<name>``, filled with ``seeds`` (an iterable of bytes) when empty."""
    out = REPO / "fuzz" / "corpus" / name
    out.mkdir(parents=True, exist_ok=True)
    if not any(out.iterdir()):
        for data in seeds:
            (out / hashlib.sha1(data).hexdigest()).write_bytes(data)
    return str(out)


def run(name: str, test_one, seeds) -> None:
    """Start libFuzzer on ``test_one`` with the target's corpus (extra argv: libFuzzer flags)."""
    import atheris

    args = [a for a in sys.argv if a.startswith("-")]
    corpus = corpus_dir(name, seeds)
    atheris.instrument_all()  # coverage feedback for every module loaded so far (rpcsrv included)
    atheris.Setup([sys.argv[0], *args, corpus], test_one)
    atheris.Fuzz()
