"""The HIL farm in Docker: TVM's tracker, boards of three machines, the runner (docker/compose.yml).

``scripts/docker-setup.sh`` makes an engine usable (installs Debian's docker.io and qemu-user-static,
registers the binfmt handlers, starts dockerd, builds the debootstrapped host base once per machine);
``docker/hil.sh`` builds the board images for amd64, arm64 and armv7 (``docker/board-image.sh``) and the
host image, and runs ``compose up --exit-code-from runner``: each machine's boards get the demo models,
TVM kernels, a partially offloaded BYOC ``.so`` and a Relax VM executable compiled for that machine.
A board image is also run on its own, as a user would (``docker run -p ...``), and answers TVM's real
client.  Skipped with the reason where no engine can start (fails instead under RPCSRV_REQUIRE_ALL=1,
as in CI).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from conftest import REPO, _missing, need_module, need_program

pytestmark = pytest.mark.slow
ROUNDS = 1  # each case once per key (HIL_ROUNDS; docker/hil.sh defaults to 2)
CASES = ("byoc_seed", "small_cnn", "kernel", "par_ws", "byoc_partial", "relax_mlp")


def engine() -> str:
    """The docker client of a running engine (started by scripts/docker-setup.sh if need be)."""
    need_program("sh")
    if os.geteuid() != 0 and subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        _missing("no Docker engine answers and only root can start one (scripts/docker-setup.sh)")
    setup = subprocess.run(["sh", str(REPO / "scripts" / "docker-setup.sh")], capture_output=True, text=True,
                           timeout=900)
    if setup.returncode != 0:
        _missing(f"no Docker engine could start here: {setup.stderr.strip()[-600:]}")
    return setup.stdout.strip().splitlines()[-1].split("=", 1)[1]


def test_compose_farm_runner_passes():
    docker = engine()
    env = dict(os.environ, DOCKER=docker, HIL_PROJECT=f"rpcsrv-hil-{os.getpid()}", HIL_ROUNDS=str(ROUNDS))
    out = subprocess.run(["sh", str(REPO / "docker" / "hil.sh")], capture_output=True, text=True, timeout=2400,
                         env=env)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-6000:]
    assert "runner: PASS" in log
    for key, boards in [("board-amd64", {"/home/board/work-1", "/home/board/work-2"}),
                        ("board-arm64", {"/home/board/work-arm64"}), ("board-armv7", {"/home/board/work-armv7"})]:
        m = re.search(rf"runner: {key}: (\{{.*\}})", log)
        assert m, f"no result line for {key}:\n{log[-4000:]}"
        tally = json.loads(m.group(1))
        assert tally["failed"] == [] and tally["ok"] == ROUNDS * len(CASES), tally
        assert set(tally["boards"]) == boards, tally  # each key's requests went to that machine's boards
        assert set(tally["seconds"]) == set(CASES), tally
    # Prometheus scraped every board and saw each key's sessions, requests, model runs and native workers
    assert "runner: prometheus: \"every board's counters moved\"" in log, log[-4000:]
    # every board logged its sessions
    assert log.count("rpcsrv.sessions INFO session") >= 3 * ROUNDS * len(CASES), log[-4000:]


@pytest.mark.parametrize("arch", ["arm64", "armv7"])
def test_board_image_alone_serves_the_real_client(arch, tmp_path):
    """``docker run --rm -p 127.0.0.1:PORT:9090 rpcsrv-board:ARCH``: the emulated board runs a Relax VM
    executable cross-compiled for it, through TVM's real client; its healthcheck passes."""
    tvm = need_module("tvm", "the real TVM client comes from `pip install apache-tvm`")
    need_program("aarch64-linux-gnu-gcc" if arch == "arm64" else "arm-linux-gnueabihf-gcc", "links for the board")
    docker = engine()
    build = subprocess.run(["sh", str(REPO / "docker" / "board-image.sh"), arch], capture_output=True, text=True,
                           timeout=1800, env=dict(os.environ, DOCKER=docker))
    assert build.returncode == 0, build.stderr[-3000:]
    sys.path.insert(0, str(REPO / "deploy"))
    import hil_cases
    import hil_runner

    cases = hil_cases.machine_cases(tmp_path, arch, hil_runner.Case)
    name = f"rpcsrv-board-test-{arch}-{os.getpid()}"
    run = subprocess.run([docker, "run", "-d", "--rm", "--name", name, "-p", "127.0.0.1::9090",
                          f"rpcsrv-board:{arch}"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    try:
        port = int(subprocess.run([docker, "port", name, "9090"], capture_output=True, text=True,
                                  check=True).stdout.split(":")[-1])
        deadline = time.monotonic() + 120
        while True:
            out = subprocess.run([docker, "logs", name], capture_output=True, text=True)
            logs = out.stdout + out.stderr  # "serving on" is rpcsrv's stdout line
            if "serving on" in logs:
                break
            assert time.monotonic() < deadline, logs
            time.sleep(0.5)
        sess = tvm.rpc.connect("127.0.0.1", port, session_timeout=300)
        for case in cases:
            if case.name in ("par_ws", "relax_mlp"):
                assert hil_runner.run_case(tvm, sess, case) < 1e-3
        health = subprocess.run([docker, "exec", name, "python3", "/opt/rpcsrv/healthcheck.py"],
                                capture_output=True, text=True, timeout=120)
        assert health.returncode == 0, health.stdout + health.stderr
        machine = subprocess.run([docker, "exec", name, "uname", "-m"], capture_output=True, text=True).stdout
        assert machine.strip() == {"arm64": "aarch64", "armv7": "armv7l"}[arch]
    finally:
        subprocess.run([docker, "stop", "-t", "10", name], capture_output=True, timeout=60)


@pytest.mark.parametrize("arch", ["amd64", "arm64", "armv7"])
def test_rpcsrv_check_in_the_board_image(arch):
    """``rpcsrv check`` in each image: exit status 0, the machine named, both smoke runs done with the
    wheel's prebuilt shim; and 1 when the flags ask for native code the board cannot run (a shim
    forced to a missing file)."""
    docker = engine()
    build = subprocess.run(["sh", str(REPO / "docker" / "board-image.sh"), arch], capture_output=True, text=True,
                           timeout=1800, env=dict(os.environ, DOCKER=docker))
    assert build.returncode == 0, build.stderr[-3000:]
    check = [docker, "run", "--rm", "--entrypoint", "rpcsrv", f"rpcsrv-board:{arch}", "check", "--json"]
    out = subprocess.run(check, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] and not report["problems"], report
    assert report["machine"]["uname"].endswith({"amd64": "x86_64", "arm64": "aarch64", "armv7": "armv7l"}[arch])
    assert report["native"]["compiler"] is None and "prebuilt" in report["native"]["shim"], report["native"]
    assert report["smoke"]["examplejson"]["ok"] and report["smoke"]["native"]["ok"], report["smoke"]
    bad = [*check[:3], "-e", "RPCSRV_NATIVE_SHIM=/nonexistent/libshim.so", *check[3:]]
    out = subprocess.run(bad, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
