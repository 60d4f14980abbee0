"""The ``byoc`` command's entry point: a board install (``pip install rpcsrv``, without the ``client``
extra) has no onnx nor rich, and ``byoc`` then says in one line what to install instead of a traceback.
The command itself is ``rpcsrv.client.cli``."""

from __future__ import annotations

import sys

#: the modules the ``client`` extra of pyproject.toml brings (onnx, rich)
CLIENT_EXTRA = ("onnx", "rich")


def main(argv: list[str] | None = None) -> int:
    try:
        from .cli import main as byoc
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in CLIENT_EXTRA:
            raise
        print(f"byoc: error: the client tools need {exc.name}, which this install lacks: "
              f"pip install \"rpcsrv[client]\"", file=sys.stderr)
        return 2
    return byoc(argv)


if __name__ == "__main__":
    sys.exit(main())
