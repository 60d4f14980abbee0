#!/usr/bin/env bash
# Install rpcsrv with its test extras, the real TVM client (apache-tvm and what its own RPC server,
# tracker and proxy import) and matplotlib (byoc profile --plot), then run the whole test suite.
# Tests that need a cross compiler or clang skip with a reason where those are missing
# (.ci/run installs them and sets RPCSRV_REQUIRE_ALL=1 so that nothing is skipped there).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/cli -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python-env.sh
"$PY" -m pip install -q -e '.[client,test,tvm,plot]'
exec "$PY" -m pytest -q -p no:cacheprovider "$@"
