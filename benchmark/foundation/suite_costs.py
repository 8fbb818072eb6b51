"""CPU seconds of each test file: runs every file in its own pytest subprocess (no xdist) and
records the user + sys CPU of it and all its children (servers, spawned ranks, builds), the wall
time and the outcome line. CPU seconds, not wall time, because the CI box and the development VM
are shared: `make test` on 2 workers is CPU-bound, so the sum of this column / 2 is its floor.

    python benchmark/foundation/suite_costs.py test/disaggregation test/e2e/test_server_tp.py \
        --out /tmp/costs.tsv [--pytest-args "-k tp2"]

Appends one tab-separated line per file to --out as it goes (file, cpu_s, wall_s, rc, summary), so
a long run can be stopped and resumed with --skip-done.
"""

from __future__ import annotations

import argparse
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


def run_one(file: str, extra: list[str]) -> tuple[float, float, int, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", file, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.strip()]
    summary = lines[-1] if lines else proc.stderr.strip()[-200:]
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
    for file in test_files(args.paths):
        if file in done:
            continue
        cpu, wall, rc, summary = run_one(file, extra)
        with open(args.out, "a") as out:
            out.write(f"{file}\t{cpu:.1f}\t{wall:.1f}\t{rc}\t{summary}\n")
        print(f"{cpu:8.1f} cpu-s {wall:7.1f} s  rc={rc}  {file}  {summary}", flush=True)


if __name__ == "__main__":
    main()
