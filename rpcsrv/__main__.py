"""``python -m rpcsrv`` = the ``rpcsrv`` command."""

import sys

from .cli import main

sys.exit(main())
