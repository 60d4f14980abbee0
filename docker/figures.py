"""Per-machine figures of the board images: start-up time, idle memory, one model's run time.

For each ``rpcsrv-board:ARCH`` (built by ``docker/board-image.sh``): ``docker run`` it, time until the
board logs "serving on", read its idle memory (``docker stats``, the container's cgroup) after the
start-up settles, then run through TVM's real client the demo CNN (ExampleJSON, run by numpy) and the
Relax VM MLP cross-compiled for the machine (native code in a worker), ``--runs`` times each, and report
the median of the graph executor's ``run()`` / the VM's ``main`` (uploads and loads excluded), and the
memory after the runs.  Prints a Markdown table (docs/deploy.md).

    python docker/figures.py amd64 arm64 armv7      (needs apache-tvm, onnx, onnxruntime, the cross gcc's)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "deploy"))
import hil_cases  # noqa: E402
import hil_runner  # noqa: E402

DOCKER = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"


def docker(*args: str) -> str:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, check=True).stdout


def memory(name: str) -> str:
    return docker("stats", "--no-stream", "--format", "{{.MemUsage}}", name).split("/")[0].strip()


def measure(tvm, arch: str, cases: list, runs: int) -> dict:
    name = f"rpcsrv-figures-{arch}"
    start = time.monotonic()
    docker("run", "-d", "--rm", "--name", name, "-p", "127.0.0.1::9090", f"rpcsrv-board:{arch}")
    try:
        while "serving on" not in subprocess.run([DOCKER, "logs", name], capture_output=True, text=True).stdout:
            time.sleep(0.05)
        startup = time.monotonic() - start
        time.sleep(5)
        idle = memory(name)
        port = int(docker("port", name, "9090").split(":")[-1])
        out = {"startup": startup, "idle": idle}
        for case in cases:
            sess = tvm.rpc.connect("127.0.0.1", port, session_timeout=600)
            times: list[float] = []
            for _ in range(runs):  # each run_case uploads, loads and runs once: keep the run's time
                one: dict = {}
                hil_runner.run_case(tvm, sess, case, one)
                times.append(one[case.name])
            out[case.name] = statistics.median(times)
        out["after"] = memory(name)
        return out
    finally:
        subprocess.run([DOCKER, "stop", "-t", "10", name], capture_output=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("arch", nargs="+", choices=["amd64", "arm64", "armv7"])
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    import tvm

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        demo = {c.name: c for c in hil_runner.build_cases(Path(tmp))}
        for arch in args.arch:
            native = {c.name: c for c in hil_cases.machine_cases(Path(tmp), arch, hil_runner.Case)}
            f = measure(tvm, arch, [demo["small_cnn"], native["relax_mlp"]], args.runs)
            rows.append(f"| {arch} | {f['startup']:.1f} s | {f['idle']} | {f['small_cnn'] * 1e3:.1f} ms | "
                        f"{f['relax_mlp'] * 1e3:.1f} ms | {f['after']} |")
            print(rows[-1], file=sys.stderr, flush=True)
    print("| machine | start-up | idle memory | small CNN (ExampleJSON) run | Relax VM MLP run | memory after |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
