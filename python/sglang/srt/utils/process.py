"""Process helpers: kill a process tree, die with the parent, per-process logging setup.

Everything here reads /proc directly (Linux) so that no psutil is needed.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Callable, Optional

logger = logging.getLogger(__name__)

LOG_FORMAT = "[%(asctime)s %(role)s] %(levelname)s %(message)s"
LOG_DATEFMT = "%Y-%m-%d %H:%M:%S"


# ---------------------------------------------------------------------------- logging
class _RoleFilter(logging.Filter):
    """Stamps every record with the process role (e.g. `TokenizerManager`)."""

    def __init__(self, role: str):
        super().__init__()
        self.role = role

    def filter(self, record: logging.LogRecord) -> bool:
        record.role = self.role
        return True


def configure_logger(log_level: str, role: str) -> None:
    """Configure the root logger of this process so that every line carries `[... role]`."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_sglang_role_handler", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler._sglang_role_handler = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter(LOG_FORMAT, datefmt=LOG_DATEFMT))
    handler.addFilter(_RoleFilter(role))
    root.addHandler(handler)
    root.setLevel(log_level.upper())


# ---------------------------------------------------------------------------- /proc helpers
def _read_ppid(pid: int) -> Optional[int]:
    """Parent pid of `pid` from /proc/<pid>/stat, or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    # Field 2 (comm) may contain spaces and parentheses: split after the last ')'.
    rest = data[data.rfind(")") + 2 :].split()
    try:
        return int(rest[1])
    except (IndexError, ValueError):
        return None


def process_state(pid: int) -> Optional[str]:
    """One-letter state of a process (`R`, `S`, `Z`, ...) or None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    rest = data[data.rfind(")") + 2 :].split()
    return rest[0] if rest else None


def pid_alive(pid: int) -> bool:
    """True when `pid` exists and is not a zombie."""
    state = process_state(pid)
    return state is not None and state not in ("Z", "X")


def child_pids(pid: int, recursive: bool = True) -> list[int]:
    """Pids of the children (and by default all descendants) of `pid`, children first."""
    parents: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        ppid = _read_ppid(int(entry))
        if ppid is not None:
            parents.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    frontier = [pid]
    while frontier:
        nxt: list[int] = []
        for p in frontier:
            for c in parents.get(p, []):
                out.append(c)
                nxt.append(c)
        frontier = nxt if recursive else []
    return out


def kill_process_tree(
    pid: int, include_self: bool = True, sig: int = signal.SIGKILL, skip: Optional[set[int]] = None
) -> None:
    """Send `sig` to every descendant of `pid` (deepest first) and, if asked, to `pid` itself."""
    skip = skip or set()
    targets = [p for p in reversed(child_pids(pid)) if p not in skip]
    if include_self:
        targets.append(pid)
    for p in targets:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


# ---------------------------------------------------------------------------- parent death
def watch_parent(
    parent_pid: Optional[int] = None,
    interval: float = 0.5,
    on_death: Optional[Callable[[], None]] = None,
) -> threading.Thread:
    """Start a daemon thread that kills this process (and its children) when the parent dies.

    Polls os.getppid() (and `parent_pid` when given: the launcher of a fork server's child): on Linux a
    process whose parent died is re-parented. Polling (instead of
    PR_SET_PDEATHSIG) is used because the death signal fires when the parent *thread* that
    spawned us exits, which would kill the children of an Engine made on a short-lived thread.
    """
    own_parent = os.getppid()  # a fork server's child: the fork server, which outlives no launcher
    parent = own_parent if parent_pid is None else parent_pid

    def loop() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != own_parent or not pid_alive(parent):
                if on_death is not None:
                    on_death()
                kill_process_tree(os.getpid(), include_self=False)
                os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=loop, name="parent-watch", daemon=True)
    thread.start()
    return thread


def kill_itself_when_parent_died(interval: float = 0.5, parent_pid: Optional[int] = None) -> None:
    """Make this process (and its children) exit when its parent process (or `parent_pid`, the
    launcher of a process forked by a fork server) dies.

    Safe to call more than once: only the first call starts the watcher thread.
    """
    if any(t.name == "parent-watch" for t in threading.enumerate()):
        return
    watch_parent(parent_pid=parent_pid, interval=interval)


def set_process_name(name: str) -> None:
    """Name this process (Linux `comm`, shown by ps/top; at most 15 bytes) for operators and tests."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass
