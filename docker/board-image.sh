#!/bin/sh
# Build the board image rpcsrv-board:ARCH (ARCH = amd64, arm64 or armv7) without an image registry:
#   1. the base: Debian bookworm debootstrapped locally with python3 and Debian's numpy
#      (docker/base-image.sh; cached as a tarball and by tag, so only a cold machine pays for it);
#   2. on this machine, rpcsrv's wheel (`pip wheel --no-deps .`, so the image gets what pyproject.toml
#      declares and nothing hand-copied) and the wheels of the board's dependencies that pyproject.toml
#      lists, resolved by pip; numpy is Debian's (no numpy build under emulation), and only pure-Python
#      wheels go in, so the same set serves every machine;
#   3. `docker build` of docker/Dockerfile.board on that base and those wheels: the ARM images run
#      their install under qemu-user emulation (scripts/docker-setup.sh registers the handlers).
#
#   sh docker/board-image.sh arm64 && docker run --rm -p 127.0.0.1:9090:9090 rpcsrv-board:arm64
#
# Environment: DOCKER (docker client), PYTHON (the Python whose pip builds the wheels, default python3),
#              RPCSRV_DOCKER_CACHE (default /var/cache/rpcsrv-docker), TAG (default rpcsrv-board:ARCH),
#              RPCSRV_BOARD_EXTRAS (rpcsrv's extras the board gets too, default "metrics": the
#              Prometheus endpoint of `rpcsrv serve --metrics-port`).
set -eu
ARCH=${1:?usage: board-image.sh amd64|arm64|armv7}
cd "$(dirname "$0")/.."
# Debian's client by default: it matches its engine (a newer client elsewhere on PATH may want buildx)
DOCKER=${DOCKER:-$(if [ -x /usr/bin/docker ]; then echo /usr/bin/docker; else echo docker; fi)}
PYTHON=${PYTHON:-python3}
CACHE=${RPCSRV_DOCKER_CACHE:-/var/cache/rpcsrv-docker}
TAG=${TAG:-rpcsrv-board:$ARCH}
EXTRAS=${RPCSRV_BOARD_EXTRAS-metrics}
say() { echo "board-image: $*" >&2; }
case $ARCH in
    amd64) TRIPLE=x86_64-linux-gnu CC_ARCH=cc CC_PKG=gcc ;;
    arm64) TRIPLE=aarch64-linux-gnu CC_ARCH=aarch64-linux-gnu-gcc CC_PKG=gcc-aarch64-linux-gnu ;;
    armv7) TRIPLE=arm-linux-gnueabihf CC_ARCH=arm-linux-gnueabihf-gcc CC_PKG=gcc-arm-linux-gnueabihf ;;
    *) say "unknown ARCH $ARCH (amd64, arm64, armv7)"; exit 2 ;;
esac
BASE=rpcsrv-base:bookworm-board-$ARCH
DOCKER="$DOCKER" sh docker/base-image.sh board "$ARCH" "$BASE"

if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then  # a system Python without pip (Debian's)
    [ -x "$CACHE/pyenv/bin/pip" ] || "$PYTHON" -m venv "$CACHE/pyenv" >&2
    PYTHON=$CACHE/pyenv/bin/python
fi
exec 8>"$CACHE/.lock-board-image-$ARCH"  # one build per image at a time
flock 8
# warm: an image built from these very sources (and this script, the Dockerfile, the base) is kept
SOURCES="pyproject.toml setup.py README.md rpcsrv client docker/board-image.sh docker/Dockerfile.board docker/healthcheck.py"
# shellcheck disable=SC2086
KEY=$( (tar -c --sort=name --mtime=@0 --owner=0 --group=0 --exclude=__pycache__ --exclude='*.pyc' $SOURCES;
        "$DOCKER" image inspect -f '{{.Id}}' "$BASE"; echo "$EXTRAS") | sha256sum | cut -c1-16)
if [ "$("$DOCKER" image inspect -f '{{index .Config.Labels "rpcsrv.source"}}' "$TAG" 2>/dev/null)" = "$KEY" ]; then
    say "$TAG cached (sources unchanged)"
    exit 0
fi
ctx=$(mktemp -d /tmp/rpcsrv-board-ctx.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/wheels" "$ctx/src"
# built from a copy of the distribution's sources, so the checkout gets no build/ or egg-info
for f in pyproject.toml setup.py setup.cfg MANIFEST.in README.md LICENSE rpcsrv client; do
    if [ -e "$f" ]; then cp -r "$f" "$ctx/src/"; fi
done
# fixed timestamps: the same sources make the same wheel, so a warm build reuses the image's layers
SOURCE_DATE_EPOCH=315532800 "$PYTHON" -m pip wheel -q --no-deps -w "$ctx/wheels" "$ctx/src" >&2
rm -rf "$ctx/src"
wheel=$(ls "$ctx"/wheels/rpcsrv-*.whl)
# the wheel's prebuilt native shim for this machine (setup.py builds one per cross gcc found on PATH)
if ! "$PYTHON" -c 'import sys, zipfile; sys.exit(not any(n.startswith("rpcsrv/native/prebuilt/" + sys.argv[2] + "/") and
        n.endswith(".so") for n in zipfile.ZipFile(sys.argv[1]).namelist()))' "$wheel" "$TRIPLE"; then
    say "the wheel has no prebuilt shim for $ARCH: put $CC_ARCH on PATH (Debian: apt-get install $CC_PKG)"
    exit 1
fi
# the board's requirements as pyproject.toml declares them (the wheel's Requires-Dist: the unconditional
# ones and those of the extras in $EXTRAS), numpy left to Debian; pip resolves what they need in turn
reqs=$("$PYTHON" - "$wheel" "$EXTRAS" <<'EOF'
import re, sys, zipfile
from email.parser import Parser
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = Parser().parsestr(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode())
for req in meta.get_all("Requires-Dist") or []:
    spec, _, marker = req.partition(";")
    extra = re.search(r"""extra\s*==\s*['"]([^'"]+)""", marker)
    if (extra is None or extra.group(1) in sys.argv[2].split()) and re.match(r"[\w.-]+", spec).group(0).lower() != "numpy":
        print(spec.replace(" ", ""))
EOF
)
# shellcheck disable=SC2086  # one word per requirement
"$PYTHON" -m pip download -q --only-binary=:all: --python-version 3.11 -d "$ctx/dl" $reqs >&2
# pure-Python wheels only: whatever binary wheel a requirement pulls (numpy) comes from Debian, or the
# board lacks it and `pip check` in the build names it
mv "$ctx"/dl/*-none-any.whl "$ctx/wheels/"
rm -rf "$ctx/dl"
rm -f "$ctx"/wheels/numpy-*
cp docker/healthcheck.py "$ctx/"


say "building $TAG on $BASE"
DOCKER_BUILDKIT=0 "$DOCKER" build -q --build-arg BASE_IMAGE="$BASE" --label rpcsrv.source="$KEY" \
    -f docker/Dockerfile.board -t "$TAG" "$ctx" >&2
say "built $TAG"
