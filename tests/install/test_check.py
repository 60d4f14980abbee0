"""``rpcsrv check``: what it prints and its exit status (0: what the flags enable works; 1: something
they enable is missing; 2: a bad flag); the hooks other parts provide; and how the shim is chosen
(prebuilt for this machine, else compiled, else one line saying what to do)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import need_program

CHECK = [sys.executable, "-m", "rpcsrv", "check"]
_SHIM_C = Path(__file__).resolve().parents[2] / "rpcsrv" / "native" / "shim.c"


def _run(*args: str, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([*CHECK, *args], capture_output=True, text=True, timeout=180,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def test_check_passes_here_and_prints_every_section():
    done = _run()
    assert done.returncode == 0, done.stdout + done.stderr
    for head in ("machine ", "python ", "numpy ", "BLAS:", "native ", "limits ", "smoke     examplejson: ok",
                 "smoke     native: ok", "answered from the client's socket (loan): ", "result    OK"):
        assert head in done.stdout, f"{head!r} missing:\n{done.stdout}"


@pytest.mark.parametrize("loop", ["c", "python"])
def test_check_says_which_loop_serves_loans_and_why_none_does(loop, tmp_path):
    """The loan's line names the loop a confined worker serves loans with (the case of a worker that cannot
    serve them is tests/native/test_native_loan.py's: rpcsrv in a folder its user cannot read)."""
    report = json.loads(_run("--json", env={"RPCSRV_LOAN_LOOP": loop}).stdout)
    expect = "in force: C loop" if loop == "c" else "in force: Python loop"
    assert report["smoke"]["native"]["loan"].startswith(expect), report["smoke"]["native"]


def test_check_json_takes_the_serve_limit_flags():
    done = _run("--json", "--max-memory-mb", "64", "--max-sessions", "3", "--native", "inprocess")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["problems"] == []
    assert report["limits"]["max_memory"] == 64 << 20 and report["limits"]["max_sessions"] == 3
    assert report["smoke"]["native"]["ok"] and "in this process" in report["smoke"]["native"]["detail"]
    assert report["machine"]["elf"] and report["numpy"]


def test_missing_native_code_fails_only_when_the_flags_enable_it(tmp_path):
    env = {"RPCSRV_NATIVE_SHIM": str(tmp_path / "missing.so")}
    done = _run(env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "result    FAILED: --native isolated needs native code, which cannot run here" in done.stdout
    off = _run("--no-native", env=env)
    assert off.returncode == 0, off.stdout + off.stderr
    assert "native: ok" in off.stdout and "not run: --native off" in off.stdout


def test_a_bad_flag_is_one_line_and_status_2():
    done = _run("--max-memory-mb", "0")
    assert done.returncode == 2
    assert done.stderr.strip() == "rpcsrv: error: --max-memory-mb 0 must be a positive number of MB"


def test_hook_sections_are_shown_and_a_failing_one_fails_the_check(tmp_path):
    (tmp_path / "fake_layers.py").write_text(
        "def report():\n    return {'ok': False, 'summary': 'seccomp layer missing', 'layers': ['ns']}\n"
        "def fine():\n    return 'all three layers'\n")
    code = ("import sys, rpcsrv.check as c\n"
            "c.HOOKS = (('confinement', 'fake_layers', 'report'), ('kernels', 'fake_layers', 'fine'),\n"
            "           ('absent', 'no_such_module_here', 'report'))\n"
            "from rpcsrv.cli import main\nsys.exit(main(['check', '--no-native']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "confinement FAILED: seccomp layer missing" in done.stdout
    assert "kernels   ok: all three layers" in done.stdout
    assert "absent" not in done.stdout
    assert "result    FAILED: confinement: seccomp layer missing" in done.stdout


# ------------------------------------------------------------------------------- how the shim is chosen

_CHOOSE = """
import json, pathlib, sys
import rpcsrv.native.shim as s
s.PREBUILT = pathlib.Path(sys.argv[1])
if sys.argv[2] == "nocc":
    s.host_compiler = lambda: None
print(json.dumps(s.status()))
"""


def _choose(prebuilt: Path, tmp_path: Path, compiler: bool = True) -> dict:
    done = subprocess.run([sys.executable, "-c", _CHOOSE, str(prebuilt), "cc" if compiler else "nocc"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RPCSRV_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _prebuilt(tmp_path: Path, *compilers: str) -> Path:
    from rpcsrv.native.shimbuild import build_prebuilt

    out = tmp_path / "prebuilt"
    build_prebuilt(out, compilers, log=lambda m: None)
    return out


def test_the_prebuilt_shim_for_this_machine_is_taken_over_the_others(tmp_path):
    need_program("gcc", "builds this machine's shim")
    arm = need_program("arm-linux-gnueabihf-gcc", "a shim for another machine beside it")
    status = _choose(_prebuilt(tmp_path, "gcc", arm), tmp_path, compiler=False)
    assert status["error"] is None and "(prebuilt for " in status["shim"], status
    assert status["prebuilt"]["arm-linux-gnueabihf"] == "other machine"
    assert "this machine" in status["prebuilt"].values()


def test_a_prebuilt_shim_that_does_not_load_falls_back_to_the_compiler(tmp_path):
    """As on a board whose C library is older than the build machine's: dlopen refuses the prebuilt
    shim (here: it needs a library that is not there), and the board's compiler builds one."""
    gcc = need_program("gcc", "builds the shims")
    prebuilt = _prebuilt(tmp_path, "gcc")
    (shim,) = prebuilt.glob("*/libshim.so")
    (tmp_path / "ghost.c").write_text("int ghost(void) { return 1; }\n")
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(tmp_path / "libghost.so"), str(tmp_path / "ghost.c")],
                   check=True)
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(shim), str(_SHIM_C), "-lpthread", f"-L{tmp_path}",
                    "-Wl,--no-as-needed", "-lghost"], check=True)
    (tmp_path / "libghost.so").unlink()
    status = _choose(prebuilt, tmp_path)
    assert status["error"] is None and "built with" in status["shim"], status
    assert any("dlopen failed" in why and "libghost.so" in why for why in status["passed_over"]), status


