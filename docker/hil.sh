#!/bin/sh
# Build the images and run the hardware-in-the-loop farm (docker/compose.yml): TVM's tracker, rpcsrv
# boards for amd64 (two), arm64 and armv7 (emulated), Prometheus scraping them, and the runner whose exit
# status is this script's.
#
#   sh scripts/docker-setup.sh && docker/hil.sh
#
# Board images: docker/board-image.sh ARCH (debootstrapped bases, cached).  Host image (tracker, runner):
# docker/Dockerfile.host on BASE_IMAGE (default rpcsrv-base:bookworm-host-amd64 from scripts/docker-setup.sh).
# PIP_CERT / pip's configured "cert" (a CA bundle for a TLS-inspecting network) is handed to the host
# build as the secret "pip_cert" when it exists; it never enters an image.
# Environment: DOCKER (docker client), COMPOSE (compose command), HIL_PROJECT (compose project name),
#              HIL_ROUNDS (runs of each case per board key, default 2), HIL_NO_BUILD=1 (use the images as
#              they are).
set -eu
cd "$(dirname "$0")/.."
DOCKER=${DOCKER:-docker}
BASE_IMAGE=${BASE_IMAGE:-rpcsrv-base:bookworm-host-amd64}
PROJECT=${HIL_PROJECT:-rpcsrv-hil}
if [ -z "${COMPOSE:-}" ]; then
    if "$DOCKER" compose version >/dev/null 2>&1; then COMPOSE="$DOCKER compose";
    elif command -v docker-compose >/dev/null 2>&1; then COMPOSE=docker-compose;
    else echo "hil: neither 'docker compose' nor docker-compose is installed" >&2; exit 2; fi
fi

if [ -z "${HIL_NO_BUILD:-}" ]; then
    cert=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
    secret=""
    if [ -n "$cert" ] && [ -s "$cert" ]; then secret="--secret id=pip_cert,src=$cert"; fi
    for arch in amd64 arm64 armv7; do
        start=$(date +%s)
        DOCKER="$DOCKER" sh docker/board-image.sh "$arch"
        echo "hil: rpcsrv-board:$arch ready in $(($(date +%s) - start)) s" >&2
    done
    DOCKER="$DOCKER" sh docker/base-image.sh prometheus amd64
    DOCKER_BUILDKIT=0 "$DOCKER" build -q -f docker/Dockerfile.prometheus -t rpcsrv-prometheus:bookworm docker >/dev/null
    start=$(date +%s)
    # shellcheck disable=SC2086  # $secret is empty or two words on purpose
    DOCKER_BUILDKIT=1 "$DOCKER" build -q -f docker/Dockerfile.host --build-arg BASE_IMAGE="$BASE_IMAGE" \
        $secret -t rpcsrv-host:bookworm . >/dev/null
    echo "hil: rpcsrv-host:bookworm ready in $(($(date +%s) - start)) s" >&2
fi

export BASE_IMAGE
status=0
$COMPOSE -f docker/compose.yml -p "$PROJECT" up --no-build --exit-code-from runner || status=$?
$COMPOSE -f docker/compose.yml -p "$PROJECT" down -t 10 >/dev/null 2>&1 || true
exit $status
