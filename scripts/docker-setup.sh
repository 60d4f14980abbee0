#!/bin/sh
# Make a Docker engine usable on a Debian machine where none runs yet (CI, a fresh farm host):
#   1. install Debian's docker.io, debootstrap and docker-compose if missing (needs root and apt);
#   2. start dockerd if no engine answers (overlay2 first, then vfs storage; iptables off as a last try);
#   3. build the local base image (debootstrap minbase bookworm + python3) once and keep it: later runs
#      on the same machine find it by tag and skip the ~1-2 minute debootstrap.
# Idempotent: every step checks first.  Prints the docker client to use on its last line
# ("DOCKER=/usr/bin/docker") for scripts that source its output.
#
# Environment:  RPCSRV_BASE_IMAGE (default rpcsrv-base:bookworm)   DEBIAN_MIRROR (default deb.debian.org)
#               DOCKERD_LOG (default /tmp/rpcsrv-dockerd.log)
set -eu

BASE_IMAGE=${RPCSRV_BASE_IMAGE:-rpcsrv-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DOCKERD_LOG=${DOCKERD_LOG:-/tmp/rpcsrv-dockerd.log}
say() { echo "docker-setup: $*" >&2; }

# Debian's engine (20.10) and client belong together; a newer static client elsewhere on PATH may
# insist on a buildx plugin that is not installed, so prefer Debian's.
docker_cli() { if [ -x /usr/bin/docker ]; then echo /usr/bin/docker; else command -v docker; fi; }

if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1 \
        || ! command -v docker-compose >/dev/null 2>&1; then
    say "installing docker.io, docker-compose, debootstrap"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q docker.io docker-compose debootstrap >&2
fi
DOCKER=$(docker_cli)

engine_up() { "$DOCKER" info >/dev/null 2>&1; }
start_dockerd() {  # $@: extra dockerd flags; waits up to 30 s for the engine to answer
    say "starting dockerd $*"
    setsid dockerd "$@" >"$DOCKERD_LOG" 2>&1 < /dev/null &
    i=0
    while [ $i -lt 30 ]; do
        engine_up && return 0
        kill -0 $! 2>/dev/null || return 1
        sleep 1; i=$((i + 1))
    done
    kill $! 2>/dev/null || true
    return 1
}
if ! engine_up; then
    start_dockerd || start_dockerd --storage-driver=vfs || start_dockerd --storage-driver=vfs --iptables=false || {
        say "no Docker engine could start here; see $DOCKERD_LOG"; exit 1; }
fi

if "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    say "base image $BASE_IMAGE cached"
else
    say "building base image $BASE_IMAGE with debootstrap from $MIRROR"
    dir=$(mktemp -d /tmp/rpcsrv-rootfs.XXXXXX)
    trap 'rm -rf "$dir"' EXIT
    # python3-venv brings ensurepip (pip inside a venv); ca-certificates for pip over https
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$dir" "$MIRROR" >&2
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
    tar -C "$dir" -c . | "$DOCKER" import -c 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >&2
    rm -rf "$dir"
    trap - EXIT
fi
echo "DOCKER=$DOCKER"
