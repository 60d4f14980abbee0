#!/bin/sh
# A Debian bookworm base image made locally with debootstrap (no image registry needed), cached twice:
# the root filesystem as a tarball under $RPCSRV_DOCKER_CACHE (default /var/cache/rpcsrv-docker), and
# the imported image by tag.  A second build finds the image (0.1 s) or re-imports the tarball (seconds);
# only a cold machine pays for the debootstrap.  The cache key is the package list: change it and the
# next run makes a new base.
#
#   sh docker/base-image.sh FLAVOR ARCH [TAG]
#
# FLAVOR  board: python3, its venv module, Debian's numpy with OpenBLAS, tini (docker/Dockerfile.board);
#         host:  python3, its venv module, ca-certificates, gcc and the aarch64 / armhf cross gcc's
#                (docker/Dockerfile.host: the HIL runner cross-compiles for the ARM boards).
#         prometheus: Debian's prometheus server (docker/Dockerfile.prometheus).
# ARCH    amd64, arm64 or armv7 (Debian's armhf).  ARM bases are made under qemu-user emulation:
#         scripts/docker-setup.sh registers the binfmt handlers.
# TAG     default rpcsrv-base:bookworm-FLAVOR-ARCH.
# Environment: DOCKER (docker client), DEBIAN_MIRROR, RPCSRV_DOCKER_CACHE.
set -eu
FLAVOR=${1:?usage: base-image.sh board|host|prometheus amd64|arm64|armv7 [TAG]}
ARCH=${2:?usage: base-image.sh board|host|prometheus amd64|arm64|armv7 [TAG]}
TAG=${3:-rpcsrv-base:bookworm-$FLAVOR-$ARCH}
# Debian's client by default: it matches its engine (a newer client elsewhere on PATH may want buildx)
DOCKER=${DOCKER:-$(if [ -x /usr/bin/docker ]; then echo /usr/bin/docker; else echo docker; fi)}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${RPCSRV_DOCKER_CACHE:-/var/cache/rpcsrv-docker}
say() { echo "base-image: $*" >&2; }

case $ARCH in
    amd64) DEB_ARCH=amd64; PLATFORM=linux/amd64 ;;
    arm64) DEB_ARCH=arm64; PLATFORM=linux/arm64 ;;
    armv7) DEB_ARCH=armhf; PLATFORM=linux/arm/v7 ;;
    *) say "unknown ARCH $ARCH (amd64, arm64, armv7)"; exit 2 ;;
esac
case $FLAVOR in
    # libopenblas0-pthread: numpy's BLAS (Debian's alternatives pick it over the reference BLAS)
    board) PACKAGES=python3,python3-venv,python3-numpy,libopenblas0-pthread,tini ;;
    # the cross compilers' libc6-dev are only recommended, which debootstrap does not follow
    host) PACKAGES=python3,python3-venv,ca-certificates,gcc,libc6-dev,gcc-aarch64-linux-gnu,libc6-dev-arm64-cross,gcc-arm-linux-gnueabihf,libc6-dev-armhf-cross ;;
    # Debian's Prometheus server (docker/Dockerfile.prometheus: the HIL farm's scraper)
    prometheus) PACKAGES=prometheus ;;
    *) say "unknown FLAVOR $FLAVOR (board, host, prometheus)"; exit 2 ;;
esac
KEY=$(printf '%s %s %s' bookworm "$DEB_ARCH" "$PACKAGES" | sha256sum | cut -c1-12)

# one maker per base at a time (the CI prebuilds in the background while the tests may ask too)
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock-$FLAVOR-$ARCH"
flock 9
if [ "$("$DOCKER" image inspect -f '{{index .Config.Labels "rpcsrv.base"}}' "$TAG" 2>/dev/null)" = "$KEY" ]; then
    say "$TAG cached"
    exit 0
fi
TARBALL=$CACHE/bookworm-$FLAVOR-$ARCH-$KEY.tar
if [ ! -s "$TARBALL" ]; then
    say "debootstrap bookworm $DEB_ARCH ($PACKAGES) from $MIRROR"
    dir=$(mktemp -d /tmp/rpcsrv-rootfs.XXXXXX)
    trap 'rm -rf "$dir" "$TARBALL.part"' EXIT
    debootstrap --variant=minbase --arch="$DEB_ARCH" --include="$PACKAGES" bookworm "$dir" "$MIRROR" >&2
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
    tar -C "$dir" -cf "$TARBALL.part" .
    mv "$TARBALL.part" "$TARBALL"
    rm -rf "$dir"
    trap - EXIT
    # older bases of this flavour and machine are stale now
    for old in "$CACHE"/bookworm-"$FLAVOR"-"$ARCH"-*.tar; do [ "$old" = "$TARBALL" ] || rm -f "$old"; done
fi
say "importing $TARBALL as $TAG ($PLATFORM)"
"$DOCKER" import --platform "$PLATFORM" -c 'CMD ["/bin/bash"]' -c "LABEL rpcsrv.base=$KEY" "$TARBALL" "$TAG" >&2
