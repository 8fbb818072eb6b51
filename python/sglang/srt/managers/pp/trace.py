"""Pipeline trace: Chrome / Perfetto trace-event JSON with one track per rank (`--pp-trace-path`).

Each rank records complete events ("ph": "X", microseconds of wall-clock time, shared by the
processes of one machine) for each micro-batch's forward and each wait and send, with the
micro-batch id, request ids and chunk sizes in `args`. A rank appends its events to its own part
file `<path>.rank<R>.part` (JSON lines) before it blocks, so nothing is lost when it idles or is
killed; `merge_trace(path)` (run by the entry rank when the ring goes idle, and by the benchmark
scripts) joins every part into `<path>`:

    {"traceEvents": [...], "displayTimeUnit": "ms"}     # open in https://ui.perfetto.dev

Event names: `forward` (busy), `recv wait` / `output wait` (bubbles), `send` (isend issue),
`send commit` (waiting for an earlier send before a ring slot is reused), `schedule`, `process result`.
`benchmark/pp/trace_report.py` turns a trace into per-stage bubble ratios and a PNG timeline.

The loops time their work with spans:

    with tracer.span("forward", mb=mb_id) as span:
        out = runner.forward_stage(wb)
        span.set(tokens=n)              # arguments known only at the end
    meter.busy(span.duration)           # the span's times serve the bubble meter as well

A span always measures its wall time (two clock reads; the bubble meter needs them with tracing
off); it records an event only when tracing is on and it was not `drop()`ped.

`SendProbe` (tests): attached to a loop's `PendingRing` (`ring.probe`; None, the default, costs
one attribute test per send), it records in order each micro-batch's forward start and each
send's issue and wait, so a test can assert that sends stay in flight while the next micro-batch
computes (`send_overlap`).
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from typing import Any, Optional

_PART_RE = re.compile(r"\.rank(\d+)\.part$")
FLUSH_EVERY = 4096  # events buffered before a rank appends them to its part file


def now_s() -> float:
    """Wall-clock seconds (comparable across the processes of one machine)."""
    return time.time()


class Span:
    """One timed region (see the module docstring); `start` / `end` are `now_s()` seconds."""

    __slots__ = ("tracer", "name", "args", "start", "end", "keep")

    def __init__(self, tracer: "PPTracer", name: str, args: dict):
        self.tracer, self.name, self.args = tracer, name, args
        self.start = self.end = 0.0
        self.keep = tracer.enabled

    def __enter__(self) -> "Span":
        self.start = now_s()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.end = now_s()
        if self.keep:
            self.tracer.complete(self.name, self.start, self.end, **self.args)

    @property
    def duration(self) -> float:
        return self.end - self.start

    def set(self, **args: Any) -> None:
        """Add event arguments (e.g. ones known only at the end of the region)."""
        if self.keep:
            self.args.update(args)

    def drop(self) -> None:
        """Record no event for this region (its times stay readable)."""
        self.keep = False


class PPTracer:
    """Per-rank event recorder; every method is a cheap no-op when tracing is off."""

    def __init__(self, path: Optional[str], world_rank: int, pp_rank: int, tp_rank: int):
        self.enabled = bool(path)
        self.path = path
        self.world_rank, self.pp_rank, self.tp_rank = world_rank, pp_rank, tp_rank
        self._events: list[dict] = []
        self.part_path = f"{path}.rank{world_rank}.part" if path else None
        if self.part_path:
            os.makedirs(os.path.dirname(os.path.abspath(self.part_path)), exist_ok=True)
            with open(self.part_path, "w", encoding="utf-8") as f:
                f.write(json.dumps(self._metadata()) + "\n")

    def _metadata(self) -> dict:
        return {
            "name": "process_name",
            "ph": "M",
            "pid": self.world_rank,
            "tid": 0,
            "args": {"name": f"rank {self.world_rank} (pp {self.pp_rank}, tp {self.tp_rank})"},
        }

    def span(self, name: str, **args: Any) -> Span:
        """A timed region, used as `with tracer.span(name, **args) as span:`."""
        return Span(self, name, args)

    def complete(self, name: str, start_s: float, end_s: float, cat: str = "pp", **args: Any) -> None:
        """Record one span [start_s, end_s] (seconds from `now_s`)."""
        if not self.enabled:
            return
        self._events.append(
            {
                "name": name,
                "cat": cat,
                "ph": "X",
                "ts": round(start_s * 1e6, 1),
                "dur": round(max(end_s - start_s, 0.0) * 1e6, 1),
                "pid": self.world_rank,
                "tid": 0,
                "args": args,
            }
        )
        if len(self._events) >= FLUSH_EVERY:  # a ring that never idles still writes its trace
            self.flush()

    def flush(self) -> None:
        """Append the buffered events to this rank's part file."""
        if not self.enabled or not self._events:
            return
        with open(self.part_path, "a", encoding="utf-8") as f:
            for ev in self._events:
                f.write(json.dumps(ev) + "\n")
        self._events = []


def part_files(path: str) -> list[str]:
    return sorted(p for p in glob.glob(glob.escape(path) + ".rank*.part") if _PART_RE.search(p))


def parts_signature(path: str) -> tuple:
    """Changes whenever a part file grows (to re-merge only when needed)."""
    sig = []
    for p in part_files(path):
        try:
            sig.append((p, os.path.getsize(p)))
        except OSError:
            pass
    return tuple(sig)


def merge_trace(path: str) -> dict:
    """Join every rank's part file into the trace JSON at `path` (atomic replace); returns it."""
    events: list[dict] = []
    for p in part_files(path):
        with open(p, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    break  # a line being written right now: take it next time
    events.sort(key=lambda e: (e.get("ph") != "M", e.get("ts", 0.0)))
    trace = {"traceEvents": events, "displayTimeUnit": "ms"}
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(trace, f)
    os.replace(tmp, path)
    return trace


class SendProbe:
    """Order of one rank's forwards and pipeline sends (see the module docstring)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []  # ("forward" | "issue" | "wait", micro-batch id)
        self.waited_at_issue = 0  # sends handed to the ring already waited on (synchronous)
        self._mb_of: dict[int, int] = {}

    def forward(self, mb_id: int) -> None:
        self.events.append(("forward", mb_id))

    def issued(self, mb_id: int, pending: Any) -> None:
        if not getattr(pending, "works", None):
            self.waited_at_issue += 1
        self._mb_of[id(pending)] = mb_id
        self.events.append(("issue", mb_id))

    def waited(self, pending: Any) -> None:
        self.events.append(("wait", self._mb_of.pop(id(pending), -1)))

    def send_overlap(self) -> dict:
        """Per send of micro-batch j: `overlapped` if it was waited on (or never) only after a later
        micro-batch's forward began on this rank, `synchronous` if waited before one began (while
        one began later); sends with no later forward on this rank (the last ones) are `tail`."""
        counts = {"overlapped": 0, "synchronous": 0, "tail": 0, "waited_at_issue": self.waited_at_issue}
        for i, (kind, mb) in enumerate(self.events):
            if kind != "issue":
                continue
            later = self.events[i + 1 :]
            fwd = next((k for k, (n, m) in enumerate(later) if n == "forward" and m > mb), None)
            wait = next((k for k, (n, m) in enumerate(later) if n == "wait" and m == mb), None)
            if fwd is None:
                counts["tail"] += 1
            elif wait is None or wait > fwd:
                counts["overlapped"] += 1
            else:
                counts["synchronous"] += 1
        return counts
