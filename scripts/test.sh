#!/usr/bin/env bash
# Install rpcsrv with its test extras, the real TVM client and matplotlib (byoc profile --plot), then run the whole test suite.
# Tests that need a cross compiler or clang skip with a reason where those are missing
# (.ci/run installs them and sets RPCSRV_REQUIRE_ALL=1 so that nothing is skipped there).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e '.[test,tvm,plot]'
exec python3 -m pytest -q "$@"
