"""CPU seconds of each test file: runs every file in its own pytest subprocess (no xdist) and
records the user + sys CPU of it and all its children (servers, spawned ranks, builds), the wall
time and the outcome line. CPU seconds, not wall time, because the CI box and the development VM
are shared: `make test` on 2 workers is CPU-bound, so the sum of this column / 2 is its floor.

    python benchmark/foundation/suite_costs.py test/disaggregation test/e2e/test_server_tp.py \
        --out /tmp/costs.tsv [--pytest-args "-k tp2"]

Appends one tab-separated line per file to --out as it goes (file, cpu_s, wall_s, rc, summary), so
a long run can be stopped and resumed with --skip-done.

This process is made a child subreaper (Linux), so a server's or a build's process that outlives
its parent is reparented here and counted when it exits, not lost to init; processes still running
when the file's pytest ends (leaked) are reported in the summary, and counted once they end.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path


def test_files(paths: list[str]) -> list[str]:
    files: list[str] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            files.extend(sorted(str(f) for f in path.rglob("test_*.py")))
        else:
            files.append(str(path))
    return files


PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
    except (OSError, AttributeError):
        pass  # not Linux: orphans go uncounted


def reap_orphans(grace_s: float = 5.0) -> int:
    """Wait (up to `grace_s`) for reparented descendants; returns how many still run."""
    deadline = time.monotonic() + grace_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 0
        if pid == 0:
            if time.monotonic() > deadline:
                return sum(1 for _ in _children())
            time.sleep(0.2)


def _children() -> list[int]:
    me = str(os.getpid())
    out = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                data = f.read()
        except (OSError, ValueError):
            continue
        if data[data.rfind(")") + 2 :].split()[1] == me:
            out.append(int(entry))
    return out


def run_one(file: str, extra: list[str]) -> tuple[float, float, int, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", file, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - start
    leaked = reap_orphans()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.strip()]
    summary = lines[-1] if lines else proc.stderr.strip()[-200:]
    if leaked:
        summary += f" [{leaked} processes still running after it]"
    return cpu, wall, proc.returncode, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--pytest-args", default="")
    parser.add_argument("--skip-done", action="store_true")
    args = parser.parse_args()
    done = set()
    if args.skip_done and os.path.exists(args.out):
        done = {line.split("\t")[0] for line in Path(args.out).read_text().splitlines()}
    extra = shlex.split(args.pytest_args)
    become_subreaper()
    for file in test_files(args.paths):
        if file in done:
            continue
        cpu, wall, rc, summary = run_one(file, extra)
        with open(args.out, "a") as out:
            out.write(f"{file}\t{cpu:.1f}\t{wall:.1f}\t{rc}\t{summary}\n")
        print(f"{cpu:8.1f} cpu-s {wall:7.1f} s  rc={rc}  {file}  {summary}", flush=True)


if __name__ == "__main__":
    main()
