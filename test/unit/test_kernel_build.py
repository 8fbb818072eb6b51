"""The CPU-kernel build's two guards (kernels/cpu/build.py): sources copied into the build
directory only when their text changed, and a stale torch `lock` file removed under our flock."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from sglang.srt.kernels.cpu.build import _CSRC, _SOURCES, copy_sources, exclusive_build


def test_copy_sources_rewrites_only_changed_files(tmp_path):
    dst = tmp_path / "src"
    paths = copy_sources(_CSRC, str(dst))
    assert [os.path.basename(p) for p in paths] == list(_SOURCES)
    copied = sorted(os.listdir(dst))
    assert copied == sorted(n for n in os.listdir(_CSRC) if n.endswith((".cpp", ".h")))
    for name in copied:
        assert (dst / name).read_bytes() == open(os.path.join(_CSRC, name), "rb").read()
    old = {name: (dst / name).stat().st_mtime_ns for name in copied}
    time.sleep(0.01)
    (dst / copied[0]).write_bytes(b"changed")
    copy_sources(_CSRC, str(dst))
    new = {name: (dst / name).stat().st_mtime_ns for name in copied}
    assert (dst / copied[0]).read_bytes() == open(os.path.join(_CSRC, copied[0]), "rb").read()
    assert new[copied[0]] != old[copied[0]]
    assert all(new[n] == old[n] for n in copied[1:])  # untouched: ninja sees nothing new


def test_exclusive_build_removes_a_stale_torch_lock(tmp_path):
    (tmp_path / "lock").write_text("")
    with exclusive_build(str(tmp_path)):
        assert not (tmp_path / "lock").exists()


def test_exclusive_build_waits_for_a_live_builder_and_not_for_a_dead_one(tmp_path):
    holder = (
        "import sys, time\n"
        "from sglang.srt.kernels.cpu.build import exclusive_build\n"
        "with exclusive_build(sys.argv[1]):\n"
        "    open(sys.argv[1] + '/lock', 'w').close()\n"  # torch's baton while building
        "    print('building', flush=True)\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", holder, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    entered = threading.Event()
    lock_seen: list[bool] = []

    def second_builder() -> None:
        with exclusive_build(str(tmp_path)):
            lock_seen.append((tmp_path / "lock").exists())
            entered.set()

    waiter = threading.Thread(target=second_builder, daemon=True)
    try:
        assert proc.stdout.readline().strip() == "building"
        waiter.start()
        assert not entered.wait(1.0)  # the live build holds the lock: the second one waits
        assert (tmp_path / "lock").exists()
        proc.kill()  # the builder dies mid-build, its torch lock file stays behind
        proc.wait(timeout=10)
        assert entered.wait(10.0)
        assert lock_seen == [False]  # the stale lock was removed before the second build
    finally:
        if proc.poll() is None:
            proc.kill()
