"""The CPU kernels are built at install time (setup.py), never at start-up: a start loads them
without a compiler and without any lock, and a build killed half-way blocks neither the next
start nor the next build."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sglang.srt.kernels.cpu import isa, loader
from sglang.test.polling import wait_until
from sglang.test.procs import SESSION, live_pids

ROOT = Path(__file__).resolve().parents[2]
LOAD_SNIPPET = (
    "import time; t = time.perf_counter()\n"
    "from sglang.srt.kernels.cpu import loader\n"
    "m = loader.load()\n"
    "print(m.isa() if m is not None else 'none', round(time.perf_counter() - t, 2))\n"
)


def _built() -> bool:
    return any(loader.load_variant(v.name).module is not None for v in isa.runnable_variants())


def _run_load(env: dict) -> tuple[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", LOAD_SNIPPET], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    name, seconds = out.stdout.split()
    return name, float(seconds)


def test_start_up_loads_the_kernels_without_a_compiler():
    """Loading needs no compiler (PATH without one) and takes about the time of an import."""
    if not _built():
        pytest.skip("the CPU kernels are not built here (no compiler at install time)")
    env = dict(os.environ, PATH="/nonexistent", CXX="/nonexistent/c++")
    env.pop("SGLANG_CPU_ISA", None)
    name, seconds = _run_load(env)
    assert name == isa.runnable_variants()[0].name
    assert seconds < 20  # an import (torch included), never a build


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL every process of the build's session: setup.py, ninja and the compilers (ninja runs
    each compiler in a process group of its own, so killing setup.py's group alone would leave them
    compiling on, orphaned, for as long as a whole build)."""
    for _ in range(3):
        for pid in live_pids(SESSION, proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    proc.wait(timeout=30)
    assert wait_until(lambda: not live_pids(SESSION, proc.pid), 30), live_pids(SESSION, proc.pid)


@pytest.mark.slow
def test_a_killed_build_blocks_neither_the_next_start_nor_the_next_build(tmp_path):
    """`setup.py build_ext` killed while the compiler runs (Ctrl-C during `make setup`): a start
    right after loads the kernels at once, and the next build completes and gives a working module
    (only the portable build is made here, and at -O0 through a compiler wrapper: the test is about
    the build's life cycle, not the kernels' speed; -O0 takes about 3/4 of -O3's compile CPU)."""
    if not _built():
        pytest.skip("the CPU kernels are not built here (no compiler at install time)")
    lib, temp = tmp_path / "lib", tmp_path / "temp"
    cmd = [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(lib), "--build-temp", str(temp)]
    cxx = tmp_path / "cxx-O0"  # torch's extension build runs $CXX; the last -O wins
    cxx.write_text(f'#!/bin/sh\nexec {shlex.quote(os.environ.get("CXX", "c++"))} "$@" -O0\n')
    cxx.chmod(0o755)
    env = dict(
        os.environ,
        SGLANG_CPU_KERNEL_VARIANTS="portable",
        CXX=str(cxx),
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    )
    build = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while not list(temp.rglob("build.ninja")) and time.monotonic() < deadline:  # the compiler is running
            assert build.poll() is None, "the build ended before it could be killed"
            time.sleep(0.2)
        time.sleep(2.0)
        assert build.poll() is None
    finally:
        _kill_tree(build)  # the whole tree: setup.py, ninja, the compiler

    start_env = dict(os.environ)
    start_env.pop("SGLANG_CPU_ISA", None)
    name, seconds = _run_load(start_env)
    assert name == isa.runnable_variants()[0].name and seconds < 20

    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (so,) = (lib / "sglang" / "srt" / "kernels" / "cpu").glob("_C_portable*.so")
    check = (
        "import importlib.util, sys, torch\n"
        f"spec = importlib.util.spec_from_file_location('_C_portable', {str(so)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "x = torch.randn(3, 8)\n"
        "ref = torch.nn.functional.silu(x[:, :4]) * x[:, 4:]\n"
        "print(m.isa(), m.source_tag(), torch.allclose(m.silu_and_mul(x), ref, atol=1e-6))\n"
    )
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["portable", isa.source_tag(), "True"], out.stderr