def test_no_shim_fits_and_no_compiler_says_what_to_do_in_one_line(tmp_path):
    arm = need_program("arm-linux-gnueabihf-gcc", "a shim for another machine only")
    status = _choose(_prebuilt(tmp_path, arm), tmp_path, compiler=False)
    error = status["error"]
    assert status["shim"] is None and "\n" not in error
    for part in ("no native shim for this board", "prebuilt in the package: arm-linux-gnueabihf", "no C compiler",
                 "apt-get install gcc", "python -m rpcsrv.native.shimbuild OUT --cc",
                 "RPCSRV_NATIVE_SHIM=OUT/<target>/libshim.so"):
        assert part in error, error


@pytest.mark.toolchain
def test_shimbuild_builds_for_a_cross_compiler_from_the_command_line(tmp_path):
    cc = need_program("aarch64-linux-gnu-gcc", "the arm64 cross compiler")
    done = subprocess.run([sys.executable, "-m", "rpcsrv.native.shimbuild", str(tmp_path), "--cc", cc,
                           "--require"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "aarch64-linux-gnu" / "libshim.so")
    from rpcsrv.native.machine import machine_of

    for lib in ("libshim.so", "libcheck.so"):
        with open(tmp_path / "aarch64-linux-gnu" / lib, "rb") as f:
            assert str(machine_of(f)) == "AArch64 ELF64 le"
    assert shutil.which(cc)


def test_check_names_the_plugins_in_use_and_fails_for_a_requested_one_that_is_missing():
    done = _run("--json")
    loaded = [p["name"] for p in json.loads(done.stdout)["sections"]["plugins"]["loaded"]]
    assert {"examplejson", "jsonrt", "graph_executor", "relax_vm"} <= set(loaded)
    text = _run().stdout
    assert "plugins   ok: plugins: graph_executor (built-in), examplejson (built-in)" in text
    # a plugin the flags ask for and that is not installed: the board lacks what it was told to have
    missing = _run("--plugin", "no_such_plugin")
    assert missing.returncode == 1, missing.stdout + missing.stderr
    assert "result    FAILED: plugins:" in missing.stdout
    assert "no_such_plugin (no such plugin installed" in missing.stdout


def test_check_says_when_the_compiled_kernels_fall_back_to_numpy():
    on = json.loads(_run("--json").stdout)["sections"]["kernels"]
    off = _run("--json", env={"RPCSRV_COMPILED_KERNELS": "0"})
    assert off.returncode == 0, off.stdout + off.stderr  # numpy is a fallback, not a failure
    kernels = json.loads(off.stdout)["sections"]["kernels"]
    assert not kernels["in_use"] and kernels["summary"].startswith("numpy fallback")
    assert "RPCSRV_COMPILED_KERNELS=0" in kernels["summary"]
    assert on["in_use"] and on["summary"].startswith("compiled kernels in use")
