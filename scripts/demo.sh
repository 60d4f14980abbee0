#!/usr/bin/env bash
# The main job: install rpcsrv with the client tools and the demo's dependencies (onnxruntime, the numeric reference),
# start the board server (`rpcsrv serve`) on a free local port, run the end-to-end demo against it
# (`byoc demo`: compile ONNX models to BYOC libraries, upload, run over TVM RPC, check against
# onnxruntime), then stop the server.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python-env.sh
"$PY" -m pip install -q -e '.[client,demo]'  # the board (rpcsrv) and the client tools (byoc)
log=$(mktemp)
"$PY" -m rpcsrv serve --host 127.0.0.1 --port 9090 --port-end 9190 >"$log" 2>&1 &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 100); do
  grep -q "serving on" "$log" && break
  sleep 0.1
done
port=$(sed -n 's/.*serving on [0-9.]*:\([0-9]*\).*/\1/p' "$log")
[ -n "$port" ] || { cat "$log"; exit 1; }
echo "rpcsrv is serving on 127.0.0.1:$port"
"$PY" -m rpcsrv.client.cli demo --host 127.0.0.1 --port "$port"
