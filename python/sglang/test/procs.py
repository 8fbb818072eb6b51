"""Processes read from /proc (Linux), for tests that check what a server or a build leaves behind."""

from __future__ import annotations

import os

PPID, PGRP, SESSION = 1, 2, 3  # fields of /proc/<pid>/stat after the command name (0 is the state)


def live_pids(field: int, value: int) -> list[int]:
    """Pids of the live processes (not zombies) whose stat `field` (PPID, PGRP or SESSION) is `value`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rfind(")") + 2 :].split()
        if len(fields) > field and int(fields[field]) == value and fields[0] not in ("Z", "X"):
            out.append(int(entry))
    return out
