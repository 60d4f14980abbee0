#!/bin/sh
# Build the board and host images and run the hardware-in-the-loop farm (docker/compose.yml):
# TVM's tracker, two rpcsrv boards, and the runner whose exit status is this script's.
#
#   docker/hil.sh                                  # base: python:3.11-slim-bookworm from a registry
#   BASE_IMAGE=rpcsrv-base:bookworm docker/hil.sh  # base: built locally by scripts/docker-setup.sh
#
# PIP_CERT / pip's configured "cert" (a CA bundle for a TLS-inspecting network) is handed to the
# builds as the secret "pip_cert" when it exists; it never enters an image.
# Environment: DOCKER (docker client), COMPOSE (compose command), HIL_PROJECT (compose project name),
#              HIL_REQUESTS (requests the runner makes, default 20).
set -eu
cd "$(dirname "$0")/.."
DOCKER=${DOCKER:-docker}
BASE_IMAGE=${BASE_IMAGE:-python:3.11-slim-bookworm}
PROJECT=${HIL_PROJECT:-rpcsrv-hil}
if [ -z "${COMPOSE:-}" ]; then
    if "$DOCKER" compose version >/dev/null 2>&1; then COMPOSE="$DOCKER compose";
    elif command -v docker-compose >/dev/null 2>&1; then COMPOSE=docker-compose;
    else echo "hil: neither 'docker compose' nor docker-compose is installed" >&2; exit 2; fi
fi

cert=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
secret=""
if [ -n "$cert" ] && [ -s "$cert" ]; then secret="--secret id=pip_cert,src=$cert"; fi

for image in board host; do
    # shellcheck disable=SC2086  # $secret is empty or two words on purpose
    DOCKER_BUILDKIT=1 "$DOCKER" build -q -f docker/Dockerfile.$image --build-arg BASE_IMAGE="$BASE_IMAGE" \
        $secret -t rpcsrv-$image . >/dev/null
done

export BASE_IMAGE
status=0
$COMPOSE -f docker/compose.yml -p "$PROJECT" up --no-build --exit-code-from runner || status=$?
$COMPOSE -f docker/compose.yml -p "$PROJECT" down -t 5 >/dev/null 2>&1 || true
exit $status
