# Sourced by scripts/demo.sh and scripts/test.sh: the Python to install into and run with.
#
# Inside an active virtualenv (or with RPCSRV_PYTHON set) that one is used; otherwise a virtualenv
# `.venv` in the repository is created once and reused, so that a fresh machine (where pip may refuse
# to touch the system Python, PEP 668) needs nothing but Python >= 3.10 with its venv module.
if [ -n "${RPCSRV_PYTHON:-}" ]; then
  PY=$RPCSRV_PYTHON
elif python3 -c 'import sys; sys.exit(0 if sys.prefix != sys.base_prefix else 1)'; then
  PY=python3
else
  if [ ! -x .venv/bin/python ]; then
    echo "creating the virtualenv .venv (python3 -m venv)" >&2
    python3 -m venv .venv
  fi
  PY=$PWD/.venv/bin/python
fi
"$PY" -c 'import sys; assert sys.version_info >= (3, 10), "rpcsrv needs Python >= 3.10"'
export PATH="$(dirname "$PY"):$PATH"  # rpcsrv and byoc, and python3 in subprocesses, from here
