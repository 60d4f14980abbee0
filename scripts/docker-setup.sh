#!/bin/sh
# Make a Docker engine usable on a Debian machine where none runs yet (CI, a fresh farm host):
#   1. install Debian's docker.io, debootstrap, docker-compose, qemu-user-static, binfmt-support and gcc
#      with the aarch64 and armhf cross gcc's (the wheel's prebuilt shims) if missing (needs root and apt);
#   2. register qemu-user's binfmt handlers for arm64 and armv7 with the F (fix-binary) flag, so that
#      ARM containers run under emulation without qemu inside them (docker/board-image.sh arm64|armv7);
#   3. start dockerd if no engine answers (overlay2 first, then vfs storage; iptables off as a last try);
#   4. build the local base image of the host side (debootstrap minbase bookworm + python3 and the
#      gcc cross compilers the HIL runner needs) once and keep it (docker/base-image.sh: a tarball in
#      /var/cache/rpcsrv-docker, then the image by tag), so later runs skip the debootstrap.
# Idempotent: every step checks first.  Prints the docker client to use on its last line
# ("DOCKER=/usr/bin/docker") for scripts that source its output.
#
# Environment:  RPCSRV_BASE_IMAGE (host base, default rpcsrv-base:bookworm-host-amd64)   DEBIAN_MIRROR (default deb.debian.org)
#               DOCKERD_LOG (default /tmp/rpcsrv-dockerd.log)
# The pid of a dockerd it starts is written to /run/rpcsrv-dockerd.pid: the engine serves the machine, not one
# test run (tests/conftest.py does not count it as a process the tests left behind).
set -eu

BASE_IMAGE=${RPCSRV_BASE_IMAGE:-rpcsrv-base:bookworm-host-amd64}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DOCKERD_LOG=${DOCKERD_LOG:-/tmp/rpcsrv-dockerd.log}
say() { echo "docker-setup: $*" >&2; }

# Debian's engine (20.10) and client belong together; a newer static client elsewhere on PATH may
# insist on a buildx plugin that is not installed, so prefer Debian's.
docker_cli() { if [ -x /usr/bin/docker ]; then echo /usr/bin/docker; else command -v docker; fi; }

if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1 \
        || ! command -v docker-compose >/dev/null 2>&1 || ! command -v qemu-aarch64-static >/dev/null 2>&1 \
        || ! command -v update-binfmts >/dev/null 2>&1 || ! command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 \
        || ! command -v arm-linux-gnueabihf-gcc >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1; then
    # the gcc's build the native shims the wheel carries for every board machine (docker/board-image.sh)
    say "installing docker.io, docker-compose, debootstrap, qemu-user-static, binfmt-support and the gcc's"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q docker.io docker-compose debootstrap qemu-user-static binfmt-support \
        gcc gcc-aarch64-linux-gnu gcc-arm-linux-gnueabihf >&2
fi
DOCKER=$(docker_cli)

# qemu-user for the ARM boards.  Debian's qemu-user-static describes its handlers with fix_binary
# (flag F: the kernel opens the static qemu when the handler is registered, so it runs inside any
# container's root without being copied there); without systemd nobody mounts binfmt_misc or loads
# them, so do both here, and check the flags rather than trust it.
BINFMT=/proc/sys/fs/binfmt_misc
[ -e $BINFMT/register ] || mount -t binfmt_misc binfmt_misc $BINFMT
for h in qemu-aarch64 qemu-arm; do
    [ -e $BINFMT/$h ] || update-binfmts --enable $h >&2 || true
    grep -q '^flags:.*F' $BINFMT/$h 2>/dev/null || { say "binfmt handler $h missing or without flag F"; exit 1; }
done

engine_up() { "$DOCKER" info >/dev/null 2>&1; }
start_dockerd() {  # $@: extra dockerd flags; waits up to 30 s for the engine to answer
    say "starting dockerd $*"
    setsid dockerd "$@" >"$DOCKERD_LOG" 2>&1 < /dev/null &
    echo $! > /run/rpcsrv-dockerd.pid
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

DOCKER="$DOCKER" DEBIAN_MIRROR="$MIRROR" sh "$(dirname "$0")/../docker/base-image.sh" host amd64 "$BASE_IMAGE" >&2
echo "DOCKER=$DOCKER"
